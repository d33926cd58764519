"""jobcore's testing kit, shipped with the library for its tests, `jobcore chaos` and
`jobcore bench`.

- :mod:`~jobcore.testing.waiting`: :func:`eventually`, waiting for a condition with a deadline;
- :mod:`~jobcore.testing.jobtypes`: the ``echo`` and ``effect`` job types (load them with
  ``JOBCORE_JOB_MODULES=jobcore.testing.jobtypes``);
- :mod:`~jobcore.testing.processes`: ``jobcore`` commands as child processes, configured
  like given settings;
- :mod:`~jobcore.testing.pipeline`: the whole stack as processes, a load and its checks;
- :mod:`~jobcore.testing.chaos`: stopping the shared RabbitMQ or PostgreSQL, always
  starting it again, under one machine-wide lock.
"""
