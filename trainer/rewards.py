"""Verifiable rewards: an answer-format policy, then math-verify in a fork-based worker pool.

math-verify alone rewards format hacks (`64` unboxed, `\\boxed{128/2}`, `\\boxed{23+41}`), so a
completion must first match `answer_pattern`. Its own timeouts use signal.alarm (main thread only),
so the workers run it without timeouts and the parent kills a worker whose item overruns.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import multiprocessing as mp
import os
import re
import signal
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Protocol

from trainer.config import BUILTIN_REWARDS, check_reward_call
from trainer.data import Problem
from twoclocks_cli.core.errors import ConfigError

# The tiny task's policy: exactly `\boxed{<integer>}`, optionally followed by whitespace.
STRICT_INTEGER_BOXED = r"\\boxed\{-?[0-9]+\}\s*"
# A looser policy for chat models: any text ending in one `\boxed{...}` (no nested braces).
FINAL_BOXED = r"(?s).*\\boxed\{[^{}]*\}\s*"
# The stated answer of a chat model's completion: its last `\boxed{...}`, else its last number.
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
# Reward names: the strict policy (the tiny task's `\boxed{int}` and nothing else) and the final
# answer as a chat model states it.
STRICT, FINAL = BUILTIN_REWARDS
# Items sent to a worker per message; a new message goes out when half are left, so a worker never
# waits for the parent to be scheduled (results still come back, and time out, one by one).
_CHUNK = 32
# Verdicts remembered per (completion, gold answer); a full memo is dropped and refilled.
_MEMO_SIZE = 1 << 16


def final_answer(text: str) -> str | None:
    """The answer `text` states, as `\\boxed{N}`: the number in its last `\\boxed{}`, else its
    last number (thousands commas dropped); None when it states none. A box holding anything
    but a number (`\\boxed{128/2}`, `\\boxed{23+41}`) states none: math-verify would compute
    it, and an expression of the question's own numbers is not an answer. Only the last number
    counts, so listing candidates gains nothing."""
    boxes = _BOXED.findall(text)
    if boxes:
        body = _THOUSANDS.sub("", boxes[-1].strip())
        return f"\\boxed{{{body}}}" if _NUMBER.fullmatch(body) else None
    numbers = _NUMBER.findall(_THOUSANDS.sub("", text))
    return f"\\boxed{{{numbers[-1]}}}" if numbers else None


class RewardFunction(Protocol):
    """Scores completions against their problems: one float per completion, same order."""

    def __call__(self, completions: list[str], problems: list[Problem]) -> list[float]: ...


def _gold_text(answer: str) -> str:
    """The gold answer as text math-verify extracts reliably (boxed unless it already is)."""
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


@functools.lru_cache(maxsize=8192)
def _parse(text: str, timeout: int | None):
    """math-verify's parse of `text`, once per text and process. Parsing is nearly all of a
    verification's cost, and texts repeat: a prompt's G completions share one gold answer, and
    short answers recur across problems and steps. An exception (a timeout) is not cached."""
    from math_verify import parse

    return parse(text, parsing_timeout=timeout)


def _verify(completion: str, answer: str, timeout: int | None) -> float | None:
    """1.0 if math-verify finds `completion` equivalent to `answer`, else 0.0; None when it
    raised (a timeout, or garbage it cannot handle) — scored 0 but never remembered."""
    from math_verify import verify

    try:
        gold = _parse(_gold_text(answer), timeout)
        pred = _parse(completion, timeout)
        if not gold or not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    except BaseException:  # noqa: BLE001 — garbage must never crash a step (incl. RecursionError)
        return None


def _worker(conn) -> None:
    """Worker loop: receive a list of (index, completion, answer), send (index, reward) for each."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": by design
    while True:
        try:
            items = conn.recv()
        except (EOFError, OSError):
            return
        if items is None:
            return
        for idx, completion, answer in items:
            conn.send((idx, _verify(completion, answer, None)))


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (SIGTERM from scancel, kill -9),
    even mid-verification when it is not reading its pipe. A no-op where prctl is missing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Worker:
    """One forked verifier process, its pipe, and the item indices it still owes.

    A bare os.fork (not multiprocessing.Process) so a pool also works inside daemonic processes
    and never joins at interpreter exit: a worker exits when its pipe closes.
    """

    def __init__(self, others: list[_Worker]):
        self.conn, child = mp.Pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the worker: never returns
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
                _die_with_parent()
                self.conn.close()
                for w in others:
                    w.conn.close()
                _worker(child)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.pending: deque[int] = deque()
        self.deadline = math.inf

    def kill(self) -> None:
        """Stop the process now, reap it and release its pipe."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.conn.close()


class MathVerifyReward:
    """Reward 1.0 for a completion matching `answer_pattern` that math-verify finds equal to the
    gold answer, else 0.0.

    `answer_pattern` must match the whole completion (re.fullmatch); `timeout_s` bounds each
    item's verification (an overrun scores 0 and its worker is replaced); `workers` forked
    processes verify in parallel (0 = in this process, main thread only, using math-verify's own
    signal-based timeout rounded up to whole seconds).
    """

    def __init__(
        self, answer_pattern: str = STRICT_INTEGER_BOXED, timeout_s: float = 2.0, workers: int = 2,
        final: bool = False,
    ):
        try:
            self.pattern = re.compile(answer_pattern)
        except re.error as e:
            raise ConfigError(
                f"reward answer_pattern {answer_pattern!r} is not a regex: {e}"
            ) from None
        if not timeout_s > 0:
            raise ConfigError(f"reward timeout_s={timeout_s!r}: must be > 0")
        if not isinstance(workers, int) or workers < 0:
            raise ConfigError(f"reward workers={workers!r}: must be an integer >= 0")
        self.timeout_s, self.n_workers = float(timeout_s), workers
        self.final = final  # score the stated final answer (final_answer), not the whole text
        self._workers: list[_Worker] = []
        self.timeouts = 0  # items that overran timeout_s since creation
        # math-verify's verdict is a pure function of its two strings: a GRPO batch repeats the
        # same answers within and across steps, so each pair is verified once
        self._memo: dict[tuple[str, str], float] = {}
        if workers:
            # import and run math-verify once here, so forked workers inherit it warm: a cold
            # first verification (lazy parser set-up, ~0.2 s idle) took over timeout_s on a
            # loaded machine and scored right answers 0 (seen with 2 training processes)
            quiet = logging.getLogger("math_verify")
            level = quiet.level
            quiet.setLevel(logging.ERROR)  # "timeout disabled": by design, as in the workers
            try:
                _verify("\\boxed{1}", "1", None)
            finally:
                quiet.setLevel(level)

    def __call__(self, completions: list[str], problems: list[Problem]) -> list[float]:
        """One reward per completion; a length mismatch is a programming error (ValueError)."""
        if len(completions) != len(problems):
            raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
        rewards = [0.0] * len(completions)
        unique: dict[tuple[str, str], list[int]] = {}
        for i, (c, p) in enumerate(zip(completions, problems, strict=True)):
            stated = self._stated(c)
            if stated is not None:
                unique.setdefault((stated, p.answer), []).append(i)
        known = {k: self._memo[k] for k in unique if k in self._memo}
        fresh = [k for k in unique if k not in known]
        scores = dict(zip(fresh, self._score(fresh), strict=True))
        if len(self._memo) + len(fresh) > _MEMO_SIZE:
            self._memo.clear()
        # a timeout or a crash (None) may not repeat: scored 0, never remembered
        self._memo.update((k, v) for k, v in scores.items() if v is not None)
        for key, rows in unique.items():
            score = known[key] if key in known else scores[key] or 0.0
            for i in rows:
                rewards[i] = score
        return rewards

    def _stated(self, completion) -> str | None:
        """What math-verify checks of `completion`: its stated final answer, or (strict) the
        whole completion when it matches the answer pattern; None scores 0 unverified."""
        if not isinstance(completion, str):
            return None
        if self.final:
            return final_answer(completion)
        return completion if self.pattern.fullmatch(completion) else None

    def _score(self, items: list[tuple[str, str]]) -> list[float | None]:
        """math-verify scores for (completion, answer) pairs, serially or through the pool;
        None for an item that raised, overran its timeout or lost its worker."""
        if not items:
            return []
        if self.n_workers == 0:
            seconds = max(1, math.ceil(self.timeout_s))
            return [_verify(c, a, seconds) for c, a in items]
        return self._pool_score(items)

    def _pool_score(self, items: list[tuple[str, str]]) -> list[float | None]:
        """Scores from the worker pool, enforcing the per-item deadline from this process."""
        self._spawn()
        out: list[float | None] = [None] * len(items)
        todo = deque(range(len(items)))
        done = 0
        while done < len(items):
            for w in self._workers:  # keep every worker's queue topped up (pipelined chunks)
                if todo and len(w.pending) <= _CHUNK // 2:
                    size = min(_CHUNK, -(-len(todo) // len(self._workers)))
                    chunk = [todo.popleft() for _ in range(size)]
                    if not w.pending:
                        w.deadline = time.monotonic() + self.timeout_s
                    try:
                        w.conn.send([(i, *items[i]) for i in chunk])
                    except OSError:  # the worker died (e.g. killed for memory): chunk not lost
                        todo.extendleft(reversed(chunk))
                        done += self._replace(w, todo)
                        continue
                    w.pending.extend(chunk)
            busy = [w for w in self._workers if w.pending]
            if not busy:  # every worker was just replaced: hand out the work again
                continue
            left = min(w.deadline for w in busy) - time.monotonic()
            ready = wait([w.conn for w in busy], timeout=max(0.0, left))
            now = time.monotonic()
            for w in busy:
                if w.conn in ready:
                    try:
                        while w.conn.poll():
                            idx, score = w.conn.recv()
                            out[idx] = score
                            w.pending.remove(idx)
                            done += 1
                            w.deadline = now + self.timeout_s
                    except (EOFError, OSError):  # the worker died: its current item scores 0
                        done += self._replace(w, todo)
                elif now >= w.deadline:
                    self.timeouts += 1
                    done += self._replace(w, todo)
        return out

    def _replace(self, w: _Worker, todo: deque) -> int:
        """Kill `w` (its current item scores 0), requeue the rest of its chunk, start a new one."""
        lost = w.pending.popleft() if w.pending else None
        todo.extendleft(reversed(w.pending))
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self._workers)
        return 0 if lost is None else 1

    def _spawn(self) -> None:
        """Start the pool (again after a fork into a child process, whose pipes are not ours)."""
        if self._workers and getattr(self, "_pid", None) == os.getpid():
            return
        self._workers = []
        for _ in range(self.n_workers):
            self._workers.append(_Worker(self._workers))
        self._pid = os.getpid()

    def close(self) -> None:
        """Stop the worker processes."""
        if getattr(self, "_pid", None) == os.getpid():
            for w in self._workers:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
            for w in self._workers:
                w.kill()
        self._workers = []

    def __enter__(self) -> MathVerifyReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 — interpreter shutdown
            pass


class _UserReward:
    """A user's `module:function` reward, checked so a bad return value is one clear error."""

    def __init__(self, spec: str, func):
        self.spec, self.func = spec, func

    def __call__(self, completions: list[str], problems: list[Problem]) -> list[float]:
        values = self.func(completions, problems)
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError):
            raise ConfigError(
                f"reward {self.spec}: must return a list of numbers, got {type(values).__name__}"
            ) from None
        if len(values) != len(completions):
            raise ConfigError(
                f"reward {self.spec}: returned {len(values)} values for {len(completions)} "
                "completions"
            )
        return values

    def close(self) -> None:
        """Nothing to release (kept for the RewardFunction lifecycle)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_reward(spec: str = "math-verify", **options) -> RewardFunction:
    """The reward named by `spec`: `math-verify` (the strict format policy), `math-verify-final`
    (the stated final answer; options go to MathVerifyReward) or `module:function` (a user
    function)."""
    if spec == STRICT:
        return MathVerifyReward(**options)
    if spec == FINAL:
        return MathVerifyReward(final=True, **options)
    if options:
        raise ConfigError(f"reward {spec!r}: options {sorted(options)} apply only to math-verify")
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"reward {spec!r}: allowed are 'math-verify', 'math-verify-final' or "
                          "'module:function'")
    try:
        func = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ConfigError(f"reward {spec!r}: cannot import module {module!r} ({e})") from None
    except AttributeError:
        raise ConfigError(f"reward {spec!r}: module {module!r} has no {name!r}") from None
    if not callable(func):
        raise ConfigError(f"reward {spec!r}: {name!r} is not callable")
    check_reward_call(spec, func, f"reward {spec!r}")
    return _UserReward(spec, func)
