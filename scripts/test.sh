#!/usr/bin/env bash
# The test command (README, .ci/run): install what the tests need, lint, run them.
set -euo pipefail
cd "$(dirname "$0")/.."
# Everything below runs in the virtual environment .venv/ (scripts/venv.sh): Debian's python3 refuses pip outside one.
bash scripts/venv.sh
export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"
bash scripts/install-test-deps.sh
export PATH="$PWD/.tools/bin:$PATH"
python3 -m ruff check .
lint-imports
python3 -m mypy gpupolicy kube controller webhook extender cli serving simulator hub certs
# The real control plane the tests run on (tests/cluster): built once per machine, then reused.
KUBEON_UPSTREAM_DIR="$(bash scripts/upstream.sh)"
export KUBEON_UPSTREAM_DIR
# 3 workers on 2 cores: most tests wait on real components (clusters, timers), the whole run uses about 1.3
# cores on average; the third worker overlaps the waits (docs/testing.md)
python3 -m pytest -n 3 -q --durations=25 "$@"
