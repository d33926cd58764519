"""Statements that change ``jobs`` (the outbox, inbox, job_effects, webhook_deliveries and
job_events rows some of them write alongside the job in the same statement), and the
reads of jobs, one module per part of a job's life:

- :mod:`~jobcore.database.sql.jobs.enqueue`: writing jobs (one, or a batch), with their outbox
  messages and quota checks, and the reads that answer an enqueue that wrote nothing;
- :mod:`~jobcore.database.sql.jobs.reads`: reading jobs (the API, operators, /metrics, long-polls);
- :mod:`~jobcore.database.sql.jobs.cancel`: cancellation, from the API's request to the worker's
  LISTEN (one channel, both ends);
- :mod:`~jobcore.database.sql.jobs.run`: the worker's claim, heartbeat, progress and fenced
  outcomes (the hot path);
- :mod:`~jobcore.database.sql.jobs.edit`: changing a pending job in place (its run_at,
  priority and payload), compare-and-set on the version a client read;
- :mod:`~jobcore.database.sql.jobs.gates`: the gate releaser and the operators' ordering actions;
- :mod:`~jobcore.database.sql.jobs.recovery`: the reaper, the rescuer and anti-entropy;
- :mod:`~jobcore.database.sql.jobs.prune`: the pruner.

The cut follows who runs a statement and why, not which table it reads: a module's
statements change together (the run module's fences, the recovery module's "nobody will
finish this job otherwise"), and a reader of the hot path reads one module. Cancellation
is its own module because its two ends share a channel and a fence, and gate releasing
its own because it is neither the claim nor recovery (a held job is pending and fine).

Only :mod:`jobcore.database.store` imports these modules (an import contract in pyproject.toml):
everything else asks :class:`jobcore.database.store.JobStore`.
"""
