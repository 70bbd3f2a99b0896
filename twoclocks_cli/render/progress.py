"""The progress of one training run (`twoclocks train`): a rich bar on a terminal (samples of
the budget, reward, accuracy, eval, samples/s, elapsed and ETA), else one plain line every
`$TWOCLOCKS_PROGRESS_S` seconds (default 30) for a log."""

from __future__ import annotations

import contextlib
import os
import sys

import typer


@contextlib.contextmanager
def progress(run_id: int, budget: int, start_samples: int, show: bool, to_stderr: bool):
    """The loop's on_step callback for as long as the run trains: None where nothing is shown
    (ranks other than 0), the bar on a terminal (stdout, or stderr with `to_stderr`), else the
    plain lines."""
    stream = sys.stderr if to_stderr else sys.stdout
    if not show:
        yield None
    elif not stream.isatty():
        yield plain_progress(run_id, start_samples, to_stderr)
    else:
        with _bar(run_id, budget, start_samples, to_stderr) as on_step:
            yield on_step


@contextlib.contextmanager
def _bar(run_id: int, budget: int, start_samples: int, to_stderr: bool):
    """A rich progress bar and the on_step callback that moves it."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    from twoclocks_cli.render.tables import console

    class Rate(ProgressColumn):
        """Samples per second over rich's recent window ('-' until there are two updates)."""

        def render(self, task) -> Text:
            return Text("-" if task.speed is None else rate_text(task.speed))
    columns = (
        TextColumn(f"run {run_id}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "samples  reward {task.fields[reward]}  acc {task.fields[acc]}  "
            "eval {task.fields[eval]}"
        ),
        Rate(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False, console=console(stderr=to_stderr)) as bar:
        task = bar.add_task("train", total=budget, reward="-", acc="-", eval="-",
                            completed=start_samples)

        def on_step(p) -> None:
            fields = {"reward": f"{p.reward:.3f}", "acc": f"{p.accuracy:.3f}"}
            if p.eval_accuracy is not None:
                fields["eval"] = f"{p.eval_accuracy:.3f}"
            bar.update(task, completed=min(p.samples, p.budget), **fields)

        yield on_step


def rate_text(rate: float) -> str:
    """Samples per second with two significant digits below 10 (a real model on a CPU trains
    at 0.3 samples/s, which a whole-number format shows as 0) and whole numbers above."""
    if rate >= 10:
        return f"{rate:,.0f} samples/s"
    return f"{rate:.2g} samples/s"


def eta_text(left: float, rate: float) -> str:
    """H:M:S until `left` more samples at `rate` per second ('-' with no rate yet). A last step
    may pass the budget (whole batches): nothing is left then, never a negative time."""
    import time

    if not rate > 0:
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(max(left, 0) / rate))


def plain_progress(run_id: int, start_samples: int, to_stderr: bool = False):
    """An on_step callback printing one plain line (on stdout, or stderr) every
    $TWOCLOCKS_PROGRESS_S seconds (and at the last step): samples, reward, accuracy, eval,
    samples/s and ETA, for logs."""
    import time

    try:
        every = max(0.0, float(os.environ.get("TWOCLOCKS_PROGRESS_S", "30")))
    except ValueError:
        every = 30.0
    t0 = time.monotonic()
    state = {"last": None, "eval": "-"}

    def on_step(p) -> None:
        now = time.monotonic()
        if p.eval_accuracy is not None:
            state["eval"] = f"{p.eval_accuracy:.3f}"
        done = p.samples >= p.budget
        if state["last"] is not None and now - state["last"] < every and not done:
            return
        state["last"] = now
        rate = (p.samples - start_samples) / max(now - t0, 1e-9)
        eta_txt = eta_text(p.budget - p.samples, rate)
        typer.echo(f"run {run_id}: {p.samples:,}/{p.budget:,} samples  step {p.step}  reward "
                   f"{p.reward:.3f}  acc {p.accuracy:.3f}  eval {state['eval']}  "
                   f"{rate_text(rate)}  ETA {eta_txt}", nl=True, err=to_stderr)
        (sys.stderr if to_stderr else sys.stdout).flush()

    return on_step
