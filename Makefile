# The two set-up commands of the README: `make demo` (the main job) and `make test` (the tests).
.PHONY: setup demo test bench

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

test:
	bash scripts/test.sh

bench: setup
	.venv/bin/python bench/store_ingest.py
