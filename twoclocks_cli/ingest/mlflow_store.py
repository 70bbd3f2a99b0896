"""MLflow tracking stores: a local `sqlite:///mlflow.db` or an `mlruns` folder, read with the
mlflow client (`pip install -e '.[sources]'`; mlflow-skinny is enough).

`twoclocks ingest --from mlflow:URI` (or the database file or `mlruns` folder as a PATH) imports
every run of every experiment, or those `--experiment NAME` names, `--filter EXPR`
(MLflow's own search syntax, `params.lr = '0.001'`) keeps and `--run GLOB` names. A run's params
are its cell (verl's MLflow logger writes `data/train_batch_size`, HF's `learning_rate`), its
metric history its steps (the last value logged at a step wins; the count is reported). Only
local stores are read: a server URI needs a network this command never uses. The store is only
read: an SQLite store is opened read-only, and the empty `.trash` folder MLflow's file store
makes in an `mlruns` folder lacking one is taken away again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import warnings
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import scalars
from twoclocks_cli.ingest.base import IngestOptions, ParsedLog, to_step

PREFIX = "mlflow:"
SQLITE_MAGIC = b"SQLite format 3\x00"
_TABLES = {"experiments", "runs", "metrics", "params"}
_PAGE = 1000


def is_sqlite_store(path: Path) -> bool:
    """Whether `path` is an SQLite file holding MLflow's tables (opened read-only)."""
    try:
        with path.open("rb") as fh:
            if fh.read(16) != SQLITE_MAGIC:
                return False
        con = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("select name from sqlite_master where "
                                               "type='table'")}
        finally:
            con.close()
    except (OSError, sqlite3.Error):
        return False
    return _TABLES <= names


def is_file_store(path: Path) -> bool:
    """Whether `path` is an `mlruns` folder: experiment folders, each with its meta.yaml."""
    return path.is_dir() and any(
        (d / "meta.yaml").is_file() for d in path.iterdir() if d.is_dir())


def tracking_uri(source: Path | str) -> tuple[str, Path]:
    """(the URI the client opens, the local path it reads) of `mlflow:URI` or a PATH."""
    text = source[len(PREFIX):] if isinstance(source, str) else str(source)
    if text.startswith("sqlite:///"):
        path = Path(text[len("sqlite:///"):])
    elif text.startswith("file://"):
        path = Path(text[len("file://"):])
    elif "://" in text:
        raise ConfigError(f"{source}: only local MLflow stores are read (sqlite:///FILE or an "
                          "mlruns folder); a server needs a network this command never uses")
    else:
        path = Path(text)
    if not path.exists():
        raise ConfigError(f"{source}: no such file or folder")
    if path.is_file():
        if not is_sqlite_store(path):
            raise ConfigError(f"{path}: not an MLflow tracking store (an SQLite file without "
                              "MLflow's experiments, runs, metrics and params tables)")
        # read-only: MLflow would otherwise migrate (write) a store that lacks its tables
        return f"sqlite:///file:{path.resolve()}?mode=ro&uri=true", path
    if not is_file_store(path):
        raise ConfigError(f"{path}: not an MLflow mlruns folder (no experiment folder with a "
                          "meta.yaml in it)")
    return path.resolve().as_uri(), path


def _client(uri: str):
    """The mlflow client of a local store."""
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # reading an existing mlruns
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _experiments(client, source, opts: IngestOptions) -> list:
    exps = client.search_experiments()
    if not opts.experiments:
        return exps
    chosen = [e for e in exps if e.name in opts.experiments or e.experiment_id in opts.experiments]
    missing = [x for x in opts.experiments
               if not any(x in (e.name, e.experiment_id) for e in chosen)]
    if missing:
        names = ", ".join(e.name for e in exps[:12])
        raise ConfigError(f"{source}: no experiment {', '.join(missing)} (experiments: {names})")
    return chosen


def _runs(client, exp_ids: list[str], opts: IngestOptions) -> list:
    out, token = [], None
    while True:
        page = client.search_runs(exp_ids, filter_string=opts.mlflow_filter or "",
                                  max_results=_PAGE, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        out.extend(page)
        token = page.token
        if not token:
            return out


def _tracked(client, run, exp_name: str) -> scalars.TrackedRun:
    """One MLflow run: its params, and each metric's history by step."""
    rid = run.info.run_id
    name = run.info.run_name or rid
    tracked = scalars.TrackedRun(key=rid, name=f"{exp_name}/{name}", sha256="", size=0,
                                 config=dict(run.data.params), config_from="MLflow params")
    content = {"run": rid, "params": sorted(run.data.params.items()), "metrics": {}}
    for key in sorted(run.data.metrics):
        history = sorted(client.get_metric_history(rid, key), key=lambda m: m.timestamp)
        content["metrics"][key] = [(m.step, m.timestamp, m.value) for m in history]
        for m in history:
            try:
                step = to_step(m.step)
            except ValueError as exc:
                raise ConfigError(f"run {name} ({rid}): metric {key!r}: {exc}") from None
            row = tracked.steps.setdefault(step, {})
            tracked.duplicates += key in row
            row[key] = float(m.value)
    blob = json.dumps(content, sort_keys=True, default=str).encode()
    tracked.sha256, tracked.size = hashlib.sha256(blob).hexdigest(), len(blob)
    if run.info.status != "FINISHED":
        tracked.unfinished = (f"MLflow status {run.info.status}: the run had not finished "
                              "when it was last logged")
        tracked.notes.append(tracked.unfinished + " (stored as incomplete)")
    return tracked


@contextlib.contextmanager
def _scratch_cwd():
    """Run MLflow in an empty temporary working directory: for the read-only `sqlite:///file:`
    URI it makes the 'parent folder' of `file:/abs/path` relative to the working directory
    (a `file:` tree the user never asked for); here that tree is made and removed unseen."""
    import os
    import tempfile

    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="twoclocks-mlflow-") as tmp:
        os.chdir(tmp)
        try:
            yield
        finally:
            os.chdir(here)


@contextlib.contextmanager
def _no_trash_left(trash: Path | None):
    """Remove `trash` (the empty folder MLflow's file store makes on opening) after the block."""
    try:
        yield
    finally:
        if trash is not None:
            with contextlib.suppress(OSError):  # not empty: not ours to remove
                trash.rmdir()


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message, cut to a readable length."""
    text = str(exc).strip().splitlines()
    return (text[0][:200] if text else type(exc).__name__)


def parse_runs(source: Path | str, opts: IngestOptions) -> list[ParsedLog]:
    """Every selected run of a local MLflow store."""
    uri, path = tracking_uri(source)
    import yaml
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    from twoclocks_cli.ingest.quiet import quiet_libraries

    trash = path.resolve() / ".trash" if path.is_dir() else None
    made_trash = trash is not None and not trash.exists()
    try:
        with warnings.catch_warnings(), quiet_libraries(), _scratch_cwd(), \
                _no_trash_left(trash if made_trash else None):
            warnings.simplefilter("ignore")
            client = _client(uri)
            exps = _experiments(client, source, opts)
            names = {e.experiment_id: e.name for e in exps}
            runs = _runs(client, list(names), opts) if names else []
            tracked = [_tracked(client, r, names[r.info.experiment_id]) for r in runs]
    except MlflowException as exc:
        first = str(exc.message if hasattr(exc, "message") else exc).strip().splitlines()
        raise ConfigError(f"{source}: {first[0] if first else 'MLflow refused the store'}") \
            from None
    except (SQLAlchemyError, sqlite3.Error) as exc:  # e.g. tables that are not MLflow's
        why = _first_line(exc)
        if "readonly" in why:  # MLflow wanted to create or migrate its tables in it
            why = "it lacks MLflow's current tables; it is only read, never migrated"
        raise ConfigError(f"{source}: not a readable MLflow store ({why})") from None
    except (ValueError, KeyError, AttributeError, TypeError, UnicodeDecodeError, OSError,
            yaml.YAMLError) as exc:  # the file store parsing a broken meta.yaml or metric
        raise ConfigError(f"{source}: MLflow cannot read the store ({type(exc).__name__}: "
                          f"{_first_line(exc)})") from None
    chosen = scalars.select_runs(source, tracked, opts)
    return [scalars.to_log(r, path, "mlflow", opts) for r in chosen]
