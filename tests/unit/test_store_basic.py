"""Store round trips on SQLite and PostgreSQL: runs, status events, metrics with NaN/inf."""

import math

from twoclocks_cli.store import Run, RunStatus, Sweep


def _make_run(store, name="r0", sweep_name="s"):
    with store.session() as s:
        sweep = Sweep(name=sweep_name, backend="sim", config={})
        s.add(sweep)
        s.flush()
        run = Run(sweep_id=sweep.id, cell_id="c" + name, name=name, backend="sim",
                  batch_prompts=4, group_size=8, batch_samples=32, lr=1e-3, seed=0, config={})
        s.add(run)
        s.flush()
        return run.id


def test_metric_roundtrip_keeps_nan_and_inf(store):
    rid = _make_run(store)
    with store.metric_writer(rid, batch_rows=3) as w:
        w.log(0, 32, {"a": 1.5, "b": math.nan})
        w.log(1, 64, {"a": math.inf, "b": -math.inf})
        w.log(2, 96, {"a": 0.0})
    a = store.load_metric([rid], "a")[rid]
    b = store.load_metric([rid], "b")[rid]
    assert list(a.steps) == [0, 1, 2] and list(a.samples) == [32, 64, 96]
    assert a.values[0] == 1.5 and a.values[1] == math.inf and a.values[2] == 0.0
    assert math.isnan(b.values[0]) and b.values[1] == -math.inf
    assert store.metric_keys([rid]) == ["a", "b"]
    assert store.max_step(rid) == 2


def test_replayed_batch_does_not_duplicate(store):
    rid = _make_run(store)
    for _ in range(2):  # a resumed run replays the same steps
        with store.metric_writer(rid) as w:
            for step in range(50):
                w.log(step, step * 8, {"x": step, "y": -step})
    assert store.count_metrics(rid) == 100
    assert list(store.load_metric([rid], "x")[rid].values) == list(range(50))


def test_status_lifecycle_records_events(store):
    rid = _make_run(store)
    store.set_status(rid, RunStatus.submitted, job_id="17")
    store.set_status(rid, RunStatus.running, host="node1", attempts=1)
    run = store.set_status(rid, RunStatus.failed, error="boom")
    assert run.status == "failed" and run.error == "boom" and run.job_id == "17"
    assert run.finished_at is not None and run.started_at is not None
    transitions = [(e.from_status, e.to_status) for e in store.events(rid)]
    assert transitions == [
        ("planned", "submitted"), ("submitted", "running"), ("running", "failed")
    ]


def test_list_runs_by_sweep(store):
    _make_run(store, "a", "s1")
    _make_run(store, "b", "s2")
    assert [r.name for r in store.list_runs("s2")] == ["b"]
    assert len(store.list_runs()) == 2
