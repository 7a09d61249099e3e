"""What reaches a terminal: the colour policy (`NO_COLOR`, `FORCE_COLOR`) and text with its control
characters made visible, shared by the CLI, the REPL and the TUI."""

from __future__ import annotations

import os
import sys


def color_enabled(stream=None) -> bool:
    """Colour on a terminal; never when NO_COLOR is set to anything but the empty string
    (https://no-color.org); always when FORCE_COLOR is set (and not "0"), e.g. for a pager."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "0") not in ("", "0"):
        return True
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty()


# C0 controls but tab and newline become their Unicode pictures (ESC shows as ␛), DEL as ␡, C1
# controls (8-bit CSI and friends) as the replacement character: text from a model or a session file
# can never move the cursor, retitle the window or ring the bell.
_CONTROL = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
_CONTROL[0x7F] = 0x2421
_CONTROL.update({c: 0xFFFD for c in range(0x80, 0xA0)})


def printable(text: str) -> str:
    """Text safe to put on a terminal; newlines and tabs stay."""
    return text.translate(_CONTROL)
