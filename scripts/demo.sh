#!/usr/bin/env bash
# The main job (`make demo`, after scripts/setup.sh): a real sqrt-scaled GRPO sweep on the tiny
# model, both clocks, the recommended schedule, that schedule trained as one more run and shown
# against the constant-batch runs, and an HTML report. Everything lands in out/demo/.
#
# Rerunnable: `twoclocks sweep` skips finished cells, and the schedule run is reused when the
# same schedule config already finished (its workdir is named by the config's hash).
# Overrides: TWOCLOCKS_DEMO_CONFIG (sweep TOML), TWOCLOCKS_DEMO_OUT (output folder),
# TWOCLOCKS_DEMO_ANALYZE (analysis options), TWOCLOCKS_DEMO_SCHEDULE (schedule options; default
# --large-lr hold: on this task the large batch's sqrt-scaled lr breaks the trained policy at the
# switch, the small phase's lr does not). Its failures are collapses by the drop rule on
# held-out accuracy; the relative parameter drift ||θ-θ0||/||θ0|| at each failure is reported
# beside them, so the drift-threshold hypothesis of the two-clocks model is tested, not assumed.
set -euo pipefail
cd "$(dirname "$0")/.."

TC=.venv/bin/twoclocks
PY=.venv/bin/python
CONFIG=${TWOCLOCKS_DEMO_CONFIG:-examples/tiny-arith-sweep.toml}
OUT=${TWOCLOCKS_DEMO_OUT:-out/demo}
DB="sqlite:///$OUT/twoclocks.db"
mkdir -p "$OUT"
SWEEP=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["name"])' "$CONFIG")
T0=$(date +%s)
step() { printf '\n== %s  [%ds]\n' "$*" "$(( $(date +%s) - T0 ))"; }

MODEL=$("$PY" -c 'import sys, tomllib; c = tomllib.load(open(sys.argv[1], "rb"))
print(c.get("trainer", {}).get("model", "builtin:tiny-arith"))' "$CONFIG")
step "1/7 the model: $MODEL"
if [ "$MODEL" = "builtin:tiny-arith" ]; then  # built once into $TWOCLOCKS_CACHE or ~/.cache/twoclocks
  "$PY" -c 'from trainer.tiny import ensure_tiny_model; print(ensure_tiny_model(progress=True))'
fi

step "2/7 the sweep ($CONFIG): plan, then run with live status"
"$TC" plan "$CONFIG"
"$TC" sweep "$CONFIG" --db "$DB" --wait

stop_early() {  # the sweep's data cannot support the next step: say so, still write the report
  echo "$1 (see the message above): the demo stops here; the report shows the runs"
  "$TC" report "$SWEEP" --db "$DB" --out "$OUT/report" || true
  exit 0
}

step "3/7 both clocks"
read -r -a ANALYZE <<< "${TWOCLOCKS_DEMO_ANALYZE:---drift-key drift_rel}"
"$TC" analyze "$SWEEP" --db "$DB" --save "${ANALYZE[@]}" --plot "$OUT/clocks.png" --csv "$OUT/clocks.csv" \
  || stop_early "the clocks could not be measured on this sweep"

step "4/7 the recommended schedule"
read -r -a SCHEDULE <<< "${TWOCLOCKS_DEMO_SCHEDULE:---large-lr hold}"
"$TC" schedule "$SWEEP" --db "$DB" --out "$OUT/schedule.toml" "${SCHEDULE[@]}" \
  || stop_early "no schedule could be recommended from this sweep"

step "5/7 train the schedule as one more run"
"$TC" schedule-config "$SWEEP" "$OUT/schedule.toml" --db "$DB" --out "$OUT/schedule-train.toml"
DIGEST=$(sha256sum "$OUT/schedule-train.toml" | cut -c1-12)
WORKDIR="$OUT/schedule-run-$DIGEST"
run_status() {  # status of the run recorded in $WORKDIR/run.json, or "none"
  "$PY" - "$WORKDIR/run.json" "$DB" <<'EOF'
import json, sys
from pathlib import Path
from twoclocks_cli.store import Store
p = Path(sys.argv[1])
if not p.is_file():
    print("none"); raise SystemExit
try:
    print(Store.open(sys.argv[2]).get_run(json.loads(p.read_text())["run_id"]).status)
except Exception:
    print("none")
EOF
}
if [ "$(run_status)" = completed ]; then
  echo "reusing the finished schedule run in $WORKDIR (same schedule config)"
else
  nice -n 5 "$TC" train "$OUT/schedule-train.toml" --db "$DB" --name "$SWEEP-schedule" \
    --workdir "$WORKDIR"
fi
RUN_ID=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["run_id"])' "$WORKDIR/run.json")

step "6/7 the schedule against the constant batches (same metric, target and collapse rules)"
# compare's static-schedule row with the same large-phase lr as the schedule trained above
LARGE=()
for i in "${!SCHEDULE[@]}"; do
  if [ "${SCHEDULE[$i]}" = --large-lr ]; then LARGE=(--large-lr "${SCHEDULE[$((i + 1))]}"); fi
done
"$TC" compare "$SWEEP" --run "$RUN_ID" --db "$DB" "${LARGE[@]}"
"$TC" compare "$SWEEP" --run "$RUN_ID" --db "$DB" "${LARGE[@]}" --json > "$OUT/compare.json"

step "7/7 the report"
"$TC" report "$SWEEP" --db "$DB" --out "$OUT/report"

step "done: $OUT/clocks.png, $OUT/schedule.toml, $OUT/compare.json, $OUT/report/index.html"
