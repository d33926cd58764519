"""The jobcore worker service (`jobcore worker`): consume job messages, run handlers under
leases, and keep the maintenance services running. Invariants: docs/design.md.

- ``app``: the composition root (pools, consumers, maintenance, health server), wired from
  settings; `jobcore worker` (services/cli/serve.py) and the tests build it here.
- ``consumer``: deliveries → one claim statement (inbox + fenced claim) → ack after
  commit; its docstring says why. ``intake``: take deliveries only while a handler slot
  could start one. ``claims``: the claimed job every module shares (a leaf).
- ``batching``: claims and successes share commits when they queue up.
  ``connections``: the connections held for the hot path.
- ``runner``: a claimed job's handler, heartbeats, timeout and its fenced outcome;
  ``job_progress``: its throttled progress reports; ``cancel``: cancel requests by NOTIFY
  (heartbeats catch the ones it misses).
- maintenance (reaper, rescuer, sweeper, pruner, gate releaser, scheduler) is the
  library's (:mod:`jobcore.maintenance`: one leader per database); ``app`` composes its
  ``Maintainer`` and passes ``metrics`` in.
- ``deadletter_notes``: each dead letter noted on its job; ``webhooks``: completion
  webhooks sent, signed.
- ``progress``: what turns ``/readyz`` red; ``metrics``, ``tracing``: /metrics and spans.
"""
