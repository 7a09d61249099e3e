"""The sessions browser: resume, delete, export."""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from dflash_tui.core import sessions


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
            yield Static("", id="sessions-status")
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
        chosen = self._selected()
        if chosen:
            sessions.delete_session(sessions.resolve_own(chosen))
            self.reload()
            self.query_one("#sessions-status", Static).update(f"Deleted {chosen}.")

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
