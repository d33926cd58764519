"""jobcore.storage.objectstore.store_error: which obstore errors are an outage (the job is given
back), which a refusal (the attempt fails) and which a missing object. The messages are the
ones obstore 0.12 gives for each answer of an S3 server (recorded against a stub server
answering each status); the integration tests meet the real ones from moto's server."""

from __future__ import annotations

import pytest
from obstore.exceptions import (
    GenericError,
    JoinError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)

from jobcore.kernel.errors import StoreRefused
from jobcore.storage.objectstore import store_error
from jobcore.storage.results import ResultNotFound, StoreUnavailable

SECRET = "s3cr3t-never-shown"
PUT = "Error performing PUT http://127.0.0.1:9589/bkt/k in 4.5ms"
RETRIED = f"{PUT}, after 2 retries, max_retries: 2, retry_timeout: 30s "


def answered(
    status: str, body: str = "<Error><Code>X</Code></Error>", *, retried: bool = False
) -> str:
    return f"{RETRIED if retried else PUT} - Server returned non-2xx status code: {status}: {body}"


@pytest.mark.parametrize(
    "exc",
    [
        GenericError(f"Generic S3 error: {RETRIED} - HTTP error: error sending request"),
        GenericError("Generic S3 error: " + answered("500 Internal Server Error", retried=True)),
        GenericError("Generic S3 error: " + answered("503 Service Unavailable", retried=True)),
        GenericError("Generic S3 error: " + answered("429 Too Many Requests", retried=True)),
        GenericError("Generic S3 error: " + answered("408 Request Timeout", retried=True)),
        GenericError(
            "Generic S3 error: "
            + answered("400 Bad Request", "<Error><Code>RequestTimeout</Code></Error>")
        ),
        JoinError("task panicked"),
    ],
    ids=["connection", "500", "503", "429", "408", "400-request-timeout", "join"],
)
def test_an_outage_is_store_unavailable(exc: Exception) -> None:
    error = store_error(exc, "bkt", secret=SECRET)
    assert type(error) is StoreUnavailable
    assert str(error).startswith(f"object store s3://bkt: {type(exc).__name__}: ")


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (PermissionDeniedError("no privileges: " + answered("403 Forbidden")), "403"),
        (UnauthenticatedError("no credentials: " + answered("401 Unauthorized")), "401"),
        (PreconditionError("precondition: " + answered("412 Precondition Failed")), "412"),
        (GenericError("Generic S3 error: " + answered("400 Bad Request")), "400"),
        (GenericError("Generic S3 error: " + answered("405 Method Not Allowed")), "405"),
        (
            FileNotFoundError(
                "not found: "
                + answered("404 Not Found", "<Error><Code>NoSuchBucket</Code></Error>")
            ),
            "404",
        ),
    ],
    ids=["403", "401", "412", "400", "405", "no-such-bucket"],
)
def test_a_refusal_is_store_refused_with_its_status(exc: Exception, status: str) -> None:
    error = store_error(exc, "bkt", secret=SECRET)
    assert type(error) is StoreRefused
    assert isinstance(error, OSError)
    assert not isinstance(error, StoreUnavailable)
    assert str(error).startswith(f"object store s3://bkt refused the request (HTTP {status}")


def test_a_redirect_to_another_region_is_a_refusal() -> None:
    exc = GenericError(
        f"Generic S3 error: {PUT} - Received redirect without LOCATION, this normally "
        "indicates an incorrectly configured region"
    )
    assert type(store_error(exc, "bkt")) is StoreRefused


def test_a_missing_key_is_not_found_but_a_404_on_a_put_is_a_missing_bucket() -> None:
    missing = FileNotFoundError(
        "not found: " + answered("404 Not Found", "<Error><Code>NoSuchKey</Code></Error>")
    )
    assert type(store_error(missing, "bkt")) is ResultNotFound
    assert type(store_error(missing, "bkt", missing_is_bucket=True)) is StoreRefused


def test_the_secret_is_scrubbed_from_every_kind() -> None:
    for exc in (
        GenericError(f"Generic S3 error: {PUT}?key={SECRET} - HTTP error"),
        PermissionDeniedError(f"denied {SECRET}: " + answered("403 Forbidden")),
        FileNotFoundError(f"gone {SECRET}"),
    ):
        assert SECRET not in str(store_error(exc, "bkt", secret=SECRET))
