"""The main screen: header, conversation, message box, stats (side panel, or one line when small)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, LoadingIndicator, Static

from dflash_tui.tui.widgets import ChatHeader, PromptInput, StatsLine, StatsPanel

# Priority bindings: the message box (a TextArea) would otherwise take ctrl+k and friends.
KEYS = [
    Binding("ctrl+t", "app.toggle_thinking", "thinking", priority=True),
    Binding("ctrl+g", "app.toggle_ghosts", "ghosts", priority=True),
    Binding("ctrl+k", "app.cycle_block", "block", priority=True),
    Binding("escape", "app.cancel", "stop", priority=True),
    Binding("ctrl+n", "app.new_session", "new", priority=True),
    Binding("ctrl+o", "app.sessions", "sessions", priority=True),
    Binding("ctrl+r", "app.replay", "replay", priority=True),
    Binding("f1", "app.help", "help", priority=True),
    Binding("f2", "app.markdown", "markdown", show=False, priority=True),
    Binding("ctrl+q", "app.quit", "quit", priority=True),
]


class ChatScreen(Screen):
    BINDINGS = KEYS
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]

    def compose(self) -> ComposeResult:
        yield ChatHeader(id="header")
        yield StatsLine(id="stats-line")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with VerticalScroll(id="conversation"):
                    with Vertical(id="loading"):
                        yield LoadingIndicator()
                        yield Static("", id="loading-text")
                yield Static("message · enter send · ctrl+j newline · ↑ earlier prompts", id="input-title")
                yield PromptInput(id="prompt")
            yield StatsPanel(id="stats-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()
