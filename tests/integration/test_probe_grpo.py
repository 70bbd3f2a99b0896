"""`twoclocks probe` on a real GRPO run of the tiny model, through the real CLI and store.

One parent run (`twoclocks train`, 8 samples a step); a probe at 192 samples: the replay of the
run to that point, then branches at 8 and 32 samples (3 replicates each) from its checkpoint,
run by the debug executor (in the CLI's process, one after another: the local executor's
process per cell costs ~10 s of CPU each here, measured). The reward is one the
tiny model learns within the test's few hundred samples (a completion with a 7 in it: held-out
accuracy 0.17 -> 0.73 in 384 samples at lr 1e-4, measured): on the arithmetic task its
accuracy moves within its evaluation noise over so few samples. Checked:

- the replay logs exactly the run's own rows up to the branch point, and replicate 0 at the
  run's own batch logs exactly the run's next steps (every metric but wall-clock timings);
- every number the probe prints (the branch point's accuracy, the target, each branch's clock,
  the local B_crit, the in-run B_simple) against a hand computation from the stored curves;
- resumable: a branch lost with its checkpoint and rows (a job that vanished) is resubmitted
  by the same command, which then prints the same numbers;
- bad input is one line and writes nothing.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3

import numpy as np
import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = [pytest.mark.slow, pytest.mark.tiny_model, pytest.mark.one_worker]

TIMING = {"time_gen_s", "time_reward_s", "time_update_s", "tokens_per_s"}
PARENT = """
prompts_per_batch = 2
group_size = 4
lr = 1e-4
sample_budget = 320
seed = 0
eval_every_samples = 64
eval_size = 64
kl_init_every = 0
checkpoint_every_steps = 0
threads = 1
num_minibatches = 2
reward = "probe_reward:sevens"
"""
REWARD = """
def sevens(texts, problems):
    return [1.0 if "7" in t else 0.0 for t in texts]
"""
AT, BATCHES, BRANCH, SEEDS, EVERY, WINDOW = 192, (8, 32), 128, 3, 32, 3
PROBE = ("--at", str(AT), "--batches", ",".join(map(str, BATCHES)), "--branch-samples",
         str(BRANCH), "--seeds", str(SEEDS), "--eval-every", str(EVERY), "--executor", "debug")


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """(url, db path, parent run id, the probe's --json, its text output)."""
    tmp = tmp_path_factory.mktemp("probe-grpo")
    db = tmp / "s.db"
    url = f"sqlite:///{db}"
    cfg = tmp / "parent.toml"
    cfg.write_text(PARENT)
    (tmp / "probe_reward.py").write_text(REWARD)
    env = {"PYTHONPATH": str(tmp)}  # the reward's module, wherever a cell runs
    proc = twoclocks("train", str(cfg), "--db", url, "--workdir", str(tmp / "parent"),
                     "--json", cwd=tmp, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads(proc.stdout)["run_id"]
    proc = twoclocks("probe", str(run_id), *PROBE, "--db", url, "--json", cwd=tmp, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["state"] == "done", out
    lost = out["branch_runs"]["32"][-1]
    _lose(db, lost)
    again = twoclocks("probe", str(run_id), *PROBE, "--db", url, cwd=tmp, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    with sqlite3.connect(db) as c:
        status, attempts = c.execute("SELECT status, attempts FROM runs WHERE id = ?",
                                     (lost,)).fetchone()
    assert (status, attempts) == ("completed", 2)
    return url, db, run_id, out, again.stdout


def _lose(db, run_id) -> None:
    """Run `run_id` as a vanished job leaves it: lost, without its checkpoint and rows."""
    import shutil

    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import RunStatus

    with sqlite3.connect(db) as c:
        folder, cell = c.execute("SELECT s.folder, r.cell_id FROM runs r JOIN sweeps s ON "
                                 "s.id = r.sweep_id WHERE r.id = ?", (run_id,)).fetchone()
        c.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
    shutil.rmtree(f"{folder}/cells/{cell[:16]}")
    store = Store.open(f"sqlite:///{db}")
    assert store.transition(run_id, RunStatus.lost, {RunStatus.completed}, "test: job vanished")
    store.close()


def _rows(db, run_id) -> dict[int, dict[str, float]]:
    with sqlite3.connect(db) as c:
        got = c.execute("SELECT step, key, value FROM metrics WHERE run_id = ?", (run_id,))
        out: dict[int, dict[str, float]] = {}
        for step, key, value in got:
            out.setdefault(step, {})[key] = value
    return out


def _series(db, run_id, key) -> tuple[np.ndarray, np.ndarray]:
    with sqlite3.connect(db) as c:
        got = c.execute("SELECT samples, value FROM metrics WHERE run_id = ? AND key = ? "
                        "ORDER BY step", (run_id, key)).fetchall()
    return np.array([s for s, _ in got], float), np.array([v for _, v in got], float)


def _same_rows(a: dict, b: dict, steps) -> None:
    for step in steps:
        keys = (set(a[step]) & set(b[step])) - TIMING
        assert keys, step
        diff = {k: (a[step][k], b[step][k]) for k in keys if a[step][k] != b[step][k]}
        assert not diff, (step, diff)


def test_replay_and_the_branch_at_the_runs_batch_are_the_run_itself(probed):
    url, db, run_id, out, _ = probed
    parent = _rows(db, run_id)
    at_step = out["at_step"]
    assert out["at_samples"] == AT and at_step == AT // 8
    with sqlite3.connect(db) as c:
        replay = c.execute("SELECT r.id FROM runs r JOIN sweeps s ON s.id = r.sweep_id "
                           "WHERE s.name = ? AND r.name = ?",
                           (out["sweep"], f"replay-{AT}")).fetchone()[0]
    _same_rows(parent, _rows(db, replay), range(1, at_step + 1))
    assert out["replay"]["identical"] and out["replay"]["steps"] == at_step
    branch = _rows(db, out["branch_runs"]["8"][0])  # replicate 0 at the run's batch and lr
    assert min(branch) == at_step + 1 and max(branch) == at_step + BRANCH // 8
    last = max(parent)
    _same_rows(parent, branch, range(at_step + 1, last + 1))
    both = [s for s in range(at_step + 1, last + 1)
            if "eval_accuracy" in parent[s] and "eval_accuracy" in branch[s]]
    assert len(both) >= 2  # the run's evaluations (every 64) fall on the branch's (every 32)
    # another replicate at the same batch draws other samples: its rows are not the run's
    other = _rows(db, out["branch_runs"]["8"][1])
    assert other[at_step + 1]["reward_mean"] != branch[at_step + 1]["reward_mean"] or \
        other[at_step + 1]["loss"] != branch[at_step + 1]["loss"]
    # the larger batch steps with the scaled lr, from the same point
    big = _rows(db, out["branch_runs"]["32"][0])
    assert min(big) == at_step + 1 and big[at_step + 1]["batch_samples"] == 32
    assert big[at_step + 1]["lr"] == pytest.approx(1e-4 * math.sqrt(32 / 8), rel=1e-12)


def _ma(v: np.ndarray, window: int) -> np.ndarray:
    half = window // 2
    return np.array([v[max(i - half, 0): min(i + window - half, v.size)].mean()
                     for i in range(v.size)])


def _clock(x, y, target, window):
    sm = _ma(y, window)
    hit = [i for i in range(y.size) if sm[i] >= target]
    raw = [i for i in range(y.size) if y[i] >= target]
    if not hit or not raw:
        return None
    i = hit[0]
    cross = x[0] if i == 0 else x[i - 1] + (target - sm[i - 1]) / (sm[i] - sm[i - 1]) * (
        x[i] - x[i - 1])
    return max(cross, x[raw[0]]) - AT


def _median(values) -> float:
    return float(np.median([math.inf if v is None else v for v in values]))


def _hand(db, out, frac: float = 0.5, window: int = WINDOW) -> dict:
    """Target, clocks and local B_crit from the stored curves, by the rules in the docs."""
    with sqlite3.connect(db) as c:
        (replay,) = c.execute("SELECT r.id FROM runs r JOIN sweeps s ON s.id = r.sweep_id "
                              "WHERE s.name = ? AND r.name = ?",
                              (out["sweep"], f"replay-{AT}")).fetchone()
    xs, ys = _series(db, replay, "eval_accuracy")
    p0 = float(ys[xs == AT][-1])
    curves = {}
    for b in BATCHES:
        for r, rid in enumerate(out["branch_runs"][str(b)]):
            x, y = _series(db, rid, "eval_accuracy")
            curves[(b, r)] = (np.r_[AT, x[x > AT]], np.r_[p0, y[x > AT]])
    best = max(np.median([_ma(curves[(b, r)][1], window)[-1] for r in range(SEEDS)])
               for b in BATCHES)
    target = p0 + frac * (best - p0)
    clocks = {b: [_clock(*curves[(b, r)], target, window) for r in range(SEEDS)]
              for b in BATCHES}
    e1, e2 = (_median(clocks[b]) for b in BATCHES)
    b1, b2 = BATCHES
    if all(math.isinf(e) for e in (e1, e2)):
        est = {"b_crit": None, "bound": None}
    elif math.isinf(e1):  # only the larger batch reached it: E_min is its own clock
        est = {"b_crit": b2, "bound": "lower"}
    elif math.isinf(e2):  # the wall between a batch that reached it and one that did not
        est = {"b_crit": math.sqrt(b1 * b2), "bound": None, "low": b1, "high": b2}
    elif max(e1, e2) < 2 * e1:
        est = {"b_crit": b2, "bound": "lower"}
    else:  # log-log interpolation to 2 E_min, E_min the smallest batch's clock (2 batches)
        frac = (math.log(2 * e1) - math.log(e1)) / (math.log(max(e1, e2)) - math.log(e1))
        est = {"b_crit": math.exp(math.log(b1) + frac * (math.log(b2) - math.log(b1))),
               "bound": None}
    return {"p0": p0, "target": target, "clocks": clocks, "est": est}


def _b_simple(db, run_id, step) -> float:
    """B_simple at `step` from the run's stored two-batch terms, EMA 0.05, by hand."""
    rows = _rows(db, run_id)
    g2 = tr = None
    for s in sorted(rows):
        r = rows[s]
        if s > step or "grad_sq_micro" not in r:
            continue
        b, bb, gb, gbb = (r[k] for k in ("grad_micro_size", "grad_full_size", "grad_sq_micro",
                                         "grad_sq_full"))
        g2_now = (bb * gbb - b * gb) / (bb - b)
        tr_now = (gb - gbb) / (1 / b - 1 / bb)
        g2 = g2_now if g2 is None else 0.05 * g2_now + 0.95 * g2
        tr = tr_now if tr is None else 0.05 * tr_now + 0.95 * tr
    return tr / g2 if g2 > 0 and tr / g2 > 0 else None


def test_printed_numbers_are_the_hand_computation_from_the_stored_curves(probed):
    from twoclocks_cli.core.numbers import count, num

    url, db, run_id, out, text = probed
    hand = _hand(db, out)
    assert out["progress_at"] == hand["p0"]
    assert out["target"] == pytest.approx(hand["target"], abs=1e-12)
    for b in BATCHES:
        got = out["clocks"][str(b)]
        want = hand["clocks"][b]
        assert [g is None for g in got] == [w is None for w in want], (b, got, want)
        assert [g for g in got if g is not None] == pytest.approx(
            [w for w in want if w is not None], abs=1e-9)
    est, want = out["b_crit"], hand["est"]
    assert est["bound"] == want["bound"], (est, want)
    assert est["b_crit"] == pytest.approx(want["b_crit"], rel=1e-9)
    if want["b_crit"] is None:
        pass
    elif want["bound"] is None and "low" in want:
        assert (est["low"], est["high"]) == (want["low"], want["high"])
    elif want["bound"] is None:
        assert est["low"] <= est["b_crit"] and (est["high"] is None or est["b_crit"] <= est["high"])
    b_simple = _b_simple(db, run_id, out["at_step"])
    if b_simple is None:
        assert out["noise"]["b_simple"] is None and "not positive" in out["noise"]["why"][
            "b_simple"]
    else:
        assert out["noise"]["b_simple"] == pytest.approx(b_simple, rel=1e-9)
    assert out["noise"]["step"] == out["at_step"]  # every step measures (noise_every = 1)
    assert out["noise"]["b_sign"] is None  # the grpo trainer does not log the l1 terms
    # the text output of the second (resumed) run says the same numbers
    flat = " ".join(text.split())
    assert f"samples from eval_accuracy {hand['p0']:.4g} to {hand['target']:.4g}" in flat
    for b in BATCHES:
        seeds = ", ".join("censored" if v is None else count(v) for v in hand["clocks"][b])
        assert re.search(rf"│ {b} +│ [^│]+│ [^│]+│ {re.escape(seeds)} +│", text), (b, seeds)
    b_text = ("unknown" if want["b_crit"] is None else
              f">= {num(want['b_crit'])}" if want["bound"] == "lower" else
              f"{num(want['b_crit'])} [{num(est['low'])}, "
              f"{'open' if est['high'] is None else num(est['high'])}]")
    assert f"local B_crit: {b_text}" in flat, flat
    said = num(b_simple) if b_simple is not None else "not positive"
    assert f"at step {out['at_step']} (samples; two-batch terms, EMA 0.05): B_simple {said}" \
        in flat, flat
    assert "B_sign not logged" in flat
    assert f"replay: identical to run {run_id} at every one of its {AT // 8} steps" in flat


def test_a_batch_no_branch_of_which_reached_the_target_bounds_the_estimate(probed):
    """Rerun on the finished branches with wider smoothing and higher targets: a batch whose
    every branch is censored stays in the estimate (a lower bound below the batches that
    reached it, the wall above them), by the same hand computation."""
    url, db, run_id, _, _ = probed
    whole = []
    for window, frac in ((3, 1.0), (5, 0.9), (5, 1.0)):
        proc = twoclocks("probe", str(run_id), *PROBE, "--window", str(window),
                         "--target-frac", str(frac), "--db", url, "--json", cwd=db.parent,
                         env={"PYTHONPATH": str(db.parent)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout)
        hand = _hand(db, out, frac, window)
        assert out["target"] == pytest.approx(hand["target"], abs=1e-12)
        est, want = out["b_crit"], hand["est"]
        assert (est["bound"], est["b_crit"]) == (want["bound"], pytest.approx(want["b_crit"])), \
            (frac, est, want)
        whole += [b for b in BATCHES if all(v is None for v in hand["clocks"][b])]
    assert whole, "no target censored a whole batch: the case is not exercised"


def _counts(db) -> tuple[int, int, int]:
    with sqlite3.connect(db) as c:
        return tuple(c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("sweeps", "runs", "metrics"))


def test_bad_input_is_one_line_and_writes_nothing(probed, tmp_path):
    url, db, run_id, _, _ = probed
    from twoclocks_cli.store import Store

    (tmp_path / "probe_reward.py").write_text(REWARD)

    store = Store.open(url)
    config = dict(store.get_run(run_id).config)
    cols = {"batch_prompts": 2, "group_size": 4, "batch_samples": 8, "lr": 1e-4, "seed": 0}
    never = store.create_run("never-ran", "never", "grpo", config, cols)
    adaptive = store.create_run("adaptive", "adaptive", "grpo", {
        **config, "batch_schedule": "adaptive", "adaptive": {"batch_max": 8}}, cols)
    branch = store.create_run("branch", "branch", "grpo", {
        **config, "branch": {"from_workdir": None, "replicate": 1}}, cols)
    gone = store.create_run("gone", "gone", "grpo",
                            {**config, "model": str(tmp_path / "no-such-model")}, cols)
    with store.metric_writer(gone) as w:  # it has steps, but its model is nowhere
        w.log(1, 8, {"batch_samples": 8.0})
    csv = tmp_path / "r.csv"
    csv.write_text("step,samples,reward_mean\n1,8,0.1\n2,16,0.2\n")
    proc = twoclocks("ingest", str(csv), "-f", "csv", "--sweep", "imp", "--batch-prompts", "2",
                     "--group-size", "4", "--lr", "0.01", "--db", url, "--json")
    imported = json.loads(proc.stdout)[0]["run_id"]
    ok = ("--batches", "8,32", "--branch-samples", "128", "--executor", "debug")
    cases = [
        ([str(run_id), "--at", "999", *ok], "beyond run"),
        ([str(never), "--at", "8", *ok], "has no logged steps"),
        ([str(gone), "--at", "8", *ok], "no-such-model"),
        ([str(adaptive), "--at", "8", *ok], "is an adaptive run"),
        ([str(branch), "--at", "8", *ok], "is a branch of a probe"),
        ([str(imported), "--at", "8", *ok], "probe branches sim and grpo runs"),
        ([str(run_id), "--at", "64", "--batches", "8,10", "--branch-samples", "128"],
         "not a whole number of groups of 4"),
        ([str(run_id), "--at", "64", *ok[:4], "--executor", "cloud"], "allowed are local"),
        ([str(run_id), "--at", "64", *ok, "--eval-every", "0"], "--eval-every 0"),
    ]
    before = _counts(db)
    for args, needle in cases:
        proc = twoclocks("probe", *args, "--db", url, cwd=tmp_path)
        assert_one_line_error(proc, needle)
    assert _counts(db) == before


def test_a_replay_that_differs_from_the_run_is_said(probed):
    """The check compares the replay with the run's stored rows: a row that differs (here the
    run's loss at step 5, changed in the store) is named with both values."""
    url, db, run_id, _, _ = probed
    with sqlite3.connect(db) as c:
        (old,) = c.execute("SELECT value FROM metrics WHERE run_id = ? AND step = 5 AND "
                           "key = 'loss'", (run_id,)).fetchone()
        c.execute("UPDATE metrics SET value = ? WHERE run_id = ? AND step = 5 AND key = 'loss'",
                  (old + 1.0, run_id))
    try:
        proc = twoclocks("probe", str(run_id), *PROBE, "--db", url, "--json", cwd=db.parent,
                         env={"PYTHONPATH": str(db.parent)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        replay = json.loads(proc.stdout)["replay"]
        assert not replay["identical"]
        assert replay["first_difference"] == {"step": 5, "key": "loss", "run": old + 1.0,
                                              "replay": old}
    finally:
        with sqlite3.connect(db) as c:
            c.execute("UPDATE metrics SET value = ? WHERE run_id = ? AND step = 5 AND "
                      "key = 'loss'", (old, run_id))
