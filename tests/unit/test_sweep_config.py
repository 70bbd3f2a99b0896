"""Sweep configs: each rejection through the real CLI, planning values, stable cell hashes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.config import parse_config, plan
from twoclocks_cli.core.errors import ConfigError

VALID = """\
name = "t"
backend = "sim"
sample_budget = 4096
executor = "debug"
[scaling]
reference_batch = 64
reference_lr = 0.01
[grid]
batch = [2, 4, 8]
group_size = 8
seeds = [0]
"""


def _write(tmp_path, text: str, name: str = "sweep.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _doc(**over) -> dict:
    base = {"name": "t", "backend": "sim", "sample_budget": 4096,
            "scaling": {"reference_batch": 64, "reference_lr": 0.01},
            "grid": {"batch": [2, 4, 8], "group_size": 8}}
    for key, value in over.items():
        table, _, field = key.partition("__")
        if field:
            base[table] = {**base[table], field: value}
        else:
            base[table] = value
    return base


REJECTIONS = [
    # (replace this line of VALID, with this, needles in the one error line)
    ("reference_lr = 0.01", "reference_lr = -0.5",
     ["scaling.reference_lr", "-0.5", "greater than 0"]),
    ("reference_lr = 0.01", "reference_lr = 0", ["scaling.reference_lr", "greater than 0"]),
    ("batch = [2, 4, 8]", "batch = [2, 0, 8]", ["grid.batch", "= 0", "> 0"]),
    ("batch = [2, 4, 8]", "batch = [2, -4]", ["grid.batch", "-4", "> 0"]),
    ("batch = [2, 4, 8]", "batch = [12, 64]\nbatch_unit = \"samples\"",
     ["grid.batch", "12", "divisible by group_size 8"]),
    ("batch = [2, 4, 8]", "batch = []", ["grid.batch", "empty grid"]),
    ("seeds = [0]", "seeds = []", ["grid.seeds", "empty grid"]),
    ("sample_budget = 4096", "sample_budget = 32",
     ["sample_budget", "32", "smaller than one batch"]),
    ("batch = [2, 4, 8]", "bach = [2]", ["unknown key 'grid.bach'", "did you mean 'grid.batch'"]),
    ("reference_batch = 64", "reference_bacth = 64",
     ["scaling.reference_bacth", "did you mean 'scaling.reference_batch'"]),
    ("backend = \"sim\"", "backend = \"jax\"", ["'backend'", "'grpo' or 'sim'"]),
    ("[grid]", "[grid\n", ["sweep.toml", "not valid TOML"]),
    # a backend table is validated before anything is written (else every cell fails later)
    ("seeds = [0]", "seeds = [0]\n[sim]\nlog_evry = 1",
     ["unknown key 'sim.log_evry'", "did you mean 'sim.log_every'"]),
    ("batch = [2, 4, 8]", "batch = {start = 2, stop = 32, factor = inf}",
     ["grid.batch.factor", "finite"]),
    ("seeds = [0]", "seeds = [100000000000000000000]", ["grid.seeds", "2147483647"]),
]


@pytest.mark.parametrize("old,new,needles", REJECTIONS, ids=[r[1][:24] for r in REJECTIONS])
def test_rejections_through_the_cli(tmp_path, old, new, needles):
    path = _write(tmp_path, VALID.replace(old, new))
    db = tmp_path / "store.db"
    proc = twoclocks_inproc("sweep", str(path), "--db", f"sqlite:///{db}")
    line = assert_one_line_error(proc, str(path), *needles)
    assert line.startswith("error: ")
    assert not db.exists() or _sweep_count(f"sqlite:///{db}") == 0


def _sweep_count(url: str) -> int:
    from twoclocks_cli.store import Store, Sweep

    store = Store.open(url)
    try:
        with store.session() as s:
            return s.query(Sweep).count()
    finally:
        store.close()


def test_plan_json_and_warnings_through_the_cli(tmp_path):
    path = _write(tmp_path, VALID.replace("sample_budget = 4096", "sample_budget = 1024")
                  .replace("seeds = [0]", "seeds = [0]\nclip_low = [0.1, 0.2]"))
    proc = twoclocks_inproc("plan", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [c["prompts"] for c in out["cells"]] == [2, 2, 4, 4, 8, 8]
    assert [c["steps"] for c in out["cells"]] == [64, 64, 32, 32, 16, 16]
    assert any("fewer than 20 steps" in w and "[64]" in w for w in out["warnings"])
    assert any("clipping cannot bind" in w for w in out["warnings"])


@pytest.mark.parametrize("rule,alpha",
                         [("sqrt", 0.5), ("linear", 1.0), ("none", 0.0), (0.75, 0.75)])
def test_scaling_rules(rule, alpha):
    p = plan(parse_config(_doc(scaling__rule=rule)))
    for c in p.cells:
        assert c.batch_samples == c.prompts * 8
        assert math.isclose(c.lr, 0.01 * (c.batch_samples / 64) ** alpha, rel_tol=1e-12)
    assert [c.lr for c in p.cells] == sorted(c.lr for c in p.cells) or alpha == 0


def test_budget_to_steps_and_geometric_range_in_samples():
    p = plan(parse_config(_doc(sample_budget=10_000, grid={
        "batch": {"start": 16, "stop": 200, "factor": 2}, "batch_unit": "samples",
        "group_size": 4})))
    assert [c.batch_samples for c in p.cells] == [16, 32, 64, 128]
    assert [c.prompts for c in p.cells] == [4, 8, 16, 32]
    assert [c.steps for c in p.cells] == [625, 312, 156, 78]
    assert [c.samples for c in p.cells] == [10_000, 9_984, 9_984, 9_984]


def test_zip_pairs_axes_and_cross_multiplies_the_rest():
    p = plan(parse_config(_doc(grid={"batch": [2, 4], "group_size": 8, "seeds": [0, 1, 2],
                                     "sim": {"sigma": [1.0, 2.0]},
                                     "zip": ["batch", "sim.sigma"]})))
    assert len(p.cells) == 6
    assert {(c.prompts, c.config["sim"]["sigma"]) for c in p.cells} == {(2, 1.0), (4, 2.0)}


def test_adam_adjustment_follows_the_sde_rule():
    p = plan(parse_config(_doc(scaling={"reference_batch": 64, "reference_lr": 0.01,
                                        "adam_adjust": True})))
    by_b = {c.batch_samples: c.config["sim"] for c in p.cells}
    assert math.isclose(by_b[32]["beta1"], 1 - 0.5 * 0.1)
    assert math.isclose(by_b[64]["beta2"], 0.999)
    assert math.isclose(by_b[16]["adam_eps"], 1e-8 / math.sqrt(0.25))
    with pytest.raises(ConfigError, match="beta1 becomes"):
        plan(parse_config(_doc(scaling={"reference_batch": 4, "reference_lr": 0.01,
                                        "adam_adjust": True})))


def test_grpo_clip_warning_depends_on_updates_per_batch():
    doc = _doc(backend="grpo", grid={"batch": [64], "group_size": 8, "clip_low": [0.1, 0.2]})
    assert any("cannot bind" in w for w in plan(parse_config(doc)).warnings)
    doc["trainer"] = {"num_minibatches": 2}
    assert not any("cannot bind" in w for w in plan(parse_config(doc)).warnings)


def test_overrides_cannot_set_what_the_sweep_owns():
    with pytest.raises(ConfigError, match="trainer.lr"):
        plan(parse_config(_doc(backend="grpo", trainer={"lr": 1e-3})))
    with pytest.raises(ConfigError, match="does not read"):
        plan(parse_config(_doc(trainer={"ppo_epochs": 2})))


HASH_SNIPPET = """
import json, sys
from twoclocks_cli.config import parse_config, plan
print(json.dumps([c.cell_id for c in plan(parse_config(json.loads(sys.argv[1]))).cells]))
"""


@pytest.mark.subprocess
def test_cell_hashes_are_stable_across_processes_and_sensitive_to_config():
    doc = _doc(grid={"batch": [2, 4], "group_size": 8, "seeds": [0, 1]})
    here = [c.cell_id for c in plan(parse_config(doc)).cells]
    there = json.loads(subprocess.run([sys.executable, "-c", HASH_SNIPPET, json.dumps(doc)],
                                      capture_output=True, text=True, check=True,
                                      env={"PYTHONHASHSEED": "123"}).stdout)
    assert here == there and len(set(here)) == 4 and all(len(h) == 64 for h in here)
    changed = [c.cell_id for c in plan(parse_config(_doc(
        sample_budget=4097, grid={"batch": [2, 4], "group_size": 8, "seeds": [0, 1]}))).cells]
    assert not set(changed) & set(here)


# every value a cell would fail on, or the store could not hold, is a plan error
PLAN_REJECTIONS = [
    ({"grid__batch": {"start": 2, "stop": 32, "factor": math.inf}},
     ["grid.batch.factor", "finite"]),
    ({"grid__batch": {"start": 2, "stop": 32, "factor": 1.000000001}},
     ["grid.batch.factor", "2.77e+09 steps", "at most 10,000"]),
    ({"grid__seeds": [10**20]}, ["grid.seeds", "2147483647"]),
    ({"grid__seeds": [-1]}, ["grid.seeds", "= -1"]),
    ({"grid__batch": [2**31]}, ["grid.batch", "at most 2147483647"]),
    ({"sample_budget": 2**63}, ["sample_budget", "less than or equal to 9223372036854775807"]),
    ({"sample_budget": 2**62}, ["sample_budget", "steps at batch 16", "step column"]),
    ({"workdir": "w" * 5000}, ["workdir", "component is 5000 bytes", "at most 255"]),
    ({"workdir": "a\x00b"}, ["workdir", "NUL"]),
    ({"sim": {"log_evry": 1}}, ["unknown key 'sim.log_evry'", "did you mean 'sim.log_every'"]),
    ({"grid__sim": {"log_evry": [1, 2]}},
     ["unknown key 'grid.sim.log_evry'", "did you mean 'grid.sim.log_every'"]),
    ({"sim": {"log_every": 1e308}}, ["sim.log_every", "integer"]),
    ({"sim": {"log_every": 10**6}}, ["sim.log_every", "runs 256 steps", "no metric row"]),
    ({"sim": {"sigma": "1"}}, ["sim.sigma", "'1'", "number"]),
    ({"sim": {"dim": True}}, ["sim.dim", "True"]),
    ({"sim": {"beta1": 1.5}}, ["sim.beta1", "[0, 1)"]),
    ({"sim": {"drift_threshold": math.inf}}, ["sim.drift_threshold", "finite"]),
    ({"grid__sim": {"sigma": [1.0, -2.0]}}, ["grid.sim.sigma", "-2.0", "> 0"]),
    ({"scaling__reference_lr": math.inf}, ["scaling.reference_lr", "finite"]),
    ({"scaling__rule": 1e308}, ["scaling.rule", "less than or equal to 4"]),
    ({"store": "postgresql://u:s3cret@127.0.0.1:abc/db"}, ["'store'", "port", "u:***@"]),
    ({"store": ""}, ["'store'", "must not be empty"]),
    ({"grid__seeds": list(range(400)), "grid__clip_low": [0.1 * i for i in range(9)]},
     ["10,800 cells", "at most 10,000"]),
    # the sweep name's rule is `ingest --sweep`'s: at most the 200 characters the column holds
    ({"name": "n" * 201}, ["'name'", "at most 200"]),
    ({"name": "-n"}, ["'name'", "letters, digits"]),
    # ... and a planned run's name (the sweep's and its cell's) must fit the same column
    ({"name": "n" * 190},
     ["'name'", "a run's name", "-p2-g8-s0-", "206 characters", "at most 200"]),
]


def test_a_sweep_name_ingest_takes_plans_too():
    """One name rule: 184 characters leave a run's name (+16 here) the column's 200."""
    cells = plan(parse_config(_doc(name="n" * 184), "s.toml"), "s.toml").cells
    assert {len(c.name) for c in cells} == {200}


def test_the_backend_field_takes_the_registrys_names():
    from twoclocks_cli.backends import BACKENDS

    for name in BACKENDS:
        assert parse_config(_doc(backend=name), "s.toml").backend == name
    with pytest.raises(ConfigError, match="'trl', 'command', 'grpo' or 'sim'"):
        parse_config(_doc(backend="jax"), "s.toml")


@pytest.mark.parametrize("over,needles", PLAN_REJECTIONS,
                         ids=[str(list(o)[0]) + str(i) for i, (o, _) in enumerate(PLAN_REJECTIONS)])
def test_plan_rejects_what_a_cell_or_the_store_could_not_take(over, needles):
    with pytest.raises(ConfigError) as info:
        plan(parse_config(_doc(**over), "s.toml"), "s.toml")
    line = str(info.value)
    assert "\n" not in line and line.startswith("s.toml")
    assert "s3cret" not in line
    for needle in needles:
        assert needle in line, (needle, line)


GRPO_REJECTIONS = [
    ({"trainer": {"modle": "x"}}, ["unknown key 'trainer.modle'", "did you mean 'trainer.model'"]),
    ({"trainer": {"model": ""}}, ["key 'trainer.model' = ''", "must not be empty"]),
    ({"trainer": {"temperature": math.inf}}, ["trainer.temperature", "finite"]),
    ({"trainer": {"kl_coef": True}}, ["trainer.kl_coef", "True", "not a string or a bool"]),
    ({"trainer": {"reward": "bogus"}}, ["trainer.reward", "'module:function'"]),
    ({"trainer": {"dataset": "d" * 300 + ".jsonl"}}, ["trainer.dataset", "at most 255"]),
    ({"grid__trainer": {"max_new_tokens": [4, "8"]}},
     ["grid.trainer.max_new_tokens", "'8'", "integer"]),
]


@pytest.mark.parametrize("over,needles", GRPO_REJECTIONS,
                         ids=[str(i) for i in range(len(GRPO_REJECTIONS))])
def test_plan_validates_grpo_cells_with_the_trainers_config(over, needles):
    with pytest.raises(ConfigError) as info:
        plan(parse_config(_doc(backend="grpo", **over), "g.toml"), "g.toml")
    line = str(info.value)
    for needle in needles:
        assert needle in line, (needle, line)


def test_geometric_ranges_terminate_and_match_the_progression():
    # a huge factor: one batch (no OverflowError); an exact progression includes `stop`
    p = plan(parse_config(_doc(grid={"batch": {"start": 2, "stop": 32, "factor": 1e308},
                                     "group_size": 8})))
    assert [c.prompts for c in p.cells] == [2]
    p = plan(parse_config(_doc(sample_budget=10**6, grid={
        "batch": {"start": 3, "stop": 300, "factor": 1.5}, "group_size": 2})))
    expect = sorted({round(3 * 1.5**k) for k in range(40) if round(3 * 1.5**k) <= 300})
    assert [c.prompts for c in p.cells] == expect
    assert expect[-1] == 259  # 3 * 1.5**11 = 259.49: the last value rounds down below stop
