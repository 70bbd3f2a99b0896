"""Foreign metric names → the store's metric names, for TRL, verl and generic tables.

Each store key lists the source keys that mean it, newest naming first; the first one present in a
file wins for the whole file (so a file never mixes two sources for one key). Names that depend on
the user's reward functions or data sources (TRL `rewards/<fn>/mean`, verl
`val-core/<source>/reward/mean@N`) are resolved by the format modules and added as explicit picks.
Keys as HF's tracker callbacks log them (`train/reward`, `eval/rewards/acc/mean`) are looked up
under the trainer's own names (`console_name`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from twoclocks_cli.core.errors import ConfigError

TRL_KEYS: dict[str, tuple[str, ...]] = {
    "reward_mean": ("reward",),
    "reward_std": ("reward_std",),
    "zero_std_frac": ("frac_reward_zero_std",),
    "entropy": ("entropy",),
    "kl_init": ("kl",),  # TRL's reference model is the initial policy
    "clip_frac": ("clip_ratio/region_mean", "clip_ratio"),
    "clip_frac_low": ("clip_ratio/low_mean",),
    "clip_frac_high": ("clip_ratio/high_mean",),
    "resp_len_mean": ("completions/mean_length", "completion_length"),
    "resp_len_max": ("completions/max_length",),
    "truncated_frac": ("completions/clipped_ratio",),
    "grad_norm": ("grad_norm",),
    "loss": ("loss",),
    "lr": ("learning_rate",),
    "time_step_s": ("step_time",),  # seconds per optimizer step (TRL >= 0.20)
    "time_total_s": ("train_runtime",),  # seconds of the whole training (its summary entry)
    "num_tokens": ("num_tokens",),  # tokens seen so far, prompts and completions (running total)
}

VERL_KEYS: dict[str, tuple[str, ...]] = {
    "reward_mean": ("critic/score/mean",),
    "entropy": ("actor/entropy", "actor/entropy_loss"),
    # verl's reference policy is the initial one; old verl put that KL in the reward (critic/kl)
    "kl_init": ("actor/kl_loss", "critic/kl"),
    "approx_kl": ("actor/ppo_kl",),
    "clip_frac": ("actor/pg_clipfrac",),
    "grad_norm": ("actor/grad_norm",),
    "loss": ("actor/pg_loss",),
    "lr": ("actor/lr",),
    "resp_len_mean": ("response_length/mean",),
    "resp_len_max": ("response_length/max",),
    "truncated_frac": ("response_length/clip_ratio",),
    "time_gen_s": ("timing_s/gen", "timing/gen"),
    "time_reward_s": ("timing_s/reward", "timing/reward"),
    "time_update_s": ("timing_s/update_actor", "timing/update_actor"),
    "tokens_per_s": ("perf/throughput",),
}

# Every metric name a backend writes (common brief); tables may use them directly.
STORE_KEYS = (
    "reward_mean", "reward_std", "accuracy", "eval_accuracy", "entropy", "kl_init", "drift_abs",
    "drift_rel", "grad_norm", "grad_sq_micro", "grad_sq_full", "grad_micro_size",
    "grad_full_size", "lr", "batch_samples", "prompts", "phase", "clip_frac", "clip_frac_low",
    "clip_frac_high", "approx_kl", "zero_std_frac", "resp_len_mean", "resp_len_max",
    "truncated_frac", "time_gen_s", "time_reward_s", "time_update_s", "tokens_per_s", "loss",
    "nonfinite", "eval_n", "grad_l1_micro", "grad_l1_full", "grad_sign_dot", "grad_l1_diff",
    "time_step_s", "num_tokens", "sampler_abs_logratio", "sampler_kl_k3", "tis_weight_mean",
    "tis_capped_frac", "time_total_s",
)

# Columns a table may use for its x axes (besides what --map names), first found wins: the
# trainer's own step before W&B's `_step`, which counts every log call (HF's evaluations and a
# completions table each take one); verl logs at its global step, so its `_step` is that step,
# and its `training/global_step` is absent from the evaluation before training. LLaMA-Factory's
# trainer_log.jsonl names the global step `current_steps`.
STEP_COLUMNS = ("step", "global_step", "train/global_step", "trainer/global_step", "_step",
                "training/global_step", "current_steps")
SAMPLES_COLUMN = "samples"
AXES = ("step", "samples")


# keys only preference (DPO-style) trainers log; keys only RL (GRPO/PPO) trainers log
PREFERENCE_KEYS = frozenset({"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                             "rewards/margins", "logps/chosen", "logps/rejected"})
RL_KEYS = frozenset({"reward", "reward_std", "frac_reward_zero_std", "completion_length",
                     "completions/mean_length", "kl", "clip_ratio", "clip_ratio/region_mean",
                     "critic/score/mean", "critic/rewards/mean", "reward_mean"})
# LLaMA-Factory's trainer_log.jsonl: its progress columns, and `accuracy` copied from the
# trainer's rewards/accuracies (only its preference trainers log it; its PPO logs `reward`)
_LLAMA_FACTORY = {"current_steps", "total_steps", "percentage", "elapsed_time"}


def console_name(key: str) -> str:
    """A key as the trainer's console names it: HF's tracker callbacks (W&B, TensorBoard,
    MLflow) log `loss` as `train/loss` and `eval_reward` as `eval/reward`."""
    if key.startswith("train/"):
        return key[len("train/"):]
    if key.startswith("eval/"):
        return "eval_" + key[len("eval/"):]
    return key


def not_rl(keys: Iterable[str], mapped: Iterable[str] = ()) -> str | None:
    """Why a log with these metric names is not an RL run's (its 'accuracy' would be no
    progress clock), or None when it may be one: a preference trainer's keys, LLaMA-Factory's
    trainer log without a reward, verl's SFT trainer's `train/loss` without a reward. Keys are
    judged under their console names too (HF's `train/reward` is TRL's `reward`); `mapped`: the
    store keys `--map` names, a reward among them answering `train/loss` (never a preference
    trainer's keys: its accuracy is no verifiable reward whatever the map says)."""
    keys = set(keys)
    have = keys | {console_name(k) for k in keys}
    if have & RL_KEYS or any(k.startswith(("rewards/", "val-core/")) and k not in
                             PREFERENCE_KEYS for k in have):
        return None
    if pref := sorted(have & PREFERENCE_KEYS):
        return (f"a preference-training (DPO-style) log ({', '.join(pref[:3])}): "
                "rewards/accuracies is preference accuracy, not a verifiable reward")
    if _LLAMA_FACTORY <= have:
        what = ("its accuracy is the trainer's rewards/accuracies, preference accuracy (DPO-"
                "style)" if "accuracy" in have else "it logs no reward (SFT)")
        return f"a LLaMA-Factory trainer_log.jsonl without a reward: {what}"
    if "train/loss" in have and not (have | set(mapped)) & {"reward_mean", "accuracy",
                                                           "eval_accuracy"}:
        return "an SFT log (train/loss and no reward, as verl's SFT trainer logs)"
    return None


def refuse_not_rl(where, keys: Iterable[str], mapped: Iterable[str] = ()) -> None:
    """ConfigError naming why the log at `where` is not an RL run's, when it is not."""
    if why := not_rl(keys, mapped):
        raise ConfigError(f"{where}: {why}; only RL runs (GRPO, PPO) have the two clocks; "
                          "nothing imported")


def parse_map(items: Iterable[str]) -> dict[str, str]:
    """`--map step=global_step,reward_mean=rew` (repeatable) → {store key: source column}."""
    out: dict[str, str] = {}
    for item in items:
        for pair in item.split(","):
            pair = pair.strip()
            if not pair:
                continue
            target, sep, source = pair.partition("=")
            target, source = target.strip(), source.strip()
            if not sep or not target or not source:
                raise ConfigError(f"--map {pair!r}: expected STORE_KEY=SOURCE_COLUMN")
            if target not in STORE_KEYS and target not in AXES:
                allowed = ", ".join(AXES + STORE_KEYS)
                raise ConfigError(
                    f"--map {pair!r}: unknown store key {target!r} (allowed: {allowed})"
                )
            out[target] = source
    return out


def choose_sources(
    present: Iterable[str], table: Mapping[str, tuple[str, ...]], explicit: Mapping[str, str]
) -> dict[str, str]:
    """For each store key, the one source key to read in this file: explicit, else first present."""
    have = set(present)
    picks = {k: v for k, v in explicit.items() if k not in AXES}
    for target, candidates in table.items():
        if target in picks:
            continue
        for cand in candidates:
            if cand in have:
                picks[target] = cand
                break
    return picks


def apply(record: Mapping[str, float], picks: Mapping[str, str]) -> dict[str, float]:
    """One record (source key → number) in store names; adds `nonfinite` when loss/grad blew up."""
    out = {target: record[src] for target, src in picks.items() if src in record}
    if any(not math.isfinite(out[k]) for k in ("loss", "grad_norm") if k in out):
        out["nonfinite"] = 1.0
    return out


def unmapped(present: Iterable[str], picks: Mapping[str, str], ignore: Iterable[str] = ()) -> set:
    used = set(picks.values()) | set(ignore)
    return {k for k in present if k not in used}


def store_key_of(configs: Iterable[Mapping | None], name: str) -> str | None:
    """The store key that `name` was imported as, when `name` is a source key of imported runs
    (verl's `critic/score/mean` is stored as `reward_mean`, TRL's `reward` too), read from each
    run's own import record (`config["ingest"]["sources"]`: store key -> source key); None when
    no run imported a key by that name (a store key, or no import at all). Runs that stored it
    under different keys (a table imported with --map) make the name ambiguous: ConfigError."""
    found: dict[str, None] = {}
    for config in configs:
        ingest = (config or {}).get("ingest")
        sources = ingest.get("sources") if isinstance(ingest, Mapping) else None
        if not isinstance(sources, Mapping):
            continue
        for target, source in sources.items():
            if source == name and target not in AXES:
                found[target] = None
    if len(found) > 1:
        raise ConfigError(f"metric {name!r} is the source of {', '.join(found)} in different "
                          "imported runs: name the store key instead")
    return next(iter(found), None)
