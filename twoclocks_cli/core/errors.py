"""Project exception types. The CLI turns each into one line on stderr and a non-zero exit."""


class TwoclocksError(Exception):
    """Base of every error a user can cause; `str(err)` is the one line they see."""

    exit_code = 2


class StoreError(TwoclocksError):
    """The database cannot be reached, parsed, written, or is at the wrong schema revision."""


class ConfigError(TwoclocksError):
    """A config file or option value is invalid (names the file, key, value and what is allowed)."""


class NotFoundError(TwoclocksError):
    """A sweep, run or metric named by the user does not exist."""


class AnalysisError(TwoclocksError):
    """The stored data cannot answer the question asked (e.g. one batch size: no fit possible)."""


class LaunchError(TwoclocksError):
    """Submitting, following or cancelling jobs failed."""
