"""The vLLM CPU-share check against hand computation, and the node memory it reads."""

from __future__ import annotations

from twoclocks_cli.core.process import (
    cpu_share_problem,
    cpu_share_refusal,
    node_memory_bytes,
    process_rss_bytes,
)

GIB = 2**30


def test_a_share_under_one_gib_names_what_it_gives_and_what_to_use():
    node = int(12.21 * GIB)
    # 0.05 x 12.21 GiB = 0.61 GiB < 1 GiB; 1 / 12.21 = 0.0819, rounded up to 0.09
    problem = cpu_share_problem(0.05, node)
    assert "0.61 GiB here" in problem and "(12.2 GiB)" in problem
    assert problem.endswith("use at least 0.09")
    assert cpu_share_problem(0.09, node) is None and cpu_share_problem(0.0819, node) is not None
    assert cpu_share_problem(0.5, GIB // 2).endswith("use at least 1")  # a node under 1 GiB


# vLLM 0.32's CPU worker on SmolLM2 at a share of 0.05 of a 23.54 GiB node, as it raised it
VLLM_REFUSAL = ("Available memory on node 0 (21.9/23.54 GiB) on kv cache allocation is less than "
                "requested memory for kv (-0.57/1.18 GiB). Reduce CPU memory used by other "
                "processes.")


def test_vllms_refusal_names_what_the_process_holds_and_what_to_use():
    node, rss = int(23.54 * GIB), int(1.75 * GIB)
    # (1.75 + 1) GiB / 23.54 GiB = 0.1168, rounded up to 0.12
    problem = cpu_share_refusal(VLLM_REFUSAL, 0.05, node, rss)
    assert "1.18 GiB here" in problem and "the 1.75 GiB this process holds" in problem
    assert problem.endswith("use at least 0.12")
    assert cpu_share_refusal("Model architectures ['Foo'] are not supported", 0.05, node, rss) \
        is None


def test_the_process_memory_is_the_kernels_figure():
    with open("/proc/self/status") as fh:
        rss = int(next(ln for ln in fh if ln.startswith("VmRSS:")).split()[1]) * 1024
    # both read the same counter a moment apart
    assert abs(process_rss_bytes() - rss) < 64 * 2**20


def test_the_node_memory_is_the_kernels_figure():
    with open("/proc/meminfo") as fh:
        total = int(next(ln for ln in fh if ln.startswith("MemTotal:")).split()[1]) * 1024
    node = node_memory_bytes()
    assert 0 < node <= total  # node 0 holds at most what the machine has
    assert node_memory_bytes(node=10_000) > 0  # no such node: the machine's total instead
