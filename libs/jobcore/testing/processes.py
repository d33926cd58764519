"""Running jobcore commands as separate OS processes, configured like the test's settings."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobcore.kernel.settings import Settings


def _services_root() -> Path:
    """The directory holding the ``services`` package (the checkout, or site-packages): the
    children run ``python -m services`` (the `jobcore` program) from there. Located, not
    imported: the library never imports the services."""
    spec = importlib.util.find_spec("services")
    if spec is None or spec.origin is None:
        return Path.cwd()
    return Path(spec.origin).resolve().parents[1]


ROOT = _services_root()


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment variables that make a child process use ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
    env.update(
        {
            "JOBCORE_ENVIRONMENT": settings.environment,
            "JOBCORE_DATABASE_URL": settings.database_url,
            "JOBCORE_AMQP_URL": settings.amqp_url,
            "JOBCORE_AMQP_PREFIX": settings.amqp_prefix,
            "JOBCORE_JOB_MODULES": ",".join(settings.job_modules),
            "JOBCORE_RESULT_DIR": str(settings.result_dir),
            "JOBCORE_SHUTDOWN_GRACE": str(settings.shutdown_grace),
            "JOBCORE_DIRECT_PICKUP": str(settings.direct_pickup).lower(),
            "PYTHONPATH": str(ROOT),
        }
    )
    if settings.result_store:
        # The object store too (jobcore.storage.objectstore), secret included: a child's own.
        env.update(
            {
                "JOBCORE_RESULT_STORE": settings.result_store,
                "JOBCORE_S3_ENDPOINT_URL": settings.s3_endpoint_url,
                "JOBCORE_S3_REGION": settings.s3_region,
                "JOBCORE_S3_ACCESS_KEY_ID": settings.s3_access_key_id,
                "JOBCORE_S3_SECRET_ACCESS_KEY": settings.s3_secret_access_key.get_secret_value(),
                "JOBCORE_S3_PREFIX": settings.s3_prefix,
                "JOBCORE_S3_TIMEOUT": str(settings.s3_timeout),
                "JOBCORE_S3_PART_SIZE": str(settings.s3_part_size),
                "JOBCORE_INLINE_PAYLOAD_MAX_BYTES": str(settings.inline_payload_max_bytes),
            }
        )
    env.update(extra)
    return env


def jobcore_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "services", *args]


@contextmanager
def jobcore_process(
    settings: Settings, *args: str, log_path: Path | None = None, **extra_env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``jobcore ARGS`` in its own process; SIGKILL it on exit if it still runs."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        jobcore_command(*args),
        env=settings_env(settings, **extra_env),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        if log_path and not isinstance(log, int):
            log.close()
