"""The `jobcore` program offers every verb, each under its name, wherever its code lives."""

from __future__ import annotations

from typing import Any

import typer

from services.entry import app


def _names(group: Any) -> dict[str, object]:
    # A group has subcommands (typer vendors its own click: no isinstance against click's).
    return {
        name: _names(command) if hasattr(command, "commands") else None
        for name, command in group.commands.items()
    }


def test_every_verb_is_registered() -> None:
    assert _names(typer.main.get_command(app)) == {
        "migrate": None,
        "topology": None,
        "api": None,
        "relay": None,
        "worker": None,
        "openapi": None,
        "prune": None,
        "audit": None,
        "dev": None,
        "demo": None,
        "chaos": None,
        "bench": None,
        "ui": None,
        "keys": {"create": None, "list": None, "revoke": None, "rotate": None},
        "tenants": {"set-quota": None, "show": None, "list": None},
        "batches": {"list": None, "show": None, "close": None, "cancel": None},
        "schedules": {"list": None, "pause": None, "resume": None, "trigger": None},
        "queues": {"list": None, "pause": None, "resume": None},
        "types": {"list": None, "pause": None, "resume": None},
        "outbox": {
            "status": None,
            "list-failing": None,
            "list-quarantined": None,
            "requeue": None,
            "discard": None,
        },
        "dlq": {"list": None, "replay": None, "replay-job": None},
        "webhooks": {
            "list": None,
            "redeliver": None,
            "secret": None,
            "endpoint": {"set": None, "list": None, "remove": None},
        },
        "jobs": {
            "list": None,
            "show": None,
            "timeline": None,
            "edit": None,
            "cancel": None,
            "retry": None,
            "unblock": None,
            "held": None,
            "republish-stale": None,
        },
        "workflows": {"list": None, "show": None, "cancel": None, "retry": None},
    }


def test_every_json_flag_is_the_shared_option() -> None:
    root: Any = typer.main.get_command(app)
    flags = []
    for group_name in ("keys", "outbox", "dlq", "webhooks", "jobs"):
        for command in root.commands[group_name].commands.values():
            for param in command.params:
                if "--json" in param.opts:
                    flags.append(param.help)
    assert flags
    assert set(flags) == {"Print JSON instead of a table."}
