"""`jobcore topology`: declare the exchanges and queues of the configured job types."""

from __future__ import annotations

import typer

from jobcore.amqp.publisher import declare_topology
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import load_relay_options
from services.cli.common import JSON_OPTION, emit, example, run, settings


def topology(as_json: bool = JSON_OPTION) -> None:
    """Declare the exchanges and queues (idempotent) and print what was declared."""
    config = settings()
    queues = load_job_modules(config.job_modules).queues()
    options = load_relay_options()
    declared = run(declare_topology(config, queues, connect_timeout=options.connect_timeout))
    if as_json:
        emit(declared, as_json=True)
        return
    emit(
        {
            "exchange": declared["exchange"],
            "dead_letter_exchange": declared["dead_letter_exchange"],
            "dead_letter_queue": declared["dead_letter_queue"],
            "dead_letter_notes_queue": declared["dead_letter_notes_queue"],
            "delivery_limit": declared["delivery_limit"],
        },
        as_json=False,
    )
    typer.echo("")
    # A queue that still dead-letters at most once was also named in a warning on stderr.
    emit(declared["queues"], as_json=False, columns=["queue", "routing_key", "dead_lettering"])


def register(app: typer.Typer) -> None:
    app.command("topology", epilog=example("jobcore topology --json"))(topology)
