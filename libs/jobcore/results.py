"""The result store: where results too large for the job row live.

A local directory by default (``JOBCORE_RESULT_DIR``). Keys are opaque to callers; the job
row holds the key in ``result_ref`` and the API serves the bytes at
``GET /jobs/{id}/result``.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from jobcore.errors import JobcoreError

_KEY_RE = re.compile(r"^[0-9a-f]{32}(\.[a-z0-9]{1,10})?$")
# put() writes aside under this prefix, then renames into place.
_TEMP_PREFIX = ".tmp-"
_TEMP_RE = re.compile(r"^\.tmp-[A-Za-z0-9_]{1,64}$")


class ResultNotFound(JobcoreError):
    """The result is not in the result store."""


class LocalResultStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, job_id: uuid.UUID, data: bytes, *, suffix: str = "bin") -> str:
        """Store ``data`` for a job and return its key. Atomic: a reader never sees half."""
        key, _ = self.put_chunks(job_id, (data,), suffix=suffix)
        return key

    def put_chunks(
        self, job_id: uuid.UUID, chunks: Iterable[bytes], *, suffix: str = "bin"
    ) -> tuple[str, int]:
        """Store the concatenation of ``chunks`` for a job, writing each as it comes, so a
        result never has to fit in memory; return its key and size. Atomic like
        :meth:`put`: the chunks go to a temporary file renamed into place at the end."""
        key = f"{job_id.hex}.{suffix}"
        if not _KEY_RE.match(key):
            raise ValueError(f"bad result suffix {suffix!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=_TEMP_PREFIX)
        size = 0
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)
                    size += len(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.root / key)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return key, size

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

    def delete(self, name: str) -> bool:
        """Delete a result by its key, or a file :meth:`stale_files` listed; False if it
        was not there or the name is not one of the store's."""
        if not (_KEY_RE.match(name) or _TEMP_RE.match(name)):
            return False
        try:
            (self.root / name).unlink()
        except FileNotFoundError:
            return False
        return True

    def stale_files(self, older_than: float) -> Iterator[tuple[str, uuid.UUID | None]]:
        """Files of the store unchanged for ``older_than`` seconds: ``(name, job id)``
        for a result (its key starts with its job's id), ``(name, None)`` for a temporary
        file an interrupted :meth:`put` left. Anything else in the directory is not ours
        and never listed."""
        if not self.root.is_dir():
            return
        cutoff = time.time() - older_than
        with os.scandir(self.root) as entries:
            for entry in entries:
                is_temp = bool(_TEMP_RE.match(entry.name))
                if not (is_temp or _KEY_RE.match(entry.name)):
                    continue
                try:
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    if entry.stat(follow_symlinks=False).st_mtime > cutoff:
                        continue
                except FileNotFoundError:
                    continue
                yield entry.name, None if is_temp else uuid.UUID(hex=entry.name[:32])
