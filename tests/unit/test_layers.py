"""The floors of the code: every import, function-level ones included, goes to a lower floor or
stays in its own room; the trainer stands on the ground floor alone; no command imports another.

Read from the source with `ast` (nothing is imported), so a lazy import inside a function counts
as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# From the ground up; a room is a package or module prefix. A module belongs to the room with the
# longest matching prefix.
FLOORS = [
    ["twoclocks_cli.core", "twoclocks_cli"],  # the package root holds only __version__
    ["twoclocks_cli.store", "twoclocks_cli.theory", "trainer"],
    ["twoclocks_cli.ingest"],  # foreign logs into the store's names
    ["twoclocks_cli.clocks"],  # reads an imported run's source names to accept them as aliases
    # the runtime controller steers on the clocks' noise estimates; a run's batch trajectory
    ["twoclocks_cli.adaptive.controller", "twoclocks_cli.adaptive.trajectory"],
    ["twoclocks_cli.integrations"],  # code that runs inside someone else's trainer
    ["twoclocks_cli.backends"],
    ["twoclocks_cli.config"],  # the planner asks the backends
    ["twoclocks_cli.suggest", "twoclocks_cli.adaptive.probe"],  # they plan sweeps
    ["twoclocks_cli.launch"],
    ["twoclocks_cli.render"],
    ["twoclocks_cli.options", "twoclocks_cli.crash"],
    ["twoclocks_cli.export"],  # checks its output path with the options' own rule
    ["twoclocks_cli.commands"],
    ["twoclocks_cli.app"],
    ["twoclocks_cli.__main__"],
]


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the two packages."""
    out = {}
    for pkg in ("twoclocks_cli", "trainer"):
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, resolved to the longest known module name."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join(prefix + ([node.module] if node.module else []))
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and ".".join(parts) != name:
                found.add(".".join(parts))
    return found


def _room(module: str) -> tuple[int, str]:
    """(floor, room) of a module."""
    best = None
    for floor, rooms in enumerate(FLOORS):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and \
                    (best is None or len(room) > len(best[1])):
                best = (floor, room)
    assert best is not None, f"{module} is on no floor: add its room to FLOORS"
    return best


def _edges() -> list[tuple[str, str]]:
    mods = _modules()
    known = set(mods)
    return [(a, b) for a, path in sorted(mods.items()) for b in sorted(_imports(a, path, known))]


def test_every_import_goes_down_a_floor_or_stays_in_its_room():
    upward = []
    for a, b in _edges():
        (fa, ra), (fb, rb) = _room(a), _room(b)
        if ra != rb and fb >= fa:
            upward.append(f"{a} -> {b}")
    assert not upward, "imports that do not go down a floor:\n" + "\n".join(upward)


def test_the_trainer_imports_only_the_ground_floor():
    bad = [f"{a} -> {b}" for a, b in _edges()
           if a.startswith("trainer") and b.startswith("twoclocks_cli")
           and not b.startswith("twoclocks_cli.core")]
    assert not bad, "\n".join(bad)


def test_no_command_imports_another_command():
    bad = [f"{a} -> {b}" for a, b in _edges()
           if a.startswith("twoclocks_cli.commands.") and b.startswith("twoclocks_cli.commands.")]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The rule must be able to fail: a function-level and a relative import are both found."""
    pkg = tmp_path / "twoclocks_cli" / "core"
    pkg.mkdir(parents=True)
    mod = pkg / "numbers.py"
    mod.write_text("def f():\n    from twoclocks_cli.commands import runs\n"
                   "from ..launch import sweeps\n")
    known = {"twoclocks_cli.commands.runs", "twoclocks_cli.launch.sweeps",
             "twoclocks_cli.core.numbers"}
    found = _imports("twoclocks_cli.core.numbers", mod, known)
    assert found == {"twoclocks_cli.commands.runs", "twoclocks_cli.launch.sweeps"}
    assert _room("twoclocks_cli.commands.runs")[0] > _room("twoclocks_cli.core.numbers")[0]
