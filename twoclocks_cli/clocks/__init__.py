"""The two clocks: crossings, collapse rules, aggregation, B_crit fits, invariance, schedule.

The names below load on first use (PEP 562), so a command that only needs the options model
(`clocks.options`, which `analyze --help` is built from) does not import numpy."""

from importlib import import_module

_HOMES = {"analyze_sweep": "analysis", "AnalysisOptions": "options", "Analysis": "result",
          "make_schedule": "schedule", "to_toml": "schedule"}

__all__ = ["Analysis", "AnalysisOptions", "analyze_sweep", "make_schedule", "to_toml"]


def __getattr__(name: str):
    """`twoclocks_cli.clocks.NAME`: the name from the submodule that defines it."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
