"""How long a test may wait for an event before calling it a hang.

Tests wait for events (a condition polled, a line read, a screen shown), never for a fixed time. The
limit here is only the safety net against a hang: far above a normal run even on a loaded 2-core
machine, and multiplied by DFLASH_TEST_WAIT_SCALE on slower ones.
"""

from __future__ import annotations

import os
import time

SCALE = float(os.environ.get("DFLASH_TEST_WAIT_SCALE", "1"))


def limit(seconds: float = 480.0) -> float:
    """A safety net of `seconds` (scaled); a test that reaches it is stuck, not slow."""
    return seconds * SCALE


async def until(pilot, condition, seconds: float = 480.0, step: float = 0.05) -> None:
    """Let the app run until `condition()` holds."""
    end = time.monotonic() + limit(seconds)
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("the app never reached the awaited state (a hang, not a slow machine)")
        await pilot.pause(step)
