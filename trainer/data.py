"""Training problems: the built-in synthetic arithmetic task, file datasets, and prompt rendering.

A `Problem` is a question and its gold answer (both strings); rewards compare completions to it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from twoclocks_cli.core.errors import ConfigError

# The prompt the built-in tiny model was trained on (it has no chat template); the expected
# completion is `\boxed{ANSWER}` followed by the tokenizer's EOS token.
PLAIN_TEMPLATE = "{question}="
# What a chat model is asked, wrapped in its own chat template by `render_prompt`.
CHAT_INSTRUCTION = "{question}\nGive only the final answer, as \\boxed{{ANSWER}}."
ALLOWED_OPS = ("+", "-", "*")
# 1 in HELDOUT_MODULUS of all possible problems is reserved for evaluation (never sampled).
HELDOUT_MODULUS = 10
# Problem spaces up to this size are enumerated to draw a held-out set without replacement.
_ENUMERATE_LIMIT = 2_000_000
EVAL_SEED = 20_240_601  # one held-out set shared by every cell, so cells compare on equal terms
BUILTIN_DATASETS = ("builtin:arithmetic",)


@dataclass(frozen=True)
class Problem:
    """One question with its gold answer (e.g. `23+41` and `64`)."""

    question: str
    answer: str


def _mix(a: np.ndarray, b: np.ndarray, op: np.ndarray) -> np.ndarray:
    """A fixed integer hash of (a, op, b) (splitmix64 finaliser); decides the held-out split."""
    with np.errstate(over="ignore"):
        x = (
            (a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
            ^ (b.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
            ^ (op.astype(np.uint64) * np.uint64(0x165667B19E3779F9))
        )
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


class ArithmeticTask:
    """Random `a<op>b` problems with integer answers; a fixed tenth of them is held out.

    Options: `min_value`/`max_value` bound both operands (inclusive, min_value ≥ 0) and set the
    difficulty; `ops` is any non-empty subset of `+`, `-`, `*` (subtraction may give negative
    answers). Training samples never include a held-out problem, so evaluation is disjoint
    by construction.
    """

    def __init__(self, min_value: int = 0, max_value: int = 99, ops: tuple[str, ...] = ("+", "-")):
        if not isinstance(min_value, int) or not isinstance(max_value, int) or min_value < 0:
            raise ConfigError(
                f"arithmetic task: min_value={min_value!r}, max_value={max_value!r}: "
                "both must be integers with 0 <= min_value"
            )
        if max_value < min_value:
            raise ConfigError(
                f"arithmetic task: max_value={max_value} is below min_value={min_value}"
            )
        ops = tuple(ops)
        bad = [o for o in ops if o not in ALLOWED_OPS]
        if not ops or bad or len(set(ops)) != len(ops):
            raise ConfigError(
                f"arithmetic task: ops={list(ops)!r}: allowed are distinct values of "
                f"{list(ALLOWED_OPS)}"
            )
        self.min_value, self.max_value, self.ops = min_value, max_value, ops
        self.space = (max_value - min_value + 1) ** 2 * len(ops)

    def _problems(self, a: np.ndarray, b: np.ndarray, op: np.ndarray) -> list[Problem]:
        """Problems for operand and operator-index arrays."""
        out = []
        for x, y, k in zip(a.tolist(), b.tolist(), op.tolist(), strict=True):
            sym = self.ops[k]
            val = x + y if sym == "+" else x - y if sym == "-" else x * y
            out.append(Problem(f"{x}{sym}{y}", str(val)))
        return out

    def _is_heldout(self, a, b, op) -> np.ndarray:
        """True where (a, op, b) belongs to the held-out tenth (depends on values, not options)."""
        codes = np.array([ALLOWED_OPS.index(o) for o in self.ops])[op]
        return _mix(a, b, codes) % np.uint64(HELDOUT_MODULUS) == 0

    def _draw(self, rng: np.random.Generator, n: int):
        """n raw (a, b, op-index) triples."""
        a = rng.integers(self.min_value, self.max_value + 1, size=n)
        b = rng.integers(self.min_value, self.max_value + 1, size=n)
        op = rng.integers(0, len(self.ops), size=n)
        return a, b, op

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """n training problems (never held-out ones); deterministic given the rng's state."""
        if n <= 0:
            return []
        parts, have = [], 0
        for _ in range(1000):
            if have >= n:
                break
            a, b, op = self._draw(rng, max(2 * (n - have), 16))
            keep = ~self._is_heldout(a, b, op)
            parts.append((a[keep], b[keep], op[keep]))
            have += int(keep.sum())
        else:
            raise ConfigError(
                f"arithmetic task {self.min_value}..{self.max_value} {list(self.ops)}: "
                "every problem is held out; widen the range"
            )
        a, b, op = (np.concatenate([p[i] for p in parts])[:n] for i in range(3))
        return self._problems(a, b, op)

    def _every_problem(self):
        """(a, b, op-index) arrays enumerating the whole problem space, in a fixed order."""
        width = self.max_value - self.min_value + 1
        op, rest = np.divmod(np.arange(self.space), width * width)
        a, b = np.divmod(rest, width)
        return a + self.min_value, b + self.min_value, op

    def heldout_size(self) -> int | None:
        """How many distinct problems the task holds out; None where its space is too large
        to enumerate (then about a tenth of it)."""
        if self.space > _ENUMERATE_LIMIT:
            return None
        return int(self._is_heldout(*self._every_problem()).sum())

    def heldout(self, n: int, seed: int) -> list[Problem]:
        """n held-out evaluation problems, fixed per seed, distinct where the split allows."""
        if n <= 0:
            return []
        rng = np.random.default_rng(seed)
        if self.space <= _ENUMERATE_LIMIT:
            a, b, op = self._every_problem()
            mask = self._is_heldout(a, b, op)
            pool = np.flatnonzero(mask)
            if pool.size == 0:
                raise ConfigError(
                    f"arithmetic task {self.min_value}..{self.max_value} {list(self.ops)}: "
                    f"only {self.space} problems, none held out; widen the range"
                )
            pick = rng.choice(pool, size=n, replace=n > pool.size)
            return self._problems(a[pick], b[pick], op[pick])
        parts, have = [], 0
        while have < n:
            a, b, op = self._draw(rng, 4 * HELDOUT_MODULUS * (n - have))
            keep = self._is_heldout(a, b, op)
            parts.append((a[keep], b[keep], op[keep]))
            have += int(keep.sum())
        a, b, op = (np.concatenate([p[i] for p in parts])[:n] for i in range(3))
        return self._problems(a, b, op)


def _cell(value, path: Path | str, where: str, key: str) -> str:
    """A question/answer cell as a non-empty string, or a ConfigError naming file and row."""
    if value is None or (isinstance(value, float) and value != value):
        raise ConfigError(f"{path}: {where}: column {key!r} is empty")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(
            f"{path}: {where}: column {key!r} must be a string or number, got "
            f"{type(value).__name__}"
        )
    text = str(value).strip()
    if not text:
        raise ConfigError(f"{path}: {where}: column {key!r} is empty")
    if "\x00" in text:  # no tokenizer or store text column takes it, and no question needs it
        raise ConfigError(f"{path}: {where}: column {key!r} contains a NUL character")
    return text


def _jsonl_rows(path: Path, qk: str, ak: str):
    """(where, question, answer) per non-blank line of a JSON Lines file."""
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}: line {lineno}: not valid JSON ({e.msg})") from None
            except RecursionError:  # json's decoder recurses once per nesting level
                raise ConfigError(f"{path}: line {lineno}: not a problem row: JSON nested too "
                                  "deeply (a row is one flat object)") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}: line {lineno}: expected a JSON object")
            for k in (qk, ak):
                if k not in row:
                    raise ConfigError(
                        f"{path}: line {lineno}: missing column {k!r} (has {sorted(row)})"
                    )
            yield f"line {lineno}", row[qk], row[ak]


def _csv_rows(path: Path, qk: str, ak: str):
    """(where, question, answer) per data row of a CSV file with a header line."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        for k in (qk, ak):
            if k not in header:
                raise ConfigError(f"{path}: missing column {k!r} (header has {header})")
        for row in reader:
            where = f"line {reader.line_num}"
            if None in row or any(v is None for v in row.values()):
                raise ConfigError(f"{path}: {where}: expected {len(header)} fields like the header")
            yield where, row[qk], row[ak]


def _parquet_rows(path: Path, qk: str, ak: str):
    """(where, question, answer) per row of a Parquet file (needs pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"{path}: reading Parquet needs pyarrow (pip install pyarrow); "
            "or convert the file to .jsonl or .csv"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise ConfigError(f"{path}: not a readable Parquet file ({e})") from None
    for k in (qk, ak):
        if k not in table.column_names:
            raise ConfigError(f"{path}: missing column {k!r} (has {table.column_names})")
    for i, (q, a) in enumerate(zip(table[qk].to_pylist(), table[ak].to_pylist(), strict=True), 1):
        yield f"row {i}", q, a


_READERS = {".jsonl": _jsonl_rows, ".csv": _csv_rows, ".parquet": _parquet_rows}


def load_problems(
    path, question_key: str = "question", answer_key: str = "answer"
) -> list[Problem]:
    """Problems from a .jsonl, .csv or .parquet file; a bad file or row is a ConfigError."""
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ConfigError(
            f"{path}: unsupported dataset file type {path.suffix!r}: allowed are "
            f"{', '.join(_READERS)}"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: dataset file not found")
    try:
        problems = [
            Problem(_cell(q, path, where, question_key), _cell(a, path, where, answer_key))
            for where, q, a in reader(path, question_key, answer_key)
        ]
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except csv.Error as e:
        raise ConfigError(f"{path}: malformed CSV ({e})") from None
    if not problems:
        raise ConfigError(f"{path}: no problems in the file")
    return problems


def render_prompt(problem: Problem, tokenizer) -> str:
    """The prompt for `problem`: the tokenizer's chat template if it has one, else PLAIN_TEMPLATE.

    Encode the result with `add_special_tokens=False` for chat templates (they carry their own);
    the tiny model's tokenizer adds no special tokens either way.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": CHAT_INSTRUCTION.format(question=problem.question)}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return PLAIN_TEMPLATE.format(question=problem.question)


def load_hf_problems(
    spec: str, split: str = "train", question_key: str = "question", answer_key: str = "answer"
) -> list[Problem]:
    """Problems of an `hf:ID` dataset — a hub id, or a local folder `datasets` can load — from
    one split; needs the `datasets` package (the `hf` extra). Every failure is a ConfigError."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"dataset {spec!r} needs the `datasets` package (pip install 'twoclocks[hf]')"
        ) from None
    try:
        table = datasets.load_dataset(spec[3:], split=split)
    except Exception as err:  # the hub and the loaders raise many types; one line for the user
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"dataset {spec!r}: cannot load ({type(err).__name__}: {first})"
        ) from None
    for key in (question_key, answer_key):
        if key not in table.column_names:
            raise ConfigError(
                f"dataset {spec!r}: missing column {key!r} (has {table.column_names})"
            )
    problems = [
        Problem(_cell(q, spec, f"row {i}", question_key), _cell(a, spec, f"row {i}", answer_key))
        for i, (q, a) in enumerate(zip(table[question_key], table[answer_key], strict=True), 1)
    ]
    if not problems:
        raise ConfigError(f"dataset {spec!r}: no problems in split {split!r}")
    return problems


# -- what a dataset spec needs, and every problem of a config --------------------------------------

# a datasets hub id: [ORG/]NAME of word characters, '-' and '.' (no '--' or '..')
_HUB_ID = re.compile(r"^(?!.*(?:--|\.\.))(?:[\w.-]+/)?[\w.-]+$")


def dataset_problem(spec: str) -> str | None:
    """What would stop `spec` (a `dataset` or `eval_dataset` value) from loading, found without
    reading a row: an unknown built-in name, a missing or unsupported file, a missing reader
    package, an `hf:` hub id that is not in the local cache. None when nothing is found."""
    if spec.startswith("builtin:"):
        if spec in BUILTIN_DATASETS:
            return None
        return (f"unknown built-in dataset {spec!r}: allowed is "
                f"{', '.join(map(repr, BUILTIN_DATASETS))}")
    if spec.startswith("hf:"):
        return _hf_problem(spec)
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix not in _READERS:
        return (f"{path}: unsupported dataset file type {path.suffix!r}: allowed are "
                f"{', '.join(_READERS)}")
    try:
        if not path.exists():
            return f"{path}: dataset file not found"
        if not path.is_file():
            return f"{path}: not a file (a dataset is one {suffix} file)"
        if not os.access(path, os.R_OK):
            return f"{path}: dataset file not readable (permission denied)"
    except OSError as err:
        return f"{path}: {err.strerror or err}"
    if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        return f"{path}: reading Parquet needs pyarrow (pip install pyarrow)"
    return None


def _hf_problem(spec: str) -> str | None:
    """`hf:ID`: the datasets package, and a local folder or a hub id. Online, an id that is not
    cached here may still be downloaded where the runs start, and whether the hub holds it
    cannot be told without asking it, so it passes; offline (HF_HUB_OFFLINE or
    HF_DATASETS_OFFLINE) only the local caches can give it."""
    ident = spec[3:]
    if importlib.util.find_spec("datasets") is None:
        return f"dataset {spec!r} needs the `datasets` package (pip install 'twoclocks[hf]')"
    path = Path(ident).expanduser()
    try:
        if path.exists():
            return None if path.is_dir() else f"dataset {spec!r}: {path} is not a folder"
    except OSError as err:
        return f"dataset {spec!r}: {err.strerror or err}"
    if ident.startswith(("/", "./", "../", "~")) or ident.count("/") > 1:
        return f"dataset {spec!r}: folder {path} does not exist"
    if not ident or len(ident) > 96 or not _HUB_ID.match(ident):
        return f"dataset {spec!r}: neither an existing folder nor a hub id ([ORG/]NAME)"
    if not _offline():
        return None
    hub, local = _hf_caches()
    if (hub / f"datasets--{ident.replace('/', '--')}").is_dir() or \
            (local / ident.replace("/", "___")).is_dir():
        return None
    return (f"dataset {spec!r}: a hub id in neither local cache ({hub}, {local}) while the hub "
            "is off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): without the network it cannot load; "
            f"download it first (`hf download --repo-type dataset {ident}`) or give a local "
            "file or folder")


def _offline() -> bool:
    """Whether this process is told to stay off the hub, as huggingface_hub and datasets read
    those variables."""
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hf_caches() -> tuple[Path, Path]:
    """(the hub's download cache, the datasets library's own cache), as those libraries find
    them from the environment (datasets itself is not imported: it is slow to import)."""
    try:
        from huggingface_hub import constants

        home, hub = constants.HF_HOME, constants.HF_HUB_CACHE
    except ImportError:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
        hub = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
    local = os.environ.get("HF_DATASETS_CACHE") or os.path.join(home, "datasets")
    return Path(hub).expanduser(), Path(local).expanduser()


def read_spec(spec: str, cfg, hub: bool = True) -> list[Problem] | None:
    """Problems of a file or `hf:` dataset spec (None for an `hf:` one when not `hub`)."""
    if spec.startswith("hf:"):
        if not hub:
            return None
        return load_hf_problems(spec, cfg.dataset_split, cfg.question_key, cfg.answer_key)
    return load_problems(spec, cfg.question_key, cfg.answer_key)


def read_data(cfg, hub: bool = True):
    """(training problems, held-out problems) of a TrainConfig: the ArithmeticTask itself for
    `builtin:arithmetic`, else a list; with `hub=False` an `hf:` dataset is not loaded (None in
    its place). Every bad file, row or size is a ConfigError."""
    if cfg.dataset == "builtin:arithmetic":
        train = ArithmeticTask(cfg.arith_min_value, cfg.arith_max_value, tuple(cfg.arith_ops))
        held = train.heldout(cfg.eval_size, EVAL_SEED)
    elif cfg.dataset.startswith("builtin:"):
        raise ConfigError(dataset_problem(cfg.dataset))
    else:
        train = read_spec(cfg.dataset, cfg, hub)
        held = None
        if cfg.eval_dataset is None and train is not None:
            if len(train) <= cfg.eval_size:
                raise ConfigError(
                    f"{cfg.dataset}: {len(train)} rows, but eval_size = {cfg.eval_size} rows "
                    "are held out from it: set eval_dataset or a smaller eval_size"
                )
            train, held = train[: -cfg.eval_size], train[-cfg.eval_size :]
    if cfg.eval_dataset == "builtin:arithmetic":
        task = ArithmeticTask(cfg.arith_min_value, cfg.arith_max_value, tuple(cfg.arith_ops))
        held = task.heldout(cfg.eval_size, EVAL_SEED)
    elif cfg.eval_dataset is not None and cfg.eval_dataset.startswith("builtin:"):
        raise ConfigError(dataset_problem(cfg.eval_dataset))
    elif cfg.eval_dataset is not None:
        rows = read_spec(cfg.eval_dataset, cfg, hub)
        held = rows[: cfg.eval_size] if rows is not None else None
    return train, held
