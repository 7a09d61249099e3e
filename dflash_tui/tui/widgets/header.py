"""The one-line header: profile, thinking, block size, temperature, engine, device, dtype (always visible).

What the next turn is generated with comes first, so an 80-column terminal cuts only the engine details.
"""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from dflash_tui.core.figures import known


def temperature_text(value: Optional[float]) -> str:
    """0 is greedy; None leaves it to the target's generation_config."""
    return "model default" if value is None else f"{value:g}"


class ChatHeader(Horizontal):
    def compose(self) -> ComposeResult:
        yield Static(id="header-state")
        yield Static("F1 help", id="header-help")

    def show(self, profile: str, engine: str, device: str, dtype: str, block_size, thinking: bool,
             ghosts: bool, loading: bool = False, temperature: Optional[str] = None) -> None:
        """`temperature` is `temperature_text` of the chat's; None (no chat yet) leaves it out."""
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("dflash", style="bold")
        text.append(f" · {profile} · thinking ")
        text.append("ON" if thinking else "OFF", style="bold reverse" if thinking else "bold")
        if loading:
            text.append(" · loading…", style="italic")
        else:
            text.append(f" · block {known(block_size)}")  # None: a server that does not say which it runs
            if temperature is not None:
                text.append(f" · temp {temperature}")
        if ghosts:
            text.append(" · ghosts")
        if not loading:
            text.append(f" · {engine} engine on {device} · {dtype}")
        self.query_one("#header-state", Static).update(text)
