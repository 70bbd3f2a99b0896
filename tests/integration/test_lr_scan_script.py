"""examples/tiny-arith-lr-scan.sh writes one train config per PROMPTS:LR pair from its
environment; the configs it writes are valid train configs with the asked task, and a bad
operator list is one line and exit 2 before anything is written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "tiny-arith-lr-scan.sh"


def _run(tmp_path, *pairs, **env):
    """The script with a stand-in for `twoclocks` that only makes the run's workdir: what is
    under test is the config it writes (the training itself is tested elsewhere)."""
    stand_in = tmp_path / "twoclocks"
    stand_in.write_text('#!/usr/bin/env bash\nwhile [ "$#" -gt 0 ]; do\n'
                        '  [ "$1" = --workdir ] && mkdir -p "$2"; shift\ndone\n')
    stand_in.chmod(0o755)
    full = {**os.environ, "TWOCLOCKS_SCAN_OUT": str(tmp_path / "scan"),
            "TWOCLOCKS_BIN": str(stand_in), **env}
    return subprocess.run(["bash", str(SCRIPT), *pairs], capture_output=True, text=True,
                          env=full, timeout=60)


def test_the_scan_writes_valid_configs_for_the_asked_task(tmp_path):
    from trainer.config import load_config

    r = _run(tmp_path, "16:3.5e-4", TWOCLOCKS_SCAN_MAX_VALUE="49", TWOCLOCKS_SCAN_OPS="+",
             TWOCLOCKS_SCAN_BUDGET="65536")
    assert r.returncode == 0, r.stderr
    cfg = load_config(tmp_path / "scan" / "p16-lr3.5e-4.toml")
    assert (cfg.arith_max_value, cfg.arith_ops, cfg.prompts_per_batch, cfg.lr,
            cfg.sample_budget) == (49, ["+"], 16, 3.5e-4, 65536)
    r = _run(tmp_path, "4:2e-4")
    assert r.returncode == 0, r.stderr
    cfg = load_config(tmp_path / "scan" / "p4-lr2e-4.toml")
    assert (cfg.arith_max_value, cfg.arith_ops) == (99, ["+", "-"])


def test_a_bad_operator_list_is_one_line(tmp_path):
    r = _run(tmp_path, "16:3.5e-4", TWOCLOCKS_SCAN_OPS="+;/")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "TWOCLOCKS_SCAN_OPS='+;/'" in r.stderr
    assert not (tmp_path / "scan").exists()
