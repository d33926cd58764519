"""The deploy files: well-formed, schema-valid, and every command line they run is real.

Each `jobcore ...` command line in the Dockerfile, the compose file and the Kubernetes
manifests is parsed by the real CLI (without running it), so a renamed command or option
fails here, not in a pod. Every ``JOBCORE_*`` variable they mention must be a setting, so
a typo in a manifest fails here too instead of being silently ignored.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic_settings import BaseSettings

try:  # typer >= 0.22 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from jobcore.settings import ENV_PREFIX, Settings
from services.cli import app

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
OPERATIONS = ROOT / "docs" / "operations.md"

IMAGE = "jobcore"
ROLES = {"api", "relay", "worker"}

# Variables the deploy files may set before the code reads them (a setting being added
# in parallel), each with a comment saying why. Empty when the code has caught up.
PENDING_SETTINGS: set[str] = set()

# Time a process may still need after JOBCORE_SHUTDOWN_GRACE: the worker gives the leases
# of unfinished jobs back (up to ~6 s), every process stops its health server.
STOP_MARGIN_SECONDS = 10.0

# The oldest Kubernetes release the manifests promise to work on, and the newest whose
# schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.29", "latest")


# --- loading ----------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in {".yaml", ".yml"} and p.is_file())


def load_documents(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object under deploy/k8s (the kustomization is not one)."""
    return [
        (path, doc)
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in load_documents(path)
    ]


def objects_of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in k8s_objects() if doc["kind"] == kind]


def only(kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in objects_of_kind(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def compose() -> dict[str, Any]:
    [doc] = load_documents(COMPOSE)
    assert isinstance(doc, dict)
    return doc


def jobcore_compose_services() -> dict[str, dict[str, Any]]:
    """Compose services that run the jobcore image."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if is_jobcore_image(str(service.get("image", "")))
    }


def replicas(service: dict[str, Any]) -> int:
    return int(service.get("deploy", {}).get("replicas", 1))


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, doc in k8s_objects():
        if doc["kind"] in {"Deployment", "Job"}:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def is_jobcore_image(image: str) -> bool:
    return image.rsplit("/", 1)[-1].split(":")[0].split("@")[0] == IMAGE


# --- the Dockerfile ---------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def exec_form(keyword: str) -> list[str]:
    values = [rest for kw, rest in final_stage() if kw == keyword]
    assert values, f"the final stage has no {keyword}"
    parsed = json.loads(values[-1])
    # The exec (JSON) form makes jobcore PID 1, so SIGTERM reaches it; the shell form
    # would give SIGTERM to /bin/sh, which does not pass it on.
    assert isinstance(parsed, list), f"{keyword} must use the exec form"
    assert all(isinstance(v, str) for v in parsed)
    return parsed


# --- command lines ----------------------------------------------------------------------


@dataclass(frozen=True)
class CommandLine:
    where: str
    args: tuple[str, ...]  # after `jobcore`

    def __str__(self) -> str:
        return f"{self.where}: jobcore {shlex.join(self.args)}"


def command_lines() -> list[CommandLine]:
    """Every jobcore command line the deploy files run."""
    lines = []
    entrypoint = exec_form("ENTRYPOINT")
    assert entrypoint == ["jobcore"], "the image's ENTRYPOINT must be the jobcore program"
    lines.append(CommandLine("Dockerfile CMD", tuple(exec_form("CMD"))))

    for name, service in jobcore_compose_services().items():
        # Compose replaces the image's ENTRYPOINT only when `entrypoint` is given.
        entry = service.get("entrypoint", entrypoint)
        entry = shlex.split(entry) if isinstance(entry, str) else list(entry)
        command = service.get("command", exec_form("CMD"))
        command = shlex.split(command) if isinstance(command, str) else list(command)
        full = entry + command
        assert full[:1] == ["jobcore"], f"compose service {name} does not run jobcore: {full}"
        lines.append(CommandLine(f"compose {name}", tuple(full[1:])))

    for where, spec in pod_specs():
        for container in spec.get("initContainers", []) + spec["containers"]:
            if not is_jobcore_image(container["image"]):
                continue
            # Kubernetes: `command` replaces ENTRYPOINT, `args` replaces CMD.
            entry = container.get("command", entrypoint)
            full = list(entry) + list(container.get("args", exec_form("CMD")))
            assert full[:1] == ["jobcore"], f"{where} does not run jobcore: {full}"
            lines.append(CommandLine(f"{where} {container['name']}", tuple(full[1:])))
    return lines


def _unparsed(ctx: Any) -> list[str]:
    # A group keeps the subcommand name apart from its arguments; typer's vendored click
    # names the field `_protected_args` (click 8.2's public `protected_args` warns, and
    # warnings are errors here).
    protected = getattr(ctx, "_protected_args", None)
    if protected is None:
        protected = ctx.protected_args
    return [*protected, *ctx.args]


def parse_jobcore(args: tuple[str, ...], *, allow_group: bool = False) -> list[str]:
    """Parse ``jobcore ARGS`` as the program would, invoking nothing; return the command path.

    Mirrors typer's own group invocation (TyperGroup.invoke): unknown commands, unknown
    options, bad values and missing arguments raise a UsageError. ``allow_group`` accepts
    a group named without a subcommand (prose mentions `jobcore dlq`).
    """
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("jobcore", list(args), resilient_parsing=False)
    path: list[str] = []
    rest = _unparsed(ctx)
    while isinstance(command, typer.core.TyperGroup):
        if not rest and allow_group and path:
            break
        assert rest, f"`jobcore {' '.join(path)}` needs a subcommand"
        name, command, rest = command.resolve_command(ctx, rest)
        assert name is not None  # an unknown name raised a UsageError
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
        rest = _unparsed(ctx)
    return path


def documented_command_lines() -> list[CommandLine]:
    """`jobcore ...` in the operations guide: inline code and lines of code blocks."""
    text = OPERATIONS.read_text(encoding="utf-8")
    spans = re.findall(r"`(jobcore(?: [^`]*)?)`", text)
    for block in re.findall(r"^\s*```[a-z]*\n(.*?)^\s*```", text, flags=re.MULTILINE | re.DOTALL):
        spans += [
            line.strip() for line in block.splitlines() if line.strip().startswith("jobcore ")
        ]
    unique = dict.fromkeys(tuple(shlex.split(span)[1:]) for span in spans)
    return [CommandLine("docs/operations.md", args) for args in unique]


COMMAND_LINES = command_lines()
DOCUMENTED_COMMAND_LINES = documented_command_lines()


@pytest.mark.parametrize("line", COMMAND_LINES, ids=str)
def test_every_command_line_is_a_real_jobcore_command(
    line: CommandLine, capsys: pytest.CaptureFixture[str]
) -> None:
    if "--help" in line.args:
        with pytest.raises(typer.Exit) as exited:
            parse_jobcore(line.args)
        assert exited.value.exit_code == 0
        assert "Usage" in capsys.readouterr().out
        return
    path = parse_jobcore(line.args)
    assert path, str(line)


@pytest.mark.parametrize("line", DOCUMENTED_COMMAND_LINES, ids=str)
def test_every_documented_command_is_a_real_jobcore_command(
    line: CommandLine, capsys: pytest.CaptureFixture[str]
) -> None:
    if "--help" in line.args or not line.args:
        with pytest.raises(typer.Exit) as exited:
            parse_jobcore(line.args)
        assert exited.value.exit_code == 0
        assert "Usage" in capsys.readouterr().out
        return
    assert parse_jobcore(line.args, allow_group=True), str(line)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("compose", {"migrate", *ROLES}),
        ("Job/", {"migrate"}),
        ("Deployment/", ROLES),
    ],
)
def test_the_deploy_files_run_every_role(where: str, expected: set[str]) -> None:
    """Guards the extraction above: a command line it missed would go unchecked."""
    assert {line.args[0] for line in COMMAND_LINES if line.where.startswith(where)} == expected


@pytest.mark.parametrize(
    "args",
    [("no-such-command",), ("migrate", "--no-such-option"), ("migrate", "extra-argument")],
    ids=shlex.join,
)
def test_the_command_line_check_rejects_bad_commands(args: tuple[str, ...]) -> None:
    with pytest.raises(click_exceptions.UsageError):
        parse_jobcore(args)


# --- settings ---------------------------------------------------------------------------


def setting_classes() -> list[type[BaseSettings]]:
    """The shared Settings and every service's own options class (``JOBCORE_RELAY_*``...).

    The CLI has imported every service's commands; options modules a command imports
    lazily are imported here, so their variables count too.
    """
    for service in ("api", "relay", "worker"):
        name = f"services.{service}.options"
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    found, stack = [], [BaseSettings]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if str(cls.model_config.get("env_prefix", "")).startswith(ENV_PREFIX):
            found.append(cls)
    assert Settings in found
    return found


def setting_names() -> set[str]:
    return {
        f"{cls.model_config.get('env_prefix', '')}{field}".upper()
        for cls in setting_classes()
        for field in cls.model_fields
    }


def files_naming_settings() -> list[Path]:
    files = [p for p in DEPLOY.rglob("*") if p.is_file()] + [OPERATIONS]
    return sorted(p for p in files if p.suffix not in {".png", ".svg"})


@pytest.mark.parametrize("path", files_naming_settings(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_jobcore_variable_is_a_setting(path: Path) -> None:
    used = set(re.findall(r"\bJOBCORE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    unknown = used - setting_names() - PENDING_SETTINGS
    assert not unknown, f"{path.name} names variables that are not settings: {sorted(unknown)}"


def test_pending_settings_are_still_pending() -> None:
    """Once a pending setting exists, it leaves the allow-list (so typos of it fail)."""
    assert not PENDING_SETTINGS & setting_names()


# --- YAML and Kubernetes ----------------------------------------------------------------


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_parses(path: Path) -> None:
    documents = load_documents(path)
    assert documents, f"{path} is empty"
    assert all(isinstance(doc, dict) for doc in documents)


def test_every_kubernetes_object_has_kind_and_name() -> None:
    objects = k8s_objects()
    kinds = {doc["kind"] for _, doc in objects}
    assert {
        "ConfigMap",
        "Secret",
        "Job",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "PersistentVolumeClaim",
    } <= kinds
    names = [(doc["kind"], doc["metadata"]["name"]) for _, doc in objects]
    assert len(names) == len(set(names)), "two objects share a kind and name"
    for path, doc in objects:
        assert doc.get("apiVersion"), path
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), path
        # Namespace-agnostic: `kubectl apply -n` or an overlay chooses it.
        assert "namespace" not in doc["metadata"], path


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_objects_match_the_api_schemas(version: str) -> None:
    try:
        import kubernetes_validate  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - a missing dev dependency must fail, not skip
        pytest.fail("kubernetes-validate is not installed: it belongs in the dev extras")
    if version == "latest":
        version = kubernetes_validate.latest_version()
    errors = []
    for path, doc in k8s_objects():
        try:
            # strict: unknown fields are errors (a misspelled field is otherwise ignored).
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {exc}")
    assert not errors, "\n".join(errors)


def test_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    [kustomization] = load_documents(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    manifests = {
        p.name
        for p in K8S.glob("*.yaml")
        if p.name != "kustomization.yaml" and not p.name.endswith(".example.yaml")
    }
    assert set(listed) == manifests
    # Real credentials are managed out of band; `apply -k` must never overwrite them.
    assert not any(doc["kind"] == "Secret" for name in listed for doc in load_documents(K8S / name))
    assert [image["name"] for image in kustomization["images"]] == [IMAGE]


def test_config_references_resolve() -> None:
    configmaps = {doc["metadata"]["name"] for doc in objects_of_kind("ConfigMap")}
    secrets = {doc["metadata"]["name"] for doc in objects_of_kind("Secret")}
    claims = {doc["metadata"]["name"] for doc in objects_of_kind("PersistentVolumeClaim")}
    for where, spec in pod_specs():
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps, where
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, where
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, where


def test_deployment_selectors_match_their_pods() -> None:
    deployments = objects_of_kind("Deployment")
    assert {d["metadata"]["name"] for d in deployments} >= {f"jobcore-{r}" for r in ROLES}
    for deployment in deployments:
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector, deployment["metadata"]["name"]
        assert selector.items() <= labels.items(), deployment["metadata"]["name"]


def selects(selector: dict[str, str], deployment: dict[str, Any]) -> bool:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return selector.items() <= labels.items()


def selects_only(selector: dict[str, str], deployment: dict[str, Any]) -> bool:
    name = deployment["metadata"]["name"]
    others = [d for d in objects_of_kind("Deployment") if d["metadata"]["name"] != name]
    return selects(selector, deployment) and not any(selects(selector, d) for d in others)


def test_the_api_service_routes_to_the_api_pods() -> None:
    api = only("Deployment", "jobcore-api")
    service = only("Service", "jobcore-api")
    assert selects_only(service["spec"]["selector"], api)
    [container] = api["spec"]["template"]["spec"]["containers"]
    declared = {p["name"] for p in container["ports"]} | {
        p["containerPort"] for p in container["ports"]
    }
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in declared


def test_relays_survive_losing_one_pod() -> None:
    relay = only("Deployment", "jobcore-relay")
    assert relay["spec"]["replicas"] >= 2
    budgets = [
        pdb
        for pdb in objects_of_kind("PodDisruptionBudget")
        if selects_only(pdb["spec"]["selector"]["matchLabels"], relay)
    ]
    assert len(budgets) == 1
    assert budgets[0]["spec"]["minAvailable"] >= 1
    assert budgets[0]["spec"]["minAvailable"] < relay["spec"]["replicas"], "drains would block"


def role_port(role: str) -> int:
    """The port a role's health endpoints listen on, from the ConfigMap."""
    data = only("ConfigMap", "jobcore-config")["data"]
    key = "JOBCORE_API_PORT" if role == "api" else f"JOBCORE_{role.upper()}_HEALTH_PORT"
    return int(data[key])


@pytest.mark.parametrize("role", sorted(ROLES))
def test_probes_hit_the_health_endpoints_on_a_declared_port(role: str) -> None:
    deployment = only("Deployment", f"jobcore-{role}")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][:1] == [role]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert role_port(role) in ports.values(), "the container must declare the port it serves"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        http = container[probe]["httpGet"]
        assert http["path"] == path
        port = ports.get(http["port"], http["port"])
        assert port == role_port(role), f"{probe} of {role} is not on its health port"


def effective_env(container: dict[str, Any], name: str) -> str | None:
    for item in container.get("env", []):
        if item["name"] == name:
            return str(item["value"])
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            data = only("ConfigMap", source["configMapRef"]["name"]).get("data", {})
            if name in data:
                return str(data[name])
    return None


def test_pods_run_unprivileged_with_resources_and_enough_grace() -> None:
    for where, spec in pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec.get("automountServiceAccountToken") is False, where
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            resources = container["resources"]
            assert {"cpu", "memory"} <= resources["requests"].keys(), where
            assert "memory" in resources["limits"], where
            # Python writes temporary files; a read-only root needs a writable /tmp.
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, where
            if where.startswith("Deployment/"):
                grace = float(effective_env(container, "JOBCORE_SHUTDOWN_GRACE") or 10.0)
                pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {})
                pre_stop_seconds = float(pre_stop["command"][-1]) if pre_stop else 0.0
                # The kubelet's SIGKILL must come after jobcore's own grace has run out,
                # and after what follows it (a worker then gives leases back).
                needed = pre_stop_seconds + grace + STOP_MARGIN_SECONDS
                assert spec["terminationGracePeriodSeconds"] >= needed, where


def test_results_are_shared_between_the_api_and_the_workers() -> None:
    result_dir = only("ConfigMap", "jobcore-config")["data"]["JOBCORE_RESULT_DIR"]
    claims = {}
    for role in ("api", "worker"):
        spec = only("Deployment", f"jobcore-{role}")["spec"]["template"]["spec"]
        [container] = spec["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == result_dir]
        [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        claims[role] = volume["persistentVolumeClaim"]["claimName"]
    assert claims["api"] == claims["worker"]
    pvc = only("PersistentVolumeClaim", claims["api"])
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]


def test_the_secret_example_holds_placeholders_only() -> None:
    [secret] = objects_of_kind("Secret")
    values = secret["stringData"]
    assert set(values) == {"JOBCORE_DATABASE_URL", "JOBCORE_AMQP_URL"}
    assert all("CHANGE-ME" in value for value in values.values())
    assert not only("ConfigMap", "jobcore-config")["data"].keys() & values.keys()


# --- compose ----------------------------------------------------------------------------


def test_compose_runs_two_relays_two_workers_after_the_migration() -> None:
    services = jobcore_compose_services()
    by_role: dict[str, int] = {}
    for service in services.values():
        role = service["command"][0]
        by_role[role] = by_role.get(role, 0) + replicas(service)
    assert by_role.get("relay", 0) >= 2
    assert by_role.get("worker", 0) >= 2
    assert by_role.get("api", 0) >= 1
    assert by_role.get("migrate") == 1

    for name, service in services.items():
        if service["command"][0] == "migrate":
            assert service.get("restart") == "no"
            continue
        condition = service["depends_on"]["migrate"]["condition"]
        assert condition == "service_completed_successfully", name


def test_compose_healthchecks_probe_each_role_on_its_port() -> None:
    for name, service in jobcore_compose_services().items():
        role = service["command"][0]
        if role not in ROLES:
            continue
        environment = service["environment"]
        port = (
            environment["JOBCORE_API_PORT"]
            if role == "api"
            else environment[f"JOBCORE_{role.upper()}_HEALTH_PORT"]
        )
        probe = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in probe, name
        assert environment.get("JOBCORE_HEALTH_HOST" if role != "api" else "JOBCORE_API_HOST") == (
            "0.0.0.0"
        ), f"{name} must listen outside its container"


def test_compose_sends_traces_to_jaeger_with_one_service_name_per_role() -> None:
    doc = compose()
    assert "jaeger" in doc["services"]
    names = {}
    for name, service in jobcore_compose_services().items():
        environment = service["environment"]
        assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318", name
        names[service["command"][0]] = environment["OTEL_SERVICE_NAME"]
    assert len(set(names.values())) == len(names)


def test_compose_builds_the_image_from_the_dockerfile() -> None:
    for name, service in jobcore_compose_services().items():
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE, name


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    users = [rest for keyword, rest in final_stage() if keyword == "USER"]
    assert users, "the final stage has no USER"
    uid = users[-1].split(":")[0]
    # runAsNonRoot can only verify a numeric uid.
    assert uid.isdigit(), "USER must be numeric"
    assert int(uid) != 0
    for _, spec in pod_specs():
        assert str(spec["securityContext"]["runAsUser"]) == uid


def test_compose_waits_out_the_shutdown_grace_before_killing() -> None:
    for name, service in jobcore_compose_services().items():
        if service["command"][0] not in ROLES:
            continue
        grace = float(service["environment"].get("JOBCORE_SHUTDOWN_GRACE", 10.0))
        stop = re.fullmatch(r"(\d+)s", str(service["stop_grace_period"]))
        assert stop, f"{name}: write stop_grace_period in seconds"
        assert int(stop.group(1)) >= grace + STOP_MARGIN_SECONDS, name
