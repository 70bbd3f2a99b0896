"""Third-party libraries read a user's source quietly: their INFO and WARNING chatter (a
migration's progress, deprecation notes) is not the user's output; their errors still are."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

# the libraries an import reads sources with, and what they log through
LOGGERS = ("mlflow", "alembic", "sqlalchemy", "wandb", "tensorboard", "tensorflow", "absl",
           "torch", "urllib3")


@contextlib.contextmanager
def quiet_libraries(names: tuple[str, ...] = LOGGERS) -> Iterator[None]:
    """Silence the libraries' loggers below error while the block runs, and put their levels
    back after."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before, strict=True):
            lg.setLevel(level)
