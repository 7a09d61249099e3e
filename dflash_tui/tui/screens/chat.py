"""The main screen: header, conversation, message box, stats (side panel, or one line when small).

The screen owns the chat: its keys, sending a message, streaming the answer, the stats, thinking,
ghosts and block size, new and resumed sessions. Each answer decodes in a thread worker that only
appends events to a queue; a timer on the UI thread drains the queue every `DflashApp.FLUSH_INTERVAL`
seconds and renders them in one go, so rendering cost does not grow with the engine's token rate.
The worker reports the end of the turn with a `TurnFinished` message; once the chat is idle, another
worker times a block-1 step (`Conversation.measure_block1`) so the speedup shown is measured. Nothing
here blocks the UI thread: keys typed at any moment reach the message box.

Before the first turn a welcome says what the loaded model is for and offers the profile's example
prompts. Answers stream as Markdown (f2: as written), can be copied (OSC 52; a code block or the thinking
on its own too), regenerated, their prompt edited and resent, and a stopped answer continued. The app
holds what outlives the screen (the engine, the profile, the `Conversation`) and loads engines; what a
chat *is* (history, settings, context trimming, requests, session records) lives in `core.conversation`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Optional

from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.notifications import Notification, Notify
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Input, LoadingIndicator, Static

from dflash_tui.core import sessions
from dflash_tui.core.conversation import ActiveTurn, Conversation, reports_steps, resume, running_draft, running_draft_kind
from dflash_tui.core.figures import draft_name, fixed, known
from dflash_tui.core.terminal import counted
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.events import Summary
from dflash_tui.tui.palette import SettingCommands
from dflash_tui.tui.screens.replay import ReplayScreen
from dflash_tui.tui.screens.sessions import RenameScreen, SessionsScreen
from dflash_tui.tui.widgets import AnswerView, ChatHeader, NoticeLine, PromptInput, StatsLine, StatsPanel, UserMessage
from dflash_tui.tui.widgets.answer import Welcome, recorded_segments, recorded_think_tokens
from dflash_tui.tui.widgets.header import temperature_text
from dflash_tui.tui.widgets.keys import TextInput
from dflash_tui.tui.widgets.stats import StatsData

if TYPE_CHECKING:
    from dflash_tui.tui.app import DflashApp

CONTINUING = "· continuing the stopped answer above"  # stands where a continued turn's question would

# Priority bindings: the message box (a TextArea) would otherwise take the function keys and ctrl+c. It
# keeps readline's ctrl+a/e/k/u/w (widgets/prompt.py): the block size is on f7. The footer shows
# only what fits 80 columns with f1 and ^q still in view; the rest are in help (f1) and the palette (ctrl+p).
KEYS: list[BindingType] = [
    Binding("ctrl+t", "toggle_thinking", "thinking", priority=True),
    Binding("ctrl+g", "toggle_ghosts", "ghosts", show=False, priority=True),
    Binding("f7", "cycle_block", "block", priority=True),  # ctrl+k is readline's kill in the message box
    Binding("escape", "cancel", "stop", priority=True),
    Binding("ctrl+c", "interrupt", "stop", show=False, priority=True),
    # the conversation scrolls from the message box (whose own page keys would only move its cursor)
    Binding("pageup", "scroll_chat('page_up')", "scroll up", show=False, priority=True),
    Binding("pagedown", "scroll_chat('page_down')", "scroll down", show=False, priority=True),
    Binding("ctrl+home", "scroll_chat('home')", "top", show=False, priority=True),
    Binding("ctrl+end", "scroll_chat('end')", "bottom", show=False, priority=True),
    Binding("ctrl+n", "new_session", "new", priority=True),
    Binding("ctrl+l", "new_context", "new context", show=False, priority=True),
    Binding("ctrl+o", "sessions", "sessions", priority=True),
    Binding("ctrl+r", "replay", "replay", show=False, priority=True),
    Binding("f1", "app.help", "help", priority=True),
    Binding("f2", "markdown", "as written", show=False, priority=True),
    Binding("f3", "copy_answer", "copy", show=False, priority=True),
    Binding("f8", "copy_code", "copy code", show=False, priority=True),
    Binding("f9", "fold_thinking", "fold thinking", show=False, priority=True),
    Binding("alt+up", "mark(-1)", "earlier message", show=False, priority=True),
    Binding("alt+down", "mark(1)", "later message", show=False, priority=True),
    Binding("ctrl+f", "find", "find", show=False, priority=True),
    Binding("f4", "regenerate", "regenerate", show=False, priority=True),
    Binding("f5", "edit_last", "edit last", show=False, priority=True),
    Binding("f6", "continue_answer", "continue", show=False, priority=True),
    Binding("ctrl+q", "app.quit", "quit", priority=True),
]

# The palette's commands on answers: (title, help, ChatScreen action); "Answer as written" (f2) is the app's.
ANSWER_COMMANDS = [
    ("Copy message", "f3: copy the marked message (alt+up/down, ctrl+f), else the last answer", "copy_answer"),
    ("Copy thinking", "copy the thinking of the marked answer, else the last one's", "copy_thinking"),
    ("Fold thinking", "f9: fold or unfold the thinking of the marked answer, else the last one's", "fold_thinking"),
    ("Find in the conversation", "ctrl+f: mark the messages that hold a text, one by one", "find"),
    ("Regenerate answer", "f4: drop the last answer and ask the same prompt again", "regenerate"),
    ("Edit last prompt", "f5: drop the last answer and put its prompt back in the message box", "edit_last"),
    ("Continue answer", "f6: go on with a stopped (cancelled) last answer", "continue_answer"),
]


class AnswerCommands(Provider):
    """The answer commands in the command palette (ctrl+p)."""

    def _commands(self):
        chat = self.screen
        for title, help_text, action in ANSWER_COMMANDS:
            yield title, help_text, lambda a=action: chat.run_action(a)
        answers = chat.query(AnswerView)
        last = answers.last() if answers else None
        for n, (lang, _) in enumerate(last.code_blocks if last else []):  # the last answer's
            yield f"Copy code block {n + 1} ({lang})", "f8 copies each in turn", lambda n=n: chat.copy_code(last, n)

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


class TurnFinished(Message, bubble=False):
    """The generate worker is done with a turn (completed, cancelled or failed with `error`)."""

    def __init__(self, active: ActiveTurn, error: Optional[str]) -> None:
        super().__init__()
        self.active = active
        self.error = error


class BlockOneMeasured(Message, bubble=False):
    """The measure worker timed a block-1 step: the speedup can now be shown as measured."""


class ChatScreen(Screen):
    BINDINGS = KEYS
    COMMANDS = {AnswerCommands, SettingCommands}
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
        self.measures = 0  # block-1 measurements finished (tests wait on it)
        self.selected: Optional[AnswerView] = None  # the answer last clicked: f2 acts on it
        self.marked: Optional[UserMessage | AnswerView] = None  # reached by alt+up/down or ctrl+f: f3 copies it
        self._toasts: dict[str, Notification] = {}  # the toast shown per kind, replaced rather than stacked

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

    @property
    def conversation(self) -> Optional[Conversation]:
        return self.app.conversation

    @property
    def _view(self) -> ConversationView:
        return self.query_one("#conversation", ConversationView)

    @property
    def _prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

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
            block = (conv.settings.block_size if conv else engine.block_size) if reports_steps(engine) else None
            header.show(name, engine.name, engine.device, engine.dtype, block, thinking, self.ghosts,
                        temperature=temperature, top_p=conv.settings.top_p if conv else None,
                        effort=conv.effort if conv else None, draft=running_draft_kind(engine))
        self._show_stats(self._stats_data())

    def _stats_data(self) -> StatsData:
        d = StatsData()
        conv, engine = self.conversation, self.app.engine
        known_steps = engine is None or reports_steps(engine)  # False: a server's text chunks, not steps
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
        self._view.mount(Welcome(profile.name, profile.description, getattr(profile, "examples", ()),
                                 demo=is_builtin_demo(profile), earlier=len(sessions.session_paths())))

    def on_welcome_chosen(self, message: Welcome.Chosen) -> None:
        self.fill_prompt(message.text)

    def fill_prompt(self, text: str) -> None:
        prompt = self._prompt
        prompt.load_text(text)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

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
        if not self.send(text) and not self._prompt.text:
            self.fill_prompt(message.text)  # refused (too long for the context): the text stays to be shortened

    def send(self, text: str) -> bool:
        """Start a turn on `text`; False when it was refused (the person is told why)."""
        conversation = self.conversation
        assert conversation is not None  # sent only once a model is loaded, or again after one answered
        try:
            active = conversation.begin(text)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return False
        answer = AnswerView(thinking=active.request.thinking, ghosts=self.ghosts, fmt=conversation.format)
        self._start(conversation, active, answer, UserMessage(text))
        return True

    def _start(self, conversation: Conversation, active: ActiveTurn, answer: AnswerView, *before) -> None:
        view = self._view
        for welcome in self.query(Welcome):
            welcome.remove()
        view.mount(*before, answer)
        view.follow()  # the person sent it: to the end, following the answer until they scroll up
        self.active, self.active_view = active, answer
        self.refresh_chrome()
        self._generate(conversation, active)

    @work(thread=True, group="generate")
    def _generate(self, conversation: Conversation, active: ActiveTurn) -> None:
        error = None
        push = self._events.append
        try:
            for event in conversation.stream(active):
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
        # the conversation follows new text itself, and never moves a reader who scrolled up: they are told
        if grew and not following(self._view):
            self.query_one("#new-text").display = True

    def on_turn_finished(self, message: TurnFinished) -> None:
        active, error = message.active, message.error
        self._flush_events()
        view = self.active_view
        turn = active.turn
        status = turn.status if turn else ("error" if error else "cancelled")
        summary = turn.summary if turn else None
        if view is not None:
            engine = self.app.engine
            # exact, as a resume counts it
            if view.thinking and turn is not None and turn.continues is None and engine is not None:
                view.think_tokens = recorded_think_tokens(engine.decode, turn.emitted_ids, view.fmt)
            view.finish(status, footer_for(summary, turn.save_error if turn else None))
        self.active, self.active_view = None, None
        self.turns_done += 1
        self.finished.append(active)
        if error:
            self.notify(error, severity="error", timeout=10)
        self.refresh_chrome()
        if not error and hasattr(self.conversation, "measure_block1"):
            self._measure(self.conversation)

    @work(thread=True, group="measure", exclusive=True)
    def _measure(self, conversation: Conversation) -> None:
        """Time block 1 off the UI thread; a turn begun meanwhile waits only for its few forwards."""
        if conversation.measure_block1():
            try:
                self.post_message(BlockOneMeasured())
            except RuntimeError:  # the event loop already closed
                pass

    def on_block_one_measured(self, message: BlockOneMeasured) -> None:
        self.measures += 1
        if self.active is None:
            self.refresh_chrome()

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
        for view in self.query(AnswerView):  # the conversation keeps the reader's line as the heights change
            view.set_ghosts(self.ghosts)
        self.refresh_chrome()

    def action_cycle_block(self) -> None:
        if self.conversation is None:
            return
        try:
            block = self.conversation.cycle_block()
        except UserError as exc:  # a server that runs its own block size
            self.toast("block", str(exc), timeout=6)
            return
        self._block_chosen(self.conversation, block)

    def set_block(self, block: int) -> None:
        """Block size `block` from the next turn (the palette's), or the sentence saying why not."""
        if self.conversation is None:
            return
        try:
            self.conversation.set_block(block)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self._block_chosen(self.conversation, block)

    def _block_chosen(self, conversation: Conversation, block: int) -> None:
        self.toast("block", f"Block size {block} from the next turn.")
        self.refresh_chrome()
        self._prepare(conversation)

    @work(thread=True, group="prepare", exclusive=True)
    def _prepare(self, conversation: Conversation) -> None:
        """Capture what the new block size needs while idle (CUDA graphs on a GPU), so the next send does
        not wait for it; a toast says so when it happened."""
        block = conversation.settings.block_size
        if conversation.prepare_steps():
            self.app.call_from_thread(self.toast, "block", f"Block {block} is ready (CUDA graphs captured).")

    def action_cancel(self) -> None:
        """Escape: stop a running answer, and bring the focus back to the message box; it closes the find
        bar first (the message found stays marked), else it clears the mark."""
        if self.active is not None:
            self.active.cancel()
        find = self.query_one("#find", FindInput)
        if find.has_class("-open"):
            find.remove_class("-open")
        elif self.active is None:
            self.mark(None)
        self.set_focus(self._prompt)  # at once: the keys behind escape in a burst go to the message box

    # -- marking, finding and copying any message -------------------------------------------------
    def messages(self) -> list[UserMessage | AnswerView]:
        """The conversation's messages, top to bottom: the person's and the answers."""
        return [w for w in self._view.children if isinstance(w, (UserMessage, AnswerView))]

    def mark(self, widget: Optional[UserMessage | AnswerView]) -> None:
        if self.marked is not None and self.marked.is_attached:
            self.marked.remove_class("-marked")
        self.marked = widget
        if widget is not None:
            widget.add_class("-marked")
            self._view.scroll_to_widget(widget, animate=False, top=widget.outer_size.height > self._view.size.height)

    def action_mark(self, by: int) -> None:
        """alt+up / alt+down: mark the message before or after the marked one (from the end at first)."""
        found = self.messages()
        if not found:
            return
        at = found.index(self.marked) if self.marked in found else len(found)
        self.mark(found[max(0, min(at + by, len(found) - 1))])

    def action_find(self) -> None:
        find = self.query_one("#find", FindInput)
        find.add_class("-open")
        self.set_focus(find)  # at once, not after the keys already queued: those behind ctrl+f are the search

    def on_input_changed(self, event) -> None:
        if event.input.id == "find":
            self.find_step(0)

    def find_step(self, by: int) -> None:
        """Mark a message holding the find bar's text (any case): the last one at first (by 0), then each
        earlier one (by -1) or later one (by 1), round the conversation."""
        find = self.query_one("#find", FindInput)
        needle = find.value.lower()
        found = [w for w in self.messages() if needle and needle in message_text(w).lower()]
        if not found:
            self.mark(None)
            if needle:
                self.toast("find", f"Nothing holds {find.value!r}.")
            return
        if by == 0 or self.marked not in found:
            target = found[-1]
        else:
            target = found[(found.index(self.marked) + by) % len(found)]
        self.mark(target)
        self.toast("find", f"{found.index(target) + 1} of {len(found)} messages hold {find.value!r}.")

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
        getattr(self._view, f"scroll_{how}")(animate=False)

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

    # -- acting on answers ------------------------------------------------------------------------
    def last_answer(self) -> Optional[AnswerView]:
        """The last finished answer on screen (None when there is none, told to the person)."""
        done = [v for v in self.query(AnswerView) if v.status != "streaming"]
        if not done:
            self.notify("There is no finished answer yet.", severity="warning", timeout=3)
        return done[-1] if done else None

    async def action_markdown(self) -> None:
        """Toggle the marked or clicked answer (else the last) between coloured tokens and rendered Markdown."""
        marked = self.marked if isinstance(self.marked, AnswerView) and self.marked.is_attached else None
        view = marked or (self.selected if self.selected is not None and self.selected.is_attached else
                          self.last_answer())
        if view is not None:
            await view.show_markdown(not view.markdown)

    async def on_answer_view_selected(self, message: AnswerView.Selected) -> None:
        self.selected = message.answer
        await message.answer.show_markdown(not message.answer.markdown)

    def copy(self, text: str, said: str) -> None:
        """`text` to the clipboard, and a toast that says what was copied."""
        self.app.copy_to_clipboard(text)
        self.toast("copy", said)

    def action_copy_answer(self) -> None:
        """f3: copy the marked message (alt+up/down, ctrl+f), else the last answer."""
        marked = self.marked if self.marked is not None and self.marked.is_attached else None
        if isinstance(marked, UserMessage):
            self.copy(marked.text, f"Copied your message ({len(marked.text)} characters).")
            return
        view = marked or self.last_answer()
        if view is not None:
            self.copy(view.answer_text, f"Copied the answer ({len(view.answer_text)} characters).")

    def answer_in_reach(self) -> Optional[AnswerView]:
        """The marked answer, else the last one on screen, finished or not (None when there is none, told)."""
        if isinstance(self.marked, AnswerView) and self.marked.is_attached:
            return self.marked
        answers = self.query(AnswerView)
        if not answers:
            self.toast("answer", "There is no answer yet.")
        return answers.last() if answers else None

    def action_copy_code(self) -> None:
        """f8: copy a code block of the marked or last answer; each press the next one."""
        view = self.answer_in_reach()
        if view is not None:
            self.copy_code(view)

    def copy_code(self, view: AnswerView, index: Optional[int] = None) -> None:
        picked = view.pick_code(index)
        if picked is None:
            self.toast("copy", "That answer has no code block.")
        else:
            self.copy(picked.code, picked.said)

    def on_answer_view_copy_code(self, message: AnswerView.CopyCode) -> None:
        self.copy_code(message.answer, message.index)

    def action_copy_thinking(self) -> None:
        view = self.answer_in_reach()
        thought = view.thinking_text.strip() if view is not None else ""
        if thought:
            self.copy(thought, f"Copied the thinking ({len(thought)} characters).")
        elif view is not None:
            self.toast("copy", "That answer has no thinking.")

    def action_fold_thinking(self) -> None:
        """f9: fold or unfold the thinking of the marked or last answer."""
        view = self.answer_in_reach()
        if view is not None and not view.fold_thinking():
            self.toast("answer", "That answer has no thinking.")

    def _take_back_last(self):
        """Retract the last turn from the chat (and so from the session) and the screen: regenerate and
        edit ask again in its place. Returns that turn, or None (told why)."""
        conv = self.conversation
        if conv is None or self.busy():
            return None
        try:
            turn = conv.retract_last()
        except UserError as exc:
            self.notify(str(exc), severity="warning", timeout=3)
            return None
        answers = self.query(AnswerView)
        if answers:
            answer = answers.last()
            # the line right above it goes too: its question, or for a continuation the "continuing" line
            heading = UserMessage if turn.continues is None else NoticeLine
            shown = list(self._view.children)
            place = shown.index(answer)
            above = shown[place - 1:place] if place and isinstance(shown[place - 1], heading) else []
            for widget in (*above, answer):
                widget.remove()
        return turn

    def action_regenerate(self) -> None:
        turn = self._take_back_last()
        if turn is not None:
            self.send(turn.user)

    def action_edit_last(self) -> None:
        turn = self._take_back_last()
        if turn is not None:
            self.fill_prompt(turn.user)

    def action_continue_answer(self) -> None:
        """Go on with a stopped last answer: a new turn that starts with what it said so far."""
        conv = self.conversation
        if conv is None or self.busy():
            return
        try:
            active = conv.continue_turn()
        except UserError as exc:
            self.notify(str(exc), severity="warning", timeout=6)
            return
        answer = AnswerView(thinking=active.request.thinking, ghosts=self.ghosts, fmt=conv.format)
        stopped = self.query(AnswerView)
        if stopped:
            answer.segments, answer.raw = list(stopped.last().segments), stopped.last().raw
        self._start(conv, active, answer, NoticeLine(CONTINUING))


def is_builtin_demo(profile) -> bool:
    """Whether `profile` is the built-in demo pair (a tiny model, not an assistant)."""
    from dflash_tui.core.profiles import builtin_profile_dir

    path = getattr(profile, "path", None)
    return profile.name == "demo" and path is not None and path.resolve().parent == builtin_profile_dir().resolve()


def message_text(widget) -> str:
    """What a message says: the person's text, or an answer's whole text (its thinking too)."""
    return widget.text if isinstance(widget, UserMessage) else widget.raw


class FindInput(TextInput):
    """The find bar (ctrl+f): enter or up marks the message before, down the one after."""

    BINDINGS = [Binding("up", "step(-1)", show=False), Binding("down", "step(1)", show=False)]
    screen: ChatScreen

    def action_step(self, by: int) -> None:
        self.screen.find_step(by)

    async def action_submit(self) -> None:
        self.screen.find_step(-1)


def following(view: VerticalScroll) -> bool:
    """Whether the conversation follows its end (the reader has not scrolled up from it)."""
    return getattr(view, "following", True)


class NewTextMarker(Static):
    """Shown under a conversation the reader scrolled up in while text arrived below; a click goes there."""

    def on_click(self) -> None:
        self.screen.query_one("#conversation", ConversationView).follow()


class ConversationView(VerticalScroll):
    """The conversation, following its end through new text, a resize, a taller message box and a resume,
    until the reader scrolls up. From then on it keeps the line they were on through whatever changes the
    heights above it (ghosts shown or hidden, a resize, an answer as written), and nothing else moves them,
    not even the answer ending. Scrolling back to the end (the wheel, pagedown, ctrl+end) or sending follows
    again. (Textual's own `anchor()` pushes a short conversation to the bottom of the view, under an empty top.)"""

    following = True
    place: Optional[tuple[Widget, int]] = None  # while not following: the widget at the top, and rows into it

    def follow(self) -> None:
        self.following = True
        self.scroll_end(animate=False)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y - 0.5:
            self.following = True
            for marker in self.screen.query("#new-text"):  # back at the end: nothing new below
                marker.display = False
        elif new_value < old_value:  # up, by the reader: a longer text below only raises max_scroll_y
            self.following = False
        self.place = None if self.following else self._line_at(round(new_value))

    def _line_at(self, y: int) -> Optional[tuple[Widget, int]]:
        for child in self.children:
            if child.display:
                region = child.virtual_region
                if region.bottom > y:
                    return child, y - region.y
        return None

    def _size_updated(self, size, virtual_size, container_size, layout: bool = True) -> bool:
        """The layout changed: to the end for a follower, else back to the reader's line where it now lies.
        In the same pass that moved it (a callback after the next refresh could run before the heights above
        the reader have changed, and then nothing would put them back)."""
        place = self.place  # as the reader left it: the clamp of scroll_y below may recompute it
        changed = super()._size_updated(size, virtual_size, container_size, layout)
        if changed and self.following:
            self.call_after_refresh(self._to_end)
        elif changed and place is not None and place[0].is_attached:
            widget, rows = place
            self.scroll_to(y=widget.virtual_region.y + rows, animate=False, immediate=True)
        return changed

    def _to_end(self) -> None:
        if self.following:
            self.scroll_end(animate=False, immediate=True)


def footer_for(summary: Optional[Summary], save_error: Optional[str] = None) -> Optional[str]:
    """The line under an answer: its figures, why it stopped early, and whether the file has it."""
    if summary is None:
        return save_error
    parts = [f"{summary.generated_tokens} tokens", f"{summary.decode_tokens_per_s:.1f} tok/s",
             f"tau {fixed(summary.mean_acceptance_length)}", f"block {known(summary.block_size)}"]
    stopped = "" if summary.finish_reason == "cancelled" else summary.stopped_by  # "⏹ cancelled" says so already
    parts += [note for note in (stopped, save_error) if note]
    return " · ".join(parts)
