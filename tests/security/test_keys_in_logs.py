"""No API key, and no key's SHA-256 hash, in any log line of any process, even at DEBUG
level; and none in any answer either.

A full stack (API with access logs, relay, worker) runs with JOBCORE_LOG_LEVEL=DEBUG; a
valid key enqueues a job that runs to the end, reads it, lists and cancels; a revoked, an
expired, a scope-less and a made-up key are refused, also with the key in the wrong
place (another scheme, lower case, with a suffix) and with bad bodies and internal callback
URLs. Then every line each process wrote is searched for each key and each hash.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx

from jobcore.access import apikeys
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack, log_records
from jobcore.usecases import keys as key_usecases


async def test_no_key_or_key_hash_in_any_log_line_or_answer(
    settings: Settings, tmp_path: Path
) -> None:
    stack = Stack(
        settings,
        tmp_path / "logs",
        relays=1,
        workers=1,
        env={"JOBCORE_LOG_LEVEL": "DEBUG"},
        api_args=("--access-log",),
    )
    answers: list[httpx.Response] = []
    async with stack:
        valid = stack.api_key
        revoked = await key_usecases.create_key(stack.db, stack.tenant, "revoked", actor="tests")
        await key_usecases.revoke_key(stack.db, revoked.record.id, actor="tests")
        expired = await key_usecases.create_key(stack.db, stack.tenant, "expired", actor="tests")
        await key_usecases.rotate_key(
            stack.db, expired.record.id, overlap=timedelta(0), actor="tests"
        )
        reader = await key_usecases.create_key(
            stack.db, stack.tenant, "r", scopes=[Scope.READ], actor="tests"
        )
        made_up = apikeys.generate_key()
        refused = [revoked.key, expired.key, made_up]
        keys = [valid, reader.key, *refused]

        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as client:

            async def call(method: str, path: str, key: str, **kwargs: object) -> httpx.Response:
                headers = {"Authorization": f"Bearer {key}", **kwargs.pop("headers", {})}  # type: ignore[dict-item]
                response = await client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
                answers.append(response)
                return response

            created = await call("POST", "/jobs/echo", valid, json={"text": "logged?"})
            assert created.status_code == 202, created.text
            job_id = created.json()["job_id"]
            done = await call("GET", f"/jobs/{job_id}", valid, params={"wait": "30"})
            assert done.json()["status"] == "succeeded", done.text
            assert (await call("GET", f"/jobs/{job_id}/result", valid)).status_code == 200
            assert (await call("GET", "/jobs", reader.key)).status_code == 200
            assert (await call("POST", f"/jobs/{job_id}/cancel", valid)).status_code == 409
            denied = await call("POST", "/jobs/echo", reader.key, json={"text": "a"})
            assert denied.status_code == 403
            for key in refused:
                assert (await call("GET", "/jobs", key)).status_code == 401
                hostile = await call(
                    "POST",
                    "/jobs/echo",
                    key,
                    params={"callback_url": "http://db.internal.example/"},
                    content=b"{not json",
                    headers={"Content-Type": "application/json"},
                )
                assert hostile.status_code == 401
            for key in keys:
                for header in (f"Basic {key}", f"bearer {key}x", f"Bearer {key.upper()}", key):
                    wrong = await client.get("/jobs", headers={"Authorization": header})
                    answers.append(wrong)
                    assert wrong.status_code == 401, header
    codes = await stack.stop()
    assert set(codes.values()) == {0}, codes

    logs = {process.name: process.all_logs() for process in stack.processes}
    assert set(logs) == {"api", "relay-0", "worker-0"}
    # DEBUG was on, and the requests were logged (so the search below had lines to search).
    api_records = log_records(stack.api.log_path) if stack.api else []
    assert any(r["level"] == "debug" and r["msg"] == "request authenticated" for r in api_records)
    assert "POST /jobs/echo" in logs["api"]
    for name in ("relay-0", "worker-0"):
        assert len(logs[name].splitlines()) >= 2, logs[name]
    secrets = {name: value for key in keys for name, value in _forms(key).items()}
    for process, text in logs.items():
        for name, secret in secrets.items():
            assert secret not in text, f"{name} in the log of {process}"
    for answer in answers:
        for name, secret in secrets.items():
            assert secret not in answer.text, f"{name} in an answer: {answer.text[:200]}"
            assert secret not in str(answer.headers), f"{name} in an answer's headers"


def _forms(key: str) -> dict[str, str]:
    """A key, its hash, and the parts of them that would still give it away."""
    digest = apikeys.hash_key(key)
    return {
        f"key {key[:8]}": key,
        f"key body {key[:8]}": key[len(apikeys.KEY_PREFIX) :],
        f"upper {key[:8]}": key.upper(),
        f"hash {digest[:8]}": digest,
    }
