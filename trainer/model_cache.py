"""The model cache: built-in models are built (or converted) once into `$TWOCLOCKS_CACHE`,
atomically under a file lock, and checked against a manifest of checksums on every use."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError

MANIFEST = "manifest.json"


def cache_root() -> Path:
    """`$TWOCLOCKS_CACHE` when set, else `~/.cache/twoclocks`."""
    env = os.environ.get("TWOCLOCKS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "twoclocks"


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_checksums(folder: Path) -> dict[str, str]:
    """Every file of `folder` (not the manifest) by name, with its SHA-256."""
    return {p.name: sha256(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name != MANIFEST}


def cached_build(root: Path, name: str, is_valid: Callable[[Path], bool],
                 build: Callable[[Path], None], label: str, progress: bool = False) -> Path:
    """`root/name`, built first by `build(tmp)` into a temporary folder renamed into place when
    `is_valid` refuses what is there. Another process building the same entry is waited for
    (a file lock); a build killed midway leaves only a temporary folder, removed next time."""
    target = root / name
    if is_valid(target):
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = (root / f"{name}.lock").open("a")
    except OSError as e:
        raise ConfigError(f"cannot write the model cache {root}: {e.strerror}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_valid(target):
            return target
        for stale in root.glob(f".{name}.tmp*"):
            shutil.rmtree(stale, ignore_errors=True)
        if progress:
            print(f"building {label} into {target}", file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp", dir=root))
        try:
            build(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
