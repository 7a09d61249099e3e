"""The Textual app behind `dflash chat`.

The screen appears at once; the engine loads in a thread worker (a load error becomes a screen that
says how to fix it). Each answer decodes in a thread worker that only appends events to a queue; a
timer on the UI thread drains the queue every `FLUSH_INTERVAL` seconds and renders them in one go,
so rendering cost does not grow with the engine's token rate. What a chat *is* (history, settings,
context trimming, requests, session records) lives in `conversation.Conversation`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Iterable, Optional

from textual import work
from textual.app import App, SystemCommand
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from engines.engine import free_memory
from engines.errors import UserError
from engines.events import Summary

from dflash_tui.core import sessions
from dflash_tui.core.conversation import ChatFlags, Conversation, open_conversation, resume
from dflash_tui.core.profiles import list_profiles
from dflash_tui.core.settings import profile_for
from engines.process import quiet_loaders
from dflash_tui.tui.screens import (ChatScreen, HelpScreen, LoadErrorScreen, MarkdownScreen, ReplayScreen, SessionsScreen,
                      SystemPromptScreen)
from dflash_tui.tui.widgets import AnswerView, ChatHeader, NoticeLine, StatsLine, StatsPanel, UserMessage
from dflash_tui.tui.widgets.stats import StatsData

ENGINE_CHOICES = ("auto", "cuda", "mlx")
PROMPT = "#prompt"


def profile_names() -> list[str]:
    """Every profile the palette offers (none when the folder cannot be read)."""
    try:
        return [p.name for p in list_profiles(errors=[])]
    except UserError:
        return []


class DflashApp(App):
    CSS_PATH = "dflash.tcss"
    TITLE = "dflash"
    FLUSH_INTERVAL = 0.1
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, profile=None, engine: Optional[str] = None, block_size: Optional[int] = None,
                 thinking: Optional[bool] = None, resume: Optional[sessions.Session] = None, record: bool = True,
                 max_new_tokens: Optional[int] = None, animate: bool = True, loaded_engine=None,
                 engine_process: bool = True) -> None:
        super().__init__()
        self.profile_ref = profile
        self.profile = None
        self.engine_flag = engine
        self.flags = ChatFlags(block_size, thinking, max_new_tokens)
        self.record = record
        self.pending_resume = resume
        self.engine = None
        self.conversation: Optional[Conversation] = None
        self.active = None
        self.active_view: Optional[AnswerView] = None
        self.ghosts = False
        self.loading = False
        self.load_error: Optional[str] = None
        self.load_seconds = 0.0
        self.animate = animate
        self.loaded_engine = loaded_engine  # an engine already loaded (tests, benchmarks): no load worker
        self.engine_process = engine_process  # decode in a child process (engine_process.py) or a thread
        self._owns_engine = False  # an engine handed in is the caller's to close
        self._events: deque = deque()
        self._keep_conversation = False
        self._load_started = 0.0
        self._last_stats = StatsData()
        self.flushes = 0  # timer flushes that rendered events
        self.turns_done = 0  # answered turns in this app (tests and the benchmark wait on it)
        self.finished: list = []  # ActiveTurns in the order they ended

    # -- startup and loading ---------------------------------------------------------------------
    def get_default_screen(self) -> Screen:
        return ChatScreen()

    def on_mount(self) -> None:
        self.set_interval(self.FLUSH_INTERVAL, self._flush_events)
        self.set_interval(0.5, self._tick_loading)
        if self.loaded_engine is not None:
            self.call_after_refresh(self._use_loaded_engine)
        else:
            self.start_load()

    def _use_loaded_engine(self) -> None:
        engine, self.loaded_engine = self.loaded_engine, None
        try:
            self.profile = profile_for(self.profile_ref)
        except UserError as exc:
            self.show_load_error(str(exc))
            return
        self._loaded(engine)

    def _chat_screen(self) -> ChatScreen:
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        raise RuntimeError("no chat screen")

    def q(self, selector, kind=None):
        return self._chat_screen().query_one(selector, kind) if kind else self._chat_screen().query_one(selector)

    def start_load(self) -> None:
        self.loading = True
        self.load_error = None
        self._show_loading(True)
        try:
            if self.profile is None:
                self.profile = profile_for(self.profile_ref)
            config = self.profile.engine_config(self.engine_flag, block_size=self.flags.block_size)
        except UserError as exc:
            self.show_load_error(str(exc))
            return
        draft = f" and draft {config.draft}" if config.draft else ""
        self._loading_what = f"Loading target {config.target}{draft} ({config.engine} engine)"
        self._load_started = time.perf_counter()
        self._tick_loading()
        self._refresh_chrome()
        self._load_worker(config)

    def _tick_loading(self) -> None:
        if not self.loading or self.load_error:
            return
        try:
            elapsed = time.perf_counter() - self._load_started if self.animate else 0
            self.q("#loading-text", Static).update(f"{self._loading_what}… {elapsed:.0f} s" if self.animate
                                                   else f"{self._loading_what}…")
        except Exception:  # noqa: BLE001 - the screen is not up yet
            pass

    @work(thread=True, exclusive=True, group="load")
    def _load_worker(self, config) -> None:
        quiet_loaders()
        from engines import load_engine

        from engines.process import ProcessEngine

        started = time.perf_counter()
        try:
            # a remote engine only waits on the network: it needs no process of its own
            engine = ProcessEngine(config) if self.engine_process and config.engine != "remote" else load_engine(config)
        except UserError as exc:
            self.call_from_thread(self.show_load_error, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - shown, not a crash
            self.call_from_thread(self.show_load_error, f"{type(exc).__name__}: {exc}")
            return
        self.load_seconds = time.perf_counter() - started
        self._owns_engine = True
        self.call_from_thread(self._loaded, engine)

    def show_load_error(self, message: str) -> None:
        self.loading = False
        self.load_error = message
        self._show_loading(False)
        self._refresh_chrome()
        self.push_screen(LoadErrorScreen(message))

    def _show_loading(self, on: bool) -> None:
        try:
            self.q("#loading").display = on
            for indicator in self.q("#loading").query("LoadingIndicator"):
                indicator.display = on  # a hidden indicator would keep animating
        except Exception:  # noqa: BLE001
            pass

    def _loaded(self, engine) -> None:
        self.engine = engine
        self.loading = False
        self._show_loading(False)
        if self._keep_conversation and self.conversation is not None:
            conv = self.conversation
            conv.engine = engine
            if conv.settings.block_size and conv.settings.block_size > 1 and not conv.has_draft:
                conv.settings.block_size = 1
            self.notice(f"Reloaded on the {engine.name} engine ({engine.device}, {engine.dtype}); history kept.")
            notices = []
        else:
            conv, notices = open_conversation(engine, self.profile, self.flags, record=self.record)
            self.conversation = conv
        self._keep_conversation = False
        conv.on_notice = self.notice
        for notice in [*notices, *engine.warnings]:
            self.notice(notice)
        if self.pending_resume is not None:
            session, self.pending_resume = self.pending_resume, None
            self.resume_session(session)
        self._refresh_chrome()
        self.q(PROMPT).focus()

    # -- chrome: header, stats -------------------------------------------------------------------
    def _thinking_before_load(self) -> bool:
        """Thinking as the header shows it while no conversation exists: the flag, else the profile's."""
        if self.flags.thinking is not None:
            return self.flags.thinking
        return self.profile.thinking if self.profile else True

    def _refresh_chrome(self) -> None:
        try:
            header = self.q("#header", ChatHeader)
        except Exception:  # noqa: BLE001
            return
        conv = self.conversation
        name = self.profile.name if self.profile else str(self.profile_ref or "demo")
        thinking = conv.settings.thinking if conv else self._thinking_before_load()
        if self.engine is None:
            header.show(name, "?", "?", "?", "?", thinking, self.ghosts, loading=self.loading)
        else:
            header.show(name, self.engine.name, self.engine.device, self.engine.dtype,
                        conv.settings.block_size if conv else self.engine.block_size, thinking, self.ghosts)
        self._show_stats(self._stats_data())

    def _stats_data(self) -> StatsData:
        d = StatsData()
        conv, engine = self.conversation, self.engine
        if engine is not None:
            d.engine, d.device, d.dtype = engine.name, engine.device, engine.dtype
            d.block_size = engine.block_size
        d.ghosts = self.ghosts
        if conv is None:
            d.thinking = self._thinking_before_load()
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
            turn_block = m.block_size or turn_block
            d.state = "done"
        if steps:
            d.speedup, d.speedup_kind = conv.speedup(d.tokens_per_s, d.tau, d.draft_s, d.verify_s, steps, turn_block)
        return d

    def _show_stats(self, d: StatsData) -> None:
        self._last_stats = d
        try:
            self.q("#stats-panel", StatsPanel).show(d)
            self.q("#stats-line", StatsLine).show(d)
        except Exception:  # noqa: BLE001
            pass

    def notice(self, text: str) -> None:
        try:
            view = self.q("#conversation", VerticalScroll)
        except Exception:  # noqa: BLE001
            return
        view.mount(NoticeLine(f"· {text}"))
        view.scroll_end(animate=False)

    # -- sending and streaming -------------------------------------------------------------------
    def on_prompt_input_submitted(self, message) -> None:
        text = message.text.strip("\n")
        prompt = self.q(PROMPT)
        if self.conversation is None:
            prompt.load_text(text)
            self.notify("The model is still loading." if self.loading else
                        "No model is loaded; ctrl+p switches profile or engine.", severity="warning")
            return
        if self.active is not None:
            prompt.load_text(text)
            self.notify("Still answering; escape stops it.", severity="warning")
            return
        self.send(text)

    def send(self, text: str) -> None:
        conv = self.conversation
        try:
            active = conv.begin(text)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        view = self.q("#conversation", VerticalScroll)
        answer = AnswerView(thinking=active.request.thinking, ghosts=self.ghosts)
        view.mount(UserMessage(text))
        view.mount(answer)
        view.scroll_end(animate=False)
        self.active, self.active_view = active, answer
        self._refresh_chrome()
        self._generate(active)

    @work(thread=True, group="generate")
    def _generate(self, active) -> None:
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
            self.call_from_thread(self._turn_done, active, error)
        except Exception:  # noqa: BLE001 - the app is gone; the turn is already recorded
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
            conversation = self.q("#conversation", VerticalScroll)
            if conversation.max_scroll_y - conversation.scroll_y < 4:
                conversation.call_after_refresh(conversation.scroll_end, animate=False)

    def _turn_done(self, active, error: Optional[str]) -> None:
        self._flush_events()
        view = self.active_view
        turn = active.turn
        status = turn.status if turn else ("error" if error else "cancelled")
        summary = turn.summary if turn else None
        if view is not None:
            view.finish(status, footer_for(summary))
        self.active, self.active_view = None, None
        self.turns_done += 1
        self.finished.append(active)
        if error:
            self.notify(error, severity="error", timeout=10)
        self._refresh_chrome()
        self.q("#conversation", VerticalScroll).scroll_end(animate=False)

    # -- actions ---------------------------------------------------------------------------------
    def action_toggle_thinking(self) -> None:
        if self.conversation is None:
            self.flags.thinking = not self._thinking_before_load()
        else:
            warning = self.conversation.toggle_thinking()
            if warning:
                self.notify(warning, severity="warning", timeout=8)
        self._refresh_chrome()

    def action_toggle_ghosts(self) -> None:
        self.ghosts = not self.ghosts
        for view in self.query(AnswerView):
            view.set_ghosts(self.ghosts)
        self._refresh_chrome()

    def action_cycle_block(self) -> None:
        if self.conversation is None:
            return
        block = self.conversation.cycle_block()
        self.notify(f"Block size {block} from the next turn.", timeout=2)
        self._refresh_chrome()

    def set_block(self, block: int) -> None:
        try:
            self.conversation.set_block(block)
        except UserError as exc:
            self.notify(str(exc), severity="error")
        self._refresh_chrome()

    def action_cancel(self) -> None:
        if self.active is not None:
            self.active.cancel()

    def _busy(self) -> bool:
        if self.active is not None:
            self.notify("Still answering; escape stops it first.", severity="warning")
            return True
        return False

    def _clear_view(self) -> None:
        view = self.q("#conversation", VerticalScroll)
        for child in list(view.children):
            if child.id != "loading":
                child.remove()

    def action_new_session(self) -> None:
        if self.conversation is None or self._busy():
            return
        self.conversation.new_session()
        self._clear_view()
        self._refresh_chrome()
        self.notify("New session.", timeout=2)

    def action_sessions(self) -> None:
        def chosen(session_id: Optional[str]) -> None:
            if session_id:
                self.resume_session(session_id)

        self.push_screen(SessionsScreen(), chosen)

    def resume_session(self, session) -> None:
        if self.conversation is None:
            self.pending_resume = session
            return
        if self._busy():
            return
        try:
            if isinstance(session, str):
                session = sessions.load_session(session)
        except UserError as exc:
            self.notify(str(exc), severity="error")
            return
        for warning in session.warnings:
            self.notify(warning, severity="warning", timeout=8)
        resume(self.conversation, session, self.flags)
        prompt = self.q(PROMPT)
        for turn in self.conversation.turns:  # up recalls the session's prompts too
            prompt.remember(turn.user)
        self._clear_view()
        view = self.q("#conversation", VerticalScroll)
        for turn in self.conversation.turns:
            view.mount(UserMessage(turn.user))
            answer = AnswerView(thinking=bool(turn.thinking), ghosts=self.ghosts)
            answer.set_text(turn.answer)
            view.mount(answer)
            answer.call_after_refresh(answer.finish, turn.status, footer_for(turn.summary))
        self.notice(f"Resumed session {session.id} ({len(session.turns)} turns).")
        self._refresh_chrome()

    def action_replay(self) -> None:
        self.push_screen(ReplayScreen(self.conversation.session_id if self.conversation else None))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_markdown(self) -> None:
        done = [v for v in self.query(AnswerView) if v.status != "streaming"]
        if done:
            self.push_screen(MarkdownScreen(done[-1].answer_text))

    def on_answer_view_selected(self, message: AnswerView.Selected) -> None:
        self.push_screen(MarkdownScreen(message.answer.answer_text))

    def action_system_prompt(self) -> None:
        if self.conversation is None:
            return

        def saved(text: Optional[str]) -> None:
            if text is not None:
                self.conversation.settings.system_prompt = text
                self.notify("System prompt saved; it applies from the next turn.", timeout=3)

        self.push_screen(SystemPromptScreen(self.conversation.settings.system_prompt), saved)

    def _unload(self) -> None:
        if self.engine is not None and self._owns_engine:
            self.engine.close()
        self.engine = None
        if self.conversation is not None:
            self.conversation.engine = None
        free_memory()

    def _close_error_screen(self) -> None:
        while isinstance(self.screen, LoadErrorScreen):
            self.pop_screen()

    def switch_engine(self, engine: str) -> None:
        if self._busy() or self.loading:
            return
        self._close_error_screen()
        self.engine_flag = engine
        self._keep_conversation = self.conversation is not None
        self._unload()
        self.start_load()

    def switch_profile(self, name: str) -> None:
        if self._busy() or self.loading:
            return
        self._close_error_screen()
        self.profile_ref, self.profile = name, None
        self.engine_flag = None
        self._unload()
        self.conversation = None
        self._clear_view()
        self.start_load()

    def on_unmount(self) -> None:
        if self.engine is not None and self._owns_engine:
            self.engine.close()

    async def action_quit(self) -> None:
        if self.active is not None:
            self.active.cancel()  # the partial answer is recorded, marked cancelled, before we leave
            deadline = time.monotonic() + 10
            while self.active is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        self.exit()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Toggle thinking", "ctrl+t: thinking on/off for the next turns", self.action_toggle_thinking)
        yield SystemCommand("Toggle ghosts", "ctrl+g: show rejected draft tokens", self.action_toggle_ghosts)
        yield SystemCommand("Next block size", "ctrl+k: cycle 1, 2, 4, 8, 16 and the profile's", self.action_cycle_block)
        if self.conversation is not None:
            for block in self.conversation.block_choices():
                yield SystemCommand(f"Block size {block}", "use this block size from the next turn",
                                    lambda b=block: self.set_block(b), discover=False)
        yield SystemCommand("Edit system prompt", "the system message sent with every turn", self.action_system_prompt)
        yield SystemCommand("New session", "ctrl+n: start a fresh conversation", self.action_new_session)
        yield SystemCommand("Sessions", "ctrl+o: resume, delete or export a session", self.action_sessions)
        yield SystemCommand("Replay", "ctrl+r: re-run this session across block sizes", self.action_replay)
        yield SystemCommand("Help", "f1: keys and colours", self.action_help)
        yield SystemCommand("Answer as Markdown", "f2: the last answer rendered", self.action_markdown)
        for engine in ENGINE_CHOICES:
            yield SystemCommand(f"Engine: {engine}", f"reload on the {engine} engine, keeping the conversation",
                                lambda e=engine: self.switch_engine(e))
        for name in profile_names():
            yield SystemCommand(f"Profile: {name}", "load this profile (starts a new session)",
                                lambda n=name: self.switch_profile(n))



def footer_for(summary: Optional[Summary]) -> Optional[str]:
    if summary is None:
        return None
    parts = [f"{summary.generated_tokens} tokens", f"{summary.decode_tokens_per_s:.1f} tok/s",
             f"tau {summary.mean_acceptance_length:.2f}", f"block {summary.block_size}"]
    return " · ".join(parts)
