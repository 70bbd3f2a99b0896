"""A checkpoint belongs to one run: two stores in one directory never share a default workdir,
another run's workdir or checkpoint is refused in one line, and a changed config is refused
(naming the keys) unless `--extend` raises only the sample budget."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = [pytest.mark.slow, pytest.mark.tiny_model]

TIMING = {"time_gen_s", "time_reward_s", "time_update_s", "tokens_per_s"}
BASE = {"prompts_per_batch": 4, "group_size": 4, "sample_budget": 64, "lr": 1e-4, "seed": 3,
        "eval_every_samples": 0, "checkpoint_every_steps": 2, "max_new_tokens": 6, "threads": 1}


def _toml(path: Path, **changes) -> str:
    cfg = {**BASE, **changes}
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in cfg.items()))
    assert tomllib.loads(path.read_text()) == cfg
    return str(path)


def _metrics(url: str, run_id: int) -> dict:
    import sqlalchemy as sa

    from twoclocks_cli.store import Store

    store = Store.open(url)
    try:
        with store.engine.connect() as c:
            rows = c.execute(sa.text("SELECT step, key, samples, value FROM metrics "
                                     "WHERE run_id = :r"), {"r": run_id}).all()
    finally:
        store.close()
    return {(s, k): (n, v) for s, k, n, v in rows if k not in TIMING}


def _runs(url: str) -> list:
    from twoclocks_cli.store import Store

    store = Store.open(url)
    try:
        return [(r.id, r.status, r.config) for r in store.list_runs()]
    finally:
        store.close()


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _workdir(proc, cwd: Path) -> Path:
    return cwd / re.search(r"checkpoints in (\S+)", proc.stdout).group(1)


def test_two_stores_in_one_directory_each_train_their_own_run(tiny_model, tmp_path):
    cfg = _toml(tmp_path / "t.toml")
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    first = _ok(twoclocks("train", cfg, "--db", a, cwd=tmp_path))
    second = _ok(twoclocks("train", cfg, "--db", b, cwd=tmp_path))
    assert "run 1 completed" in first.stdout and "run 1 completed" in second.stdout
    wa, wb = _workdir(first, tmp_path), _workdir(second, tmp_path)
    assert wa != wb  # both are run 1 of their store: the default workdir is not named by the id
    ma, mb = _metrics(a, 1), _metrics(b, 1)
    assert sorted({s for s, _ in mb}) == list(range(1, 5))  # its own 4 steps, not 0 rows
    assert ma == mb  # same config, same seed, one thread: the same training

    # store b pointed at store a's workdir: refused, nothing written to b
    before = _runs(b)
    line = assert_one_line_error(twoclocks("train", cfg, "--db", b, "--workdir", str(wa),
                                           cwd=tmp_path), "resume refused")
    assert "a.db" in line and "b.db" in line
    assert _runs(b) == before and len(_metrics(b, 1)) == len(mb)

    # a sweep job (the grpo backend) given a workdir holding another run's checkpoint
    from twoclocks_cli.backends import run_cell
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.store import Run, Store

    store = Store.open(b)
    with store.session() as s:
        run = Run(cell_id="cell", name="c", backend="grpo", config=tomllib.loads(
            Path(cfg).read_text()))
        s.add(run)
        s.flush()
        rid = run.id
    with pytest.raises(ConfigError, match=r"belongs to run 1 of .*a\.db.*resume refused"):
        run_cell(store, rid, wa)
    assert store.count_metrics(rid) == 0
    store.close()


def test_a_changed_config_is_refused_unless_extend_raises_only_the_budget(tiny_model, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    work = str(tmp_path / "w")
    base = _toml(tmp_path / "base.toml")
    _ok(twoclocks("train", base, "--db", url, "--workdir", work))
    rows = _metrics(url, 1)
    assert sorted({s for s, _ in rows}) == [1, 2, 3, 4]

    hotter = _toml(tmp_path / "hot.toml", lr=5e-4, sample_budget=128)
    for extra in ([], ["--extend"]):
        line = assert_one_line_error(
            twoclocks("train", hotter, "--db", url, "--workdir", work, *extra), "lr: 0.0001")
        assert "0.0005" in line
    longer = _toml(tmp_path / "long.toml", sample_budget=128)
    assert_one_line_error(twoclocks("train", longer, "--db", url, "--workdir", work),
                          "sample_budget: 64 -> 128", "--extend")
    shorter = _toml(tmp_path / "short.toml", sample_budget=32)
    assert_one_line_error(twoclocks("train", shorter, "--db", url, "--workdir", work,
                                    "--extend"), "may only raise sample_budget")
    assert [(i, s, c["lr"], c["sample_budget"]) for i, s, c in _runs(url)] == \
        [(1, "completed", 1e-4, 64)]  # nothing written by the refusals
    assert _metrics(url, 1) == rows

    _ok(twoclocks("train", longer, "--db", url, "--workdir", work, "--extend"))
    (run,) = _runs(url)
    assert run[1] == "completed" and run[2]["sample_budget"] == 128  # the row says the truth
    extended = _metrics(url, 1)
    # the truth: one uninterrupted run to 128 samples in another store
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    _ok(twoclocks("train", longer, "--db", fresh, "--workdir", str(tmp_path / "f")))
    assert extended == _metrics(fresh, 1)
    assert sorted({s for s, _ in extended}) == list(range(1, 9))
