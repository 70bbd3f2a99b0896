"""A three-run batch sweep with known curves, written by the real trackers' own libraries (W&B
offline, MLflow on a local SQLite store, torch's TensorBoard SummaryWriter) as verl logs to
them, and by hand as the CSV the same curves make (and as a W&B panel export, which only W&B's
web page writes). Values are multiples of 1/1024, exact in TensorBoard's 32-bit floats too."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

PROMPTS = (4, 8, 16)
GROUP = 8
BUDGET = 16384  # samples per run
LR0 = 2.0 ** -10
REWARD, ENTROPY, EVAL = "critic/score/mean", "actor/entropy", "val-core/math/reward/mean@4"
STORE = {REWARD: "reward_mean", ENTROPY: "entropy", EVAL: "eval_accuracy"}


def lr_of(prompts: int) -> float:
    """sqrt scaling from LR0 at the smallest batch."""
    return LR0 * math.sqrt(prompts / PROMPTS[0])


def name_of(prompts: int) -> str:
    return f"bs{prompts * GROUP}"


def _q(x: float) -> float:
    return round(x * 1024) / 1024


def curve(prompts: int) -> dict[int, dict[str, float]]:
    """step -> verl key -> value: the evaluation before training at step 0 (samples 0), then
    a reward that rises (slower per sample at a larger batch) and falls after 9,000 samples,
    evaluated every 8 steps."""
    b = prompts * GROUP
    out: dict[int, dict[str, float]] = {0: {EVAL: _q(0.05)}}
    for s in range(1, BUDGET // b + 1):
        n = s * b
        r = 0.1 + 0.7 * (1 - math.exp(-n / (1500 * (1 + b / 256)))) - 0.7 / 8000 * max(0, n - 9000)
        out[s] = {REWARD: _q(r), ENTROPY: _q(1 - 0.5 * n / BUDGET)}
        if s % 8 == 0:
            out[s][EVAL] = _q(r - 0.05)
    return out


def verl_config(prompts: int) -> dict:
    """The part of verl's config the importers read."""
    return {"data": {"train_batch_size": prompts},
            "actor_rollout_ref": {"rollout": {"n": GROUP},
                                  "actor": {"optim": {"lr": lr_of(prompts)}}},
            "trainer": {"project_name": "sweep", "experiment_name": name_of(prompts)}}


def write_csv(folder: Path) -> list[Path]:
    """One CSV per run, in the store's names (what `ingest --format csv` reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for p in PROMPTS:
        rows = ["step,reward_mean,entropy,eval_accuracy"]
        for s, v in curve(p).items():
            rows.append(f"{s}," + ",".join(repr(v[k]) if k in v else "" for k in STORE))
        path = folder / f"{name_of(p)}.csv"
        path.write_text("\n".join(rows) + "\n")
        paths.append(path)
    return paths


def write_panel_csv(path: Path, widen: int = 0) -> Path:
    """The three runs as a W&B panel export ('Step, <run> - <metric>, ...__MIN, ...__MAX');
    `widen` rows get a __MIN/__MAX range (a downsampled panel)."""
    head = ["Step"]
    for p in PROMPTS:
        for k in STORE:
            head += [f"{name_of(p)} - {k}", f"{name_of(p)} - {k}__MIN", f"{name_of(p)} - {k}__MAX"]
    curves = {p: curve(p) for p in PROMPTS}
    lines = [",".join(f'"{h}"' for h in head)]
    for i, s in enumerate(sorted({s for c in curves.values() for s in c})):
        cells = [str(s)]
        for p in PROMPTS:
            for k in STORE:
                v = curves[p].get(s, {}).get(k)
                lo, hi = (v, v) if v is None or i >= widen else (v - 0.01, v + 0.01)
                cells += ["" if x is None else repr(x) for x in (v, lo, hi)]
        lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def _python(script: str, *args: str, env: dict | None = None, timeout: float = 120) -> None:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]


WANDB_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
             "WANDB_DISABLE_CODE": "true", "WANDB_API_KEY": ""}

_WANDB = r"""
import json, sys, time
import wandb
spec = json.loads(sys.argv[1])
for run in spec["runs"]:
    r = wandb.init(project="sweep", dir=spec["dir"], name=run["name"], id=run.get("id"),
                   resume=run.get("resume"), config=run["config"],
                   settings=wandb.Settings(silent=True, x_disable_stats=True))
    for step, row in run["rows"]:
        r.log(row, step=step) if run.get("explicit_step", True) else r.log(row)
        if run.get("sleep"):
            time.sleep(run["sleep"])
    r.finish()
"""


def write_wandb(folder: Path, runs: list[dict], timeout: float = 120) -> Path:
    """W&B offline runs under folder/wandb: each {"name", "config", "rows": [(step, {...})]}
    (optional "id", "resume", "explicit_step": False to let W&B count _step, "sleep")."""
    folder.mkdir(parents=True, exist_ok=True)
    _python(_WANDB, json.dumps({"dir": str(folder), "runs": runs}),
            env={**WANDB_ENV, "WANDB_DIR": str(folder)}, timeout=timeout)
    return folder / "wandb"


def wandb_sweep(folder: Path) -> Path:
    return write_wandb(folder, [{"name": name_of(p), "config": verl_config(p),
                                 "rows": sorted(curve(p).items())} for p in PROMPTS])


_MLFLOW = r"""
import json, sys, time, logging
logging.getLogger("mlflow").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
spec = json.loads(sys.argv[1])
client = MlflowClient(tracking_uri=spec["uri"])
ids = {}
for run in spec["runs"]:
    exp = run["experiment"]
    if exp not in ids:
        ids[exp] = client.create_experiment(exp)
    r = client.create_run(ids[exp], run_name=run["name"])
    t = int(time.time() * 1000)
    metrics = [Metric(k, v, t + i, step) for i, (step, row) in enumerate(run["rows"])
               for k, v in row.items()]
    params = [Param(k, str(v)) for k, v in run["params"].items()]
    for i in range(0, max(len(metrics), 1), 1000):
        client.log_batch(r.info.run_id, metrics=metrics[i:i + 1000],
                         params=params if i == 0 else [])
    client.set_terminated(r.info.run_id, run.get("status", "FINISHED"))
"""


def _verl_params(prompts: int) -> dict:
    """verl's MLflow logger: the config flattened with '/'."""
    def flat(tree, prefix=""):
        out = {}
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out
    return flat(verl_config(prompts))


def _verl_metrics(rows: dict) -> list:
    """verl's MLflow logger writes '@' as '_at_'."""
    return [(s, {k.replace("@", "_at_"): v for k, v in row.items()})
            for s, row in sorted(rows.items())]


def write_mlflow(uri: str, runs: list[dict], env: dict | None = None) -> None:
    """MLflow runs: each {"experiment", "name", "params", "rows": [(step, {...})]}."""
    _python(_MLFLOW, json.dumps({"uri": uri, "runs": runs}), env=env, timeout=180)


def mlflow_sweep(db: Path, experiment: str = "sweep") -> str:
    uri = f"sqlite:///{db}"
    write_mlflow(uri, [{"experiment": experiment, "name": name_of(p), "params": _verl_params(p),
                        "rows": _verl_metrics(curve(p))} for p in PROMPTS])
    return uri


def tensorboard_sweep(folder: Path) -> Path:
    """verl's tensorboard logger (add_scalar per key and step) under folder/<run>, with the
    run's config as add_hparams writes it."""
    from torch.utils.tensorboard import SummaryWriter

    for p in PROMPTS:
        w = SummaryWriter(str(folder / name_of(p)))
        for s, row in sorted(curve(p).items()):
            for k, v in row.items():
                w.add_scalar(k, v, s)
        w.add_hparams({"data.train_batch_size": p, "actor_rollout_ref.rollout.n": GROUP,
                       "actor_rollout_ref.actor.optim.lr": lr_of(p)}, {})
        w.close()
    return folder


# --- OpenRLHF (train_ppo_ray): its W&B and TensorBoard loggers, as its trainer calls them ---

ORLHF_PROMPTS, ORLHF_GROUP, ORLHF_LR, ORLHF_SEED = 8, 4, 2.0 ** -21, 1234  # exact in float32
ORLHF_STEPS, ORLHF_EVAL_EVERY = 12, 3


def openrlhf_config(prompts: int = ORLHF_PROMPTS, group: int = ORLHF_GROUP, lr: float = ORLHF_LR,
                    seed: int = ORLHF_SEED) -> dict:
    """Part of OpenRLHF's flat argparse namespace (`args.__dict__`, what its WandbLogger passes
    as the run's config): train_batch_size counts samples per optimizer update, not prompts."""
    return {"pretrain": "Qwen/Qwen2.5-0.5B-Instruct", "prompt_data": "openai/gsm8k",
            "rollout_batch_size": prompts, "micro_rollout_batch_size": 2,
            "n_samples_per_prompt": group, "train_batch_size": prompts * group // 2,
            "micro_train_batch_size": 2, "max_epochs": 1, "num_episodes": 1,
            "actor_learning_rate": lr, "critic_learning_rate": 9e-6, "seed": seed,
            "advantage_estimator": "group_norm", "init_kl_coef": 1e-3, "use_kl_loss": True,
            "eval_steps": ORLHF_EVAL_EVERY, "eval_n_samples_per_prompt": 4,
            "eval_temperature": 0.6, "logging_steps": 1, "save_steps": -1,
            "use_wandb": "KEY", "wandb_project": "openrlhf_train_ppo",
            "wandb_run_name": "qwen-gsm8k", "use_tensorboard": None}


def openrlhf_nested_config(prompts: int, group: int, lr: float, seed: int) -> dict:
    """The same settings under OpenRLHF's dotted options (`--rollout.batch_size`, ...), nested
    as its `hierarchize` nests them; the actor's AdamW lr beside an unused Muon lr."""
    return {"rollout": {"batch_size": prompts, "n_samples_per_prompt": group,
                        "micro_batch_size": 2},
            "train": {"batch_size": prompts * group // 2, "micro_batch_size": 2, "seed": seed},
            "actor": {"optim": "adam", "adam": {"lr": lr, "eps": 1e-8}, "muon": {"lr": 0.02}},
            "critic": {"optim": "adam", "adam": {"lr": 9e-6}},
            "eval": {"steps": ORLHF_EVAL_EVERY, "n_samples_per_prompt": 4},
            "logger": {"logging_steps": 1, "wandb": {"project": "openrlhf_train_ppo"}}}


def openrlhf_train(step: int) -> dict[str, float]:
    """What OpenRLHF's actor returns after global step `step` (its status dict: the loss, the
    lr, and the experience's info averaged), exact in 32-bit floats."""
    return {"policy_loss": _q(0.02 - step / 2048), "actor_lr": ORLHF_LR * min(1, step / 4),
            "reward": _q(0.2 + step / 32), "score": _q(0.2 + step / 32),
            "response_length": 200.0 + 8 * step, "total_length": 300.0 + 8 * step,
            "truncated": _q(step / 256), "return": _q(0.1 + step / 64),
            "kl": _q(step / 4096), "logprobs_diff": _q(step / 8192),
            "ppo_clip_ratio": _q(step / 1024), "ppo_kl": _q(step / 16384),
            "group_reward_std": _q(0.4 - step / 128)}


def openrlhf_eval(step: int, sources: tuple[str, ...] = ("gsm8k",), n: int = 4) -> dict:
    """OpenRLHF's evaluate() logs: pass@n and pass1 per data source, lengths, a count."""
    out: dict[str, float] = {}
    for i, ds in enumerate(sources):
        out[f"eval_{ds}_pass{n}"] = _q(0.5 + step / 64 - i / 16)
        out[f"eval_{ds}_pass1"] = _q(0.25 + step / 64 - i / 16)
        out[f"eval_{ds}_response_length_mean"] = 180.0 + step + i
    out["eval_response_length_mean"] = 180.0 + step
    out["eval_num_samples"] = 64.0 * n
    return out


_OPENRLHF_WANDB = r"""
import json, sys
from types import SimpleNamespace
import wandb

def hierarchize(tree):  # OpenRLHF's dotted options: nested namespaces (utils/config.py)
    return SimpleNamespace(**{k: hierarchize(v) if isinstance(v, dict) else v
                              for k, v in tree.items()})

spec = json.loads(sys.argv[1])
for run in spec["runs"]:
    # WandbLogger.__init__: the whole args namespace as config, its metrics on two step axes
    config = hierarchize(run["config"]).__dict__ if run.get("nested") else run["config"]
    wandb.init(project="openrlhf_train_ppo", dir=spec["dir"], name=run["name"],
               config=config, reinit=True,
               settings=wandb.Settings(silent=True, x_disable_stats=True))
    wandb.define_metric("train/global_step")
    wandb.define_metric("train/*", step_metric="train/global_step", step_sync=True)
    wandb.define_metric(run["eval_axis"])
    wandb.define_metric("eval/*", step_metric=run["eval_axis"], step_sync=True)
    table = wandb.Table(columns=["global_step", "text", "reward"])
    for step, train, evals in run["steps"]:
        # log_train: the sample table in a row of its own, then train/<k> with the global step
        table = wandb.Table(columns=table.columns, data=table.data)
        table.add_data(step, "Sample: 1+1=2", train["reward"])
        wandb.log({"train/generated_samples": table})
        wandb.log({"train/%s" % k: v for k, v in {**train, "global_step": step}.items()})
        if evals:  # log_eval: eval/<k> with eval/global_step, no train/global_step
            wandb.log({"eval/%s" % k: v for k, v in {**evals, "global_step": step}.items()})
    wandb.finish()
"""


def openrlhf_steps(sources: tuple[str, ...] = ("gsm8k",)) -> list:
    """[(global step, train status, eval logs or {})]: an evaluation every ORLHF_EVAL_EVERY."""
    return [(s, openrlhf_train(s), openrlhf_eval(s, sources) if s % ORLHF_EVAL_EVERY == 0
             else {}) for s in range(1, ORLHF_STEPS + 1)]


def write_openrlhf_wandb(folder: Path, runs: list[dict], timeout: float = 180) -> Path:
    """OpenRLHF runs as its WandbLogger writes them, offline, under folder/wandb: each
    {"name", "config", "steps": openrlhf_steps(...), "eval_axis": "eval/global_step" (its SFT,
    RM and DPO trainers) or "eval/epoch" (its PPO logger; the rows still carry
    eval/global_step), "nested": True for a config of dotted options (OpenRLHF after 0.9: its
    namespace of namespaces, as `openrlhf_nested_config` gives)}."""
    folder.mkdir(parents=True, exist_ok=True)
    _python(_OPENRLHF_WANDB, json.dumps({"dir": str(folder), "runs": runs}),
            env={**WANDB_ENV, "WANDB_DIR": str(folder)}, timeout=timeout)
    return folder / "wandb"


def write_openrlhf_tensorboard(folder: Path, name: str = "qwen-gsm8k",
                               sources: tuple[str, ...] = ("gsm8k",)) -> Path:
    """An OpenRLHF run as its TensorboardLogger writes it (torch's SummaryWriter under
    tensorboard_dir/run_name): train/<k> and eval/<k> scalars at the global step, the sample
    as text; no config."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(folder / name))
    for step, train, evals in openrlhf_steps(sources):
        w.add_text("train/generated_samples", "Sample:\\n1+1=2\\n\\nReward: 1.0000", step)
        for k, v in train.items():
            w.add_scalar(f"train/{k}", v, step)
        for k, v in evals.items():
            w.add_scalar(f"eval/{k}", v, step)
    w.close()
    return folder / name
