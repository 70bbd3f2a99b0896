"""Stand-ins shaped as vLLM's outputs (vllm.outputs, vllm.logprobs; fields as in vLLM 0.27-0.30),
for the vLLM engine's tests in the main venv, which has no vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    index: int = 0
    text: str = ""


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
