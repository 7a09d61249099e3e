"""Terminal colour shared by the CLI and the REPL: who wrote each token."""

from __future__ import annotations

import sys

from dflash_tui.core.terminal import color_enabled

ORIGIN_STYLE = {"draft": {"fg": "green"}, "target": {}}


def styled(text: str, err: bool = False, **style) -> str:
    """`click.style(text, **style)` where colour is enabled for stdout (stderr with err=True)."""
    import click

    return click.style(text, **style) if color_enabled(sys.stderr if err else sys.stdout) else text
