"""What the TUI tests share: starting the app on a loaded engine, waiting for it, sending a message, the
session file's records, and the WCAG contrast oracle. The fixtures (the tiny pair, its engines, its
profile) are in conftest.py."""

from __future__ import annotations

import json

from tests import waiting

SIZE = (120, 40)
SMALL = (80, 24)


def make_app(profile, engine=None, **kwargs):
    """The real app on `profile`; with `engine` it skips loading (None: the real load path, in a worker)."""
    from dflash_tui.tui.app import DflashApp

    return DflashApp(profile=str(profile), loaded_engine=engine, animate=False, **kwargs)


async def ready(pilot):
    """Until the app holds a conversation (or says why it could not load)."""
    app = pilot.app
    await waiting.until(pilot, lambda: app.conversation is not None or app.load_error is not None)
    await pilot.pause()


async def send(pilot, text):
    """Type `text`, press enter, wait for the turn to end; returns its `ActiveTurn`."""
    app = pilot.app
    before = app.turns_done
    await pilot.press(*text, "enter")
    await waiting.until(pilot, lambda: app.turns_done > before)
    await pilot.pause()
    return app.finished[-1]


def session_lines(app) -> list[dict]:
    """Every record of the chat's session file, header first."""
    path = app.conversation.writer.path
    return [json.loads(line) for line in path.read_text().splitlines()]


def wcag(a, b) -> float:
    """WCAG 2 contrast ratio of two (r, g, b) colours, written out here as the oracle."""
    def lum(rgb):
        c = [v / 255 for v in rgb]
        c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
