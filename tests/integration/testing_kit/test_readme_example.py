from pathlib import Path

from jobcore.testing import InlineWorker, run_inline

EMAIL = {"to": "ada@example.com", "subject": "Welcome"}


async def test_send_email_runs_inline(tmp_path: Path) -> None:
    result = await run_inline("send_email", EMAIL, result_dir=tmp_path)
    assert result["delivered"] is True
    assert len(list((tmp_path / "outbox-mail").iterdir())) == 1


async def test_the_welcome_email_is_sent_once(jobcore_worker: InlineWorker) -> None:
    job_id = await jobcore_worker.enqueue("send_email", EMAIL, idempotency_key="welcome-ada")
    again = await jobcore_worker.enqueue("send_email", EMAIL, idempotency_key="welcome-ada")
    drained = await jobcore_worker.drain()
    job = await jobcore_worker.job(job_id)
    assert again == job_id
    assert drained.succeeded == 1
    assert job["status"] == "succeeded"
    assert job["result"]["delivered"] is True
