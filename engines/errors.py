"""Errors a person can act on.

Every failure caused by what the user wrote or pointed at (a checkpoint, a block size, a profile)
raises `UserError` with one sentence: what is wrong, where, and how to fix it. The CLI prints that
sentence and exits with code 2; nothing else about it is shown. JSON from the user (a file, a session, a
request) is read with `parse_json`, so every way it can be unreadable gives the same short reason.
"""

from __future__ import annotations

import json
from typing import Any, Union


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


MAX_DEPTH = 64  # JSON nesting dflash reads from a user (a tool's parameter schema needs a dozen at most)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a parsed JSON value nests deeper than `limit` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return False


def parse_json(text: Union[str, bytes], limit: int = MAX_DEPTH) -> Any:
    """json.loads for JSON a user wrote: any failure is a ValueError whose text is a short reason. json.loads
    itself raises RecursionError near 1,000 levels and a bare ValueError for an integer past Python's digit
    limit; nesting past `limit` is refused too, since what walks a value later (json.dumps, a chat
    template) recurses as well."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}" if "\n" in exc.doc.rstrip("\n") else f"column {exc.colno}"
        raise ValueError(f"{exc.msg} at {where}") from None
    except RecursionError:
        raise ValueError(f"it nests deeper than {limit} levels") from None
    except ValueError as exc:  # the digit limit, or bytes that are not UTF-8; the hint after ";" is Python's
        raise ValueError(str(exc).split(";")[0]) from None
    if too_deep(value, limit):
        raise ValueError(f"it nests deeper than {limit} levels")
    return value
