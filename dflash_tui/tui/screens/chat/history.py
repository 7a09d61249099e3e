"""The chat's sessions: a new one, a new context, the picker (ctrl+o), renaming, resuming and replaying."""

from __future__ import annotations

from typing import Optional

from dflash_tui.core import sessions
from dflash_tui.core.conversation import resume
from dflash_tui.core.terminal import counted
from dflash_tui.engines.errors import UserError
from dflash_tui.tui.screens.chat.base import CONTINUING, ChatBase
from dflash_tui.tui.screens.chat.turns import footer_for
from dflash_tui.tui.screens.replay import ReplayScreen
from dflash_tui.tui.screens.sessions import RenameScreen, SessionsScreen
from dflash_tui.tui.widgets import AnswerView, NoticeLine, UserMessage
from dflash_tui.tui.widgets.answer import recorded_segments, recorded_think_tokens


class HistoryActions(ChatBase):
    """New, renamed, resumed and replayed sessions."""

    def action_new_session(self) -> None:
        if self.conversation is None or self.busy():
            return
        self.conversation.new_session()
        self.clear_view()
        self.show_welcome()
        self.refresh_chrome()
        self.notify("New session.", timeout=2)

    def action_new_context(self) -> None:
        """Clear the engine's kept caches; the history stays, and the next turn prefills all of it."""
        if self.conversation is None or self.busy():
            return
        self.conversation.new_context()
        self.notify("New context: the next turn prefills the whole history.", timeout=2)

    def action_sessions(self) -> None:
        def chosen(session_id: Optional[str]) -> None:
            if session_id:
                self.resume_session(session_id)

        conv = self.conversation
        self.app.push_screen(SessionsScreen(conv.session_id if conv is not None else None), chosen)

    def action_rename_session(self) -> None:
        """Name the open chat's session (the palette's "Rename session"), through the chat's own writer."""
        writer = self.conversation.writer if self.conversation is not None else None
        try:
            title = sessions.open_title(writer)
        except UserError as exc:
            self.notify(str(exc), severity="warning", timeout=4)
            return

        def answered(text: Optional[str]) -> None:
            if text is None:
                return
            try:
                self.toast("rename", sessions.renamed(sessions.rename_open(writer, text)), timeout=3)
            except UserError as exc:
                self.notify(str(exc), severity="error", timeout=8)

        self.app.push_screen(RenameScreen(title), answered)

    def resume_session(self, session) -> None:
        if self.conversation is None:
            self.app.pending_resume = session
            return
        if self.busy():
            return
        try:
            if isinstance(session, str):
                session = sessions.load_session(session)
        except UserError as exc:
            self.notify(str(exc), severity="error")
            return
        for warning in session.warnings:
            self.notify(warning, severity="warning", timeout=8)
        try:  # open in another dflash, or its lock file is not one dflash may use: one sentence, the chat stays
            resume(self.conversation, session, self.app.flags)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        prompt = self._prompt
        for turn in self.conversation.turns:  # up recalls the session's prompts too
            prompt.remember(turn.user)
        self.clear_view()
        view = self._view
        decode = self.conversation.engine.decode
        for turn, record in zip(self.conversation.turns, session.turns):
            view.mount(UserMessage(turn.user) if turn.continues is None else NoticeLine(CONTINUING))
            answer = AnswerView(thinking=bool(turn.thinking), ghosts=self.ghosts, fmt=self.conversation.format)
            emitted = record.get("emitted_ids", [])
            segments = recorded_segments(decode, record.get("prompt_ids", []), emitted, record.get("steps", []))
            answer.set_recorded(turn.answer, segments)
            if turn.thinking and turn.continues is None:  # its header's count: the ids up to the thinking's end
                answer.think_tokens = recorded_think_tokens(decode, emitted, self.conversation.format)
            view.mount(answer)
            answer.call_after_refresh(answer.finish, turn.status, footer_for(turn.summary))
        count = len(session.turns)
        self.notice(f"Resumed session {session.id} ({counted(count, 'turn')}).")
        view.follow()  # its last answer in view, once laid out
        self.refresh_chrome()

    def action_replay(self) -> None:
        self.app.push_screen(ReplayScreen(self.conversation.session_id if self.conversation else None))
