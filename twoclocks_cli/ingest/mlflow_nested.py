"""MLflow's nested runs: a parent run (often params only, a sweep's shared settings, as HF's
MLflowCallback leaves it with `MLFLOW_NESTED_RUN`) and the runs started under it with
`mlflow.start_run(nested=True)`, each tagged `mlflow.parentRunId`.

A child takes the params it does not log itself from its ancestors, the nearest first, and says
so; a parent whose own metrics are no run to import (no step logged) while runs under it have
steps is left out, with a note on those runs, instead of refusing the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from twoclocks_cli.ingest import scalars
from twoclocks_cli.ingest.base import ParsedLog

PARENT_TAG = "mlflow.parentRunId"


@dataclass
class Family:
    """The runs of a store by id, with the parents outside the selection fetched once."""

    listed: dict[str, object]  # run id -> mlflow Run, the runs selected by experiment and filter
    label: Callable[[object], str]  # a run's name as messages show it (experiment/run)
    fetch: Callable[[str], object | None]  # a run by id, None when the store has no such run
    _fetched: dict[str, object | None] = field(default_factory=dict)
    _children: dict[str, list[str]] | None = None  # parent id -> ids of listed runs under it

    def run(self, rid: str):
        """The run `rid`, listed or fetched (None when the store lacks it)."""
        if rid in self.listed:
            return self.listed[rid]
        if rid not in self._fetched:
            self._fetched[rid] = self.fetch(rid)
        return self._fetched[rid]

    def ancestors(self, run) -> list:
        """The run's parent, its parent's parent, ...: as far as the store holds them (a tag
        that loops back stops the walk)."""
        chain, seen = [], {run.info.run_id}
        rid = run.data.tags.get(PARENT_TAG)
        while rid and rid not in seen:
            seen.add(rid)
            parent = self.run(rid)
            if parent is None:
                break
            chain.append(parent)
            rid = parent.data.tags.get(PARENT_TAG)
        return chain

    def inherited(self, run) -> dict[str, tuple[str, str]]:
        """key -> (value, the ancestor's name) of the params the run does not log itself."""
        own, out = run.data.params, {}
        for parent in self.ancestors(run):
            for key, value in parent.data.params.items():
                if key not in own and key not in out:
                    out[key] = (value, self.label(parent))
        return out

    def descendants(self, rid: str) -> list[str]:
        """The ids of the listed runs under `rid`, at any depth."""
        if self._children is None:
            self._children = {}
            for r in self.listed.values():
                if (pid := r.data.tags.get(PARENT_TAG)) is not None:
                    self._children.setdefault(pid, []).append(r.info.run_id)
        children = self._children
        out, todo, seen = [], list(children.get(rid, [])), {rid}
        while todo:
            cid = todo.pop(0)
            if cid not in seen:
                seen.add(cid)
                out.append(cid)
                todo.extend(children.get(cid, []))
        return out


def credit_parents(log: ParsedLog, config: dict, inherited: dict[str, tuple[str, str]],
                   given: set[str]) -> None:
    """Name the ancestor in `params_from` for each run column whose key the run took from it,
    and say so in a note, but for the columns an option sets (`given`: its note says so)."""
    if not inherited:
        return
    _, origin = scalars.config_params(config)
    taken: dict[str, list[str]] = {}
    for column, key in origin.items():
        if key in inherited and log.params_from.get(column, "").endswith(f"({key})"):
            parent = inherited[key][1]
            log.params_from[column] = f"MLflow params of the parent run {parent} ({key})"
            if column not in given:
                taken.setdefault(parent, []).append(f"{column} = {inherited[key][0]} ({key})")
    for parent, what in taken.items():
        log.notes.append(f"{', '.join(what)}: from the params of the parent run {parent} "
                         "(not logged by this run itself)")


def parent_note(name: str, why: str) -> str:
    """The note each imported run under a parent that was left out carries."""
    return f"the parent run {name} is not imported as a run of its own: {why}"
