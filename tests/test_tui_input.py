"""Input you can trust (issue 46): keys that arrive in one burst act in the order typed in every box (the
message box, the find bar, the palette, the picker's search and rename boxes opened in the same burst; the
rename box alone is in test_tui_chat.py), ctrl+c clears a message of
any length (ctrl+z brings it back), and ctrl+x waits for ctrl+e without eating other keys. Bursts are
queued as one batch of events (`burst`), as a terminal delivers fast typing on a busy machine."""

from __future__ import annotations

import pytest

from tests import waiting

pytest.importorskip("textual")
pytest.importorskip("torch")

from tests.tui_helpers import SIZE, burst, make_app, open_sessions, ready, write_sessions  # noqa: E402 - after the importorskip above


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
        burst(app, "ctrl+x", "a")  # ctrl+x waits for ctrl+e; any other key still acts
        await waiting.until(pilot, lambda: prompt.text == "Xabc def-a!", 60)
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


@pytest.mark.asyncio
async def test_ctrl_c_clears_a_message_of_many_lines_and_ctrl_z_brings_it_back(profile, engine, data_dir):
    """The clear-all: ctrl+c empties the box, in its turn after the keys typed before it; with the box empty
    it says how to quit, as before."""
    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        prompt = app.screen.query_one("#prompt")
        prompt.load_text("first line\nsecond line\nthird")
        prompt.move_cursor(prompt.document.end)
        burst(app, *" and more", "ctrl+c", *"fresh")
        await waiting.until(pilot, lambda: prompt.text == "fresh", 60)
        burst(app, "ctrl+z", "ctrl+z")  # "fresh" taken back, then the clear
        await waiting.until(pilot, lambda: prompt.text == "first line\nsecond line\nthird and more", 60)
        prompt.load_text("")
        await pilot.press("ctrl+c")
        await waiting.until(pilot, lambda: any("to quit" in str(n.message) for n in app._notifications))


@pytest.mark.asyncio
async def test_the_keys_behind_one_that_opens_a_box_in_the_picker_reach_that_box(profile, engine, data_dir):
    """`/` then `red` searched for nothing (the letters reached the list, r opening a rename); `r` then a title
    and enter renamed nothing (the title reached the list). The keys that open a box act as they arrive, the
    box taking the focus at once; while the search box has it, r, e, j and d are text."""
    from dflash_tui.core import sessions
    from dflash_tui.tui.screens import SessionsScreen

    ids = write_sessions(2)
    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        picker = await open_sessions(pilot)
        search = picker.query_one("#sessions-search")
        burst(app, "/", *"jredquestion 0", "ctrl+u", *"question 1")
        await waiting.until(pilot, lambda: search.value == "question 1", 60)
        assert picker is app.screen and picker._selected() == ids[0]
        await pilot.press("escape")  # closes the picker from its search
        await waiting.until(pilot, lambda: not isinstance(app.screen, SessionsScreen))
        await pilot.press("ctrl+o")
        await waiting.until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        burst(app, "r", "ctrl+u", *"Pears", "enter")
        await waiting.until(pilot, lambda: sessions.load_session(ids[0]).title == "Pears", 60)
