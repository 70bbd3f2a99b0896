"""The floors of the code: every import, function-level ones included, goes to a lower floor or
stays in its own room; no module imports itself back through others; a private name (`_x`) is
read only inside its own package; the trainer stands on the ground floor alone; no command
imports another; a renderer is handed data and never reads the store; documents have one codec.

Read from the source with `ast` (nothing is imported), so a lazy import inside a function counts
as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# From the ground up; a room is a package or module prefix. A module belongs to the room with the
# longest matching prefix.
FLOORS = [
    ["twoclocks_cli.core", "twoclocks_cli"],  # the package root holds only __version__
    ["twoclocks_cli.store", "twoclocks_cli.theory", "trainer"],
    ["twoclocks_cli.ingest"],  # foreign logs into the store's names
    ["twoclocks_cli.clocks"],  # reads an imported run's source names to accept them as aliases
    # the runtime controller steers on the clocks' noise estimates; a run's batch trajectory;
    # the sim backend's branch runner for the controller's rule "branch"
    ["twoclocks_cli.adaptive.controller", "twoclocks_cli.adaptive.trajectory",
     "twoclocks_cli.adaptive.sim_branch"],
    ["twoclocks_cli.integrations"],  # code that runs inside someone else's trainer
    ["twoclocks_cli.backends"],
    ["twoclocks_cli.config"],  # the planner asks the backends
    ["twoclocks_cli.suggest", "twoclocks_cli.adaptive.probe"],  # they plan sweeps
    ["twoclocks_cli.launch"],
    ["twoclocks_cli.gather"],  # what a command shows, collected from the store and the clocks
    ["twoclocks_cli.render"],
    ["twoclocks_cli.options", "twoclocks_cli.crash"],
    ["twoclocks_cli.export"],  # checks its output path with the options' own rule
    ["twoclocks_cli.commands"],
    ["twoclocks_cli.app"],
    ["twoclocks_cli.__main__"],
]


def _modules(root: Path = ROOT, pkgs: tuple[str, ...] = ("twoclocks_cli", "trainer")
             ) -> dict[str, Path]:
    """Dotted name -> file of every module of the packages under `root`."""
    out = {}
    for pkg in pkgs:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


@dataclass
class Scan:
    """What one module reads from the project: the modules it imports and the private names
    (module, name) it takes from them."""

    imports: set[str] = field(default_factory=set)
    private: set[tuple[str, str]] = field(default_factory=set)


def _is_private(name: str) -> bool:
    """`_x` is private; a dunder (`__version__`) is not."""
    return name.startswith("_") and not name.endswith("__")


def _longest(target: str, known: set[str]) -> str | None:
    """The longest known module `target` names or lies in (None: not the project's)."""
    parts = target.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or None


def _from_module(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an `from ... import` reads, relative ones resolved against `name`."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    prefix = base[: len(base) - node.level + 1] if node.level else []
    return ".".join(prefix + ([node.module] if node.module else []))


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` of a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _scan_import(node: ast.Import, known: set[str], scan: Scan, aliases: dict) -> None:
    """`import a.b.c [as m]`: the module, the name it binds, a private part of its path."""
    for alias in node.names:
        module = _longest(alias.name, known)
        if module:
            scan.imports.add(module)
        if alias.asname:
            aliases[alias.asname] = alias.name
        else:
            head = alias.name.split(".")[0]
            aliases[head] = head
        parts = alias.name.split(".")
        for i, part in enumerate(parts[1:], 1):  # `import pkg._mod` reads pkg's private module
            if _is_private(part) and _longest(".".join(parts[:i]), known):
                scan.private.add((".".join(parts[:i]), part))


def _scan_from(name: str, path: Path, node: ast.ImportFrom, known: set[str], scan: Scan,
               aliases: dict) -> None:
    """`from m import x [as y]`: submodule x, else module m; a private x read from m."""
    module = _from_module(name, path, node)
    owner = _longest(module, known)
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        if sub in known:
            scan.imports.add(sub)
            aliases[alias.asname or alias.name] = sub
        elif owner:
            scan.imports.add(owner)
        if owner and _is_private(alias.name):
            scan.private.add((module if module in known else owner, alias.name))


def _scan(name: str, path: Path, known: set[str]) -> Scan:
    """The project modules `name` imports and the private names it reads from them, as
    `from m import _x`, `import m._x` or `m._x` through a name an import bound."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scan, aliases = Scan(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            _scan_import(node, known, scan, aliases)
        elif isinstance(node, ast.ImportFrom):
            _scan_from(name, path, node, known, scan, aliases)
    for node in ast.walk(tree):  # after every import, so a lazy one's alias counts too
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = _dotted(node.value)
            head, _, rest = (base or "").partition(".")
            if head in aliases:
                module = ".".join(filter(None, (aliases[head], rest)))
                if module in known:
                    scan.private.add((module, node.attr))
    scan.imports.discard(name)
    return scan


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, resolved to the longest known module name."""
    return _scan(name, path, known).imports


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


def _scans(root: Path = ROOT, pkgs: tuple[str, ...] = ("twoclocks_cli", "trainer")
           ) -> dict[str, Scan]:
    """Every module's scan."""
    mods = _modules(root, pkgs)
    known = set(mods)
    return {name: _scan(name, path, known) for name, path in sorted(mods.items())}


def _edges() -> list[tuple[str, str]]:
    return [(a, b) for a, scan in _scans().items() for b in sorted(scan.imports)]


def _cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """The import graph's strongly connected parts of more than one module (Tarjan), each
    sorted: every module in one reaches every other and is reached back."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _package(module: str, packages: set[str]) -> str:
    """The package a module lies in (a package's own __init__ lies in itself)."""
    return module if module in packages else module.rpartition(".")[0]


def _foreign_private(scans: dict[str, Scan], packages: set[str]) -> list[str]:
    """`importer -> module._name` for every private name read from another package."""
    return [f"{a} -> {m}.{n}" for a, scan in scans.items() for m, n in sorted(scan.private)
            if _package(a, packages) != _package(m, packages)]


def _packages(root: Path = ROOT, pkgs: tuple[str, ...] = ("twoclocks_cli", "trainer")
              ) -> set[str]:
    """The dotted names that are packages (a folder with an __init__.py)."""
    return {n for n, p in _modules(root, pkgs).items() if p.name == "__init__.py"}


def test_every_import_goes_down_a_floor_or_stays_in_its_room():
    upward = []
    for a, b in _edges():
        (fa, ra), (fb, rb) = _room(a), _room(b)
        if ra != rb and fb >= fa:
            upward.append(f"{a} -> {b}")
    assert not upward, "imports that do not go down a floor:\n" + "\n".join(upward)


def test_no_import_cycle():
    """A cycle inside one room passes the floor rule, but its modules can only be read (and
    loaded) together: none may exist."""
    cycles = _cycles(_edges())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_private_names_stay_in_their_package():
    """`_x` is free to change with its module's package; another package must not lean on it."""
    bad = _foreign_private(_scans(), _packages())
    assert not bad, "private names read from another package:\n" + "\n".join(bad)


def test_the_trainer_imports_only_the_ground_floor():
    bad = [f"{a} -> {b}" for a, b in _edges()
           if a.startswith("trainer") and b.startswith("twoclocks_cli")
           and not b.startswith("twoclocks_cli.core")]
    assert not bad, "\n".join(bad)


def test_no_command_imports_another_command():
    bad = [f"{a} -> {b}" for a, b in _edges()
           if a.startswith("twoclocks_cli.commands.") and b.startswith("twoclocks_cli.commands.")]
    assert not bad, "\n".join(bad)


def _store_readers(root: Path = ROOT) -> list[str]:
    """`module.function` of every render function that takes a `store` parameter, and
    `module -> store` for every render module that imports the store."""
    bad = []
    mods = _modules(root)
    for name, path in sorted(mods.items()):
        if not name.startswith("twoclocks_cli.render"):
            continue
        bad += [f"{name} -> {m}" for m in sorted(_scan(name, path, set(mods)).imports)
                if m.startswith("twoclocks_cli.store")]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                if any(a.arg == "store" for a in params):
                    bad.append(f"{name}.{node.name}(store)")
    return bad


def test_renderers_receive_data_and_never_read_the_store():
    """A command gathers (gather/, clocks/) and hands `render/` the result: a renderer that
    reads the store climbs back down the floors it sits on."""
    bad = _store_readers()
    assert not bad, "renderers that read the store:\n" + "\n".join(bad)


def test_the_store_rule_finds_a_renderer_that_reads_it(tmp_path):
    pkg = tmp_path / "twoclocks_cli" / "render"
    pkg.mkdir(parents=True)
    (tmp_path / "twoclocks_cli" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "page.py").write_text("def draw(store, out):\n    return store.runs()\n")
    (tmp_path / "twoclocks_cli" / "store.py").write_text("")
    (pkg / "table.py").write_text("def rows():\n    from twoclocks_cli import store\n")
    assert _store_readers(tmp_path) == ["twoclocks_cli.render.page.draw(store)",
                                        "twoclocks_cli.render.table -> twoclocks_cli.store"]


def _hand_written_codecs(root: Path = ROOT) -> list[str]:
    """`module.Class.method` of every to_json/from_json written outside core.codec."""
    bad = []
    for name, path in sorted(_modules(root).items()):
        if name == "twoclocks_cli.core.codec":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bad += [f"{name}.{node.name}.{f.name}" for f in node.body
                        if isinstance(f, ast.FunctionDef) and f.name in ("to_json", "from_json")]
    return bad


def test_documents_have_one_codec():
    """Results and options become JSON and come back through core.codec.Document alone: a
    second, hand-written writer drifts from the first (key order, ints read back as floats)."""
    bad = _hand_written_codecs()
    assert not bad, "hand-written to_json/from_json:\n" + "\n".join(bad)


def test_the_codec_rule_finds_a_hand_written_one(tmp_path):
    pkg = tmp_path / "twoclocks_cli"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "doc.py").write_text("class A:\n    def to_json(self):\n        return {}\n")
    assert _hand_written_codecs(tmp_path) == ["twoclocks_cli.doc.A.to_json"]


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


def _write(root: Path, files: dict[str, str]) -> None:
    """A package tree under `root`: relative path -> source."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_a_cycle_and_a_foreign_private_name(tmp_path):
    """Both new rules must be able to fail: a lazy cycle inside one package, and private names
    read from another package (from-import, attribute of an imported module, private module),
    while a private name read inside its own package passes."""
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import g\n\ndef _helper():\n    pass\n",
        "pkg/b.py": "def g():\n    from . import a\n    return a._helper\n",  # same package
        "pkg/low/__init__.py": "",
        "pkg/low/_inner.py": "",
        "pkg/low/c.py": "from pkg.a import _helper\n",
        "pkg/low/d.py": "import pkg.a as mod\n\ndef f():\n    return mod._helper()\n",
        "pkg/low/e.py": "def f():\n    import pkg.a\n    return pkg.a._helper\n",
        "pkg/f.py": "from pkg.low import _inner\n",
        "pkg/g.py": "from pkg.low.c import x\n",  # no private name: fine
    })
    scans = _scans(tmp_path, ("pkg",))
    edges = [(a, b) for a, scan in scans.items() for b in scan.imports]
    assert _cycles(edges) == [["pkg.a", "pkg.b"]]
    assert _cycles([(a, b) for a, b in edges if (a, b) != ("pkg.b", "pkg.a")]) == []
    assert sorted(_foreign_private(scans, _packages(tmp_path, ("pkg",)))) == [
        "pkg.f -> pkg.low._inner", "pkg.low.c -> pkg.a._helper",
        "pkg.low.d -> pkg.a._helper", "pkg.low.e -> pkg.a._helper"]


def test_the_cycle_check_on_a_crafted_graph():
    """Three modules in a ring are one cycle; a tail into it and a self-contained pair are not
    mixed up with it."""
    edges = [("x.a", "x.b"), ("x.b", "x.c"), ("x.c", "x.a"), ("x.d", "x.a"),
             ("y.p", "y.q"), ("y.q", "y.p")]
    assert _cycles(edges) == [["x.a", "x.b", "x.c"], ["y.p", "y.q"]]
