"""The Textual app behind `dflash chat`: it loads and switches engines, runs the palette and the
global keys (help, quit); the chat itself (its keys, streaming, stats, sessions) is `ChatScreen`'s.

The screen appears at once; the engine loads in a thread worker that reports back with an
`EngineLoaded` or `LoadFailed` message (a load error becomes a screen that says how to fix it). The app
holds what outlives a screen: the profile, the engine and the `Conversation` on it, and the theme,
which it remembers between runs (`preferences.py`).
"""

from __future__ import annotations

import asyncio
import time
from operator import attrgetter
from typing import Iterable, Optional

from textual import work
from textual.app import App, InvalidThemeError, SystemCommand
from textual.command import CommandPalette
from textual.message import Message
from textual.screen import Screen

from dflash_tui.core import sessions
from dflash_tui.core.conversation import ChatFlags, Conversation, draft_arch, open_conversation, running_draft
from dflash_tui.core.figures import draft_text
from dflash_tui.core.knobs import KNOB, Setting
from dflash_tui.core.profiles import Profile, list_profiles
from dflash_tui.core.settings import profile_for, server_text
from dflash_tui.engines import hub
from dflash_tui.engines.engine import EngineLike, free_memory
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.process import quiet_loaders
from dflash_tui.tui.contrast import readable_variables
from dflash_tui.tui.palette import SettingsPalette
from dflash_tui.tui.preferences import load_preferences, save_preferences
from dflash_tui.tui.screens import ChatScreen, HelpScreen, LoadErrorScreen, SystemPromptScreen
from dflash_tui.tui.widgets.header import temperature_text

ENGINE_CHOICES = ("auto", "cuda", "mlx")
TEMPERATURE_CHOICES = (0.0, 0.3, 0.6, 1.0)


def profile_names() -> list[str]:
    """Every profile the palette offers (none when the folder cannot be read)."""
    try:
        return [p.name for p in list_profiles(errors=[])]
    except UserError:
        return []


class EngineLoaded(Message):
    """The load worker has an engine, for the profile it was loaded from."""

    def __init__(self, engine, profile: Profile) -> None:
        super().__init__()
        self.engine = engine
        self.profile = profile


class LoadFailed(Message):
    """The load worker could not load the engine: `error` says why, in one sentence."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class DflashApp(App):
    CSS_PATH = "dflash.tcss"
    TITLE = "dflash"
    FLUSH_INTERVAL = 0.1
    ENABLE_COMMAND_PALETTE = True
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]  # every screen: a modal fits 24 rows tighter

    # the chat screen's state, read here by tests and benchmarks
    active = property(attrgetter("chat.active"))
    ghosts = property(attrgetter("chat.ghosts"))
    flushes = property(attrgetter("chat.flushes"))
    turns_done = property(attrgetter("chat.turns_done"))
    finished = property(attrgetter("chat.finished"))
    _last_stats = property(attrgetter("chat._last_stats"))

    def __init__(self, profile=None, engine: Optional[str] = None, block_size: Optional[int] = None,
                 thinking: Optional[bool] = None, resume: Optional[sessions.Session] = None, record: bool = True,
                 max_new_tokens: Optional[int] = None, animate: bool = True, loaded_engine=None,
                 engine_process: bool = True, reasoning_effort: Optional[str] = None) -> None:
        super().__init__()
        self.profile_ref = profile
        self.profile: Optional[Profile] = None
        self.engine_flag = engine
        self.flags = ChatFlags(block_size, thinking, max_new_tokens, reasoning_effort)
        self.record = record
        self.pending_resume = resume
        self.engine: Optional[EngineLike] = None
        self.conversation: Optional[Conversation] = None
        self.loading = False
        self.load_error: Optional[str] = None
        self.load_seconds = 0.0
        self.load_started = 0.0
        self.loading_what = ""
        self.loading_stage = ""  # what the engine says it is doing now (loading the draft, capturing graphs)
        self.animations = animate  # False: no clock on the loading line (snapshots)
        self.loaded_engine = loaded_engine  # an engine already loaded (tests, benchmarks): no load worker
        self.engine_process = engine_process  # decode in a child process (engines/process.py) or a thread
        self._owns_engine = False  # an engine handed in is the caller's to close
        # The conversation an engine switch keeps: out of reach (conversation is None) until an engine loads,
        # so that no key or palette command runs it without one, even when the new engine fails to load.
        self._kept: Optional[Conversation] = None
        self.chat = ChatScreen()
        self.preferences, warning = load_preferences()
        self._startup_warnings = [warning] if warning else []
        self._preferences_warned = bool(warning)  # one warning about the preferences file per run is enough
        if self.preferences.theme:
            try:
                self.theme = self.preferences.theme
            except InvalidThemeError:
                self._startup_warnings.append(f"The saved theme {self.preferences.theme!r} does not exist here; "
                                              "pick one from the palette (ctrl+p, theme).")

    # -- startup and loading ---------------------------------------------------------------------
    def get_default_screen(self) -> Screen:
        return self.chat

    def on_mount(self) -> None:
        for warning in self._startup_warnings:
            self.notify(warning, severity="warning", timeout=8)
        if self.loaded_engine is not None:
            self.call_after_refresh(self._use_loaded_engine)
        else:
            self.start_load()

    def _use_loaded_engine(self) -> None:
        engine, self.loaded_engine = self.loaded_engine, None
        try:
            self.profile = profile = profile_for(self.profile_ref)
        except UserError as exc:
            self.show_load_error(str(exc))
            return
        self._loaded(engine, profile)

    def start_load(self) -> None:
        self.loading = True
        self.load_error = None
        self.chat.show_loading(True)
        try:
            if self.profile is None:
                self.profile = profile_for(self.profile_ref)
            config = self.profile.engine_config(self.engine_flag, block_size=self.flags.block_size)
            if config.engine != "remote":  # offline and not cached: said at once, not after an engine process starts
                hub.require_cached({"target": config.target, "draft": config.draft})
        except UserError as exc:
            self.show_load_error(str(exc))
            return
        draft = f" and draft {config.draft}" if config.draft else ""
        server = server_text(config)  # the remote engine loads nothing here: it connects
        self.loading_what = (f"Connecting to {server}" if server else
                             f"Loading target {config.target}{draft} ({config.engine} engine)")
        self.load_started = time.perf_counter()
        self.loading_stage = ""
        self.chat.tick_loading()
        self.chat.refresh_chrome()
        self._load_worker(config, self.profile)

    @work(thread=True, exclusive=True, group="load")
    def _load_worker(self, config, profile: Profile) -> None:
        quiet_loaders()
        from dflash_tui.engines import load_engine
        from dflash_tui.engines.process import ProcessEngine

        started = time.perf_counter()
        try:
            # a remote engine only waits on the network: it needs no process of its own
            engine = (ProcessEngine(config, self._stage) if self.engine_process and config.engine != "remote"
                      else load_engine(config, self._stage))
        except UserError as exc:
            self.post_message(LoadFailed(str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - shown, not a crash
            self.post_message(LoadFailed(f"{type(exc).__name__}: {exc}"))
            return
        self.load_seconds = time.perf_counter() - started
        self._owns_engine = True
        self.post_message(EngineLoaded(engine, profile))

    def _stage(self, stage: str) -> None:
        """A stage of the engine's work, said from whichever worker thread runs it: on the loading line
        while loading, as a toast later (a capture between requests, or one a longer request needs)."""
        try:
            self.call_from_thread(self.show_stage, stage)
        except RuntimeError:  # said from the app's own thread
            self.show_stage(stage)

    def show_stage(self, stage: str) -> None:
        if self.loading:
            self.loading_stage = stage
            self.chat.tick_loading()
        else:
            self.chat.toast("engine", f"{stage[:1].upper()}{stage[1:]}…", timeout=4)

    def on_engine_loaded(self, message: EngineLoaded) -> None:
        self._loaded(message.engine, message.profile)

    def on_load_failed(self, message: LoadFailed) -> None:
        self.show_load_error(message.error)

    def show_load_error(self, message: str) -> None:
        self.loading = False
        self.load_error = message
        self.chat.show_loading(False)
        self.chat.refresh_chrome()
        self.push_screen(LoadErrorScreen(message))

    def _loaded(self, engine, profile: Profile) -> None:
        self.engine = engine
        self.loading = False
        if self._kept is not None:
            self.conversation = conv = self._kept
            conv.engine = engine
            conv.probes.clear()  # block-1 steps timed on the engine before: no measure of this one's speedup
            if conv.settings.block_size and conv.settings.block_size > 1 and not conv.has_draft:
                conv.settings.block_size = 1
            draft = f"draft {draft_text(running_draft(engine), draft_arch(engine))}" if engine.draft_info is not None else "no draft"
            notices = [f"Reloaded on the {engine.name} engine ({engine.device}, {engine.dtype}) with {draft}; "
                       "history kept."]
        else:
            self.conversation, notices = open_conversation(engine, profile, self.flags, record=self.record)
        self._kept = None
        self.chat.engine_ready(self.conversation, notices)

    # -- switching engines and profiles ----------------------------------------------------------
    def _unload(self) -> None:
        if self.engine is not None and self._owns_engine:
            self.engine.close()
        self.engine = None
        if self.conversation is not None:
            self._kept, self.conversation = self.conversation, None
        free_memory()

    def _close_error_screen(self) -> None:
        while isinstance(self.screen, LoadErrorScreen):
            self.pop_screen()

    def switch_engine(self, engine: str) -> None:
        if self.chat.busy() or self.loading:
            return
        self._close_error_screen()
        self.engine_flag = engine
        self._unload()
        self.start_load()

    def switch_draft(self, draft: str) -> None:
        """Reload on the same engine with `draft`, one of the profile's `drafts`, keeping the conversation (as an
        engine switch does); the header then names it. Each turn's record says which draft ran it."""
        if self.chat.busy() or self.loading or self.profile is None:
            return
        self._close_error_screen()
        self.profile = self.profile.with_draft(draft)
        self._unload()
        self.start_load()

    def switchable_drafts(self) -> tuple[str, ...]:
        """The profile's drafts the palette switches between (`drafts`, where it lists more than one); none on
        a remote engine, whose server runs its own draft."""
        profile = self.profile
        if profile is None or len(profile.drafts) < 2 or self.engine_flag == "remote" or (
                self.engine is not None and self.engine.name == "remote"):
            return ()
        return profile.drafts

    def _draft_commands(self) -> Iterable[SystemCommand]:
        """One "Draft: ..." entry per draft the palette switches between."""
        profile = self.profile
        running = self.engine.config.draft if self.engine is not None else None
        for draft in self.switchable_drafts():
            now = running is not None and profile is not None and profile.local_path(draft) == running
            yield SystemCommand(f"Draft: {draft}", "running now" if now else
                                "reload with this draft of the profile, keeping the conversation",
                                lambda d=draft: self.switch_draft(d))

    def switch_profile(self, name: str) -> None:
        if self.chat.busy() or self.loading:
            return
        self._close_error_screen()
        self.profile_ref, self.profile = name, None
        self.engine_flag = None
        self._unload()
        self._kept = None
        self.chat.clear_view()
        self.start_load()

    def on_unmount(self) -> None:
        if self.engine is not None and self._owns_engine:
            self.engine.close()

    # -- the theme, readable and remembered -----------------------------------------------------------
    def get_css_variables(self) -> dict[str, str]:
        """The theme's variables, with every text colour at 4.5:1 or more on its background (contrast.py)."""
        variables = readable_variables(super().get_css_variables(), self.current_theme.dark)
        self.theme_variables = variables
        return variables

    def watch_theme(self, theme: str) -> None:
        """Every theme change (the palette's theme picker) is saved; a failure is said once per run."""
        if theme == self.preferences.theme:
            return
        self.preferences.theme = theme
        warning = save_preferences(self.preferences)
        if warning and not self._preferences_warned:
            self._preferences_warned = True
            self.notify(warning, severity="warning", timeout=8)

    # -- global keys and the palette -------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        chat = self.chat
        if chat.active is not None:
            chat.active.cancel()  # the partial answer is recorded, marked cancelled, before we leave
            deadline = time.monotonic() + 10
            while chat.active is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        self.exit()

    def action_system_prompt(self) -> None:
        conversation = self.conversation
        if conversation is None:
            return

        def saved(text: Optional[str]) -> None:
            if text is not None:
                conversation.settings.system_prompt = text
                self.notify("System prompt saved; it applies from the next turn.", timeout=3)

        self.push_screen(SystemPromptScreen(conversation.settings.system_prompt), saved)

    def apply_setting(self, setting: Setting) -> None:
        """A setting from the palette, typed (core/knobs.py) or picked, from the next turn; the header shows it
        and each turn's record keeps the one it used. A draft reloads the engine with it, a block size goes the
        way f7 goes."""
        conversation = self.conversation
        if conversation is None:
            return
        if setting.name == "draft":
            self.switch_draft(str(setting.value))
        elif setting.name == "block_size":
            assert isinstance(setting.value, int)  # (knobs.py reads a block size as one)
            self.chat.set_block(setting.value)
        else:
            conversation.apply_setting(setting)
            self.notify(f"From the next turn: {setting}.", timeout=3)
            self.chat.refresh_chrome()

    def action_command_palette(self) -> None:
        """Textual's palette, but enter applies a setting typed in it (tui/palette.py)."""
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(SettingsPalette(id="--command-palette"))

    def _temperature_commands(self, conversation: Conversation) -> Iterable[SystemCommand]:
        profile = conversation.profile
        ours = profile.temperature if profile is not None else None
        choices = dict.fromkeys([*TEMPERATURE_CHOICES, ours])  # the profile's last, unless it is one of them
        for value in choices:
            what = "the target's generation_config" if value is None else "greedy" if value == 0 else "sample"
            if value == ours:
                what += " (the profile's)"
            yield SystemCommand(f"Temperature: {temperature_text(value)}", f"{what}, from the next turn",
                                lambda v=value: self.apply_setting(Setting(KNOB["temperature"], v)), discover=False)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        chat = self.chat
        yield SystemCommand("Toggle thinking", "ctrl+t: thinking on/off (gpt-oss: its effort level) for the next turns",
                            chat.action_toggle_thinking)
        yield SystemCommand("Toggle ghosts", "ctrl+g: show rejected draft tokens", chat.action_toggle_ghosts)
        yield SystemCommand("Next block size", "f7: cycle 1, 2, 4, 8, 16 and the profile's", chat.action_cycle_block)
        if self.conversation is not None:
            for block in self.conversation.block_choices():
                yield SystemCommand(f"Block size {block}", "use this block size from the next turn",
                                    lambda b=block: chat.set_block(b), discover=False)
        if self.conversation is not None:
            yield from self._temperature_commands(self.conversation)
        yield SystemCommand("Edit system prompt", "the system message sent with every turn", self.action_system_prompt)
        yield SystemCommand("New session", "ctrl+n: start a fresh conversation", chat.action_new_session)
        yield SystemCommand("New context", "ctrl+l: clear the kept caches; the next turn prefills the whole history",
                            chat.action_new_context)
        yield SystemCommand("Sessions", "ctrl+o: resume, rename, delete or export a session", chat.action_sessions)
        yield SystemCommand("Rename session", "give the open session a title (empty: its first prompt)",
                            chat.action_rename_session)
        yield SystemCommand("Replay", "ctrl+r: re-run this session across block sizes", chat.action_replay)
        yield SystemCommand("Help", "f1: keys and colours", self.action_help)
        yield SystemCommand("Answer as written", "f2: show the selected or last answer as written, or rendered again", chat.action_markdown)
        yield from self._draft_commands()
        for engine in ENGINE_CHOICES:
            yield SystemCommand(f"Engine: {engine}", f"reload on the {engine} engine, keeping the conversation",
                                lambda e=engine: self.switch_engine(e))
        for name in profile_names():
            yield SystemCommand(f"Profile: {name}", "load this profile (starts a new session)",
                                lambda n=name: self.switch_profile(n))
