"""`twoclocks report`: a self-contained page that real headless chromium renders with its plots.

CI must have Debian's chromium (`apt-get install -y chromium`): with CI=true a missing browser
fails the test instead of skipping it.
"""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tests.unit.test_ingest_analyze import ingest_synthetic
from twoclocks_cli.app import app

PLOT_RED = (0xC0, 0x39, 0x2B)  # target line and failure markers
PLOT_BLUE = (0x2E, 0x86, 0xC1)  # progress-clock markers and the fit


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed (CI must run: apt-get install -y chromium)")
    pytest.skip("chromium is not installed (apt-get install -y chromium)")


def screenshot(page, tmp_path, name) -> np.ndarray:
    """Render `page` in headless chromium at 1200x1600; the screenshot as an RGB array."""
    png = tmp_path / f"{name}.png"
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp_path / ('chrome-' + name)}",
           f"--screenshot={png}", "--window-size=1200,1600", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert png.exists(), (proc.returncode, proc.stderr[-2000:])
    return np.asarray(Image.open(png).convert("RGB")).astype(int)


def near(img: np.ndarray, rgb, tol=12) -> int:
    return int((np.abs(img - np.array(rgb)).max(axis=2) <= tol).sum())


def report(*args):
    return CliRunner().invoke(app, ["report", *map(str, args)])


@pytest.mark.subprocess
def test_report_renders_in_headless_chromium_with_plots(tmp_path, sqlite_url):
    ingest_synthetic(tmp_path, sqlite_url)
    out = tmp_path / "rep"
    r = report("syn", "--out", out, "--db", sqlite_url)
    assert r.exit_code == 0, r.output
    page = out / "index.html"
    text = page.read_text()
    # self-contained: no scripts, nothing fetched from elsewhere, every image beside the page
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:|//)""", text, re.I)
    images = re.findall(r"<img src='([^']+)'", text)
    assert sorted(images) == ["clocks.png", "curves.png", "side.png"]
    assert all((out / i).stat().st_size > 5000 for i in images)
    for section in ("Summary", "Clock table", "Runs", "Fits", "Schedule", "Options used"):
        assert f"<h2>{section}</h2>" in text
    assert "[[phases]]" in text and "&quot;target&quot;: &quot;frac:0.5&quot;" in text
    assert (out / "analysis.json").exists()

    shot = screenshot(page, tmp_path, "full")
    white = (shot.min(axis=2) >= 250).mean()
    colours = len(np.unique(shot.reshape(-1, 3), axis=0))
    assert white < 0.98 and colours > 200, (white, colours)  # a blank page is ~1.0 and 1
    red, blue = near(shot, PLOT_RED), near(shot, PLOT_BLUE)
    # control: the same page without its images has (almost) none of the plot colours
    bare = out / "bare.html"
    bare.write_text(re.sub(r"<img [^>]*>", "", text))
    control = screenshot(bare, tmp_path, "bare")
    assert red > 200 and blue > 50, (red, blue)
    assert near(control, PLOT_RED) < red / 10 and near(control, PLOT_BLUE) < blue / 10


def test_report_without_a_fit_still_renders_and_says_why(tmp_path, sqlite_url):
    log = tmp_path / "run<script>.jsonl"  # a file name is a run name: it must be escaped
    log.write_text("".join(f'{{"step": {s}, "reward_mean": {min(0.9, 0.1 + s / 50)}}}\n'
                           for s in range(1, 60)))
    r = CliRunner().invoke(app, ["ingest", str(log), "-f", "jsonl", "--sweep", "one",
                                 "--batch-prompts", "4", "--group-size", "2", "--db", sqlite_url])
    assert r.exit_code == 0, r.output
    out = tmp_path / "rep"
    r = report("one", "--out", out, "--db", sqlite_url)
    assert r.exit_code == 0, r.output
    text = (out / "index.html").read_text()
    assert "<script>" not in text and "run&lt;script&gt;.jsonl" in text
    assert "No schedule:" in text and "no fit possible" in text
    assert (out / "curves.png").exists()


@pytest.mark.parametrize("args, needle", [
    (["nope", "--out", "OUT"], "no sweep named 'nope'"),
    (["one", "--out", "FILE"], "is not a directory"),
    (["one", "--out", "OUT", "--smoothing", "spline"], "--smoothing 'spline'"),
    (["one", "--out", "OUT", "--metric", "nope"], "metric 'nope' not logged"),
])
def test_report_bad_input_is_one_line(tmp_path, sqlite_url, args, needle):
    log = tmp_path / "r.jsonl"
    log.write_text('{"step": 1, "reward_mean": 0.1}\n{"step": 2, "reward_mean": 0.2}\n')
    CliRunner().invoke(app, ["ingest", str(log), "-f", "jsonl", "--sweep", "one",
                             "--batch-prompts", "4", "--group-size", "2", "--db", sqlite_url])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    args = [str(tmp_path / "o") if a == "OUT" else str(blocker / "sub") if a == "FILE" else a
            for a in args]
    r = report(*args, "--db", sqlite_url)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "o").exists()  # refused before the folder is made


def _used(out) -> dict:
    import json

    saved = json.loads((out / "analysis.json").read_text())
    a = saved["analysis"]
    return {"id": a["analysis_id"], "how": saved["options"]["analysis_source"]["how"],
            "target": a["options"]["target"], "runs": len(a["runs"])}


@pytest.mark.slow
def test_report_reuses_the_stored_analysis_until_the_sweep_changes(tmp_path, sqlite_url):
    """`analyze` stores a result; `report` shows exactly that one while the sweep is unchanged,
    redoes it with the same options once a run is added, and starts afresh on request."""
    import json

    ingest_synthetic(tmp_path, sqlite_url)
    r = CliRunner().invoke(app, ["analyze", "syn", "--target", "frac:0.4", "--json", "--save",
                                 "--db", sqlite_url])
    assert r.exit_code == 0, r.output
    stored = json.loads(r.stdout)["analysis_id"]

    assert report("syn", "--out", tmp_path / "a", "--db", sqlite_url).exit_code == 0
    assert _used(tmp_path / "a") == {"id": stored, "how": "reused", "target": "frac:0.4", "runs": 6}
    assert "frac:0.4" in (tmp_path / "a" / "index.html").read_text()

    log = tmp_path / "late.jsonl"  # one more run: the stored analysis no longer describes it
    log.write_text("".join(f'{{"step": {s}, "reward_mean": {min(0.9, s / 40)}}}\n'
                           for s in range(1, 80)))
    r = CliRunner().invoke(app, ["ingest", str(log), "-f", "jsonl", "--sweep", "syn",
                                 "--batch-prompts", "8", "--group-size", "8", "--db", sqlite_url])
    assert r.exit_code == 0, r.output
    assert report("syn", "--out", tmp_path / "b", "--db", sqlite_url).exit_code == 0
    b = _used(tmp_path / "b")
    assert b["how"] == "refreshed" and b["id"] > stored and b["target"] == "frac:0.4"
    assert b["runs"] == 7

    assert report("syn", "--out", tmp_path / "c", "--db", sqlite_url).exit_code == 0
    assert _used(tmp_path / "c") == {**b, "how": "reused"}  # the refreshed one, now current
    assert report("syn", "--out", tmp_path / "d", "--reanalyze", "--db", sqlite_url).exit_code == 0
    d = _used(tmp_path / "d")
    assert d["how"] == "analysed" and d["target"] == "frac:0.5" and d["id"] > b["id"]


def test_report_names_what_was_trained_and_warns_on_a_tiny_eval_set(tmp_path, sqlite_url):
    """A grpo run's model, data, reward and eval size are on the page (the trainer's defaults
    filled in where the cell left them out); an eval set of 64 problems is warned about."""
    from trainer.config import TrainConfig
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import Run, Sweep

    store = Store.open(sqlite_url)
    with store.session() as s:
        sweep = Sweep(name="g", backend="grpo", config={})
        s.add(sweep)
        s.flush()
        for seed, eval_size in ((0, 64), (1, 1024)):
            s.add(Run(sweep_id=sweep.id, cell_id=f"c{seed}", name=f"r{seed}", backend="grpo",
                      status="planned", batch_samples=32, batch_prompts=4, group_size=8,
                      lr=1e-4, seed=seed,
                      config={"model": "builtin:tiny-arith", "eval_size": eval_size,
                              "prompts_per_batch": 4, "group_size": 8, "lr": 1e-4}))
    for run in store.list_runs("g"):
        with store.metric_writer(run.id) as w:
            for step in range(1, 6):
                w.log(step, 32 * step, {"reward_mean": 0.1 * step})
    r = report("g", "--db", sqlite_url, "--out", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "rep" / "index.html").read_text()
    section = page[page.index("What was trained"):page.index("<h2>Clock table")]
    assert "builtin:tiny-arith" in section and "64, 1024" in section
    assert TrainConfig.model_fields["dataset"].default in section  # the default, filled in
    assert TrainConfig.model_fields["reward"].default in section
    assert "an eval set of 64 problems" in section and "0.062" in section  # 0.5 / sqrt(64)


def _sim_sweep_and_adaptive_run(tmp_path, sqlite_url):
    """A sim constant grid (4..32 samples, 2 seeds, the adaptive test's model) analysed and
    stored, and one adaptive run of the same setting with the branch rule; returns its id."""
    import tests.integration.simsweep as ss
    from tests.integration.test_adaptive_sim import SIM, _adaptive_runs
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep
    from twoclocks_cli.store import Store

    store = Store.open(sqlite_url)
    sim = {**SIM, "cap": 0.05}
    old = ss.LR0
    ss.LR0 = 0.02
    try:
        ss.make_sweep(store, "const", [1, 2, 4, 8], 2, 6000, sim, tmp_path / "c")
        opts = AnalysisOptions(target="0.9", drift_threshold=8.0, theory=False, bootstrap=100)
        store.save_analysis("const", analyze_sweep(store, "const", opts).to_json())
        rid = _adaptive_runs(store, "adaptive", sim, tmp_path / "a",
                             {"batch_max": 8, "adapt_every": 512, "rule": "branch",
                              "branch_samples": 32, "grow_ratio": 0.5}, ss.LR0)[0]
    finally:
        ss.LR0 = old
    store.close()
    return rid


def test_report_draws_an_adaptive_run_against_the_sweeps_clocks(tmp_path, sqlite_url):
    """`report --run`: the run's trajectory is its stored batch_samples, each decision's local
    B_crit is B (2r - 1)/(1 - r) of its stored gain ratio r, its clocks are `compare`'s, and
    the page shows the figure and both tables."""
    import json

    import tests.integration.simsweep as ss
    from twoclocks_cli.store import Store

    rid = _sim_sweep_and_adaptive_run(tmp_path, sqlite_url)
    out = tmp_path / "rep"
    r = report("const", "--out", out, "--run", rid, "--db", sqlite_url)
    assert r.exit_code == 0, r.output
    saved = json.loads((out / "analysis.json").read_text())
    [c] = saved["runs_compared"]
    cmp = CliRunner().invoke(app, ["compare", "const", "--run", str(rid), "--json",
                                   "--db", sqlite_url])
    assert cmp.exit_code == 0, cmp.output
    assert c["schedule"]["progress"] == json.loads(cmp.stdout)["schedule"]["progress"]

    store = Store.open(sqlite_url)
    batch = store.load_metric([rid], "batch_samples")[rid]
    traj = c["trajectory"]
    assert traj["samples"] == batch.samples.tolist() and traj["batch"] == batch.values.tolist()
    assert len(set(traj["batch"])) > 1  # it grew
    ratio = store.load_metric([rid], "adaptive_branch_gain_ratio")[rid]
    by_step = dict(zip(ratio.steps.tolist(), ratio.values.tolist(), strict=True))
    decisions = traj["decisions"]
    assert len(decisions) == len(store.load_metric([rid], "adaptive_decision")[rid].values)
    checked = 0
    for d in decisions:
        r_ = by_step.get(d["step"])
        if r_ is not None and 0.5 < r_ < 1:
            assert d["local_b_crit"] == pytest.approx(d["batch"] * (2 * r_ - 1) / (1 - r_))
            checked += 1
        else:
            assert d["local_b_crit"] is None and "no estimate" in d["how"]
        assert d["next_batch"] is None or d["next_batch"] % ss.G == 0
    assert checked >= 1
    store.close()

    text = (out / "index.html").read_text()
    assert "<h2>Adaptive and scheduled runs</h2>" in text
    assert f"<img src='run-{rid}.png'" in text and (out / f"run-{rid}.png").stat().st_size > 5000
    assert text.count("<td class=\"l\">constant ") == 4  # one row per batch of the sweep


@pytest.mark.parametrize("which, needle", [("missing", "no run with id 999"),
                                           ("constant", "is a constant-batch run")])
def test_report_run_refused_in_one_line_before_any_write(tmp_path, sqlite_url, which, needle):
    from twoclocks_cli.store import Store

    rid = _sim_sweep_and_adaptive_run(tmp_path, sqlite_url)
    store = Store.open(sqlite_url)
    const = [r.id for r in store.list_runs("const")][0]
    store.close()
    out = tmp_path / "rep"
    r = report("const", "--out", out, "--run", rid, "--run",
               999 if which == "missing" else const, "--db", sqlite_url)
    assert r.exit_code != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not out.exists()
