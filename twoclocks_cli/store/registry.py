"""The queries that create sweeps and runs: sweep cells, standalone `train` runs, imported logs
and TRL-callback runs. Each is one transaction, so a refused registration writes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import delete, select

from twoclocks_cli.core.errors import ConfigError, NotFoundError
from twoclocks_cli.store.models import Metric, Run, RunStatus, Sweep, apply_status


@dataclass(frozen=True)
class NewCell:
    """One planned cell as the store registers it: its identity, columns and config."""

    cell_id: str
    name: str
    columns: dict  # batch_prompts, group_size, batch_samples, lr, clip_low, clip_high, seed
    config: dict


@dataclass(frozen=True)
class Registration:
    """What `register_cells` did: the sweep's folder, new and existing cells, their run ids."""

    folder: str
    new: int
    existing: int
    runs: dict[str, int]  # cell id -> run id


class RegistryQueries:
    """Store methods that create rows (mixed into `Store`; they use its `session`)."""

    def sweep_names(self) -> list[str]:
        """Every sweep's name, sorted."""
        with self.session() as s:
            return list(s.scalars(select(Sweep.name).order_by(Sweep.name)).all())

    def sweep_named(self, sweep: str | None) -> str:
        """The named sweep, or the only one; a clear error when there are none or several."""
        if sweep is not None:
            return self.get_sweep(sweep).name
        names = self.sweep_names()
        if len(names) == 1:
            return names[0]
        if not names:
            raise NotFoundError("no sweeps in the store yet: run `twoclocks sweep` first")
        raise NotFoundError(f"several sweeps; name one of: {', '.join(names)}")

    def all_sweeps(self) -> list[Sweep]:
        """Every sweep, oldest first."""
        with self.session() as s:
            return list(s.scalars(select(Sweep).order_by(Sweep.id)))

    def register_cells(self, name: str, backend: str, config: dict, folder: str,
                       cells: Iterable[NewCell], source: str) -> Registration:
        """Create sweep `name` (or update its config) and its cells not yet registered, in ONE
        transaction. A sweep of another backend is refused (one line naming `source`)."""
        cells = list(cells)
        with self.session() as s:
            sweep = s.scalar(select(Sweep).where(Sweep.name == name))
            if sweep is not None and sweep.backend != backend:
                raise ConfigError(f"{source}: key 'backend' = {backend!r}: sweep {name!r} "
                                  f"already exists with backend {sweep.backend!r}; use a new "
                                  "name")
            if sweep is None:
                sweep = Sweep(name=name, backend=backend, folder=folder, config=config)
                s.add(sweep)
                s.flush()
            else:
                sweep.config = config
                sweep.folder = sweep.folder or folder  # e.g. a sweep created by an ingest
            have = {r.cell_id: r for r in s.scalars(select(Run).where(Run.sweep_id == sweep.id))}
            new = 0
            for cell in cells:
                if cell.cell_id in have:
                    continue
                run = Run(sweep_id=sweep.id, cell_id=cell.cell_id, name=cell.name,
                          backend=backend, config=cell.config, status=RunStatus.planned.value,
                          **cell.columns)
                s.add(run)
                have[cell.cell_id] = run
                new += 1
            s.flush()
            ids = {c.cell_id: have[c.cell_id].id for c in cells}
            return Registration(sweep.folder, new, len(cells) - new, ids)

    def create_run(self, cell_id: str, name: str, backend: str, config: dict,
                   columns: dict) -> int:
        """A run outside any sweep (a standalone `twoclocks train`); returns its id."""
        with self.session() as s:
            run = Run(cell_id=cell_id, name=name, backend=backend, config=config, **columns)
            s.add(run)
            s.flush()
            return run.id

    def set_run_config(self, run_id: int, config: dict) -> None:
        """Replace run `run_id`'s config (an extended run says what it is trained to now)."""
        with self.session() as s:
            s.get(Run, run_id).config = config

    def _own_sweep(self, s, name: str, backend: str, config: dict,
                   accept: Callable[[Sweep], str | None]) -> Sweep:
        """Sweep `name`, created with `backend` when missing; `accept` returns why an
        existing one cannot take these runs (raised as a ConfigError), or None."""
        sweep = s.scalar(select(Sweep).where(Sweep.name == name))
        if sweep is None:
            sweep = Sweep(name=name, backend=backend, config=config)
            s.add(sweep)
            s.flush()
        elif (why := accept(sweep)) is not None:
            raise ConfigError(why)
        return sweep

    def _cell_run(self, s, sweep: Sweep, cell_id: str, name: str, backend: str, config: dict,
                  columns: dict) -> tuple[Run, bool]:
        """(run `cell_id` of `sweep`, whether it was created now: planned, with these values)."""
        run = s.scalar(select(Run).where(Run.sweep_id == sweep.id, Run.cell_id == cell_id))
        if run is not None:
            return run, False
        run = Run(sweep_id=sweep.id, cell_id=cell_id, name=name, backend=backend, config=config,
                  status=RunStatus.planned.value, **columns)
        s.add(run)
        s.flush()
        return run, True

    def upsert_import_run(self, sweep_name: str, fmt: str, formats: Iterable[str], cell_id: str,
                          name: str, config: dict, columns: dict,
                          keep_metrics: bool = False) -> tuple[int, str]:
        """The run of one imported log: (run id, created|updated|unchanged). The sweep must be
        an import sweep (its backend one of `formats`). An updated run loses its metrics (the
        mapping may have changed) unless `keep_metrics` (`--follow`: the same file grew)."""
        formats = set(formats)
        with self.session() as s:
            sweep = self._own_sweep(
                s, sweep_name, fmt, {"ingested": True},
                lambda w: None if w.backend in formats else (
                    f"sweep {sweep_name!r} holds {w.backend} runs made by twoclocks; import "
                    "into another sweep (--sweep NAME)"))
            run, created = self._cell_run(s, sweep, cell_id, name, fmt, config, columns)
            if created:
                return run.id, "created"
            # completed or incomplete: the import finished writing (a failed one did not)
            written = (RunStatus.completed.value, RunStatus.incomplete.value)
            if run.config == config and run.status in written and all(
                    getattr(run, k) == v for k, v in columns.items()):
                return run.id, "unchanged"
            run.config = config
            for k, v in columns.items():
                setattr(run, k, v)
            if not keep_metrics:
                s.execute(delete(Metric).where(Metric.run_id == run.id))
            return run.id, "updated"

    def attach_running(self, sweep_name: str, backend: str, cell_id: str, name: str,
                       config: dict, columns: dict, message: str) -> int:
        """Run `cell_id` of sweep `sweep_name` (created when missing), marked running: how a
        trainer twoclocks did not start (the TRL callback) joins the store."""
        with self.session() as s:
            sweep = self._own_sweep(
                s, sweep_name, backend, {"callback": True},
                lambda w: None if w.backend == backend else (
                    f"sweep {sweep_name!r} holds {w.backend} runs: a {backend} callback run "
                    "goes into another sweep (sweep=NAME)"))
            run, _ = self._cell_run(s, sweep, cell_id, name, backend, config, columns)
            s.add(apply_status(run, RunStatus.running, message=message))
            return run.id
