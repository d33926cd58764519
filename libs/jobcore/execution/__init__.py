"""Execution: what a job type is, and a job from its claim to its recorded outcome, as every
runner of handlers makes it. The worker service (``jobcore worker``) and the testing kit's
``InlineWorker`` both run :class:`~jobcore.execution.executor.JobExecutor`; the worker
adds the delivery (AMQP), the batching of commits and the process around it.

- :mod:`.registry`: job types (name, queue, payload model, limits) and the handler's
  context, and the registry the processes look them up in;
- :mod:`.claims`: the claim: ``ClaimRequest`` (a message's), the statement (inbox row and
  lease in one; in rounds when a message comes twice), and its answers: ``ClaimedJob``
  (the job under this runner's lease, the one shape of the job from the claim's row to the
  outcome) or ``Unclaimed`` (why no lease was taken);
- :mod:`.executor`: ``JobExecutor``: claim, load the payload, run the handler under its
  lease (heartbeats, watchdog, cancellation, ``ctx.transaction()``, the ``handler``
  span), record the outcome with a fenced statement;
- :mod:`.transaction`: a handler's own transaction (``ctx.transaction()``) and its fence;
- :mod:`.dependencies`: a workflow job's dependencies as it reads them
  (``ctx.dependency_results()``), inline or from the result store;
- :mod:`.progress`: a running job's progress, its bounds and how often it is written;
- :mod:`.progress_reports`: a running job's progress reports, throttled;
- :mod:`.payloads`: what a payload must be to be enqueued, and reading a claimed job's;
- :mod:`.attempts`: one attempt: the handler under its timeout, its error, its result;
- :mod:`.outcomes`: what an attempt ends in (success, a retry, a failure, a cancellation);
- :mod:`.job_messages`: a job message's outbox row (enqueue, retries, recovery);
- :mod:`.completion_webhooks`: completion webhooks as plain code (envelope, signature,
  the callback addresses allowed, retries);
- :mod:`.job_type_records`: what a worker records of its job types for the enqueue from
  SQL;
- :mod:`.preflight`: start-up checks of settings that together could deadlock.

The handler's side of the contract (``JobContext``, :mod:`.transaction`, :mod:`.progress`)
stays with :mod:`.registry`, which imports it: the core imports the registry, not the
other way round.
"""
