"""One place for SQL: only twoclocks_cli/store builds queries or opens sessions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUERY_NAMES = {"select", "insert", "update", "delete", "func", "text", "Session"}


def _offences(path: Path) -> list[str]:
    """Lines of `path` that import a query builder from sqlalchemy or open a Store session."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            names = {a.name for a in node.names} & QUERY_NAMES
            if names and node.module in ("sqlalchemy", "sqlalchemy.orm"):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {sorted(names)}")
        if isinstance(node, ast.Attribute) and node.attr == "session" and isinstance(
                node.ctx, ast.Load):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} opens a session")
    return out


def test_only_the_store_queries():
    files = [p for d in ("twoclocks_cli", "trainer") for p in (ROOT / d).rglob("*.py")
             if "store" not in p.relative_to(ROOT).parts[:2]]
    assert len(files) > 50
    offences = [o for p in files for o in _offences(p)]
    assert offences == []


def test_the_check_finds_a_raw_query(tmp_path):
    bad = ROOT / "twoclocks_cli" / "_probe_sql_boundary.py"
    try:
        bad.write_text("from sqlalchemy import select\n\ndef f(store):\n"
                       "    with store.session() as s:\n        return s.scalar(select(1))\n")
        found = _offences(bad)
    finally:
        bad.unlink()
    assert len(found) == 2 and "imports ['select']" in found[0]
