# The two set-up commands of the README: `make demo` (the main job) and `make test` (the tests).
.PHONY: setup demo demo-real test test-fast test-real test-vllm wheel-check bench

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

# The batch-size study on SmolLM2-135M (a benchmark, about an hour and a half on 2 idle cores):
# the main job's steps on examples/smollm2-sweep.toml, into out/demo-real/.
demo-real: setup
	TWOCLOCKS_DEMO_CONFIG=examples/smollm2-sweep.toml TWOCLOCKS_DEMO_OUT=out/demo-real \
	  bash scripts/demo.sh

test:
	bash scripts/test.sh

# The fast lane: every test that starts no process, needs no server and no tiny model (markers in
# pyproject.toml; tests/support/lane.py fails a test starting a process here). CI runs everything.
test-fast: setup
	TWOCLOCKS_TEST_LANE=fast $${TWOCLOCKS_VENV:-.venv}/bin/python -m pytest -q -p no:cacheprovider \
	  -n $${TWOCLOCKS_TEST_WORKERS:-2} -m "not (slow or postgres or slurm or tiny_model or subprocess)"

# The real-model lane: SmolLM2-135M against transformers, a few steps, kill -9 and resume.
test-real: setup
	$${TWOCLOCKS_VENV:-.venv}/bin/python -m pytest -q -p no:cacheprovider -n0 --durations=10 -m smollm2

# The vLLM lane: vLLM's CPU build in a venv of its own (scripts/setup-vllm.sh), tests/vllm/.
test-vllm:
	bash scripts/setup-vllm.sh
	$${TWOCLOCKS_VLLM_VENV:-.venv-vllm}/bin/python -m pytest -q -p no:cacheprovider -n0 --durations=10 tests/vllm

# The built wheel in a fresh venv, away from the sources: every --help, a sim sweep, analyze,
# schedule and probe (scripts/wheel-check.sh).
wheel-check: setup
	bash scripts/wheel-check.sh

bench: setup
	.venv/bin/python bench/store_ingest.py
