"""Third-party libraries read a user's source quietly: their INFO and WARNING chatter (a
migration's progress, deprecation notes) is not the user's output; their errors still are,
unless the reader turns every error it can meet into its own one line (`silenced`)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# the libraries an import reads sources with, and what they log through
LOGGERS = ("mlflow", "alembic", "sqlalchemy", "wandb", "tensorboard", "tensorflow", "absl",
           "torch", "urllib3")
SILENT = logging.CRITICAL + 1  # above every level a library logs at


def _family(names: tuple[str, ...]) -> list[logging.Logger]:
    """The named loggers, and their descendants that hold a level of their own (MLflow sets
    `sqlalchemy.engine`'s, which a level on `sqlalchemy` would not reach)."""
    found = [logging.getLogger(n) for n in names]
    for key, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and lg.level != logging.NOTSET and \
                any(key.startswith(n + ".") for n in names):
            found.append(lg)
    return found


@contextlib.contextmanager
def quiet_libraries(names: tuple[str, ...] = LOGGERS, level: int = logging.ERROR
                    ) -> Iterator[None]:
    """Silence the libraries' loggers below `level` while the block runs, and put their levels
    back after. A library that configures its loggers on import (MLflow does) must be imported
    before the block."""
    loggers = _family(names)
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(level, lg.level))
    try:
        yield
    finally:
        for lg, old in zip(loggers, before, strict=True):
            lg.setLevel(old)


@contextlib.contextmanager
def silenced(names: tuple[str, ...] = LOGGERS) -> Iterator[None]:
    """No log record and no warning from the libraries while the block runs: for a reader that
    turns each error they raise into one line of its own (MLflow logs a database error with its
    traceback, then raises it)."""
    with warnings.catch_warnings(), quiet_libraries(names, SILENT):
        warnings.simplefilter("ignore")
        yield
