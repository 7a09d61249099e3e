"""Searching saved sessions, as the session picker does at each key typed: the sessions whose prompts,
answers or name hold every word of a query (any case), each with where (`Match`): the turn, and one line
around the first word found with the words' spans in it, to highlight.

A session's text is made searchable once (`Session.passages`, core/sessions.py: each prompt and answer on
one printable line with its lower case), so a search reads no file and redoes no escaping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

from rich.cells import cell_len, get_character_cell_size

from dflash_tui.core.terminal import one_line

if TYPE_CHECKING:
    from dflash_tui.core.sessions import Session

SNIPPET_WIDTH = 60  # cells of a search hit's excerpt, the most a listing row gives it
WORD = 12  # characters: a word cut at an excerpt's end is left out up to this long


@dataclass(frozen=True)
class Passage:
    """One text of a session as a search reads it: a turn's prompt or answer, or the session's name (turn 0),
    on one line as a listing shows it, with its lower case beside it, character for character."""
    turn: int  # 1 for the first turn
    text: str  # printable, runs of white space made one space (one_line)
    folded: str  # fold(text): a position in one is the same position in the other


@dataclass(frozen=True)
class Match:
    """A session a search found, and where: the turn (1 for the first; 0 when only its name holds the words)
    and one line around the first word found, an ellipsis where it is cut, with the spans of the words
    searched for in it (the first word found first). No words searched: every session, with no excerpt."""
    session: Session
    turn: int
    snippet: str
    spans: tuple[tuple[int, int], ...]


def fold(text: str) -> str:
    """`text` in lower case, one character for one (a character whose lower case is longer, as İ's, keeps
    its first), so that a position found in the fold is the same position in `text`."""
    folded = text.lower()
    return folded if len(folded) == len(text) else "".join(c.lower()[0] for c in text)


def passages(texts: Iterable[tuple[int, str]]) -> tuple[Passage, ...]:
    """The non-empty texts, (turn, text) each, made searchable."""
    lines = [(turn, one_line(text)) for turn, text in texts]
    return tuple(Passage(turn, line, fold(line)) for turn, line in lines if line)


def search(found: list[Session], query: str, width: int = SNIPPET_WIDTH) -> list[Match]:
    """The sessions (in their order) whose prompts, answers or name hold every word of `query`, in any case;
    each excerpt fits `width` cells."""
    words = [fold(word) for word in query.split()]
    return [hit for hit in (find(session, words, width) for session in found) if hit is not None]


def find(session: Session, words: list[str], width: int = SNIPPET_WIDTH) -> Optional[Match]:
    """`session`'s Match for the folded `words`, None unless it holds each of them: the excerpt is around the
    first passage's first word found (its prompts and answers before its name)."""
    texts = session.passages
    if not all(any(word in p.folded for p in texts) for word in words):
        return None
    for passage in texts:
        hits = [(at, at + len(word)) for word in words if (at := passage.folded.find(word)) >= 0]
        if hits:
            start, end = min(hits, key=lambda hit: (hit[0], -hit[1]))
            return _excerpt(session, passage, words, start, end, width)
    return Match(session, 0, "", ())


def _excerpt(session: Session, passage: Passage, words: list[str], start: int, end: int, width: int) -> Match:
    """The Match of `passage.text[start:end]` with what is around it in `width` cells: the whole text when it
    fits, else a third of the room before it and the rest after (before it too when the text ends first), an
    ellipsis on each side cut."""
    text = passage.text
    if cell_len(text) <= width:  # whole
        return Match(session, passage.turn, text, _spans(passage.folded, words, 0, len(text), start, end, 0))
    while end - start > 1 and cell_len(text[start:end]) > width - 2:  # a word longer than the line
        end -= 1
    room = width - 2 - cell_len(text[start:end])  # 2: the ellipses
    left, right, before = start, end, room // 3
    while left > 0 and (size := get_character_cell_size(text[left - 1])) <= before:
        left, before, room = left - 1, before - size, room - size
    while right < len(text) and (size := get_character_cell_size(text[right])) <= room:
        right, room = right + 1, room - size
    while left > 0 and (size := get_character_cell_size(text[left - 1])) <= room:
        left, room = left - 1, room - size
    # no word cut in half at either end (but a long run without spaces, a link or a number, is cut)
    if left > 0 and text[left - 1] != " " and (space := text.find(" ", left, min(start, left + WORD))) >= 0:
        left = space + 1
    if right < len(text) and text[right] != " " and (space := text.rfind(" ", max(end, right - WORD), right)) >= 0:
        right = space
    snippet = ("…" if left > 0 else "") + text[left:right] + ("…" if right < len(text) else "")
    shift = left - (1 if left > 0 else 0)
    return Match(session, passage.turn, snippet, _spans(passage.folded, words, left, right, start, end, shift))


def _spans(folded: str, words: list[str], left: int, right: int, start: int, end: int,
           shift: int) -> tuple[tuple[int, int], ...]:
    """Where the words lie whole in `folded[left:right]`, and the first word found (`start` to `end`, cut short
    when longer than the line), overlaps merged, as positions in the excerpt (`shift` before `left`)."""
    spans = [(start, end)]
    for word in words:
        at = folded.find(word, left)
        while at >= 0 and at + len(word) <= right:
            spans.append((at, at + len(word)))
            at = folded.find(word, at + len(word))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return tuple((a - shift, b - shift) for a, b in merged)
