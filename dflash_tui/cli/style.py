"""Terminal colour shared by the CLI and the REPL: who wrote each token."""

from __future__ import annotations

import os
import sys

ORIGIN_STYLE = {"draft": {"fg": "green"}, "target": {}}


def color_enabled(stream=None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    stream = stream or sys.stdout
    return "NO_COLOR" not in os.environ and stream.isatty()
