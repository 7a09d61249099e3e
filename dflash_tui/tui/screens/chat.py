"""The main screen: header, conversation, message box, stats (side panel, or one line when small).

The screen owns the chat: its keys, sending a message, streaming the answer, the stats, thinking,
ghosts and block size, new and resumed sessions. Each answer decodes in a thread worker that only
appends events to a queue; a timer on the UI thread drains the queue every `DflashApp.FLUSH_INTERVAL`
seconds and renders them in one go, so rendering cost does not grow with the engine's token rate.
The worker reports the end of the turn with a `TurnFinished` message. The app holds what outlives
the screen (the engine, the profile, the `Conversation`) and loads engines; what a chat *is*
(history, settings, context trimming, requests, session records) lives in `core.conversation`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Optional

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, LoadingIndicator, Static

from dflash_tui.core import sessions
from dflash_tui.core.conversation import ActiveTurn, Conversation, resume
from dflash_tui.tui.screens.markdown import MarkdownScreen
from dflash_tui.tui.screens.replay import ReplayScreen
from dflash_tui.tui.screens.sessions import SessionsScreen
from dflash_tui.tui.widgets import AnswerView, ChatHeader, NoticeLine, PromptInput, StatsLine, StatsPanel, UserMessage
from dflash_tui.tui.widgets.stats import StatsData
from engines.errors import UserError
from engines.events import Summary

if TYPE_CHECKING:
    from dflash_tui.tui.app import DflashApp

# Priority bindings: the message box (a TextArea) would otherwise take ctrl+k and friends.
KEYS = [
    Binding("ctrl+t", "toggle_thinking", "thinking", priority=True),
    Binding("ctrl+g", "toggle_ghosts", "ghosts", priority=True),
    Binding("ctrl+k", "cycle_block", "block", priority=True),
    Binding("escape", "cancel", "stop", priority=True),
    Binding("ctrl+n", "new_session", "new", priority=True),
    Binding("ctrl+l", "new_context", "new context", show=False, priority=True),
    Binding("ctrl+o", "sessions", "sessions", priority=True),
    Binding("ctrl+r", "replay", "replay", priority=True),
    Binding("f1", "app.help", "help", priority=True),
    Binding("f2", "markdown", "markdown", show=False, priority=True),
    Binding("ctrl+q", "app.quit", "quit", priority=True),
]


class TurnFinished(Message, bubble=False):
    """The generate worker is done with a turn (completed, cancelled or failed with `error`)."""

    def __init__(self, active: ActiveTurn, error: Optional[str]) -> None:
        super().__init__()
        self.active = active
        self.error = error


class ChatScreen(Screen):
    BINDINGS = KEYS
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    app: "DflashApp"

    def __init__(self) -> None:
        super().__init__()
        self.active: Optional[ActiveTurn] = None
        self.active_view: Optional[AnswerView] = None
        self.ghosts = False
        self._events: deque = deque()
        self._last_stats = StatsData()
        self.flushes = 0  # timer flushes that rendered events
        self.turns_done = 0  # answered turns (tests and the benchmark wait on it)
        self.finished: list[ActiveTurn] = []  # in the order they ended

    def compose(self) -> ComposeResult:
        yield ChatHeader(id="header")
        yield StatsLine(id="stats-line")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with VerticalScroll(id="conversation"):
                    with Vertical(id="loading"):
                        yield LoadingIndicator()
                        yield Static("", id="loading-text")
                yield Static("message · enter send · ctrl+j newline · ↑ earlier prompts", id="input-title")
                yield PromptInput(id="prompt")
            yield StatsPanel(id="stats-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()
        self.set_interval(self.app.FLUSH_INTERVAL, self._flush_events)
        self.set_interval(0.5, self.tick_loading)

    @property
    def conversation(self) -> Optional[Conversation]:
        return self.app.conversation

    @property
    def _view(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

    @property
    def _prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    # -- loading (the app loads; the screen shows it) ------------------------------------------------
    def tick_loading(self) -> None:
        app = self.app
        if not app.loading or app.load_error or not self.is_mounted:
            return
        elapsed = time.perf_counter() - app.load_started if app.animate else 0
        self.query_one("#loading-text", Static).update(f"{app.loading_what}… {elapsed:.0f} s" if app.animate
                                                       else f"{app.loading_what}…")

    def show_loading(self, on: bool) -> None:
        if not self.is_mounted:
            return
        box = self.query_one("#loading")
        box.display = on
        for indicator in box.query(LoadingIndicator):
            indicator.display = on  # a hidden indicator would keep animating

    def engine_ready(self, notices: list[str]) -> None:
        """The app loaded an engine and holds a conversation on it: say so and resume what waits."""
        app = self.app
        self.show_loading(False)
        for notice in notices:
            self.notice(notice)
        app.conversation.on_notice = self.notice
        for notice in app.engine.warnings:
            self.notice(notice)
        if app.pending_resume is not None:
            session, app.pending_resume = app.pending_resume, None
            self.resume_session(session)
        self.refresh_chrome()
        self._prompt.focus()

    # -- chrome: header, stats -------------------------------------------------------------------
    def thinking_before_load(self) -> bool:
        """Thinking as the header shows it while no conversation exists: the flag, else the profile's."""
        app = self.app
        if app.flags.thinking is not None:
            return app.flags.thinking
        return app.profile.thinking if app.profile else True

    def refresh_chrome(self) -> None:
        if not self.is_mounted:
            return
        app, conv, engine = self.app, self.conversation, self.app.engine
        header = self.query_one("#header", ChatHeader)
        name = app.profile.name if app.profile else str(app.profile_ref or "demo")
        thinking = conv.settings.thinking if conv else self.thinking_before_load()
        if engine is None:
            header.show(name, "?", "?", "?", "?", thinking, self.ghosts, loading=app.loading)
        else:
            header.show(name, engine.name, engine.device, engine.dtype,
                        conv.settings.block_size if conv else engine.block_size, thinking, self.ghosts)
        self._show_stats(self._stats_data())

    def _stats_data(self) -> StatsData:
        d = StatsData()
        conv, engine = self.conversation, self.app.engine
        if engine is not None:
            d.engine, d.device, d.dtype = engine.name, engine.device, engine.dtype
            d.block_size = engine.block_size
        d.ghosts = self.ghosts
        if conv is None:
            d.thinking = self.thinking_before_load()
            return d
        d.thinking = conv.settings.thinking
        d.block_size = turn_block = conv.settings.block_size  # the next turn's, except while one runs
        d.session_tau = conv.session_tau()
        d.context_limit = conv.context_limit() if engine is not None else None  # None while switching engines
        steps = 0
        if self.active is not None:
            s = self.active.stats
            d.tokens_per_s, d.tokens, d.tau, d.histogram = s.tokens_per_s, s.tokens, s.tau, s.histogram()
            d.draft_s, d.verify_s, steps = s.draft_s, s.verify_s, len(s.lengths)
            d.context_tokens = s.prompt_tokens + s.tokens
            d.block_size = turn_block = self.active.block_size
            d.peak_bytes, d.peak_kind = self._last_stats.peak_bytes, self._last_stats.peak_kind
            d.state = "generating"
        elif conv.turns and conv.turns[-1].summary:
            m = conv.turns[-1].summary
            d.tokens_per_s, d.tokens, d.tau, d.histogram = m.decode_tokens_per_s, m.generated_tokens, \
                m.mean_acceptance_length, m.histogram
            d.draft_s, d.verify_s, steps = m.draft_s, m.verify_s, len(m.acceptance_lengths)
            d.context_tokens = m.prompt_tokens + m.generated_tokens
            d.peak_bytes, d.peak_kind = m.peak_memory_bytes, m.peak_memory_kind
            d.reused_tokens, d.prefilled_tokens = m.reused_prompt_tokens, m.prefilled_prompt_tokens
            turn_block = m.block_size or turn_block
            d.state = "done"
        if steps:
            d.speedup, d.speedup_kind = conv.speedup(d.tokens_per_s, d.tau, d.draft_s, d.verify_s, steps, turn_block)
        return d

    def _show_stats(self, d: StatsData) -> None:
        self._last_stats = d
        self.query_one("#stats-panel", StatsPanel).show(d)
        self.query_one("#stats-line", StatsLine).show(d)

    def notice(self, text: str) -> None:
        if not self.is_mounted:
            return
        view = self._view
        view.mount(NoticeLine(f"· {text}"))
        view.scroll_end(animate=False)

    # -- sending and streaming -------------------------------------------------------------------
    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text.strip("\n")
        if self.conversation is None:
            self._prompt.load_text(text)
            self.notify("The model is still loading." if self.app.loading else
                        "No model is loaded; ctrl+p switches profile or engine.", severity="warning")
            return
        if self.active is not None:
            self._prompt.load_text(text)
            self.notify("Still answering; escape stops it.", severity="warning")
            return
        self.send(text)

    def send(self, text: str) -> None:
        try:
            active = self.conversation.begin(text)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        view = self._view
        answer = AnswerView(thinking=active.request.thinking, ghosts=self.ghosts)
        view.mount(UserMessage(text))
        view.mount(answer)
        view.scroll_end(animate=False)
        self.active, self.active_view = active, answer
        self.refresh_chrome()
        self._generate(active)

    @work(thread=True, group="generate")
    def _generate(self, active: ActiveTurn) -> None:
        error = None
        push = self._events.append
        try:
            for event in self.conversation.stream(active):
                push(event)
        except UserError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - shown on screen
            error = f"{type(exc).__name__}: {exc}"
        try:
            self.post_message(TurnFinished(active, error))  # False once the app is gone: the turn is recorded
        except RuntimeError:  # the event loop already closed
            pass

    def _flush_events(self) -> None:
        if not self._events or self.active_view is None:
            return
        events = []
        pop = self._events.popleft
        while self._events:
            events.append(pop())
        self.flushes += 1
        view = self.active_view
        view.add_events(events)
        grew = view.render_text(cheap=True)
        self._show_stats(self._stats_data())
        if grew:
            conversation = self._view
            if conversation.max_scroll_y - conversation.scroll_y < 4:
                conversation.call_after_refresh(conversation.scroll_end, animate=False)

    def on_turn_finished(self, message: TurnFinished) -> None:
        active, error = message.active, message.error
        self._flush_events()
        view = self.active_view
        turn = active.turn
        status = turn.status if turn else ("error" if error else "cancelled")
        summary = turn.summary if turn else None
        if view is not None:
            view.finish(status, footer_for(summary, turn.save_error if turn else None))
        self.active, self.active_view = None, None
        self.turns_done += 1
        self.finished.append(active)
        if error:
            self.notify(error, severity="error", timeout=10)
        self.refresh_chrome()
        self._view.scroll_end(animate=False)

    # -- actions ---------------------------------------------------------------------------------
    def action_toggle_thinking(self) -> None:
        if self.conversation is None:
            self.app.flags.thinking = not self.thinking_before_load()
        else:
            warning = self.conversation.toggle_thinking()
            if warning:
                self.notify(warning, severity="warning", timeout=8)
        self.refresh_chrome()

    def action_toggle_ghosts(self) -> None:
        self.ghosts = not self.ghosts
        for view in self.query(AnswerView):
            view.set_ghosts(self.ghosts)
        self.refresh_chrome()

    def action_cycle_block(self) -> None:
        if self.conversation is None:
            return
        block = self.conversation.cycle_block()
        self.notify(f"Block size {block} from the next turn.", timeout=2)
        self.refresh_chrome()

    def set_block(self, block: int) -> None:
        try:
            self.conversation.set_block(block)
        except UserError as exc:
            self.notify(str(exc), severity="error")
        self.refresh_chrome()

    def action_cancel(self) -> None:
        if self.active is not None:
            self.active.cancel()

    def busy(self) -> bool:
        """A turn is streaming (and the person is told so)."""
        if self.active is not None:
            self.notify("Still answering; escape stops it first.", severity="warning")
            return True
        return False

    def clear_view(self) -> None:
        for child in list(self._view.children):
            if child.id != "loading":
                child.remove()

    def action_new_session(self) -> None:
        if self.conversation is None or self.busy():
            return
        self.conversation.new_session()
        self.clear_view()
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

        self.app.push_screen(SessionsScreen(), chosen)

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
        resume(self.conversation, session, self.app.flags)
        prompt = self._prompt
        for turn in self.conversation.turns:  # up recalls the session's prompts too
            prompt.remember(turn.user)
        self.clear_view()
        view = self._view
        for turn in self.conversation.turns:
            view.mount(UserMessage(turn.user))
            answer = AnswerView(thinking=bool(turn.thinking), ghosts=self.ghosts)
            answer.set_text(turn.answer)
            view.mount(answer)
            answer.call_after_refresh(answer.finish, turn.status, footer_for(turn.summary))
        self.notice(f"Resumed session {session.id} ({len(session.turns)} turns).")
        self.refresh_chrome()

    def action_replay(self) -> None:
        self.app.push_screen(ReplayScreen(self.conversation.session_id if self.conversation else None))

    def action_markdown(self) -> None:
        done = [v for v in self.query(AnswerView) if v.status != "streaming"]
        if done:
            self.app.push_screen(MarkdownScreen(done[-1].answer_text))

    def on_answer_view_selected(self, message: AnswerView.Selected) -> None:
        self.app.push_screen(MarkdownScreen(message.answer.answer_text))


def footer_for(summary: Optional[Summary], save_error: Optional[str] = None) -> Optional[str]:
    """The line under an answer: its figures, why it stopped early, and whether the file has it."""
    if summary is None:
        return save_error
    parts = [f"{summary.generated_tokens} tokens", f"{summary.decode_tokens_per_s:.1f} tok/s",
             f"tau {summary.mean_acceptance_length:.2f}", f"block {summary.block_size}"]
    parts += [note for note in (summary.stopped_by, save_error) if note]
    return " · ".join(parts)
