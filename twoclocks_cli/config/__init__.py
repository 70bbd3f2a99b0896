"""Sweep configs: the TOML models, loading with one-line errors, and planning into cells."""

from twoclocks_cli.config.load import load_config, parse_config
from twoclocks_cli.config.models import SweepConfig
from twoclocks_cli.config.plan import Cell, Plan, cell_hash, plan, scaled_lr

__all__ = ["Cell", "Plan", "SweepConfig", "cell_hash", "load_config", "load_plan", "parse_config",
           "plan", "scaled_lr"]


def load_plan(config) -> Plan:
    """Load and plan a sweep config file (ConfigError on any problem); its relative paths are
    read from the file's folder."""
    from pathlib import Path

    cfg = load_config(config)
    return plan(cfg, str(config), config_dir=str(Path(config).parent))
