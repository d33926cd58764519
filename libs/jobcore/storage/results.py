"""The result store: where results too large for the job row live, and payloads too
large to keep inline (``payload_ref``).

A local directory by default (``JOBCORE_RESULT_DIR``), or an S3-compatible bucket
(:mod:`jobcore.storage.objectstore`, ``JOBCORE_RESULT_STORE=s3://...``); both answer
:class:`ResultStore`. Keys are opaque to callers; the job row holds the key in
``result_ref`` and the API serves the bytes at ``GET /jobs/{id}/result``. A result's key
is ``<job id hex>-<lease token hex>.<suffix>`` (:func:`result_key`), a payload's
``payloads/<job id hex>.json``.

A result's key names the attempt's lease token, so each attempt (each claim: a job given
back runs its attempt again under a new token) writes an object of its own. An attempt
fenced out after its lease expired cannot stop its upload (it runs in a thread), but it
can only write its own object, never the one a later attempt's success names. Objects of
attempts whose job ended naming another are the pruner's sweep's to delete. Keys without
the token (``<job id hex>.<suffix>``) are older releases' and stay valid.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from jobcore.kernel.errors import JobcoreError

_KEY_RE = re.compile(r"^[0-9a-f]{32}(-[0-9a-f]{32})?(\.[a-z0-9]{1,10})?$")
# Payloads stored by reference (jobcore.usecases.enqueue.write_one) live under their own prefix, so
# the sweep of uploads whose job never committed can tell them apart.
PAYLOADS_PREFIX = "payloads/"
_PAYLOAD_KEY_RE = re.compile(r"^payloads/[0-9a-f]{32}\.json$")
# put() writes aside under this prefix, then renames into place.
_TEMP_PREFIX = ".tmp-"
_TEMP_RE = re.compile(r"^\.tmp-[A-Za-z0-9_]{1,64}$")


class ResultNotFound(JobcoreError):
    """The result is not in the result store."""


class StoreUnavailable(JobcoreError, OSError):
    """The object store could not be reached or refused the request: retry later. An
    OSError, like a full disk under the local store, so every caller that survives one
    survives the other. Its message names no credential."""


def result_key(job_id: uuid.UUID, suffix: str, lease_token: uuid.UUID | None = None) -> str:
    """The key of a job's result written under ``lease_token`` (None: the job's one key,
    for a result written outside a worker's attempt). ValueError for a bad suffix."""
    key = (
        f"{job_id.hex}.{suffix}"
        if lease_token is None
        else f"{job_id.hex}-{lease_token.hex}.{suffix}"
    )
    if not _KEY_RE.match(key):
        raise ValueError(f"bad result suffix {suffix!r}")
    return key


def payload_key(job_id: uuid.UUID) -> str:
    return f"{PAYLOADS_PREFIX}{job_id.hex}.json"


def job_of_key(name: str) -> uuid.UUID | None:
    """The job a result or payload key belongs to (None: not one of the store's keys)."""
    if _KEY_RE.match(name):
        return uuid.UUID(hex=name[:32])
    if _PAYLOAD_KEY_RE.match(name):
        return uuid.UUID(hex=name[len(PAYLOADS_PREFIX) : len(PAYLOADS_PREFIX) + 32])
    return None


class ResultStore(Protocol):
    """What the worker, the API and the pruner need of a store. Blocking calls: run them in
    a thread (``asyncio.to_thread``)."""

    def put(
        self,
        job_id: uuid.UUID,
        data: bytes,
        *,
        suffix: str = "bin",
        lease_token: uuid.UUID | None = None,
    ) -> str: ...

    def put_chunks(
        self,
        job_id: uuid.UUID,
        chunks: Iterable[bytes],
        *,
        suffix: str = "bin",
        lease_token: uuid.UUID | None = None,
    ) -> tuple[str, int]: ...

    def put_payload(self, job_id: uuid.UUID, data: bytes) -> str: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, name: str) -> bool: ...

    def stale_files(self, older_than: float) -> Iterator[tuple[str, uuid.UUID | None]]: ...

    def presigned_url(self, key: str) -> str | None:
        """A short-lived URL the client may fetch the result from, or None: the API streams
        it (:meth:`path`)."""
        ...

    def path(self, key: str) -> Path: ...


class LocalResultStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def put(
        self,
        job_id: uuid.UUID,
        data: bytes,
        *,
        suffix: str = "bin",
        lease_token: uuid.UUID | None = None,
    ) -> str:
        """Store ``data`` for a job (the attempt under ``lease_token``: :func:`result_key`)
        and return its key. Atomic: a reader never sees half."""
        key, _ = self.put_chunks(job_id, (data,), suffix=suffix, lease_token=lease_token)
        return key

    def put_chunks(
        self,
        job_id: uuid.UUID,
        chunks: Iterable[bytes],
        *,
        suffix: str = "bin",
        lease_token: uuid.UUID | None = None,
    ) -> tuple[str, int]:
        """Store the concatenation of ``chunks`` for a job, writing each as it comes, so a
        result never has to fit in memory; return its key and size. Atomic like
        :meth:`put`: the chunks go to a temporary file renamed into place at the end."""
        key = result_key(job_id, suffix, lease_token)
        return key, self._write_atomically(key, chunks)

    def put_payload(self, job_id: uuid.UUID, data: bytes) -> str:
        """Store a job's payload (before its row commits); its key."""
        key = payload_key(job_id)
        self._write_atomically(key, (data,))
        return key

    def _write_atomically(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write ``chunks`` to a temporary file beside ``key`` and rename it into place (a
        reader never sees half); the size written."""
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TEMP_PREFIX)
        size = 0
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)
                    size += len(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return size

    def presigned_url(self, key: str) -> str | None:
        return None

    def path(self, key: str) -> Path:
        """The file behind a key; keys that could escape the store are refused."""
        if not _KEY_RE.match(key):
            raise ResultNotFound(f"no result {key!r}")
        path = self.root / key
        if not path.is_file():
            raise ResultNotFound(f"no result {key!r}")
        return path

    def get(self, key: str) -> bytes:
        if _PAYLOAD_KEY_RE.match(key):
            try:
                return (self.root / key).read_bytes()
            except FileNotFoundError:
                raise ResultNotFound(f"no payload {key!r}") from None
        return self.path(key).read_bytes()

    def delete(self, name: str) -> bool:
        """Delete a result by its key, or a file :meth:`stale_files` listed; False if it
        was not there or the name is not one of the store's."""
        if not (_KEY_RE.match(name) or _TEMP_RE.match(name) or _PAYLOAD_KEY_RE.match(name)):
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
        payloads = self.root / PAYLOADS_PREFIX
        if payloads.is_dir():
            with os.scandir(payloads) as entries:
                for entry in entries:
                    name = PAYLOADS_PREFIX + entry.name
                    if not _PAYLOAD_KEY_RE.match(name):
                        continue
                    try:
                        if entry.stat(follow_symlinks=False).st_mtime > cutoff:
                            continue
                    except FileNotFoundError:
                        continue
                    yield name, job_of_key(name)
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
