"""The docs: the mkdocs site builds in strict mode, and every `bash tested` shell block in
README.md and docs/*.md runs and prints what the ```text block after it shows.

The convention is described in docs/development.md ("Tested shell blocks in the docs"): a block
runs with bash in a new temporary folder holding a copy of examples/, with this interpreter's
bin/ first on PATH and the store, cache and crash folders inside that temporary folder. It must
exit 0; when the next fenced block, with only blank lines between, is a ```text block, each of
its non-empty lines (stripped) must appear in the block's output (stdout and stderr together).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^[ ]*(?P<fence>`{3,})(?P<info>.*)$")
LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)\s]*)?\)")
BLOCK_TIMEOUT_S = 300


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    body: str
    end: int  # 0-based index of the closing fence line


def fenced_blocks(path: Path) -> list[Block]:
    """The top-level fenced blocks of a Markdown file (a fence inside a longer fence is text)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group("fence"), m.group("info").strip(), i
        j = i + 1
        while j < len(lines):
            close = FENCE.match(lines[j])
            if close and close.group("fence") == fence and not close.group("info").strip():
                break
            j += 1
        else:
            raise AssertionError(f"{path}:{start + 1}: fence {fence}{info} is never closed")
        blocks.append(Block(path, start + 1, info, "\n".join(lines[start + 1:j]) + "\n", j))
        i = j + 1
    return blocks


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def find_tested_blocks() -> list[tuple[Block, list[str]]]:
    """Every `bash tested` block with the lines its output must contain."""
    found = []
    for path in doc_files():
        blocks = fenced_blocks(path)
        lines = path.read_text(encoding="utf-8").split("\n")
        for k, block in enumerate(blocks):
            if block.info != "bash tested":
                continue
            expected: list[str] = []
            if k + 1 < len(blocks):
                nxt = blocks[k + 1]
                between = lines[block.end + 1:nxt.line - 1]
                if nxt.info == "text" and all(not ln.strip() for ln in between):
                    expected = [ln.strip() for ln in nxt.body.split("\n") if ln.strip()]
            found.append((block, expected))
    return found


TESTED = find_tested_blocks()


def test_there_are_tested_blocks():
    # the finder must not pass by finding nothing (a changed fence style, a moved page)
    assert len(TESTED) >= 3, [f"{b.path.name}:{b.line}" for b, _ in TESTED]


@pytest.mark.subprocess  # bash runs the block
@pytest.mark.parametrize(
    "block,expected", TESTED, ids=[f"{b.path.relative_to(ROOT)}:{b.line}" for b, _ in TESTED])
def test_tested_block_runs(block: Block, expected: list[str], tmp_path: Path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TWOCLOCKS_") and k not in ("COLUMNS", "LINES")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["TWOCLOCKS_DB"] = f"sqlite:///{tmp_path / 'twoclocks.db'}"
    env["TWOCLOCKS_CACHE"] = str(tmp_path / "cache")
    env["TWOCLOCKS_CRASH_DIR"] = str(tmp_path / "crashes")
    proc = subprocess.run(
        ["bash", "-c", "set -eo pipefail\n" + block.body], cwd=tmp_path, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=BLOCK_TIMEOUT_S)
    where = f"{block.path.relative_to(ROOT)}:{block.line}"
    assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{proc.stdout}"
    missing = [line for line in expected if line not in proc.stdout]
    assert not missing, f"{where}: output lacks {missing}\n--- output ---\n{proc.stdout}"


@pytest.mark.subprocess  # mkdocs builds the site
def test_mkdocs_build_strict(tmp_path: Path):
    # mkdocs is the `docs` extra (scripts/setup.sh installs it): missing, this test fails
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert (tmp_path / "site" / "index.html").is_file()


def test_readme_is_short_and_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text
    targets = [m.group("target") for m in LINK.finditer(text)]
    assert any(t.startswith("docs/") for t in targets)
    broken = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not broken, broken
