"""A traceback is a bug: keep it in a log file and show the user one line that names the file.

The log goes to $TWOCLOCKS_CRASH_DIR, else $XDG_CACHE_HOME/twoclocks/crashes (default
~/.cache/twoclocks/crashes), else the system temp folder when that cannot be written.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

EXIT_CODE = 1  # project errors exit 2 (errors.TwoclocksError); a bug exits 1


def crash_dir() -> Path:
    """Where crash logs go (see the module docstring)."""
    if os.environ.get("TWOCLOCKS_CRASH_DIR"):
        return Path(os.environ["TWOCLOCKS_CRASH_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "twoclocks" / "crashes"


def write_log(err: BaseException) -> Path | None:
    """Write argv, version and the full traceback of `err`; the log's path (None if unwritable)."""
    from twoclocks_cli import __version__

    stamp = time.strftime("%Y%m%dT%H%M%S")
    body = (f"twoclocks {__version__}, python {sys.version.split()[0]}\n"
            f"argv: {sys.argv!r}\ncwd: {os.getcwd()}\n\n"
            + "".join(traceback.format_exception(type(err), err, err.__traceback__)))
    for folder in (crash_dir(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"twoclocks-crash-{stamp}-{os.getpid()}.log"
            path.write_text(body, encoding="utf-8")
            return path
        except OSError:
            continue
    return None


def one_line(err: BaseException) -> str:
    """The line shown for an unexpected exception: what it was and where the traceback is."""
    path = write_log(err)
    first = (str(err).strip().splitlines() or [""])[0]
    what = f"{type(err).__name__}: {first[:200]}" if first else type(err).__name__
    where = f"the full traceback is in {path}" if path else "no crash log could be written"
    return f"error: internal error ({what}); this is a bug in twoclocks, please report it; {where}"
