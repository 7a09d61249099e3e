"""The session picker's search (issue 46, item 4): each session found shows where (its turn, and a line
around the words, highlighted), read from real session files in a temporary data dir; ↓ leaves the search
box for the list, ↑ on the list's first row goes back, enter opens the highlighted session."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from tests import waiting  # noqa: E402 - after the importorskip above
from tests.test_contrast import every_theme_reads  # noqa: E402 - the contrast scan of a screen, on every theme
from tests.tui_helpers import SIZE, SMALL, make_app, open_sessions, ready, write_session  # noqa: E402

LONG = ("Rye flour holds little gluten, so a rye loaf is dense. For a lighter crumb, feed\n\t\x1b[1ma "
        "sourdough starter for a week before you bake, then mix it with wheat flour and let it rise overnight.")


def turn(user: str, answer: str) -> dict:
    return {"status": "completed", "user": user, "answer": answer, "prompt_ids": [], "emitted_ids": [],
            "settings": {}, "steps": [], "summary": None}


def bakery() -> dict[str, str]:
    """Three sessions, two of which speak of sourdough (one in its second turn's answer, behind a control
    character and a tab), and one named only in its title: their ids by what they hold."""
    from dflash_tui.core import sessions

    ids = {"rye": write_session("20260101-100000-0001", turn("How do I bake bread?", "Mix flour, water and salt."),
                                turn("And rye?", LONG)),
           "starter": write_session("20260102-100000-0002", turn("What is a sourdough starter?", "Flour and water.")),
           "named": write_session("20260103-100000-0003", turn("Pizza at home?", "A hot oven."))}
    sessions.rename_session(sessions.load_session(ids["named"]), "Weekend baking")
    return ids


def cell(picker, session_id: str):
    """The search hit's cell of a session's row: where it matches."""
    return picker.query_one("DataTable").get_row(session_id)[-1]


def highlighted(text) -> list[str]:
    return [text.plain[span.start:span.end] for span in text.spans if span.style.reverse]


async def search(pilot, query: str):
    """The picker opened, `query` typed into its search box and listed."""
    picker = await open_sessions(pilot)
    search_box = picker.query_one("#sessions-search")
    await pilot.press("slash", *query)
    await waiting.until(pilot, lambda: search_box.value == query and picker.query_text == query)
    return picker


@pytest.mark.asyncio
async def test_the_pickers_search_shows_each_hits_turn_and_the_words_highlighted(profile, engine, data_dir):
    """The picker's search listed the sessions found with no word of where: each row now shows the turn, a
    line around the first word found (control characters shown, white space made one space, an ellipsis
    where cut, fitting the box as it is resized) with the words highlighted; a session found by its title shows
    its title."""
    ids = bakery()
    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        picker = await search(pilot, "sourdough")
        table = picker.query_one("DataTable")
        await waiting.until(pilot, lambda: table.row_count == 2)
        rye, starter = cell(picker, ids["rye"]), cell(picker, ids["starter"])
        assert rye.plain == "turn 2 · …feed ␛[1ma sourdough starter for a week before you…", rye.plain
        assert highlighted(rye) == ["sourdough"]
        assert starter.plain == "turn 1 · What is a sourdough starter?" and highlighted(starter) == ["sourdough"]
        await pilot.resize_terminal(*SMALL)  # the excerpts fit the narrower box
        await waiting.until(pilot, lambda: cell(picker, ids["rye"]).plain == "turn 2 · …sourdough starter…")
        await pilot.press("ctrl+u", *"FLOUR rye")  # every word, any case; each one highlighted where it shows
        await waiting.until(pilot, lambda: table.row_count == 1 and picker.query_text == "FLOUR rye")
        rye = cell(picker, ids["rye"])
        assert rye.plain == "turn 1 · Mix flour, water and salt." and highlighted(rye) == ["flour"]
        await pilot.press("ctrl+u", *"weekend")
        await waiting.until(pilot, lambda: table.row_count == 1 and picker.query_text == "weekend")
        named = cell(picker, ids["named"])
        assert named.plain == "title · Weekend baking" and highlighted(named) == ["Weekend"]
        await pilot.press("ctrl+u")  # no words: the listing's columns again
        await waiting.until(pilot, lambda: table.row_count == 3)
        assert [str(c.label) for c in table.columns.values()] == ["id", "created", "profile", "turns", "title"]


@pytest.mark.asyncio
async def test_down_leaves_the_pickers_search_for_the_list_and_up_comes_back(profile, engine, data_dir):
    """↓ in the picker's search box moved the list's row while the focus stayed in the box: now it gives the
    list the focus, ↑ on the first row gives it back, and enter (from either) opens the highlighted row."""
    from textual.widgets import DataTable, Input

    from dflash_tui.tui.screens.chat import ChatScreen

    ids = bakery()
    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        picker = await search(pilot, "flour")
        table = picker.query_one(DataTable)
        await waiting.until(pilot, lambda: table.row_count == 2)
        found = [key.value for key in table.rows]  # the rows' session ids, as listed
        await pilot.press("down")
        assert isinstance(app.focused, DataTable) and picker._selected() == found[0]
        await pilot.press("down")
        assert picker._selected() == found[1]
        await pilot.press("up")
        assert isinstance(app.focused, DataTable) and picker._selected() == found[0]
        await pilot.press("up")
        assert isinstance(app.focused, Input) and picker._selected() == found[0]
        await pilot.press("r", "y", "e")  # text again: the letters are the search, not the list's keys
        await waiting.until(pilot, lambda: picker.query_text == "flourrye")
        await pilot.press("ctrl+u", *"rye", "down", "down", "enter")  # the only row: ↓ stays on it
        await waiting.until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.conversation.turns, 60)
        assert app.conversation.session_id == ids["rye"]


@pytest.mark.asyncio
async def test_the_pickers_search_fits_80_by_24_and_reads_on_every_theme(profile, engine, data_dir):
    """At 80x24 each hit is one line inside the box, its turn and words on screen and highlighted, the list
    not pushed off it, nothing to scroll sideways; the highlight reads on every theme."""
    bakery()
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        picker = await search(pilot, "flour")
        table = picker.query_one("DataTable")
        await waiting.until(pilot, lambda: table.row_count == 2)
        await pilot.pause()
        box = picker.query_one("#sessions-box").region
        lines = ["".join(s.text for s in strip) for strip in picker._compositor.render_strips()]
        rows = [y for y, line in enumerate(lines) if "turn 1 · " in line]
        assert len(rows) == 2 and all(box.y < y < box.bottom - 1 for y in rows), lines
        assert "2 sessions of 3 hold 'flour'" in "".join(lines)
        assert table.virtual_size.width <= table.scrollable_content_region.width
        for y in rows:
            found = [s.text.lower() for s in picker._compositor.render_strips()[y] if s.style and s.style.reverse]
            assert found == ["flour"] and lines[y].lower().index("flour") < box.right
        failures = await every_theme_reads(pilot, "picker search")
        assert not failures, failures
