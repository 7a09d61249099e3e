"""Edit the system prompt sent with every turn."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static, TextArea

from dflash_tui.tui.widgets.keys import TextBox


class SystemPromptScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("ctrl+s", "save", "save", priority=True), Binding("escape", "cancel", "cancel")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(id="system-box"):
            yield Static("system prompt", classes="modal-title")
            yield TextBox(self.text, id="system-text", soft_wrap=True)
            yield Static("ctrl+s saves (applies from the next turn) · escape cancels", classes="modal-hint")

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def action_save(self) -> None:
        self.dismiss(self.query_one(TextArea).text)

    def action_cancel(self) -> None:
        self.dismiss(None)
