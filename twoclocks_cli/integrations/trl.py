"""`TwoClocksCallback`: every `on_log` of a TRL (or any transformers) Trainer, into the store.

    from twoclocks_cli.integrations.trl import TwoClocksCallback
    trainer.add_callback(TwoClocksCallback(db="sqlite:///runs.db", sweep="mine", name="bs16-s0"))

The run joins `sweep` as a `trl` run (so `analyze`, `report` and `status` treat it like an
imported TRL log) and is `running` from `on_train_begin`, `completed` at `on_train_end`, and
`failed` when the process ends without reaching it (an exception, a kill that lets Python exit).
Names are mapped as `twoclocks ingest --format trl` maps them. Samples come from the trainer's own
counters, never guessed: a GRPOTrainer generates `per_device_train_batch_size x processes x
gradient_accumulation_steps / num_iterations` fresh completions per optimizer step (its
`generation_batch_size` is generated once per `steps_per_generation x num_iterations` micro-steps);
prompts per step are that over `num_generations`. Only the main process (world rank 0) writes.
A run with the same name in the sweep is attached to (a requeued job): metrics upsert on
(run, step, key), so each step is stored once.
"""

from __future__ import annotations

import atexit
import hashlib
import math

from transformers import TrainerCallback

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import mapping
from twoclocks_cli.ingest.trl import reward_pick

BACKEND = "trl"  # the same backend name as `ingest --format trl`: one kind of run


def samples_per_step(args) -> tuple[int, int | None]:
    """(fresh completions per optimizer step, prompts per step or None) from a TrainingArguments
    or GRPOConfig, as the trainer itself counts them."""
    per_device = int(args.per_device_train_batch_size)
    processes = int(getattr(args, "world_size", 1) or 1)
    accum = int(args.gradient_accumulation_steps or 1)
    iterations = int(getattr(args, "num_iterations", 1) or 1)
    completions = per_device * processes * accum
    if completions % iterations:
        raise ConfigError(f"{completions} completions per step do not divide by "
                          f"num_iterations = {iterations}: the samples axis would be fractional")
    per_step = completions // iterations
    g = getattr(args, "num_generations", None)
    return per_step, (per_step // int(g) if g else None)


class TwoClocksCallback(TrainerCallback):
    """Write a Trainer's logs into a twoclocks store as one run (see the module docstring)."""

    def __init__(self, db: str | None = None, sweep: str = "trl", name: str | None = None,
                 lr: float | None = None, seed: int | None = None):
        self.db, self.sweep, self.name = db, sweep, name
        self.lr, self.seed = lr, seed  # the configured values; default: the trainer's args
        self.run_id: int | None = None
        self._store = self._writer = None
        self._per_step = 0
        self._ended = False

    # -- lifecycle --------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from twoclocks_cli.store import Store

        self._per_step, prompts = samples_per_step(args)
        self._store = Store.open(self.db)
        self.run_id = self._attach(args, prompts)
        self._writer = self._store.metric_writer(self.run_id)
        atexit.register(self._exit_without_end)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._write_log(state, logs)

    def _write_log(self, state, logs) -> dict:
        """Map one TRL log and write it at the trainer's step; returns what was written."""
        if self._writer is None or not logs:
            return {}
        values = self._map(logs)
        if values:
            step = int(state.global_step)
            self._writer.log(step, step * self._per_step, values)
            self._writer.flush()  # every log lands now: status/analyze see a live run
        return values

    def on_train_end(self, args, state, control, **kwargs):
        if self._writer is None:
            return
        from twoclocks_cli.store.models import RunStatus

        self._writer.flush()
        self._store.set_status(self.run_id, RunStatus.completed,
                               message=f"trainer finished at step {state.global_step}")
        self._ended = True

    def _exit_without_end(self) -> None:
        """The process is ending and on_train_end never came: the training failed."""
        if self._ended or self._writer is None:
            return
        from twoclocks_cli.store.models import RunStatus

        try:
            self._writer.flush()
            self._store.set_status(self.run_id, RunStatus.failed,
                                   message="the process ended before on_train_end",
                                   error="training did not finish (an exception or a signal)")
        except Exception:  # noqa: BLE001 - at exit there is nobody left to tell
            pass

    # -- helpers ----------------------------------------------------------------------------

    def _map(self, logs: dict) -> dict[str, float]:
        """TRL names -> store names (as the TRL importer maps them); numbers only."""
        numbers = {k: float(v) for k, v in logs.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        picks = mapping.choose_sources(numbers, mapping.TRL_KEYS, {})
        for target, eval_ in (("accuracy", False), ("eval_accuracy", True)):
            if target not in picks and (src := reward_pick(set(numbers), eval_)):
                picks[target] = src
        if any(k.startswith("eval_") for k in numbers):  # an eval log: only its own keys
            picks = {t: s for t, s in picks.items() if s.startswith("eval_")}
        return mapping.apply(numbers, picks)

    def _attach(self, args, prompts: int | None) -> int:
        """The run named `name` in `sweep` (created with the trainer's settings when missing)."""
        name = self.name or str(args.run_name or args.output_dir)
        cell = hashlib.sha256(f"trl-callback\0{name}".encode()).hexdigest()[:32]
        lr = self.lr if self.lr is not None else float(args.learning_rate)
        seed = self.seed if self.seed is not None else int(args.seed)
        g = getattr(args, "num_generations", None)
        columns = {"batch_prompts": prompts, "group_size": int(g) if g else None,
                   "batch_samples": self._per_step, "lr": lr if math.isfinite(lr) else None,
                   "seed": seed}
        config = {"prompts_per_batch": prompts, "group_size": columns["group_size"], "lr": lr,
                  "seed": seed, "sample_budget": int(args.max_steps) * self._per_step
                  if args.max_steps and args.max_steps > 0 else None,
                  "trl": {"callback": True, "output_dir": str(args.output_dir),
                          "per_device_train_batch_size": args.per_device_train_batch_size,
                          "gradient_accumulation_steps": args.gradient_accumulation_steps,
                          "num_iterations": getattr(args, "num_iterations", 1),
                          "world_size": getattr(args, "world_size", 1)}}
        return self._store.attach_running(self.sweep, BACKEND, cell, name, config, columns,
                                          "TRL trainer started")
