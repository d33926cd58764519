"""jobcore's testing kit, shipped with the library: for handler authors, and for jobcore's
own tests, `jobcore chaos` and `jobcore bench`.

For handler authors:

- :func:`run_inline` (:mod:`~jobcore.testing.inline`): one attempt of a job type's
  handler, inline, with the API's payload checks and a real context; no broker, no database;
- :class:`InlineWorker` (:mod:`~jobcore.testing.draining`): enqueue jobs, then run every
  due one to its end in the test's process through the database, without a broker;
- :mod:`~jobcore.testing.pytest_plugin`: fixtures (a migrated database per test, an
  ``InlineWorker`` on it); ``pytest_plugins = ["jobcore.testing.pytest_plugin"]``.

The machinery of jobcore's own tests:

- :mod:`~jobcore.testing.waiting`: :func:`eventually`, waiting for a condition with a deadline;
- :mod:`~jobcore.testing.jobtypes`: the ``echo`` and ``effect`` job types (load them with
  ``JOBCORE_JOB_MODULES=jobcore.testing.jobtypes``);
- :mod:`~jobcore.testing.processes`: ``jobcore`` commands as child processes, configured
  like given settings;
- :mod:`~jobcore.testing.pipeline`: the whole stack as processes, a load and its checks;
- :mod:`~jobcore.testing.chaos`: stopping the shared RabbitMQ or PostgreSQL, always
  starting it again, under one machine-wide lock;
- :mod:`~jobcore.testing.scratch`: a database and a broker prefix made for one run and
  removed after it, and test databases cloned from a template migrated once;
- :mod:`~jobcore.testing.tcpproxy`: a TCP proxy that can be told to cut its connections
  (``jobcore demo``, the fault tests);
- :mod:`~jobcore.testing.app_producer`: `jobcore chaos`'s producer that enqueues as an
  application does, in transactions of its own, rolling back a share on purpose;
- :mod:`~jobcore.testing.multistep`: its producer of workflows, batches, debounced bursts
  and edits, and their checks at the end of the run, with
  :mod:`~jobcore.testing.multistep_jobtypes`, the job types they run.
"""

from jobcore.testing.draining import Drained, InlineWorker
from jobcore.testing.inline import InlineRun, run_inline, run_inline_job

__all__ = ["Drained", "InlineRun", "InlineWorker", "run_inline", "run_inline_job"]
