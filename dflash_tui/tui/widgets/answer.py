"""Messages in the conversation. An answer is coloured by origin (accepted draft tokens vs the
target's own), may show rejected proposals as ghosts, and puts its thinking text in a dimmed,
collapsible block above the answer."""

from __future__ import annotations

import time
from typing import Iterable, Optional

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Static

from dflash_tui.core.conversation import THINK_CLOSE, thinking_layout
from dflash_tui.core.terminal import printable
from dflash_tui.tui.widgets.stats import DRAFT_STYLE, GHOST_STYLE, TARGET_STYLE

LAYOUT_EVERY_S = 0.3  # while streaming, a new row shows within this; text in existing rows every frame
STYLES = {"draft": Style.parse(DRAFT_STYLE), "target": Style.parse(TARGET_STYLE), "ghost": Style.parse(GHOST_STYLE),
          "plain": Style()}


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        t = Text()
        t.append("you  ", style="bold")
        t.append(printable(text))
        super().__init__(t)


class NoticeLine(Static):
    """A one-line notice in the conversation (context trimmed, engine warnings, reloads)."""


class AnswerView(Vertical):
    class Selected(Message):
        def __init__(self, answer: "AnswerView") -> None:
            super().__init__()
            self.answer = answer

    def __init__(self, thinking: bool, ghosts: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.thinking = thinking
        self.ghosts = ghosts
        self.segments: list[tuple[str, str]] = []
        self.raw = ""
        self.think_tokens = 0
        self.status = "streaming"
        self._laid_out = 0.0

    def compose(self) -> ComposeResult:
        with Collapsible(title="thinking", collapsed=False, classes="thinking"):
            yield Static(classes="thinking-text")
        yield Static(classes="answer-text")
        yield Static(classes="answer-footer")

    def on_mount(self) -> None:
        self.query_one(Collapsible).display = False
        self.render_text()

    # -- streaming -------------------------------------------------------------------------------
    def add_events(self, events: Iterable) -> None:
        for event in events:
            if self.thinking and THINK_CLOSE not in self.raw:
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

    def set_text(self, text: str) -> None:
        """A recorded answer (no origins kept): shown plain."""
        self.segments = [(text, "plain")]
        self.raw = text

    def set_ghosts(self, on: bool) -> None:
        if on != self.ghosts:
            self.ghosts = on
            self.render_text()

    @property
    def answer_text(self) -> str:
        _, _, answer = thinking_layout(self.raw, self.thinking)
        return self.raw[answer:]

    @property
    def thinking_text(self) -> str:
        start, end, _ = thinking_layout(self.raw, self.thinking)
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
        start, end, answer_at = thinking_layout(self.raw, self.thinking)
        think, answer = Text(), Text()
        laid_out = False
        pos = 0
        for text, kind in self.segments:
            style = STYLES.get(kind) or STYLES["plain"]
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
        t = Text()
        if status == "cancelled":
            t.append("⏹ cancelled", style="bold yellow")
            if footer:
                t.append(" · ")
        elif status == "error":
            t.append("✗ failed", style="bold red")
            if footer:
                t.append(" · ")
        if footer:
            t.append(footer, style="dim")
        self.query_one(".answer-footer", Static).update(t)
        self.add_class(f"-{status}")

    def on_click(self) -> None:
        if self.status != "streaming":
            self.post_message(self.Selected(self))
