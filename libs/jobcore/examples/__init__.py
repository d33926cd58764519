"""The job types jobcore ships as examples, loaded through ``JOBCORE_JOB_MODULES``.

- :mod:`.jobtypes`: three real examples and a no-op for benchmarks;
- :mod:`.demo`: the job types of ``jobcore demo`` (ones that retry, fail or run long).
"""
