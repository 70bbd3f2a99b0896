"""Third-party libraries read a user's source quietly: their own log lines (INFO chatter, a
traceback before a refusal this command words in one line) are not the user's output."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

# the libraries an import reads sources with, and what they log through
LOGGERS = ("mlflow", "alembic", "sqlalchemy", "wandb", "tensorboard", "tensorflow", "absl",
           "torch", "urllib3")


@contextlib.contextmanager
def quiet_libraries(names: tuple[str, ...] = LOGGERS) -> Iterator[None]:
    """Raise the libraries' loggers above error while the block runs (every failure reaches
    the user as this command's one line), and put their levels back after."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before, strict=True):
            lg.setLevel(level)
