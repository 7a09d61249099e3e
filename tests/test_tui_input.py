"""Input you can trust (issue 46): keys that arrive in one burst act in the order typed in every box (the
message box, the find bar, the palette; the rename box is in test_tui_chat.py). Bursts are queued as one
batch of events (`burst`), as a terminal delivers fast typing on a busy machine."""

from __future__ import annotations

import pytest

from tests import waiting

pytest.importorskip("textual")
pytest.importorskip("torch")

from tests.tui_helpers import SIZE, burst, make_app, ready  # noqa: E402 - after the importorskip above


@pytest.mark.asyncio
async def test_a_burst_of_keys_acts_in_the_order_typed_in_every_box(profile, engine, data_dir):
    """`hello`, ctrl+u, `world` left an empty box; `abc def`, ctrl+a, `X` gave `abc defX`: a binding ran only
    once its key had bubbled up to the app, after the text typed behind it."""
    from dflash_tui.tui.screens.chat import ChatScreen

    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        prompt = app.screen.query_one("#prompt")
        burst(app, *"hello", "ctrl+u", *"world")
        await waiting.until(pilot, lambda: prompt.text == "world", 60)
        burst(app, "ctrl+u", *"abc def", "ctrl+a", "X", "ctrl+e", *"!!", "backspace", "left", "-")
        await waiting.until(pilot, lambda: prompt.text == "Xabc def-!", 60)
        # ctrl+f and escape move the focus at once: the keys behind each go to the box it gives the focus to
        burst(app, "ctrl+u", "ctrl+k", "ctrl+f", *"abc", "backspace", "escape", *"typed on")
        find = app.screen.query_one("#find")
        await waiting.until(pilot, lambda: prompt.text == "typed on", 60)
        assert find.value == "ab" and app.focused is prompt
        burst(app, "ctrl+p", *"ghosts", "ctrl+a", *"Toggle ")  # the palette's query box
        await waiting.until(pilot, lambda: not isinstance(app.screen, ChatScreen))
        query = app.screen.query_one("Input")
        await waiting.until(pilot, lambda: query.value == "Toggle ghosts", 60)
        await pilot.press("enter")
        await waiting.until(pilot, lambda: app.ghosts)

