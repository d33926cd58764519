"""What operators and clients can do, one typed function each: the HTTP routes, every
`jobcore` command and any future console call the same functions.

- :mod:`~jobcore.usecases.jobs`: cancel, retry, list and show jobs;
- :mod:`~jobcore.usecases.outbox`: the outbox's status, failing and quarantined rows,
  requeue and discard;
- :mod:`~jobcore.usecases.dlq`: list and replay dead letters;
- :mod:`~jobcore.usecases.keys`: create, list and revoke API keys;
- :mod:`~jobcore.usecases.webhooks`: signing secrets, deliveries (redeliver), endpoints;
- :mod:`~jobcore.usecases.prune`: retention by hand;
- :mod:`~jobcore.usecases.console`: what only the web console reads (its overview, the
  job search);
- :mod:`~jobcore.usecases.timeline`: a job's events and where it is now.

Each takes the :class:`~jobcore.db.Database` (or a unit of work, when the caller's
transaction must include it) and typed arguments, returns a typed result and raises
:class:`~jobcore.errors.JobcoreError` subclasses; the caller turns those into an HTTP
problem or one line on stderr.
"""
