"""Peak RSS of a training step with its gradient sync: 2 data-parallel processes vs 1.

A ~57M-parameter Llama-shaped model (random init from a small config, fp32, CPU) takes training
steps of two micro-batches each (gradient accumulation) and an AdamW step, its forward the
trainer's own (`trainer.scorer.Scorer`: half of each row is prompt, half completion). After two
warm-up steps (optimizer state allocated, DDP's buckets rebuilt) each process resets its peak
RSS (`/proc/self/clear_refs`) and reads it (VmHWM) after one more step. Modes:

- `single`: one process, no sync (the reference);
- `ddp`: 2 processes through `trainer.dist` as the trainer runs them (accelerate-prepared DDP,
  gloo, gradients as bucket views, `no_sync` on the first micro-batch);
- `flat`: 2 processes with the hand-rolled sync the trainer had before (every gradient copied
  into one flat tensor, all-reduced, copied back), for comparison;
- `fsdp`: 2 processes sharded by `trainer.dist` as `accelerate launch --use_fsdp --fsdp_version
  2` selects it (`trainer.sharding`: each decoder layer a unit, gradients reduce-scattered
  after every micro-batch).

Prints each mode's per-rank peak (the larger rank), its ratio to `single`, and the extra memory
in units of one full copy of the gradients, twice: with glibc's allocator as it comes, and with
a fixed mmap threshold (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` = 128 KiB). glibc
raises its threshold after a large block is freed, so later large blocks come from a heap it
keeps resident after they are freed: RSS then counts memory no tensor holds, which penalises
FSDP's gather-and-free of each layer's weights. With the fixed threshold RSS follows the live
tensors, so the modes compare what they hold. Target: `ddp` carries no extra full copy (extra
well under 1.0 copies); `fsdp` holds half of parameters, gradients and AdamW moments per rank
(of 4 full copies: expect about 2 copies below `single`). Run on an otherwise idle machine
(the load average is printed).

    python bench/grad_sync_memory.py [--layers 8] [--hidden 512] [--seq 64] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _peak_reset() -> None:
    """Reset this process's peak RSS (Linux: VmHWM restarts from the current RSS)."""
    Path("/proc/self/clear_refs").write_text("5")


def _peak_mb() -> float:
    """This process's peak RSS since the last reset, MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _model(args):
    """The random-init Llama-shaped model of `args`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=args.hidden,
                      intermediate_size=args.hidden * 11 // 4, num_hidden_layers=args.layers,
                      num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def _flat_sum(model) -> None:
    """The trainer's former sync: all gradients concatenated, all-reduced, copied back."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def worker(args) -> None:
    """One process of one mode: warm up, reset the peak, one measured step; rank 0 writes JSON."""
    import torch

    from trainer.dist import Dist, setup_dist

    torch.set_num_threads(1)
    from trainer.scorer import Scorer

    if args.mode == "fsdp":  # what `accelerate launch --use_fsdp --fsdp_version 2` sets
        os.environ.update(ACCELERATE_USE_FSDP="true", FSDP_VERSION="2")
    dist = setup_dist() if args.mode in ("ddp", "fsdp") else Dist()
    if args.mode == "flat":
        torch.distributed.init_process_group("gloo")
        dist = Dist(torch.distributed.get_rank(), torch.distributed.get_world_size())
    model = _model(args)
    n_params = sum(p.numel() for p in model.parameters())
    net, opt = dist.prepare(model, Scorer(model),
                            lambda: torch.optim.AdamW(model.parameters(), lr=1e-5))
    gen = torch.Generator().manual_seed(dist.rank)
    p = args.seq // 2

    def step() -> None:
        dist.zero_grad(net, opt)
        for k in range(2):
            ids = torch.randint(0, 32000, (args.batch, args.seq), generator=gen)
            with dist.no_sync(net) if k == 0 else _null():
                logits = net(ids, torch.ones_like(ids), p)
                torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                  ids[:, p:].flatten()).backward()
        if args.mode == "flat":
            _flat_sum(model)
        opt.step()

    step()
    step()
    dist.barrier()
    _peak_reset()
    step()
    peak = _peak_mb()
    peaks = dist.sum([0.0] * dist.rank + [peak] + [0.0] * (dist.world - dist.rank - 1))
    if dist.rank == 0:
        Path(args.out).write_text(json.dumps({"peaks": peaks, "params": n_params}))


def _null():
    import contextlib

    return contextlib.nullcontext()


FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def run_mode(mode: str, args, tmp: Path, allocator: dict) -> dict:
    """Run `mode` (1 or 2 processes) with glibc settings `allocator`; return its JSON."""
    out = tmp / f"{mode}.json"
    script = [os.path.abspath(__file__), "--worker", mode, "--out", str(out),
              "--layers", str(args.layers), "--hidden", str(args.hidden),
              "--seq", str(args.seq), "--batch", str(args.batch)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")
           and k not in FIXED_MMAP} | allocator
    if mode == "single":
        cmd = [sys.executable, *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(_free_port()), *script]
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--worker", choices=["single", "ddp", "flat", "fsdp"])
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        args.mode = args.worker
        worker(args)
        return
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name, allocator in (("glibc as it comes", {}), ("fixed mmap threshold", FIXED_MMAP)):
        with tempfile.TemporaryDirectory() as tmp:
            res = {m: run_mode(m, args, Path(tmp), allocator)
                   for m in ("single", "ddp", "flat", "fsdp")}
        params = res["single"]["params"]
        grad_mb = params * 4 / 2**20
        base = max(res["single"]["peaks"])
        print(f"[{name}] model {params / 1e6:.1f}M parameters; one fp32 copy of the gradients "
              f"= {grad_mb:.0f} MB")
        print(f"{'mode':<8}{'peak RSS/rank MB':>18}{'ratio':>8}{'extra (grad copies)':>22}")
        for mode, r in res.items():
            peak = max(r["peaks"])
            print(f"{mode:<8}{peak:>18,.0f}{peak / base:>8.3f}{(peak - base) / grad_mb:>22.2f}")


def _free_port() -> int:
    """A TCP port nothing listens on now (each 2-process run gets its own rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
