"""The one-line header: profile, thinking, block size, temperature, the draft's kind (DFlash 1 or 2), engine,
device, dtype (always visible).

What the next turn is generated with comes first, so an 80-column terminal drops only the engine details,
whole fields with a "…" (`FittedLine`). Where the side panel (and its colour legend) is folded away, the
answer's colours are named at the right end, in them, on the answer's background (`colour_key`); the
footer says f1 there.
"""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from dflash_tui.core.figures import known
from dflash_tui.tui.contrast import origin_styles, theme_background
from dflash_tui.tui.widgets.stats import Field, FittedLine


def temperature_text(value: Optional[float]) -> str:
    """0 is greedy; None leaves it to the target's generation_config."""
    return "model default" if value is None else f"{value:g}"


def colour_key(origin: dict, ghosts: bool) -> Text:
    """The answer's colours named in them: "draft target", and "ghost" while the ghosts are shown."""
    key = Text.assemble(("draft", origin["draft"]), " ", ("target", origin["target"]))
    if ghosts:
        key.append_text(Text.assemble(" ", ("ghost", origin["ghost"])))
    return key


class ChatHeader(Horizontal):
    ghosts = False

    def compose(self) -> ComposeResult:
        yield FittedLine(id="header-state")
        yield Static(id="header-key")
        yield Static("F1 help", id="header-help")

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._show_key)  # init: the key in the theme's colours

    def _show_key(self) -> None:
        origin = origin_styles(theme_background(self.app.current_theme))
        self.query_one("#header-key", Static).update(colour_key(origin, self.ghosts))

    def show(self, profile: str, engine: str, device: str, dtype: str, block_size, thinking: bool,
             ghosts: bool, loading: bool = False, temperature: Optional[str] = None, failed: bool = False,
             top_p: Optional[float] = None, effort: Optional[str] = None, draft: Optional[str] = None) -> None:
        """`temperature` is `temperature_text` of the chat's; None (no chat yet) leaves it out. `failed`: no
        engine could be loaded (said instead of its unknown block size, engine and device). `effort`: the
        reasoning effort of a family that has one (gpt-oss), shown in thinking's place (it has no off). `draft`:
        which draft runs, "DFlash 1", "DFlash 2" or "no draft" (None: the engine does not say; left out)."""
        if effort is not None:
            state = Text.assemble("effort ", (effort, "bold reverse"))
        else:
            state = Text.assemble("thinking ", ("ON", "bold reverse") if thinking else ("OFF", "bold"))
        fields: list[Field] = [("dflash", "bold"), (profile, ""), (state, "")]
        if loading:
            fields.append(("loading…", "italic"))
        elif failed:
            fields.append(("not loaded", "italic"))  # the error screen says why; ctrl+p switches
        else:
            fields.append((f"block {known(block_size)}", ""))  # None: a server that does not say which it runs
            if temperature is not None:
                fields.append((f"temp {temperature}", ""))
            if top_p is not None:  # None: the target's generation_config (left unsaid, as the profile's)
                fields.append((f"top_p {top_p:g}", ""))
            if draft is not None:  # which draft the engine runs: after the next turn's settings, before the engine
                fields.append((draft, "bold"))
        if ghosts:
            fields.append(("ghosts", ""))
        if ghosts != self.ghosts:
            self.ghosts = ghosts
            self._show_key()
        if not loading and not failed:
            fields += [(f"{engine} engine on {device}", ""), (dtype, "")]
        self.query_one("#header-state", FittedLine).set_fields(fields)
