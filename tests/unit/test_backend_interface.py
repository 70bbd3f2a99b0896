"""Every backend module gives the planner the same members, so the planner never names one."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from twoclocks_cli.backends import BACKENDS, SweepBackend, sweep_backend

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = sorted(n for n in dir(SweepBackend) if not n.startswith("_")) + ["ADAM_KEYS", "LINE_KEY",
                                                                              "TABLE"]


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_module_has_the_whole_interface(name):
    module = sweep_backend(name)
    missing = [m for m in MEMBERS if not hasattr(module, m)]
    assert not missing, f"{name}: {missing}"
    for member in MEMBERS:
        if member.isupper() or member == "LINE_KEY":
            continue
        want = list(inspect.signature(getattr(SweepBackend, member)).parameters)[1:]
        got = list(inspect.signature(getattr(module, member)).parameters)
        assert got == want, (name, member, got)
    assert len(module.ADAM_KEYS) == 3 and isinstance(module.TABLE, str)


@pytest.mark.subprocess
def test_the_planner_names_no_backend_and_imports_no_torch():
    text = (ROOT / "twoclocks_cli" / "config" / "plan.py").read_text()
    assert not [ln for ln in text.splitlines()
                if any(s in ln for s in ("backend ==", "backend in", "backend !="))]
    code = "import sys, twoclocks_cli.config.plan; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
