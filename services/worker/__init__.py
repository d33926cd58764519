"""The jobcore worker service: consume job messages, run handlers under leases.

- ``consumer``: deliveries → one claim statement (inbox + fenced claim) → ack after commit.
  Its docstring says why the ack follows the commit and why the lease protects the job.
- ``runner``: a claimed job's handler, heartbeats, timeout, and its fenced outcome.
- ``batching``: claims and successes share commits when they queue up.
- ``reaper``: expired leases back to pending (one reaper at a time, through a lease row).
- ``cancel``: cancel requests by NOTIFY (heartbeats catch the ones it misses).
- ``app``: the composition root; ``cli``: `jobcore worker` and `jobcore dlq`.
"""
