"""What reaches a terminal: the colour policy (`NO_COLOR`, `FORCE_COLOR`) and text with its control
characters made visible, shared by the CLI, the REPL and the TUI.

`printable` is the one function every writer of text that came from outside the program (model output,
file contents, session and profile fields, values echoed back in errors and listings) passes it through;
`json_text` is its counterpart for JSON written to a terminal or a pipe."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager

from dflash_tui.engines.text import printable

__all__ = ["color_enabled", "json_text", "printable", "typing_hidden"]


def counted(n: int, noun: str) -> str:
    """'1 turn', '3 turns': a count with its noun (regular plurals only)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def color_enabled(stream=None) -> bool:
    """Colour on a terminal; never when NO_COLOR is set to anything but the empty string
    (https://no-color.org); always when FORCE_COLOR is set (and not "0"), e.g. for a pager."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "0") not in ("", "0"):
        return True
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty()


# What json.dumps(ensure_ascii=False) leaves raw that a terminal may act on (C0 controls it escapes
# itself): DEL, the C1 controls and lone surrogates, as JSON \u escapes (they occur only inside strings).
_JSON_RAW = {c: f"\\u{c:04x}" for c in [0x7F, *range(0x80, 0xA0), *range(0xD800, 0xE000)]}


def json_text(value, **kwargs) -> str:
    """json.dumps(value, ensure_ascii=False, **kwargs) with nothing in it a terminal acts on: readable
    non-ASCII text, every control character escaped."""
    return json.dumps(value, ensure_ascii=False, **kwargs).translate(_JSON_RAW)


@contextmanager
def typing_hidden(stream=None):
    """While an answer streams to a terminal: ctrl+c is not echoed as `^C` into the answer's text (ECHOCTL),
    nor is text typed ahead (ECHO; the next prompt gets it). The terminal's modes are restored after. A
    stream that is no terminal (a pipe, a file) is left alone."""
    stream = sys.stdin if stream is None else stream
    try:
        import termios

        fd = stream.fileno()
        saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    except (ImportError, AttributeError, OSError, ValueError):  # no termios (Windows), a closed or fake stream
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
