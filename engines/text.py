"""Values from outside the program: text made safe for a terminal (`printable`), and numbers read from
JSON checked as numbers (`finite_number`). The engines put checkpoint and config values into their error
sentences with `printable`, and every front end passes model output, file contents and echoed values through
it (dflash_tui/core/terminal.py re-exports it). Framework-free, so it lives here, below the front ends."""

from __future__ import annotations

import math
from typing import Union

# C0 controls but tab and newline become their Unicode pictures (ESC shows as ␛), DEL as ␡, C1
# controls (8-bit CSI and friends) and lone surrogates (undecodable input bytes) as the replacement
# character: text from a model or a file can never move the cursor, retitle the window, write the
# clipboard or ring the bell, and never stops a write with an encoding error.
CONTROL: dict[int, Union[int, str]] = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
CONTROL[0x7F] = 0x2421
CONTROL.update({c: 0xFFFD for c in range(0x80, 0xA0)})
CONTROL.update({c: 0xFFFD for c in range(0xD800, 0xE000)})
# Bidirectional formatting characters (embeddings and overrides U+202A-U+202E, isolates U+2066-U+2069, the
# marks U+200E, U+200F and U+061C) reorder what a terminal shows around them: a name could read as another
# ("Trojan Source"). They are shown as visible escapes such as <U+202E>, never acted on.
BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
CONTROL.update({c: f"<U+{c:04X}>" for c in BIDI})


def printable(text) -> str:
    """Text safe to put on a terminal; newlines and tabs stay. Anything else is shown as its str()."""
    return (text if isinstance(text, str) else str(text)).translate(CONTROL)


_BIDI = frozenset(BIDI)


def has_control(text: str) -> bool:
    """Whether `text` holds a control character `printable` would escape (C0 but newline and tab, DEL, C1, a
    lone surrogate); the bidirectional marks, which right-to-left text uses, do not count: printers escape
    them, a reader need not refuse them."""
    return any(ord(c) in CONTROL and ord(c) not in _BIDI for c in text)


def one_line(text) -> str:
    """`printable` text on one line: newlines and tabs (and runs of spaces) become one space, for a field shown
    where a line break would break the format (a completion's description, a column of a listing)."""
    return " ".join(printable(text).split())


def finite_number(value) -> bool:
    """An int or float that is finite as a float: JSON holds integers of any length (10**400), which
    math.isfinite and float() refuse with an OverflowError; a bool is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
