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
