"""trainer.adaptive.snapshot: a snapshot is a host copy that shares nothing with the live state, and
putting it back makes the next steps repeat exactly. The CUDA cases run only where torch sees a
GPU (scripts/gpu-check.sh runs them there); CI has none."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trainer.adaptive import snapshot

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: scripts/gpu-check.sh runs these"))]


class _Source:
    """A data position with the state()/load_state() pair the snapshot copies."""

    def __init__(self):
        self.pos = 0

    def state(self) -> dict:
        return {"pos": self.pos}

    def load_state(self, state: dict) -> None:
        self.pos = state["pos"]


def _run(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return SimpleNamespace(model=model, opt=opt, step=0, samples=0, source=_Source(),
                           data_rng=np.random.default_rng(0), device=device)


def _step(run) -> float:
    """One noisy step that reads every stream the snapshot restores."""
    x = (torch.randn(16, 6) + float(run.data_rng.normal())).to(run.device)
    loss = run.model(x).pow(2).mean()
    run.opt.zero_grad()
    loss.backward()
    run.opt.step()
    run.step += 1
    run.samples += 16
    run.source.pos += 16
    return float(loss)


@pytest.mark.parametrize("device", DEVICES)
def test_a_snapshot_is_a_host_copy_sharing_no_storage(device):
    run = _run(device)
    _step(run)
    snap = snapshot.take(run)
    live = dict(run.model.state_dict())
    for key, t in snap.model.items():
        assert t.device.type == "cpu"
        assert t.data_ptr() != live[key].data_ptr()
        assert torch.equal(t, live[key])
    moments = snap.optimizer["state"][0]
    assert moments["exp_avg"].data_ptr() != run.opt.state_dict()["state"][0]["exp_avg"].data_ptr()
    assert isinstance(snap.optimizer["param_groups"], list)


@pytest.mark.parametrize("device", DEVICES)
def test_putting_a_snapshot_back_repeats_the_next_steps_exactly(device):
    run = _run(device)
    for _ in range(3):
        _step(run)
    snap = snapshot.take(run)
    first = [_step(run) for _ in range(4)]
    weights = {k: v.clone() for k, v in run.model.state_dict().items()}
    snapshot.put(run, snap)
    assert (run.step, run.samples, run.source.pos) == (3, 48, 48)
    again = [_step(run) for _ in range(4)]
    assert again == first
    for key, t in run.model.state_dict().items():
        assert t.device.type == device  # put back on the parameters' device
        assert torch.equal(t, weights[key])
    assert run.opt.state_dict()["state"][0]["exp_avg"].device.type == device
    # the snapshot survives a put: a second replay is the same again
    snapshot.put(run, snap)
    assert [_step(run) for _ in range(4)] == first
