"""Results and large payloads in an S3-compatible bucket (``JOBCORE_RESULT_STORE=s3://B``).

The client is obstore (the Rust ``object_store`` crate's S3 client): it signs every request
itself (SigV4), streams a result of unknown length as a multipart upload of
``JOBCORE_S3_PART_SIZE`` parts, two in flight, so a worker holds at most a few parts of a
result in memory, and signs presigned ``GET`` URLs locally. Why obstore and not
aiobotocore: docs/operations.md, "Object storage".

Layout under ``JOBCORE_S3_PREFIX``: ``results/<job id hex>-<lease token hex>.<suffix>``
for results (one object per attempt: :func:`jobcore.storage.results.result_key`),
``payloads/<job id hex>.json`` for payloads stored by reference. The keys the job rows
hold are the store-independent ones of :mod:`jobcore.storage.results` (``<hex>-<token>.<suffix>``,
or ``<hex>.<suffix>`` from older releases, and ``payloads/<hex>.json``), so a row means
the same under either store.

A failure is one of three (:func:`store_error`, both of the last two OSErrors):

- a missing object: :class:`~jobcore.storage.results.ResultNotFound`;
- an outage, which retrying later can cure (no connection, a timeout, a 5xx, throttling:
  429, 503 SlowDown): :class:`~jobcore.storage.results.StoreUnavailable`. A worker that meets one
  gives the job back without spending its attempt, a bounded number of times
  (``jobcore.execution.executor.JobExecutor.give_back``); an enqueue answers 503;
- a refusal, which the same request meets again until someone changes the bucket, its
  policy or the credentials (401, 403, a missing bucket, 412 and the other 4xx):
  :class:`~jobcore.kernel.errors.StoreRefused`. It fails the attempt, like any error.

Requests give up after ``JOBCORE_S3_TIMEOUT`` (retries included) rather than obstore's
default of minutes, so an outage delays a job, not a stuck handler slot.
"""

from __future__ import annotations

import mimetypes
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    InvalidPathError,
    NotModifiedError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)
from obstore.exceptions import BaseError as ObstoreError
from obstore.store import S3Store

from jobcore.kernel.errors import JobcoreError, StoreRefused
from jobcore.kernel.settings import parse_store_url
from jobcore.storage.results import (
    _KEY_RE,
    PAYLOADS_PREFIX,
    LocalResultStore,
    ResultNotFound,
    ResultStore,
    StoreUnavailable,
    job_of_key,
    payload_key,
    result_key,
)

if TYPE_CHECKING:
    from jobcore.kernel.settings import Settings

RESULTS_PREFIX = "results/"
# Parts uploaded at once per result: memory per upload stays about this many parts.
UPLOAD_CONCURRENCY = 2

# What obstore (the object_store crate) raises for 401, 403, 409, 304, 412, and for a
# request it cannot even make: the same request would meet the same answer.
_REFUSALS = (
    PermissionDeniedError,
    UnauthenticatedError,
    AlreadyExistsError,
    NotModifiedError,
    PreconditionError,
    InvalidPathError,
    NotSupportedError,
    UnknownConfigurationKeyError,
)
# The status in object_store's message of a request that failed with one ("Server
# returned non-2xx status code: 400 Bad Request: <body>"), once its retries are spent.
_STATUS_RE = re.compile(r"status code: (\d{3})\b")
# 4xx answers that are worth a later try: a timeout, throttling, and S3's own
# RequestTimeout (a 400 when the upload's socket went quiet).
_TRANSIENT_4XX = frozenset({408, 429})
_TRANSIENT_CODES = ("<Code>RequestTimeout</Code>",)
# A redirect with no Location: a bucket in another region than JOBCORE_S3_REGION.
_BARE_REDIRECT = "redirect without LOCATION"
# A 404 on a bucket, not a key: every request to it will be answered the same.
_NO_BUCKET = "<Code>NoSuchBucket</Code>"


def store_error(
    exc: BaseException, bucket: str, *, secret: str = "", missing_is_bucket: bool = False
) -> JobcoreError:
    """What an obstore error means for its caller: :class:`~jobcore.storage.results.ResultNotFound`
    (a missing object on a read), :class:`~jobcore.kernel.errors.StoreRefused` (the store will
    refuse it again) or :class:`~jobcore.storage.results.StoreUnavailable` (an outage: try later).
    ``missing_is_bucket``: the request names no object that could be missing (a put, a
    listing): its 404 means the bucket is.
    The message names the bucket and the store's answer, never ``secret``."""
    text = " ".join(str(exc).split())
    if secret:
        text = text.replace(secret, "***")
    status_match = _STATUS_RE.search(text)
    status = int(status_match.group(1)) if status_match else None
    described = f"{type(exc).__name__}: {text[:300]}"
    if isinstance(exc, FileNotFoundError):
        # obstore raises the built-in for a 404 (its NotFoundError is deprecated).
        if missing_is_bucket or _NO_BUCKET in text:
            return StoreRefused(
                f"object store s3://{bucket} refused the request (HTTP 404, no such "
                f"bucket): {described}"
            )
        return ResultNotFound(f"no object in s3://{bucket}: {described}")
    refused = isinstance(exc, _REFUSALS) or _BARE_REDIRECT in text
    if status is not None and 400 <= status < 500:
        refused = status not in _TRANSIENT_4XX and not any(c in text for c in _TRANSIENT_CODES)
    if refused:
        answer = f" (HTTP {status})" if status is not None else ""
        return StoreRefused(f"object store s3://{bucket} refused the request{answer}: {described}")
    return StoreUnavailable(f"object store s3://{bucket}: {described}")


def open_result_store(settings: Settings) -> ResultStore:
    """The store ``JOBCORE_RESULT_STORE`` names: a bucket, or a local directory (empty:
    ``JOBCORE_RESULT_DIR``)."""
    bucket = parse_store_url(settings.result_store)
    if bucket is None:
        return LocalResultStore(Path(settings.result_store or settings.result_dir))
    return S3ResultStore(settings, bucket)


def content_type(key: str) -> str:
    """The type a presigned GET answers an object with: from its name's suffix, as the
    API answers a file of the local store, so a result reads the same from either."""
    return mimetypes.guess_type(key)[0] or "application/octet-stream"


class S3ResultStore:
    """:class:`~jobcore.storage.results.ResultStore` in a bucket. Blocking calls (obstore's own
    runtime does the I/O): the callers run them in threads, like the local store's."""

    def __init__(self, settings: Settings, bucket: str) -> None:
        self.bucket = bucket
        self.part_size = settings.s3_part_size
        self.presign_expiry = timedelta(seconds=settings.s3_presign_expiry)
        secret = settings.s3_secret_access_key.get_secret_value()
        # Only to scrub it from error messages, should a library ever echo it.
        self._secret = secret
        timeout = timedelta(seconds=settings.s3_timeout)
        config: dict[str, object] = {"region": settings.s3_region}
        if settings.s3_access_key_id:
            config["access_key_id"] = settings.s3_access_key_id
            config["secret_access_key"] = secret
        if settings.s3_endpoint_url:
            config["endpoint"] = settings.s3_endpoint_url
        self._store = S3Store(
            bucket,
            prefix=settings.s3_prefix.strip("/") or None,
            config=config,  # type: ignore[arg-type]
            client_options={
                "allow_http": settings.s3_endpoint_url.startswith("http://"),
                "connect_timeout": timedelta(seconds=min(5.0, settings.s3_timeout)),
                "timeout": timeout,
            },
            retry_config={
                "max_retries": 2,
                "retry_timeout": timeout,
                "backoff": {
                    "init_backoff": timedelta(milliseconds=100),
                    "max_backoff": timedelta(seconds=2),
                    "base": 2,
                },
            },
        )

    # --- keys --------------------------------------------------------------------------

    @staticmethod
    def _object(key: str) -> str:
        """Where a row's key lives in the bucket (under the store's prefix)."""
        if _KEY_RE.match(key):
            return RESULTS_PREFIX + key
        if job_of_key(key) is not None:  # a payload key
            return key
        raise ResultNotFound(f"no result {key!r}")

    def _failed(self, exc: BaseException, *, missing_is_bucket: bool = False) -> NoReturn:
        raise store_error(
            exc, self.bucket, secret=self._secret, missing_is_bucket=missing_is_bucket
        ) from None

    # --- ResultStore -------------------------------------------------------------------

    def put(
        self,
        job_id: uuid.UUID,
        data: bytes,
        *,
        suffix: str = "bin",
        lease_token: uuid.UUID | None = None,
    ) -> str:
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
        """Upload the concatenation of ``chunks`` (the attempt under ``lease_token``'s
        object: :func:`~jobcore.storage.results.result_key`); a multipart upload once it outgrows a
        part, so memory stays about ``UPLOAD_CONCURRENCY`` parts. An object appears whole
        or not at all (a failed multipart upload is aborted)."""
        key = result_key(job_id, suffix, lease_token)
        size = 0

        def counted() -> Iterator[bytes]:
            nonlocal size
            for chunk in chunks:
                size += len(chunk)
                yield chunk

        try:
            obstore.put(
                self._store,
                RESULTS_PREFIX + key,
                counted(),
                chunk_size=self.part_size,
                max_concurrency=UPLOAD_CONCURRENCY,
                attributes={"Content-Type": content_type(key)},
            )
        except (ObstoreError, FileNotFoundError) as exc:
            self._failed(exc, missing_is_bucket=True)
        return key, size

    def put_payload(self, job_id: uuid.UUID, data: bytes) -> str:
        key = payload_key(job_id)
        try:
            obstore.put(
                self._store,
                key,
                data,
                chunk_size=self.part_size,
                max_concurrency=UPLOAD_CONCURRENCY,
                attributes={"Content-Type": content_type(key)},
            )
        except (ObstoreError, FileNotFoundError) as exc:
            self._failed(exc, missing_is_bucket=True)
        return key

    def get(self, key: str) -> bytes:
        try:
            return bytes(obstore.get(self._store, self._object(key)).bytes())
        except (ObstoreError, FileNotFoundError) as exc:
            self._failed(exc)

    def delete(self, name: str) -> bool:
        """Delete an object by its row key (S3 answers a delete of a missing key as a
        success: True then too). False for a name that is not one of the store's."""
        try:
            path = self._object(name)
        except ResultNotFound:
            return False
        try:
            obstore.delete(self._store, path)
        except (ObstoreError, FileNotFoundError) as exc:
            error = store_error(exc, self.bucket, secret=self._secret)
            if isinstance(error, ResultNotFound):
                return False
            raise error from None
        return True

    def stale_files(self, older_than: float) -> Iterator[tuple[str, uuid.UUID | None]]:
        """Objects under ``results/`` and ``payloads/`` unchanged for ``older_than``
        seconds, by row key, with their job's id. An interrupted multipart upload leaves
        no object (S3 keeps its parts until it is aborted; a bucket lifecycle rule
        ``AbortIncompleteMultipartUpload`` clears those, docs/operations.md)."""
        cutoff = time.time() - older_than
        try:
            for prefix in (RESULTS_PREFIX, PAYLOADS_PREFIX):
                for batch in obstore.list(self._store, prefix, chunk_size=1000):
                    for meta in batch:
                        path = meta["path"]
                        key = path.removeprefix(RESULTS_PREFIX)
                        job_id = job_of_key(key)
                        if job_id is None or meta["last_modified"].timestamp() > cutoff:
                            continue
                        yield key, job_id
        except (ObstoreError, FileNotFoundError) as exc:
            self._failed(exc, missing_is_bucket=True)

    def presigned_url(self, key: str) -> str | None:
        """A presigned GET URL, valid ``JOBCORE_S3_PRESIGN_EXPIRY`` seconds; signed here,
        no request is made."""
        try:
            return obstore.sign(self._store, "GET", self._object(key), self.presign_expiry)
        except ObstoreError as exc:
            self._failed(exc)

    def path(self, key: str) -> Path:
        raise ResultNotFound("results in a bucket are served by presigned URL")
