"""Malformed sweep configs (hypothesis): never a traceback, never a partially registered sweep."""

from __future__ import annotations

import copy
import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from twoclocks_cli.app import app

BASE = {
    "name": "fz", "backend": "sim", "sample_budget": 512, "executor": "debug",
    "scaling": {"reference_batch": 64, "reference_lr": 0.01, "rule": "sqrt"},
    "grid": {"batch": [2, 4], "group_size": 8, "seeds": [0], "clip_low": 0.2},
    "sim": {"dim": 4, "flat_dims": 4, "checkpoint_every": 50},
}

SCALARS = st.one_of(
    st.integers(-5, 5000), st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=6), st.booleans(), st.lists(st.integers(-3, 64), max_size=3),
    st.just([]), st.fixed_dictionaries({"start": st.integers(-2, 8), "stop": st.integers(-2, 64)}),
    # values the store or a cell cannot take (each would pass, hang or crash unchecked)
    st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, 2**31, 10**20, "w" * 300]),
    st.fixed_dictionaries({"start": st.integers(1, 8), "stop": st.integers(8, 10**6),
                           "factor": st.sampled_from([1.000000001, 1e308, float("inf"), 1.5])}),
)
PATHS = [("name",), ("backend",), ("sample_budget",), ("executor",), ("scaling", "reference_batch"),
         ("scaling", "reference_lr"), ("scaling", "rule"), ("grid", "batch"),
         ("grid", "group_size"), ("grid", "seeds"), ("grid", "clip_low"), ("grid", "zip"),
         ("sim", "optimizer"), ("slurm", "array_parallelism"), ("grid", "bogus"), ("bogus",),
         ("sim", "log_every"), ("sim", "sigma"), ("sim", "log_evry"), ("workdir",), ("store",)]


def toml_value(v) -> str:
    """A minimal TOML writer for the values generated here (json strings are TOML strings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v) if "e" in repr(v) or "." in repr(v) else f"{v}.0"
    return json.dumps(v) if isinstance(v, str) else str(v)


def to_toml(doc: dict) -> str:
    top = [f"{k} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())
              for k, v in doc.items() if isinstance(v, dict)]
    return "\n".join(top + tables) + "\n"


@st.composite
def mutated(draw):
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        table = doc
        for key in path[:-1]:
            table = table.setdefault(key, {})
        if draw(st.booleans()) and path[-1] in table:
            del table[path[-1]]
        else:
            table[path[-1]] = draw(SCALARS)
    text = to_toml(doc)
    if draw(st.integers(0, 9)) == 0:  # sometimes also break the syntax
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.sampled_from(["=", "[", "\"", "]]", "\n= 3"])) + text[cut:]
    return text


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=mutated())
def test_malformed_configs_fail_cleanly_and_write_nothing(tmp_path_factory, text):
    from twoclocks_cli.store import Run, Store, Sweep

    root = tmp_path_factory.mktemp("fz")
    (root / "sweep.toml").write_text(text)
    url = f"sqlite:///{root / 'store.db'}"
    here = os.getcwd()
    os.chdir(root)  # a valid config's default workdir lands here, not in the repository
    try:
        result = CliRunner().invoke(app, ["sweep", str(root / "sweep.toml"), "--db", url,
                                          "--executor", "debug"])
    finally:
        os.chdir(here)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        (text, repr(result.exception))
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert result.exit_code == 2, (text, result.output)
        errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1, result.output
        if (root / "store.db").exists():
            store = Store.open(url)
            with store.session() as s:
                assert s.query(Sweep).count() == 0 and s.query(Run).count() == 0, text
            store.close()
