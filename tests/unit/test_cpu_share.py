"""The vLLM CPU-share check against hand computation, and the node memory it reads."""

from __future__ import annotations

from twoclocks_cli.core.process import cpu_share_problem, node_memory_bytes

GIB = 2**30


def test_a_share_under_one_gib_names_what_it_gives_and_what_to_use():
    node = int(12.21 * GIB)
    # 0.05 x 12.21 GiB = 0.61 GiB < 1 GiB; 1 / 12.21 = 0.0819, rounded up to 0.09
    problem = cpu_share_problem(0.05, node)
    assert "0.61 GiB here" in problem and "(12.2 GiB)" in problem
    assert problem.endswith("use at least 0.09")
    assert cpu_share_problem(0.09, node) is None and cpu_share_problem(0.0819, node) is not None
    assert cpu_share_problem(0.5, GIB // 2).endswith("use at least 1")  # a node under 1 GiB


def test_the_node_memory_is_the_kernels_figure():
    with open("/proc/meminfo") as fh:
        total = int(next(ln for ln in fh if ln.startswith("MemTotal:")).split()[1]) * 1024
    node = node_memory_bytes()
    assert 0 < node <= total  # node 0 holds at most what the machine has
    assert node_memory_bytes(node=10_000) > 0  # no such node: the machine's total instead
