"""What operators and clients can do, one typed function each: the HTTP routes, every
`jobcore` command and the web console call the same functions.

- :mod:`~jobcore.usecases.enqueue`: enqueue one job or a batch, each from an
  :class:`~jobcore.usecases.enqueue.submit.EnqueueRequest` (its fields checked, its
  fingerprint computed, when it is built), or a job in the caller's own transaction: the
  API, the scheduler, retries and the testing kit. Maintenance's scheduler enqueues too,
  yet imports no use case: it is handed the enqueue as an ``EnqueueTick``;
- :mod:`~jobcore.usecases.reads`: a tenant's reads of its jobs (one, a page, a result);
- :mod:`~jobcore.usecases.waiting`: what a long-poll reads (the job and its tenant's cap of
  long-polls, the jobs waited for) and listens to;
- :mod:`~jobcore.usecases.jobs`: cancel, retry, unblock, list (the held ones too), show and
  republish stale jobs;
- :mod:`~jobcore.usecases.job_edits`: change a pending job in place (run_at, priority,
  payload), compare-and-set on the version read;
- :mod:`~jobcore.usecases.batches`: create a batch with callbacks, add members, close,
  read, list and cancel it (a retried member takes its place);
- :mod:`~jobcore.usecases.timeline`: a job's events and where it is now;
- :mod:`~jobcore.usecases.workflows`: create a workflow (jobs and the edges between them),
  read it, cancel it, retry one of its jobs in place;
- :mod:`~jobcore.usecases.outbox`: the outbox's status, failing and quarantined rows,
  requeue and discard;
- :mod:`~jobcore.usecases.dlq`: list and replay dead letters;
- :mod:`~jobcore.usecases.keys`: create, list, revoke and rotate API keys;
- :mod:`~jobcore.usecases.quotas`: tenants' quota overrides, effective quotas and usage;
- :mod:`~jobcore.usecases.webhooks`: signing secrets, deliveries (a job's, redeliver),
  endpoints;
- :mod:`~jobcore.usecases.schedules`: list, pause, resume and trigger periodic jobs;
- :mod:`~jobcore.usecases.pauses`: pause and resume a queue or a job type;
- :mod:`~jobcore.usecases.prune`: retention by hand;
- :mod:`~jobcore.usecases.audit`: read the audit log (each action writes its own entry);
- :mod:`~jobcore.usecases.whereabouts`: where a job is now, in words (pure: a job row in);
- :mod:`~jobcore.usecases.backlog`: the backlog gauges the relay's /metrics computes when
  scraped (open jobs per queue, queue depths, what keeps vacuum from cleaning up);
- :mod:`~jobcore.usecases.console`: what only the web console reads (its overview, the
  job search).

Each takes the :class:`~jobcore.database.gateway.Database` (or a session or unit of work, when the
caller's transaction or connection must include it) and typed arguments, returns a typed
result and raises :class:`~jobcore.kernel.errors.JobcoreError` subclasses (a bad field of a
request: :class:`~jobcore.kernel.errors.InvalidField`, which names the field); the caller turns
those into an HTTP problem or one line on stderr. Invariants they keep: docs/design.md.
"""
