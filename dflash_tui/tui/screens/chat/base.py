"""What every part of the chat screen shares: its state, the header and stats, notices and toasts, the
welcome, the message box and the marked message. The jobs build on it: turns.py (sending, streaming, the
turn's settings), answers.py (finding, copying and redoing answers), history.py (sessions)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Optional

from textual.notifications import Notification, Notify
from textual.screen import Screen

from dflash_tui.core import sessions
from dflash_tui.core.conversation import ActiveTurn, Conversation, running_draft, running_draft_kind
from dflash_tui.core.figures import draft_name
from dflash_tui.core.profiles import Profile, builtin_profile_dir
from dflash_tui.tui.screens.chat.view import ConversationView
from dflash_tui.tui.widgets import AnswerView, ChatHeader, NoticeLine, PromptInput, StatsLine, StatsPanel, UserMessage
from dflash_tui.tui.widgets.answer import Welcome
from dflash_tui.tui.widgets.header import temperature_text
from dflash_tui.tui.widgets.stats import StatsData

if TYPE_CHECKING:
    from dflash_tui.tui.app import DflashApp

CONTINUING = "· continuing the stopped answer above"  # stands where a continued turn's question would


class ChatBase(Screen):
    """The chat screen's shared state and chrome (see the module docstring); `ChatScreen` is the whole."""

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
        self.measures = 0  # block-1 measurements finished (tests wait on it)
        self.selected: Optional[AnswerView] = None  # the answer last clicked: f2 acts on it
        self.marked: Optional[UserMessage | AnswerView] = None  # reached by alt+up/down or ctrl+f: f3 copies it
        self._toasts: dict[str, Notification] = {}  # the toast shown per kind, replaced rather than stacked

    @property
    def conversation(self) -> Optional[Conversation]:
        return self.app.conversation

    @property
    def _view(self) -> ConversationView:
        return self.query_one("#conversation", ConversationView)

    @property
    def _prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

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
        temperature = temperature_text(conv.settings.temperature) if conv else None
        if engine is None:
            header.show(name, "?", "?", "?", "?", thinking, self.ghosts, loading=app.loading, temperature=temperature,
                        failed=app.load_error is not None)
        else:
            # the block size the next turn runs with; unknown ("–") on a server that runs its own and does not
            # say which (never the profile's, which it does not use)
            block = (conv.settings.block_size if conv else engine.block_size) if engine.reports_steps else None
            header.show(name, engine.name, engine.device, engine.dtype, block, thinking, self.ghosts,
                        temperature=temperature, top_p=conv.settings.top_p if conv else None,
                        effort=conv.effort if conv else None, draft=running_draft_kind(engine))
        self._show_stats(self._stats_data())

    def _stats_data(self) -> StatsData:
        d = StatsData()
        conv, engine = self.conversation, self.app.engine
        known_steps = engine is None or engine.reports_steps  # False: a server's text chunks, not steps
        if engine is not None:
            d.engine, d.device, d.dtype = engine.name, engine.device, engine.dtype
            d.draft_kind = running_draft_kind(engine)
            d.draft = draft_name(running_draft(engine))
            d.block_size = engine.block_size if known_steps else None
        else:
            d.block_size = None  # nothing loaded (loading, or a load that failed): not "block 1"
        if not known_steps:  # nor will a turn tell its acceptance, split, memory or cache reuse
            d.histogram = d.draft_s = d.verify_s = d.peak_bytes = d.reused_tokens = d.prefilled_tokens = None
        d.ghosts = self.ghosts
        if conv is None:
            d.thinking = self.thinking_before_load()
            return d
        d.thinking, d.effort = conv.settings.thinking, conv.effort
        # the next turn's block size, except while one runs (unknown where the server runs its own)
        d.block_size = turn_block = conv.settings.block_size if known_steps else None
        d.session_tau = conv.session_tau()
        d.session_mixed = len({t.summary.block_size for t in conv.turns if t.summary}) > 1
        d.context_limit = conv.context_limit() if engine is not None else None  # None while switching engines
        steps = step_tokens = 0
        step_times: list[float] = []
        if self.active is not None:
            s = self.active.stats
            d.tokens_per_s, d.tokens, d.tau, d.histogram = s.tokens_per_s, s.tokens, s.tau, s.histogram()
            d.draft_s, d.verify_s = (s.draft_s, s.verify_s) if s.steps_known else (None, None)
            steps, step_tokens, step_times = len(s.lengths), sum(s.lengths), s.step_s
            d.context_tokens = s.prompt_tokens + s.tokens
            d.block_size = turn_block = self.active.block_size
            d.peak_bytes, d.peak_kind = self._last_stats.peak_bytes, self._last_stats.peak_kind
            d.state = "generating"
        elif conv.turns and conv.turns[-1].summary:
            m = conv.turns[-1].summary
            d.tokens_per_s, d.tokens, d.tau, d.histogram = m.decode_tokens_per_s, m.generated_tokens, \
                m.mean_acceptance_length, m.histogram
            d.draft_s, d.verify_s = m.draft_s, m.verify_s
            steps, step_tokens = len(m.acceptance_lengths or []), sum(m.acceptance_lengths or [])
            step_times = conv.turns[-1].step_s
            d.context_tokens = m.prompt_tokens + m.generated_tokens
            d.peak_bytes, d.peak_kind = m.peak_memory_bytes, m.peak_memory_kind
            if engine is None or (m.engine, m.device) != (engine.name, engine.device):
                d.peak_bytes = None  # the engine before a switch measured it: not this one's memory
            d.reused_tokens, d.prefilled_tokens = m.reused_prompt_tokens, m.prefilled_prompt_tokens
            turn_block = m.block_size or turn_block
            d.state = "done"
        if steps:
            d.speedup = conv.speedup(turn_block, d.context_tokens, step_tokens, step_times)
        d.session_speedup = conv.session_speedup()
        return d

    def _show_stats(self, d: StatsData) -> None:
        self._last_stats = d
        self.query_one("#stats-panel", StatsPanel).show(d)
        self.query_one("#stats-line", StatsLine).show(d)

    def notice(self, text: str, classes: str = "") -> None:
        if not self.is_mounted:
            return
        view = self._view
        view.mount(NoticeLine(f"· {text}", classes=classes))  # the anchor shows it, unless the reader scrolled up

    def toast(self, kind: str, text: str, timeout: float = 2) -> None:
        """A toast that replaces the last one of its `kind` (repeated keys must not pile them up)."""
        old = self._toasts.get(kind)
        if old is not None and old in self.app._notifications:  # Textual has no public way to withdraw one
            self.app._unnotify(old)
        self._toasts[kind] = Notification(text, "", "information", timeout)
        self.app.post_message(Notify(self._toasts[kind]))

    def show_welcome(self) -> None:
        """Before the first turn: what the model is for and its example prompts."""
        profile = self.app.profile
        if self.conversation is None or profile is None or self.conversation.turns or self.query(Welcome):
            return
        self._view.mount(Welcome(profile.name, profile.description, profile.examples,
                                 demo=is_builtin_demo(profile), earlier=len(sessions.session_paths())))

    def on_welcome_chosen(self, message: Welcome.Chosen) -> None:
        self.fill_prompt(message.text)

    def fill_prompt(self, text: str) -> None:
        prompt = self._prompt
        prompt.load_text(text)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

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

    # -- the marked message (alt+up/down, ctrl+f): f3 copies it --------------------------------------
    def messages(self) -> list[UserMessage | AnswerView]:
        """The conversation's messages, top to bottom: the person's and the answers."""
        return [w for w in self._view.children if isinstance(w, (UserMessage, AnswerView))]

    def mark(self, widget: Optional[UserMessage | AnswerView]) -> None:
        shown = self.marked_message()
        if shown is not None:
            shown.remove_class("-marked")
        self.marked = widget
        if widget is not None:
            widget.add_class("-marked")
            self._view.scroll_to_widget(widget, animate=False, top=widget.outer_size.height > self._view.size.height)

    def marked_message(self) -> Optional[UserMessage | AnswerView]:
        """The marked message, while it is still on screen (a retracted answer's mark is gone with it)."""
        return self.marked if self.marked is not None and self.marked.is_attached else None

    def marked_answer(self) -> Optional[AnswerView]:
        """The marked message when it is an answer (what f2, f8, f9 and ctrl+g act on before the last one)."""
        marked = self.marked_message()
        return marked if isinstance(marked, AnswerView) else None


def is_builtin_demo(profile: Profile) -> bool:
    """Whether `profile` is the built-in demo pair (a tiny model, not an assistant)."""
    path = profile.path
    return profile.name == "demo" and path is not None and path.resolve().parent == builtin_profile_dir().resolve()
