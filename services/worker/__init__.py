"""The jobcore worker service (`jobcore worker`): consume job messages, run handlers under
leases, and keep the maintenance services running. Invariants: docs/design.md.

- ``app``: the composition root (pools, consumers, maintenance, health server), wired from
  settings; `jobcore worker` (services/cli/serve.py) and the tests build it here.
- the execution core (claim, payload, handler, outcome) is the library's
  (:mod:`jobcore.execution`); ``app`` builds its ``JobExecutor`` on the held connections,
  with successes batched.
- ``consumer``: deliveries → claim requests → the core's claim (inbox + lease, batched) →
  ack after commit, then the core runs the job; its docstring says why. ``intake``: take
  deliveries only while a handler slot could start one.
- ``batching``: claims and successes share commits when they queue up.
  ``connections``: the connections held for the hot path.
- ``cancel``: cancel requests by NOTIFY, passed to the core (heartbeats catch the ones it
  misses).
- maintenance (reaper, rescuer, sweeper, pruner, gate releaser, scheduler) is the
  library's (:mod:`jobcore.maintenance`: one leader per database); ``app`` composes its
  ``Maintainer`` and passes ``metrics`` in.
- ``deadletter_notes``: each dead letter noted on its job; ``webhook_sender``: completion
  webhooks sent, signed.
- ``readiness``: what turns ``/readyz`` red; ``metrics``, ``tracing``: /metrics and the
  delivery's span.
"""
