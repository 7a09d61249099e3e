"""Replay: re-run a session's turns across block sizes (the replay release fills this screen in)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ReplayScreen(ModalScreen):
    BINDINGS = [Binding("escape,ctrl+r,q", "dismiss", "close")]

    def __init__(self, session_id: str | None = None) -> None:
        super().__init__()
        self.session_id = session_id

    def compose(self) -> ComposeResult:
        with Vertical(id="replay-box"):
            yield Static("replay", classes="modal-title")
            yield Static(
                "Replay re-runs every turn of a session with the recorded prompt ids at several block sizes "
                "and compares speed and acceptance. It arrives in a later release; until then, "
                "`dflash sessions show ID` prints what each turn recorded."
                + (f"\n\nThis session: {self.session_id}" if self.session_id else "")
            )
            yield Static("escape closes", classes="modal-hint")
