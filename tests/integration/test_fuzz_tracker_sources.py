"""Source files the store cannot take, written by the trackers' own libraries (W&B offline,
MLflow, torch's TensorBoard writer): each is one line, exit 2, and neither the store nor the
source changes (an import never writes to what it reads). W&B and MLflow write in a process of
their own (W&B's service); a verl log's refusals are tests/unit/test_fuzz_newer_sources.py's.

A run's batch, group size and seed from a source's config pass the same bounds as
`--batch-prompts`, `--group-size` and `--seed`; its steps and samples the store's columns.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
from pathlib import Path

import pytest

from tests.support import stored
from tests.support import trackers as tk
from tests.unit.test_fuzz_newer_commands import Here

# the trackers' libraries write the sources in a process each, once, on one worker
pytestmark = [pytest.mark.one_worker, pytest.mark.subprocess]
ROWS = [(s, {tk.REWARD: s / 8}) for s in range(4)]
FAR = 2**40  # a step a 32-bit column cannot hold


def _config(batch=4, n=8, seed=None) -> dict:
    cfg = {"data": {"train_batch_size": batch},
           "actor_rollout_ref": {"rollout": {"n": n}, "actor": {"optim": {"lr": 1e-3}}}}
    return {**cfg, "seed": seed} if seed is not None else cfg


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Every source at once (the trackers write in a subprocess each: a few seconds)."""
    root = tmp_path_factory.mktemp("sources")
    # a step the store cannot hold is refused while the source is read, before --run selects:
    # those runs have a source of their own
    wandb = tk.write_wandb(root / "wb", [
        {"name": "batch", "config": _config(batch=1e300), "rows": ROWS},
        {"name": "seed", "config": _config(seed=1e30), "rows": ROWS},
        {"name": "wide", "config": _config(batch=2**31), "rows": ROWS}])
    wandb_far = tk.write_wandb(root / "wbfar", [
        {"name": "far", "config": _config(), "rows": [*ROWS, (FAR, {tk.REWARD: 0.5})]}])
    tk.write_mlflow(f"sqlite:///{root / 'ml.db'}", [
        {"experiment": "e", "name": "n", "params": {"data/train_batch_size": 4,
                                                   "actor_rollout_ref/rollout/n": 1e300},
         "rows": ROWS}])
    tk.write_mlflow(f"sqlite:///{root / 'mlfar.db'}", [
        {"experiment": "e", "name": "far", "params": {"data/train_batch_size": 4,
                                                     "actor_rollout_ref/rollout/n": 8},
         "rows": [*ROWS, (FAR, {tk.REWARD: 0.5})]}])
    from torch.utils.tensorboard import SummaryWriter

    for name, step in (("tb62", 2**62), ("tb40", FAR)):
        w = SummaryWriter(str(root / name / "run"))
        for s, row in ROWS:
            w.add_scalar(tk.REWARD, row[tk.REWARD], s)
        w.add_scalar(tk.REWARD, 0.5, step)
        w.close()
    return {"wandb": wandb, "wandb_far": wandb_far, "mlflow": root / "ml.db",
            "mlflow_far": root / "mlfar.db", "tb62": root / "tb62",
            "tb40": root / "tb40", "root": root}


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An empty twoclocks store (each case works on a copy)."""
    return stored.empty_store(tmp_path_factory.mktemp("empty"))


def _digest(path: Path) -> str:
    """One hash over a file or every file under a folder (names and bytes)."""
    h = hashlib.sha256()
    for p in sorted([path] if path.is_file() else path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path.parent)).encode() + p.read_bytes())
    return h.hexdigest()


SOURCE_CASES = [
    ("wandb", ["--run", "batch"], "batch_prompts = 1000000000000000052504760255204420248"),
    ("wandb", ["--run", "seed"], "seed = 1000000000000000019884624838656"),
    ("wandb_far", ["--batch-prompts", "4", "--group-size", "8"], "1099511627776"),
    ("wandb", ["--run", "wide"], "batch_prompts = 2147483648: must be a whole number from 1"),
    ("mlflow", ["--run", "e/n"], "group_size = 1000000000000000052504760255204420248"),
    ("mlflow_far", [], "1099511627776 is above 2147483647"),
    ("tb62", ["--batch-prompts", "4", "--group-size", "8"], "step 4611686018427387904: must"),
    ("tb40", ["--batch-prompts", "4", "--group-size", "8"], "step 1099511627776: must"),
]


@pytest.mark.parametrize("source,extra,needle", SOURCE_CASES,
                         ids=[f"{c[0]}-{' '.join(c[1])}" for c in SOURCE_CASES])
def test_a_source_value_the_store_cannot_take(tmp_path_factory, sources, empty_store, source,
                                              extra, needle):
    here = Here(tmp_path_factory.mktemp("src"), empty_store)
    before = _digest(sources[source])
    here.refuses(["ingest", str(sources[source]), *extra, "--db", "DB"], needle)
    assert _digest(sources[source]) == before


def test_a_tensorboard_record_claiming_a_terabyte(tmp_path_factory, sources, empty_store):
    """A record header (with a valid checksum) saying 2^40 bytes follow: refused, not read."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    here = Here(tmp_path_factory.mktemp("tbmem"), empty_store)
    (good,) = (sources["tb40"] / "run").iterdir()
    run = here.root / "tbmem" / "run"
    run.mkdir(parents=True)
    head = struct.pack("<Q", 2**40)
    (run / good.name).write_bytes(good.read_bytes() + head + struct.pack("<I", masked_crc32c(head))
                                  + b"x" * 64)
    here.files = here._files()
    here.refuses(["ingest", str(here.root / "tbmem"), "--batch-prompts", "2", "--group-size",
                  "2", "--db", "DB"], "claims more bytes than memory holds")


@pytest.fixture(scope="module")
def mlruns(tmp_path_factory) -> Path:
    """A real MLflow file store (mlruns) with one run, to break in copies."""
    path = tmp_path_factory.mktemp("mlruns") / "mlruns"
    tk.write_mlflow(path.as_uri(), [{"experiment": "e", "name": "r", "params": {
        "prompts_per_batch": 4, "group_size": 8, "lr": 0.001}, "rows": ROWS}],
        env={"MLFLOW_ALLOW_FILE_STORE": "true"})
    return path


def _break(store: Path, how: str) -> None:
    """Damage one file of an mlruns copy the way a crash or a stray editor would."""
    exp = next(d for d in store.iterdir() if d.is_dir() and (d / "meta.yaml").is_file()
               and d.name not in ("0", ".trash"))
    run = next(d for d in exp.iterdir() if d.is_dir())
    metric = next(p for p in (run / "metrics").rglob("*") if p.is_file())
    if how == "garbage metric rows":
        metric.write_text("this is not a metric row\n1 2\n")
    elif how == "NaN text":
        metric.write_text("1700000000000 NaNx 0\n")
    elif how == "empty run meta.yaml":
        (run / "meta.yaml").write_text("")
    elif how == "broken experiment meta.yaml":
        (exp / "meta.yaml").write_text("name: [unclosed\n")
    elif how == "binary meta.yaml":
        (run / "meta.yaml").write_bytes(b"\xff\xfe\x00\x81" * 64)


@pytest.mark.parametrize("how", ["garbage metric rows", "NaN text", "empty run meta.yaml",
                                 "broken experiment meta.yaml", "binary meta.yaml"])
def test_a_broken_mlruns_folder_is_one_line(tmp_path_factory, mlruns, empty_store, how):
    here = Here(tmp_path_factory.mktemp("mlbroken"), empty_store)
    store = here.root / "mlruns"
    shutil.copytree(mlruns, store)
    _break(store, how)
    here.files = here._files()
    before = _digest(store)
    result = here.run(["ingest", str(store), "--db", "DB"])
    assert result.exit_code in (0, 2), (how, result.output[-2000:])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    if result.exit_code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), (how, result.stderr)
        here.unchanged(how)
    else:  # MLflow skipped what it could not read; what it did read is a run
        assert lines == [], (how, result.stderr)
    assert _digest(store) == before, how


def test_an_mlruns_folder_is_imported_and_left_as_it_was(tmp_path_factory, mlruns, empty_store):
    """MLflow's file store makes a `.trash` folder on opening one that lacks it; the import
    takes it away again, so the source is byte-for-byte and folder-for-folder the same."""
    here = Here(tmp_path_factory.mktemp("mlclean"), empty_store)
    store = here.root / "mlruns"
    shutil.copytree(mlruns, store)
    shutil.rmtree(store / ".trash", ignore_errors=True)
    before = _digest(store), sorted(p.name for p in store.rglob("*"))
    result = here.run(["ingest", str(store), "--db", "DB", "--json"])
    assert result.exit_code == 0, result.output[-2000:]
    assert (_digest(store), sorted(p.name for p in store.rglob("*"))) == before
