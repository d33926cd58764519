"""JOBCORE_RESULT_STORE and the S3 settings: what is refused, and the secret kept out of
sight."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.settings import load_settings
from jobcore.storage.objectstore import S3ResultStore, open_result_store
from jobcore.storage.results import LocalResultStore, job_of_key, result_key

SECRET = "wJalrXUtnFEMI-not-a-real-key"


@pytest.mark.parametrize(
    "value",
    ["s3://", "s3://Bad_Bucket", "s3://bucket/prefix", "s3://key:secret@bucket", "s3://b?x=1"],
)
def test_a_malformed_bucket_url_is_refused_in_one_line_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(result_store=value)
    message = str(caught.value)
    assert message.startswith("JOBCORE_RESULT_STORE: ")
    assert "\n" not in message
    assert value not in message  # a URL may carry credentials: never echoed


def test_the_store_is_a_bucket_a_directory_or_the_result_dir(tmp_path: Path) -> None:
    bucket = load_settings(
        result_store="s3://jobcore-results",
        s3_endpoint_url="http://127.0.0.1:9",
        s3_secret_access_key=SECRET,
        s3_access_key_id="id",
    )
    assert isinstance(open_result_store(bucket), S3ResultStore)
    directory = open_result_store(load_settings(result_store=str(tmp_path / "r")))
    assert isinstance(directory, LocalResultStore)
    assert directory.root == tmp_path / "r"
    default = open_result_store(load_settings(result_dir=tmp_path / "d"))
    assert isinstance(default, LocalResultStore)
    assert default.root == tmp_path / "d"


def test_the_secret_key_is_not_in_the_settings_repr_or_dump() -> None:
    settings = load_settings(s3_secret_access_key=SECRET)
    assert SECRET not in repr(settings)
    assert SECRET not in settings.model_dump_json()
    assert settings.s3_secret_access_key.get_secret_value() == SECRET


def test_a_part_below_s3s_minimum_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="JOBCORE_S3_PART_SIZE"):
        load_settings(s3_part_size=1024 * 1024)


def test_a_result_key_names_its_attempt_and_old_keys_stay_valid(tmp_path: Path) -> None:
    job, token = uuid.UUID(int=5), uuid.UUID(int=9)
    key = result_key(job, "csv", token)
    assert key == f"{job.hex}-{token.hex}.csv"
    # Rows of older releases keep keys without the token: both name their job.
    for name in (key, f"{job.hex}.csv", f"{job.hex}-{token.hex}", f"{job.hex}"):
        assert job_of_key(name) == job
    for name in (f"{job.hex}-{token.hex[:8]}.csv", f"{job.hex}-{token.hex}.csv/..", "x.csv"):
        assert job_of_key(name) is None
    with pytest.raises(ValueError, match="bad result suffix"):
        result_key(job, "../x", token)
    # Two attempts of one job write two files; each is read back by its key.
    store = LocalResultStore(tmp_path)
    first = store.put(job, b"one", suffix="txt", lease_token=uuid.UUID(int=1))
    second = store.put(job, b"two", suffix="txt", lease_token=uuid.UUID(int=2))
    legacy = store.put(job, b"old", suffix="txt")
    assert (store.get(first), store.get(second), store.get(legacy)) == (b"one", b"two", b"old")
    assert sorted(name for name, _ in store.stale_files(-1.0)) == sorted([first, second, legacy])
