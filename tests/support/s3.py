"""The suite's S3-compatible server (``scripts/s3.sh``: moto's standalone server on
127.0.0.1:9571), started on demand like the suite's PgBouncer, and a bucket per test.

One server serves every test and every pytest-xdist worker; each test makes a bucket of
its own (:func:`new_bucket`), so parallel tests never see each other's objects.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import boto3
import orjson
from botocore.config import Config
from pydantic import SecretStr

from jobcore.kernel.settings import Settings
from tests.support.scripts import start_with_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "s3.sh"
PORT = 9571
ENDPOINT = f"http://127.0.0.1:{PORT}"
START_TIMEOUT = 60.0
# moto takes any credentials; these make obstore sign its requests as against a real S3.
ACCESS_KEY = "jobcore-test"
SECRET_KEY = "jobcore-test-secret-do-not-log"


def ensure_s3() -> None:
    """Start the suite's S3 server unless it runs; raise with its own words if it cannot."""
    start_with_script(SCRIPT, {"S3_PORT": str(PORT)}, timeout=START_TIMEOUT)


def client(endpoint: str = ENDPOINT) -> Any:
    """A boto3 S3 client on the suite's server: the tests' own look at the bucket, through
    a second, independent client."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(retries={"max_attempts": 1}),
    )


def new_bucket() -> str:
    """A fresh bucket on the suite's server (started if need be)."""
    ensure_s3()
    bucket = f"jobcore-test-{uuid.uuid4().hex[:20]}"
    client().create_bucket(Bucket=bucket)
    return bucket


def s3_settings(
    settings: Settings, bucket: str, *, endpoint: str = ENDPOINT, **extra: Any
) -> Settings:
    """``settings`` with the result store in ``bucket`` (through ``endpoint``)."""
    return settings.model_copy(
        update={
            "result_store": f"s3://{bucket}",
            "s3_endpoint_url": endpoint,
            "s3_access_key_id": ACCESS_KEY,
            "s3_secret_access_key": SecretStr(SECRET_KEY),
            "s3_prefix": "jc/",
            "s3_timeout": 5.0,
            "s3_part_size": 5 * 1024 * 1024,
            **extra,
        }
    )


def remove_bucket(bucket: str) -> None:
    """Delete a test's bucket with its objects (moto keeps them in memory for its life)."""
    s3 = client()
    listing = s3.list_objects_v2(Bucket=bucket)
    for item in listing.get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=item["Key"])
    s3.delete_bucket(Bucket=bucket)


def deny(bucket: str, action: str, prefix: str) -> None:
    """A bucket policy refusing ``action`` on the objects under ``prefix``: the server
    answers such a request 403 from now on, as S3 does for credentials without it."""
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": action,
                "Resource": f"arn:aws:s3:::{bucket}/{prefix}*",
            }
        ],
    }
    client().put_bucket_policy(Bucket=bucket, Policy=orjson.dumps(policy).decode())
