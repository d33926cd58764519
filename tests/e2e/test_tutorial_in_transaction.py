"""The tutorial page "Enqueue in your own transaction" (docs/tutorial-in-transaction.md)
works as written: its files are examples/orders/ as they are, and, written to a directory
of their own, the shop runs beside a real API, relay and worker, and the client at the
end of the page prints what the page says it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT, settings_env
from tests.e2e.stack import E2EStack, free_port
from tests.e2e.test_orders_example import app_ready
from tests.e2e.test_tutorial import TITLED_BLOCK

PAGE = ROOT / "docs" / "tutorial-in-transaction.md"
EXAMPLE = ROOT / "examples" / "orders"
RUN_TIMEOUT = 120


def page_files() -> dict[str, str]:
    return {name: body for name, body in TITLED_BLOCK.findall(PAGE.read_text())}


def test_the_page_shows_the_example_as_it_is() -> None:
    files = page_files()
    assert set(files) == {"tables.py", "receipts.py", "orders_app.py", "place_order.py"}
    for name in ("tables.py", "receipts.py", "orders_app.py"):
        assert files[name] == (EXAMPLE / name).read_text(), f"{name} differs from the example"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "shop"
    directory.mkdir()
    for name, body in page_files().items():
        (directory / name).write_text(body)
    return directory


async def test_the_pages_shop_places_an_order_and_sends_its_receipt_once(
    settings: Settings, project: Path, tmp_path: Path
) -> None:
    modules = "jobcore.examples.jobtypes,jobcore.testing.jobtypes,receipts"
    path = f"{project}{os.pathsep}{ROOT}"
    stack = E2EStack(
        settings,
        tmp_path,
        env={"JOBCORE_JOB_MODULES": modules, "PYTHONPATH": path, "OTEL_SDK_DISABLED": "true"},
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        await stack.start()
        log = open(tmp_path / "orders-app.log", "wb")  # noqa: SIM115 - the child keeps it
        shop = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "orders_app:app", "--port", str(port)],
            cwd=project,
            env=settings_env(
                settings,
                JOBCORE_JOB_MODULES=modules,
                PYTHONPATH=path,
                OTEL_SDK_DISABLED="true",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            await app_ready(shop, url, tmp_path)
            run = subprocess.run(
                [sys.executable, "place_order.py"],
                cwd=project,
                env={**os.environ, "ORDERS_URL": url},
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                check=False,
            )
        finally:
            shop.kill()
            shop.wait(timeout=10)
        assert run.returncode == 0, run.stderr + stack.logs("worker")[-3000:]
        assert run.stdout == "402 Payment declined\norder 1: 1 receipt sent\n"
    finally:
        await stack.stop()
