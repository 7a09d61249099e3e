"""The sessions browser: resume, rename, delete (after a confirmation; never the chat open here), export (to the
file it offers, or one you name: mode 0600, as `sessions export -o` writes). Sessions are listed by last use
(the last turn written), the one open here marked ●; `/` searches every session's prompts and answers, each row
found showing where (its turn, and a line around the words, highlighted); ↓ goes from the search to the list
and ↑ on its first row back."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from dflash_tui.core import search, sessions
from dflash_tui.core.terminal import counted, one_line, printable
from dflash_tui.engines.errors import UserError
from dflash_tui.tui.widgets.keys import TextInput

if TYPE_CHECKING:
    from dflash_tui.tui.app import DflashApp

LISTING = ("id", "created", "profile", "turns", "title")  # the columns while nothing is searched
PLACE = "turn {} · "  # where a search hit lies, before its excerpt
PLACE_CELLS = len(PLACE.format(999))  # its room: a turn of three digits
FOUND = Style(reverse=True)  # the words found: reverse reads on every theme, and with NO_COLOR too


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
    them in a burst reach that box and not the list; while the search box has the focus they are text, and
    ↓ leaves it for the list (↑ on the list's first row goes back; ↑, home and end in the box are its own)."""

    app: DflashApp
    AUTO_FOCUS = "#sessions-table"  # not the search box, the first in the box: a burst's ↓ moves the row

    # The list's row while the search box has the focus: Textual's blurred cursor ($primary at 30% under the
    # text) falls under 3:1 on some themes (tokyo-night, solarized-dark); $panel is one of the backgrounds
    # the theme's text is made to read on (tui/contrast.py)
    DEFAULT_CSS = """
    #sessions-table:blur > .datatable--cursor { background: $panel; color: $foreground; }
    """

    BINDINGS = [
        Binding("enter", "resume", "resume", priority=True),
        Binding("down", "down", show=False, priority=True),
        Binding("up", "up", show=False, priority=True),
        Binding("pagedown", "move(10)", show=False, priority=True),
        Binding("pageup", "move(-10)", show=False, priority=True),
        Binding("home", "edge(-1000000)", show=False, priority=True),
        Binding("end", "edge(1000000)", show=False, priority=True),
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
            # not select_on_focus: back from the list (↑, /) the query is kept to go on typing (ctrl+u clears
            # it), and no selection made when the focus event lands can swallow the keys of a burst behind it
            yield TextInput(placeholder="/ search the prompts and answers of every session", id="sessions-search",
                            compact=True, select_on_focus=False)
            yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="sessions-status", markup=False)  # titles and errors are text, not markup
            yield Static("enter resume · / search · r rename · d delete · e export md · j export json · escape close",
                         classes="modal-hint")

    def __init__(self, open_id: str | None = None) -> None:
        super().__init__()
        self.open_id = open_id  # the chat's own session: marked, and never deleted from here
        self.every = sessions.by_last_use(sessions.list_sessions())  # read before any key can reach the screen
        self.found = search.search(self.every, "")
        self.query_text = ""
        self.row = 0

    def on_mount(self) -> None:
        self.reload(self.found)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The letter keys are text while the search box has the focus; ↑, home and end move in it."""
        if action in ("rename", "delete", "export", "export_json", "search", "up", "edge") \
                and isinstance(self.focused, Input):
            return False
        return True

    def action_search(self) -> None:
        self.set_focus(self.query_one("#sessions-search", Input))  # at once: the keys behind / are the search

    def on_input_changed(self, event: Input.Changed) -> None:
        """Only the sessions whose prompts, answers or titles hold every word typed (any case), read from the
        sessions loaded when the picker opened (each one's text made searchable once)."""
        self.query_text = event.value
        self.row = 0
        self.reload(self._search())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_resume()

    def action_down(self) -> None:
        """From the search box to the list, at its highlighted row; in the list, one row on."""
        if isinstance(self.focused, Input):
            if self.found:
                self.set_focus(self.query_one(DataTable))  # at once: the keys behind ↓ act on the list
            return
        self.action_move(1)

    def action_up(self) -> None:
        """One row back; from the list's first row, to the search box."""
        if self.row == 0 and isinstance(self.focused, DataTable):
            self.action_search()
            return
        self.action_move(-1)

    def action_edge(self, by: int) -> None:
        """home and end: the list's first and last row (in the search box, the text's ends: check_action)."""
        self.action_move(by)

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

    def _inside(self) -> int:
        """The cells across the box: 90% of the screen, up to 150, less its border and padding."""
        return min(int(self.app.size.width * 0.9), 150) - 6

    def _snippet_width(self) -> int:
        """The cells a search hit's excerpt gets, up to SNIPPET_WIDTH: what the id column (22 cells and its
        padding), the hit's own padding, a scroll bar and its turn leave, so that it fits at 80 columns."""
        return max(10, min(search.SNIPPET_WIDTH, self._inside() - 24 - 2 - 2 - PLACE_CELLS))

    def _search(self) -> list[search.Match]:
        return search.search(self.every, self.query_text, self._snippet_width())

    def on_resize(self) -> None:
        """The columns fit the new width: the titles', or the excerpts of a search's hits."""
        self.reload(self._search())

    def reload(self, found: list[search.Match] | None = None) -> None:
        table = self.query_one(DataTable)
        if found is None:  # read again (after a deletion), the search kept
            self.every = sessions.by_last_use(sessions.list_sessions())
            found = self._search()
        searching = bool(self.query_text.split())
        table.clear(columns=True)  # one line a row either way: a search's hits take the listing's columns
        if searching:
            table.add_column("id")
            table.add_column("where it matches", width=self._snippet_width() + PLACE_CELLS)
        else:
            table.add_columns(*LISTING)
        self.found = found
        self.row = max(0, min(self.row, len(found) - 1))
        # the title gets the width the other columns leave in the box
        width = max(40, self._inside() - 58)
        for hit in found:
            s = hit.session
            ident = ("● " if s.id == self.open_id else "") + s.id
            if searching:
                table.add_row(ident, where(hit), key=s.id)
                continue
            shown = one_line(s.title)  # a first prompt or a title: escaped (core/terminal.py), never markup
            title = shown if len(shown) <= width else shown[:width - 1] + "…"
            table.add_row(ident, s.created[:16].replace("T", " "), Text(one_line(s.profile_name or "?")),
                          str(len(s.turns)), Text(title), key=s.id)
        count = counted(len(found), "session")
        if self.query_text:
            count += f" of {len(self.every)} " + (f"hold {self.query_text!r}" if found else
                                                   f"(none holds {self.query_text!r})")
        self.query_one("#sessions-status", Static).update(count if self.every else "No sessions yet.")
        self._show_row()

    def _selected(self) -> str | None:
        return self.found[self.row].session.id if self.found else None

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
        session = self.found[self.row].session
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
            self.row = next((n for n, hit in enumerate(self.found) if hit.session.id == session.id), self.row)
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


def where(hit: search.Match) -> Text:
    """A search hit's cell: its turn ("title" when only its title holds the words), then its excerpt with the
    words found highlighted (the excerpt is printable text, never markup)."""
    place = PLACE.format(hit.turn) if hit.turn else "title · "
    text = Text(place + hit.snippet, no_wrap=True, overflow="ellipsis")
    for start, end in hit.spans:
        text.stylize(FOUND, len(place) + start, len(place) + end)
    return text
