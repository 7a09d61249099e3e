"""F1: every key, and what the colours mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from dflash_tui.tui.widgets.stats import DRAFT_STYLE, GHOST_STYLE, TARGET_STYLE

KEY_HELP = [
    ("enter", "send the message"),
    ("ctrl+j / shift+enter", "new line in the message"),
    ("↑ / ↓", "earlier prompts (on the first / last line)"),
    ("ctrl+t", "thinking on/off for the next turns"),
    ("ctrl+g", "show rejected draft tokens (ghosts)"),
    ("ctrl+k", "next block size (1, 2, 4, 8, 16, the profile's)"),
    ("escape", "stop the answer (it stays, marked cancelled)"),
    ("ctrl+n", "new session"),
    ("ctrl+l", "new context: clear the kept caches (the history stays)"),
    ("ctrl+o", "sessions: resume, delete, export"),
    ("ctrl+r", "replay the session across block sizes"),
    ("f2 / click", "the last answer as rendered Markdown"),
    ("ctrl+p", "command palette: profile, engine, system prompt, …"),
    ("f1", "this help"),
    ("ctrl+q", "quit"),
]


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for key, what in KEY_HELP:
            table.add_row(key, what)
        legend = Text()
        legend.append("\nColours: ")
        legend.append("accepted draft tokens", style=DRAFT_STYLE)
        legend.append(" came free from the draft; ")
        legend.append("target tokens", style=TARGET_STYLE)
        legend.append(" are the target's own (one per verify step, or where it disagreed); ")
        legend.append("ghosts", style=GHOST_STYLE)
        legend.append(" are draft proposals the target rejected.\n"
                      "tau is the mean number of tokens each verify pass commits.")
        with Vertical(id="help-box"):
            yield Static("dflash · keys", classes="modal-title")
            yield Static(table)
            yield Static(legend)
            yield Static("escape closes", classes="modal-hint")
