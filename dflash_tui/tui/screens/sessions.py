"""The sessions browser: resume, rename, delete (after a confirmation; never the chat open here), export (to the
file it offers, or one you name: mode 0600, as `sessions export -o` writes). Sessions are listed by last use
(the last turn written), the one open here marked ●; `/` searches every session's prompts and answers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from dflash_tui.core import sessions
from dflash_tui.core.terminal import counted, one_line, printable
from dflash_tui.engines.errors import UserError
from dflash_tui.tui.widgets.keys import TextInput

if TYPE_CHECKING:
    from dflash_tui.tui.app import DflashApp


class ConfirmDeleteScreen(ModalScreen[bool]):
    """Asks before a session goes: a deleted conversation cannot be brought back."""

    DEFAULT_CSS = """
    ConfirmDeleteScreen { align: center middle; }
    #confirm-delete-box { width: 70%; max-width: 90; height: auto; border: round $error; background: $surface;
                          padding: 1 2; }
    """
    BINDINGS = [Binding("y", "answer(True)", "delete"), Binding("n,escape", "answer(False)", "keep")]

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-delete-box"):
            yield Static(f"Delete {self.what}?", id="confirm-delete-text", markup=False)
            yield Static("y deletes · n or escape keeps it", classes="modal-hint")

    def action_answer(self, delete: bool) -> None:
        self.dismiss(delete)


class LineScreen(ModalScreen[str | None]):
    """One line to fill in, in a box over the screen: enter gives it, escape gives None."""

    DEFAULT_CSS = """
    LineScreen { align: center middle; }
    #line-box { width: 70%; max-width: 90; height: auto; border: round $accent; background: $surface; padding: 1 2; }
    """
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, heading: str, value: str, hint: str, max_length: int = 0) -> None:
        super().__init__()
        self.heading, self.value, self.hint, self.max_length = heading, value, hint, max_length

    def compose(self) -> ComposeResult:
        with Vertical(id="line-box"):
            yield Static(self.heading, classes="modal-title", markup=False)
            yield TextInput(self.value, max_length=self.max_length, id="line-value", compact=True)
            yield Static(self.hint, classes="modal-hint", markup=False)

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class RenameScreen(LineScreen):
    """A session's title, filled in to edit: enter saves it (empty: back to the first prompt), escape keeps it."""

    def __init__(self, title: str) -> None:
        super().__init__("rename session", title, "enter saves (empty: the first prompt) · escape cancels",
                         sessions.TITLE_MAX)


class SessionsScreen(ModalScreen[str | None]):
    """The picker's row is its own (`row`), moved by priority keys from the moment the screen is pushed:
    keys of a fast burst (ctrl+o, down, down, enter) can arrive before the table is mounted, focused and
    filled, and once opened the first row; now each acts on the list read when the screen was made. The keys
    that open a box (/, r, e, j, d) are priority keys too, acting as they arrive, so that the keys behind
    them in a burst reach that box and not the list; while the search box has the focus they are text."""

    app: DflashApp

    BINDINGS = [
        Binding("enter", "resume", "resume", priority=True),
        Binding("down", "move(1)", show=False, priority=True),
        Binding("up", "move(-1)", show=False, priority=True),
        Binding("pagedown", "move(10)", show=False, priority=True),
        Binding("pageup", "move(-10)", show=False, priority=True),
        Binding("home", "move(-1000000)", show=False, priority=True),
        Binding("end", "move(1000000)", show=False, priority=True),
        Binding("r", "rename", "rename", priority=True),
        Binding("d,delete", "delete", "delete", priority=True),
        Binding("e", "export", "export md", priority=True),
        Binding("j", "export_json", "export json", priority=True),
        Binding("escape,q", "close", "close"),
        Binding("slash,ctrl+f", "search", "search", priority=True),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="sessions-box"):
            yield Static("sessions · last used first · ● open here", classes="modal-title")
            yield TextInput(placeholder="/ search the prompts and answers of every session", id="sessions-search",
                        compact=True)
            yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="sessions-status", markup=False)  # titles and errors are text, not markup
            yield Static("enter resume · / search · r rename · d delete · e export md · j export json · escape close",
                         classes="modal-hint")

    def __init__(self, open_id: str | None = None) -> None:
        super().__init__()
        self.open_id = open_id  # the chat's own session: marked, and never deleted from here
        self.every = sessions.by_last_use(sessions.list_sessions())  # read before any key can reach the screen
        self.found = self.every
        self.query_text = ""
        self.row = 0

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "created", "profile", "turns", "title")
        self.reload(self.found)
        table.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The letter keys are text while the search box has the focus."""
        if action in ("rename", "delete", "export", "export_json", "search") and isinstance(self.focused, Input):
            return False
        return True

    def action_search(self) -> None:
        self.set_focus(self.query_one("#sessions-search", Input))  # at once: the keys behind / are the search

    def on_input_changed(self, event: Input.Changed) -> None:
        """Only the sessions whose prompts or answers hold every word typed (any case)."""
        self.query_text = event.value
        self.found = [s for s in self.every if matches(s, event.value)]
        self.row = 0
        self.reload(self.found, search=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_resume()

    def action_move(self, by: int) -> None:
        self.row = max(0, min(self.row + by, len(self.found) - 1))
        self._show_row()

    def _show_row(self) -> None:
        if not self.is_mounted:
            return
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=self.row)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        table = event.data_table  # a click moved it; a highlight the keys already passed is stale
        if table.row_count == len(self.found) and event.cursor_row == table.cursor_row:
            self.row = event.cursor_row

    def reload(self, found=None, search: bool = False) -> None:
        table = self.query_one(DataTable)
        table.clear()
        if found is None:  # read again (after a deletion), the search kept
            self.every = sessions.by_last_use(sessions.list_sessions())
            found = [s for s in self.every if matches(s, self.query_text)]
        self.found = found
        self.row = max(0, min(self.row, len(found) - 1))
        # the title gets the width the other columns leave in the box (90% of the screen, up to 150)
        width = max(40, min(int(self.app.size.width * 0.9), 150) - 6 - 58)
        for s in found:
            shown = one_line(s.title)  # a first prompt or a title: escaped (core/terminal.py), never markup
            title = shown if len(shown) <= width else shown[:width - 1] + "…"
            table.add_row(("● " if s.id == self.open_id else "") + s.id, s.created[:16].replace("T", " "),
                          Text(one_line(s.profile_name or "?")), str(len(s.turns)), Text(title), key=s.id)
        count = counted(len(found), "session")
        if self.query_text:
            count += f" of {len(self.every)} " + (f"hold {self.query_text!r}" if found else
                                                   f"(none holds {self.query_text!r})")
        self.query_one("#sessions-status", Static).update(count if self.every else "No sessions yet.")
        self._show_row()

    def _selected(self) -> str | None:
        return self.found[self.row].id if self.found else None

    def action_resume(self) -> None:
        chosen = self._selected()
        if chosen:
            self.dismiss(chosen)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_rename(self) -> None:
        """Ask for the highlighted session's title; the chat open here is renamed through its own writer."""
        if not self.found:
            return
        session = self.found[self.row]
        status = self.query_one("#sessions-status", Static)

        def answered(text: str | None) -> None:
            if text is None:
                status.update("Not renamed.")
                return
            conversation = self.app.conversation
            try:
                title = (sessions.rename_open(conversation.writer if conversation is not None else None, text)
                         if session.id == self.open_id
                         else sessions.rename_session(session, text))
            except UserError as exc:
                status.update(str(exc))
                return
            self.reload()  # the file was written to: the row moves to where its last use puts it
            self.row = next((n for n, s in enumerate(self.found) if s.id == session.id), self.row)
            self._show_row()
            status.update(sessions.renamed(title))

        self.app.push_screen(RenameScreen(session.title), answered)

    def action_delete(self) -> None:
        """Refuse the chat open here (and one another dflash writes) before asking, then ask."""
        chosen = self._selected()
        if not chosen:
            return
        status = self.query_one("#sessions-status", Static)
        try:
            session = sessions.resolve_own(chosen)
            sessions.refuse_if_open(session)
        except UserError as exc:
            status.update(str(exc))
            return
        what = sessions.deletion_text(session)

        def answered(delete: bool | None) -> None:
            if not delete:
                status.update("Nothing deleted.")
                return
            try:
                sessions.delete_session(session)  # with its replay files
            except UserError as exc:  # opened elsewhere while the question was up
                status.update(str(exc))
                return
            self.reload()
            status.update(f"Deleted {what}.")

        self.app.push_screen(ConfirmDeleteScreen(what), answered)

    def _export(self, fmt: str) -> None:
        """Ask for the file, the exports folder's offered; write it through the one export writer (mode 0600)."""
        chosen = self._selected()
        if not chosen:
            return
        status = self.query_one("#sessions-status", Static)

        def answered(name: str | None) -> None:
            if not name or not name.strip():
                status.update("Not exported.")
                return
            try:
                path = sessions.export_session(sessions.load_session(chosen), fmt, Path(name.strip()))
            except UserError as exc:
                status.update(str(exc))
                return
            status.update(printable(f"Exported to {path}"))

        what = "Markdown" if fmt == "md" else "JSON"
        self.app.push_screen(LineScreen(f"export {chosen} as {what}", str(sessions.default_export(chosen, fmt)),
                                        "enter writes it (mode 0600; the folder must exist) · escape cancels"),
                             answered)

    def action_export(self) -> None:
        self._export("md")

    def action_export_json(self) -> None:
        self._export("json")


def matches(session, text: str) -> bool:
    """Whether every word of `text` is in the session's title, prompts or answers (any case); no words: all do."""
    words = text.lower().split()
    if not words:
        return True
    body = "\n".join([session.name, *(f"{t.get('user') or ''}\n{t.get('answer') or ''}" for t in session.turns)]).lower()
    return all(word in body for word in words)
