"""OpenRLHF runs as its W&B and TensorBoard loggers keep them (`train_ppo_ray` and its trainers).

- Metrics are `train/<k>` at `train/global_step` and `eval/<k>` at `eval/global_step` (W&B logs
  each in rows of their own; TensorBoard at the global step); its status names are `reward`,
  `kl` (to the reference model, the initial policy), `policy_loss`, `actor_lr`,
  `response_length`, `truncated`, `ppo_clip_ratio`, `ppo_kl`, `entropy_loss`.
- One global step is one rollout of `rollout_batch_size` prompts x `n_samples_per_prompt`
  completions, then the updates on them (`train_batch_size` counts samples per optimizer
  update, not the step's batch); the first step logged is 1: samples = step x prompts x n.
- The lr is `actor_learning_rate` (`critic_learning_rate` is the value model's), the seed
  `seed`. Since its dotted options (`--rollout.batch_size`) the argparse namespace is nested and
  W&B keeps each group as its repr, `namespace(batch_size=8, ...)`: read here as literals.
- Held-out accuracy is `eval_<source>_pass1` (pass@1, the mean reward over the eval samples);
  with several sources none is chosen (a note says so; `--map` picks one).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Mapping

from twoclocks_cli.ingest.base import flat_config

# store key -> OpenRLHF's status names, as `normal_name` leaves them (`train/` taken off)
KEYS: dict[str, tuple[str, ...]] = {
    "reward_mean": ("reward",),
    "kl_init": ("kl",),
    "loss": ("policy_loss",),
    "lr": ("actor_lr",),
    "resp_len_mean": ("response_length",),
    "truncated_frac": ("truncated",),
    "clip_frac": ("ppo_clip_ratio",),
    "approx_kl": ("ppo_kl",),
    "entropy": ("entropy_loss",),
}
# run column -> config keys: the flat argparse name (up to 0.9), then the dotted one (later)
PARAMS: dict[str, tuple[str, ...]] = {
    "batch_prompts": ("rollout_batch_size", "rollout.batch_size"),
    "group_size": ("n_samples_per_prompt", "rollout.n_samples_per_prompt"),
    "lr": ("actor_learning_rate", "actor.adam.lr"),
    "seed": ("seed", "train.seed"),
}
_INTEGERS = ("batch_prompts", "group_size", "seed")
# status keys no other trainer's logger writes under `train/`
_OWN_KEYS = ("train/actor_lr", "train/policy_loss")
PASS1 = re.compile(r"^eval/eval_(.+)_pass1$")
STEP_KEY, EVAL_STEP_KEY = "train/global_step", "eval/global_step"
_MAX_REPR = 1 << 20


def expand(config: Mapping) -> dict:
    """The config with each `namespace(...)` repr W&B kept read back into a dict of literals
    (an argument that is no literal is left out)."""
    out = {}
    for key, value in config.items():
        if isinstance(value, str) and value.startswith("namespace(") and len(value) < _MAX_REPR:
            tree = _namespace(value)
            out[key] = value if tree is None else tree
        elif isinstance(value, Mapping):
            out[key] = expand(value)
        else:
            out[key] = value
    return out


def _namespace(text: str) -> dict | None:
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return _call(node)


def _call(node) -> dict | None:
    """A `namespace(a=..., b=namespace(...))` call as a dict; None for any other expression."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "namespace" and not node.args):
        return None
    out = {}
    for kw in node.keywords:
        if kw.arg is None:
            continue
        inner = _call(kw.value)
        if inner is not None:
            out[kw.arg] = inner
            continue
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return out


def recognise(config: Mapping, keys: Iterable[str]) -> str:
    """What marks a run as OpenRLHF's, in words ("" when nothing does): its config's rollout
    keys, else status or eval keys only its loggers write."""
    flat = flat_config(expand(config))
    for prompts, group in zip(PARAMS["batch_prompts"], PARAMS["group_size"], strict=True):
        if prompts in flat and group in flat:
            return f"its config's {prompts} and {group}"
    have = set(keys)
    own = [k for k in _OWN_KEYS if k in have] or sorted(k for k in have if PASS1.match(k))[:1]
    return f"its {own[0]}" if own else ""


def params(config: Mapping) -> tuple[dict, dict[str, str]]:
    """{run column: value} from an OpenRLHF config, and the key each came from. With the Muon
    optimizer the actor has two lrs: none is taken (the peak logged one is used)."""
    flat = flat_config(expand(config))
    out, origin = {}, {}
    for column, keys in PARAMS.items():
        for key in keys:
            v = flat.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if column == "lr" and key == "actor.adam.lr" and flat.get("actor.optim") == "muon":
                continue
            if column == "lr":
                v = float(v)
            elif column in _INTEGERS and math.isfinite(v) and v == int(v):
                v = int(v)
            out[column], origin[column] = v, key
            break
    return out, origin


def filtering_note(config: Mapping) -> str:
    """A note when dynamic filtering was on ("" otherwise): then a step generates groups until
    rollout_batch_size of them pass, and samples count the completions trained on."""
    flat = flat_config(expand(config))
    if flat.get("dynamic_filtering") is True or flat.get("algo.dynamic_filtering_enable") is True:
        return ("dynamic filtering was on: a step generates prompts until rollout_batch_size "
                "groups pass the filter, so samples count the completions trained on, not all "
                "those generated (train/dynamic_filtering_pass_rate is the share kept)")
    return ""


def pass1_keys(keys: Iterable[str]) -> list[str]:
    """The held-out pass@1 keys logged, one per eval data source."""
    return sorted(k for k in keys if PASS1.match(k))

