"""Terminal colour shared by the CLI and the REPL: who wrote each token, and rich consoles under the same
colour policy (core/terminal.py) as click."""

from __future__ import annotations

import sys
from typing import Literal, Optional

from dflash_tui.core.terminal import color_enabled, is_terminal

ORIGIN_STYLE = {"draft": {"fg": "green"}, "target": {}}


def styled(text: str, err: bool = False, **style) -> str:
    """`click.style(text, **style)` where colour is enabled for stdout (stderr with err=True)."""
    import click

    return click.style(text, **style) if color_enabled(sys.stderr if err else sys.stdout) else text


def console(err: bool = False):
    """A rich Console on stdout (stderr with err=True) that follows `color_enabled`. rich reads NO_COLOR and
    FORCE_COLOR itself, but its own way: FORCE_COLOR=0 forces colour, NO_COLOR keeps bold and dim, and
    FORCE_COLOR makes a pipe a terminal, so a live bar would redraw into a log. Here colour follows the one
    policy, and only a terminal gets live redrawing."""
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    tty = is_terminal(stream)
    colours: Optional[Literal["auto", "standard"]] = ("auto" if tty else "standard") if color_enabled(stream) else None
    return Console(stderr=err, force_terminal=tty, color_system=colours)
