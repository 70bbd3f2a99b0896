"""The two clocks: crossings, collapse rules, aggregation, B_crit fits, invariance, schedule."""

from twoclocks_cli.clocks.analysis import analyze_sweep
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.clocks.result import Analysis
from twoclocks_cli.clocks.schedule import make_schedule, to_toml

__all__ = ["Analysis", "AnalysisOptions", "analyze_sweep", "make_schedule", "to_toml"]
