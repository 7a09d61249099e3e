"""Issue 46 item 2: answers rendered as Markdown while they stream, every character in its origin's colour.
The renderer's pure functions (lists, quotes, emphasis, fences, ghosts, unclosed markers), then the real app
on the tiny pair: the tiny model cannot be made to write Markdown, so an answer mounted in the real chat
screen is fed known steps (as the screen's flush does) or a recorded turn's segments."""

from __future__ import annotations

import pytest

from tests import waiting

pytest.importorskip("textual")

from rich.style import Style  # noqa: E402 - after the importorskip above

from dflash_tui.engines.events import StepEvent  # noqa: E402
from dflash_tui.tui.widgets.markdown import HIGHLIGHT, Source, code_of, render, render_plain, split  # noqa: E402
from tests.test_contrast import unreadable_text  # noqa: E402 - the contrast scan of a screen
from tests.tui_helpers import SMALL, make_app, ready  # noqa: E402

STYLES = {"draft": Style.parse("bold #00ff00"), "target": Style.parse("#0000ff"), "ghost": Style.parse("strike #ff0000"),
          "plain": Style()}


def source(*segments: tuple[str, str]) -> Source:
    """A Source from (text, origin) pieces as an answer streams them; "ghost" pieces stand where they came."""
    text, starts, kinds, ghost_at, ghost_text = "", [], [], [], []
    for piece, kind in segments:
        if kind == "ghost":
            ghost_at.append(len(text))
            ghost_text.append(piece)
        else:
            starts.append(len(text))
            kinds.append(kind)
            text += piece
    return Source(text, starts, kinds, ghost_at, ghost_text)


def styled(text) -> dict[str, Style]:
    """Each run of a rendered Text by its characters: {"bold": its style}."""
    return {text.plain[span.start:span.end]: span.style for span in text.spans}


def test_lists_quotes_headings_and_rules_keep_the_origin_colours():
    blocks = render(source(("## Steps ##\n- one\n  * two\n3. three\n", "draft"), ("> quoted *and* more\n> > deeper\n", "target"),
                           ("---\nend", "target")), STYLES, rule_width=5)
    assert len(blocks) == 1 and blocks[0].lang is None
    text = blocks[0].text
    assert text.plain == "Steps\n• one\n  • two\n3. three\n▎ quoted and more\n▎ ▎ deeper\n─────\nend"
    runs = styled(text)
    assert runs["Steps"] == STYLES["draft"] + Style(bold=True)  # the marker and closing hashes hidden
    assert runs["•"] == STYLES["draft"] and runs["and"] == STYLES["target"] + Style(italic=True)
    assert runs["─────"].color == STYLES["target"].color


def test_emphasis_nests_and_unclosed_markers_show_as_typed():
    text = render(source(("***both** it* and __strong__ and `co**de**` ", "target"), ("[link](http://x.y)", "draft"),
                         (" snake_case_name **open", "target")), STYLES)[0].text
    assert text.plain == "both it and strong and `co**de**` link (http://x.y) snake_case_name **open"
    runs = styled(text)
    target = STYLES["target"]
    assert runs["both"] == target + Style(italic=True) + Style(bold=True) and runs[" it"] == target + Style(italic=True)
    assert runs["strong"] == target + Style(bold=True)
    assert runs["co**de**"] == target + Style(bold=True)  # code: bold, backticks kept, no emphasis inside
    assert runs["link"] == STYLES["draft"] + Style(underline=True)
    assert text.plain.endswith("**open")  # streaming: unclosed until its closer arrives


def test_fences_split_the_answer_and_an_open_one_is_a_growing_code_block():
    written = "intro\n\n```python title\ndef f():\n    return 1\n```\n  ~~~\n  two\n   three\n  ~~~\n````\nstill ```\nopen"
    spans = split(written)
    assert [(s.lang, s.closed) for s in spans] == [(None, False), ("python", True), ("", True), ("", False)]
    assert [code_of(written, s) for s in spans[1:]] == ["def f():\n    return 1", "two\n three", "still ```\nopen"]
    blocks = render(source((written, "target")), STYLES)
    assert [(b.lang, b.closed) for b in blocks] == [(None, True), ("python", True), ("code", True), ("code", False)]
    assert blocks[0].text.plain == "intro\n" and blocks[1].text.plain == "def f():\n    return 1"


def test_ghosts_stand_where_they_were_rejected_and_are_not_markdown():
    shown = source(("a **b", "draft"), ("**x*", "ghost"), ("** c\n```\nco", "target"), ("de", "ghost"), ("de\n```", "target"))
    prose, code = render(shown, STYLES)
    assert prose.text.plain == "a b**x* c" and styled(prose.text)["**x*"] == STYLES["ghost"]
    assert code.text.plain == "codede" and code.code == "code"
    assert render_plain(shown, STYLES).plain == "a **b**x*** c\n```\ncodede\n```"


def step(*pieces: tuple[str, str], rejected: str = "") -> StepEvent:
    return StepEvent(drafted=[], accepted=0, emitted=[0] * len(pieces), pieces=list(pieces), rejected_text=rejected)


@pytest.mark.asyncio
async def test_an_answer_streams_as_markdown_with_code_blocks_and_thinking_at_80x24(profile, engine, data_dir):
    """The answer as it streams and when done, at 80x24: emphasis added to the origin colour, heading marker
    hidden, the open fence a growing code block, the thinking open until the answer starts and folded then,
    f8 / a click / the palette copy a code block exactly, f9 folds, the find's highlight, f2 as written."""
    from textual.widgets import Collapsible

    from dflash_tui.tui.widgets import AnswerView, UserMessage
    from dflash_tui.tui.widgets.answer import CodeBlock

    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        chat = app.chat
        for n in range(30):  # enough to scroll
            chat.notice(f"line {n}")
        view = AnswerView(thinking=True)
        await chat._view.mount(UserMessage("write f"), view)
        styles = view.styles_by_origin

        def feed(*pieces, rejected=""):  # as the chat screen's flush does
            view.add_events([step(*pieces, rejected=rejected)])
            view.render_text(cheap=True)

        feed(("<think>\nplan the ", "target"), ("code", "draft"))
        await pilot.pause()
        thinking = view.query_one(Collapsible)
        assert thinking.display and not thinking.collapsed  # the only thing streaming: open
        # at the end first (a follower's move there may still be pending: scrolling to the top before it would
        # move nothing, and then the pending move would take the view back to the end)
        await waiting.until(pilot, lambda: 0 < chat._view.max_scroll_y == chat._view.scroll_y)
        chat._view.scroll_to(y=0, animate=False, immediate=True)  # the reader scrolled up
        assert not chat._view.following
        feed(("\n</think>\n\n# Title\n\nSome ", "target"), ("**bold**", "target"), (" text\n```python\ndef f():\n", "draft"))
        await waiting.until(pilot, lambda: view.query(CodeBlock))
        await pilot.wait_for_scheduled_animations()  # Textual's Collapsible scrolled to itself when folded
        assert thinking.collapsed  # the answer started: folded to its title, the reader left where they were
        assert chat._view.scroll_y == 0 and not chat._view.following
        code = view.query_one(CodeBlock)
        assert code.title == "python …" and code.block.text.plain == "def f():"  # a fence still open
        first = view._shown[0].block
        runs = styled(view.answer_rich)
        assert view.answer_rich.plain.startswith("Title\n\nSome bold text\n")
        assert runs["Title"] == styles["target"] + Style(bold=True, underline=True)
        assert runs["bold"] == styles["target"] + Style(bold=True)
        feed(("    return 1\n```\n~~~\necho two\n~~~\nlast line", "draft"))
        view.finish("completed")
        await waiting.until(pilot, lambda: [b.title for b in view.query(CodeBlock)] == ["python", "code"])
        assert view._shown[0].block is first  # a finished block is not rendered again
        chat._view.follow()
        await pilot.pause()
        shown = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "─ python ─" in shown and "─ code ─" in shown and "last line" in shown and "thinking" in shown, shown
        assert not unreadable_text(app)

        await pilot.press("f8")  # the code exactly, then the next block each press
        assert app.clipboard == "def f():\n    return 1"
        assert chat._toasts["copy"].message == "Copied code block 1/2 · python · 2 lines."
        await pilot.press("f8")
        assert app.clipboard == "echo two" and chat._toasts["copy"].message == "Copied code block 2/2 · code · 1 line."
        await pilot.click(view.query_one(CodeBlock), offset=(3, 0))  # its title
        await waiting.until(pilot, lambda: app.clipboard == "def f():\n    return 1")
        await pilot.press("ctrl+p", *"Copy code block 2", "enter")
        await waiting.until(pilot, lambda: app.clipboard == "echo two")
        await pilot.press("ctrl+p", *"Copy thinking", "enter")
        await waiting.until(pilot, lambda: app.clipboard == "plan the code")

        await pilot.press("f9")
        assert not thinking.collapsed and "f9 folds" in thinking.title
        await pilot.press("f9")
        assert thinking.collapsed

        def marked(text):
            return [text.plain[s.start:s.end] for s in text.spans if s.style == HIGHLIGHT]

        view.highlight("TEXT")  # any case, in the text as shown, through a theme change
        app.theme = "textual-light"
        await pilot.pause()
        assert marked(view.answer_rich) == ["text"] and view.styles_by_origin != styles
        view.highlight("Code")
        assert marked(view.thinking_rich) == ["code"] and marked(view.answer_rich) == []
        user = chat.query_one(UserMessage)
        user.highlight("WRITE")
        assert marked(user.content) == ["write"]
        view.highlight(None)
        user.highlight(None)
        assert marked(view.thinking_rich) == marked(user.content) == []

        await pilot.press("f2")  # as written, still coloured
        await waiting.until(pilot, lambda: not view.query(CodeBlock))
        assert view.answer_rich.plain == view.answer_text
        assert {span.style for span in view.answer_rich.spans} == {view.styles_by_origin[k] for k in ("target", "draft")}

        recorded = AnswerView(thinking=True)  # a resumed turn's answer renders the same way
        recorded.set_recorded(view.raw, view.segments)
        await chat._view.mount(recorded)
        recorded.finish("completed")
        await pilot.pause()
        assert recorded.query_one(Collapsible).collapsed and recorded.query_one(CodeBlock).block.code == \
            "def f():\n    return 1"
