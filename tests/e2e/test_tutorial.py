"""The tutorial (docs/tutorial.md) works as written: every code block titled with a file
name is written to a directory of its own, the job type it declares is registered in a
real API, relay and worker, the client script enqueues and polls over HTTP, and the
tutorial's tests pass under the testing kit's pytest plugin."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT
from tests.e2e.stack import E2EStack

TUTORIAL = ROOT / "docs" / "tutorial.md"
TITLED_BLOCK = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
RUN_TIMEOUT = 120


def tutorial_files() -> dict[str, str]:
    return {name: body for name, body in TITLED_BLOCK.findall(TUTORIAL.read_text())}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The reader's directory: the tutorial's files, as the page shows them."""
    directory = tmp_path / "project"
    directory.mkdir()
    for name, body in tutorial_files().items():
        (directory / name).write_text(body)
    return directory


def test_the_tutorial_names_the_files_it_runs() -> None:
    # A page whose blocks lost their titles would run nothing below.
    assert set(tutorial_files()) == {
        "greetings.py",
        "enqueue_greeting.py",
        "conftest.py",
        "pytest.ini",
        "test_greetings.py",
    }


async def test_the_job_type_is_enqueued_over_http_and_runs(
    settings: Settings, project: Path, tmp_path: Path
) -> None:
    stack = E2EStack(
        settings,
        tmp_path,
        env={
            "JOBCORE_JOB_MODULES": "jobcore.examples.jobtypes,greetings",
            "PYTHONPATH": f"{project}{os.pathsep}{ROOT}",
            "OTEL_SDK_DISABLED": "true",
        },
    )
    try:
        await stack.start()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")},
            "JOBCORE_URL": stack.url("api"),
            "JOBCORE_KEY": stack.api_key,
            "PYTHONPATH": str(ROOT),
        }
        run = subprocess.run(
            [sys.executable, "enqueue_greeting.py"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        assert run.returncode == 0, run.stderr + stack.logs("worker")[-3000:]
        assert run.stdout == "succeeded Hello, Ada!\n"
    finally:
        await stack.stop()


def test_the_tutorials_tests_pass_with_the_testing_kit(settings: Settings, project: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")},
        # The plugin clones its template on this server; each test gets its own database.
        "JOBCORE_DATABASE_URL": settings.database_url,
        "JOBCORE_JOB_MODULES": "greetings",
        "PYTHONPATH": f"{project}{os.pathsep}{ROOT}",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_greetings.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout
