"""The `command` backend: any trainer run as a shell command, its log followed live.

The `[command]` template gets the cell's values through placeholders ({prompts} {group_size}
{lr} {clip_low} {clip_high} {seed} {total_steps} {workdir}; total_steps = ceil(budget / (P*G))
rollout batches; {workdir} is "$TWOCLOCKS_WORKDIR", which the job sets, so `plan` shows each
command as it runs), each shell-quoted; bash runs it in the cell's workdir (on SLURM inside the
array task, after the config's `slurm.setup` lines, so a `ray start`/`srun` recipe works).
Its log (stdout, or a file it writes) is read again whenever it grows by the ingest parsers
(verl console lines, JSON Lines or CSV; a partial last line waits for its newline) and the steps
whose values are new go through the launcher's writer, at samples = step x P x G unless the log
states them. Exit 0 is `completed`; any other exit is `failed`, with the last lines of the log
in the error. When the cell runs again (a requeue, a rerun of a lost or failed cell) the
command gets the resume arguments appended (verl: `trainer.resume_mode=auto`) and rows already
stored are upserted, never duplicated.

The `verl` preset appends the verl overrides that carry the cell: data.train_batch_size,
actor_rollout_ref.rollout.n, actor_rollout_ref.actor.optim.lr,
actor_rollout_ref.actor.clip_ratio_low/high, trainer.total_training_steps,
trainer.default_local_dir, trainer.logger=['console'] and data.seed. verl itself needs GPUs:
it cannot run on the CPU machines this project is tested on, so the verl preset is checked by
`plan` (its command lines) and the backend by a fixture that prints verl's console format.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import socket
import string
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from twoclocks_cli.backends import require_table
from twoclocks_cli.core.errors import ConfigError

TABLE = "command"
ADAM_KEYS = ("adam_beta1", "adam_beta2", "adam_epsilon")  # at the cell's top level
PLACEHOLDERS = ("prompts", "group_size", "lr", "clip_low", "clip_high", "seed", "total_steps",
                "workdir")
LOGS = "logs"  # attempt-N.out / attempt-N.err inside the cell's workdir
TAIL_CHARS = 600


@dataclass(frozen=True)
class Preset:
    """What a preset adds to the user's template."""

    overrides: tuple[tuple[str, str], ...]  # (key, value template) appended as key=value
    log_format: str
    resume_args: str


VERL = Preset(
    overrides=(
        ("data.train_batch_size", "{prompts}"),
        ("actor_rollout_ref.rollout.n", "{group_size}"),
        ("actor_rollout_ref.actor.optim.lr", "{lr}"),
        ("actor_rollout_ref.actor.clip_ratio_low", "{clip_low}"),
        ("actor_rollout_ref.actor.clip_ratio_high", "{clip_high}"),
        ("trainer.total_training_steps", "{total_steps}"),
        ("trainer.default_local_dir", "{workdir}/checkpoints"),
        ("trainer.logger", "\"['console']\""),
        ("data.seed", "{seed}"),
    ),
    log_format="verl", resume_args="trainer.resume_mode=auto")
PRESETS = {"verl": VERL}


def total_steps(cell: dict) -> int:
    """Rollout batches a cell runs: ceil(budget / (P*G))."""
    return math.ceil(int(cell["sample_budget"]) / (int(cell["prompts_per_batch"])
                                                  * int(cell["group_size"])))


def placeholders(text: str, key: str, where: str) -> set[str]:
    """The placeholder names in `text`; ConfigError for unknown ones or unbalanced braces."""
    try:
        names = {f for _, f, spec, conv in string.Formatter().parse(text) if f is not None}
        bad_spec = [f for _, f, spec, conv in string.Formatter().parse(text)
                    if f is not None and (spec or conv)]
    except ValueError as exc:
        raise ConfigError(f"{where}: key {key!r}: {exc} (write {{{{ and }}}} for literal "
                          "braces)") from None
    unknown = sorted(n for n in names if n not in PLACEHOLDERS)
    if unknown:
        raise ConfigError(f"{where}: key {key!r}: unknown placeholder {{{unknown[0]}}}; allowed: "
                          + " ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                          + " ({{ and }} for literal braces)")
    if bad_spec:
        raise ConfigError(f"{where}: key {key!r}: placeholder {{{bad_spec[0]}}} takes no format "
                          "spec or conversion (values are given at full precision)")
    return names


WORKDIR_VAR = "TWOCLOCKS_WORKDIR"  # the cell's workdir, set in the command's environment


def values(cell: dict, workdir: str | None = None) -> dict[str, str]:
    """Each placeholder's text for a cell, shell-quoted (numbers at full precision). {workdir}
    is `"$TWOCLOCKS_WORKDIR"` (set by the job), so `plan` prints the command exactly as it runs;
    with `workdir` given, that folder itself, unquoted (for the path of a log file)."""
    raw = {"prompts": int(cell["prompts_per_batch"]), "group_size": int(cell["group_size"]),
           "lr": repr(float(cell["lr"])), "clip_low": repr(float(cell["clip_eps_low"])),
           "clip_high": repr(float(cell["clip_eps_high"])), "seed": int(cell["seed"]),
           "total_steps": total_steps(cell)}
    if workdir is not None:
        return {**{k: str(v) for k, v in raw.items()}, "workdir": str(workdir)}
    return {**{k: shlex.quote(str(v)) for k, v in raw.items()},
            "workdir": f'"${WORKDIR_VAR}"'}


def resolved(table: dict) -> dict:
    """The command table with the preset's log format and resume arguments filled in."""
    preset = PRESETS.get(table.get("preset") or "")
    out = dict(table)
    if out.get("log_format") is None and preset:
        out["log_format"] = preset.log_format
    if out.get("resume_args") is None:
        out["resume_args"] = preset.resume_args if preset else ""
    return out


def check(table: dict, where: str) -> None:
    """Validate a [command] table before any cell is written."""
    placeholders(table["template"], "command.template", where)
    placeholders(table.get("log_source") or "stdout", "command.log_source", where)
    placeholders(table.get("resume_args") or "", "command.resume_args", where)
    if resolved(table)["log_format"] is None:
        raise ConfigError(f"{where}: key 'command.log_format' is required without a preset; "
                          "allowed: verl, jsonl, csv")
    preset = PRESETS.get(table.get("preset") or "")
    for key, _ in preset.overrides if preset else ():
        if re.search(r"(?<![\w.])\+{0,2}" + re.escape(key) + r"=", table["template"]):
            raise ConfigError(f"{where}: key 'command.template' sets {key}: the "
                              f"{table['preset']} preset sets it from the cell; remove it here")
    for name in table.get("env") or {}:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"{where}: key 'command.env.{name}': not an environment variable "
                              "name (letters, digits, _)")


def command_line(cell: dict, resume: bool = False) -> str:
    """The exact shell command of a cell (with the resume arguments when it runs again)."""
    table = resolved(cell["command"])
    vals = values(cell)
    parts = [table["template"].format(**vals).strip()]
    preset = PRESETS.get(table.get("preset") or "")
    if preset:
        parts += [f"{key}={value.format(**vals)}" for key, value in preset.overrides]
    if resume and table["resume_args"]:
        parts.append(table["resume_args"].format(**vals))
    return " ".join(parts)


def log_path(cell: dict, workdir: Path, attempt: int) -> Path:
    """Where the log is read: the attempt's stdout file, or the file the command writes."""
    source = cell["command"].get("log_source") or "stdout"
    if source == "stdout":
        return workdir / LOGS / f"attempt-{attempt}.out"
    path = Path(os.path.expanduser(source.format(**values(cell, str(workdir)))))
    return path if path.is_absolute() else workdir / path


# -- the plan side (twoclocks_cli.backends.SweepBackend) -----------------------------------------

def check_options(cfg, source: str) -> None:
    """A command sweep needs its [command] table."""
    require_table(cfg, TABLE, source)


def check_table(cfg, source: str, config_dir: str | None) -> dict:
    """The `command` table every cell carries (checked, its preset's defaults filled in)."""
    table = cfg.command.model_dump(mode="json")
    check(table, source)
    return {"command": resolved(table)}


def resolve_cell(cfg, common: dict, options: dict, table: dict) -> dict:
    """The common keys, a copy of the `command` table and the cell's options (its Adam
    settings: the grid has no command axes)."""
    return {**common, **json.loads(json.dumps(table)), **options}


def steps(budget: int, batch: int) -> int:
    """The command runs ceil(budget / batch) rollout batches ({total_steps})."""
    return -(-budget // batch)


def cell_checker(cfg, source: str):
    """Each cell's command line can be formed."""

    def check_cell(cell) -> None:
        command_line(cell.config)

    return check_cell


def clip_warning(cells: list, settings: int) -> str | None:
    """The command's updates per batch are unknown here: no warning."""
    return None


LINE_KEY = "command"


def cell_line(cell) -> str | None:
    """The cell's exact command line."""
    return command_line(cell.config)


def written_as(cfg, key: str) -> str | None:
    """command.X as written; None for a key of the cell's top level."""
    table, _, name = key.partition(".")
    return key if table == TABLE and name else None


# -- following the log ------------------------------------------------------------------------

class LogFollower:
    """Parses a growing log with the ingest parsers and yields the steps that changed."""

    def __init__(self, path: Path, fmt: str, batch: int):
        from twoclocks_cli.ingest.base import IngestOptions

        self.path, self.batch = path, batch
        self.opts = IngestOptions(fmt=fmt, skip_bad=True, identity="path")
        self.size: int | None = None
        self.mtime: float | None = None
        self.written: dict[int, tuple[int, dict]] = {}
        self.notes: list[str] = []

    def poll(self) -> list[tuple[int, int, dict]]:
        """(step, samples, values) of every step that is new or changed since the last poll."""
        from twoclocks_cli.ingest import base
        from twoclocks_cli.ingest.importer import parse_file

        try:
            stat = self.path.stat()
        except OSError:
            return []
        if (stat.st_size, stat.st_mtime) == (self.size, self.mtime):
            return []
        self.size, self.mtime = stat.st_size, stat.st_mtime
        try:
            log = parse_file(self.path, self.opts)
        except base.NoStepsError:
            return []  # the run is starting
        except ConfigError as exc:
            if "no metric this tool knows" in str(exc):
                return []  # only header lines so far
            raise
        self.notes = list(log.notes)
        out = []
        for step in sorted(log.steps):
            row = log.steps[step]
            if not row:
                continue
            samples = log.samples.get(step, (step + log.step_offset) * self.batch)
            if self.written.get(step) != (samples, row):
                out.append((step, samples, dict(row)))
                self.written[step] = (samples, dict(row))
        return out


def _tail(*paths: Path, lines: int = 4) -> str:
    """The last non-empty lines of the first of `paths` that has any, as one line."""
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.seek(max(0, path.stat().st_size - 16384))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        got = [" ".join(ln.split()) for ln in text.splitlines() if ln.strip()]
        if got:
            joined = " | ".join(got[-lines:])
            return joined[-TAIL_CHARS:]
    return "(no output)"


def _attempt(logs: Path) -> int:
    """The number of this attempt: one more than the attempts logged in the workdir."""
    seen = [int(m.group(1)) for p in logs.glob("attempt-*.out")
            if (m := re.fullmatch(r"attempt-(\d+)\.out", p.name))]
    return max(seen, default=0) + 1


def _die_with_parent() -> None:
    """In the child: be killed when the job process dies (Linux), and lead a process group."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run(cell: dict, writer, workdir: Path):
    """Run the cell's command to its exit, writing the steps of its log as they appear."""
    from twoclocks_cli.store.models import RunStatus

    table = resolved(cell["command"])
    workdir = Path(workdir).resolve()
    logs = workdir / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    attempt = _attempt(logs)
    cmd = command_line(cell, resume=attempt > 1)
    out_path, err_path = logs / f"attempt-{attempt}.out", logs / f"attempt-{attempt}.err"
    follower = LogFollower(log_path(cell, workdir, attempt), table["log_format"],
                           int(cell["prompts_per_batch"]) * int(cell["group_size"]))
    env = {**os.environ, **(table.get("env") or {}), WORKDIR_VAR: str(workdir)}
    poll = float(table.get("poll_s") or 1.0)
    (logs / f"attempt-{attempt}.cmd").write_text(cmd + "\n")
    _stop_previous(logs, attempt)
    earlier = _catch_up(cell, workdir, attempt, table["log_format"], writer)
    with open(out_path, "ab") as out, open(err_path, "ab") as err:
        proc = subprocess.Popen(["bash", "-c", cmd], cwd=workdir, env=env, stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
        (logs / f"attempt-{attempt}.pgid").write_text(f"{socket.gethostname()} {proc.pid}\n")
        try:
            while proc.poll() is None:
                _write(writer, follower.poll())
                time.sleep(poll)
        except BaseException:  # cancelled or failed here: the command must not outlive us
            _stop(proc)
            raise
    _write(writer, follower.poll())
    if proc.returncode != 0:
        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with code {proc.returncode}")
        raise RuntimeError(f"command {how} (attempt {attempt}; log {out_path}): "
                           f"{_tail(err_path, out_path)}")
    if not follower.written and not earlier:
        raise RuntimeError(f"command exited with code 0 but {follower.path} has no step this "
                           f"tool reads as {table['log_format']} (check command.log_source and "
                           f"command.log_format): {_tail(err_path, out_path)}")
    return RunStatus.completed


def _stop_previous(logs: Path, attempt: int) -> None:
    """Kill what is left of the previous attempt on this host (a job killed with -9 takes bash
    with it, not a trainer bash had forked): two trainers must never write one workdir. Only
    processes of that process group whose environment names this workdir are killed (a reused
    pid is left alone)."""
    try:
        host, pgid = (logs / f"attempt-{attempt - 1}.pgid").read_text().split()
    except (OSError, ValueError):
        return
    if host != socket.gethostname():
        return
    mark = f"{WORKDIR_VAR}={logs.parent}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            group = (proc / "stat").read_text().rsplit(")", 1)[1].split()[2]
            if group != pgid or mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, IndexError):
            continue


def _catch_up(cell: dict, workdir: Path, attempt: int, fmt: str, writer) -> int:
    """Store what earlier attempts logged to stdout (oldest first): steps a killed job never
    read, which a resumed trainer does not log again when its checkpoint covers them."""
    if (cell["command"].get("log_source") or "stdout") != "stdout":
        return 0  # a log file the command writes is read whole by this attempt's follower
    batch = int(cell["prompts_per_batch"]) * int(cell["group_size"])
    steps = 0
    for n in range(1, attempt):
        path = log_path(cell, workdir, n)
        if path.is_file():
            got = LogFollower(path, fmt, batch).poll()
            _write(writer, got)
            steps += len(got)
    return steps


def _write(writer, steps: list[tuple[int, int, dict]]) -> None:
    for step, samples, row in steps:
        writer.log(step, samples, row)
    if steps:
        writer.flush()  # live: status and analyze see the rows while the command runs


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the command's process group, SIGKILL it after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
