"""The execution core: a job from its claim to its recorded outcome. The worker service
(``jobcore worker``) and the testing kit's InlineWorker both run it; the worker adds the
delivery (AMQP), the batching of commits and the process around it.

- :mod:`~jobcore.execution.claims`: the claim: ``ClaimRequest`` (a message's), the
  statement (inbox row and lease in one; in rounds when a message comes twice), and its
  answers: ``ClaimedJob`` (the job under this runner's lease, the one shape of the job
  from the claim's row to the outcome) or ``Unclaimed`` (why no lease was taken);
- :mod:`~jobcore.execution.executor`: ``JobExecutor``: claim, load the payload, run the
  handler under its lease (heartbeats, watchdog, cancellation, ``ctx.transaction()``,
  the ``handler`` span), record the outcome with a fenced statement;
- :mod:`~jobcore.execution.attempts`: one handler call under its timeout, its error text,
  its result and effects as stored;
- :mod:`~jobcore.execution.outcomes`: what an attempt ends in (pure code);
- :mod:`~jobcore.execution.progress_reports`: a running job's progress reports, throttled.

The handler's side of the contract (``JobContext``, :mod:`jobcore.execution.transaction`,
:mod:`jobcore.execution.progress`) stays with :mod:`jobcore.execution.registry`, which imports it:
the core imports the registry, not the other way round.
"""
