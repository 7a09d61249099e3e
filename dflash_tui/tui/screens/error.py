"""A model that could not load: what went wrong and how to fix it, instead of a crash."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class LoadErrorScreen(ModalScreen):
    def __init__(self, message: str, what: str = "The model could not be loaded") -> None:
        super().__init__()
        self.message = message
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Static(self.what, classes="modal-title error-title")
            yield Static(self.message, id="error-message", markup=False)  # "'dflash-tui[cuda]'" is text, not markup
            yield Static("ctrl+p: switch profile or engine · ctrl+q: quit", classes="modal-hint")
