"""What reaches a terminal: the colour policy (`NO_COLOR`, `FORCE_COLOR`) and text with its control
characters made visible, shared by the CLI, the REPL and the TUI.

`printable` is the one function every writer of text that came from outside the program (model output,
file contents, session and profile fields, values echoed back in errors and listings) passes it through;
`json_text` is its counterpart for JSON written to a terminal or a pipe."""

from __future__ import annotations

import json
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
# controls (8-bit CSI and friends) and lone surrogates (undecodable input bytes) as the replacement
# character: text from a model or a file can never move the cursor, retitle the window, write the
# clipboard or ring the bell, and never stops a write with an encoding error.
_CONTROL = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
_CONTROL[0x7F] = 0x2421
_CONTROL.update({c: 0xFFFD for c in range(0x80, 0xA0)})
_CONTROL.update({c: 0xFFFD for c in range(0xD800, 0xE000)})

# What json.dumps(ensure_ascii=False) leaves raw that a terminal may act on (C0 controls it escapes
# itself): DEL, the C1 controls and lone surrogates, as JSON \u escapes (they occur only inside strings).
_JSON_RAW = {c: f"\\u{c:04x}" for c in [0x7F, *range(0x80, 0xA0), *range(0xD800, 0xE000)]}


def printable(text) -> str:
    """Text safe to put on a terminal; newlines and tabs stay. Anything else is shown as its str()."""
    return (text if isinstance(text, str) else str(text)).translate(_CONTROL)


def json_text(value, **kwargs) -> str:
    """json.dumps(value, ensure_ascii=False, **kwargs) with nothing in it a terminal acts on: readable
    non-ASCII text, every control character escaped."""
    return json.dumps(value, ensure_ascii=False, **kwargs).translate(_JSON_RAW)
