"""The deploy files: well-formed, schema-valid, and every command line they run is real.

Each `jobcore ...` command line in the Dockerfile, the compose file and the Kubernetes
manifests is parsed by the real CLI (without running it), so a renamed command or option
fails here, not in a pod. Every ``JOBCORE_*`` variable they mention must be a setting, so
a typo in a manifest fails here too instead of being silently ignored.

Both deployments run a three-node RabbitMQ cluster and PgBouncer in transaction mode: the
tests read the broker's and PgBouncer's own configuration files (and the RabbitmqCluster
resource, which kubernetes-validate has no schema for, against a schema subset of the
operator's CRD) and check that the jobcore services are wired to them.
"""

from __future__ import annotations

import configparser
import importlib
import importlib.util
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import typer
import yaml
from pydantic_settings import BaseSettings

try:  # typer >= 0.22 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from jobcore.kernel.settings import ENV_PREFIX, Settings, parse_store_url
from tests.support.cli_parse import parse_jobcore

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
# The operators' guides: what docs/operations.md was before it became the site's how-to
# pages (every variable they name is a setting).
HOW_TO = sorted((ROOT / "docs" / "how-to").glob("*.md"))
# The README and every page of the site but the bench's reports (every `jobcore ...` in
# them is a real command).
DOCUMENTATION = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "bench" not in p.parts),
]

IMAGE = "jobcore"
ROLES = {"api", "relay", "worker"}

# Variables the deploy files may set before the code reads them (a setting being added
# in parallel), each with a comment saying why. Empty when the code has caught up.
# Settings the manifests may name before jobcore.kernel.settings has them (none today).
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


# --- RabbitMQ, PgBouncer and PostgreSQL URLs and configuration files ---------------------


def rabbitmq_conf(text: str) -> dict[str, str]:
    """rabbitmq.conf (sysctl format): `key = value` lines, `#` comments."""
    entries = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a `key = value` line: {raw!r}"
        assert key.strip() not in entries, f"{key.strip()} is set twice"
        entries[key.strip()] = value.strip()
    return entries


def classic_config_nodes(conf: dict[str, str]) -> set[str]:
    """The node list of classic config peer discovery."""
    backend = conf.get("cluster_formation.peer_discovery_backend")
    assert backend in {"classic_config", "rabbit_peer_discovery_classic_config"}, backend
    return {
        value
        for key, value in conf.items()
        if re.fullmatch(r"cluster_formation\.classic_config\.nodes\.\d+", key)
    }


def pgbouncer_ini(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"))
    parser.read_string(text)
    return parser


def pgbouncer_database(ini: configparser.ConfigParser, name: str) -> dict[str, str]:
    """A [databases] entry's connection string, as a dict (`host=... port=...`)."""
    assert ini.has_option("databases", name), f"PgBouncer serves no database {name!r}"
    return dict(pair.split("=", 1) for pair in ini.get("databases", name).split())


def check_transaction_pooling(ini: configparser.ConfigParser) -> None:
    settings = ini["pgbouncer"]
    assert settings["pool_mode"] == "transaction"
    # Protocol-level prepared statements would be tracked (1.24's default: 200); jobcore
    # prepares none behind PgBouncer and must not come to rely on it.
    assert settings.get("max_prepared_statements", "0") == "0"
    # jobcore's per-session idle_in_transaction_session_timeout is a SET, which PgBouncer
    # cannot keep per client: PgBouncer ends silent transactions itself.
    assert float(settings["idle_transaction_timeout"]) > 0


def userlist(text: str) -> list[tuple[str, str]]:
    """PgBouncer's auth_file: one `"user" "password"` per line."""
    entries = []
    for line in text.splitlines():
        if line.strip():
            match = re.fullmatch(r'\s*"([^"]+)"\s+"([^"]*)"\s*', line)
            assert match, f"not a userlist line: {line!r}"
            entries.append((match.group(1), match.group(2)))
    return entries


def pg_hosts(url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a libpq URL, multi-host ones included (a,b:5433)."""
    netloc = url.split("://", 1)[1].split("/", 1)[0]
    hosts = []
    for part in netloc.rpartition("@")[2].split(","):
        host, _, port = part.partition(":")
        hosts.append((host, int(port or 5432)))
    return hosts


def amqp_hosts(urls: str) -> list[tuple[str, int]]:
    """The (host, port) of each URL of a comma-separated JOBCORE_AMQP_URL."""
    hosts = []
    for url in urls.split(","):
        parts = urlsplit(url.strip())
        assert parts.scheme in {"amqp", "amqps"}, url
        assert parts.hostname, url
        assert parts.username, f"{parts.hostname}: no user"
        assert parts.password, f"{parts.hostname}: no password"
        hosts.append((parts.hostname, parts.port or (5671 if parts.scheme == "amqps" else 5672)))
    return hosts


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


def documented_command_lines() -> list[CommandLine]:
    """`jobcore ...` in the README and the docs: inline code and lines of code blocks (a
    shell comment and a trailing `&` are not the command's)."""
    found: dict[tuple[str, ...], str] = {}
    for page in DOCUMENTATION:
        text = page.read_text(encoding="utf-8")
        spans = re.findall(r"`(jobcore(?: [^`]*)?)`", text)
        blocks = re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", text, flags=re.MULTILINE | re.DOTALL)
        for block in blocks:
            spans += [
                line.strip() for line in block.splitlines() if line.strip().startswith("jobcore ")
            ]
        for span in spans:
            args = shlex.split(span, comments=True)[1:]
            if not args:  # the program's name in prose
                continue
            found.setdefault(
                tuple(args[:-1] if args[-1:] == ["&"] else args), str(page.relative_to(ROOT))
            )
    return [CommandLine(page, args) for args, page in found.items()]


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
    files = [p for p in DEPLOY.rglob("*") if p.is_file()] + HOW_TO
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
        "RabbitmqCluster",
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
        if doc["kind"] in CUSTOM_RESOURCE_SCHEMAS:
            continue  # no schema in kubernetes-validate: see the custom resource tests
        try:
            # strict: unknown fields are errors (a misspelled field is otherwise ignored).
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {exc}")
    assert not errors, "\n".join(errors)


# --- custom resources -------------------------------------------------------------------

# A Kubernetes quantity ("20Gi", "500m", 2): the operator's CRD takes an int or a string.
QUANTITY: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {
            "type": "string",
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
            r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        },
    ]
}
STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}

# The part of the RabbitMQ Cluster Operator's CRD (rabbitmq.com/v1beta1, its Go types in
# api/v1beta1/rabbitmqcluster_types.go) that the manifests use or could misspell: every
# field of `spec` and of `spec.rabbitmq` is listed, so an unknown one fails as
# kubernetes-validate's strict mode does for built-in kinds. Pod-level fields (resources,
# affinity, tolerations) are checked against the real Pod schema instead.
RABBITMQ_CLUSTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "rabbitmq.com/v1beta1"},
        "kind": {"const": "RabbitmqCluster"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "labels": STRING_MAP,
                "annotations": STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "image": {"type": "string"},
                "imagePullSecrets": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {"name": {"type": "string"}},
                    },
                },
                "service": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "type": {"enum": ["ClusterIP", "LoadBalancer", "NodePort"]},
                        "annotations": STRING_MAP,
                    },
                },
                "persistence": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"storageClassName": {"type": "string"}, "storage": QUANTITY},
                },
                "resources": {"type": "object"},
                "affinity": {"type": "object"},
                "tolerations": {"type": "array", "items": {"type": "object"}},
                "rabbitmq": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "additionalPlugins": {
                            "type": "array",
                            "maxItems": 100,
                            "items": {"type": "string", "pattern": r"^\w+$", "maxLength": 100},
                        },
                        "additionalConfig": {"type": "string", "maxLength": 2000},
                        "advancedConfig": {"type": "string", "maxLength": 100000},
                        "envConfig": {"type": "string", "maxLength": 100000},
                    },
                },
                "tls": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "secretName": {"type": "string"},
                        "caSecretName": {"type": "string"},
                        "disableNonTLSListeners": {"type": "boolean"},
                    },
                },
                "override": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "statefulSet": {"type": "object"},
                        "service": {"type": "object"},
                    },
                },
                "skipPostDeploySteps": {"type": "boolean"},
                "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
                "secretBackend": {"type": "object"},
            },
        },
    },
}

CUSTOM_RESOURCE_SCHEMAS: dict[str, dict[str, Any]] = {"RabbitmqCluster": RABBITMQ_CLUSTER_SCHEMA}


def schema_errors(doc: dict[str, Any]) -> list[str]:
    schema = CUSTOM_RESOURCE_SCHEMAS[doc["kind"]]
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(doc)
    ]


def test_custom_resource_schemas_are_valid_json_schemas() -> None:
    for schema in CUSTOM_RESOURCE_SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_custom_resources_match_their_schema_subset() -> None:
    objects = [(path, doc) for path, doc in k8s_objects() if doc["kind"] in CUSTOM_RESOURCE_SCHEMAS]
    assert objects
    errors = [
        f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {error}"
        for path, doc in objects
        for error in schema_errors(doc)
    ]
    assert not errors, "\n".join(errors)


def rabbitmq_cluster() -> dict[str, Any]:
    [cluster] = objects_of_kind("RabbitmqCluster")
    return cluster


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("spec", "replica"), 3),  # misspelled
        (("spec", "replicas"), "3"),
        (("spec", "rabbitmq", "additionalConfig"), "x" * 2001),
        (("spec", "rabbitmq", "extraConfig"), "default_queue_type = quorum"),
        (("spec", "persistence", "storage"), "20 gigabytes"),
        (("spec", "service", "type"), "Headless"),
    ],
    ids=lambda v: ".".join(v) if isinstance(v, tuple) else None,
)
def test_the_schema_subset_rejects_what_the_operator_would(
    where: tuple[str, ...], value: object
) -> None:
    """Guards the subset above: each of these would be refused by the API server."""
    doc = json.loads(json.dumps(rabbitmq_cluster()))
    node = doc
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = value
    assert schema_errors(doc)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rabbitmq_cluster_pod_fields_match_the_pod_schema(version: str) -> None:
    """resources, affinity and tolerations are a Pod's types: checked as a Pod's."""
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    spec = rabbitmq_cluster()["spec"]
    container = {"name": "rabbitmq", "image": spec["image"], "resources": spec["resources"]}
    pod_spec: dict[str, Any] = {"containers": [container]}
    for field in ("affinity", "tolerations"):
        if field in spec:
            pod_spec[field] = spec[field]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rabbitmq"}, "spec": pod_spec}
    kubernetes_validate.validate(pod, version, strict=True)


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


def config_data(kind: str, name: str) -> dict[str, str]:
    """A ConfigMap's data or an (example) Secret's stringData."""
    doc = only(kind, name)
    return dict(doc.get("data" if kind == "ConfigMap" else "stringData", {}))


def test_config_references_resolve() -> None:
    configmaps = {doc["metadata"]["name"] for doc in objects_of_kind("ConfigMap")}
    secrets = {doc["metadata"]["name"] for doc in objects_of_kind("Secret")}
    claims = {doc["metadata"]["name"] for doc in objects_of_kind("PersistentVolumeClaim")}
    for where, spec in pod_specs():
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
            sources = [*volume.get("projected", {}).get("sources", []), volume]
            for source in sources:
                for kind, field, key in (
                    ("ConfigMap", "configMap", "name"),
                    ("Secret", "secret", "secretName"),
                ):
                    if field not in source:
                        continue
                    name = source[field].get(key, source[field].get("name"))
                    assert name in (configmaps if kind == "ConfigMap" else secrets), where
                    for item in source[field].get("items", []):
                        assert item["key"] in config_data(kind, name), f"{where}: {item}"
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps, where
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, where
            for item in container.get("env", []):
                for kind, field in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    ref = item.get("valueFrom", {}).get(field)
                    if ref:
                        assert ref["key"] in config_data(kind, ref["name"]), f"{where}: {item}"
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
    """The variable's value in the container (Secrets: the example's placeholders).

    `env` wins over `envFrom`; among `envFrom` sources, the last one naming it wins.
    """
    for item in container.get("env", []):
        if item["name"] != name:
            continue
        if "value" in item:
            return str(item["value"])
        for kind, field in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
            ref = item["valueFrom"].get(field)
            if ref:
                return config_data(kind, ref["name"])[ref["key"]]
        raise AssertionError(f"{name}: a valueFrom this test cannot resolve")
    found = None
    for source in container.get("envFrom", []):
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if field in source:
                data = config_data(kind, source[field]["name"])
                if name in data:
                    found = str(data[name])
    return found


def sleep_seconds(command: list[str]) -> float:
    """How long a preStop command sleeps: `sleep N`, alone or in a shell line."""
    sleeps = re.findall(r"\bsleep (\d+(?:\.\d+)?)\b", " ".join(command))
    assert len(sleeps) == 1, f"a preStop hook must sleep once: {command}"
    return float(sleeps[0])


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
                pre_stop_seconds = sleep_seconds(pre_stop["command"]) if pre_stop else 0.0
                # The kubelet's SIGKILL must come after jobcore's own grace has run out,
                # and after what follows it (a worker then gives leases back).
                needed = pre_stop_seconds + grace + STOP_MARGIN_SECONDS
                assert spec["terminationGracePeriodSeconds"] >= needed, where


def test_results_live_in_a_bucket_and_no_pod_needs_a_shared_volume() -> None:
    config = only("ConfigMap", "jobcore-config")["data"]
    parse_store_url(config["JOBCORE_RESULT_STORE"])  # the worker and API would refuse it
    assert config["JOBCORE_RESULT_STORE"].startswith("s3://")
    assert "JOBCORE_RESULT_DIR" not in config
    assert not objects_of_kind("PersistentVolumeClaim")
    for role in ("api", "worker"):
        spec = only("Deployment", f"jobcore-{role}")["spec"]["template"]["spec"]
        assert not [v for v in spec["volumes"] if "persistentVolumeClaim" in v], role
        [container] = spec["containers"]
        sources = {s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s}
        assert "jobcore-secrets" in sources, role


def test_the_secret_example_holds_placeholders_only() -> None:
    secrets = {doc["metadata"]["name"]: doc["stringData"] for doc in objects_of_kind("Secret")}
    assert set(secrets) == {"jobcore-secrets", "jobcore-pgbouncer-userlist"}
    values = secrets["jobcore-secrets"]
    assert set(values) == {
        "JOBCORE_DATABASE_URL",
        "JOBCORE_LISTEN_DATABASE_URL",
        "JOBCORE_AMQP_URL",
        "JOBCORE_S3_ACCESS_KEY_ID",
        "JOBCORE_S3_SECRET_ACCESS_KEY",
    }
    assert all("CHANGE-ME" in value for value in values.values())
    assert not only("ConfigMap", "jobcore-config")["data"].keys() & values.keys()
    assert all(
        password == "CHANGE-ME"
        for _, password in userlist(secrets["jobcore-pgbouncer-userlist"]["userlist.txt"])
    )


def rabbitmq_node_hosts(cluster: dict[str, Any]) -> set[str]:
    """The DNS names the operator gives the cluster's pods (its headless `-nodes` Service)."""
    name = cluster["metadata"]["name"]
    return {f"{name}-server-{i}.{name}-nodes" for i in range(cluster["spec"]["replicas"])}


def role_containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for role in sorted(ROLES):
        [container] = only("Deployment", f"jobcore-{role}")["spec"]["template"]["spec"][
            "containers"
        ]
        yield role, container


def test_rabbitmq_runs_three_nodes_with_quorum_queues_by_default() -> None:
    spec = rabbitmq_cluster()["spec"]
    # A quorum queue runs while a majority of its replicas do: three nodes survive one
    # lost, and an even count adds a node without adding a tolerated loss.
    assert spec["replicas"] >= 3
    assert spec["replicas"] % 2 == 1
    assert {"cpu", "memory"} <= spec["resources"]["requests"].keys()
    assert "memory" in spec["resources"]["limits"]
    assert spec["persistence"]["storage"]
    conf = rabbitmq_conf(spec["rabbitmq"]["additionalConfig"])
    assert conf["default_queue_type"] == "quorum"
    # The broker's consumer_timeout (ms) is the one jobcore is told about.
    told = only("ConfigMap", "jobcore-config")["data"].get("JOBCORE_AMQP_CONSUMER_TIMEOUT")
    seconds = float(told) if told else Settings.model_fields["amqp_consumer_timeout"].default
    assert int(conf.get("consumer_timeout", 1_800_000)) == seconds * 1000


def test_kubernetes_amqp_url_lists_every_rabbitmq_node() -> None:
    url = config_data("Secret", "jobcore-secrets")["JOBCORE_AMQP_URL"]
    hosts = amqp_hosts(url)
    assert len(hosts) == len(set(hosts))
    assert {host for host, _ in hosts} == rabbitmq_node_hosts(rabbitmq_cluster())
    assert {port for _, port in hosts} == {5672}
    for role, container in role_containers():
        assert effective_env(container, "JOBCORE_AMQP_URL") == url, role


def test_kubernetes_services_reach_postgres_through_pgbouncer_in_transaction_mode() -> None:
    deployment = only("Deployment", "jobcore-pgbouncer")
    service = only("Service", "jobcore-pgbouncer")
    assert deployment["spec"]["replicas"] >= 2, "one PgBouncer is a single point of failure"
    assert selects_only(service["spec"]["selector"], deployment)
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    [port] = service["spec"]["ports"]

    ini = pgbouncer_ini(config_data("ConfigMap", "jobcore-pgbouncer")["pgbouncer.ini"])
    check_transaction_pooling(ini)
    assert int(ini["pgbouncer"]["listen_port"]) == ports.get(port["targetPort"], port["targetPort"])
    # The image runs `pgbouncer /etc/pgbouncer/pgbouncer.ini`; auth_file must be there too.
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    mounted = set()
    for mount in container["volumeMounts"]:
        for source in volumes[mount["name"]].get("projected", {}).get("sources", []):
            for field in ("configMap", "secret"):
                for item in source.get(field, {}).get("items", []):
                    mounted.add(f"{mount['mountPath']}/{item['path']}")
    assert {"/etc/pgbouncer/pgbouncer.ini", ini["pgbouncer"]["auth_file"]} <= mounted

    url = config_data("Secret", "jobcore-secrets")["JOBCORE_DATABASE_URL"]
    assert pg_hosts(url) == [(service["metadata"]["name"], port["port"])]
    pgbouncer_database(ini, urlsplit(url).path.lstrip("/"))
    for role, container in role_containers():
        assert effective_env(container, "JOBCORE_DATABASE_URL") == url, role
        assert effective_env(container, "JOBCORE_DATABASE_POOLER") == "pgbouncer", role


def test_kubernetes_listen_and_migrations_go_straight_to_postgres() -> None:
    values = config_data("Secret", "jobcore-secrets")
    direct = values["JOBCORE_LISTEN_DATABASE_URL"]
    hosts = {host for host, _ in pg_hosts(direct)}
    assert only("Service", "jobcore-pgbouncer")["metadata"]["name"] not in hosts
    # The example shows the failover form: every server, libpq picks the writable one.
    assert len(hosts) >= 2
    assert "target_session_attrs=read-write" in urlsplit(direct).query
    assert urlsplit(direct).path == urlsplit(values["JOBCORE_DATABASE_URL"]).path
    for role, container in role_containers():
        assert effective_env(container, "JOBCORE_LISTEN_DATABASE_URL") == direct, role

    [migrate] = only("Job", "jobcore-migrate")["spec"]["template"]["spec"]["containers"]
    assert effective_env(migrate, "JOBCORE_DATABASE_URL") == direct
    assert effective_env(migrate, "JOBCORE_DATABASE_POOLER") in {None, "none"}


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


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split(":")[0].split("@")[0]


def compose_services_running(name: str) -> dict[str, dict[str, Any]]:
    return {
        service_name: service
        for service_name, service in compose()["services"].items()
        if image_name(str(service.get("image", ""))) == name
    }


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> file on this machine, for the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE.parent / source).resolve()
            assert mounts[target].is_file(), f"{volume}: no such file"
    return mounts


def compose_pgbouncer() -> tuple[str, configparser.ConfigParser, list[tuple[str, str]]]:
    [(name, service)] = compose_services_running("pgbouncer").items()
    mounts = bind_mounts(service)
    # The image runs `pgbouncer /etc/pgbouncer/pgbouncer.ini`.
    ini = pgbouncer_ini(mounts["/etc/pgbouncer/pgbouncer.ini"].read_text(encoding="utf-8"))
    users = userlist(mounts[ini["pgbouncer"]["auth_file"]].read_text(encoding="utf-8"))
    return name, ini, users


def test_compose_runs_a_three_node_rabbitmq_cluster() -> None:
    nodes = compose_services_running("rabbitmq")
    assert len(nodes) == 3
    hostnames = {name: service["hostname"] for name, service in nodes.items()}
    assert len(set(hostnames.values())) == 3
    # Nodes talk only when they share the Erlang cookie.
    cookies = {service["environment"]["RABBITMQ_ERLANG_COOKIE"] for service in nodes.values()}
    assert len(cookies) == 1
    assert all(cookies)

    data_volumes = set()
    for name, service in nodes.items():
        mounts = bind_mounts(service)
        [conf_file] = [
            path
            for target, path in mounts.items()
            if target.startswith("/etc/rabbitmq/conf.d/") and target.endswith(".conf")
        ]
        conf = rabbitmq_conf(conf_file.read_text(encoding="utf-8"))
        # The node name is rabbit@<host name>: each node lists all three.
        assert classic_config_nodes(conf) == {f"rabbit@{h}" for h in hostnames.values()}, name
        assert conf["default_queue_type"] == "quorum", name
        [data] = [
            v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == "/var/lib/rabbitmq"
        ]
        data_volumes.add(data)
    assert len(data_volumes) == 3, "each node needs its own data directory"

    # Started together, each node could form a cluster of its own: one starts first and
    # the others join it once it answers.
    [first] = [
        name
        for name, service in nodes.items()
        if not nodes.keys() & service.get("depends_on", {}).keys()
    ]
    for name, service in nodes.items():
        if name != first:
            assert service["depends_on"][first]["condition"] == "service_healthy", name
    # The same broker as in Kubernetes.
    assert {service["image"] for service in nodes.values()} == {rabbitmq_cluster()["spec"]["image"]}


def test_compose_runs_pgbouncer_in_transaction_mode_in_front_of_postgres() -> None:
    _, ini, users = compose_pgbouncer()
    check_transaction_pooling(ini)
    [postgres] = compose_services_running("postgres")
    environment = compose()["services"][postgres]["environment"]
    entry = pgbouncer_database(ini, environment["POSTGRES_DB"])
    assert (entry["host"], int(entry.get("port", 5432))) == (postgres, 5432)
    assert (environment["POSTGRES_USER"], environment["POSTGRES_PASSWORD"]) in users


def test_compose_services_reach_postgres_through_pgbouncer_but_listen_directly() -> None:
    pgbouncer, ini, users = compose_pgbouncer()
    [postgres] = compose_services_running("postgres")
    through_pgbouncer = [(pgbouncer, int(ini["pgbouncer"]["listen_port"]))]
    for name, service in jobcore_compose_services().items():
        environment = service["environment"]
        assert pg_hosts(environment["JOBCORE_LISTEN_DATABASE_URL"]) == [(postgres, 5432)], name
        url = environment["JOBCORE_DATABASE_URL"]
        if service["command"][0] == "migrate":
            # Session locks, and --create-database needs the server's `postgres` database.
            assert pg_hosts(url) == [(postgres, 5432)]
            assert environment.get("JOBCORE_DATABASE_POOLER", "none") == "none"
            continue
        assert pg_hosts(url) == through_pgbouncer, name
        assert environment["JOBCORE_DATABASE_POOLER"] == "pgbouncer", name
        pgbouncer_database(ini, urlsplit(url).path.lstrip("/"))
        assert (urlsplit(url).username, urlsplit(url).password) in users, name
        assert service["depends_on"][pgbouncer]["condition"] == "service_healthy", name


def test_compose_amqp_url_lists_every_rabbitmq_node() -> None:
    nodes = compose_services_running("rabbitmq")
    hostnames = {service["hostname"] for service in nodes.values()}
    credentials = {
        (
            service["environment"]["RABBITMQ_DEFAULT_USER"],
            service["environment"]["RABBITMQ_DEFAULT_PASS"],
        )
        for service in nodes.values()
    }
    for name, service in jobcore_compose_services().items():
        url = service["environment"]["JOBCORE_AMQP_URL"]
        hosts = amqp_hosts(url)
        assert sorted(host for host, _ in hosts) == sorted(hostnames), name
        assert {(urlsplit(u).username, urlsplit(u).password) for u in url.split(",")} == credentials
        if service["command"][0] in {"relay", "worker"}:
            for node in nodes:
                assert service["depends_on"][node]["condition"] == "service_healthy", name
