"""mkdocs hooks (mkdocs.yml): the reference pages' tables, generated from the code.

A page asks for a table with a marker on a line of its own, ``<!-- generated: NAME -->``:

- ``settings``: every field of :class:`jobcore.kernel.settings.Settings` and
  :class:`jobcore.kernel.settings.RelayOptions` as its environment variable, with its default and
  bounds read from the model and its meaning from ``docs/reference/settings.yml``;
- ``cli``: every command of the ``jobcore`` program (the typer app of ``services.entry``);
- ``http``: every route of the API's OpenAPI document (``services.api.app.create_app``);
- ``metrics``: every metric the API, the relay and the worker register;
- ``bench``: every report `jobcore bench` wrote under ``docs/bench/``, with its plots (for
  a page one folder below ``docs/``);
- ``bench-report FOLDER [SCENARIO]``: the table and plots of the one report ``jobcore bench
  --out FOLDER`` wrote (``FOLDER`` is ``docs/bench`` or a folder under it), with the
  run's date and machine; with ``SCENARIO``, only that scenario's rows and plot. A page
  that discusses a run embeds its figures this way instead of typing them.

The tables are built from the public objects (the settings models, the typer app, the
FastAPI app, the processes' metric registries), never from lists of modules, so a module
that moves changes nothing here. What cannot be generated fails the strict build: a
setting with no meaning in settings.yml, a meaning for a setting that no longer exists,
an unknown marker, a marker that does not parse, a report that is not there.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- generated: ([a-z]+) -->$", re.MULTILINE)
BENCH_REPORT_MARKER = re.compile(
    r"^<!-- generated: bench-report (docs/bench(?:/[a-z0-9-]+)*)(?: ([a-z_0-9]+))? -->$",
    re.MULTILINE,
)
# Anything that looks like a marker: one that matches neither pattern above is a typo that
# would otherwise stay an invisible HTML comment.
ANY_MARKER = re.compile(r"^[ \t]*<!--[ \t]*generated\b.*$", re.MULTILINE)
ROOT = Path(__file__).resolve().parents[1]
SETTINGS_NOTES = ROOT / "docs" / "reference" / "settings.yml"


class GeneratedReferenceError(PluginError):
    """A reference table cannot be generated: the build stops with this message."""


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def table(match: re.Match[str]) -> str:
        generator = GENERATORS.get(match[1])
        if generator is None:
            raise GeneratedReferenceError(f"{page.file.src_path}: no generated table {match[1]!r}")
        return generator()

    def report(match: re.Match[str]) -> str:
        return bench_report(match[1], match[2], page.file.src_path)

    for line in ANY_MARKER.findall(markdown):
        if not (MARKER.fullmatch(line) or BENCH_REPORT_MARKER.fullmatch(line)):
            raise GeneratedReferenceError(f"{page.file.src_path}: malformed marker {line!r}")
    return BENCH_REPORT_MARKER.sub(report, MARKER.sub(table, markdown))


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _plain(text: object) -> str:
    """Help text (plain text, not Markdown) for a table cell: its ``<placeholders>`` shown."""
    return _cell(str(text).replace("&", "&amp;").replace("<", "&lt;").replace("*", "\\*"))


def _code(value: object) -> str:
    text = str(value)
    return f"`{text}`" if text else "empty"


# --- settings -------------------------------------------------------------------------------


def _default(field: Any) -> str:
    from datetime import timedelta

    from pydantic import SecretStr

    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "none"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        return f"`{int(value.total_seconds())}` s"
    if isinstance(value, tuple):
        return _code(",".join(value))
    if isinstance(value, dict):
        return "`{}`"
    return _code(value)


def _bounds(field: Any) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥"}
    found = []
    for item in field.metadata:
        for attribute, word in words.items():
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{word} {value:,}" if isinstance(value, int) else f"{word} {value}")
    return ", ".join(found)


def settings_table() -> str:
    from jobcore.kernel.settings import RelayOptions, Settings

    fields: dict[str, Any] = {}
    for model in (Settings, RelayOptions):
        prefix = model.model_config.get("env_prefix", "")
        for name, field in model.model_fields.items():
            fields[f"{prefix}{name}".upper()] = field
    notes = yaml.safe_load(SETTINGS_NOTES.read_text(encoding="utf-8"))
    described: set[str] = set()
    rows = ["| variable | default | bounds | meaning |", "|---|---|---|---|"]
    for note in notes:
        names = note["names"]
        unknown = [name for name in names if name not in fields]
        if unknown:
            raise GeneratedReferenceError(f"settings.yml describes no such setting: {unknown}")
        described.update(names)
        rows.append(
            "| "
            + " / ".join(f"`{name}`" for name in names)
            + " | "
            + " / ".join(_default(fields[name]) for name in names)
            + " | "
            + _cell("; ".join(b for b in (_bounds(fields[name]) for name in names) if b))
            + " | "
            + _cell(note["text"])
            + " |"
        )
    missing = sorted(set(fields) - described)
    if missing:
        raise GeneratedReferenceError(f"docs/reference/settings.yml has no meaning for {missing}")
    return "\n".join(rows) + "\n"


# --- the command line -----------------------------------------------------------------------


def cli_reference() -> str:
    import typer

    from services.entry import app

    # typer ships its own click: its commands and contexts are read by duck typing.
    root = typer.main.get_command(app)
    parts: list[str] = []

    def walk(command: Any, path: list[str], parent: Any) -> None:
        ctx = command.context_class(command, info_name=path[-1], parent=parent)
        if path != ["jobcore"] and not getattr(command, "hidden", False):
            parts.append(_command_section(command, ctx, path))
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], ctx)

    walk(root, ["jobcore"], None)
    options = _params_table(root.params)
    head = f"## Global options\n\n{options}" if options else ""
    return head + "\n".join(parts)


def _command_section(command: Any, ctx: Any, path: list[str]) -> str:
    usage = " ".join(command.collect_usage_pieces(ctx))
    help_text = (command.help or "").strip()
    # typer's \b (no rewrap) markers and the rich markup typer accepts are not Markdown.
    help_text = help_text.replace("\b\n", "").replace("\b", "")
    level = "#" * min(len(path), 4)
    lines = [f"{level} {' '.join(path)}", "", f"```\n{' '.join(path)} {usage}\n```", ""]
    if help_text:
        lines += [_escape_prose(help_text), ""]
    table = _params_table(command.params)
    if table:
        lines += [table]
    return "\n".join(lines) + "\n"


def _escape_prose(text: str) -> str:
    # Help text is plain text: keep its paragraphs, show its words as written.
    return "\n\n".join(_plain(" ".join(paragraph.split())) for paragraph in text.split("\n\n"))


def _params_table(params: Iterable[Any]) -> str:
    rows = []
    for param in params:
        if getattr(param, "hidden", False) or param.name in {"help"}:
            continue
        if param.param_type_name == "argument":
            name = f"`{(param.metavar or param.name).upper()}`"
            kind = "argument" + ("" if param.required else " (optional)")
        else:
            name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
            kind = "option" + (" (required)" if param.required else "")
        default = param.default
        if getattr(param, "is_flag", False) and param.secondary_opts:
            # An on/off pair: the default is whichever of the two is on.
            shown = f"`{param.opts[0] if default else param.secondary_opts[0]}`"
        elif callable(default) or default in (None, False, (), []) or param.is_flag is True:
            shown = ""
        else:
            shown = _code(
                ", ".join(str(getattr(d, "value", d)) for d in default)
                if isinstance(default, list | tuple)
                else getattr(default, "value", default)
            )
        rows.append(f"| {name} | {kind} | {shown} | {_plain(getattr(param, 'help', '') or '')} |")
    if not rows:
        return ""
    return "| parameter | kind | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


# --- the HTTP API ---------------------------------------------------------------------------


def http_reference() -> str:
    from jobcore.kernel.settings import Settings
    from services.api.app import create_app

    document = create_app(Settings()).openapi()
    parts = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            parts.append(_operation_section(method.upper(), path, operation))
    return "\n".join(parts)


def _schema_words(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_schema_words(s) for s in schema["anyOf"])
    if "enum" in schema:
        return ", ".join(f"`{v}`" for v in schema["enum"])
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return f"array of {_schema_words(schema.get('items', {}))}"
    bounds = [
        f"{word} {schema[key]}"
        for key, word in (("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"))
        if key in schema
    ]
    if "maxLength" in schema:
        bounds.append(f"length ≤ {schema['maxLength']}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _operation_section(method: str, path: str, operation: dict[str, Any]) -> str:
    lines = [f"### `{method} {path}`", ""]
    summary = operation.get("summary")
    if summary:
        lines += [f"**{_cell(summary)}**", ""]
    description = (operation.get("description") or "").strip()
    if description:
        lines += [description, ""]
    params = operation.get("parameters", [])
    if params:
        lines += ["| parameter | in | required | schema | meaning |", "|---|---|---|---|---|"]
        for param in params:
            schema = param.get("schema", {})
            lines.append(
                f"| `{param['name']}` | {param['in']} | {'yes' if param.get('required') else ''}"
                f" | {_cell(_schema_words(schema))}"
                f" | {_cell(param.get('description') or schema.get('description') or '')} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Body: `{media}`, {_cell(_schema_words(content.get('schema', {})))}.", ""]
    responses = operation.get("responses", {})
    if responses:
        lines += ["| status | answer |", "|---|---|"]
        for status, response in responses.items():
            lines.append(f"| `{status}` | {_cell(response.get('description', ''))} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# --- metrics --------------------------------------------------------------------------------


def _registries() -> dict[str, Any]:
    """The registries each process serves at /metrics, built as the processes build them
    (nothing is connected: the database pools open on start, never in a constructor)."""
    from prometheus_client import CollectorRegistry

    from jobcore.amqp.topology import Topology
    from jobcore.execution.registry import load_job_modules
    from jobcore.kernel.settings import Settings
    from jobcore.usecases.backlog import BacklogGauges
    from services.api.app import create_app
    from services.relay.metrics import RelayMetrics
    from services.worker.app import Worker

    api = create_app(Settings()).state.api.metrics.registry
    relay = RelayMetrics().registry
    BacklogGauges(relay, None, Topology("jobcore"), [], lambda: None)  # type: ignore[arg-type]
    # A schedule, so that the worker builds its scheduler and the scheduler's metrics: of
    # the first job type whose payload may be empty (a schedule's default payload).
    registry = load_job_modules(Settings().job_modules)
    job_type = next(kind.name for kind in registry if _accepts_empty_payload(kind))
    worker = Worker(Settings(schedules={"docs": {"job_type": job_type, "cron": "0 3 * * *"}}))
    worker_registry: CollectorRegistry = worker.metrics.registry
    return {"API": api, "relay": relay, "worker": worker_registry}


def _accepts_empty_payload(kind: Any) -> bool:
    from jobcore.execution.registry import InvalidPayloadError

    try:
        kind.validate_payload({})
    except InvalidPayloadError:
        return False
    return True


def metrics_reference() -> str:
    rows = ["| metric | type | labels | served by | meaning |", "|---|---|---|---|---|"]
    found: dict[str, tuple[str, str, str]] = {}
    served: dict[str, list[str]] = {}
    for process, registry in _registries().items():
        labels = _label_names(registry)
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            served.setdefault(name, []).append(process)
            shown = ", ".join(f"`{label}`" for label in labels.get(family.name, ()))
            found[name] = (family.type, shown, family.documentation)
    for name in sorted(found):
        kind, labels, help_text = found[name]
        rows.append(
            f"| `{name}` | {kind} | {labels} | {', '.join(served[name])} | {_plain(help_text)} |"
        )
    return "\n".join(rows) + "\n"


def _label_names(registry: Any) -> dict[str, tuple[str, ...]]:
    """Each family's label names as declared (a family not yet observed has no samples to
    read them from). prometheus-client keeps them on the collector only."""
    names: dict[str, tuple[str, ...]] = {}
    for collector in list(registry._collector_to_names):
        name = getattr(collector, "_name", None)
        if name is not None:
            names[name] = tuple(getattr(collector, "_labelnames", ()))
    return names


# --- the benchmark reports ------------------------------------------------------------------


def bench_reports() -> str:
    """Links to the reports and their plots as `jobcore bench` wrote them: the figures are
    never typed here, and a new report appears by itself."""
    bench = ROOT / "docs" / "bench"
    lines = []
    for report in sorted(bench.rglob("report.md"), key=lambda p: (p.parent != bench, p)):
        folder = report.parent.relative_to(ROOT / "docs").as_posix()
        name = "all scenarios" if report.parent == bench else report.parent.name
        lines.append(f"- [`{folder}/report.md`](../{folder}/report.md): {name}")
        plots = sorted(report.parent.glob("*.png"))
        lines += [f"\n    ![{name}: {plot.stem}](../{folder}/{plot.name})\n" for plot in plots]
    if not lines:
        raise GeneratedReferenceError("docs/bench holds no report.md")
    return "\n".join(lines) + "\n"


def _report_table(lines: list[str]) -> tuple[list[str], list[str]]:
    """The report's table: its header (two lines) and its rows."""
    start = next((i for i, line in enumerate(lines) if line.startswith("| scenario |")), None)
    if start is None:
        return [], []
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start : start + 2], lines[start + 2 : end]


def _targets(lines: list[str], scenario: str | None) -> list[str]:
    """The PASS/FAIL list a scenario with targets writes under its section."""
    found: list[str] = []
    section = None
    in_targets = False
    for line in lines:
        if line.startswith("## "):
            section = line[3:].split(":", 1)[0]
            in_targets = False
        elif line.startswith("Targets"):
            in_targets = scenario is None or section == scenario
            if in_targets:
                found += [line, ""]
        elif in_targets and line.startswith("- "):
            found.append(line)
        elif in_targets and line.strip():
            in_targets = False
    return [*found, ""] if found else []


def bench_report(folder: str, scenario: str | None, page_path: str) -> str:
    """One report's table and plots, as `jobcore bench --out FOLDER` wrote them, for the
    page at ``page_path`` (relative to ``docs/``): a page explains a run in words and
    shows its figures through this, so they change only when the bench runs again."""
    directory = ROOT / folder
    report = directory / "report.md"
    where = f"{page_path}: bench-report {folder}"
    if not report.is_file():
        raise GeneratedReferenceError(f"{where}: no {folder}/report.md")
    lines = report.read_text(encoding="utf-8").splitlines()
    header, rows = _report_table(lines)
    if scenario is not None:
        rows = [row for row in rows if row.split("|")[1].strip() == scenario]
    if not rows:
        wanted = f"rows of scenario {scenario!r}" if scenario else "table"
        raise GeneratedReferenceError(f"{where}: {folder}/report.md has no {wanted}")
    if scenario is not None:
        plots = [plot for plot in [directory / f"{scenario}.png"] if plot.is_file()]
    else:
        plots = sorted(directory.glob("*.png"))
    page_dir = posixpath.dirname(page_path)
    in_docs = directory.relative_to(ROOT / "docs").as_posix()
    link = posixpath.relpath(f"{in_docs}/report.md", page_dir)
    run = next((line for line in lines if line.startswith("Run at ")), "")
    when = run.removeprefix("Run at ").split(" with ", 1)[0]
    machine = next((line for line in lines if line.startswith("Machine: ")), "")
    machine = machine.removeprefix("Machine: ").split("; load average", 1)[0]
    caption = f"From [`docs/{in_docs}/report.md`]({link})" + (f", run at {when}" if when else "")
    if machine:
        caption += f" on {machine}"
    parts = [caption + ":", "", *header, *rows, "", *_targets(lines, scenario)]
    for plot in plots:
        target = posixpath.relpath(f"{in_docs}/{plot.name}", page_dir)
        parts += [f"![docs/{in_docs}: {plot.stem}]({target})", ""]
    return "\n".join(parts)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "cli": cli_reference,
    "http": http_reference,
    "metrics": metrics_reference,
    "bench": bench_reports,
}
