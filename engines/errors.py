"""Errors a person can act on.

Every failure caused by what the user wrote or pointed at (a checkpoint, a block size, a profile)
raises `UserError` with one sentence: what is wrong, where, and how to fix it. The CLI prints that
sentence and exits with code 2; nothing else about it is shown.
"""


class UserError(Exception):
    """Bad input: a one-sentence message that says what, where and how to fix it (exit code 2)."""


class CheckpointError(UserError):
    """A target or draft checkpoint is missing, unreadable or does not fit its partner."""


class EngineUnavailable(UserError):
    """The chosen engine cannot run here (its framework is not installed or has no device)."""


def describe(exc: BaseException, limit: int = 160) -> str:
    """A library's exception as a short clause for a one-sentence message: its type and first line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
