"""Load a script of bench/ as a module: the benches are run as files, not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str):
    """bench/<name>.py, executed as a fresh module named `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
