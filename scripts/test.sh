#!/usr/bin/env bash
# The README's test command: set up the environment, start what the tests need, run pytest.
# PostgreSQL is started by the test session itself (tests/support/pgserver.py); SLURM by
# scripts/slurm-up.sh (single node on 127.0.0.1, needs root for apt-get on a new machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${TWOCLOCKS_VENV:-.venv}

if [ "$(id -u)" = 0 ] && ! command -v chromium >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium (the report test will fail)"
fi

slurm_started=0
if [ -x scripts/slurm-up.sh ] && [ "${TWOCLOCKS_NO_SLURM:-0}" != 1 ]; then
  if bash scripts/slurm-up.sh; then
    slurm_started=1
    export TWOCLOCKS_REQUIRE_SLURM=1
  else
    echo "warning: SLURM did not start; the slurm tests will fail" >&2
    export TWOCLOCKS_REQUIRE_SLURM=1
  fi
fi
cleanup() { [ "$slurm_started" = 1 ] && bash scripts/slurm-down.sh || true; }
trap cleanup EXIT

# The tiny model, built before the workers start (2 threads on idle cores, ~3 min; beside a
# busy test worker the same build took over 19). Cached: a no-op after the first run. A failed
# build says nothing here: the tests that need the model build it and fail with the reason.
"$VENV/bin/python" -c "from trainer.tiny import ensure_tiny_model; ensure_tiny_model(0, progress=True)" \
  || echo "warning: the tiny model did not build; its tests will say why" >&2

set +e
# Two pytest-xdist workers (TWOCLOCKS_TEST_WORKERS=0: one process); the distribution mode and
# what keeps it sound (one thread per worker, groups, the tiny model built first) are in
# pyproject.toml's addopts and tests/conftest.py.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=25 \
  -n "${TWOCLOCKS_TEST_WORKERS:-2}" "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
