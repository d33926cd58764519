"""API keys over their life: scopes and expiry from `jobcore keys create`, rotation with
an overlap (both keys work, a third is refused), last use in `jobcore keys list`."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from psycopg.errors import CheckViolation

from jobcore.access import apikeys
from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.kernel.scopes import DEFAULT_SCOPES, Scope
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from tests.integration.api.support import assert_problem
from tests.integration.api.test_cli import jobcore

AGE_LAST_USE = Query(
    "age_last_use",
    "Pretend a key was last used long ago.",
    "UPDATE api_keys SET last_used_at = now() - interval '1 hour' WHERE id = %(id)s",
)


EXPIRE_NOW = Query(
    "expire_now",
    "Bring a key's expiry forward to now.",
    "UPDATE api_keys SET expires_at = now() WHERE id = %(id)s",
)


def created(settings: Settings, *args: str) -> dict[str, Any]:
    done = jobcore(settings, "keys", "create", "--tenant", "acme", "--json", *args)
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = orjson.loads(done.stdout)
    return shown


def listed(settings: Settings) -> dict[str, dict[str, Any]]:
    done = jobcore(settings, "keys", "list", "--json")
    assert done.returncode == 0, done.stderr
    return {row["id"]: row for row in orjson.loads(done.stdout)}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_scopes_from_the_command_line_decide_the_routes(
    settings: Settings, api_client: httpx.AsyncClient
) -> None:
    default = created(settings)
    assert default["scopes"] == ",".join(DEFAULT_SCOPES)
    reader = created(settings, "--scope", "read")
    admin = created(settings, "--scope", "admin", "--scope", "read")
    assert admin["scopes"] == "read,admin"

    job = await api_client.post("/jobs/echo", json={"text": "a"}, headers=bearer(default["key"]))
    assert job.status_code == 202, job.text
    job_id = job.json()["job_id"]
    assert (await api_client.get(f"/jobs/{job_id}", headers=bearer(reader["key"]))).is_success
    refused = await api_client.post("/jobs/echo", json={"text": "a"}, headers=bearer(reader["key"]))
    assert assert_problem(refused, 403, "insufficient-scope")["required_scope"] == "enqueue"
    cancel = await api_client.post(f"/jobs/{job_id}/cancel", headers=bearer(reader["key"]))
    assert assert_problem(cancel, 403, "insufficient-scope")["required_scope"] == "cancel"
    # Admin is never a default: the tenant's own key cannot reach the operator routes.
    admin_only = await api_client.get("/admin/jobs", headers=bearer(default["key"]))
    assert assert_problem(admin_only, 403, "insufficient-scope")["required_scope"] == "admin"
    everyone = await api_client.get("/admin/jobs", headers=bearer(admin["key"]))
    assert [item["id"] for item in everyone.json()["items"]] == [job_id]

    for bad in (("--scope", "root"), ("--scope", "")):
        refused_cli = jobcore(settings, "keys", "create", "--tenant", "acme", *bad)
        assert refused_cli.returncode == 2
        assert "Traceback" not in refused_cli.stderr


async def test_expiry_from_the_command_line(
    settings: Settings, api_client: httpx.AsyncClient, db: Database
) -> None:
    hourly = created(settings, "--expires-in", "1h30m")
    lifetime = datetime.fromisoformat(hourly["expires_at"]) - datetime.fromisoformat(
        hourly["created_at"]
    )
    assert lifetime == timedelta(hours=1, minutes=30)
    later = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    dated = created(settings, "--expires-at", later)
    assert datetime.fromisoformat(dated["expires_at"]) == datetime.fromisoformat(later)
    for key in (hourly, dated):
        assert (await api_client.get("/jobs", headers=bearer(key["key"]))).status_code == 200

    # Its time comes (moved to now, rather than waited for): refused from then on, with
    # the answer a made-up key gets.
    async with db.unit_of_work() as uow:
        await execute(uow, EXPIRE_NOW({"id": uuid.UUID(hourly["id"])}))
        await uow.commit()
    answer = await api_client.get("/jobs", headers=bearer(hourly["key"]))
    made_up = await api_client.get("/jobs", headers=bearer("jc_" + "x" * 43))
    assert assert_problem(answer, 401, "invalid-api-key") == made_up.json()
    assert answer.headers["www-authenticate"] == made_up.headers["www-authenticate"]
    assert listed(settings)[hourly["id"]]["state"] == "expired"
    assert listed(settings)[dated["id"]]["state"] == "active"

    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    for bad in (
        ("--expires-in", "soon"),
        ("--expires-at", "2027-01-01T00:00:00"),  # no offset
        ("--expires-in", "1d", "--expires-at", later),
    ):
        failed = jobcore(settings, "keys", "create", "--tenant", "acme", *bad)
        assert failed.returncode == 2, (bad, failed.stderr)
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    in_the_past = jobcore(settings, "keys", "create", "--tenant", "acme", "--expires-at", past)
    assert in_the_past.returncode == 1
    assert in_the_past.stderr.strip() == "jobcore: the expiry time is in the past"


async def test_rotation_keeps_both_keys_working_for_the_overlap_and_refuses_a_third(
    settings: Settings, api_client: httpx.AsyncClient
) -> None:
    old = created(settings, "--label", "billing", "--scope", "read", "--expires-in", "90d")
    rotated = jobcore(settings, "keys", "rotate", old["id"], "--overlap", "1h", "--json")
    assert rotated.returncode == 0, rotated.stderr
    new = orjson.loads(rotated.stdout)
    assert new["key"] != old["key"]
    assert (new["tenant"], new["label"], new["scopes"]) == ("acme", "billing", "read")
    assert (new["rotated_from"], new["lineage"]) == (old["id"], old["id"])
    # The new key lasts as long as the old one was made to (90 days).
    lifetime = datetime.fromisoformat(new["expires_at"]) - datetime.fromisoformat(new["created_at"])
    assert abs(lifetime - timedelta(days=90)) < timedelta(seconds=5)

    for key in (old["key"], new["key"]):
        assert (await api_client.get("/jobs", headers=bearer(key))).status_code == 200
    keys = listed(settings)
    assert {keys[old["id"]]["state"], keys[new["id"]]["state"]} == {"active"}
    # The old key expires an overlap after the rotation (one transaction: one now()).
    old_expiry = datetime.fromisoformat(keys[old["id"]]["expires_at"])
    assert old_expiry - datetime.fromisoformat(new["created_at"]) == timedelta(hours=1)

    # Neither key of the lineage can be rotated while both are usable.
    for key_id in (old["id"], new["id"]):
        third = jobcore(settings, "keys", "rotate", key_id)
        assert third.returncode == 1
        assert len(third.stderr.strip().splitlines()) == 1
        assert "rotated already" in third.stderr
    assert len(listed(settings)) == 2

    # Once the old key is gone, the new one rotates again, within the same lineage.
    assert jobcore(settings, "keys", "revoke", old["id"]).returncode == 0
    again = jobcore(settings, "keys", "rotate", new["id"], "--overlap", "0s", "--json")
    assert again.returncode == 0, again.stderr
    newest = orjson.loads(again.stdout)
    assert newest["lineage"] == old["id"]
    assert (await api_client.get("/jobs", headers=bearer(new["key"]))).status_code == 401
    assert (await api_client.get("/jobs", headers=bearer(newest["key"]))).status_code == 200
    # A revoked or expired key is not rotated: that would revive its lineage.
    for dead in (old["id"], new["id"]):
        refused = jobcore(settings, "keys", "rotate", dead)
        assert refused.returncode == 1
        assert "create a new key" in refused.stderr
    unknown = jobcore(settings, "keys", "rotate", str(uuid.uuid4()))
    assert unknown.returncode == 1
    assert "no API key" in unknown.stderr
    for bad in (("--overlap", "forever"), ("--overlap", "91d")):
        failed = jobcore(settings, "keys", "rotate", newest["id"], *bad)
        assert failed.returncode in (1, 2), failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1


async def test_concurrent_rotations_of_one_lineage_make_one_successor(db: Database) -> None:
    first = await key_usecases.create_key(db, "acme", actor="tests")
    outcomes = await asyncio.gather(
        *(key_usecases.rotate_key(db, first.record.id, actor="tests") for _ in range(4)),
        return_exceptions=True,
    )
    made = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, key_usecases.RotationRefused)]
    assert (len(made), len(refused)) == (1, 3), outcomes
    usable = [k for k in await key_usecases.list_keys(db) if k.state == "active"]
    assert len(usable) == 2


async def test_last_use_is_recorded_at_most_once_a_minute_and_listed(
    settings: Settings, api_client: httpx.AsyncClient, db: Database
) -> None:
    key = created(settings)
    assert listed(settings)[key["id"]]["last_used_at"] is None
    assert (await api_client.get("/jobs", headers=bearer(key["key"]))).status_code == 200
    first = listed(settings)[key["id"]]["last_used_at"]
    assert first is not None
    assert datetime.now(UTC) - datetime.fromisoformat(first) < timedelta(minutes=1)
    # Within the minute, using the key writes nothing.
    assert (await api_client.get("/jobs", headers=bearer(key["key"]))).status_code == 200
    assert listed(settings)[key["id"]]["last_used_at"] == first
    # A key last used an hour ago is touched again by its next request.
    async with db.unit_of_work() as uow:
        await execute(uow, AGE_LAST_USE({"id": uuid.UUID(key["id"])}))
        await uow.commit()
    aged = listed(settings)[key["id"]]["last_used_at"]
    assert aged < first
    assert (
        await api_client.post("/jobs/echo", json={"text": "a"}, headers=bearer(key["key"]))
    ).status_code == 202
    assert listed(settings)[key["id"]]["last_used_at"] > first
    # A refused key is not touched.
    assert jobcore(settings, "keys", "revoke", key["id"]).returncode == 0
    before = listed(settings)[key["id"]]["last_used_at"]
    async with db.unit_of_work() as uow:
        await execute(uow, AGE_LAST_USE({"id": uuid.UUID(key["id"])}))
        await uow.commit()
    aged_again = listed(settings)[key["id"]]["last_used_at"]
    assert (await api_client.get("/jobs", headers=bearer(key["key"]))).status_code == 401
    assert listed(settings)[key["id"]]["last_used_at"] == aged_again != before

    table = jobcore(settings, "keys", "list")
    for column in ("SCOPES", "STATE", "EXPIRES_AT", "LAST_USED_AT", "ROTATED_FROM"):
        assert column in table.stdout


@pytest.mark.parametrize("scopes", [(), ("nope",)])
async def test_a_key_needs_known_scopes(db: Database, scopes: tuple[str, ...]) -> None:
    with pytest.raises(key_usecases.InvalidKeyRequest):
        await key_usecases.create_key(db, "acme", scopes=scopes, actor="tests")
    assert await key_usecases.list_keys(db) == []


async def test_scopes_are_checked_by_the_database_too(db: Database) -> None:
    created_key = await key_usecases.create_key(db, "acme", scopes=[Scope.ADMIN], actor="tests")
    assert created_key.record.scopes == (Scope.ADMIN,)
    bad = Query(
        "bad_scope", "A scope no code knows.", "UPDATE api_keys SET scopes = '{root}' WHERE true"
    )
    with pytest.raises(CheckViolation, match="api_keys_scopes_check"):
        async with db.unit_of_work() as uow:
            await execute(uow, bad({}))


# What `keys create` of the release before migration 0008 writes (it knows no new column).
OLD_RELEASE_INSERT = Query(
    "old_release_key_insert",
    "Insert a key as the previous release does, during a rollout.",
    """
    INSERT INTO api_keys (id, tenant, key_hash, prefix, label)
    VALUES (%(id)s, 'acme', %(key_hash)s, %(prefix)s, 'old release')
    """,
)


async def test_a_key_the_previous_release_created_works_and_rotates(
    api_client: httpx.AsyncClient, db: Database
) -> None:
    key = apikeys.generate_key()
    key_id = uuid.uuid4()
    async with db.unit_of_work() as uow:
        await execute(
            uow,
            OLD_RELEASE_INSERT(
                {"id": key_id, "key_hash": apikeys.hash_key(key), "prefix": key[:11]}
            ),
        )
        await uow.commit()
    [old] = await key_usecases.list_keys(db)
    assert (old.scopes, old.lineage, old.state) == (DEFAULT_SCOPES, key_id, "active")
    assert (await api_client.get("/jobs", headers=bearer(key))).status_code == 200
    new, _ = await key_usecases.rotate_key(db, key_id, actor="tests")
    assert (new.record.lineage, new.record.rotated_from) == (key_id, key_id)
    with pytest.raises(key_usecases.RotationRefused):
        await key_usecases.rotate_key(db, key_id, actor="tests")
