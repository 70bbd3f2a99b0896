"""MLflow tracking stores: a local `sqlite:///mlflow.db` or an `mlruns` folder, read with the
mlflow client (`pip install -e '.[sources]'`; mlflow-skinny is enough).

`twoclocks ingest --from mlflow:URI` (or the database file or `mlruns` folder as a PATH) imports
every run of every experiment, or those `--experiment NAME` names, `--filter EXPR`
(MLflow's own search syntax, `params.lr = '0.001'`) keeps and `--run GLOB` names. A run's params
are its cell (verl's MLflow logger writes `data/train_batch_size`, HF's `learning_rate`), its
metric history its steps (the last value logged at a step wins; the count is reported); nested
runs take their parents' params (mlflow_nested.py). Only local stores are read: a server URI needs
a network this command never uses. The store is only read: an SQLite store is opened read-only
(one MLflow would migrate, or one missing a table, is refused in one line saying which), and the
empty `.trash` folder MLflow's file store makes in an `mlruns` folder lacking one is taken away
again. MLflow's own logging is silenced while it reads: each error it logs, it also raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import base, scalars
from twoclocks_cli.ingest import mlflow_nested as nested
from twoclocks_cli.ingest.base import IngestOptions, ParsedLog, to_step

PREFIX = "mlflow:"
SQLITE_MAGIC = b"SQLite format 3\x00"
# an MLflow store holds both of these and some of the others: one lacking a table is still told
# as MLflow's (its import then names the table), and a store of runs and metrics alone is not
_TABLES = {"experiments", "runs"}
_RUN_TABLES = {"metrics", "params", "tags", "latest_metrics", "experiment_tags"}
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
    return _TABLES <= names and len(_RUN_TABLES & names) >= 2


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
                              "MLflow's experiments and runs tables and two of its metrics, "
                              "params, tags, latest_metrics, experiment_tags)")
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


def _tracked(client, run, exp_name: str,
             inherited: dict[str, tuple[str, str]]) -> scalars.TrackedRun:
    """One MLflow run: its params (with those it takes from its parents), and each metric's
    history by step."""
    rid = run.info.run_id
    name = run.info.run_name or rid
    config = {**{k: v for k, (v, _) in inherited.items()}, **run.data.params}
    tracked = scalars.TrackedRun(key=rid, name=f"{exp_name}/{name}", sha256="", size=0,
                                 config=config, config_from="MLflow params")
    content = {"run": rid, "params": sorted(run.data.params.items()), "metrics": {}}
    if inherited:  # only then: a run without parents keeps the identity it always had
        content["inherited"] = sorted((k, v, p) for k, (v, p) in inherited.items())
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


def _schema(path: Path) -> tuple[set[str], str | None]:
    """The store's tables and its alembic revision (None without one), read with sqlite3."""
    try:
        con = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("select name from sqlite_master where "
                                                "type='table'")}
            rev = (con.execute("select version_num from alembic_version").fetchone()
                   if "alembic_version" in tables else None)
        finally:
            con.close()
    except sqlite3.Error:
        return set(), None
    return tables, (rev[0] if rev else None)


def _mlflow_schema() -> tuple[str, set[str], set[str]] | None:
    """What the installed mlflow reads: (its schema revision, every revision it can migrate
    from, its tables); None when mlflow does not say."""
    try:
        from alembic.script import ScriptDirectory
        from mlflow.store.db import utils

        script = ScriptDirectory.from_config(utils._get_alembic_config(db_url=""))
        return (script.get_current_head(), {r.revision for r in script.walk_revisions()},
                set(utils.Base.metadata.tables))
    except Exception:  # noqa: BLE001 - only a more precise message hangs on it
        return None


def _unreadable(source, path: Path, exc: BaseException) -> str:
    """Why MLflow could not read an SQLite store, in words: a schema revision other than the
    installed mlflow's (it would migrate the store, which is only read), or tables missing."""
    import re

    import mlflow

    tables, rev = _schema(path) if path.is_file() else (set(), None)
    known = _mlflow_schema() if tables else None
    version = f"mlflow {mlflow.__version__}"
    if known and rev != known[0]:
        if rev in known[1]:
            return (f"{source}: an MLflow store of an older schema (revision {rev}; {version} "
                    f"reads {known[0]}): it is only read, never migrated; migrate a copy "
                    "(mlflow db upgrade sqlite:///COPY) and import the copy")
        if rev is None:
            return (f"{source}: not a readable MLflow store: it has no schema revision (no "
                    "alembic_version: not a store MLflow wrote, or a damaged copy); it is only "
                    "read, never migrated")
        return (f"{source}: not a readable MLflow store: its schema revision {rev} is not one "
                f"{version} knows (written by a newer mlflow? upgrade mlflow)")
    m = re.search(r"no such table: (\w+)", str(getattr(exc, "message", exc)))
    missing = [m.group(1)] if m else sorted(known[2] - tables) if known else []
    if missing:
        return (f"{source}: not a readable MLflow store: it lacks MLflow's table "
                f"{', '.join(missing[:6])} (a damaged or partial copy?); it is only read, never "
                "migrated or repaired")
    why = _first_line(exc)
    if "readonly" in why:  # MLflow wanted to create tables in it
        why = "it lacks MLflow's current tables; it is only read, never migrated"
    return f"{source}: not a readable MLflow store ({why})"


@contextlib.contextmanager
def _reading(source, path: Path):
    """MLflow reading the store: silenced (its errors become one line each, here), in a scratch
    working directory, leaving no `.trash` folder it made."""
    import yaml
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    from twoclocks_cli.ingest.quiet import silenced

    trash = path.resolve() / ".trash" if path.is_dir() else None
    made_trash = trash is not None and not trash.exists()
    try:
        with silenced(), _scratch_cwd(), _no_trash_left(trash if made_trash else None):
            yield
    except ConfigError:
        raise
    except (MlflowException, SQLAlchemyError, sqlite3.Error) as exc:
        raise ConfigError(_unreadable(source, path, exc)) from None
    except (ValueError, KeyError, AttributeError, TypeError, UnicodeDecodeError, OSError,
            yaml.YAMLError) as exc:  # the file store parsing a broken meta.yaml or metric
        raise ConfigError(f"{source}: MLflow cannot read the store ({type(exc).__name__}: "
                          f"{_first_line(exc)})") from None


def _fetcher(client, names: dict[str, str]):
    """A run by id for the nested runs' lineage, with its experiment's name known for notes;
    None when the store has no such run."""
    from mlflow.exceptions import MlflowException

    def fetch(rid: str):
        try:
            run = client.get_run(rid)
            exp = run.info.experiment_id
            if exp not in names:
                names[exp] = client.get_experiment(exp).name
        except MlflowException:
            return None
        return run
    return fetch


def parse_runs(source: Path | str, opts: IngestOptions,
               skipped: list[tuple[str, str]] | None = None) -> list[ParsedLog]:
    """Every selected run of a local MLflow store; a parent run with no step of its own is
    left out when runs under it have steps. With `skipped` (--skip-bad), another run with no
    step is listed there, (run, why), instead of refusing the store."""
    uri, path = tracking_uri(source)
    try:
        import mlflow  # noqa: F401 - it sets its loggers' levels on import: before the silence
    except ImportError:
        raise ConfigError(f"{source}: reading an MLflow store needs the mlflow package (pip "
                          "install -e '.[sources]'; mlflow-skinny is enough)") from None

    with _reading(source, path):
        client = _client(uri)
        exps = _experiments(client, source, opts)
        names = {e.experiment_id: e.name for e in exps}
        runs = _runs(client, list(names), opts) if names else []
        family = nested.Family({r.info.run_id: r for r in runs},
                               label=lambda r: f"{names[r.info.experiment_id]}/"
                                               f"{r.info.run_name or r.info.run_id}",
                               fetch=_fetcher(client, names))
        inherits = {r.info.run_id: family.inherited(r) for r in runs}
        tracked = [_tracked(client, r, names[r.info.experiment_id], inherits[r.info.run_id])
                   for r in runs]
    chosen = scalars.select_runs(source, tracked, opts)
    return _logs(source, path, chosen, tracked, family, inherits, opts, skipped)


def _logs(source, path: Path, chosen: list[scalars.TrackedRun], tracked, family,
          inherits: dict, opts: IngestOptions, skipped: list | None) -> list[ParsedLog]:
    """The chosen runs as logs, credited with their parents' params; parents without a step
    of their own left out (noted on the runs under them)."""
    stepped = {t.key for t in tracked if t.steps}
    given = {c for c in ("batch_prompts", "group_size", "lr", "seed")
             if getattr(opts, c) is not None}
    logs, left_out = {}, {}
    for run in chosen:
        under = [rid for rid in family.descendants(run.key) if rid in stepped]
        try:
            log = scalars.to_log(run, path, "mlflow", opts)
        except base.NoStepsError as exc:
            if under:
                left_out[run.key] = (run.name, under, "it logged no step of its own; the runs "
                                     "under it did")
            elif skipped is not None:
                skipped.append((run.name, str(exc)))
            else:
                raise
            continue
        except ConfigError as exc:
            if not under:
                raise
            left_out[run.key] = (run.name, under, f"its own metrics are no run to import "
                                 f"({_first_line(exc)})")
            continue
        nested.credit_parents(log, run.config, inherits[run.key], given)
        logs[run.key] = log
    for name, under, why in left_out.values():
        for rid in under:
            if rid in logs:
                logs[rid].notes.append(nested.parent_note(name, why))
    if left_out and not logs:
        name, under, why = next(iter(left_out.values()))
        shown = ", ".join(t.name for t in tracked if t.key in under[:8])
        raise ConfigError(f"{source}: run {name} is a parent run: {why} ({shown}); --run "
                          "names them")
    return list(logs.values())
