"""Source files the store cannot take, from a real verl log (its batch and group size swapped for
numbers the store cannot hold), an event file the OS will not open, and an SQLite file that only
looks like MLflow's: each is one line, exit 2, and neither the store nor the source changes (an
import never writes to what it reads). Those the trackers' own libraries write (W&B offline,
MLflow, torch's TensorBoard writer) are tests/integration/test_fuzz_tracker_sources.py's.

A run's batch and group size from a source's config pass the same bounds as `--batch-prompts`
and `--group-size`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import stored
from tests.unit.test_fuzz_inputs import FUZZ
from tests.unit.test_fuzz_newer_commands import Here

VERL = Path(__file__).parents[1] / "fixtures" / "ingest" / "verl_new.log"


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An empty twoclocks store (each case works on a copy)."""
    return stored.empty_store(tmp_path_factory.mktemp("empty"))


def _verl(root: Path, **swap: str) -> Path:
    """verl_new.log with its batch (command line and printed config) or rollout.n replaced."""
    text = VERL.read_text()
    if "batch" in swap:
        text = text.replace("data.train_batch_size=128", f"data.train_batch_size={swap['batch']}")
        text = text.replace("'train_batch_size': 128", f"'train_batch_size': {swap['batch']}")
    if "n" in swap:
        text = text.replace("actor_rollout_ref.rollout.n=8",
                            f"actor_rollout_ref.rollout.n={swap['n']}")
        text = text.replace("'rollout': {'n': 8", f"'rollout': {{'n': {swap['n']}")
    path = root / "verl.log"
    path.write_text(text)
    return path


@pytest.mark.parametrize("swap,needle", [
    ({"batch": "1e300"}, "batch_prompts = 1000000000000000052504760255204420248"),
    ({"batch": str(10**30)}, f"batch_prompts = {10**30}"),
    ({"batch": str(2**31)}, f"batch_prompts = {2**31}: must be a whole number from 1 to"),
    ({"n": "1e300"}, "group_size = 1000000000000000052504760255204420248"),
])
def test_a_verl_config_the_store_cannot_take(tmp_path_factory, empty_store, swap, needle):
    here = Here(tmp_path_factory.mktemp("verl"), empty_store)
    log = _verl(here.root, **swap)
    here.files = here._files()
    here.refuses(["ingest", str(log), "--db", "DB"], needle)


def test_an_event_file_that_cannot_be_opened(tmp_path_factory, empty_store):
    """An event file the OS will not open (here a link to nothing) is one line naming it."""
    here = Here(tmp_path_factory.mktemp("tblink"), empty_store)
    run = here.root / "tb" / "run"
    run.mkdir(parents=True)
    (run / "events.out.tfevents.1.host").symlink_to(here.root / "gone")
    here.files = here._files()
    here.refuses(["ingest", str(here.root / "tb"), "--batch-prompts", "2", "--group-size", "2",
                  "--db", "DB"], "events.out.tfevents.1.host")


def test_a_foreign_sqlite_file_is_read_never_written(tmp_path_factory, empty_store):
    """An SQLite file with tables named like MLflow's: MLflow would migrate it (add its
    alembic_version and tags tables); opened read-only it is refused and stays as it was, and
    no `file:` folder appears where the command ran."""
    here = Here(tmp_path_factory.mktemp("foreign"), empty_store)
    fake = here.root / "fake.db"
    con = sqlite3.connect(fake)
    for table in ("experiments", "runs", "metrics", "params"):
        con.execute(f"CREATE TABLE {table} (x INTEGER)")
    con.commit()
    con.close()
    here.files = here._files()
    before = fake.read_bytes()
    line = here.refuses(["ingest", "--from", f"mlflow:sqlite:///{fake}", "--db", "DB"],
                        "not a readable MLflow store")
    assert "only read, never migrated" in line
    assert fake.read_bytes() == before


# --- hypothesis: any number in a source's batch, group size or seed ---------------------------

NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(2**64), 2**64).map(str),
    st.sampled_from(["1e300", "-0", "0", "2147483647", "2147483648", "1.5", "nan", "inf"]),
)


@settings(FUZZ, max_examples=40)
@given(field=st.sampled_from(["batch", "n"]), value=NUMBER_TEXT)
def test_any_number_in_a_verl_config(tmp_path_factory, empty_store, field, value):
    """Imported (exit 0, the batch within the store's bounds) or refused in one line."""
    here = Here(tmp_path_factory.mktemp("verlfz"), empty_store)
    log = _verl(here.root, **{field: value})
    here.files = here._files()
    result = here.run(["ingest", str(log), "--db", "DB", "--json"])
    assert result.exit_code in (0, 2), (field, value, result.output[-2000:])
    if result.exit_code == 2:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (value, result.stderr)
        here.unchanged(value)
    else:
        import json

        (run,) = json.loads(result.stdout)
        assert 1 <= run["batch_samples"] <= 2**31 - 1, (value, run)
