"""`compare`'s phase display: an adaptive run's decisions that kept the batch are one segment."""

from __future__ import annotations

from twoclocks_cli.render.compare import merged_phases


def _ph(prompts, lr, start, end, steps):
    return {"prompts_per_batch": prompts, "lr": lr, "from_samples": start, "to_samples": end,
            "steps": steps}


def test_kept_batches_merge_under_a_warm_up_and_show_the_last_lr():
    """Three decisions at 64 prompts during a warm-up (the lr logged rises), then a switch to
    256 prompts: two segments, each with its last lr, its span and its steps summed."""
    phases = [_ph(64, 1e-4, 0, 1024, 2), _ph(64, 2e-4, 1024, 2048, 2),
              _ph(64, 3e-4, 2048, 3072, 2), _ph(256, 3e-4, 3072, 5120, 1),
              _ph(256, 4e-4, 5120, 7168, 1), _ph(64, 4e-4, 7168, 7680, 1)]
    assert merged_phases(phases) == [_ph(64, 3e-4, 0, 3072, 6), _ph(256, 4e-4, 3072, 7168, 2),
                                     _ph(64, 4e-4, 7168, 7680, 1)]
    assert phases[0] == _ph(64, 1e-4, 0, 1024, 2)  # the input is left as it was
