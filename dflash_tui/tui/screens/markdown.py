"""A finished answer rendered as Markdown."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown, Static


class MarkdownScreen(ModalScreen):
    BINDINGS = [Binding("escape,f2,q", "dismiss", "close")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(id="markdown-box"):
            yield Static("answer · rendered Markdown", classes="modal-title")
            with VerticalScroll():
                yield Markdown(self.text or "*(empty answer)*")
            yield Static("escape closes", classes="modal-hint")
