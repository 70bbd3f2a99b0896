"""The `trl` backend: one sweep cell trained by the user's own TRL `GRPOTrainer`.

The cell's batch, group size, lr, clip, seed and budget become `trl.GRPOConfig` fields:
`per_device_train_batch_size` counts completions, so the cell's P*G completions per rollout
batch are split over `processes x gradient_accumulation_steps`; `num_generations = G`;
`epsilon`/`epsilon_high` are the clip; `max_steps = ceil(budget / (P*G)) x num_iterations`
(with `num_iterations = mu`, TRL makes mu optimizer steps from each generation batch of P*G
completions). The `[trl]` table names the entry point (`module:function`, taking the GRPOConfig
and returning a trainer, so the model, data and rewards stay the user's; or `builtin:tiny-arith`)
and fixed GRPOConfig overrides. Checkpoints go to `WORKDIR/trl` every `checkpoint_every_steps`;
called again with the same workdir (a requeue, a rerun of a lost cell) the trainer resumes with
`resume_from_checkpoint` = the latest complete checkpoint, and since the writer upserts on
(run, step, key) each step is stored once. The steps are written by `TwoClocksCallback`'s
mapping (as `ingest --format trl` names them) into the launcher's writer.

Nothing here imports torch or trl at import time: the plan side (`check_table`, `cell_checker`:
`grpo_args`, `check_entry`, `config_fields`) runs without them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import json
import math
import re
import sys
from functools import lru_cache
from pathlib import Path

from twoclocks_cli.backends import adam_keys, cell_source, require_table
from twoclocks_cli.core.errors import ConfigError

TABLE = "trl"
ADAM_KEYS = ("adam_beta1", "adam_beta2", "adam_epsilon")  # GRPOConfig's names
BUILTINS = {"builtin:tiny-arith": "twoclocks_cli.backends.trl_tiny:tiny_arith_trainer"}
CHECKPOINTS = "trl"  # the trainer's output_dir inside the cell's workdir
ATTEMPTS = "trl-attempts.jsonl"  # one line per attempt: which checkpoint it resumed from

# GRPOConfig fields the sweep sets itself -> the sweep key that owns them
OWNED = {
    "per_device_train_batch_size": "grid.batch", "generation_batch_size": "grid.batch",
    "steps_per_generation": "grid.batch", "num_generations": "grid.group_size",
    "learning_rate": "scaling.reference_lr", "epsilon": "grid.clip_low",
    "epsilon_high": "grid.clip_high", "seed": "grid.seeds", "max_steps": "sample_budget",
    "output_dir": "the cell's workdir", "save_strategy": "trl.checkpoint_every_steps",
    "save_steps": "trl.checkpoint_every_steps", "resume_from_checkpoint": "the cell's workdir",
}
ADAM = adam_keys(ADAM_KEYS)
# what a cell gets unless [trl.args] says otherwise: every step logged (full clock resolution),
# no external reporters, two checkpoints kept
DEFAULTS = {"logging_steps": 1, "report_to": "none", "save_total_limit": 2,
            "disable_tqdm": True}


def _positive_int(args: dict, key: str, where: str) -> int:
    value = args.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: key 'trl.args.{key}' = {value!r}: must be an integer >= 1")
    return value


def grpo_args(cell: dict, workdir: Path | str, where: str = "cell") -> dict:
    """The GRPOConfig keyword arguments of a cell (ConfigError when its batch cannot split)."""
    table = cell["trl"]
    user = dict(table.get("args") or {})
    prompts, g = int(cell["prompts_per_batch"]), int(cell["group_size"])
    batch = prompts * g
    accum = _positive_int(user, "gradient_accumulation_steps", where)
    mu = _positive_int(user, "num_iterations", where)
    procs = int(table.get("processes", 1))
    if batch % (procs * accum):
        raise ConfigError(
            f"{where}: key 'grid.batch': {prompts} prompts x G {g} = {batch} completions do not "
            f"split over trl.processes {procs} x trl.args.gradient_accumulation_steps {accum}; "
            f"allowed: batches divisible by {procs * accum} completions")
    per_device = batch // (procs * accum)
    if batch % mu:
        raise ConfigError(f"{where}: key 'trl.args.num_iterations' = {mu}: {batch} completions "
                          "per generation do not divide by it (the samples axis would be "
                          "fractional)")
    steps = math.ceil(int(cell["sample_budget"]) / batch) * mu
    out = {**DEFAULTS, **user}
    out.update(
        output_dir=str(Path(workdir) / CHECKPOINTS), per_device_train_batch_size=per_device,
        num_generations=g, learning_rate=float(cell["lr"]),
        epsilon=float(cell["clip_eps_low"]), epsilon_high=float(cell["clip_eps_high"]),
        seed=int(cell["seed"]), max_steps=steps, save_strategy="steps",
        save_steps=int(table.get("checkpoint_every_steps", 10)))
    return out


# -- checks made by `plan`, without importing the user's code, trl or torch ---------------------

def split_entry(entry: str) -> tuple[str, str]:
    """(module, function) of an entry (a builtin resolves to its module)."""
    return tuple(BUILTINS.get(entry, entry).split(":", 1))  # type: ignore[return-value]


def search_dirs(table: dict) -> list[str]:
    """Folders the entry module is looked for in (after sys.path)."""
    return [str(d) for d in table.get("python_path") or []]


def check_entry(entry: str, dirs: list[str], where: str) -> None:
    """The entry is a builtin, or its module's file exists on sys.path or in `dirs` (its code is
    not run: importing the user's module would start torch in the CLI)."""
    if entry.startswith("builtin:"):
        if entry not in BUILTINS:
            raise ConfigError(f"{where}: key 'trl.entry' = {entry!r}: unknown builtin; allowed: "
                              f"{', '.join(sorted(BUILTINS))} or module:function")
        return
    module, _ = split_entry(entry)
    if not _module_file(module, [*sys.path, *dirs]):
        raise ConfigError(f"{where}: key 'trl.entry' = {entry!r}: module {module!r} is not "
                          "importable (looked on sys.path"
                          + (f" and in {', '.join(dirs)}" if dirs else "")
                          + "; add its folder to trl.python_path)")


def _module_file(module: str, path: list[str]) -> bool:
    """Whether `module` (dotted) resolves to a file, walking packages without importing them."""
    locations: list[str] | None = [p or "." for p in path]
    for part in module.split("."):
        if locations is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            return False
        locations = list(spec.submodule_search_locations or []) or None
    return True


@lru_cache(maxsize=1)
def config_fields() -> frozenset[str] | None:
    """GRPOConfig's field names read from trl's and transformers' source (not imported); None
    when trl is not installed here (the job's GRPOConfig checks the keys then)."""
    files = []
    for pkg, rel, cls in (("trl", "trainer/grpo_config.py", "GRPOConfig"),
                          ("trl", "trainer/base_config.py", "_BaseConfig"),
                          ("transformers", "training_args.py", "TrainingArguments")):
        spec = importlib.util.find_spec(pkg)
        if spec is None or spec.origin is None:
            return None
        files.append((Path(spec.origin).parent / rel, cls))
    names: set[str] = set()
    for path, cls in files:
        if not path.is_file():
            return None
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                names.update(n.target.id for n in node.body
                             if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    return frozenset(names) if "num_generations" in names else None


def check_args(args: dict, adam: bool, source: str, where: str = "trl.args") -> None:
    """[trl.args] (or grid.trl) keys: GRPOConfig fields, none of those the sweep sets."""
    owned = {**OWNED, **(ADAM if adam else {})}
    fields = config_fields()
    for key in args:
        if key in owned:
            raise ConfigError(f"{source}: key '{where}.{key}': set by the sweep itself "
                              f"({owned[key]}); remove it here")
        if fields is not None and key not in fields:
            import difflib

            hint = difflib.get_close_matches(key, sorted(fields), n=1)
            raise ConfigError(f"{source}: unknown key '{where}.{key}': not a trl.GRPOConfig "
                              "field" + (f"; did you mean {hint[0]!r}?" if hint else ""))


# -- the plan side (twoclocks_cli.backends.SweepBackend) -----------------------------------------

def check_options(cfg, source: str) -> None:
    """A trl sweep needs its [trl] table."""
    require_table(cfg, TABLE, source)


def check_table(cfg, source: str, config_dir: str | None) -> dict:
    """The `trl` table every cell carries, its `python_path` made absolute (from `config_dir`,
    else the folder of `source` when it is a file, else the working directory); its entry and
    fixed and grid arguments checked."""
    table = cfg.trl.model_dump(mode="json")
    base = Path(config_dir) if config_dir else (
        Path(source).parent if Path(source).is_file() else Path.cwd())
    if not table["entry"].startswith("builtin:"):  # the job imports from these folders
        table["python_path"] = list(dict.fromkeys(
            [str(base.resolve())] + [str((base / d).resolve()) for d in table["python_path"]]))
    check_entry(table["entry"], table["python_path"], source)
    check_args(table["args"], cfg.scaling.adam_adjust, source)
    check_args(cfg.grid.trl, cfg.scaling.adam_adjust, source, where="grid.trl")
    for key in set(cfg.grid.trl) & set(table["args"]):
        raise ConfigError(f"{source}: key 'trl.args.{key}': also an axis (grid.trl.{key}); "
                          "set it in one place")
    return {"trl": table}


def resolve_cell(cfg, common: dict, options: dict, table: dict) -> dict:
    """The common keys and a copy of the `trl` table, the cell's options in its args."""
    cell = {**common, **json.loads(json.dumps(table))}
    cell["trl"]["args"].update(options)
    return cell


def steps(budget: int, batch: int) -> int:
    """TRL runs ceil(budget / batch) generation batches (the last may pass the budget)."""
    return -(-budget // batch)


def cell_checker(cfg, source: str):
    """Each cell's GRPOConfig arguments can be formed (its batch splits)."""

    def check(cell) -> None:
        grpo_args(cell.config, "workdir", cell_source(cell, source))

    return check


def clip_warning(cells: list, settings: int) -> str | None:
    """TRL's updates per generation are the user's (num_iterations): no warning."""
    return None


LINE_KEY = "grpo_config"


def cell_line(cell) -> str | None:
    """The GRPOConfig fields the sweep sets for the cell."""
    args = grpo_args(cell.config, "<workdir>")
    shown = {k: v for k, v in args.items() if k in OWNED and k != "output_dir"}
    return "GRPOConfig(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


def written_as(cfg, key: str) -> str | None:
    """trl.X, or grid.trl.X for an axis (in the cell's trl.args); None for a key of the cell's
    top level."""
    table, _, name = key.partition(".")
    if table != TABLE or not name:
        return None
    axis = name.removeprefix("args.")
    return f"grid.trl.{axis}" if axis in cfg.grid.trl else key


# -- the job side -------------------------------------------------------------------------------

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (its trainer_state.json, written last, parses)."""
    if not output_dir.is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in output_dir.iterdir()
                    if (m := _CHECKPOINT.match(p.name)) and p.is_dir()), reverse=True)
    for _, path in found:
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue  # killed while it was written
        return path
    return None


def load_entry(table: dict):
    """The user's trainer factory, imported in the job (its folders after sys.path)."""
    module, name = split_entry(table["entry"])
    for d in search_dirs(table):
        if d not in sys.path:
            sys.path.append(d)
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"trl.entry = {table['entry']!r}: cannot import {module!r}: "
                          f"{exc}") from None
    func = getattr(mod, name, None)
    if not callable(func):
        raise ConfigError(f"trl.entry = {table['entry']!r}: module {module!r} has no function "
                          f"{name!r}")
    return func


def _cell_callback(writer):
    """A TwoClocksCallback that writes into the launcher's writer (the launcher owns the run's
    status) and stops the trainer at a non-finite loss or gradient (the cell diverged)."""
    from twoclocks_cli.integrations.trl import TwoClocksCallback, samples_per_step

    class CellCallback(TwoClocksCallback):
        diverged = False

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self._per_step, _ = samples_per_step(args)
                self._writer = writer

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self._write_log(state, logs).get("nonfinite"):
                self.diverged = True
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            if self._writer is not None:
                self._writer.flush()

    return CellCallback()


def run(cell: dict, writer, workdir: Path):
    """Train the cell with the user's trainer; resumes from the latest checkpoint in workdir."""
    import time

    from trl import GRPOConfig

    from twoclocks_cli.store.models import RunStatus

    table = cell["trl"]
    workdir = Path(workdir)
    kwargs = grpo_args(cell, workdir)
    try:
        args = GRPOConfig(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"trl.args: GRPOConfig refused the cell's settings: "
                          f"{' '.join(str(exc).split())}") from None
    procs = int(table.get("processes", 1))
    if int(args.world_size) != procs:
        raise ConfigError(f"trl.processes = {procs} but the trainer runs on {args.world_size} "
                          "process(es): the batch would be split wrongly")
    trainer = load_entry(table)(args)
    callback = _cell_callback(writer)
    trainer.add_callback(callback)
    ckpt = latest_checkpoint(Path(args.output_dir))
    with open(workdir / ATTEMPTS, "a") as fh:
        fh.write(json.dumps({"time": time.time(), "resume_from": ckpt.name if ckpt else None})
                 + "\n")
    trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    writer.flush()
    close = getattr(trainer, "twoclocks_close", None)
    if callable(close):
        close()
    return RunStatus.diverged if callback.diverged else RunStatus.completed
