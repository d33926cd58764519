"""The kernel: the types and pure rules every layer shares, and the settings. It imports
no other package of jobcore.

- :mod:`.errors`: one error base class, a subclass per failure, each docstring its message;
- :mod:`.states`: the job state machine (statuses, allowed transitions, terminal states);
- :mod:`.settings`: the typed ``JOBCORE_*`` settings, validated at start-up;
- :mod:`.envelope`: the AMQP wire format of a job message;
- :mod:`.channels`: the PostgreSQL NOTIFY channels more than one module names;
- :mod:`.jobevents`: the kinds of event on a job's timeline;
- :mod:`.priorities`: the three priority levels and the relay's weights between them;
- :mod:`.retry`: exponential backoff with full jitter;
- :mod:`.quotas`: tenant quotas as arithmetic (the enqueue rate limit, the caps, headers);
- :mod:`.gates`: the flow control a job type declares (concurrency, rate, ordering);
- :mod:`.keyed`: debounce and throttle by key, as a job type declares them, and their keys;
- :mod:`.scopes`: what an API key may do;
- :mod:`.batches`: what a batch's callback job receives (:class:`~.batches.BatchOutcome`);
- :mod:`.startstop`: the start/stop contract every long-running loop shares;
- :mod:`.old_paths`: the previous release's module paths that applications import, kept
  importable as the new modules;
- :mod:`.groupcommit`: group commit: what queued behind a write in flight goes out as one
  (the API's coalesced enqueues, the worker's batches).
"""
