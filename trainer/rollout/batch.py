"""The rollout batch every engine returns (`Rollout`) and builds from its raw samples
(`assemble`). Apart from the package's `make_engine`, so the engines and the factory that picks
them do not import each other."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """Sampled completions of N prompts, as one left-padded token matrix.

    `input_ids`/`attention_mask` are [N, P+C] (prompt left-padded to P, completion right-padded
    to C); `completion_mask` [N, C] marks completion tokens up to and including the first EOS;
    `truncated` [N] is True where no EOS came within max_new_tokens; `sampler_logp` [N, C] is
    the engine's log-prob of each sampled token at the sampling temperature (NaN off the mask
    or where the engine gave none; None when it gave none at all). `sampler_entropy` [N, C]
    (NaN off the mask) comes only from an engine whose numbers are the training policy's own
    to float rounding — its forward's math on its live weights in the trainer's precision (the
    HF engine's decode loop, `rollout_dtype` unset or equal to `dtype`) —
    so the trainer may use them, with `sampler_logp`, in place of a forward of its own.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_len: int
    texts: list[str]
    truncated: torch.Tensor
    sampler_logp: torch.Tensor | None = None
    sampler_entropy: torch.Tensor | None = None

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len :]

    def select(self, index: torch.Tensor) -> Rollout:
        """The rows `index` of this rollout (same padding)."""
        idx = index.tolist()
        return Rollout(
            self.input_ids[index],
            self.attention_mask[index],
            self.completion_mask[index],
            self.prompt_len,
            [self.texts[i] for i in idx],
            self.truncated[index],
            None if self.sampler_logp is None else self.sampler_logp[index],
            None if self.sampler_entropy is None else self.sampler_entropy[index],
        )


def assemble(
    prompt_ids, prompt_mask, completion_ids, eos_id: int, pad_id: int, tokenizer
) -> Rollout:
    """A Rollout from left-padded prompts and raw sampled completions (after EOS: anything)."""
    is_eos = completion_ids == eos_id
    has_eos = is_eos.any(dim=1)
    first = torch.where(
        has_eos,
        is_eos.int().argmax(dim=1),
        torch.full_like(has_eos, completion_ids.shape[1], dtype=torch.long),
    )
    pos = torch.arange(completion_ids.shape[1]).unsqueeze(0)
    cmask = (pos <= first.unsqueeze(1)).long()
    completion_ids = torch.where(
        cmask.bool(), completion_ids, torch.full_like(completion_ids, pad_id)
    )
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return Rollout(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=torch.cat([prompt_mask.long(), cmask], dim=1),
        completion_mask=cmask,
        prompt_len=prompt_ids.shape[1],
        texts=texts,
        truncated=~has_eos,
    )
