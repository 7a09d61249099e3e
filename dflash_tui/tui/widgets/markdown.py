"""Markdown rendered as an answer streams, every character in the colour of its origin (the draft's, the
target's). Textual's Markdown widget renders a finished document in one style per element; an answer needs
the token colours kept under the Markdown, and a new frame every tenth of a second while it grows.

The answer is cut into blocks (`split`): prose, and fenced code blocks (``` or ~~~, with an info string; an
unclosed fence is a code block that is still growing). Prose is rendered line by line: headings (bold, the
marker hidden), bullets drawn as •, numbered items as typed, blockquotes behind a bar, rules; inline
**bold**, *italic*, `code` (bold, its backticks kept: a background tint would take the colours under 3:1),
links as their underlined text with the url after it. Markdown adds bold, italic or underline to the
origin's style; the colour stays. Unclosed markers show as typed. Line breaks are kept as written (a
chat's lines are its layout), and so is indentation. "---" is always a rule (no setext headings: a line
above it must not turn into a heading a frame later). Each line is one regex scan, emphasis matched within
the line, so the cost grows with the text; a finished block renders the same every frame (the answer caches
it, and splits again only from its last block).

Rejected draft proposals (ghosts) are not Markdown: each shows before the character it stood before, in
its own style."""

from __future__ import annotations

import re
import string
import unicodedata
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Optional, Sequence

from rich.style import Style
from rich.text import Text

from dflash_tui.core.terminal import printable

BOLD, ITALIC, UNDERLINE = 1, 2, 4
BULLET, BAR, RULE_CHAR = "•", "▎ ", "─"
HIGHLIGHT = Style(reverse=True, bold=True)  # reversed, a pair keeps its contrast

FENCE = re.compile(r"([ \t]*)(`{3,}|~{3,})[ \t]*([^\n]*)")
QUOTE = re.compile(r" {0,3}> ?")
HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+|$)")
CLOSING_HASHES = re.compile(r"[ \t]+#+[ \t]*$")
RULE = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
ITEM = re.compile(r"([ \t]*)([-*+])(?:[ \t]+|$)")
# one inline token: an escape, a backtick run, an emphasis run, an autolink, a link's brackets
INLINE = re.compile(r"\\[!-/:-@\[-`{-~]|`+|\*+|_+|<https?://[^\s<>]*>|\[|\]\([^()\s]*\)|\]")
TICKS = re.compile(r"`+")


@dataclass(frozen=True)
class Source:
    """Text in origin runs: run i (of kind `kinds[i]`) starts at `starts[i]`; ghost i (`ghost_text[i]`)
    shows before the character at `ghost_at[i]`. The answer widget extends its lists as tokens stream."""

    text: str
    starts: Sequence[int]
    kinds: Sequence[str]
    ghost_at: Sequence[int] = ()
    ghost_text: Sequence[str] = ()


@dataclass(frozen=True)
class Span:
    """A block of the source, [start, end): prose, or a fenced code block (`lang` not None) whose code lies
    in [body, body_end) indented by `indent` columns, still open while `closed` is False."""

    start: int
    end: int
    lang: Optional[str] = None
    body: int = 0
    body_end: int = 0
    indent: int = 0
    closed: bool = False


@dataclass(frozen=True)
class Block:
    """A block as shown: prose, or a code block with its language ("code" when the fence named none) and its
    code exactly (no fences, no indentation of the fence)."""

    text: Text
    lang: Optional[str] = None
    code: str = ""
    closed: bool = True


def split(text: str, start: int = 0) -> list[Span]:
    """The blocks of `text` from `start`, in order: paragraphs (with the blank lines after them) and fenced
    code blocks (the last one may be open). Only the last block changes as the text grows: split again from
    its start, the blocks before it stand."""
    spans: list[Span] = []
    prose = pos = start
    fence: Optional[tuple[int, str, str, int]] = None  # an open fence: its start, marker, language, indent
    body = 0
    blank = False  # the line before was blank: a paragraph ends
    while pos < len(text):
        eol = text.find("\n", pos)
        eol = len(text) if eol < 0 else eol
        after = min(eol + 1, len(text))
        m = FENCE.match(text, pos, eol)
        if fence is None:
            opens = m is not None and not (m.group(2)[0] == "`" and "`" in m.group(3))
            if pos > prose and (opens or (blank and text[pos:eol].strip())):
                spans.append(Span(prose, pos))
                prose = pos
            blank = not text[pos:eol].strip()
            if opens and m is not None:
                fence, body = (pos, m.group(2), (m.group(3).split() or [""])[0], len(m.group(1))), after
        elif m and not m.group(3).strip() and m.group(2)[0] == fence[1][0] and len(m.group(2)) >= len(fence[1]):
            opened, _, lang, indent = fence
            spans.append(Span(opened, after, lang, body, pos, indent, closed=True))
            fence, prose, blank = None, after, False
        pos = after
    if fence is not None:
        opened, _, lang, indent = fence
        spans.append(Span(opened, len(text), lang, min(body, len(text)), len(text), indent))
    elif prose < len(text) or not spans:  # (an empty text is one empty paragraph)
        spans.append(Span(prose, len(text)))
    return spans


def code_of(text: str, span: Span) -> str:
    """A code block's code: its lines without the fence's indentation, no newline after the last."""
    lines = text[span.body:span.body_end].removesuffix("\n").split("\n")
    return "\n".join(_dedent(line, span.indent) for line in lines) if span.body < span.body_end else ""


def _dedent(line: str, indent: int) -> str:
    return line[_indent_of(line, indent):]


def _indent_of(line: str, indent: int) -> int:
    """How many of `line`'s leading blanks a code block drops: up to its fence's `indent`."""
    return min(indent, len(line) - len(line.lstrip(" \t")))


class _Writer:
    """Appends source ranges to a Text in their origins' styles (plus Markdown attributes), putting each
    ghost before the character it stood before."""

    def __init__(self, source: Source, styles: dict, start: int = 0) -> None:
        self.source, self.styles = source, styles
        self.out = Text()
        self.ghost = bisect_left(source.ghost_at, start)
        self._cache: dict[tuple[str, int], Style] = {}

    def style(self, kind: str, attrs: int) -> Style:
        key = (kind, attrs)
        if key not in self._cache:
            base = self.styles.get(kind) or self.styles["plain"]
            self._cache[key] = base + Style(bold=True if attrs & BOLD else None, italic=True if attrs & ITALIC else None,
                                            underline=True if attrs & UNDERLINE else None) if attrs else base
        return self._cache[key]

    def kind_at(self, pos: int) -> str:
        return self.source.kinds[max(0, bisect_right(self.source.starts, pos) - 1)]

    def ghosts(self, upto: int) -> None:
        """The ghosts that stood before `upto` (or at it) and are not shown yet."""
        at, ghosts = self.source.ghost_at, self.source.ghost_text
        while self.ghost < len(at) and at[self.ghost] <= upto:
            self.out.append(printable(ghosts[self.ghost]), self.style("ghost", 0))
            self.ghost += 1

    def chars(self, a: int, b: int, attrs: int = 0) -> None:
        src = self.source
        run = max(0, bisect_right(src.starts, a) - 1)
        while a < b:
            self.ghosts(a)
            stop = min(b, src.starts[run + 1] if run + 1 < len(src.starts) else b)
            if self.ghost < len(src.ghost_at):
                stop = min(stop, src.ghost_at[self.ghost])
            self.out.append(printable(src.text[a:stop]), self.style(src.kinds[run], attrs))
            a = stop
            while run + 1 < len(src.starts) and a >= src.starts[run + 1]:
                run += 1

    def insert(self, pos: int, text: str, attrs: int = 0) -> None:
        """`text` shown in place of source characters at `pos`, in their origin's style."""
        self.ghosts(pos)
        self.out.append(text, self.style(self.kind_at(pos), attrs))

    def newline(self, eol: int) -> None:
        self.ghosts(eol)
        self.out.append("\n")


def _lines(text: str, a: int, b: int):
    """(start, end) of each line in [a, b), a newline at b ending the last."""
    while a < b:
        eol = text.find("\n", a, b)
        eol = b if eol < 0 else eol
        yield a, eol
        a = eol + 1


def render_block(source: Source, span: Span, styles: dict, rule_width: int = 40, last: bool = False) -> Block:
    """One block of `split(source.text)` as shown; the `last` block takes the ghosts that stood after it."""
    w = _Writer(source, styles, span.start)
    text = source.text
    if span.lang is not None:
        lines = list(_lines(text, span.body, span.body_end))
        for n, (a, eol) in enumerate(lines):
            w.chars(a + _indent_of(text[a:eol], span.indent), eol)
            if n + 1 < len(lines):
                w.newline(eol)
        w.ghosts(len(text) if last else span.end - 1)
        return Block(w.out, span.lang or "code", code_of(text, span), span.closed)
    lines = list(_lines(text, span.start, span.end))
    for n, (a, eol) in enumerate(lines):
        _prose_line(w, text, a, eol, rule_width)
        if n + 1 < len(lines):
            w.newline(eol)
    w.ghosts(len(text) if last else span.end - 1)
    return Block(w.out)


def render(source: Source, styles: dict, rule_width: int = 40) -> list[Block]:
    """The whole of `source` as blocks (the answer widget renders block by block to cache the finished ones)."""
    spans = split(source.text)
    return [render_block(source, span, styles, rule_width, last=n == len(spans) - 1) for n, span in enumerate(spans)]


def render_plain(source: Source, styles: dict, start: int = 0, end: Optional[int] = None,
                 ghost_after: bool = True) -> Text:
    """[start, end) of `source` as written (its Markdown unrendered), in its origins' styles, ghosts in place
    (with `ghost_after`, those that stood at `end` too)."""
    end = len(source.text) if end is None else end
    w = _Writer(source, styles, start)
    w.chars(start, end)
    w.ghosts(end if ghost_after else end - 1)
    return w.out


def highlight(text: Text, query: Optional[str]) -> Text:
    """`text` with every occurrence of `query` (any case) marked by HIGHLIGHT."""
    if query:
        for m in re.finditer(re.escape(query), text.plain, re.IGNORECASE):
            text.stylize(HIGHLIGHT, m.start(), m.end())
    return text


def _prose_line(w: _Writer, text: str, a: int, eol: int, rule_width: int) -> None:
    while m := QUOTE.match(text, a, eol):
        w.insert(m.start(), BAR)
        a = m.end()
    if RULE.match(text, a, eol):
        w.insert(a, RULE_CHAR * rule_width)
        return
    if m := HEADING.match(text, a, eol):
        closing = CLOSING_HASHES.search(text, m.end(), eol)
        _inline(w, text, m.end(), closing.start() if closing else eol, BOLD | (UNDERLINE if len(m.group(1)) == 1 else 0))
        return
    if m := ITEM.match(text, a, eol):
        w.chars(a, m.start(2))
        w.insert(m.start(2), BULLET)
        a = m.start(2) + 1
    _inline(w, text, a, eol, 0)


@dataclass
class _Run:
    """An emphasis delimiter run: its characters not yet matched are [left, right)."""

    char: str
    left: int
    right: int
    opens: bool
    closes: bool
    length: int  # as written

    @property
    def both(self) -> bool:
        return self.opens and self.closes


def _punctuation(ch: str) -> bool:
    return ch in string.punctuation or unicodedata.category(ch)[0] in "PS"


def _run(text: str, s: int, e: int, a: int, b: int) -> _Run:
    """CommonMark's flanking rules: whether the run at [s, e) may open or close emphasis."""
    before = text[s - 1] if s > a else " "
    after = text[e] if e < b else " "
    left = not after.isspace() and (not _punctuation(after) or before.isspace() or _punctuation(before))
    right = not before.isspace() and (not _punctuation(before) or after.isspace() or _punctuation(after))
    if text[s] == "_":
        return _Run("_", s, e, left and (not right or _punctuation(before)), right and (not left or _punctuation(after)),
                    e - s)
    return _Run("*", s, e, left, right, e - s)


def _emphasis(runs: list[_Run], marks: list[tuple[int, int, int]]) -> None:
    """Match the delimiter runs (CommonMark's rules, in short); matched markers hidden (-1), emphasis marked.
    As CommonMark's reference does, a closer that found no opener remembers how far down it looked, so a
    line of unmatched markers costs its length, not its square."""
    stack: list[_Run] = []
    bottoms: dict[tuple[str, bool, int], int] = {}  # per kind of closer: the stack below holds no opener for it
    for run in runs:
        if run.closes:
            key = (run.char, run.opens, run.length % 3)
            i = len(stack) - 1
            while i >= bottoms.get(key, 0) and run.left < run.right:
                opener = stack[i]
                if opener.char != run.char or ((opener.both or run.both) and (opener.length + run.length) % 3 == 0
                                               and (opener.length % 3 or run.length % 3)):
                    i -= 1
                    continue
                k = 2 if opener.right - opener.left >= 2 and run.right - run.left >= 2 else 1
                marks += [(opener.right - k, opener.right, -1), (run.left, run.left + k, -1),
                          (opener.right, run.left, BOLD if k == 2 else ITALIC)]
                opener.right -= k
                run.left += k
                del stack[i + 1:]
                if opener.left == opener.right:
                    stack.pop()
                    i -= 1
                bottoms = {k: min(v, len(stack)) for k, v in bottoms.items()}
            if run.left < run.right:
                bottoms[key] = len(stack)
        if run.opens and run.left < run.right:
            stack.append(run)


def _inline(w: _Writer, text: str, a: int, b: int, base: int) -> None:
    """Inline Markdown in [a, b): marks as (start, end, attribute), -1 hiding the characters; then written."""
    marks: list[tuple[int, int, int]] = []
    inserts: list[tuple[int, str]] = []
    runs: list[_Run] = []
    brackets: list[int] = []
    closers = _code_closers(text, a, b)
    pos = a
    while m := INLINE.search(text, pos, b):
        s, e = m.span()
        token = m.group()
        pos = e
        if token[0] == "\\":
            marks.append((s, s + 1, -1))
        elif token[0] == "`":
            close = closers.get(s, -1)
            if close >= 0:
                marks.append((e, close, BOLD))
                pos = close + len(token)
        elif token[0] in "*_":
            runs.append(_run(text, s, e, a, b))
        elif token[0] == "<":
            marks += [(s, s + 1, -1), (s + 1, e - 1, UNDERLINE), (e - 1, e, -1)]
        elif token == "[":
            brackets.append(s)
        elif brackets:
            opened = brackets.pop()
            if token != "]":  # "](url)": a link
                url = text[s + 2:e - 1]
                marks += [(opened, opened + 1, -1), (opened + 1, s, UNDERLINE), (s, s + 1, -1)]
                if url and url != text[opened + 1:s]:
                    inserts.append((s + 1, " "))
                else:
                    marks.append((s + 1, e, -1))
    _emphasis(runs, marks)
    _write(w, a, b, base, marks, inserts)


def _code_closers(text: str, a: int, b: int) -> dict[int, int]:
    """For each backtick run in [a, b), where the next run as long starts: the run that closes a code span
    opened there (none: it shows as typed)."""
    found = [(m.start(), m.end() - m.start()) for m in TICKS.finditer(text, a, b)]
    closers: dict[int, int] = {}
    later: dict[int, int] = {}
    for start, length in reversed(found):
        if length in later:
            closers[start] = later[length]
        later[length] = start
    return closers


def _write(w: _Writer, a: int, b: int, base: int, marks: list[tuple[int, int, int]],
           inserts: list[tuple[int, str]]) -> None:
    """Write [a, b) piece by piece between the marks' edges, with the attributes in force on each piece."""
    edges: dict[int, list[tuple[int, int]]] = {a: [], b: []}
    for s, e, attr in marks:
        if s < e:
            edges.setdefault(s, []).append((attr, 1))
            edges.setdefault(e, []).append((attr, -1))
    placed = dict(inserts)
    for p in placed:
        edges.setdefault(p, [])
    counts = {-1: 0, BOLD: 0, ITALIC: 0, UNDERLINE: 0}
    points = sorted(edges)
    for n, p in enumerate(points[:-1]):
        for attr, change in edges[p]:
            counts[attr] += change
        if p in placed:
            w.insert(p, placed[p], base)
        if not counts[-1]:
            attrs = base | sum(attr for attr in (BOLD, ITALIC, UNDERLINE) if counts[attr])
            w.chars(p, points[n + 1], attrs)
