#!/usr/bin/env bash
# The TypeScript client's generated files (clients/typescript/src/generated): the API's
# OpenAPI document for the default job types (`jobcore openapi`), and the types
# openapi-typescript makes of it (clients/typescript/scripts/generate.mjs).
#   scripts/ts_client.sh [DIR]    DIR defaults to clients/typescript/src/generated
# `make ts-client` runs it; tests/integration/test_typescript_client_drift.py runs it into a
# temporary folder and compares. Needs `make setup` and `make ts-deps` first.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-clients/typescript/src/generated}")
mkdir -p "$out"
# The shell's own JOBCORE_* settings are dropped: the committed document is the default one.
unset_jobcore=()
for name in $(compgen -e); do
  [[ $name == JOBCORE_* ]] && unset_jobcore+=(-u "$name")
done
env "${unset_jobcore[@]}" JOBCORE_JOB_MODULES=jobcore.examples.jobtypes \
  "${PYTHON:-.venv/bin/python}" -m services openapi --out "$out/openapi.json"
node clients/typescript/scripts/generate.mjs "$out"
