"""The one-line header: profile, engine, device, dtype, block size, thinking (always visible)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static


class ChatHeader(Horizontal):
    def compose(self) -> ComposeResult:
        yield Static(id="header-state")
        yield Static("F1 help", id="header-help")

    def show(self, profile: str, engine: str, device: str, dtype: str, block_size, thinking: bool,
             ghosts: bool, loading: bool = False) -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("dflash", style="bold")
        text.append(f" · {profile} · thinking ")
        text.append("ON" if thinking else "OFF", style="bold reverse" if thinking else "bold")
        if loading:
            text.append(" · loading…", style="italic")
        else:
            text.append(f" · block {block_size} · {engine} engine on {device} · {dtype}")
        if ghosts:
            text.append(" · ghosts")
        self.query_one("#header-state", Static).update(text)
