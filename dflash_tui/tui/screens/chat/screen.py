"""The main screen: header, conversation, message box, stats (side panel, or one line when small).

It puts the jobs together (turns.py, answers.py, history.py on base.py) and owns what is the screen's
own: its layout, loading, the keys that stop, scroll and redirect typing."""

from __future__ import annotations

import time

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, LoadingIndicator, Static

from dflash_tui.core.conversation import Conversation
from dflash_tui.tui.palette import SettingCommands
from dflash_tui.tui.screens.chat.answers import AnswerActions, FindInput
from dflash_tui.tui.screens.chat.history import HistoryActions
from dflash_tui.tui.screens.chat.keys import KEYS, AnswerCommands
from dflash_tui.tui.screens.chat.view import ConversationView, NewTextMarker
from dflash_tui.tui.widgets import ChatHeader, PromptInput, StatsLine, StatsPanel


class ChatScreen(AnswerActions, HistoryActions):
    """The chat: every job's actions (answers.py on turns.py, history.py) on the shared state of base.py."""

    BINDINGS = KEYS
    COMMANDS = {AnswerCommands, SettingCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]

    def compose(self) -> ComposeResult:
        yield ChatHeader(id="header")
        yield StatsLine(id="stats-line")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with ConversationView(id="conversation"):
                    with Vertical(id="loading"):
                        yield LoadingIndicator()
                        yield Static("", id="loading-text")
                yield NewTextMarker("↓ new text below · ctrl+end or click", id="new-text")
                yield FindInput(placeholder="find · enter/↑ earlier · ↓ later · escape closes", id="find",
                                compact=True)
                yield Static("message · enter send · ctrl+j newline · ↑ earlier prompts", id="input-title")
                yield PromptInput(id="prompt")
            yield StatsPanel(id="stats-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()
        self.set_interval(self.app.FLUSH_INTERVAL, self._flush_events)
        self.set_interval(0.5, self.tick_loading)

    # -- loading (the app loads; the screen shows it) ------------------------------------------------
    def tick_loading(self) -> None:
        app = self.app
        if not app.loading or app.load_error or not self.is_mounted:
            return
        elapsed = time.perf_counter() - app.load_started if app.animations else 0
        what = f"{app.loading_what}: {app.loading_stage}" if app.loading_stage else app.loading_what
        self.query_one("#loading-text", Static).update(f"{what}… {elapsed:.0f} s" if app.animations else f"{what}…")

    def show_loading(self, on: bool) -> None:
        if not self.is_mounted:
            return
        box = self.query_one("#loading")
        box.display = on
        for indicator in box.query(LoadingIndicator):
            indicator.display = on  # a hidden indicator would keep animating

    def engine_ready(self, conversation: Conversation, notices: list[str]) -> None:
        """The app loaded an engine and holds `conversation` on it: say so and resume what waits."""
        app = self.app
        self.show_loading(False)
        for notice in notices:
            self.notice(notice)
        conversation.on_notice = self.notice
        for stale in self.query(".engine-notice"):  # the engine before's ("No CUDA device…" after a switch)
            stale.remove()
        for notice in conversation.engine.warnings:
            self.notice(notice, classes="engine-notice")
        if app.pending_resume is not None:
            session, app.pending_resume = app.pending_resume, None
            self.resume_session(session)
        self.show_welcome()
        self.refresh_chrome()
        self._prompt.focus()

    # -- keys that stop, scroll and redirect -----------------------------------------------------------
    def action_cancel(self) -> None:
        """Escape: stop a running answer, and bring the focus back to the message box; it closes the find
        bar first (the message found stays marked, its matches no longer highlighted), else it clears the mark."""
        if self.active is not None:
            self.active.cancel()
        find = self.query_one("#find", FindInput)
        if find.has_class("-open"):
            find.remove_class("-open")
            self.highlight("")
        elif self.active is None:
            self.mark(None)
        self.set_focus(self._prompt)  # at once: the keys behind escape in a burst go to the message box

    def action_interrupt(self) -> None:
        """ctrl+c: stop a running answer; otherwise, in the message box, copy its selection or clear it all (as a
        shell drops the line it holds), else say how to quit. The box acts in its own turn, after the keys
        typed before ctrl+c (widgets/keys.py); a priority key runs as soon as it arrives."""
        if self.active is not None:
            self.active.cancel()
            return
        if self.focused is self._prompt:
            self._prompt.call_later(self._interrupt_prompt)
        else:
            self.app.action_help_quit()

    def _interrupt_prompt(self) -> None:
        prompt = self._prompt
        if prompt.selected_text:
            prompt.action_copy()
        elif prompt.clear_all():
            self.toast("clear", "Message cleared; ctrl+z brings it back.", timeout=4)
        else:
            self.app.action_help_quit()

    def action_scroll_chat(self, how: str) -> None:
        view = self._view
        scroll = {"page_up": view.scroll_page_up, "page_down": view.scroll_page_down, "home": view.scroll_home,
                  "end": view.scroll_end}
        scroll[how](animate=False)

    def on_key(self, event: events.Key) -> None:
        """A printable key typed while the conversation (or an example button) has the focus goes to the
        message box, as in chat apps: nothing typed is lost, and the next enter sends it."""
        prompt = self._prompt
        if self.focused is prompt or isinstance(self.focused, Input) or not event.is_printable or \
                not event.character or not prompt.display:
            return
        event.stop()
        event.prevent_default()
        prompt.focus()
        prompt.insert(event.character)
