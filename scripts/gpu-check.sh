#!/usr/bin/env bash
# GPU check of the trainer. NEVER RUN IN CI, AND NOT YET RUN ON A GPU: the first GPU lent to
# this project was lost to a set-up error before the script ran; on the second (2026-12-05, an
# H100 without network) the dependencies went over as wheels and SmolLM2's GGUF in two parts
# (checksum matched), then the first attempt ran the package from the source tree, where
# `twoclocks_cli.migrations` does not exist (it is mapped from migrations/ only when installed:
# install the project, `pip install --no-deps .`), and the lease ended before a second. Its HF and snapshot
# parts have run on CPU only (bf16, with the CUDA check below removed and the snapshot tests'
# CPU cases selected). Run it on a CUDA machine with the `train` extra installed (and the `vllm`
# extra for the vLLM half):
#
#     bash scripts/gpu-check.sh            # uses .venv, or $TWOCLOCKS_VENV
#
# 1. The tiny model end to end in bf16 with the HF engine: `twoclocks train` (rollouts, a few
#    updates, evaluation, a checkpoint, metrics in a SQLite store), printing samples/s.
# 2. The branch snapshots on the GPU: tests/unit/test_snapshot.py's CUDA cases (a snapshot is a
#    host copy; putting it back repeats the next steps exactly), then an adaptive run with the
#    branch rule on the tiny model (every decision trains two branches from a snapshot and
#    continues from the kept one), its branch gains read back from the store.
# 3. With 2 or more CUDA devices: the same HF run sharded by FSDP2 over 2 of them
#    (`accelerate launch --use_fsdp --fsdp_version 2`, trainer/sharding.py; nccl, bf16),
#    printing samples/s (tested on CPU with gloo in fp32 only).
# 4. When `vllm` imports: the same run with rollout_engine = "vllm", printing samples/s; then
#    the engine alone: sampler vs trainer log-probs on the same weights (must agree), after the
#    trainer's weights moved (must disagree) and after `sync` (must agree again), and rollout
#    samples/s of the engine by itself.
# 5. `builtin:smollm2-135m` (when its package is installed) in bf16 with the HF engine, and
#    with the vLLM engine in the vLLM half: the example's task at 32 prompts x 8, 2,048
#    samples; samples/s, rewards, eval accuracy (and vLLM's log-prob gap to the trainer).
#    Its function ran on CPU scaled down (64 samples, 4 prompts; for vLLM without sleep mode,
#    which its CPU build lacks): bf16 there gave a sampler-trainer |log-ratio| of 0.03-0.04.
# 6. The SmolLM2 batch-size study sized for a GPU (examples/smollm2-sweep-gpu.toml, mixed bf16)
#    through scripts/demo.sh: sweep, both clocks, schedule, the schedule trained, compare,
#    report; cut to one seed and a quarter of the budget unless TWOCLOCKS_GPU_STUDY=full (then
#    into out/study-gpu, kept). In the vLLM half the cut study again with rollout_engine vllm.
# Exits non-zero on the first failed check; prints "gpu-check: all checks passed" at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TWOCLOCKS_VENV:-.venv}
PY="$VENV/bin/python"
TC="$VENV/bin/twoclocks"
[ -x "$PY" ] || { echo "gpu-check: no virtual environment at $VENV (run scripts/setup.sh)"; exit 2; }
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "gpu-check: torch sees no CUDA device here; this check needs one"; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/twoclocks-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
DB="sqlite:///$WORK/gpu-check.db"

EXTRA=""  # TOML appended to the next config written

write_config() {  # $1 engine, $2 file
  cat >"$2" <<EOF
model = "builtin:tiny-arith"
dtype = "bfloat16"
rollout_engine = "$1"
vllm_gpu_memory_utilization = 0.2
vllm_enable_sleep_mode = $( [ "$1" = vllm ] && echo true || echo false )
group_size = 8
prompts_per_batch = 32
sample_budget = 2048
num_minibatches = 2
max_new_tokens = 12
eval_every_samples = 1024
eval_size = 256
checkpoint_every_steps = 0
seed = 0
$EXTRA
EOF
}

train() {  # $1 engine, $2 label, then the launcher (if any): one run checked, samples/s printed
  local engine=$1 label=$2 cfg="$WORK/$2.toml" out="$WORK/$2.json" t0 t1
  shift 2
  write_config "$engine" "$cfg"
  t0=$(date +%s.%N)
  "$@" "$TC" train "$cfg" --db "$DB" --name "gpu-check-$label" --workdir "$WORK/run-$label" \
    --json >"$out"
  t1=$(date +%s.%N)
  "$PY" - "$out" "$t0" "$t1" "$label" <<'EOF'
import json, sys
rec = json.load(open(sys.argv[1]))
wall = float(sys.argv[3]) - float(sys.argv[2])
m = rec["metrics"]
assert rec["status"] == "completed", rec["status"]
assert rec["samples"] >= 2048 and rec["metric_rows"] > 0, rec
assert 0 <= m["accuracy"] <= 1 and m["eval_accuracy"] is not None, m
print(f"gpu-check [{sys.argv[4]}]: {rec['steps']} steps, {rec['samples']} samples in {wall:.1f} s "
      f"= {rec['samples'] / wall:.1f} samples/s (start-up included); accuracy "
      f"{m['accuracy']:.3f}, eval_accuracy {m['eval_accuracy']:.3f}, "
      f"{rec['metric_rows']} metric rows in the SQLite store")
EOF
}

smollm2() {  # $1 engine: builtin:smollm2-135m in bf16, the example's task, GPU-sized
  local engine=$1 label="smollm2-$1" cfg="$WORK/smollm2-$1.toml" out="$WORK/smollm2-$1.json" t0 t1
  sed -e 's/^prompts_per_batch = .*/prompts_per_batch = 32/' \
      -e 's/^sample_budget = .*/sample_budget = 2048/' \
      -e 's/^eval_every_samples = .*/eval_every_samples = 1024/' \
      -e 's/^eval_size = .*/eval_size = 256/' -e 's/^micro_batch_size = .*/micro_batch_size = 64/' \
      -e 's/^checkpoint_every_steps = .*/checkpoint_every_steps = 0/' -e 's/^threads = .*//' \
      -e 's/^lr = .*/lr = 2e-6/' examples/smollm2-train.toml >"$cfg"
  printf 'dtype = "bfloat16"\nrollout_engine = "%s"\n' "$engine" >>"$cfg"
  if [ "$engine" = vllm ]; then
    printf 'vllm_gpu_memory_utilization = 0.2\nvllm_enable_sleep_mode = true\n' >>"$cfg"
  fi
  t0=$(date +%s.%N)
  "$TC" train "$cfg" --db "$DB" --name "gpu-check-$label" --workdir "$WORK/run-$label" --json >"$out"
  t1=$(date +%s.%N)
  "$PY" - "$out" "$t0" "$t1" "$label" <<'EOF'
import json, sys
rec = json.load(open(sys.argv[1]))
wall = float(sys.argv[3]) - float(sys.argv[2])
m = rec["metrics"]
assert rec["status"] == "completed" and rec["samples"] >= 2048, rec
assert m["eval_accuracy"] is not None, m
print(f"gpu-check [{sys.argv[4]} bf16]: {rec['steps']} steps, {rec['samples']} samples in "
      f"{wall:.1f} s = {rec['samples'] / wall:.1f} samples/s (conversion and start-up included); "
      f"reward {m['accuracy']:.3f} at the last step, eval_accuracy {m['eval_accuracy']:.3f}")
EOF
  "$TC" runs show "gpu-check-$label" --db "$DB" --json >"$WORK/$label-show.json"
  "$PY" - "$WORK/$label-show.json" "$label" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
keys = ["eval_accuracy", "reward_mean", "time_gen_s", "time_update_s", "tokens_per_s"]
if sys.argv[2].endswith("vllm"):  # bf16 both: the sampler's log-probs against the trainer's
    keys.append("sampler_abs_logratio")
for key in keys:
    print(f"gpu-check [{sys.argv[2]} bf16]: {key}: {m[key]}")
EOF
}

study() {  # $1 engine: the SmolLM2 study (cut unless TWOCLOCKS_GPU_STUDY=full) via demo.sh
  local engine=$1 out="$WORK/study-$1" cfg
  local cut=(-e 's/^sample_budget = .*/sample_budget = 4096/' -e 's/^seeds = .*/seeds = [0]/')
  if [ "${TWOCLOCKS_GPU_STUDY:-cut}" = full ]; then
    out="out/study-gpu-$engine" cut=()
  fi
  mkdir -p "$out"
  cfg="$out/study.toml"
  sed "${cut[@]}" -e "s|^workdir = .*|workdir = \"$out/runs\"|" \
      -e "s|^name = .*|name = \"smollm2-sums-gpu-$engine\"|" examples/smollm2-sweep-gpu.toml >"$cfg"
  if [ "$engine" = vllm ]; then  # vLLM samples in the model's dtype: bf16 parameters throughout
    sed -i -e '/^rollout_dtype = /d' -e '/^update_dtype = /d' \
      -e 's/^dtype = .*/dtype = "bfloat16"/' -e 's/^rollout_engine = .*/rollout_engine = "vllm"\
vllm_gpu_memory_utilization = 0.2\
vllm_enable_sleep_mode = true/' "$cfg"
  fi
  TWOCLOCKS_DEMO_CONFIG="$cfg" TWOCLOCKS_DEMO_OUT="$out" bash scripts/demo.sh
  [ -s "$out/report/index.html" ] || { echo "gpu-check [study $engine]: no report"; exit 1; }
  if [ -s "$out/compare.json" ]; then
    echo "gpu-check [study $engine]: schedule trained and compared ($out/compare.json)"
  else
    echo "gpu-check [study $engine]: the sweep ran but no schedule was compared (see above)"
  fi
}

HAVE_SMOLLM2=0
if "$PY" -c "from trainer.tiny import model_problem as p; import sys; sys.exit(bool(p('builtin:smollm2-135m')))"; then
  HAVE_SMOLLM2=1
fi
if [ "$HAVE_SMOLLM2" = 1 ]; then
  smollm2 hf
  study hf
else
  echo "gpu-check: builtin:smollm2-135m is not installed here: its run was skipped (scripts/setup.sh)"
fi

train hf hf

"$PY" -m pytest -q -n 0 -p no:cacheprovider tests/unit/test_snapshot.py -k cuda -rs \
  | tee "$WORK/snapshot.log"
grep -q "2 passed" "$WORK/snapshot.log" || { echo "gpu-check: the CUDA snapshot tests did not run"; exit 1; }

EXTRA='batch_schedule = "adaptive"
[adaptive]
rule = "branch"
branch_samples = 256
batch_min = 4
batch_max = 32
adapt_every = 512
scaling = "sqrt"'
train hf adaptive
EXTRA=""
"$TC" runs show gpu-check-adaptive --db "$DB" --json >"$WORK/adaptive-show.json"
"$PY" - "$WORK/adaptive-show.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
gain_b, gain_2b = m["adaptive_branch_gain_b"], m["adaptive_branch_gain_2b"]
assert gain_b["n"] >= 2 and gain_b["n_nan"] == 0 and gain_2b["n_nan"] == 0, (gain_b, gain_2b)
assert m["adaptive_branch_samples"]["max"] == 512, m["adaptive_branch_samples"]  # both branches
batches = m["batch_samples"]
print(f"gpu-check [adaptive]: {gain_b['n']} branch decisions on the GPU, gains B "
      f"{gain_b['min']:.3f}..{gain_b['max']:.3f} and 2B {gain_2b['min']:.3f}..{gain_2b['max']:.3f}; "
      f"batch {batches['min']:.0f}..{batches['max']:.0f} samples")
EOF

if [ "$("$PY" -c "import torch; print(torch.cuda.device_count())")" -ge 2 ]; then
  train hf hf-fsdp "$VENV/bin/accelerate" launch --use_fsdp --fsdp_version 2 --num_processes 2 \
    --num_machines 1 --mixed_precision no --dynamo_backend no
else
  echo "gpu-check: fewer than 2 CUDA devices: the FSDP run was skipped"
fi

if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "gpu-check: vllm does not import here: the vLLM half was skipped (pip install '.[vllm]')"
  echo "gpu-check: all checks passed (HF engine only)"
  exit 0
fi

train vllm vllm
if [ "$HAVE_SMOLLM2" = 1 ]; then
  smollm2 vllm
  study vllm
fi

"$PY" - <<'EOF'
"""The engine alone: does vLLM sample the trainer's policy, before and after a sync?"""
import time

import numpy as np
import torch

from trainer.config import TrainConfig
from trainer.data import ArithmeticTask
from trainer.logprobs import completion_logprobs
from trainer.loop import load_model, prompt_text
from trainer.rollout import vllm_inputs as V
from trainer.rollout.vllm import VLLMEngine

cfg = TrainConfig(dtype="bfloat16", rollout_engine="vllm", max_new_tokens=12,
                  vllm_gpu_memory_utilization=0.2, vllm_enable_sleep_mode=True,
                  vllm_sleep_level=2)
path, tok, model = load_model(cfg, "cuda")
engine = VLLMEngine(cfg, tok, path)
problems = ArithmeticTask().sample(np.random.default_rng(0), 64)
prompts = [prompt_text(p, cfg, tok) for p in problems for _ in range(8)]


def mismatch() -> dict:
    roll = engine.generate(prompts)
    assert roll.sampler_logp is not None
    with torch.no_grad():
        logp, _ = completion_logprobs(model, roll, cfg.temperature)
    return V.sampler_mismatch(logp, roll.sampler_logp, roll.completion_mask)


same = mismatch()
torch.manual_seed(0)
with torch.no_grad():  # move the trainer's weights far
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.5 * p.float().std().to(p.dtype))
stale = mismatch()
engine.sync(model)
synced = mismatch()
for name, m in (("same weights", same), ("trainer moved, no sync", stale), ("after sync", synced)):
    print(f"gpu-check [vllm engine]: {name}: mean |log-ratio| {m['sampler_abs_logratio']:.4f}, "
          f"k3 KL {m['sampler_kl_k3']:.5f} over {m['sampler_tokens']} tokens")
assert same["sampler_abs_logratio"] < 0.1, "vLLM does not sample the checkpoint's policy"
assert synced["sampler_abs_logratio"] < 0.1, "after sync vLLM does not sample the trainer's policy"
assert stale["sampler_abs_logratio"] > 3 * synced["sampler_abs_logratio"], "the sync changed nothing"

t0, n = time.perf_counter(), 0
for _ in range(5):
    n += len(engine.generate(prompts).texts)
dt = time.perf_counter() - t0
print(f"gpu-check [vllm engine]: {n} rollouts in {dt:.2f} s = {n / dt:.1f} samples/s "
      "(generation alone, sleep/wake included)")
EOF
echo "gpu-check: all checks passed"
