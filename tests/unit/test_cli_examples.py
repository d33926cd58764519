"""Every `jobcore` command's ``--help`` ends with one example, and every example is a real
command line; so is every `jobcore ...` line in the shell blocks of README.md and docs/.

"Real" means the CLI's own parser resolves it (tests/support/cli_parse.py, invoking
nothing): an unknown command or option, a missing argument or a value outside an option's
choices or range fails here. Checks the commands make in their bodies (a key id being a
UUID, a rate like ``50/s``) are not run, as that would run the command.

Which lines of the docs count: fenced blocks tagged bash, sh, shell, zsh, console or
shell-session, where each simple command (split at ``|``, ``&&``, ``;``, ``&``, ``$(``, after
leading ``NAME=value`` assignments, redirections dropped) whose program is `jobcore` counts;
in a console block only the lines after a ``$`` prompt. Untagged blocks in these docs mix
shell commands with settings files and file trees, so there only lines that start with
`jobcore` count. No placeholder is skipped: a docs line says ``jobcore jobs show
0b6f3c2e-...``, not ``jobcore jobs show <id>`` (which the shell would read as redirections).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import dropwhile
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from services.commandline import EXAMPLE_LABEL, example
from services.entry import app
from tests.support.cli_parse import parse_jobcore

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "zsh", "console", "shell-session"})
PROMPT_LANGUAGES = frozenset({"console", "shell-session"})

# --- the help's examples -----------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # after `jobcore`; () is the program itself
    command: Any

    @property
    def is_group(self) -> bool:
        return isinstance(self.command, typer.core.TyperGroup)

    def __str__(self) -> str:
        return " ".join(("jobcore", *self.path))


def every_command() -> list[Command]:
    """The program, each group and each command under it, depth first."""
    found: list[Command] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        found.append(Command(path, command))
        if isinstance(command, typer.core.TyperGroup):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = every_command()


def example_words(command: Command) -> list[str]:
    """The words of a command's example, after `jobcore`; an assertion names what is wrong."""
    epilog = command.command.epilog
    assert epilog, f"`{command} --help` has no example (epilog=example(...))"
    assert epilog.startswith(f"{EXAMPLE_LABEL} "), f"{command}: not an example: {epilog!r}"
    assert epilog.count(EXAMPLE_LABEL) == 1, f"{command}: one example, not several"
    assert "\n" not in epilog, f"{command}: an example is one line: {epilog!r}"
    words = shlex.split(epilog.removeprefix(EXAMPLE_LABEL))
    assert words[0] == "jobcore", f"{command}: an example runs jobcore: {epilog!r}"
    return words[1:]


def test_the_walk_reaches_every_level_of_the_program() -> None:
    paths = {command.path for command in COMMANDS}
    expected = {(), ("jobs",), ("jobs", "list"), ("webhooks", "endpoint", "set"), ("bench",)}
    assert expected <= paths
    assert len(COMMANDS) >= 60


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_has_one_example_that_parses(command: Command) -> None:
    words = example_words(command)
    assert not {"--help", "-h"} & set(words), f"{command}: an example runs the command"
    resolved = parse_jobcore(tuple(words))
    if command.is_group:
        # A group's example runs one of its commands (a group alone only prints its help).
        assert tuple(resolved[: len(command.path)]) == command.path, (command, resolved)
        assert len(resolved) > len(command.path)
    else:
        assert tuple(resolved) == command.path, f"{command}'s example runs {resolved}"


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_example_uses_only_loopback_addresses(command: Command) -> None:
    line = " ".join(example_words(command))
    hosts = re.findall(r"://(?:[^@/\s]*@)?([^:/\s]+)", line)
    hosts += re.findall(r"--host[ =](\S+)", line)
    assert all(host == "127.0.0.1" for host in hosts), f"{command}: {line}"
    assert not re.search(r"\bjc_|whsec_|password", line, re.IGNORECASE), f"{command}: {line}"


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_help_shows_its_example(command: Command) -> None:
    example_words(command)  # there is one
    shown = CliRunner().invoke(app, [*command.path, "--help"])
    assert shown.exit_code == 0, shown.output
    # The help may wrap a long line; the words are what a reader copies.
    assert " ".join(command.command.epilog.split()) in " ".join(shown.output.split())


def test_an_example_is_one_plain_jobcore_line() -> None:
    assert example("jobcore jobs held") == f"{EXAMPLE_LABEL} jobcore jobs held"
    # Rich markup would eat [ ]; a second line would be a second example.
    for bad in ("jobcore jobs list --type [x]", "jobcore jobs held\njobcore jobs list", "ls"):
        with pytest.raises(ValueError, match="an example is one"):
            example(bad)


# --- the docs' command lines -------------------------------------------------------------


@dataclass(frozen=True)
class DocsLine:
    where: str  # file:line
    args: tuple[str, ...]  # after `jobcore`

    def __str__(self) -> str:
        return f"{self.where}: jobcore {shlex.join(self.args)}"


_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OPERATOR_CHARS = frozenset("();<>|&")


def fenced_blocks(text: str) -> Iterator[tuple[str, int, str]]:
    """(language, line number of the block's first line, body) of each fenced block."""
    for match in _FENCE.finditer(text):
        info = match["info"].strip().split()
        language = info[0].lower().strip("{}.") if info else ""
        first_line = text.count("\n", 0, match.start("body")) + 1
        yield language, first_line, match["body"]


def logical_lines(body: str) -> Iterator[tuple[int, str]]:
    """(offset of its first line, text) of each line, backslash continuations joined."""
    pending: list[str] = []
    start = 0
    for offset, line in enumerate(body.splitlines()):
        if not pending:
            start = offset
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        yield start, " ".join(pending)
        pending = []
    if pending:
        yield start, " ".join(pending)


def jobcore_commands(line: str) -> list[tuple[str, ...]]:
    """The arguments of each simple command in a shell line whose program is `jobcore`."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found: list[tuple[str, ...]] = []
    words: list[str] = []

    def end_command() -> None:
        command = list(dropwhile(_ASSIGNMENT.match, words))
        if command and Path(command[0]).name == "jobcore":
            found.append(tuple(command[1:]))
        words.clear()

    tokens = iter(list(lexer))
    for token in tokens:
        if set(token) <= _OPERATOR_CHARS:
            if "<" in token or ">" in token:  # a redirection: drop it and its target
                if words and words[-1].isdigit():  # the 2 of 2>&1
                    words.pop()
                next(tokens, None)
                continue
            end_command()
            continue
        words.append(token)
    end_command()
    return found


def docs_command_lines(path: Path, root: Path = ROOT) -> list[DocsLine]:
    where = path.relative_to(root)
    found: list[DocsLine] = []
    for language, first_line, body in fenced_blocks(path.read_text(encoding="utf-8")):
        if language and language not in SHELL_LANGUAGES:
            continue
        for offset, line in logical_lines(body):
            text = line.strip()
            if language in PROMPT_LANGUAGES:
                if not text.startswith("$ "):
                    continue  # the command's output
                text = text[2:]
            elif not language and not text.startswith("jobcore "):
                continue
            if not re.search(r"(^|[\s;&|(/])jobcore(\s|$)", text):
                continue
            for args in jobcore_commands(text):
                found.append(DocsLine(f"{where}:{first_line + offset}", args))
    return found


def docs_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


DOCS_LINES = [line for page in docs_pages() for line in docs_command_lines(page)]


def test_the_docs_scan_finds_their_command_lines() -> None:
    # The tutorial's and the how-to guides' blocks hold dozens; none found is a broken scan.
    assert len(DOCS_LINES) >= 20
    assert {line.where.split(":")[0] for line in DOCS_LINES} >= {
        "docs/tutorial.md",
        "docs/how-to/flow-control.md",
    }


def test_the_scan_reads_shell_as_the_shell_does(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "\n".join(
            [
                "```bash",
                "KEY=$(jobcore keys create --tenant acme --json | jq -r .key)  # a comment",
                "JOBCORE_LOG_LEVEL=debug .venv/bin/jobcore worker \\",
                "    --queue exports 2>&1 > worker.log &",
                "kubectl delete job jobcore-migrate && jobcore migrate",
                "```",
                "```console",
                "$ jobcore jobs held",
                "jobcore: output, not a command",
                "```",
                "```",
                "JOBCORE_DATABASE_URL=postgresql://127.0.0.1/jobcore",
                "jobcore topology --json",
                "services/cli/   `jobcore ui`: a file tree",
                "```",
                "```python",
                "jobcore = 1",
                "```",
            ]
        ),
        encoding="utf-8",
    )
    lines = docs_command_lines(page, root=tmp_path)
    assert [(line.where, line.args) for line in lines] == [
        ("page.md:2", ("keys", "create", "--tenant", "acme", "--json")),
        ("page.md:3", ("worker", "--queue", "exports")),
        ("page.md:5", ("migrate",)),
        ("page.md:8", ("jobs", "held")),
        ("page.md:13", ("topology", "--json")),
    ]


@pytest.mark.parametrize("line", DOCS_LINES, ids=str)
def test_every_docs_command_line_parses(line: DocsLine, capsys: pytest.CaptureFixture[str]) -> None:
    if "--help" in line.args:
        with pytest.raises(typer.Exit) as exited:
            parse_jobcore(line.args)
        assert exited.value.exit_code == 0
        assert "Usage" in capsys.readouterr().out
        return
    assert parse_jobcore(line.args), str(line)
