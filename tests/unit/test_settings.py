import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.settings import RelayOptions, Settings, load_relay_options, load_settings


def test_defaults_reach_local_services(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOBCORE_DATABASE_URL", "JOBCORE_AMQP_URL"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.database_url == "postgresql://postgres@127.0.0.1:5432/jobcore"
    assert settings.amqp_url.startswith("amqp://guest:guest@127.0.0.1:5672")
    assert settings.sqlalchemy_url.startswith("postgresql+psycopg://")


def test_environment_is_read_with_one_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "JOBCORE_DATABASE_URL", "postgres+psycopg://u@db.example:6543/x?sslmode=require"
    )
    monkeypatch.setenv("JOBCORE_JOB_MODULES", "a.b, c.d")
    settings = load_settings()
    # Normalised: one scheme for psycopg, the driver suffix dropped.
    assert settings.database_url == "postgresql://u@db.example:6543/x?sslmode=require"
    assert settings.database_name == "x"
    assert settings.job_modules == ("a.b", "c.d")


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        (
            "JOBCORE_DATABASE_URL",
            "mysql://localhost/x",
            "JOBCORE_DATABASE_URL: must be a postgresql",
        ),
        (
            "JOBCORE_DATABASE_URL",
            "postgresql://localhost",
            "JOBCORE_DATABASE_URL: must name a database",
        ),
        ("JOBCORE_AMQP_URL", "http://localhost", "JOBCORE_AMQP_URL: must be an amqp"),
        ("JOBCORE_AMQP_URL", "amqp://localhost:99999/", "JOBCORE_AMQP_URL: has a bad port"),
        (
            "JOBCORE_AMQP_URL",
            "amqp://a:5681/,http://b:5682/",
            "JOBCORE_AMQP_URL: item 2 of the list (b): must be an amqp",
        ),
        (
            "JOBCORE_AMQP_URL",
            "amqp://a:5681/,amqp://b:x/",
            "JOBCORE_AMQP_URL: item 2 of the list (b): has a bad port",
        ),
        ("JOBCORE_AMQP_URL", "amqp://a:5681/,", "JOBCORE_AMQP_URL: item 2 of the list is empty"),
        ("JOBCORE_AMQP_PREFIX", "has space", "JOBCORE_AMQP_PREFIX:"),
        ("JOBCORE_WORKER_STALL_AFTER", "0", "JOBCORE_WORKER_STALL_AFTER:"),
    ],
)
def test_bad_values_give_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    text = str(info.value)
    assert text.startswith(message)
    assert "\n" not in text


def test_password_never_appears_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBCORE_DATABASE_URL", "mysql://user:s3cret@localhost/x")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "s3cret" not in str(info.value)


MULTI_HOST = (
    "postgresql://app:s3cret@10.0.0.1:5432,10.0.0.2:5433/jobs?target_session_attrs=read-write"
)


def test_a_multi_host_url_is_kept_for_libpq_and_rewritten_for_sqlalchemy() -> None:
    settings = Settings(database_url=MULTI_HOST)
    assert settings.database_url == MULTI_HOST  # libpq takes the comma form as it is
    assert settings.database_name == "jobs"
    assert settings.maintenance_database_url() == MULTI_HOST.replace("/jobs?", "/postgres?")
    # SQLAlchemy's URL has one port: several hosts go to the query, which it does parse.
    assert settings.sqlalchemy_url == (
        "postgresql+psycopg://app:s3cret@/jobs?host=10.0.0.1:5432&host=10.0.0.2:5433"
        "&target_session_attrs=read-write"
    )
    args = (
        make_url(settings.sqlalchemy_url)
        .get_dialect()()
        .create_connect_args(make_url(settings.sqlalchemy_url))[1]
    )
    assert (args["host"], args["port"]) == ("10.0.0.1,10.0.0.2", "5432,5433")
    assert args["target_session_attrs"] == "read-write"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u:s3cret@a:5432,b:x/db", "has a bad port in its host number 2"),
        ("postgresql://u:s3cret@a:5432,/db", "names no host in its host number 2"),
        ("postgresql://u:s3cret@a:0/db", "has a bad port in its host number 1"),
    ],
)
def test_each_host_of_a_multi_host_url_is_checked_without_quoting_it(
    url: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_settings(database_url=url)
    assert str(info.value) == f"JOBCORE_DATABASE_URL: {message}"


def test_a_bad_broker_in_a_list_is_named_without_any_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOBCORE_AMQP_URL", "amqp://u:s3cret@a:5681/,amqp://u:s3cret@b:99999/")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "item 2 of the list (b)" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_a_list_of_brokers_is_kept_in_order_without_the_spaces() -> None:
    settings = Settings(amqp_url=" amqp://u:p@a:5681/ , amqps://u:p@b:5682/vh ")
    assert settings.amqp_urls == ("amqp://u:p@a:5681/", "amqps://u:p@b:5682/vh")
    assert settings.amqp_url == "amqp://u:p@a:5681/,amqps://u:p@b:5682/vh"
    assert Settings(amqp_url="amqp://u:p@a/").amqp_urls == ("amqp://u:p@a/",)


def test_production_refuses_placeholder_broker_credentials() -> None:
    with pytest.raises(ConfigurationError, match="placeholder"):
        load_settings(environment="production")
    assert Settings(environment="production", amqp_url="amqp://app:pw@mq:5672/").amqp_url


def test_worker_prefetch_follows_the_concurrency_and_never_exceeds_it() -> None:
    settings = Settings(worker_concurrency=6)
    assert settings.worker_prefetch is None
    assert settings.job_prefetch() == 6
    assert settings.job_prefetch(concurrency=2) == 2  # `jobcore worker --concurrency 2`
    lower = Settings(worker_concurrency=6, worker_prefetch=4)
    assert lower.job_prefetch() == 4
    assert lower.job_prefetch(concurrency=2) == 2


def test_a_prefetch_above_the_concurrency_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBCORE_WORKER_CONCURRENCY", "16")
    monkeypatch.setenv("JOBCORE_WORKER_PREFETCH", "32")
    with pytest.raises(ConfigurationError, match="worker_prefetch is larger than worker_conc"):
        load_settings()


def test_the_fifo_claim_is_refused_with_a_queue_depth_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The FIFO claim has no per-queue budget: a limit would silently not hold.
    monkeypatch.setenv("JOBCORE_RELAY_FAIR_CLAIM", "false")
    with pytest.raises(ConfigurationError, match="JOBCORE_RELAY_QUEUE_DEPTH_LIMIT=0"):
        load_relay_options()
    monkeypatch.setenv("JOBCORE_RELAY_QUEUE_DEPTH_LIMIT", "0")
    options = load_relay_options()
    assert (options.fair_claim, options.queue_depth_limit) == (False, 0)
    monkeypatch.delenv("JOBCORE_RELAY_FAIR_CLAIM")
    monkeypatch.delenv("JOBCORE_RELAY_QUEUE_DEPTH_LIMIT")
    assert (load_relay_options().fair_claim, load_relay_options().queue_depth_limit) == (True, 1000)


def test_listen_url_is_direct_unless_behind_pgbouncer_without_one() -> None:
    pooled = "postgresql://postgres@127.0.0.1:6441/jobcore"
    direct = "postgres://postgres@127.0.0.1:5432/jobcore"
    plain = Settings(database_url=pooled)
    assert (plain.listen_url, plain.prepared_statements) == (pooled, True)
    behind = Settings(database_url=pooled, database_pooler="pgbouncer")
    assert (behind.listen_url, behind.prepared_statements) == (None, False)
    given = Settings(database_url=pooled, database_pooler="pgbouncer", listen_database_url=direct)
    assert given.listen_url == "postgresql://postgres@127.0.0.1:5432/jobcore"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("JOBCORE_DATABASE_POOLER", "pgpool", "JOBCORE_DATABASE_POOLER: "),
        ("JOBCORE_LISTEN_DATABASE_URL", "mysql://x/y", "JOBCORE_LISTEN_DATABASE_URL: must be a"),
    ],
)
def test_pooler_settings_are_checked(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=message):
        load_settings()


@pytest.mark.parametrize("value", ["public", "Jobs", "pg_jobs", "job-core", "a.b", "", "x" * 64])
def test_the_schema_is_a_plain_identifier_of_jobcores_own(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Written into statements as it is (jobcore.database.gateway.in_schema): a plain
    lower-case identifier, never public or a system schema."""
    monkeypatch.setenv("JOBCORE_DATABASE_SCHEMA", value)
    with pytest.raises(ConfigurationError, match="JOBCORE_DATABASE_SCHEMA: "):
        load_settings()


def test_the_schema_is_jobcore_unless_named() -> None:
    assert Settings().database_schema == "jobcore"
    assert Settings(database_schema="tasks_2").database_schema == "tasks_2"


def test_the_timeline_switch_is_refused_behind_pgbouncer() -> None:
    """The switch is a session SET, which transaction pooling would not keep."""
    with pytest.raises(ConfigurationError) as info:
        load_settings(job_events=False, database_pooler="pgbouncer")
    assert "JOBCORE_JOB_EVENTS=false" in str(info.value)
    assert load_settings(job_events=False).job_events is False


# The relay settings that moved from Settings to RelayOptions, with their defaults.
RELAY_VARIABLES = {
    "JOBCORE_RELAY_BATCH_SIZE": 500,
    "JOBCORE_RELAY_POLL_INTERVAL": 1.0,
    "JOBCORE_RELAY_MAX_PUBLISH_ATTEMPTS": 10,
    "JOBCORE_RELAY_HEALTH_PORT": 8001,
}


def _moved(options: RelayOptions) -> list[float]:
    return [
        getattr(options, name.removeprefix("JOBCORE_RELAY_").lower()) for name in RELAY_VARIABLES
    ]


def test_the_relay_options_are_read_from_their_old_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Moved from Settings to RelayOptions under the same names: deployments keep them."""
    for name in RELAY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert _moved(load_relay_options()) == list(RELAY_VARIABLES.values())
    given = ["250", "0.25", "3", "9101"]
    for name, value in zip(RELAY_VARIABLES, given, strict=True):
        monkeypatch.setenv(name, value)
    options = load_relay_options()
    assert _moved(options) == [250, 0.25, 3, 9101]
    with pytest.raises(ValidationError):
        options.batch_size = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("JOBCORE_RELAY_BATCH_SIZE", "0"),
        ("JOBCORE_RELAY_POLL_INTERVAL", "61"),
        ("JOBCORE_RELAY_MAX_PUBLISH_ATTEMPTS", "x"),
        ("JOBCORE_RELAY_HEALTH_PORT", "65536"),
    ],
)
def test_a_bad_relay_option_gives_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError) as info:
        load_relay_options()
    text = str(info.value)
    assert text.startswith(f"{env}: ")
    assert "\n" not in text


def test_the_bench_routes_are_a_setting_refused_in_production(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("JOBCORE_BENCH_ROUTES", raising=False)
    assert load_settings().bench_routes is False
    monkeypatch.setenv("JOBCORE_BENCH_ROUTES", "true")
    assert load_settings().bench_routes is True
    monkeypatch.setenv("JOBCORE_ENVIRONMENT", "production")
    monkeypatch.setenv("JOBCORE_AMQP_URL", "amqp://jobcore:secret@rabbit.example:5672/")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert str(info.value) == (
        "JOBCORE_BENCH_ROUTES: the bench's unauthenticated routes are refused in production"
    )
    monkeypatch.setenv("JOBCORE_BENCH_ROUTES", "false")
    assert load_settings().environment == "production"
