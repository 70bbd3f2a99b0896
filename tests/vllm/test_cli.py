"""What the CLI refuses on vLLM's CPU build before anything is written, through the real CLI."""

from __future__ import annotations

from tests.support.cli import assert_one_line_error, twoclocks


def test_sleep_mode_is_refused_before_the_store_is_touched(tmp_path):
    """vLLM's CPU worker ignores sleep and wake: `twoclocks train` names the setting in one
    line, exit 2, and writes no store (the engine itself refuses too, if it is started)."""
    config = tmp_path / "sleep.toml"
    config.write_text('model = "builtin:tiny-arith"\nrollout_engine = "vllm"\n'
                      'vllm_enable_sleep_mode = true\nvllm_sleep_level = 2\nsample_budget = 128\n')
    db = tmp_path / "s.db"
    proc = twoclocks("train", str(config), "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert_one_line_error(proc, "sleep.toml", "vllm_enable_sleep_mode", "CPU build", code=2)
    assert not db.exists()


def test_a_cpu_share_below_the_workers_own_memory_is_refused_before_the_store(tmp_path):
    """On vLLM's CPU build gpu_memory_utilization is a share of the memory node: a share worth
    half a GiB here is refused in one line naming the key and the share to use, exit 2, no
    store (vLLM's own worker would fail at start-up with a traceback)."""
    from twoclocks_cli.core.process import node_memory_bytes

    share = round(0.5 * 2**30 / node_memory_bytes(), 4)
    config = tmp_path / "share.toml"
    config.write_text('model = "builtin:tiny-arith"\nrollout_engine = "vllm"\n'
                      f'vllm_gpu_memory_utilization = {share}\nsample_budget = 128\n')
    db = tmp_path / "s.db"
    proc = twoclocks("train", str(config), "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert_one_line_error(proc, "share.toml", "vllm_gpu_memory_utilization", "use at least",
                          code=2)
    assert not db.exists()
