"""`twoclocks ingest` of W&B run folders, W&B panel CSV exports, MLflow stores and TensorBoard
event files, each written by its own library in the test (W&B offline, no network; MLflow on a
local SQLite store; torch's SummaryWriter): a three-run batch sweep from each source gives the
same clocks, to the last digit, as the same curves imported from CSV; bad input is one line and
leaves the store file as it was; --follow imports a TensorBoard and a W&B run while they log."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.support import trackers as tk

_MISSING = [m for m in ("wandb", "mlflow", "tensorboard") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.skipif(bool(_MISSING), reason=f"the 'sources' extra is not installed "
                       f"({', '.join(_MISSING)} missing): pip install -e '.[sources]' "
                       "(scripts/setup.sh installs it)"),
    pytest.mark.xdist_group("ingest_sources"),  # the sources are written once, on one worker
    pytest.mark.subprocess,
]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each source's sweep, written once, and the store with the CSV sweep imported."""
    root = tmp_path_factory.mktemp("sources")
    db = root / "store.db"
    url = f"sqlite:///{db}"
    for p, path in zip(tk.PROMPTS, tk.write_csv(root / "csv"), strict=True):
        _ingest(url, str(path), "--sweep", "csv", "--batch-prompts", str(p), "--group-size",
                str(tk.GROUP), "--lr", repr(tk.lr_of(p)))
    return {
        "root": root, "db": db, "url": url, "csv": _clocks(url, "csv"),
        "wandb": tk.wandb_sweep(root / "wb"),
        "mlflow": tk.mlflow_sweep(root / "mlflow.db"),
        "tensorboard": tk.tensorboard_sweep(root / "tb" / "sweep"),
        "wandb-csv": tk.write_panel_csv(root / "panel.csv"),
    }


def _cli(*args: str):
    """The real CLI in this process (the follow tests start it as a process of its own)."""
    from typer.testing import CliRunner

    from twoclocks_cli.app import app

    return CliRunner().invoke(app, list(args))


def _ingest(url: str, *args: str) -> list[dict]:
    result = _cli("ingest", *args, "--db", url, "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def _one_line_error(result, needle: str) -> None:
    """Exit 2, one line on stderr naming the problem, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and needle in lines[0], (needle, lines[0])


def _clocks(url: str, sweep: str) -> dict:
    """`analyze --json` without what names the sweep and its runs (ids, names)."""
    proc = _cli("analyze", sweep, "--db", url, "--json")
    assert proc.exit_code == 0, proc.output

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("sweep", "run_id", "name")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    out = strip(json.loads(proc.stdout))
    out["runs"].sort(key=lambda r: (r["batch_samples"], r["lr"]))  # in the order imported
    return out


def _import(written, source: str, sweep: str) -> list[dict]:
    url, where = written["url"], written[source]
    if source == "mlflow":
        return _ingest(url, "--from", f"mlflow:{where}", "--sweep", sweep)
    if source == "wandb-csv":  # the export keeps no config: one run at a time, its own options
        return [r for p in tk.PROMPTS for r in _ingest(
            url, str(where), "--run", tk.name_of(p), "--sweep", sweep, "--batch-prompts",
            str(p), "--group-size", str(tk.GROUP), "--lr", repr(tk.lr_of(p)))]
    return _ingest(url, str(where), "--sweep", sweep)


@pytest.mark.parametrize("source", ["wandb", "mlflow", "tensorboard", "wandb-csv"])
def test_a_sweep_from_each_source_gives_the_clocks_its_csv_gives(written, source):
    sweep = f"from-{source}"
    results = _import(written, source, sweep)
    assert [r["action"] for r in results] == ["created"] * 3
    assert {r["format"] for r in results} == {source}
    by_batch = {r["batch_samples"]: r for r in results}
    assert sorted(by_batch) == [p * tk.GROUP for p in tk.PROMPTS]
    for p in tk.PROMPTS:  # each run's batch and lr from its own config
        r = by_batch[p * tk.GROUP]
        assert (r["batch_prompts"], r["group_size"], r["lr"]) == (p, tk.GROUP, tk.lr_of(p))
        assert r["steps"] == len(tk.curve(p)) and r["sources"]["reward_mean"] == tk.REWARD
        if source != "wandb-csv":
            assert "config" in r["params_from"]["batch_prompts"] or \
                "params" in r["params_from"]["batch_prompts"] or \
                "hparams" in r["params_from"]["batch_prompts"], r["params_from"]
    clocks = _clocks(written["url"], sweep)
    assert clocks == written["csv"]
    assert clocks["metric"] == "eval_accuracy" and len(clocks["runs"]) == 3
    # the evaluation before training is the curve's first point, at samples 0
    assert all(run["first_samples"] == 0 and run["initial"] > 0.05 for run in clocks["runs"])
    # importing the same source again changes nothing
    assert {r["action"] for r in _import(written, source, sweep)} == {"unchanged"}


def test_what_each_source_says_it_inferred(written):
    url = written["url"]
    tb = _ingest(url, str(written["tensorboard"]), "--sweep", "notes-tb")
    assert all(any("32-bit floats" in n for n in r["notes"]) for r in tb)
    assert {r["run"] for r in tb} == {tk.name_of(p) for p in tk.PROMPTS}
    assert {r["path"] for r in tb} == {str(written["tensorboard"])}
    wide = tk.write_panel_csv(written["root"] / "wide.csv", widen=5)
    panel = _ingest(url, str(wide), "--sweep", "notes-csv", "--batch-prompts", "4",
                    "--group-size", "8")
    assert len(panel) == 3
    for r in panel:
        assert any(n.startswith("5 row(s) where __MIN and __MAX differ") for n in r["notes"])
        assert any("analyze takes runs of one batch and lr as seeds" in n for n in r["notes"])
    # an event file cut off mid-record (a run still writing, or a copy cut short)
    events = next((written["tensorboard"] / tk.name_of(4)).glob("events.out.tfevents.*"))
    cut = written["root"] / "tbcut" / "bs32"
    cut.mkdir(parents=True)
    (cut / events.name).write_bytes(events.read_bytes()[:-3])
    (r,) = _ingest(url, str(cut), "--sweep", "notes-cut", "--batch-prompts", "4",
                   "--group-size", "8")
    assert any(n.startswith(f"{events.name} ends mid-record") for n in r["notes"])
    assert r["rows"] == sum(len(v) for v in tk.curve(4).values()) - 1
    _one_line_error(_cli("ingest", str(written["wandb-csv"]), "--sweep", "notes-csv2", "--db", url),
                    "samples are not logged and the batch size is unknown; pass --batch-prompts "
                    "and --group-size (samples = step × prompts × group size); a W&B panel "
                    "export keeps no config: import each run with --run NAME")


def test_trl_names_in_wandb_and_the_peak_lr(tmp_path):
    """HF/TRL's W&B callback: `train/` and `eval/` prefixes, `train/global_step` as the step
    (W&B counts its own _step per log call), the lr logged, no batch in the config."""
    rows = []
    for s in range(1, 7):
        rows.append([s, {"train/reward": s / 8, "train/learning_rate": 1e-3 * min(1, s / 3),
                         "train/global_step": 2 * s}])
        if s % 3 == 0:
            rows.append([s, {"eval/rewards/accuracy_reward/mean": s / 16,
                             "train/global_step": 2 * s}])
    folder = tk.write_wandb(tmp_path, [{"name": "trl", "config": {"num_generations": 4},
                                        "rows": rows, "explicit_step": False}])
    url = f"sqlite:///{tmp_path / 's.db'}"
    (r,) = _ingest(url, str(folder), "--sweep", "trl", "--batch-prompts", "2")
    assert r["sources"]["step"] == "train/global_step"
    assert r["sources"]["reward_mean"] == "train/reward"
    assert r["sources"]["eval_accuracy"] == "eval/rewards/accuracy_reward/mean"
    assert r["group_size"] == 4 and r["params_from"]["group_size"] == "W&B config (num_generations)"
    assert r["lr"] == 1e-3 and "the peak train/learning_rate logged" in " ".join(r["notes"])
    assert r["steps"] == 6 and r["batch_samples"] == 8
    from twoclocks_cli.store import Store

    store = Store.open(url)
    acc = store.load_metric([r["run_id"]], "eval_accuracy")[r["run_id"]]
    assert list(acc.steps) == [6, 12] and list(acc.samples) == [48, 96]
    assert list(acc.values) == [3 / 16, 6 / 16]
    store.close()


def test_a_resumed_wandb_run_is_one_run(tmp_path):
    """W&B resumes a run into a new directory with the same id: the directories are joined,
    the later one's steps replacing the earlier's from its first step (a checkpoint's) on."""
    config = tk.verl_config(4)
    first = [[s, {tk.REWARD: s / 16}] for s in range(1, 9)]
    again = [[s, {tk.REWARD: s / 16 + 1 / 32}] for s in range(6, 11)]
    tk.write_wandb(tmp_path, [{"name": "r", "id": "resumeme", "config": config, "rows": first}])
    time.sleep(1.1)  # a run directory's name holds its start second
    folder = tk.write_wandb(tmp_path, [{"name": "r", "id": "resumeme", "resume": "allow",
                                        "config": config, "rows": again}])
    assert len([d for d in folder.iterdir() if d.name.startswith("offline-run-")]) == 2
    url = f"sqlite:///{tmp_path / 's.db'}"
    (r,) = _ingest(url, str(folder), "--sweep", "resumed")
    assert r["steps"] == 10 and any("from step 6: 3 earlier step(s)" in n for n in r["notes"])
    from twoclocks_cli.store import Store

    store = Store.open(url)
    reward = store.load_metric([r["run_id"]], "reward_mean")[r["run_id"]]
    want = [s / 16 for s in range(1, 6)] + [s / 16 + 1 / 32 for s in range(6, 11)]
    assert list(reward.values) == want and list(reward.samples) == [32 * s for s in range(1, 11)]
    store.close()


def test_mlflow_experiment_filter_and_an_mlruns_folder(written, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    source = f"mlflow:{written['mlflow']}"
    got = _ingest(url, "--from", source, "--experiment", "sweep", "--filter",
                  "params.`data/train_batch_size` = '8'", "--sweep", "one")
    assert [r["batch_samples"] for r in got] == [64]
    got = _ingest(url, "--from", source, "--run", "sweep/bs1*", "--sweep", "two")
    assert sorted(r["batch_samples"] for r in got) == [128]
    _one_line_error(_cli("ingest", "--from", source, "--experiment", "nope", "--db", url),
                    "no experiment nope (experiments: ")
    # a file store (mlruns), as older MLflow wrote by default, read as a PATH
    mlruns = tmp_path / "mlruns"
    tk.write_mlflow(mlruns.as_uri(), [{"experiment": "e", "name": "bs32",
                                       "params": {"prompts_per_batch": 4, "group_size": 8,
                                                  "lr": 0.001, "seed": 3},
                                       "rows": [[s, {"reward": s / 4}] for s in range(1, 4)],
                                       "status": "KILLED"}],
                    env={"MLFLOW_ALLOW_FILE_STORE": "true"})
    (r,) = _ingest(url, str(mlruns), "--sweep", "files")
    assert r["format_from"] == "detected: an MLflow mlruns folder"
    assert (r["batch_samples"], r["lr"], r["seed"]) == (32, 0.001, 3)
    assert any("MLflow status KILLED" in n for n in r["notes"])


def _content(db: Path) -> str:
    """A hash of the store's content as SQLite reads it, its write-ahead log included. Not the
    file's bytes: a connection the CLI left to the garbage collector checkpoints the log into
    the file whenever it closes, which moves bytes and changes nothing; a write still sitting
    in the log would change no byte of the file."""
    with closing(sqlite3.connect(db)) as con:
        return hashlib.sha256("\n".join(con.iterdump()).encode()).hexdigest()


def test_bad_input_is_one_line_and_the_store_file_is_untouched(written, tmp_path):
    url, db = written["url"], written["db"]
    before = _content(db)
    other = tmp_path / "other"
    (other / "sub").mkdir(parents=True)
    (other / "sub" / "notes.txt").write_text("not a run\n")
    no_reward = tk.write_wandb(tmp_path / "nr", [
        {"name": "sft", "config": {}, "rows": [[1, {"loss": 0.5}], [2, {"loss": 0.4}]]}])
    tb = written["tensorboard"] / tk.name_of(4)
    event = next(p for p in sorted(tb.iterdir()) if p.is_file())
    corrupt_tb = tmp_path / "tbbad" / "run"
    corrupt_tb.mkdir(parents=True)
    data = bytearray(event.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt_tb / event.name).write_bytes(bytes(data))
    wb_file = next(written["wandb"].glob("offline-run-*/*.wandb"))
    corrupt_wb = tmp_path / "wbbad" / wb_file.parent.name
    corrupt_wb.mkdir(parents=True)
    data = bytearray(wb_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt_wb / wb_file.name).write_bytes(bytes(data))
    timed = tmp_path / "timed.csv"
    timed.write_text('"Relative Time (Process)","a - reward","a - reward__MIN","a - reward__MAX"\n'
                     "0.5,0.1,0.1,0.1\n")
    cases = [
        ([str(timed)], "the x axis 'Relative Time (Process)' is '0.5', not a step"),
        ([str(other)], "a folder without a trainer_state.json, a .wandb file"),
        ([str(written["wandb"]), "--format", "tensorboard"], "no events.out.tfevents"),
        ([str(no_reward)], "no reward was logged (keys: loss)"),
        ([str(corrupt_tb)], "fails its checksum (a corrupt event file)"),
        ([str(corrupt_wb)], "fails its checksum (a corrupt .wandb file)"),
        ([str(db)], "an SQLite database without MLflow's tables"),
        (["--from", "mlflow:http://localhost:5000"], "only local MLflow stores are read"),
        (["--from", f"mlflow:{tmp_path / 'none.db'}"], "no such file or folder"),
        ([str(written["tensorboard"]), "--run", "bs99"], "no run matches --run bs99"),
        ([str(written["tensorboard"]), "--map", "reward_mean=nope"], "has no such key"),
    ]
    for args, needle in cases:  # behind a good source: still nothing is written
        _one_line_error(_cli("ingest", str(written["tensorboard"]), *args, "--sweep", "bad",
                             "--db", url), needle)
        assert _content(db) == before, args


# the writers log half their steps, wait for the test to see the run `running`, log the rest
_WAIT = r"""
def wait(go):
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
"""
_TB_WRITER = r"""
import os, sys, time
from torch.utils.tensorboard import SummaryWriter
""" + _WAIT + r"""
w = SummaryWriter(sys.argv[1])
w.add_hparams({"data.train_batch_size": 4, "actor_rollout_ref.rollout.n": 8}, {}, run_name=".")
for s in range(1, 13):
    w.add_scalar("critic/score/mean", s / 64, s)
    w.add_scalar("actor/entropy", 1 - s / 64, s)
    w.flush()
    if s == 6:
        wait(sys.argv[2])
w.close()
"""


def _follow(source: Path, pattern: str, url: str, writer: subprocess.Popen) -> subprocess.Popen:
    """The real CLI following `source` once the writer made its first log file, until the
    writer exits (--pid: a busy machine may pause a writer longer than any --idle)."""
    deadline = time.monotonic() + 60
    while not list(source.glob(pattern)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return subprocess.Popen(
        [sys.executable, "-m", "twoclocks_cli", "ingest", str(source), "--follow", "--idle", "60",
         "--pid", str(writer.pid), "--poll", "0.1", "--sweep", "live", "--db", url, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows(url: str, run_id: int) -> list[tuple]:
    from twoclocks_cli.store import Store

    store = Store.open(url)
    try:
        out = []
        for key in ("reward_mean", "entropy"):
            series = store.load_metric([run_id], key).get(run_id)
            if series is not None:
                out += [(int(s), int(n), key, v) for s, n, v in
                        zip(series.steps, series.samples, series.values, strict=True)]
        return sorted(out)
    finally:
        store.close()


def _midway(db: Path, go: Path) -> tuple[str, int]:
    """(status, steps stored) of the followed run once it has a step; then lets the writer
    go on."""
    import sqlite3

    deadline, got = time.monotonic() + 90, None
    while got is None and time.monotonic() < deadline:
        if db.exists():
            with sqlite3.connect(db) as con:
                try:
                    got = con.execute("select r.status, count(distinct m.step) from runs r join "
                                      "metrics m on m.run_id = r.id group by r.id").fetchone()
                except sqlite3.OperationalError:  # the follower is still creating the store
                    pass
        time.sleep(0.05)
    go.touch()
    assert got is not None, "the follower stored no step in 90 s"
    return got


def _once(url: str, source: Path) -> list[tuple]:
    (r,) = _ingest(url, str(source), "--sweep", "once")
    return _rows(url, r["run_id"])


def test_follow_a_tensorboard_run_while_it_logs(tmp_path):
    run = tmp_path / "tb" / "bs32"
    run.mkdir(parents=True)
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    writer = subprocess.Popen([sys.executable, "-c", _TB_WRITER, str(run), str(tmp_path / "go")])
    follower = _follow(run, "events.out.tfevents.*", url, writer)
    status, steps = _midway(db, tmp_path / "go")
    assert status == "running" and 1 <= steps <= 6
    assert writer.wait(timeout=60) == 0
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    (r,) = json.loads(out)
    assert r["action"] == "followed" and r["batch_samples"] == 32
    followed = _rows(url, r["run_id"])
    assert len(followed) == 24 and followed[0] == (1, 32, "entropy", 1 - 1 / 64)
    assert followed == _once(url, run)


_WANDB_LIVE = r"""
import os, sys, time
import wandb
""" + _WAIT + r"""
r = wandb.init(project="live", dir=sys.argv[1], name="live", settings=wandb.Settings(silent=True),
               config={"data": {"train_batch_size": 4}, "actor_rollout_ref": {"rollout": {"n": 8}}})
pad = {f"extra/k{i}": i / 7 for i in range(40)}  # wandb writes its log in 32 KiB blocks
for s in range(1, 241):
    r.log({"critic/score/mean": s / 256, "actor/entropy": 1 - s / 256, **pad}, step=s)
    if s == 120:
        wait(sys.argv[2])
r.finish()
"""


def test_follow_a_wandb_run_while_it_logs(tmp_path):
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    (tmp_path / "wandb").mkdir()
    writer = subprocess.Popen([sys.executable, "-c", _WANDB_LIVE, str(tmp_path),
                               str(tmp_path / "go")],
                              env={**os.environ, **tk.WANDB_ENV, "WANDB_DIR": str(tmp_path)})
    follower = _follow(tmp_path / "wandb", "offline-run-*/*.wandb", url, writer)
    status, steps = _midway(db, tmp_path / "go")
    assert status == "running" and 1 <= steps <= 120  # the blocks W&B had written
    assert writer.wait(timeout=60) == 0
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    (r,) = json.loads(out)
    assert r["steps"] == 240
    followed = _rows(url, r["run_id"])
    assert len(followed) == 480 and followed[-1] == (240, 240 * 32, "reward_mean", 240 / 256)
    assert followed == _once(url, tmp_path / "wandb")
