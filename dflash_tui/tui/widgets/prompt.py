"""The message box: enter sends, ctrl+j (or shift+enter where reported) inserts a newline, up on the
first line recalls earlier prompts, down walks back. ctrl+a, ctrl+e, ctrl+k and ctrl+u act as readline's
on the logical line (not the wrapped row on screen): a long prompt clears with one ctrl+a ctrl+k. ctrl+x
ctrl+e hands the message to $VISUAL or $EDITOR, as shells do (ctrl+x alone still cuts a selection).
Keys of a burst act in the order typed (widgets/keys.py)."""

from __future__ import annotations

from textual import events
from textual.app import SuspendNotSupported
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from dflash_tui.core.terminal import edit_in_editor
from dflash_tui.engines.errors import UserError
from dflash_tui.tui.widgets.keys import InTurn

NEWLINE_KEYS = ("ctrl+j", "shift+enter")


class PromptInput(InTurn, TextArea):
    BINDINGS = [
        Binding("ctrl+a", "line_start", "line start", show=False),
        Binding("ctrl+e", "line_end", "line end", show=False),
        Binding("ctrl+k", "kill_to_end", "kill to end", show=False),
        Binding("ctrl+u", "kill_to_start", "kill to start", show=False),
        Binding("ctrl+x", "ctrl_x", "cut, or ctrl+x ctrl+e: editor", show=False),
    ]

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.prompt_history: list[str] = []
        self._recall_index: int | None = None
        self._draft = ""
        self._after_ctrl_x = False  # the next key completes a ctrl+x sequence

    async def _on_key(self, event: events.Key) -> None:
        after_ctrl_x, self._after_ctrl_x = self._after_ctrl_x, False
        if after_ctrl_x and event.key == "ctrl+e":
            event.stop()
            event.prevent_default()
            self.edit_in_editor()
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip():
                self.remember(text)
                self.clear()
                self.post_message(self.Submitted(text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def remember(self, text: str) -> None:
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._recall_index = None

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0 and self.prompt_history:
            if self._recall_index is None:
                self._draft, self._recall_index = self.text, len(self.prompt_history)
            if self._recall_index > 0:
                self._recall_index -= 1
                self._show(self.prompt_history[self._recall_index])
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        last_row = self.document.line_count - 1
        if not select and self._recall_index is not None and self.cursor_location[0] == last_row:
            self._recall_index += 1
            if self._recall_index >= len(self.prompt_history):
                self._recall_index = None
                self._show(self._draft)
            else:
                self._show(self.prompt_history[self._recall_index])
            return
        super().action_cursor_down(select)

    # -- readline's keys, on the logical line ---------------------------------------------------------
    def action_line_start(self) -> None:
        self.move_cursor((self.cursor_location[0], 0))

    def action_line_end(self) -> None:
        row = self.cursor_location[0]
        self.move_cursor((row, len(self.document.get_line(row))))

    def action_kill_to_end(self) -> None:
        """To the end of the line; at its end, the line break (joining the next line, as emacs does)."""
        row, column = self.cursor_location
        end = len(self.document.get_line(row))
        if column < end:
            self.delete((row, column), (row, end))
        elif row < self.document.line_count - 1:
            self.delete((row, column), (row + 1, 0))

    def action_kill_to_start(self) -> None:
        row, column = self.cursor_location
        if column:
            self.delete((row, 0), (row, column))

    # -- clear, and the editor -------------------------------------------------------------------------
    def clear_all(self) -> bool:
        """Empty the box, however many lines it holds, as one edit that ctrl+z takes back; False when empty."""
        if not self.text:
            return False
        self.clear()
        return True

    def action_ctrl_x(self) -> None:
        """With a selection, cut it; else wait for the key that completes the sequence (ctrl+e: the editor)."""
        if self.selected_text:
            self.action_cut()
        else:
            self._after_ctrl_x = True

    def edit_in_editor(self) -> None:
        """The message in $VISUAL or $EDITOR, the app suspended meanwhile; what the editor saves replaces it
        (as one edit, which ctrl+z takes back). An editor that fails leaves the box as it was."""
        try:
            with self.app.suspend():
                text = edit_in_editor(self.text)
        except SuspendNotSupported:
            self.notify("This terminal cannot hand the screen to an editor.", severity="warning", timeout=4)
            return
        except UserError as exc:
            self.notify(str(exc), severity="warning", timeout=6)
            return
        self.replace(text, (0, 0), self.document.end)
        self.move_cursor(self.document.end)
