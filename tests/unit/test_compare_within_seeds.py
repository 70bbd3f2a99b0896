"""compare's verdict beside a ratio: one schedule run's progress clock inside a batch's interval
over its seeds is said to show no difference; outside it, or against an open interval, the
ratio stands alone."""

from __future__ import annotations

from twoclocks_cli.clocks.compare import ConstantRow, _verdict
from twoclocks_cli.clocks.result import BatchRow
from twoclocks_cli.clocks.runclock import Clock, RunClocks
from twoclocks_cli.clocks.stats import Aggregate


def _row(b: int, median: float, low: float, high: float | None) -> ConstantRow:
    progress = Aggregate(n=3, median=median, low=low, high=high)
    failure = Aggregate(n=3, n_censored=3, lower_bound=3072)
    return ConstantRow(batch=BatchRow(batch_samples=b, n_runs=3, progress=progress,
                                      failure=failure),
                       final=0.55, failure_rules=[], reached=3, failed=0)


def _schedule(progress: float) -> RunClocks:
    return RunClocks(run_id=10, points=13, first_samples=0, last_samples=3072, initial=0.3,
                     final=0.55, best=0.6, progress=Clock(samples=progress, censored=False),
                     failure=Clock(censored_at=3072))


def test_a_clock_inside_the_seed_interval_shows_no_difference_and_one_outside_keeps_its_ratio():
    rows = [_row(16, 288, 232, 497), _row(256, 796, 620, 1702)]
    lines = _verdict(rows, _schedule(232))
    assert lines[0] == ("progress: the schedule reached the target at 232 samples vs 288 for the "
                        "smallest batch (B=16): 0.81x, inside B=16's 90% interval over its 3 "
                        "seeds [232, 497]: no difference shown")
    assert lines[1] == ("progress: the schedule reached the target at 232 samples vs 796 for the "
                        "largest batch (B=256): 0.29x")


def test_an_open_interval_claims_nothing_either_way():
    lines = _verdict([_row(16, 288, 232, None), _row(64, 384, 256, 610)], _schedule(300))
    assert lines[0].endswith("(B=16): 1.04x")
    assert lines[1].endswith("[256, 610]: no difference shown")
