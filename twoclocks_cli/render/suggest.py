"""What `twoclocks suggest` prints: B_crit as it stands, the suggested cells with their cost
and why each, the notes, and the config file written."""

from __future__ import annotations

from twoclocks_cli.core.numbers import count
from twoclocks_cli.render.tables import console
from twoclocks_cli.suggest import estimate_text


def render_suggestions(doc: dict, rec) -> None:
    """The suggestion document as tables; `rec` is the analysis's recommended estimate."""
    from rich.table import Table

    con = console()
    con.print(f"sweep {doc['sweep']}: B_crit {estimate_text(rec)} samples "
              f"({rec.source or 'no estimate'}, {rec.placement or '-'}); "
              f"analysis {doc.get('analysis_id')} ({doc.get('analysis_source')})")
    cost = count(doc["cost_samples"])
    table = Table(title=f"suggested cells: {doc['cells']} cells, {cost} samples "
                        "(cost = seeds x budget)")
    for col in ("#", "kind", "batch", "prompts x G", "seeds", "budget", "cost"):
        table.add_column(col, justify="left" if col in ("kind", "seeds") else "right")
    for i, s in enumerate(doc["suggestions"], start=1):
        table.add_row(str(i), s["kind"], count(s["batch_samples"]),
                      f"{s['batch_prompts']} x {s['group_size']}",
                      ", ".join(map(str, s["seeds"])), count(s["budget"]),
                      count(s["cost_samples"]))
    if doc["suggestions"]:
        con.print(table)
        for i, s in enumerate(doc["suggestions"], start=1):
            con.print(f"{i}. {s['why']}", highlight=False)
    else:
        con.print("nothing to suggest")
    for note in doc["notes"]:
        con.print(f"note: {note}", highlight=False)
    if doc.get("out"):
        con.print(f"wrote {doc['out']} ({doc['out_cells']} cells): add them with "
                  f"`twoclocks sweep {doc['out']} --wait`, then `twoclocks analyze "
                  f"{doc['sweep']}`")
