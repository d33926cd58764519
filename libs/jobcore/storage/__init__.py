"""Where results too large for the job row, and payloads too large to keep inline, live.

- :mod:`.results`: the :class:`~jobcore.storage.results.ResultStore` protocol, its keys,
  and the local directory store;
- :mod:`.objectstore`: the S3-compatible bucket store (``JOBCORE_RESULT_STORE=s3://...``).
"""
