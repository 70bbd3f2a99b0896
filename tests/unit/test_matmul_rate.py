"""bench/matmul_rate.py, the rate benches' shared part: the alternation's medians and the printed
rate against a hand computation."""

from __future__ import annotations

import argparse

from tests.support.bench import load_bench


def test_alternate_warms_up_once_then_alternates_and_takes_medians():
    calls, work_times, gemm_times = [], iter([9.0, 1.0, 3.0, 2.0]), iter([7.0, 5.0, 4.0, 6.0])

    def work():
        calls.append("w")
        return next(work_times)

    def gemm():
        calls.append("g")
        return next(gemm_times)

    medians = load_bench("matmul_rate").alternate(3, work, gemm)
    assert medians == (2.0, 5.0)  # of 1, 3, 2 and of 5, 4, 6
    assert calls == ["w", "g"] * 4


def test_the_rate_lines_are_the_hand_computed_rates():
    m = load_bench("matmul_rate")
    ap = argparse.ArgumentParser()
    m.rate_args(ap, "update")
    a = ap.parse_args(["--gemm", "1000", "--runs", "3", "--threads", "2"])
    # 2e9 useful FLOPs in 0.5 s = 4 GFLOP/s; a 1000^2 GEMM (2e9 FLOPs) in 0.2 s = 10 GFLOP/s
    lines, peak = m.rate_lines("update forward + backward", a, 0.5, 0.2, 2 * 10**9, 0.6)
    assert peak == 1e10
    assert lines == [
        "update forward + backward (float32): 500 ms (median of 3) = 4.0 useful GFLOP/s",
        "float32 GEMM 1000^2: 200.0 ms = 10.0 GFLOP/s peak (2 threads)",
        "update / peak: 0.40 (target >= 0.60)",
    ]
