"""Issue 46 item 2: answers rendered as Markdown while they stream, every character in its origin's colour.
The renderer's pure functions: lists, quotes, emphasis, fences, ghosts, unclosed markers."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from rich.style import Style  # noqa: E402 - after the importorskip above

from dflash_tui.tui.widgets.markdown import Source, code_of, render, render_plain, split  # noqa: E402

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
