"""The chat's settings typed into the command palette (ctrl+p): "temperature 0.7", "top_k 20", "min_p 0.05",
"max_new_tokens 512", "seed 7", "block 3", "draft demo/draft2" (core/knobs.py reads and checks them).

As it is typed, the palette lists what the value does, or the one sentence saying why it cannot be taken.
Enter applies it and closes the palette whether or not the search has listed it yet: the search runs behind
the keys, and on a busy machine Textual's own enter found no option to pick, so the palette stayed open and
the next value was typed onto the end of the last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from textual import on
from textual.app import ComposeResult
from textual.command import CommandInput, CommandList, CommandPalette, DiscoveryHit, Hit, Hits, Provider
from textual.widgets import Input

from dflash_tui.core.knobs import KNOBS, parse_setting
from dflash_tui.engines.errors import UserError
from dflash_tui.tui.widgets.keys import PaletteInput

if TYPE_CHECKING:
    from dflash_tui.tui.app import DflashApp

FIRST = 1e9  # a typed setting's hit comes before any fuzzy match of a command's title: it is what was typed
EXAMPLES = " · ".join(knob.example.split(" (")[0] for knob in KNOBS)


def typed_setting(app: "DflashApp", query: str) -> Optional[tuple[str, Callable[[], None], str]]:
    """What the palette offers for `query` when it types a setting: (the line it lists, what choosing it does,
    its help); None when the query types no setting."""
    try:
        setting = parse_setting(query, app.switchable_drafts())
    except UserError as exc:
        said = str(exc)
        return said, lambda: app.notify(said, severity="warning", timeout=8), "not applied: type another value"
    if setting is None:
        return None
    return f"Set {setting}", lambda: app.apply_setting(setting), "from the next turn"


class SettingCommands(Provider):
    """A setting typed in the palette, beside the fixed choices the app lists (temperatures, block sizes,
    drafts)."""

    app: "DflashApp"

    async def discover(self) -> Hits:
        yield DiscoveryHit("Settings: type one", self._explain, help=f"{EXAMPLES}: from the next turn")

    def _explain(self) -> None:
        self.app.notify(f"Type a setting in the palette (ctrl+p): {EXAMPLES}.", timeout=8)

    async def search(self, query: str) -> Hits:
        found = typed_setting(self.app, query)
        if found is not None:
            text, apply, help_text = found
            yield Hit(FIRST, text, apply, help=help_text)


class SettingsPalette(CommandPalette):
    """Textual's palette; enter on a typed setting applies it and closes, unless an option was picked with ↑/↓.
    Its query box keeps a burst of keys in order (widgets/keys.py)."""

    app: "DflashApp"

    def compose(self) -> ComposeResult:
        for widget in super().compose():  # the palette's own layout, its query box swapped where it stands
            yield PaletteInput(placeholder=widget.placeholder, select_on_focus=False) \
                if isinstance(widget, CommandInput) else widget

    @on(Input.Submitted)
    def _apply_typed(self, event: Input.Submitted) -> None:
        if self.query_one(CommandList).highlighted not in (None, 0):  # chosen from the list: Textual runs it
            return
        found = typed_setting(self.app, event.value.strip())
        if found is None:
            return
        event.stop()
        event.prevent_default()  # not Textual's handler as well
        self._cancel_gather_commands()
        self.app.post_message(CommandPalette.Closed(option_selected=True))
        self.dismiss()
        self.app.call_later(found[1])
