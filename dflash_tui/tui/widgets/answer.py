"""Messages in the conversation. An answer is coloured by origin (accepted draft tokens vs the
target's own), may show rejected proposals as ghosts, and puts its thinking text in a dimmed,
collapsible block above the answer. A finished answer can be switched in place to rendered Markdown.

Origin colours are picked for the theme's background (a light theme needs darker ones) and nudged
until they stand out from it by WCAG contrast `MIN_CONTRAST`; answers re-render when the theme changes.
A resumed answer gets its colours back from the turn's recorded ids and steps (`recorded_segments`)."""

from __future__ import annotations

import time
from typing import Iterable, Optional

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Button, Collapsible, Markdown, Static
from textual.widgets._collapsible import CollapsibleTitle

from dflash_tui.core.terminal import printable
from dflash_tui.engines.detokenize import StreamingDetokenizer
from dflash_tui.engines.reasoning import THINK
from dflash_tui.tui.contrast import origin_styles, theme_background

LAYOUT_EVERY_S = 0.3  # while streaming, a new row shows within this; text in existing rows every frame
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
        t = Text()
        t.append("you  ", style="bold")
        t.append(printable(text))
        super().__init__(t)
        self.text = text  # as typed: what f3 copies and ctrl+f finds


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


class AnswerView(Vertical):
    class Selected(Message):
        def __init__(self, answer: "AnswerView") -> None:
            super().__init__()
            self.answer = answer

    DEFAULT_CSS = """
    AnswerView Markdown.answer-markdown { padding: 0 0 0 5; margin: 0; }
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
        self.markdown = False  # showing the answer rendered as Markdown instead of coloured tokens
        self.styles_by_origin = origin_styles(Color(0, 0, 0))
        self._laid_out = 0.0

    def compose(self) -> ComposeResult:
        with Collapsible(title="thinking", collapsed=False, classes="thinking"):
            yield Static(classes="thinking-text")
        yield Static(classes="answer-text")
        yield Static(classes="answer-footer")

    def on_mount(self) -> None:
        thinking = self.query_one(Collapsible)
        thinking.display = False
        for title in thinking.query(CollapsibleTitle):  # a click folds it; tab does not stop on every answer
            title.can_focus = False
        self.watch(self.app, "theme", self._theme_changed)  # init: styles for the theme in use, then render

    def _theme_changed(self) -> None:
        self.styles_by_origin = origin_styles(theme_background(self.app.current_theme))
        self.render_text()

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

    def set_ghosts(self, on: bool) -> None:
        if on != self.ghosts:
            self.ghosts = on
            self.render_text()

    @property
    def answer_text(self) -> str:
        _, _, answer = self.fmt.layout(self.raw, self.thinking)
        return self.raw[answer:]

    @property
    def thinking_text(self) -> str:
        start, end, _ = self.fmt.layout(self.raw, self.thinking)
        return self.raw[start:end]

    def _height_changed(self, widget: Static, text: Text) -> bool:
        """Whether `text` may need more rows than the widget shows (a layout pass re-renders the whole
        screen; skipping it while the height stays put keeps frames cheap at high token rates)."""
        width = widget.content_size.width
        if width <= 0:
            return True
        rows = sum(max(1, -(-cell_len(line) // width)) for line in text.plain.split("\n"))
        key = "_rows_" + ("a" if widget.has_class("answer-text") else "t")
        now = time.monotonic()
        since = now - self._laid_out
        if (rows != getattr(self, key, None) and since >= LAYOUT_EVERY_S) or since > 1.0:
            setattr(self, key, rows)
            self._laid_out = now
            return True
        return False

    def render_text(self, cheap: bool = False) -> bool:
        """Re-render the text; with `cheap`, skip the layout pass when the height cannot have changed.
        Returns whether a layout pass was asked for."""
        start, end, answer_at = self.fmt.layout(self.raw, self.thinking)
        think, answer = Text(), Text()
        laid_out = False
        pos = 0
        for text, kind in self.segments:
            style = self.styles_by_origin.get(kind) or self.styles_by_origin["plain"]
            if kind == "ghost":
                if self.ghosts:
                    if start <= pos < end or (pos == end and answer_at > end and pos < answer_at):
                        think.append(printable(text), style=style)
                    elif pos >= answer_at:
                        answer.append(printable(text), style=style)
                continue
            stop = pos + len(text)
            if start < end and pos < end and stop > start:
                think.append(printable(text[max(start - pos, 0):min(end, stop) - pos]), style=style)
            if stop > answer_at:
                answer.append(printable(text[max(answer_at - pos, 0):]), style=style)
            pos = stop
        collapsible = self.query_one(Collapsible)
        has_thinking = start < end or (start == end == len(self.raw) and start > 0)
        if collapsible.display != has_thinking:
            collapsible.display = has_thinking
            laid_out = True
        if has_thinking:
            count = f" · {self.think_tokens} tokens" if self.think_tokens else ""
            title = f"thinking{count}" + ("" if end < len(self.raw) or self.status != "streaming" else " …")
            if collapsible.title != title:
                collapsible.title = title
            widget = self.query_one(".thinking-text", Static)
            grow = not cheap or self._height_changed(widget, think)
            laid_out = laid_out or grow
            widget.update(think, layout=grow)
        if not answer and self.status == "streaming":
            answer = Text("…", style="dim")
        self.answer_rich, self.thinking_rich = answer, think
        widget = self.query_one(".answer-text", Static)
        grow = not cheap or self._height_changed(widget, answer)
        widget.update(answer, layout=grow)
        return laid_out or grow

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

    async def show_markdown(self, on: bool) -> None:
        """Switch a finished answer between its coloured tokens and the answer rendered as Markdown."""
        if self.status == "streaming":
            return
        self.markdown = on
        if on:
            source = self.answer_text or "*(empty answer)*"
            found = self.query(Markdown)
            if found:
                await found.first().update(source)
            else:
                await self.mount(Markdown(source, classes="answer-markdown"), after=self.query_one(".answer-text"))
        for widget in self.query(Markdown):
            widget.display = on
        self.query_one(".answer-text", Static).display = not on

    def on_click(self) -> None:
        if self.status != "streaming":
            self.post_message(self.Selected(self))
