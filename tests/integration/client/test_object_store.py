"""jobcore.client against a live API whose results and large payloads are in the suite's
S3 server (scripts/s3.sh): the API answers their reads with a 302 to a presigned URL, and
the client fetches the bytes from the store, whole or streamed, without ever sending the
store its API key.

Between the processes and the S3 server sits a forwarder that keeps every byte sent to
the store, so the test sees what the store was sent, not what the client meant to send.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from jobcore.client import AsyncClient, Client, Job, JobResult
from jobcore.examples.jobtypes import ExportCsvPayload, csv_chunks
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack
from tests.support import s3

pytestmark = pytest.mark.timeout(240)

WAIT = 90.0  # seconds a test waits for a job to finish (it takes well under one)
INLINE_MAX = 64
# Enough rows for a result of several chunks of the client's stream (about 1 MiB).
ROWS = 40_000


class RecordingForwarder:
    """127.0.0.1:<port> forwarded to the S3 server, keeping what clients sent it."""

    def __init__(self, port: int) -> None:
        self.target_port = port
        self.sent = bytearray()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        for pipe in (self._pipe(reader, up_writer, record=True), self._pipe(up_reader, writer)):
            task = asyncio.create_task(pipe)
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, record: bool = False
    ) -> None:
        try:
            while data := await reader.read(65536):
                if record:
                    self.sent += data
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


@pytest.fixture
def bucket() -> Iterator[str]:
    try:
        name = s3.new_bucket()
    except Exception as exc:
        pytest.fail(f"the suite's S3 server is not reachable: {exc}", pytrace=False)
    yield name
    s3.remove_bucket(name)


@pytest.fixture
async def store_link() -> AsyncIterator[RecordingForwarder]:
    forwarder = RecordingForwarder(s3.PORT)
    await forwarder.start()
    try:
        yield forwarder
    finally:
        await forwarder.stop()


@pytest.fixture
def s3_config(settings: Settings, bucket: str, store_link: RecordingForwarder) -> Settings:
    return s3.s3_settings(
        settings,
        bucket,
        endpoint=f"http://127.0.0.1:{store_link.port}",
        inline_payload_max_bytes=INLINE_MAX,
    )


def expected_csv() -> bytes:
    return b"".join(csv_chunks(ExportCsvPayload(rows=ROWS, seed=1)))


def blocking_reads(url: str, key: str, tmp_path: Path) -> tuple[JobResult, bytes, int, Job, object]:
    """The blocking client's reads of a stored result and a stored payload (in a thread)."""
    with Client(url, key) as client:
        export = client.enqueue("export_csv", {"rows": ROWS, "seed": 1})
        assert client.wait(export.job_id, timeout=WAIT, poll=5).status == "succeeded"
        whole = client.result(export.job_id)
        with client.stream_result(export.job_id) as stream:
            assert stream.media_type == "text/csv"
            chunks = list(stream.iter_bytes())
        assert len(chunks) > 1
        saved = client.save_result(export.job_id, tmp_path / "export.csv")
        large = client.enqueue("echo", {"text": "x" * (INLINE_MAX * 4)})
        job = client.get(large.job_id)
        payload = client.payload(large.job_id)
    return whole, b"".join(chunks), saved, job, payload


async def test_results_and_payloads_in_a_bucket_are_read_through_the_client(
    s3_config: Settings, store_link: RecordingForwarder, tmp_path: Path
) -> None:
    async with Stack(s3_config, tmp_path / "logs", relays=1, workers=1) as stack:
        whole, streamed, saved, job, payload = await asyncio.to_thread(
            blocking_reads, stack.api_url, stack.api_key, tmp_path
        )
        async with AsyncClient(stack.api_url, stack.api_key) as client:
            export = await client.enqueue("export_csv", {"rows": ROWS, "seed": 1})
            assert (await client.wait(export.job_id, timeout=WAIT, poll=5)).status == "succeeded"
            async_whole = await client.result(export.job_id)
            async with client.stream_result(export.job_id) as stream:
                async_streamed = b"".join([chunk async for chunk in stream.aiter_bytes()])
            async_saved = await client.save_result(export.job_id, tmp_path / "async.csv")
            async_payload = await client.payload(job.id)
        api_key = stack.api_key

    expected = expected_csv()
    assert whole.content == expected
    assert whole.media_type == "text/csv"
    assert streamed == expected
    assert saved == len(expected)
    assert (tmp_path / "export.csv").read_bytes() == expected
    # A payload stored by reference: the job says so, and the client reads it back.
    assert job.payload is None
    assert job.payload_ref == f"payloads/{job.id.hex}.json"
    assert payload == {"text": "x" * (INLINE_MAX * 4), "count": 1}
    assert async_whole.content == expected
    assert async_streamed == expected
    assert async_saved == len(expected)
    assert (tmp_path / "async.csv").read_bytes() == expected
    assert async_payload == payload

    # The store was asked for them (presigned GETs), and never saw the API key.
    sent = bytes(store_link.sent)
    assert sent.count(b"X-Amz-Signature=") >= 8
    assert api_key.encode() not in sent
    assert b"Bearer" not in sent
