"""What bench/update_flops.py and bench/decode_flops.py share: SmolLM2 and one step's prompts of
`examples/smollm2-train.toml`, the matmul parameter count, and a square GEMM of the same dtype
timed alternately with the work so that a load change on the machine hits both."""

from __future__ import annotations

import argparse
import statistics
import time
import tomllib
from pathlib import Path
from typing import NamedTuple

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2-train.toml"


def rate_args(ap: argparse.ArgumentParser, work: str) -> None:
    """The options both benches take: runs, threads, the GEMM's side and the dtype."""
    ap.add_argument("--runs", type=int, default=10, help=f"Alternating runs of {work} and GEMM.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gemm", type=int, default=2048, help="Side of the square peak matmul.")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="The model's and the peak matmul's dtype.")


def matmul_params(model) -> tuple[int, int]:
    """(body, head): parameters multiplied per token by the transformer's nn.Linear layers and
    by the LM head (tied or not); embeddings are lookups, norms are vector work."""
    import torch

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


class Batch(NamedTuple):
    """SmolLM2 in one dtype, its tokenizer, a config for the example, and one step's prompts."""

    example: dict
    model: object
    tokenizer: object
    cfg: object
    prompts: list[str]


def smollm2_batch(dtype) -> Batch:
    """One step of the example: its prompts_per_batch problems (seed 0), each G times."""
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.config import TrainConfig
    from trainer.data import ArithmeticTask
    from trainer.smollm2 import SMOLLM2_ID
    from trainer.tiny import resolve_model_path

    example = tomllib.loads(EXAMPLE.read_text())
    path = resolve_model_path(SMOLLM2_ID)
    tok = AutoTokenizer.from_pretrained(str(path), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    cfg = TrainConfig(model=str(path), max_new_tokens=example["max_new_tokens"],
                      temperature=example["temperature"],
                      prompt_template=example["prompt_template"])
    problems = ArithmeticTask(max_value=example["arith_max_value"],
                              ops=tuple(example["arith_ops"])).sample(
        np.random.default_rng(0), example["prompts_per_batch"])
    prompts = [cfg.prompt_template.format(question=q.question)
               for q in problems for _ in range(example["group_size"])]
    return Batch(example, model, tok, cfg, prompts)


def gemm_timer(side: int, dtype):
    """Seconds one side x side matmul takes (the mean of 4), as a callable."""
    import torch

    x, y = (torch.randn(side, side, dtype=dtype) for _ in range(2))

    def gemm() -> float:
        t = time.perf_counter()
        for _ in range(4):
            torch.mm(x, y)
        return (time.perf_counter() - t) / 4

    return gemm


def alternate(runs: int, work, gemm) -> tuple[float, float]:
    """Medians of `runs` alternating timings of work() and gemm(), after one warm-up each."""
    work(), gemm()
    works, gemms = [], []
    for _ in range(runs):
        works.append(work())
        gemms.append(gemm())
    return statistics.median(works), statistics.median(gemms)


def rate_lines(what: str, a, seconds: float, gemm_s: float, flops: int,
               target: float) -> tuple[list[str], float]:
    """The printed rate of `what` against the GEMM peak, and the achieved / peak ratio."""
    achieved, peak = flops / seconds, 2 * a.gemm**3 / gemm_s
    return [f"{what} ({a.dtype}): {1000 * seconds:.0f} ms (median of {a.runs}) = "
            f"{achieved / 1e9:.1f} useful GFLOP/s",
            f"{a.dtype} GEMM {a.gemm}^2: {1000 * gemm_s:.1f} ms = {peak / 1e9:.1f} GFLOP/s peak "
            f"({a.threads} threads)",
            f"{what.split()[0]} / peak: {achieved / peak:.2f} (target >= {target:.2f})"], peak
