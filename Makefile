# The README's two commands are `make demo` and `make test`; CI runs `.ci/run`, which
# calls `make lint` and `make test`. Everything installs from pyproject.toml, pinned by
# requirements.lock (regenerate with `make lock`).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Three on two cores: most tests wait on processes, brokers and databases rather than
# compute; worksteal keeps a long test from leaving one worker alone at the end.
PYTEST_WORKERS ?= 3

.PHONY: setup tools ts-deps ts-client demo dev test test-slow test-parallel test-serial lint docs check-wheel lock bench bench-steady bench-cardinality clean

$(BIN)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/jobcore demo

dev: setup
	$(BIN)/jobcore dev

# The Debian packages the suite drives (chromium, pgbouncer, wrk): installed here when
# missing, so that `make test` works on a fresh machine as the README says.
tools:
	scripts/install_tools.sh

# The TypeScript client's packages (clients/typescript), installed from its lock file when
# it changed: its tests run under `make test`, against a real API. Node.js 20 or later.
TS_CLIENT := clients/typescript
$(TS_CLIENT)/node_modules/.package-lock.json: $(TS_CLIENT)/package.json $(TS_CLIENT)/package-lock.json
	@command -v npm >/dev/null || { echo "ts-deps: npm not found: install Node.js 20 or later" >&2; exit 1; }
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The Node example of enqueueing through SQL (clients/sql-examples/node: Node's pg), the
# same way: its test runs under `make test`, against a real database and worker.
SQL_NODE := clients/sql-examples/node
$(SQL_NODE)/node_modules/.package-lock.json: $(SQL_NODE)/package.json $(SQL_NODE)/package-lock.json
	@command -v npm >/dev/null || { echo "ts-deps: npm not found: install Node.js 20 or later" >&2; exit 1; }
	cd $(SQL_NODE) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

ts-deps: $(TS_CLIENT)/node_modules/.package-lock.json $(SQL_NODE)/node_modules/.package-lock.json

# Regenerate the TypeScript client's OpenAPI document and types after an API change.
ts-client: setup ts-deps
	PYTHON=$(BIN)/python scripts/ts_client.sh

test: setup tools ts-deps
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not serial and not slow" -p no:cacheprovider --durations=25
	@# Exit code 5 means "no test selected": fine while no test disrupts shared services.
	$(BIN)/pytest -m "serial and not slow" -p no:cacheprovider || [ $$? -eq 5 ]

# The full-size versions of tests CI runs small (minutes each on 2 cores), on demand.
test-slow: setup
	$(BIN)/pytest -m slow -p no:cacheprovider

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	@command -v promtool >/dev/null || { echo "lint: promtool not found (Debian package prometheus): run scripts/install_tools.sh" >&2; exit 1; }
	promtool check rules deploy/prometheus/alerts.yaml
	promtool test rules deploy/prometheus/alerts.test.yaml
	@# Every migration safe under traffic: squawk over each revision's offline SQL.
	$(BIN)/python scripts/lint_migrations.py
	@# Every runtime statement names jobcore's tables and functions with their schema.
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_sql_schema_qualified.py
	@# The documentation site: a broken link, a missing page or a reference page that no
	@# longer generates from the code fails here.
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir var/site

# The documentation site at http://127.0.0.1:8088/ (rebuilt as its pages change).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8088

# Build the wheel, install it in a new virtual environment and run `jobcore demo`, chaos and
# a quick bench from outside the checkout (about 4 minutes; CI runs it).
check-wheel: setup
	scripts/check_wheel.sh

# Every scenario at full size (about 13 minutes on 2 cores, and about 8 more for `fair`);
# the README shows its table.
bench: setup
	$(BIN)/jobcore bench --out var/bench

# A million jobs at 400/s with retention in minutes (about 45 minutes on 2 cores): do the
# tables plateau and does throughput hold? The README shows its figures.
bench-steady: setup
	$(BIN)/jobcore bench steady --steady-rate 400 --out docs/bench/steady

# Tenants, ordering keys, held jobs and gate keys swept over orders of magnitude (the full
# size: about half an hour on 2 cores today, its capped drains most of it); CI runs
# `--size small`. The README shows its targets.
bench-cardinality: setup
	$(BIN)/jobcore bench cardinality --size full --out docs/bench/cardinality

lock: setup
	$(BIN)/pip freeze --exclude-editable | grep -vi '^jobcore' > requirements.lock

clean:
	rm -rf $(VENV) var
