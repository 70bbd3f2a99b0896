"""`--json` on the db commands: one JSON object each, the URL masked, values the same as the
migration API's own (alembic's revision table)."""

from __future__ import annotations

import json

from tests.support.cli import twoclocks_inproc


def test_db_current_upgrade_downgrade_json(tmp_path):
    from twoclocks_cli.store.engine import make_engine
    from twoclocks_cli.store.migrate import current_revision, head_revision

    url = f"sqlite:///{tmp_path / 's.db'}"
    up = json.loads(twoclocks_inproc("db", "upgrade", "--db", url, "--json").stdout)
    assert up["after"] == head_revision() and up["before"] is None
    cur = json.loads(twoclocks_inproc("db", "current", "--db", url, "--json").stdout)
    assert cur == {"url": url, "revision": current_revision(make_engine(url)),
                   "head": head_revision(), "state": "up to date"}
    down = json.loads(twoclocks_inproc("db", "downgrade", "base", "--db", url, "--json").stdout)
    assert down["before"] == head_revision() and down["after"] == "base"
    cur = json.loads(twoclocks_inproc("db", "current", "--db", url, "--json").stdout)
    assert cur["revision"] is None and cur["state"] == "empty"


def test_status_shows_standalone_train_runs_and_watch_json_streams_lines(tmp_path):
    from twoclocks_cli.store import Run, Store, Sweep

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    with store.session() as s:
        s.add(Run(cell_id="train-abc", name="my-run", backend="grpo", status="completed",
                  batch_samples=128, lr=1e-4, config={}))
        sw = Sweep(name="sw", backend="sim", config={})
        s.add(sw)
        s.flush()
        s.add(Run(sweep_id=sw.id, cell_id="c0", name="cell", backend="sim", status="completed",
                  config={}))
    alone = store.list_runs()[0]
    with store.metric_writer(alone.id) as w:
        for step in range(1, 8):
            w.log(step, 128 * step, {"reward_mean": 0.1})
    snap = json.loads(twoclocks_inproc("status", "--db", url, "--json").stdout)
    assert [(r["name"], r["last_step"]) for r in snap["standalone"]] == [("my-run", 7)]
    table = twoclocks_inproc("status", "--db", url)
    assert "runs of `twoclocks train` (no sweep): 1" in table.stdout and "my-run" in table.stdout
    watch = twoclocks_inproc("status", "--db", url, "--watch", "--json", "--interval", "0.2")
    lines = [ln for ln in watch.stdout.splitlines() if ln.strip()]
    assert watch.returncode == 0 and len(lines) == 1  # nothing runs: one object, then done
    assert json.loads(lines[0])["sweeps"]["sw"] == {"completed": 1}
