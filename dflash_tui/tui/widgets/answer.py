"""Messages in the conversation. An answer is coloured by origin (accepted draft tokens vs the
target's own), may show rejected proposals as ghosts, and puts its thinking text in a collapsible block
above the answer (folded to its title once the answer starts; f9 or a click opens it). The answer is
rendered as Markdown while it streams, in the same origin colours (widgets/markdown.py), one widget per
paragraph or code block so a frame re-renders only the block that grows; f2 shows it as written. Each code
block is framed under its language and can be copied on its own (f8, or a click on its title).

Origin colours are picked for the theme's background (a light theme needs darker ones) and nudged
until they stand out from it by WCAG contrast `MIN_CONTRAST`; answers re-render when the theme changes.
A resumed answer gets its colours back from the turn's recorded ids and steps (`recorded_segments`).
The find marks what it found in the messages (`highlight`), reversed so the colours keep their contrast."""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterable, Optional

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Button, Collapsible, Static
from textual.widgets._collapsible import CollapsibleTitle

from dflash_tui.core.terminal import counted, printable
from dflash_tui.engines.detokenize import StreamingDetokenizer
from dflash_tui.engines.reasoning import THINK
from dflash_tui.tui.contrast import origin_styles, theme_background
from dflash_tui.tui.widgets.markdown import Block, Source, Span, code_of, highlight, render_block, render_plain, split

LAYOUT_EVERY_S = 0.3  # while streaming, a new row shows within this; text in existing rows every frame
PARAGRAPH_LINES = 40  # paragraphs share a widget up to about this many lines


def recorded_segments(decode, prompt_ids: list[int], emitted_ids: list[int], steps: list) -> list[tuple[str, str]]:
    """A recorded turn's text split by origin, ghosts included, as it streamed: the first id is the
    target's (sampled from the prefill), then each step emitted its `accepted` drafted ids and one of
    the target's (the last step cut at the stop id). Decoded exactly as the engine did (in context)."""
    detok = StreamingDetokenizer(decode, prompt_ids)
    segments: list[tuple[str, str]] = []
    at = 1
    pieces = detok.add_tokens(emitted_ids[:1], ["target"])
    for step in steps:
        drafted, accepted = step["drafted"], step["accepted"]
        ids = emitted_ids[at:at + accepted + 1]
        at += len(ids)
        pieces += detok.add_tokens(ids, ["draft"] * min(accepted, len(ids)) + ["target"] * (len(ids) - accepted))
        segments += pieces
        pieces = []
        if drafted[accepted:]:
            segments.append((detok.peek(drafted[accepted:]), "ghost"))
    segments += pieces + [(detok.flush(), "target")]
    return [(text, kind) for text, kind in segments if text]


def recorded_think_tokens(decode, emitted_ids: list[int], fmt=THINK) -> int:
    """How many of a recorded turn's ids its thinking took: up to the one that closes it (all of them while
    it never closed), found by bisection over decoded prefixes; `fmt`: the family's thinking format."""
    if not emitted_ids or not fmt.thought(decode(emitted_ids)):
        return len(emitted_ids)
    low, high = 1, len(emitted_ids)  # the shortest prefix whose text holds the close
    while low < high:
        mid = (low + high) // 2
        if fmt.thought(decode(emitted_ids[:mid])):
            high = mid
        else:
            low = mid + 1
    return low


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(self._shown(text, None))
        self.text = text  # as typed: what f3 copies and ctrl+f finds
        self.found: Optional[str] = None  # the text the find marks in it

    @staticmethod
    def _shown(text: str, found: Optional[str]) -> Text:
        shown = Text()
        shown.append("you  ", style="bold")
        shown.append_text(highlight(Text(printable(text)), found))
        return shown

    def highlight(self, query: Optional[str]) -> None:
        """Mark every occurrence of `query` (any case) in the text; None clears."""
        if (query or None) != self.found:
            self.found = query or None
            self.update(self._shown(self.text, self.found))


class NoticeLine(Static):
    """A one-line notice in the conversation (context trimmed, engine warnings, reloads)."""


class Welcome(Vertical):
    """The first screen of a chat: what the loaded model is for, and its example prompts as buttons
    (click, or shift+tab from the message box and enter) that fill the message box."""

    DEFAULT_CSS = """
    Welcome { height: auto; padding: 1 0; }
    Welcome .welcome-title { text-style: bold; }
    Welcome .welcome-hint { color: $text-muted; margin: 1 0 0 0; }
    Welcome Button { width: auto; min-width: 0; margin: 0 0 0 2; }
    """

    class Chosen(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    DEMO = ("A tiny model: short, independent questions like these; it forgets past a few hundred tokens. "
            "A real assistant: dflash chat --profile qwen3-8b")

    def __init__(self, name: str, description: str, examples: Iterable[str], demo: bool = False,
                 earlier: int = 0) -> None:
        super().__init__()
        self.title, self.description, self.examples = name, description, tuple(examples)
        self.demo, self.earlier = demo, earlier

    def compose(self) -> ComposeResult:
        yield Static(f"{self.title}: {self.description}" if self.description else self.title, classes="welcome-title")
        if self.demo:
            yield Static(self.DEMO, classes="welcome-demo")
        if self.examples:
            yield Static("Try one (click it, or shift+tab to it and press enter; it fills the message box):",
                         classes="welcome-hint")
            for example in self.examples:
                yield Button(printable(example), classes="welcome-example", compact=True)  # one row each
        yield Static("Green text came free from the draft, blue is the target's own; f1 lists every key.",
                     classes="welcome-hint")
        if self.earlier:
            yield Static(f"ctrl+o resumes an earlier session ({self.earlier} saved); from the shell, "
                         "dflash chat -c continues the last one.", classes="welcome-hint")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        index = list(self.query(Button)).index(event.button)
        self.post_message(self.Chosen(self.examples[index]))


Parts = tuple[Block, ...]  # what one widget shows: paragraphs one under another, or one code block


def joined(parts: Parts) -> Block:
    return parts[0] if len(parts) == 1 else Block(Text("\n").join(part.text for part in parts))


class TextBlock(Static):
    """Part of an answer as shown (a few paragraphs, or the thinking). `rows`: the rows it was last laid
    out for, so a frame that cannot change its height skips the layout pass (AnswerView._height_changed)."""

    def __init__(self, parts: Parts, **kwargs) -> None:
        self.parts, self.block = parts, joined(parts)
        super().__init__(self.block.text, **kwargs)
        self.rows: Optional[int] = None

    def show(self, parts: Parts, block: Block, layout: bool) -> None:
        self.parts, self.block = parts, block
        self.update(block.text, layout=layout)

    def shows(self, parts: Parts) -> bool:
        """Whether it shows these very parts (a finished block is rendered once, then kept)."""
        return len(parts) == len(self.parts) and all(a is b for a, b in zip(parts, self.parts))


class CodeBlock(TextBlock):
    """A fenced code block in a frame titled with its language; a click on the title or the "copy" label
    below copies its code (the chat screen does, as f8 does)."""

    DEFAULT_CSS = """
    CodeBlock {
        height: auto;
        margin: 0 0 0 3;  /* its code lines up with the paragraphs' (padded 5) */
        padding: 0 1;
        border: round $foreground 50%;
        border-title-color: $foreground;
        border-title-style: bold;
        border-subtitle-color: $foreground;
    }
    """

    class Clicked(Message):
        def __init__(self, block: "CodeBlock") -> None:
            super().__init__()
            self.block = block

    def __init__(self, parts: Parts) -> None:
        super().__init__(parts, classes="code-block")
        self.border_subtitle = "copy · f8"
        self.title = ""
        self._title(self.block)

    def show(self, parts: Parts, block: Block, layout: bool) -> None:
        super().show(parts, block, layout)
        self._title(block)

    def _title(self, block: Block) -> None:
        title = printable(block.lang or "code") + ("" if block.closed else " …")
        if self.title != title:
            self.title = title
            self.border_title = Content(title)  # the model's words: never markup

    def on_click(self, event: events.Click) -> None:
        if event.y in (0, self.outer_size.height - 1):  # the frame's title or its "copy" label
            event.stop()
            self.post_message(self.Clicked(self))


class Thinking(Collapsible):
    """The thinking above an answer, folded to its title once the answer starts. It stays where it is when
    folded or opened: Textual's Collapsible scrolls itself into view then, and that moved a reader who had
    scrolled up while the answer streamed (the conversation keeps their line itself)."""

    def scroll_visible(self, *args, **kwargs) -> None:
        pass


@dataclass(frozen=True)
class CodePick:
    """A code block picked to copy: its code exactly, and where it stands among the answer's blocks."""

    code: str
    lang: str
    number: int
    total: int

    @property
    def said(self) -> str:
        lines = counted(self.code.count("\n") + 1 if self.code else 0, "line")
        return f"Copied code block {self.number}/{self.total} · {printable(self.lang)} · {lines}."


class AnswerView(Vertical):
    """An answer: its thinking (folded once the answer starts), then the answer rendered as Markdown as it
    streams (widgets/markdown.py), or as written (f2), in origin colours either way."""

    class Selected(Message):
        def __init__(self, answer: "AnswerView") -> None:
            super().__init__()
            self.answer = answer

    class CopyCode(Message):
        """A click on a code block's title: the chat copies block `index` of `answer`."""

        def __init__(self, answer: "AnswerView", index: int) -> None:
            super().__init__()
            self.answer, self.index = answer, index

    DEFAULT_CSS = """
    AnswerView .answer-body { height: auto; }
    """

    def __init__(self, thinking: bool, ghosts: bool = False, fmt=THINK, **kwargs) -> None:
        super().__init__(**kwargs)
        self.thinking = thinking
        self.fmt = fmt  # how the family's answers carry their thinking (engines/reasoning.py)
        self.ghosts = ghosts
        self.segments: list[tuple[str, str]] = []
        self.raw = ""
        self.think_tokens = 0
        self.status = "streaming"
        self.markdown = True  # the answer rendered as Markdown; False: as written (f2)
        self.found: Optional[str] = None  # the text the find marks in it
        self.styles_by_origin = origin_styles(Color(0, 0, 0))
        self._laid_out = 0.0
        self._rendered: dict[tuple[int, int], Block] = {}  # finished blocks by their source range
        self._thought: Optional[tuple[int, int, int]] = None  # the thinking shown: its range and ghosts
        self._folded = False  # folded once the answer started (after that only f9 and clicks fold it)
        self._code_at = -1  # the code block f8 copied last
        self._width = 0
        self._index: tuple[list[int], list[str], list[int], list[str]] = ([], [], [], [])  # see _source
        self._indexed = (0, 0, 0, 0)  # segments indexed (but the last), the text they spell, runs, ghosts
        self._spans: list[Span] = []  # the answer's blocks when last split
        self._thinking_text = TextBlock((Block(Text()),), classes="thinking-text")
        self._shown: list[TextBlock] = [TextBlock((Block(Text()),), classes="answer-text")]

    def compose(self) -> ComposeResult:
        with Thinking(title="thinking", collapsed=False, classes="thinking"):
            yield self._thinking_text
        with Vertical(classes="answer-body"):
            yield from self._shown
        yield Static(classes="answer-footer")

    def on_mount(self) -> None:
        thinking = self.query_one(Collapsible)
        thinking.display = False
        for title in thinking.query(CollapsibleTitle):  # a click folds it; tab does not stop on every answer
            title.can_focus = False
        self.watch(self.app, "theme", self._theme_changed)  # init: styles for the theme in use, then render

    def _theme_changed(self) -> None:
        self.styles_by_origin = origin_styles(theme_background(self.app.current_theme))
        self._restyle()

    def _restyle(self) -> None:
        """Render everything again (colours, ghosts, the find's marks or the rule's width changed)."""
        self._rendered.clear()
        self._thought = None
        if self.is_mounted:
            self.render_text()

    def on_resize(self) -> None:
        if self.size.width != self._width:  # a rule spans the width
            self._width = self.size.width
            self._restyle()

    # -- streaming -------------------------------------------------------------------------------
    def add_events(self, events: Iterable) -> None:
        for event in events:
            if self.thinking and not self.fmt.thought(self.raw):
                self.think_tokens += len(event.emitted)
            for text, origin in event.pieces:
                self._append(text, origin)
                self.raw += text
            if event.rejected_text:
                self._append(event.rejected_text, "ghost")

    def _append(self, text: str, kind: str) -> None:
        # one span per run of the same origin: fewer spans, cheaper frames
        if self.segments and self.segments[-1][1] == kind:
            self.segments[-1] = (self.segments[-1][0] + text, kind)
        else:
            self.segments.append((text, kind))

    def set_recorded(self, text: str, segments: list[tuple[str, str]]) -> None:
        """A recorded answer: coloured from `segments` (see `recorded_segments`) when they spell exactly
        `text`, else (another tokenizer, a continued turn's earlier part) the rest of `text` shown plain."""
        spelled = "".join(piece for piece, kind in segments if kind != "ghost")
        if not text.endswith(spelled):
            segments, spelled = [], ""
        head = text[:len(text) - len(spelled)]
        self.segments = []
        for piece, kind in [(head, "plain"), *segments]:
            if piece:
                self._append(piece, kind)
        self.raw = text
        self._indexed, self._spans = (0, 0, 0, 0), []
        self._restyle()

    def set_ghosts(self, on: bool) -> None:
        if on != self.ghosts:
            self.ghosts = on
            self._restyle()

    def highlight(self, query: Optional[str]) -> None:
        """Mark every occurrence of `query` (any case) in the thinking and the answer as shown; None clears."""
        if (query or None) != self.found:
            self.found = query or None
            self._restyle()

    async def show_markdown(self, on: bool) -> None:
        """The answer rendered as Markdown (on), or as written; origin colours either way."""
        self.markdown = on
        self._restyle()

    @property
    def answer_text(self) -> str:
        _, _, answer = self.fmt.layout(self.raw, self.thinking)
        return self.raw[answer:]

    @property
    def thinking_text(self) -> str:
        start, end, _ = self.fmt.layout(self.raw, self.thinking)
        return self.raw[start:end]

    @property
    def answer_rich(self) -> Text:
        """The answer as shown, its blocks one after another."""
        return Text("\n").join(widget.block.text for widget in self._shown)

    @property
    def thinking_rich(self) -> Text:
        return self._thinking_text.block.text

    # -- code blocks ------------------------------------------------------------------------------
    @property
    def code_blocks(self) -> list[tuple[str, str]]:
        """(language, code) of each fenced code block in the answer."""
        text = self.answer_text
        return [(span.lang or "code", code_of(text, span)) for span in split(text) if span.lang is not None]

    def pick_code(self, index: Optional[int] = None) -> Optional[CodePick]:
        """Code block `index`; by default the one after the block picked last (round the answer). None: it
        has no code block."""
        blocks = self.code_blocks
        if not blocks:
            return None
        self._code_at = (self._code_at + 1 if index is None else index) % len(blocks)
        lang, code = blocks[self._code_at]
        return CodePick(code, lang, self._code_at + 1, len(blocks))

    def on_code_block_clicked(self, message: CodeBlock.Clicked) -> None:
        message.stop()
        shown = [widget for widget in self._shown if isinstance(widget, CodeBlock)]
        self.post_message(self.CopyCode(self, shown.index(message.block)))

    # -- thinking ---------------------------------------------------------------------------------
    def fold_thinking(self) -> bool:
        """Fold or unfold the thinking (f9); False when the answer shows none."""
        collapsible = self.query_one(Collapsible)
        if not collapsible.display:
            return False
        self._folded = True  # the reader's choice from now on
        collapsible.collapsed = not collapsible.collapsed
        return True

    def on_collapsible_collapsed(self) -> None:
        self._title()

    def on_collapsible_expanded(self) -> None:
        self._title()

    def _title(self, streaming: bool = False) -> None:
        """The thinking's title: its token count, and the key that folds it where the row has room."""
        collapsible = self.query_one(Collapsible)
        title = "thinking" + (f" · {counted(self.think_tokens, 'token')}" if self.think_tokens else "") + " …" * streaming
        hint = f" · f9 {'opens' if collapsible.collapsed else 'folds'}"
        if cell_len(title + hint) + 8 <= self.size.width:  # the fold symbol and the padding beside it
            title += hint
        if collapsible.title != title:
            collapsible.title = title

    # -- rendering --------------------------------------------------------------------------------
    def _source(self) -> Source:
        """The whole text in origin runs, with its ghosts: extended by the segments added since the last frame
        (the last one seen may have grown), so a frame costs what arrived, not the whole answer."""
        starts, kinds, ghost_at, ghost_text = self._index
        done, pos, runs, ghosts = self._indexed
        if done > len(self.segments):
            done = pos = runs = ghosts = 0
        del starts[runs:], kinds[runs:], ghost_at[ghosts:], ghost_text[ghosts:]
        for n in range(done, len(self.segments)):
            self._indexed = (n, pos, len(starts), len(ghost_at))
            text, kind = self.segments[n]
            if kind == "ghost":
                ghost_at.append(pos)
                ghost_text.append(text)
            elif text:
                starts.append(pos)
                kinds.append(kind)
                pos += len(text)
        return Source(self.raw, starts, kinds, ghost_at if self.ghosts else (), ghost_text)

    def _height_changed(self, widget: TextBlock, text: Text) -> bool:
        """Whether `text` may need more rows than the widget shows (a layout pass re-renders the whole
        screen; skipping it while the height stays put keeps frames cheap at high token rates)."""
        width = widget.content_size.width
        if width <= 0:
            return True
        rows = sum(max(1, -(-cell_len(line) // width)) for line in text.plain.split("\n"))
        now = time.monotonic()
        since = now - self._laid_out
        if (rows != widget.rows and since >= LAYOUT_EVERY_S) or since > 1.0:
            widget.rows = rows
            self._laid_out = now
            return True
        return False

    def _show(self, widget: TextBlock, parts: Parts, cheap: bool) -> bool:
        """`parts` in `widget`; whether that asked for a layout pass."""
        block = joined(parts)
        grow = not cheap or self._height_changed(widget, block.text)
        widget.show(parts, block, layout=grow)
        return grow

    def render_text(self, cheap: bool = False) -> bool:
        """Re-render the text; with `cheap`, skip the layout pass when the height cannot have changed.
        Returns whether a layout pass was asked for."""
        start, end, answer_at = self.fmt.layout(self.raw, self.thinking)
        source = self._source()
        collapsible = self.query_one(Collapsible)
        has_thinking = start < end or (start == end == len(self.raw) and start > 0)
        laid_out = collapsible.display != has_thinking
        collapsible.display = has_thinking
        if has_thinking:
            if not self._folded and self.raw[answer_at:].strip():  # the answer started: in view, under its title
                self._folded = collapsible.collapsed = True
                laid_out = True
            self._title(streaming=end == len(self.raw) and self.status == "streaming")
            shown_ghosts = bisect_right(source.ghost_at, end)
            if self._thought != (start, end, shown_ghosts):
                self._thought = (start, end, shown_ghosts)
                text = render_plain(source, self.styles_by_origin, start, end, ghost_after=answer_at > end)
                laid_out = self._show(self._thinking_text, (Block(highlight(text, self.found)),), cheap) or laid_out
        return self._show_answer(self._blocks(source, answer_at), cheap) or laid_out

    def _blocks(self, source: Source, answer_at: int) -> list[Parts]:
        """The answer as shown, widget by widget: each code block alone, paragraphs in runs of about
        `PARAGRAPH_LINES` (few widgets to lay out, little to re-render per frame). Finished blocks come from
        the cache: a block never changes once another follows it."""
        if answer_at == len(source.text) and self.status == "streaming":
            return [(Block(Text("…", style="dim")),)]
        styles = self.styles_by_origin
        if not self.markdown:
            return [(Block(highlight(render_plain(source, styles, answer_at), self.found)),)]
        kept = self._spans[:-1] if self._spans and self._spans[0].start == answer_at else []
        self._spans = spans = kept + split(source.text, kept[-1].end if kept else answer_at)
        rule = max(3, min(self._width - 8, 80)) if self._width else 40
        shown: list[Parts] = []
        lines = 0  # in the last run of paragraphs
        for n, span in enumerate(spans):
            last = n == len(spans) - 1
            block = None if last else self._rendered.get((span.start, span.end))
            if block is None:
                block = render_block(source, span, styles, rule, last)
                highlight(block.text, self.found)
                if not last:
                    self._rendered[(span.start, span.end)] = block
            if block.lang is None and shown and shown[-1][-1].lang is None and lines < PARAGRAPH_LINES:
                shown[-1] += (block,)
            else:
                shown.append((block,))
                lines = 0
            lines += source.text.count("\n", span.start, span.end)
        return shown

    def _show_answer(self, shown: list[Parts], cheap: bool) -> bool:
        """Put `shown` in the answer's widgets: a changed one updates, a new one (or one of another kind)
        mounts; whether that asked for a layout pass."""
        widgets, laid_out = self._shown, False
        for n, parts in enumerate(shown):
            widget = widgets[n] if n < len(widgets) else None
            if widget is None or isinstance(widget, CodeBlock) != (parts[0].lang is not None):
                for old in widgets[n:]:
                    old.remove()
                new = [CodeBlock(p) if p[0].lang is not None else TextBlock(p, classes="answer-text") for p in shown[n:]]
                widgets[n:] = new
                self.query_one(".answer-body").mount(*new)
                return True
            if not widget.shows(parts):
                laid_out = self._show(widget, parts, cheap) or laid_out
        for old in widgets[len(shown):]:
            old.remove()
            laid_out = True
        del widgets[len(shown):]
        return laid_out

    def finish(self, status: str, footer: Optional[str] = None) -> None:
        self.status = status
        self.render_text()
        # theme variables, so the mark follows the theme (in readable colours: contrast.readable_variables)
        mark = {"cancelled": ("⏹ cancelled", "bold $text-warning"), "error": ("✗ failed", "bold $text-error")}
        parts: list[str | tuple[str, str]] = [mark[status]] if status in mark else []
        if footer:
            parts += [" · "] * bool(parts) + [printable(footer)]
        self.query_one(".answer-footer", Static).update(Content.assemble(*parts))
        self.add_class(f"-{status}")

    def on_click(self) -> None:
        if self.status != "streaming":
            self.post_message(self.Selected(self))
