"""The sessions browser: resume, delete (after a confirmation; never the chat open here), export."""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from dflash_tui.core import sessions
from dflash_tui.engines.errors import UserError


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


class SessionsScreen(ModalScreen[str | None]):
    """The picker's row is its own (`row`), moved by priority keys from the moment the screen is pushed:
    keys of a fast burst (ctrl+o, down, down, enter) can arrive before the table is mounted, focused and
    filled, and once opened the first row; now each acts on the list read when the screen was made."""

    BINDINGS = [
        Binding("enter", "resume", "resume", priority=True),
        Binding("down", "move(1)", show=False, priority=True),
        Binding("up", "move(-1)", show=False, priority=True),
        Binding("pagedown", "move(10)", show=False, priority=True),
        Binding("pageup", "move(-10)", show=False, priority=True),
        Binding("home", "move(-1000000)", show=False, priority=True),
        Binding("end", "move(1000000)", show=False, priority=True),
        Binding("d,delete", "delete", "delete"),
        Binding("e", "export", "export md"),
        Binding("j", "export_json", "export json"),
        Binding("escape,q", "close", "close"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="sessions-box"):
            yield Static("sessions", classes="modal-title")
            yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="sessions-status", markup=False)  # titles and errors are text, not markup
            yield Static("enter resume · d delete · e export Markdown · j export JSON · escape close",
                         classes="modal-hint")

    def __init__(self) -> None:
        super().__init__()
        self.found = sessions.list_sessions()  # read before any key can reach the screen
        self.row = 0

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "created", "profile", "turns", "first prompt")
        self.reload(self.found)
        table.focus()

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

    def reload(self, found=None) -> None:
        table = self.query_one(DataTable)
        table.clear()
        found = sessions.list_sessions() if found is None else found
        self.found = found
        self.row = max(0, min(self.row, len(found) - 1))
        # the first prompt gets the width the other columns leave in the box (90% of the screen, up to 150)
        width = max(40, min(int(self.app.size.width * 0.9), 150) - 6 - 58)
        for s in found:
            title = s.title if len(s.title) <= width else s.title[:width - 1] + "…"
            table.add_row(s.id, s.created[:16].replace("T", " "), s.profile_name or "?", str(len(s.turns)),
                          title, key=s.id)
        self.query_one("#sessions-status", Static).update(
            f"{len(found)} session{'s' if len(found) != 1 else ''}" if found else "No sessions yet.")
        self._show_row()

    def _selected(self) -> str | None:
        return self.found[self.row].id if self.found else None

    def action_resume(self) -> None:
        chosen = self._selected()
        if chosen:
            self.dismiss(chosen)

    def action_close(self) -> None:
        self.dismiss(None)

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
        chosen = self._selected()
        if not chosen:
            return
        session = sessions.load_session(chosen)
        folder = sessions.data_dir() / "exports"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{chosen}.{fmt}"
        text = sessions.to_markdown(session) if fmt == "md" else json.dumps(sessions.to_json(session), indent=2)
        path.write_text(text, encoding="utf-8")
        self.query_one("#sessions-status", Static).update(f"Exported to {path}")

    def action_export(self) -> None:
        self._export("md")

    def action_export_json(self) -> None:
        self._export("json")
