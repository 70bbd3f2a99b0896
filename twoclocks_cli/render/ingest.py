"""What `twoclocks ingest` says per imported source: the run, its steps and values, batch, lr
and format, then what was skipped, logged twice, left unmapped, or noted."""

from __future__ import annotations

import typer


def render_ingested(results: list) -> None:
    """One line per result (an ingest.IngestResult), and its notes indented below."""
    for r in results:
        if r.action == "skipped":
            typer.echo(f"{r.path}: skipped (--skip-bad): {r.notes[0]}")
            continue
        typer.echo(_summary(r))
        _details(r)


def _summary(r) -> str:
    """'PATH (run R): run 3 in sweep 'imported' created: 12 steps, ... format trl'."""
    batch = f"{r.batch_prompts}x{r.group_size}={r.batch_samples}" if r.batch_samples else "-"
    lr_txt = f"{r.lr:.3g}" if r.lr is not None else "-"
    how = " (detected from its content)" if r.format_from.startswith("detected") else ""
    where = f"{r.path} (run {r.run})" if r.run else r.path
    return (f"{where}: run {r.run_id} in sweep "
            f"{r.sweep!r} {r.action}: {r.steps} steps, {r.rows} values, batch {batch}, "
            f"lr {lr_txt}, format {r.format}{how}")


def _details(r) -> None:
    """The lines skipped, the values logged twice, the keys with no store name, the notes."""
    for line, why in r.skipped_lines:
        typer.echo(f"  skipped line {line}: {why}")
    if r.duplicates:
        typer.echo(f"  {r.duplicates} values logged twice for one step; the last one kept")
    if r.unmapped:
        shown = ", ".join(r.unmapped[:8]) + (" ..." if len(r.unmapped) > 8 else "")
        typer.echo(f"  not imported ({len(r.unmapped)} keys with no store name): {shown}")
    for note in r.notes:
        typer.echo(f"  note: {note}")
