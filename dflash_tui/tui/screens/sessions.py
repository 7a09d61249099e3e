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
    BINDINGS = [
        Binding("enter", "resume", "resume", priority=True),
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

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "created", "profile", "turns", "first prompt")
        self.reload()
        table.focus()

    def reload(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        found = sessions.list_sessions()
        for s in found:
            table.add_row(s.id, s.created[:16].replace("T", " "), s.profile_name or "?", str(len(s.turns)),
                          s.title[:40], key=s.id)
        self.query_one("#sessions-status", Static).update(
            f"{len(found)} session{'s' if len(found) != 1 else ''}" if found else "No sessions yet.")

    def _selected(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

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
