#!/usr/bin/env bash
# An lr scan on the built-in tiny model: one `twoclocks train` run per PROMPTS:LR pair, one after
# another, into one store, with the held-out accuracy every 1,024 samples (1,024 problems).
# Where the main job's lr should sit is found this way: first at the smallest batch of the grid,
# then at the sqrt-scaled lr of the larger batches.
#
#     bash examples/tiny-arith-lr-scan.sh 4:1.25e-4 4:2e-4 4:2.5e-4 16:5e-4
#     TWOCLOCKS_SCAN_OUT=out/scan bash examples/tiny-arith-lr-scan.sh ...   # where it writes
#     TWOCLOCKS_SCAN_SEED=1 bash examples/tiny-arith-lr-scan.sh 128:7e-4     # another seed
#
# The other settings come from the environment too (defaults in brackets): TWOCLOCKS_SCAN_BUDGET
# samples [32768], TWOCLOCKS_SCAN_EVAL_EVERY samples [1024], TWOCLOCKS_SCAN_EVAL_SIZE problems
# [1024], TWOCLOCKS_SCAN_MINIBATCHES updates per batch [2], TWOCLOCKS_SCAN_CLIP_LOW and
# TWOCLOCKS_SCAN_CLIP_HIGH [0.2], TWOCLOCKS_SCAN_WARMUP lr warm-up samples [0], and the task:
# TWOCLOCKS_SCAN_MAX_VALUE largest operand [99], TWOCLOCKS_SCAN_OPS operators, comma-separated
# [+,-]. Names do not carry them: give each setting its own TWOCLOCKS_SCAN_OUT.
#
# Then read the curves with `twoclocks runs list --db sqlite:///out/scan/scan.db` and
# `twoclocks export --run ID --keys eval_accuracy,drift_rel,entropy --db ...`. A finished pair is
# skipped on a rerun (its workdir holds a finished run), so the scan can be resumed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${TWOCLOCKS_SCAN_OUT:-out/scan}
BUDGET=${TWOCLOCKS_SCAN_BUDGET:-32768}
SEED=${TWOCLOCKS_SCAN_SEED:-0}
EVAL_EVERY=${TWOCLOCKS_SCAN_EVAL_EVERY:-1024}
EVAL_SIZE=${TWOCLOCKS_SCAN_EVAL_SIZE:-1024}
MINIBATCHES=${TWOCLOCKS_SCAN_MINIBATCHES:-2}
CLIP_LOW=${TWOCLOCKS_SCAN_CLIP_LOW:-0.2}
CLIP_HIGH=${TWOCLOCKS_SCAN_CLIP_HIGH:-0.2}
WARMUP=${TWOCLOCKS_SCAN_WARMUP:-0}
MAX_VALUE=${TWOCLOCKS_SCAN_MAX_VALUE:-99}
OPS=${TWOCLOCKS_SCAN_OPS:-+,-}
if ! [[ "$OPS" =~ ^[-+*](,[-+*])*$ ]]; then
  echo "error: TWOCLOCKS_SCAN_OPS='$OPS': expected operators from + - * separated by commas" >&2
  exit 2
fi
OPS_TOML="\"${OPS//,/\", \"}\""
TC=${TWOCLOCKS_BIN:-.venv/bin/twoclocks}
mkdir -p "$OUT"
[ "$#" -gt 0 ] || { echo "usage: $0 PROMPTS:LR [PROMPTS:LR ...]" >&2; exit 2; }
for pair in "$@"; do
  prompts=${pair%%:*}; lr=${pair##*:}
  if ! [[ "$prompts" =~ ^[0-9]+$ ]] || [ "$prompts" = "$pair" ]; then
    echo "error: '$pair': expected PROMPTS:LR, e.g. 4:2e-4" >&2; exit 2
  fi
  name="p$prompts-lr$lr"
  [ "$SEED" = 0 ] || name="$name-s$SEED"  # seed 0 keeps the names of earlier scans
  config="$OUT/$name.toml"
  cat > "$config" <<TOML
model = "builtin:tiny-arith"
dataset = "builtin:arithmetic"
arith_max_value = $MAX_VALUE
arith_ops = [$OPS_TOML]
group_size = 8
prompts_per_batch = $prompts
lr = $lr
lr_warmup_samples = $WARMUP
sample_budget = $BUDGET
clip_eps_low = $CLIP_LOW
clip_eps_high = $CLIP_HIGH
num_minibatches = $MINIBATCHES
micro_batch_size = 64
max_new_tokens = 12
eval_every_samples = $EVAL_EVERY
eval_size = $EVAL_SIZE
kl_init_every = 4
checkpoint_every_steps = 50
threads = 1
seed = $SEED
TOML
  if [ -f "$OUT/wd-$name/done" ]; then echo "$name: done already"; continue; fi
  "$TC" train "$config" --db "sqlite:///$OUT/scan.db" --name "$name" --workdir "$OUT/wd-$name"
  touch "$OUT/wd-$name/done"
done
