"""The result store: where results too large for the job row live.

A local directory by default (``JOBCORE_RESULT_DIR``). Keys are opaque to callers; the job
row holds the key in ``result_ref`` and the API serves the bytes at
``GET /jobs/{id}/result``.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from pathlib import Path

from jobcore.errors import JobcoreError

_KEY_RE = re.compile(r"^[0-9a-f]{32}(\.[a-z0-9]{1,10})?$")


class ResultNotFound(JobcoreError):
    """The result is not in the result store."""


class LocalResultStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, job_id: uuid.UUID, data: bytes, *, suffix: str = "bin") -> str:
        """Store ``data`` for a job and return its key. Atomic: a reader never sees half."""
        key = f"{job_id.hex}.{suffix}"
        if not _KEY_RE.match(key):
            raise ValueError(f"bad result suffix {suffix!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.root / key)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return key

    def path(self, key: str) -> Path:
        """The file behind a key; keys that could escape the store are refused."""
        if not _KEY_RE.match(key):
            raise ResultNotFound(f"no result {key!r}")
        path = self.root / key
        if not path.is_file():
            raise ResultNotFound(f"no result {key!r}")
        return path

    def get(self, key: str) -> bytes:
        return self.path(key).read_bytes()
