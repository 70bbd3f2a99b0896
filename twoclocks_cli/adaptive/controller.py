"""The in-run two-clock controller: `batch_schedule = "adaptive"` picks the batch while training.
A room of the adaptive package on the clocks' floor: the backends run it, and it reads only the
clocks' noise estimates, their live drop rule and analysis.

How it decides (every `adapt_every` samples, from per-step signals the run already logs):

- progress phase: the batch becomes clamp(overhead * kappa * B_noise, batch_min, batch_max)
  rounded to whole prompts (kappa * B_noise estimates the local B_crit; `overhead` is the share
  of it to run at: McCandlish's E(B) = E_min (1 + B/B_crit) makes that (1 + overhead) x the
  fewest samples; at overhead 1 the theory-model runs took 1.00-1.37x the best constant's
  samples, at 0.1 within 1.1x), moved by at most a factor `max_change` per decision. B_noise
  is the gradient noise scale from EMAs of its two-batch terms, as `analyze` computes it:
  McCandlish's B_simple = tr(S)/|G|^2 (noise = "euclidean", from grad_sq_micro/grad_sq_full)
  or the sign-descent B_sign (noise = "sign", from the l1 terms; see twoclocks_cli.clocks.noise).
  `kappa` (default 1) corrects for noise in directions that do not matter for progress; it can
  be calibrated from an analysed sweep (`from_sweep`: its recommended B_crit over the median
  noise scale of its smallest batch's runs).
- failure guard: with a `drift_threshold` (given, or from `from_sweep`: the lowest drift at
  which its runs failed), when the drift projected over the next `lookahead` samples at the
  rate of the last decision interval (the rate of drift^2: noise-driven drift is a random walk,
  its square grows linearly in samples) crosses `safety * drift_threshold`, the batch switches to
  `batch_max` (where a per-step cap slows the drift per sample) and stays there. The guard does
  not wait for the change bound: failing is worse than a jolt to Adam's moments. It does not
  fire at the first `guard_warmup` decisions: early drift is the descent from the initial point
  (fast, then saturating), which the random-walk projection would carry forward as if it went on.
  Beside the drift, the guard watches the progress metric (`collapse_key`, when the step's
  signals carry it): the live drop rule (clocks.collapse.LiveFalls, the analysis's rule on a
  trailing mean) declaring a collapse sends the batch to `batch_max` at that step, warm-up or
  not (a collapse is observed, not projected).
- lr follows the scaling rule from the reference (batch, lr): lr = lr_ref (B / B_ref)^alpha;
  under `grow_lr = "hold"` a batch above the starting one keeps the starting batch's lr.

With `rule = "guard"` the progress phase holds the starting batch (`start = "best"`: the
largest doubling of batch_min at or below the sweep's fastest batch to the target; or
"b_crit") and only the guard moves it: the two-clock schedule with the switch timed by the run's
own drift instead of the sweep's failure clock.

With `rule = "branch"` the progress phase measures instead of trusting B_noise: at each decision
the backend runs two short branches (B and 2B) from the run's state (`observe`'s `brancher`);
the batch grows for the failure clock when B's measured drift would cross the threshold and a
larger batch drifts less, else for the progress clock when 2B keeps `grow_ratio` of B's progress
per sample. The run continues from the chosen branch and the other's samples are charged.

The options are `trainer.adaptive.config.AdaptiveConfig` (a training option: the trainer
reads them without this package). The controller is pure python/numpy (no torch), its
state a JSON-able dict (exact resume); `start` builds one for a run, calibrated from the
store or restored from a checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from trainer.adaptive.config import AdaptiveConfig
from trainer.ports import BranchResult
from twoclocks_cli.clocks.collapse import LiveFalls
from twoclocks_cli.core.errors import ConfigError

SCALING = {"sqrt": 0.5, "linear": 1.0, "constant": 0.0}
DRIFT_KEYS = ("drift_rel", "drift_abs", "kl_init")
MODES = {"progress": 0, "guard": 1}
# the calibration key of the sweep's batch each `start` begins at or below
START_KEY = {"best": "best_batch", "b_crit": "b_crit"}
# the branch rule grows for the failure clock only where drift^2 per sample falls at least this
# steeply with the batch (a power-law slope): where it is flat (Adam under sqrt scaling without a
# cap) a larger batch does not delay failure, and a noisy slope near 0 must not move the batch
DRIFT_SLOPE = -0.25


def schedule_of(cell: dict, where: str = "cell", table: str = "adaptive") -> AdaptiveConfig | None:
    """The cell's AdaptiveConfig when `batch_schedule = "adaptive"`, else None (checked);
    `table` is how errors name the [adaptive] table (a sweep's: sim.adaptive)."""
    mode = cell.get("batch_schedule")
    if mode is None or mode == "phases":
        if cell.get("adaptive") is not None:
            raise ConfigError(f"{where}: [adaptive] is set but batch_schedule is not "
                              "\"adaptive\" (allowed: \"adaptive\", \"phases\")")
        return None
    if mode != "adaptive":
        raise ConfigError(f"{where}: batch_schedule = {mode!r}: allowed are \"adaptive\" and "
                          "\"phases\" (the default)")
    if cell.get("phases"):
        raise ConfigError(f"{where}: batch_schedule = \"adaptive\" and [[phases]] both set: the "
                          "controller picks the batch, remove the phases")
    return AdaptiveConfig.from_dict(cell.get("adaptive"), table)


@dataclass
class Decision:
    """One decision: the new batch and lr, the mode, the signals used and the reason."""

    index: int
    step: int
    samples: float
    prompts: int
    lr: float
    mode: str
    signals: dict
    reason: str

    def metrics(self) -> dict:
        """The decision as step metrics (`decision_metrics`)."""
        return decision_metrics(self)


@dataclass
class ControllerState:
    """Everything the controller carries between steps (JSON-able: saved with checkpoints)."""

    prompts: int
    lr: float
    mode: str = "progress"
    decisions: int = 0
    next_decision: float = 0.0
    emas: list | None = None  # euclidean: [|G|^2, tr S]; sign: [P, A, b, r]
    last_drift: float | None = None
    last_drift_samples: float = 0.0
    drift_rate: float | None = None
    drift: float | None = None
    b_noise: float | None = None
    kappa: float = 1.0
    drift_threshold: float | None = None
    calibration: dict = field(default_factory=dict)
    keeps: int = 0  # rule branch: decisions in a row that kept the batch (the back-off)
    start_prompts: int | None = None  # the first steps' batch (grow_lr hold's lr cap)
    live: LiveFalls | None = None  # the live drop rule on collapse_key (a dict in a checkpoint)

    def __post_init__(self):
        """A checkpoint's dict back into the live drop rule it was saved from."""
        if isinstance(self.live, dict):
            self.live = LiveFalls(**self.live)


class Controller:
    """Picks the next step's batch (prompts) and lr from the steps so far."""

    def __init__(self, cfg: AdaptiveConfig, group_size: int, run_prompts: int, run_lr: float,
                 state: dict | None = None, calibration: dict | None = None):
        self.cfg = cfg
        self.group_size = int(group_size)
        self.ref_prompts = cfg.reference_prompts or int(run_prompts)
        self.ref_lr = cfg.reference_lr or float(run_lr)
        if state is not None:
            self.state = ControllerState(**state)
            return
        cal = calibration or {}
        kappa = cfg.kappa if cfg.kappa is not None else cal.get("kappa", 1.0)
        thr = cfg.drift_threshold if cfg.drift_threshold is not None else cal.get(
            "drift_threshold")
        start = cfg.start_prompts or start_batch(cfg, self.group_size,
                                                 cal.get(START_KEY.get(cfg.start, "")))
        self.state = ControllerState(prompts=start, lr=self.lr_for(start),
                                     next_decision=float(cfg.adapt_every), kappa=float(kappa),
                                     drift_threshold=None if thr is None else float(thr),
                                     calibration=dict(cal), last_drift_samples=0.0,
                                     start_prompts=start)

    # -- what the loop reads ---------------------------------------------------------------

    @property
    def prompts(self) -> int:
        return self.state.prompts

    @property
    def lr(self) -> float:
        return self.state.lr

    @property
    def batch(self) -> int:
        return self.state.prompts * self.group_size

    @property
    def decisions(self) -> int:
        """Decisions taken so far: the phase index of the next step."""
        return self.state.decisions

    def mode_metrics(self) -> dict:
        """The mode the next step runs in, as a step metric (`MODES`)."""
        return {"adaptive_mode": MODES[self.state.mode]}

    def lr_for(self, prompts: int) -> float:
        """lr at `prompts` by the scaling rule from the reference (batch, lr)."""
        return self.ref_lr * (prompts / self.ref_prompts) ** SCALING[self.cfg.scaling]

    def lr_at(self, prompts: int) -> float:
        """The lr a batch of `prompts` runs at (a branch's too): the scaling rule's, capped
        under grow_lr "hold" at the starting batch's."""
        cap = self.state.start_prompts if self.cfg.grow_lr == "hold" else None
        return self.lr_for(prompts if cap is None else min(prompts, cap))

    def due(self, samples: float) -> bool:
        """Whether a step ending at `samples` is a scheduled decision, so a backend can write
        its row (with its evaluation, which `observe` must see) before observing it."""
        return samples >= self.state.next_decision

    def to_dict(self) -> dict:
        """The state for a checkpoint (restore with Controller(..., state=this))."""
        return asdict(self.state)

    def metrics(self) -> dict:
        """Step metrics of the current setting and the signals of the last decision."""
        s = self.state
        out = {"batch_samples": self.batch, "prompts": s.prompts, "phase": s.decisions,
               "lr": s.lr, "adaptive_mode": MODES[s.mode], "adaptive_kappa": s.kappa}
        for key, value in (("adaptive_b_noise", s.b_noise), ("adaptive_drift", s.drift),
                           ("adaptive_drift_rate", s.drift_rate)):
            if value is not None and math.isfinite(value):
                out[key] = value
        return out

    # -- the per-step update ---------------------------------------------------------------

    def observe(self, step: int, samples: float, signals: dict,
                brancher=None) -> Decision | None:
        """Fold one step's signals in; at a decision point set the next batch and return why.

        signals: the step's metrics (grad_* terms, grad_micro_size, grad_full_size, the drift
        key); missing or non-finite terms are skipped. brancher (rule "branch"): called at a
        decision with the batches to try (prompts) and the samples each spends, it runs them
        from the current state and returns one BranchResult each; the backend then continues
        from the branch of the chosen batch (`Decision.prompts`) and charges the others.
        A step carrying `collapse_key` feeds the live drop rule; the step at which it declares
        a collapse is a decision too (the guard's), whenever it comes."""
        s = self.state
        self._fold(signals)
        d = signals.get(self.cfg.drift_key)
        if d is not None and math.isfinite(float(d)):
            s.drift = float(d)
            if s.last_drift is None:
                s.last_drift, s.last_drift_samples = s.drift, float(samples)
        collapsed = self._collapsed(samples, signals)
        if samples < s.next_decision and not collapsed:
            return None
        while s.next_decision <= samples:
            s.next_decision += self.cfg.adapt_every
        return self._decide(step, float(samples), brancher)

    def _collapsed(self, samples: float, sig: dict) -> bool:
        """Feed the progress metric to the live drop rule; True when it declares a collapse
        here while the guard has not yet fired (a collapse is acted on once, at once)."""
        key, s = self.cfg.collapse_key, self.state
        value = None if key == "none" else _f(sig, key)
        if value is None:
            return False
        if s.live is None:
            s.live = LiveFalls(patience=self.cfg.collapse_patience)
        return s.live.push(samples, value) and s.mode != "guard"

    def _fold(self, sig: dict) -> None:
        """EMA of the noise terms of this step (as clocks.stats / clocks.noise smooth them)."""
        terms = _terms(self.cfg.noise, sig)
        if terms is None:
            return
        a = self.cfg.noise_ema
        s = self.state
        s.emas = list(terms) if s.emas is None else [
            a * x + (1 - a) * e for x, e in zip(terms, s.emas, strict=True)]
        s.b_noise = _scale(self.cfg.noise, s.emas)

    def _decide(self, step: int, samples: float, brancher=None) -> Decision:
        cfg, s = self.cfg, self.state
        old_p, old_lr = s.prompts, s.lr
        if s.drift is not None and s.last_drift is not None and samples > s.last_drift_samples:
            # noise-driven drift is a random walk: its square grows linearly in samples
            s.drift_rate = max(s.drift**2 - s.last_drift**2, 0.0) / (
                samples - s.last_drift_samples)
            s.last_drift, s.last_drift_samples = s.drift, samples
        projected = None
        if s.drift is not None and s.drift_rate is not None:
            projected = math.sqrt(s.drift**2 + s.drift_rate * cfg.lookahead)
        signals = {"b_noise": s.b_noise, "kappa": s.kappa, "drift": s.drift,
                   "drift_rate": s.drift_rate, "drift_projected": projected,
                   "drift_threshold": s.drift_threshold}
        limit = None if s.drift_threshold is None else cfg.safety * s.drift_threshold
        warm = s.decisions < cfg.guard_warmup
        if s.mode == "guard":
            why = "failure guard holds batch_max"
        elif limit is not None and projected is not None and projected >= limit and not warm:
            s.mode, s.prompts = "guard", cfg.batch_max
            why = (f"failure guard: sqrt({cfg.drift_key}^2 {s.drift**2:.4g} + rate "
                   f"{s.drift_rate:.3g}/sample x {cfg.lookahead}) = {projected:.4g} >= "
                   f"{cfg.safety:g} x threshold "
                   f"{s.drift_threshold:.4g}: batch_max, kept from here")
        elif s.live is not None and s.live.collapsed_at == samples:
            s.mode, s.prompts = "guard", cfg.batch_max
            why = self._collapse_guard(signals)
        elif cfg.rule == "guard":
            # the batch it holds comes from the sweep's B_crit: logged as the decision's reading
            signals["sweep_b_crit"] = s.calibration.get("b_crit")
            why = "rule guard: the batch holds until the failure guard moves it"
            if limit is None:
                why += " (no drift_threshold: it never will)"
        elif cfg.rule == "branch":
            why = self._branch_decision(brancher, limit, warm, signals)
            # branching costs samples: while the batch holds, branch half as often each time
            s.keeps = s.keeps + 1 if s.prompts == old_p else 0
            s.next_decision = samples + cfg.adapt_every * 2 ** min(s.keeps, cfg.max_backoff)
        else:
            s.prompts, why = self._progress_batch(s.prompts)
            if warm and limit is not None:
                why += f" (guard warm-up: decision {s.decisions + 1} of {cfg.guard_warmup})"
        s.lr = self.lr_at(s.prompts)
        s.decisions += 1
        reason = (f"adaptive decision {s.decisions} at {samples:,.0f} samples (step {step}): "
                  f"{old_p} -> {s.prompts} prompts ({old_p * self.group_size} -> "
                  f"{self.batch} samples), lr {old_lr:.4g} -> {s.lr:.4g}: {why}")
        return Decision(s.decisions, step, samples, s.prompts, s.lr, s.mode, signals, reason)

    def _collapse_guard(self, signals: dict) -> str:
        """Why the guard fired on a live collapse (its fall joins the decision's signals)."""
        fall = self.state.live.falls()[-1]
        signals.update({"collapse_at": fall.at, "collapse_peak": fall.peak})
        live = self.state.live
        return (f"failure guard: {self.cfg.collapse_key} collapsed (live drop rule on a "
                f"{live.window}-point trailing mean: fell from {fall.peak:.4g} at "
                f"{fall.at:,.0f} samples, k {live.k}, still below its recovery level "
                f"{live.patience} evaluations later): batch_max, kept from here")

    def branch_plan(self) -> tuple[list[int], int]:
        """The batches (prompts) a branch decision tries and the samples each spends: the
        current batch and twice it (within batch_max), `branch_samples` rounded up to whole
        steps of the larger. ([], 0): at batch_max there is nothing to try."""
        p = self.state.prompts
        up = min(2 * p, self.cfg.batch_max)
        if up == p:
            return [], 0
        big = up * self.group_size
        return [p, up], big * max(1, math.ceil(self.cfg.branch_samples / big))

    def _branch_decision(self, brancher, limit: float | None, warm: bool,
                         signals: dict) -> str:
        """Rule "branch": run B and 2B from here; grow for the failure clock when B's drift,
        projected over `lookahead`, crosses safety x threshold and the larger batch drifts less
        per sample (to the smallest batch the measured drift-vs-batch slope makes safe), else
        for the progress clock when 2B's gain per sample is at least `grow_ratio` of B's."""
        cfg, s = self.cfg, self.state
        tried, each = self.branch_plan()
        if not tried:
            return "at batch_max: nothing to branch, batch kept"
        if brancher is None:
            raise ConfigError("adaptive.rule = \"branch\" needs a backend that branches (the "
                              "sim backend); use rule = \"noise\"")
        results = brancher(tried, each)
        if results is None:
            return f"no budget left for two branches of {each:,.0f} samples: batch kept"
        lo, hi = results
        spent = f"branches {lo.prompts} and {hi.prompts} prompts, {each:,.0f} samples each"
        if not (math.isfinite(lo.gain) and math.isfinite(hi.gain)):
            return self._diverged_branch(lo, hi, spent, signals)
        d0 = s.drift if s.drift is not None else 0.0
        rate_lo = max(lo.drift**2 - d0**2, 0.0) / lo.samples
        rate_hi = max(hi.drift**2 - d0**2, 0.0) / hi.samples
        signals.update({"branch_gain_b": lo.gain, "branch_gain_2b": hi.gain,
                        "branch_drift_rate_b": rate_lo, "branch_drift_rate_2b": rate_hi,
                        "branch_samples": 2.0 * each})
        ratio = hi.gain / lo.gain if lo.gain > 0 else math.nan
        signals["branch_gain_ratio"] = ratio
        # drift^2 per sample against the batch as a power law through the two branches
        slope = (math.log(rate_hi / rate_lo) / math.log(hi.prompts / lo.prompts)
                 if rate_lo > 0 and rate_hi > 0 else 0.0)
        signals["branch_drift_slope"] = slope
        at_b = math.sqrt(lo.drift**2 + rate_lo * cfg.lookahead)
        signals["drift_projected"] = at_b
        if limit is not None and not warm and at_b >= limit and slope < DRIFT_SLOPE:
            s.prompts = self._safe_batch(hi.drift, rate_lo, lo.prompts, slope, limit)
            if s.prompts == cfg.batch_max:
                s.mode = "guard"
            return (f"{spent}: drift projected at B {at_b:.4g} >= {cfg.safety:g} x threshold "
                    f"{s.drift_threshold:.4g} and drift^2 per sample falls with the batch "
                    f"(slope {slope:.2f}): {s.prompts} prompts, the smallest projected below it")
        if lo.gain > 0:
            grow = hi.gain >= cfg.grow_ratio * lo.gain
        else:
            grow = hi.gain > lo.gain
        s.prompts = hi.prompts if grow else lo.prompts
        verdict = "grow" if grow else "keep"
        return (f"{spent}: gain {lo.gain:.4g} at B, {hi.gain:.4g} at 2B (ratio "
                f"{ratio:.3g}, grow at >= {cfg.grow_ratio:g}): {verdict}")

    def _diverged_branch(self, lo: BranchResult, hi: BranchResult, spent: str,
                         signals: dict) -> str:
        """A branch diverged (its gain is not finite): the other one is kept, whatever its
        gain; neither the gain ratio nor the drift slope means anything then. (Both diverged:
        the backend ends the run as diverged before asking.)"""
        ok = lo if math.isfinite(lo.gain) else hi
        bad = hi if ok is lo else lo
        self.state.prompts = ok.prompts
        signals.update({"branch_gain_b": lo.gain, "branch_gain_2b": hi.gain,
                        "branch_samples": lo.samples + hi.samples})
        return f"{spent}: the branch at {bad.prompts} prompts diverged: {ok.prompts} kept"

    def _safe_batch(self, drift: float, rate: float, prompts: int, slope: float,
                    limit: float) -> int:
        """Smallest doubling of `prompts` (up to batch_max) whose drift, projected over
        `lookahead` at rate x (batch ratio)^slope, stays under `limit`."""
        b = prompts
        while b < self.cfg.batch_max:
            b = min(2 * b, self.cfg.batch_max)
            at = rate * (b / prompts) ** slope
            if math.sqrt(drift**2 + at * self.cfg.lookahead) < limit:
                return b
        return self.cfg.batch_max

    def _progress_batch(self, current: int) -> tuple[int, str]:
        """The progress phase's next batch (prompts) and why."""
        cfg, s = self.cfg, self.state
        if s.b_noise is None or math.isnan(s.b_noise):
            return current, f"no {cfg.noise} noise scale yet: batch kept"
        scale = cfg.overhead * s.kappa
        want = math.inf if math.isinf(s.b_noise) else scale * max(s.b_noise, 0.0)
        goal = want / self.group_size
        lo = max(cfg.batch_min, math.ceil(current / cfg.max_change - 1e-9))
        hi = min(cfg.batch_max, math.floor(current * cfg.max_change + 1e-9))
        new = int(min(max(round(goal) if math.isfinite(goal) else hi, lo), hi))
        bound = (" (bounded by batch_min/batch_max and the change factor "
                 f"{cfg.max_change:g})" if new != (round(goal) if math.isfinite(goal) else None)
                 else "")
        return new, (f"overhead {cfg.overhead:g} x kappa {s.kappa:.3g} x B_noise "
                     f"{s.b_noise:.4g} = {want:.4g} samples = "
                     f"{goal:.3g} prompts{bound}")


def start_batch(cfg: AdaptiveConfig, group_size: int, below: float | None) -> int:
    """The first steps' batch (prompts): the largest batch_min x 2^k within batch_max whose
    samples are at most `below` (the sweep's batch that `cfg.start` names); batch_min without
    one, or when even batch_min is above it."""
    p = cfg.batch_min
    if cfg.start == "batch_min" or not below or not math.isfinite(below):
        return p
    while 2 * p <= cfg.batch_max and 2 * p * group_size <= below:
        p *= 2
    return p


def decision_metrics(d: Decision) -> dict:
    """A decision as step metrics: its index, the batch it chose and the signals it used."""
    out = {"adaptive_decision": d.index, "adaptive_next_prompts": d.prompts,
           "adaptive_next_lr": d.lr}
    for key, value in d.signals.items():
        if value is not None and math.isfinite(value):
            out[f"adaptive_{key}"] = value
    return out


def _f(sig: dict, key: str) -> float | None:
    v = sig.get(key)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _terms(noise: str, sig: dict) -> tuple | None:
    """One step's noise terms: euclidean (|G|^2, tr S) or sign (P, A, b, r); None if missing."""
    b, bb = _f(sig, "grad_micro_size"), _f(sig, "grad_full_size")
    if b is None or bb is None or not 0 < b < bb:
        return None
    if noise == "euclidean":
        gb, gbb = _f(sig, "grad_sq_micro"), _f(sig, "grad_sq_full")
        if gb is None or gbb is None:
            return None
        return (bb * gbb - b * gb) / (bb - b), (gb - gbb) / (1 / b - 1 / bb)
    import numpy as np

    from twoclocks_cli.clocks.noise import sign_terms

    vals = [_f(sig, k) for k in ("grad_l1_micro", "grad_l1_full", "grad_sign_dot")]
    if any(v is None for v in vals):
        return None
    p, a, bv, r = (float(np.asarray(x).reshape(-1)[0]) for x in sign_terms(
        *([v] for v in vals), [b], [bb]))
    out = (p, a, bv, r)
    return out if all(math.isfinite(x) for x in out) else None


def _scale(noise: str, emas: list) -> float:
    """B_noise from the smoothed terms (nan: no signal yet)."""
    if noise == "euclidean":
        g2, trs = emas
        return trs / g2 if g2 > 0 else math.nan
    import numpy as np

    from twoclocks_cli.clocks.noise import q_squared

    p, a, b, r = emas
    with np.errstate(all="ignore"):
        q2 = float(np.asarray(q_squared(np.array([p]), np.array([a]), np.array([r])))[0])
    return b * (q2 - 1.0) if q2 == q2 else math.nan


# -- a run's controller ----------------------------------------------------------------------


def start(cfg: AdaptiveConfig, group_size: int, run_prompts: int, run_lr: float, store=None,
          run_id: int | None = None, state: dict | None = None) -> Controller:
    """The controller of run `run_id`: restored from a checkpoint's `state` (which carries its
    calibration), else fresh, calibrated from `cfg.from_sweep`'s analysis in `store` and the
    calibration recorded as an event of the run. Without a store there is nothing to
    calibrate from: `from_sweep` is refused."""
    if state is not None:
        return Controller(cfg, group_size, run_prompts, run_lr, state=state)
    if cfg.from_sweep is not None and store is None:
        raise ConfigError("adaptive.from_sweep needs a store to read the sweep's analysis")
    cal = calibrate(store, cfg) if store is not None else {}
    ctl = Controller(cfg, group_size, run_prompts, run_lr, calibration=cal)
    if cal:
        record_event(store, run_id, calibration_message(ctl))
    return ctl


def calibration_message(ctl: Controller) -> str:
    """The run event that says how a fresh controller was calibrated."""
    cal = ctl.state.calibration
    return (f"adaptive calibration from sweep {cal['from_sweep']!r}: kappa {ctl.state.kappa:.4g} "
            f"({cal['kappa_why']}); drift_threshold {ctl.state.drift_threshold} "
            f"({cal['drift_why']})")


# -- calibration from an analysed sweep ------------------------------------------------------


def calibrate(store, cfg: AdaptiveConfig) -> dict:
    """kappa and drift_threshold from `cfg.from_sweep`'s latest stored analysis ({} without).

    kappa = recommended B_crit / median noise scale (the one `cfg.noise` names) at the progress
    crossings of the runs at the sweep's smallest batch (see _smallest_batch_noise);
    drift_threshold = the lowest `cfg.drift_key` value any of its runs had when its failure
    clock fired (a lower bound of where runs fail). Either is None (with why) when the sweep
    does not measure it."""
    if cfg.from_sweep is None:
        return {}
    result = store.latest_analysis(store.get_sweep(cfg.from_sweep).name)
    if result is None:
        raise ConfigError(f"adaptive.from_sweep = {cfg.from_sweep!r}: the sweep has no stored "
                          f"analysis: run `twoclocks analyze {cfg.from_sweep}` first")
    from twoclocks_cli.clocks.result import Analysis

    return calibration_of(Analysis.from_json(result), cfg,
                          lambda rid: _drift_series(store, rid, cfg.drift_key))


def calibration_of(a, cfg: AdaptiveConfig, drift_of) -> dict:
    """The calibration from an analysis (a clocks.result.Analysis); drift_of(run_id) ->
    (samples, values)."""
    crit = a.critical
    rec = crit.recommended.b_crit if crit.recommended is not None else None
    euclidean = cfg.noise == "euclidean"
    key = "noise_scale" if euclidean else "sign_noise_scale"
    noise, where = _smallest_batch_noise(
        a.runs, (lambda r: r.noise_scale) if euclidean else (lambda r: r.sign_noise_scale))
    if noise is None:
        noise = (crit.noise_scale if euclidean else crit.sign_noise_scale).value
        where = "of all runs"
    reached = [b for b in a.batches if b.progress.median is not None]
    best = min(reached, key=lambda b: b.progress.median).batch_samples if reached else None
    out: dict = {"from_sweep": cfg.from_sweep, "b_crit": rec, "best_batch": best,
                 "noise_scale": noise}
    if rec and noise and noise > 0 and math.isfinite(noise):
        out["kappa"] = float(rec) / float(noise)
        out["kappa_why"] = (f"recommended B_crit {rec:.4g} / median {key} {noise:.4g} {where}")
    else:
        out["kappa_why"] = f"no recommended B_crit or {key} in the analysis: kappa 1"
    drifts = []
    for r in a.runs:
        at = r.failure.samples
        if at is None:
            continue
        samples, values = drift_of(r.run_id)
        hit = [v for s, v in zip(samples, values, strict=True) if s >= at and v == v]
        if hit:
            drifts.append(hit[0])
    if drifts:
        out["drift_threshold"] = float(min(drifts))
        out["drift_why"] = (f"lowest {cfg.drift_key} at the failure clock of {len(drifts)} "
                            "failed runs (a lower bound)")
    else:
        out["drift_why"] = f"no run of the sweep failed with {cfg.drift_key} logged: no guard"
    return out


def _smallest_batch_noise(runs: list, scale_of) -> tuple[float | None, str]:
    """Median noise scale (at the progress crossing) of the runs at the sweep's smallest batch.

    Why not every run's: the noise terms are smoothed per step, so a large-batch run reaches its
    crossing within a few EMA time constants and its noise scale still carries the start of
    training, where B_noise is smallest (measured on the theory model, no cap, lr0 0.02: ~60 at
    64 samples against ~300 at 4). The controller starts at batch_min and smooths as the
    small-batch runs do, so their noise scale is the one its kappa x B_noise is compared with.
    `scale_of(run)` is the run's noise scale (None where not formed)."""
    pts = [(float(r.batch_samples), float(scale_of(r))) for r in runs
           if r.batch_samples and scale_of(r) is not None
           and math.isfinite(float(scale_of(r))) and float(scale_of(r)) > 0]
    if not pts:
        return None, ""
    low = min(b for b, _ in pts)
    vals = sorted(v for b, v in pts if b == low)
    mid = len(vals) // 2
    med = vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])
    return med, f"of the {len(vals)} runs at the smallest batch ({low:g} samples)"


def _drift_series(store, run_id: int, key: str):
    series = store.load_metric([run_id], key).get(run_id)
    if series is None:
        return [], []
    return [float(x) for x in series.samples], [float(x) for x in series.values]


def record_event(store, run_id: int, message: str) -> None:
    """A run event carrying a decision's reason (once: a replayed decision is not repeated)."""
    store.record_note(run_id, message)
