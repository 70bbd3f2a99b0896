"""Reading a small file a user names (a config, a cost file): only a regular file, and never more
than a cap, so a device, a FIFO, a folder or a huge file is one clear line instead of a hang, a
memory error or a long parse."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # a config or cost file is a few lines; 1 MiB leaves wide room

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def special_kind(mode: int) -> str | None:
    """What a file of `mode` is when it is not a regular file ("a FIFO", ...), else None."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path: str | Path, max_bytes: int = MAX_CONFIG_BYTES, what: str = "file",
                 hint: str = "") -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them; anything else
    (missing, a folder, a FIFO or device, unreadable, larger) is one ConfigError line naming
    the file. It is opened without blocking and checked on the open descriptor, so a FIFO
    swapped in after the check cannot hang the read."""
    path = Path(path)
    try:
        kind = special_kind(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{path}: {what} not found{hint}") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot read: {getattr(err, 'strerror', None) or err}") from None
    if kind is not None:
        raise ConfigError(f"{path}: is {kind}, not a {what}: give a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if (kind := special_kind(info.st_mode)) is not None:
            raise ConfigError(f"{path}: is {kind}, not a {what}: give a regular file")
        try:
            data = fh.read(max_bytes + 1)
        except OSError as err:
            raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    if len(data) > max_bytes:
        size = max(info.st_size, len(data))
        raise ConfigError(f"{path}: {size:,} bytes: a {what} may be at most {max_bytes:,} bytes")
    return data
