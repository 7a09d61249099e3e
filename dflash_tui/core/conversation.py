"""The chat controller shared by the TUI and the plain REPL (no UI framework here).

It owns what a chat is: the history (resent by the family's thinking rule, engines/reasoning.py), the
system prompt, the thinking flag or a family's reasoning effort (gpt-oss), the block size, trimming
the oldest turns when the history outgrows the target's context (with a notice), building the
`GenerationRequest` for each turn, and recording every turn, completed or cancelled, in the session.
Only completed turns are resent as history: a cancelled or failed answer stops mid-thought (often inside
an unclosed `<think>`), and the model would read it as a reply it gave. Such a turn stays in the file and
on screen, and `continue_turn()` picks it up where it stopped when the user asks. A turn taken back to be
asked again (`retract_last()`) leaves the history, and the session file says so. It also holds the
measured block-1 speed (`measure_block1`) the speedup figure compares against. The front ends only show
what it streams.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional, Sequence

from dflash_tui.core import sessions
from dflash_tui.core.figures import DRAFT_KINDS, draft_kind
from dflash_tui.core.knobs import Knob, Setting
from dflash_tui.core.profiles import Profile
from dflash_tui.core.speedup import Speedup, session_speedup, turn_speedup
from dflash_tui.core.terminal import printable  # noqa: F401 - re-exported for older imports
from dflash_tui.engines.checkpoints import check_block_size
from dflash_tui.engines.config import DEFAULT_EFFORT, EFFORTS, GenerationRequest, Sampling
from dflash_tui.engines.engine import EngineLike
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.events import StepEvent, Summary
from dflash_tui.engines.guided import Constraint
from dflash_tui.engines.probe import Block1Probe, typical
from dflash_tui.engines.reasoning import THINK, format_for, takes_effort

BLOCK_CHOICES = (1, 2, 4, 8, 16)
FULL_CONTEXT_KEEP = 0.75  # a full context drops its oldest turns down to this share at once (issue 14)
PROBE_SPAN = 1.25  # a block-1 probe stands for contexts within 25% of the one it was timed at
DRAFT_THINKING_WARNING = ("This profile's draft was not trained with thinking traces: with thinking on, "
                          "expect fewer accepted draft tokens.")
NEEDS_THINKING_WARNING = ("Profile {name} needs thinking (needs_thinking = true): with it off, expect wrong answers; "
                          "ctrl+t turns it back on.")


@dataclass
class ChatSettings(Sampling):
    """What the next turn is generated with (the profile's values unless changed in the chat)."""

    block_size: Optional[int] = None  # None: the engine's own (the draft's trained block size)
    thinking: bool = True
    reasoning_effort: Optional[str] = None  # low, medium or high where the template reads it (gpt-oss)
    max_new_tokens: int = 512
    seed: int = 0
    system_prompt: str = ""
    constraint: Optional[Constraint] = None  # what the answers must match (the REPL's /json); None: free text

    @classmethod
    def from_profile(cls, profile: Profile, block_size: Optional[int] = None,
                     thinking: Optional[bool] = None) -> "ChatSettings":
        """Flags first, then the profile, then the defaults (docs/design.md, "Profiles")."""
        return cls(
            block_size=block_size if block_size is not None else profile.block_size,
            thinking=thinking if thinking is not None else profile.thinking,
            reasoning_effort=profile.reasoning_effort,
            max_new_tokens=profile.max_new_tokens, system_prompt=profile.system_prompt, **profile.sampling(),
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "constraint": self.constraint.to_dict() if self.constraint else None}

    def setting(self, knob: Knob) -> Setting:
        """The value in use of a knob these settings hold (core/knobs.py; not the draft, which is the engine's):
        what `Conversation.apply_setting` sets."""
        values = {**self.sampling(), "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                  "block_size": self.block_size}
        return Setting(knob, values[knob.name])

    def update(self, data: dict) -> None:
        for key, value in data.items():
            if key == "constraint" and isinstance(value, dict):
                value = Constraint.from_dict(value)  # as a session records it
            if key in self.__dataclass_fields__:
                setattr(self, key, value)


@dataclass
class ChatFlags:
    """`dflash chat`'s own flags: they win over the profile and over what a resumed session recorded."""

    block_size: Optional[int] = None
    thinking: Optional[bool] = None
    max_new_tokens: Optional[int] = None
    reasoning_effort: Optional[str] = None

    def apply(self, settings: ChatSettings) -> ChatSettings:
        if self.block_size:
            settings.block_size = self.block_size
        if self.thinking is not None:
            settings.thinking = self.thinking
        if self.reasoning_effort is not None:
            settings.reasoning_effort = self.reasoning_effort
        if self.max_new_tokens:
            settings.max_new_tokens = self.max_new_tokens
        return settings


@dataclass
class Turn:
    """One exchange as the chat shows and resends it."""

    user: str
    answer: str = ""
    status: str = "completed"  # "completed", "cancelled" or "error"
    thinking: Optional[bool] = None
    summary: Optional[Summary] = None  # a resumed turn's lacks token_ids and text (the file keeps them apart)
    save_error: Optional[str] = None  # why the session file could not take this turn (it is retried)
    prompt_ids: list[int] = field(default_factory=list)  # the ids sent (a continuation's end with the earlier part)
    emitted_ids: list[int] = field(default_factory=list)  # the ids this request generated
    continues: Optional[int] = None  # the index of the stopped turn this one went on with (continue_turn)
    step_s: list[float] = field(default_factory=list)  # each verify step's seconds in the engine (a resumed turn: none)

    @property
    def cancelled(self) -> bool:
        return self.status == "cancelled"

    @property
    def resent(self) -> bool:
        """Whether later turns send this one as history: only a finished answer is one the model gave."""
        return self.status == "completed"

    @property
    def can_continue(self) -> bool:
        # (no ids emitted: a turn interrupted before its first token goes on from its prompt)
        return self.status in ("cancelled", "error") and bool(self.prompt_ids)


def split_thinking(text: str, thinking: bool = True, fmt=THINK) -> tuple[Optional[str], str, bool]:
    """(thinking text or None, answer text, thinking finished) for an answer as generated, by `fmt`'s rule
    (engines/reasoning.py). An empty thinking block (thinking off) yields no thinking text."""
    start, end, answer = fmt.layout(text, thinking)
    inner = text[start:end].strip("\n")
    done = end < len(text) or start == end
    return (inner if inner.strip() or not done else None), text[answer:], done


def thinking_layout(raw: str, thinking: bool, fmt=THINK) -> tuple[int, int, int]:
    """(thinking start, thinking end, answer start) as offsets into the raw answer, by `fmt`'s rule.

    No thinking gives (0, 0, answer start); an unclosed block runs to the end of the text."""
    return fmt.layout(raw, thinking)


@dataclass
class LiveStats:
    """Figures for the turn in progress, updated per event (cheap: the decode thread calls `add`)."""

    block_size: int = 1
    started: float = field(default_factory=time.perf_counter)
    first_at: Optional[float] = None
    last_at: Optional[float] = None
    tokens: int = 0
    lengths: list = field(default_factory=list)
    step_s: list = field(default_factory=list)  # each step's seconds in the engine (draft, verify, the loop's work)
    draft_s: float = 0.0
    verify_s: float = 0.0
    prompt_tokens: int = 0
    steps_known: bool = True  # False: the events are a server's text chunks, not verify steps (`reports_steps`)

    def add(self, event: StepEvent) -> None:
        now = time.perf_counter()
        self.tokens += len(event.emitted)
        if event.is_prefill:
            self.first_at = now
        elif self.steps_known:
            self.lengths.append(event.accepted + 1)
            self.step_s.append(event.draft_s + event.verify_s + event.loop_s)
            self.draft_s += event.draft_s
            self.verify_s += event.verify_s
        self.last_at = now

    @property
    def tokens_per_s(self) -> float:
        if self.first_at is None or self.last_at is None or self.last_at <= self.first_at:
            return 0.0
        return (self.tokens - 1) / (self.last_at - self.first_at)

    @property
    def tau(self) -> Optional[float]:
        if not self.steps_known:
            return None
        return sum(self.lengths) / len(self.lengths) if self.lengths else 0.0

    def histogram(self) -> Optional[list[int]]:
        if not self.steps_known:
            return None
        counts = [0] * max(self.block_size, 1)
        for n in self.lengths:
            if 1 <= n <= len(counts):
                counts[n - 1] += 1
        return counts


@dataclass
class ActiveTurn:
    """A turn being generated: its request, the exact prompt ids, and what has streamed so far."""

    user: str
    request: GenerationRequest
    prompt_ids: list[int]
    messages: list[dict]
    dropped: int
    block_size: Optional[int]  # None: the engine does not say which block size its server uses
    stats: LiveStats
    emitted: list[int] = field(default_factory=list)
    steps: list = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    recorded: bool = False
    turn: Optional[Turn] = None
    continues: Optional[int] = None  # the index of the stopped turn this one picks up (continue_turn)
    earlier: str = ""  # that turn's answer so far: the recorded answer is earlier + text

    def cancel(self) -> None:
        self.request.cancel.set()


class Conversation:
    """History + settings + session for one engine. `begin()` a turn, iterate `stream()` over it."""

    def __init__(self, engine: EngineLike, settings: ChatSettings, profile: Optional[Profile] = None,
                 record: bool = True):
        self._engine_use = threading.Lock()  # a block-1 probe and a turn never run on the engine at once
        self._running = False  # a turn's stream is on the engine (a probe now would race it)
        self.engine = engine
        self.settings = settings
        self.profile = profile
        self.profile_block_size = (profile.block_size if profile else None) or settings.block_size or engine.block_size
        if settings.block_size is None:
            settings.block_size = engine.block_size
        self.turns: list[Turn] = []
        self.dropped = 0  # the oldest turns no longer sent (context full)
        self.notices: list[str] = []
        self.record = record
        self.writer: Optional[sessions.SessionWriter] = None
        self.last_request: Optional[GenerationRequest] = None
        self._warned: set[str] = set()  # the warnings this session has given (set_thinking)
        self.on_notice: Optional[Callable[[str], None]] = None
        self.reuse_cache = True  # the engine keeps its caches between turns (False: every turn prefilled whole)

    @property
    def engine(self) -> EngineLike:
        return self._engine

    @engine.setter
    def engine(self, engine: EngineLike) -> None:
        """A probe timed one loaded pair: a new engine (another engine kind, a reload) starts unmeasured."""
        self._engine = engine
        self.probes: list[Block1Probe] = []

    # -- settings --------------------------------------------------------------------------------
    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def has_draft(self) -> bool:
        return self.engine.draft_info is not None

    def block_choices(self) -> list[int]:
        if not self.has_draft:
            return [1]
        return sorted(set(BLOCK_CHOICES) | {int(self.profile_block_size)})

    def _block_settable(self) -> None:
        if not self.engine.reports_steps:
            raise UserError("This server runs the block size it was launched with and does not say which; it cannot "
                            "be set from here (`dflash serve` takes one per request).")

    def cycle_block(self) -> int:
        self._block_settable()
        choices = self.block_choices()
        current = self.settings.block_size or self.engine.block_size  # (__init__ sets it)
        later = [b for b in choices if b > current]
        self.settings.block_size = later[0] if later else choices[0]
        return self.settings.block_size

    def set_block(self, block_size: int) -> list[str]:
        """Block size `block_size` from the next turn (UserError when it cannot run); returns the warnings for a
        questionable one (above the draft's trained block size), for the front end to show."""
        self._block_settable()
        warnings = check_block_size(block_size, self.engine.trained_block_size, self.has_draft)
        self.settings.block_size = block_size
        return warnings

    def apply_setting(self, setting: Setting) -> list[str]:
        """A setting typed by a person (core/knobs.py), from the next turn; returns its warnings (`set_block`'s).
        A draft is not the chat's to switch: the front end reloads the engine with it."""
        if setting.name == "draft":
            raise ValueError("a draft is switched by loading the engine again, which the front end does")
        if setting.name == "block_size":
            assert isinstance(setting.value, int)  # (knobs.py reads a block size as one)
            return self.set_block(setting.value)
        setattr(self.settings, setting.name, setting.value)
        return []

    def set_thinking(self, on: bool) -> Optional[str]:
        """Set thinking for the next turns; returns a warning, once per session, when the profile says the setting
        goes wrong: thinking on with a draft trained without traces, thinking off on a target that needs it."""
        self.settings.thinking = on
        profile = self.profile
        if profile is None:
            return None
        warning = DRAFT_THINKING_WARNING if on and not profile.draft_thinking else \
            NEEDS_THINKING_WARNING.format(name=profile.name) if not on and profile.needs_thinking else None
        if warning is None or warning in self._warned:
            return None
        self._warned.add(warning)
        return warning

    def toggle_thinking(self) -> Optional[str]:
        """The thinking key: on/off, or for a family with an effort (gpt-oss) the next level (it has no off)."""
        if self.efforts:
            self.cycle_effort()
            return None
        return self.set_thinking(not self.settings.thinking)

    @property
    def format(self):
        """How this engine's answers carry their thinking (engines/reasoning.py)."""
        return format_for(self.engine)

    @property
    def efforts(self) -> tuple:
        """The reasoning efforts the target's template takes; () for on/off thinking."""
        tokenizer = self.engine.tokenizer
        return EFFORTS if tokenizer is not None and takes_effort(tokenizer) else ()

    @property
    def effort(self) -> Optional[str]:
        """The effort the next turn asks for (the template's default when none is set); None without one."""
        return (self.settings.reasoning_effort or DEFAULT_EFFORT) if self.efforts else None

    def cycle_effort(self) -> str:
        """low -> medium -> high -> low for the next turns."""
        order = list(self.efforts)
        self.settings.reasoning_effort = order[(order.index(self.effort) + 1) % len(order)]
        return self.settings.reasoning_effort

    # -- building requests -----------------------------------------------------------------------
    def messages_for(self, user: str, history: list[Turn]) -> list[dict]:
        messages: list[dict] = []
        if self.settings.system_prompt.strip():
            messages.append({"role": "system", "content": self.settings.system_prompt})
        for turn in history:
            if turn.resent:
                messages.append({"role": "user", "content": turn.user})
                messages.append(self.format.history(turn.answer))
        messages.append({"role": "user", "content": user})
        return messages

    def _request(self, messages: list[dict]) -> GenerationRequest:
        s = self.settings
        return GenerationRequest(
            messages=messages, thinking=s.thinking, reasoning_effort=self.effort, max_new_tokens=s.max_new_tokens,
            seed=s.seed, block_size=s.block_size, constraint=s.constraint, **s.sampling(),
        )

    def context_limit(self) -> Optional[int]:
        return self.engine.target_info.max_positions

    def begin(self, user: str) -> ActiveTurn:
        """Build the next turn's request over the history that still fits the context."""
        limit = self.context_limit()
        reserve = min(self.settings.max_new_tokens, limit // 2) if limit else 0
        start = min(self.dropped, len(self.turns))
        # Once the history outgrows the context, the oldest turns go at once until it fills about 75%:
        # dropping one turn per answer would change the prompt's start on every later turn, and the
        # engine's kept caches (a prefix) would be lost exactly in long chats.
        fill = limit or 0  # (used only with a limit)
        while True:
            history = self.turns[start:]
            messages = self.messages_for(user, history)
            request = self._request(messages)
            ids = self.engine.prepare(request)
            if not limit or len(ids) + reserve <= fill or not history:
                break
            fill = int(limit * FULL_CONTEXT_KEEP)
            start += 1
        if limit and len(ids) >= limit:  # refused before any history is given up for it
            raise UserError(f"The message is {len(ids)} tokens with the chat template but the context holds {limit}; "
                            "shorten it.")
        if start > self.dropped:
            # a cancelled or failed turn was never sent: only the answered ones count as given up
            newly = sum(t.resent for t in self.turns[self.dropped:start])
            self.dropped = start
            if newly:
                given_up = sum(t.resent for t in self.turns[:start])
                self.notice(f"Context full: {newly} oldest turn{'s' if newly > 1 else ''} no longer sent "
                            f"({given_up} dropped in all; prompt {len(ids)} of {limit} tokens).")
        return self._active(user, request, list(ids), messages)

    def continue_turn(self) -> ActiveTurn:
        """Pick up the last turn where it was cancelled (or failed), when the user asks to.

        The new prompt is that turn's exact ids so far: the prompt it was sent plus the tokens it emitted,
        so the model goes on mid-answer (inside its `<think>` if it stopped there) for what the token limit
        leaves after the stopped request's tokens; at temperature 0 the whole equals the answer it would
        have given uninterrupted.
        The kept caches hold those ids, so nothing is prefilled twice. The prompt is the one the turn was
        sent, system prompt and history included, even if they changed since. When it ends it is a new
        turn, recorded with `continues` (the stopped turn's index) and the whole answer; the stopped turn
        stays in the file and on screen, marked, and is still never resent as history.
        """
        last = len(self.turns) - 1
        stopped = self.turns[last] if self.turns else None
        if stopped is None or not stopped.can_continue:
            raise UserError("There is no stopped answer to continue: only the last turn, once cancelled or failed, "
                            "can be continued.")
        left = self.settings.max_new_tokens - len(stopped.emitted_ids)
        if left < 1:
            raise UserError(f"The stopped answer already has {len(stopped.emitted_ids)} tokens, the token limit "
                            f"({self.settings.max_new_tokens}); raise the limit to continue it.")
        ids = stopped.prompt_ids + stopped.emitted_ids
        s = self.settings
        thinking = stopped.thinking if stopped.thinking is not None else s.thinking
        request = GenerationRequest(prompt_ids=ids, thinking=thinking, max_new_tokens=left, seed=s.seed,
                                    block_size=s.block_size, constraint=s.constraint, **s.sampling())
        active = self._active(stopped.user, request, ids, [])
        active.continues, active.earlier = last, stopped.answer
        return active

    def _active(self, user: str, request: GenerationRequest, ids: list[int], messages: list[dict]) -> ActiveTurn:
        request.reuse_cache = self.reuse_cache
        self.last_request = request
        block = self.settings.block_size or self.engine.block_size
        steps = self.engine.reports_steps
        return ActiveTurn(user=user, request=request, prompt_ids=ids, messages=messages, dropped=self.dropped,
                          block_size=block if steps else None,
                          stats=LiveStats(block_size=block if steps else 1, prompt_tokens=len(ids), steps_known=steps))

    def notice(self, text: str) -> None:
        self.notices.append(text)
        if self.on_notice:
            self.on_notice(text)

    # -- running a turn --------------------------------------------------------------------------
    def stream(self, active: ActiveTurn) -> Iterator[StepEvent]:
        """Run the turn on the engine; the turn is recorded when the stream ends, however it ends
        (finished, cancelled, or abandoned by the consumer: recorded as cancelled)."""
        error: Optional[BaseException] = None
        self._record_prompt(active)  # on disk before the engine starts: a killed process keeps the prompt
        with self._engine_use:  # waits out a block-1 probe in flight (a few single-token forwards)
            self._running = True
        try:
            for event in self.engine.generate(active.request):
                active.emitted += event.emitted
                active.text += event.text
                if not event.is_prefill:
                    active.steps.append({"drafted": event.drafted, "accepted": event.accepted})
                active.stats.add(event)
                if event.finish_reason:
                    active.finish_reason = event.finish_reason
                yield event
        except GeneratorExit:
            active.finish_reason = active.finish_reason or "cancelled"
            raise
        except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised
            error = exc
            raise
        finally:
            self._running = False
            if error is None or active.emitted:
                self._finish(active, error)
            elif self.record and self.writer is not None and not active.recorded:
                active.recorded = True  # failed before any token: not a turn, and its prompt record says so
                self.writer.append_unanswered(len(self.turns))

    def _settings_record(self, active: ActiveTurn) -> dict:
        return {**self.settings.to_dict(), "block_size": active.block_size, "thinking": active.request.thinking,
                "reasoning_effort": active.request.reasoning_effort, "engine": self.engine_name,
                "device": self.engine.device, "dtype": self.engine.dtype, **self._draft_record()}

    def _draft_record(self) -> dict:
        """Which draft runs: the name it was given (hub id or folder) and its architecture ('dflash' or
        'dflash2'; None where the engine does not say). In the header and in each turn's settings, since the
        palette can switch drafts mid-session."""
        return {"draft": running_draft(self.engine), "draft_arch": draft_arch(self.engine)}

    def _record_prompt(self, active: ActiveTurn) -> None:
        """The turn's prompt record, fsynced before generation: its turn record settles it when the turn ends;
        if the process dies first, a resumed chat shows it as an interrupted turn to continue."""
        if not self.record or active.recorded:
            return
        continues = {} if active.continues is None else {"continues": active.continues}
        self._writer().append_prompt({
            "index": len(self.turns), **continues, "time": sessions.now_iso(), "user": active.user,
            "answer": active.earlier, "messages": active.messages, "dropped_turns": active.dropped,
            "settings": self._settings_record(active), "prompt_ids": active.prompt_ids,
        })

    def _finish(self, active: ActiveTurn, error: Optional[BaseException]) -> None:
        if active.recorded:
            return
        active.recorded = True
        summary = self.engine.last_summary
        text = active.earlier + (summary.text if summary is not None else active.text)
        if error is not None:
            status = "error"
        elif active.finish_reason in (None, "cancelled") or (summary is not None and summary.finish_reason == "cancelled"):
            status = "cancelled"
        else:
            status = "completed"
        summary_dict = stored(summary)
        turn = Turn(user=active.user, answer=text, status=status, thinking=active.request.thinking, summary=summary,
                    prompt_ids=active.prompt_ids, emitted_ids=active.emitted, continues=active.continues,
                    step_s=list(active.stats.step_s))
        active.turn = turn
        if summary is not None:
            self.note_steps_path(summary)
        if status == "error" and not active.emitted:
            return
        self.turns.append(turn)
        if self.record:
            writer = self._writer()
            continues = {} if active.continues is None else {"continues": active.continues}
            saved = writer.append_turn({
                "index": len(self.turns) - 1, **continues, "status": status, "time": sessions.now_iso(),
                "user": active.user, "answer": text, "messages": active.messages, "dropped_turns": active.dropped,
                "settings": self._settings_record(active),
                "prompt_ids": active.prompt_ids, "emitted_ids": active.emitted, "steps": active.steps,
                "finish_reason": active.finish_reason or status, "summary": summary_dict,
            })
            turn.save_error = None if saved else f"not saved: {writer.error}"

    def retract_last(self) -> Turn:
        """Take the last turn back so the chat can ask again in its place (regenerate, edit and resend): it is
        no longer sent as history, and the session file records that, so a resumed chat neither shows nor
        sends it. Its own line stays in the file (append-only)."""
        if not self.turns:
            raise UserError("There is no answer to take back yet.")
        turn = self.turns.pop()
        if self.writer is not None and not self.writer.append_retraction(len(self.turns)):
            self.notice(f"Taking the answer back is not saved yet ({self.writer.error}); it is retried with the "
                        "next turn.")
        return turn

    # -- the session -----------------------------------------------------------------------------
    def header(self) -> dict:
        engine = self.engine
        target_path = engine.target_info.path
        draft_path = engine.draft_info.path if engine.draft_info else None
        return {
            "profile": profile_snapshot(self.profile),
            "engine": self.engine_name, "device": engine.device, "dtype": engine.dtype,
            "target": engine.config.target or str(target_path),
            "draft": engine.config.draft or (str(draft_path) if draft_path else None),
            "target_path": str(target_path),
            "draft_path": str(draft_path) if draft_path else None, "draft_arch": draft_arch(engine),
            "target_revision": sessions.revision_of(target_path), "draft_revision": sessions.revision_of(draft_path),
            "chat_template_hash": sessions.template_hash(engine.tokenizer),
            "settings": self.settings.to_dict(),
        }

    def _writer(self) -> sessions.SessionWriter:
        if self.writer is None:
            self.writer = sessions.SessionWriter(self.header())
        return self.writer

    @property
    def session_id(self) -> Optional[str]:
        return self.writer.id if self.writer else None

    def close(self) -> None:
        """Let other dflash processes open this session (its lock is released)."""
        if self.writer is not None:
            self.writer.close()

    def new_session(self) -> None:
        self.close()
        self._warned.clear()
        self.turns = []
        self.dropped = 0
        self.writer = None
        self.new_context()

    def new_context(self) -> None:
        """Clear the engine's kept caches: the next turn prefills its whole prompt (the history stays)."""
        self.engine.new_context()

    def restore(self, session: sessions.Session) -> None:
        """Continue a recorded session: its history, its last settings, appending to its file.

        The session's lock is taken first and the file read again under it: a second dflash that read the
        file before the first one appended would otherwise continue a stale history and number its turns
        twice. A session open elsewhere is refused (UserError) with nothing changed here."""
        writer = None
        if self.record:  # locked first, then read again under the lock; a file not dflash's own: a copy of it
            session, note = sessions.open_to_resume(session)
            writer = sessions.SessionWriter.resume(session)
            if note:
                self.notice(note)
        self.turns = [Turn(user=t["user"], answer=t["answer"], status=t["status"], thinking=t.get("thinking"),
                           summary=Summary.from_dict(t["summary"]) if t.get("summary") else None,
                           prompt_ids=t["prompt_ids"], emitted_ids=t["emitted_ids"], continues=t.get("continues"))
                      for t in session.history()]
        self.dropped = max([t.get("dropped_turns", 0) for t in session.turns] or [0])
        settings = session.last_settings()
        self.settings.update({k: v for k, v in settings.items() if k not in ("engine", "device", "dtype")})
        if self.settings.block_size and self.settings.block_size > 1 and not self.has_draft:
            self.settings.block_size = 1
        if self.writer is not None and self.writer.path != session.path:
            self.writer.close()
        self.writer = writer

    # -- session statistics ----------------------------------------------------------------------
    def session_tau(self) -> Optional[float]:
        """Tau over the session's steps: the turns whose tau is unknown are left out; None when no turn's is
        known."""
        return session_tau([t.summary for t in self.turns if t.summary])

    def measure_block1(self) -> bool:
        """Time a block-1 step at the engine's kept context, unless a probe already stands for about that
        length; True when a new figure was measured. The UI calls it when idle after a turn (the TUI from
        a worker thread): the engine times a few single-token forwards on its kept caches and leaves them
        as they were, so the next turn still reuses them. A turn begun meanwhile waits for those forwards."""
        last = self.turns[-1].summary if self.turns else None
        if last is None or self.engine is None or not self.has_draft:  # no engine: one is being switched to
            return False
        if self.probe_near(last.prompt_tokens + last.generated_tokens):
            return False
        with self._engine_use:
            if self._running:
                return False
            probe = self.engine.measure_block1()
        if probe is None:  # nothing kept to measure on (a resumed session, a remote server)
            return False
        self.probes.append(probe)
        return True

    def prepare_steps(self) -> bool:
        """Between turns, after the block size changed: let the engine make ready what the next turn at
        that size needs (the cuda engine captures its graphs), so that sending does not wait for it; True
        when it did something (a remote server has nothing to prepare)."""
        with self._engine_use:
            if self._running:
                return False
            return self.engine.prepare_steps(self.settings.block_size or self.engine.block_size)

    @contextmanager
    def lend_engine(self) -> Iterator[Optional[EngineLike]]:
        """The engine for other work on it (a replay of a session), or None while a turn runs on it. Held
        to the end of the block: a turn or probe begun meanwhile waits, so two never share the engine."""
        with self._engine_use:
            yield None if self._running else self.engine

    def note_steps_path(self, summary: Summary) -> None:
        """A probe stands for the step path it was timed on, the path of the turn before it. A turn that ran on
        another one than the last turn's (on a CPU the steps compiled in the background after the first answer,
        adopted between turns) makes the probes stale: the figure shows "–" until a probe on the new path is
        timed, instead of comparing compiled steps with eager block-1 steps (which read faster than a replay by
        what the compile gained). Called before the turn joins `turns`."""
        last = next((t.summary for t in reversed(self.turns) if t.summary is not None), None)
        if last is not None and summary.graphs != last.graphs:
            self.probes.clear()

    def probe_near(self, context_tokens: int) -> Optional[Block1Probe]:
        """The probe timed nearest `context_tokens`, if one lies within PROBE_SPAN of it."""
        near = [p for p in self.probes
                if max(p.context_tokens, context_tokens) <= PROBE_SPAN * max(1, min(p.context_tokens, context_tokens))]
        return min(near, key=lambda p: abs(p.context_tokens - context_tokens), default=None)

    def speedup(self, block_size: Optional[int], context_tokens: int, step_tokens: Optional[int],
                step_times: Sequence[float]) -> Speedup:
        """Block B's decode steps against block 1's, both timed inside the engine: measured, never estimated.

        The block-B side is a turn's own steps: the tokens they committed (`step_tokens`, the sum of the
        acceptance lengths) and each one's seconds in the engine (`step_times`: its draft, its verify and the
        loop's work that step, `StepEvent.loop_s`, without the consumer's time between events). The block-1 side is a probe's
        single-token target steps (`measure_block1`), timed on the same engine at about the same context (within
        PROBE_SPAN), once the front end is idle. Neither side holds the UI, the pipe or the detokenizer, so the figure agrees with a replay
        at blocks 1 and B (issue 32); both sides take their median step (core/speedup.py, which also says how
        sure the figure is). Unknown ("–") while no probe stands for this context or the steps' times are not
        known (a resumed turn, a server's text chunks)."""
        if block_size is None:  # the server did not say which block size it ran
            return Speedup()
        if block_size <= 1:
            return Speedup(1.0, "block 1")
        probe = self.probe_near(context_tokens)
        return turn_speedup(step_tokens or 0, step_times, probe) if probe is not None else Speedup()

    def turn_speedup(self, turn: Turn) -> Speedup:
        """`speedup` for a finished turn."""
        s = turn.summary
        if s is None:
            return Speedup()
        return self.speedup(s.block_size, s.prompt_tokens + s.generated_tokens, sum(s.acceptance_lengths or []),
                            turn.step_s)

    def summary_speedup(self, summary: Summary) -> tuple[Optional[float], str]:
        """The figure and its kind for the turn that ended with `summary` (the REPL's /stats; `turn_speedup`
        has its spread and noise too)."""
        turn = next((t for t in reversed(self.turns) if t.summary is summary), None)
        figure = self.turn_speedup(turn) if turn is not None else Speedup()
        return figure.value, figure.kind

    def session_speedup(self) -> Speedup:
        """The session's turns together, those whose figure is known: block 1's time for all their tokens over
        their steps' time (core/speedup.py). A block-1 turn is its own block-1 side."""
        measured = []
        for turn in self.turns:
            s = turn.summary
            if s is None or not turn.step_s or s.block_size is None:
                continue
            probe = self.probe_near(s.prompt_tokens + s.generated_tokens) if s.block_size > 1 else None
            block1 = typical(turn.step_s) if s.block_size <= 1 else probe.seconds_per_token if probe else None
            if block1:
                measured.append((sum(s.acceptance_lengths or []), turn.step_s, block1))
        return session_speedup(measured)


def draft_arch(engine: EngineLike) -> Optional[str]:
    """The running draft's architecture as its config declares it: 'dflash' (DFlash 1) or 'dflash2' (DFlash 2, a
    candidate selector); None without a draft, or where the engine does not say (a remote server's)."""
    info = engine.draft_info
    arch = info.arch if info is not None else None
    return arch if arch in DRAFT_KINDS else None


def running_draft(engine: EngineLike) -> Optional[str]:
    """The running draft as it was given (hub id or path); a server's own for a remote engine (whose profile may
    name a local draft it never runs); None without one."""
    info = engine.draft_info
    if info is None:
        return None
    return str(info.path) if engine.name == "remote" else (engine.config.draft or str(info.path))


def running_draft_kind(engine: EngineLike) -> Optional[str]:
    """What the header and the stats call the running draft: 'DFlash 1', 'DFlash 2', or 'no draft' (the target
    alone); None where the engine does not say which kind its draft is (a remote server)."""
    if not engine.reports_steps:  # a server that is not ours does not say whether it drafts at all
        return None
    if engine.draft_info is None:
        return "no draft"
    return draft_kind(draft_arch(engine))


def session_tau(summaries: list[Summary]) -> Optional[float]:
    """The mean acceptance length over every step of `summaries` whose tau is known, None if none is.

    A turn with its acceptance lengths counts each step; one with only a tau (vLLM's and SGLang's
    counters) counts its generated tokens over that tau as its steps."""
    total = steps = 0.0
    for s in summaries:
        if s.acceptance_lengths:
            total, steps = total + sum(s.acceptance_lengths), steps + len(s.acceptance_lengths)
        elif s.acceptance_lengths is None and s.mean_acceptance_length and s.generated_tokens > 1:
            tokens = s.generated_tokens - 1  # the prefill token is not a step
            total, steps = total + tokens, steps + tokens / s.mean_acceptance_length
    return total / steps if steps else None


def open_conversation(engine: EngineLike, profile: Profile, flags: ChatFlags,
                      record: bool = True) -> tuple[Conversation, list[str]]:
    """A new chat on `engine` (profile resolved for it, flags applied) and the notices it starts with
    (the engine's own warnings are the caller's to show)."""
    profile = profile.resolved(engine.name)
    conv = Conversation(engine, flags.apply(ChatSettings.from_profile(profile)), profile=profile, record=record)
    warning = conv.set_thinking(conv.settings.thinking)  # a flag may start it in a setting the profile warns of
    return conv, [warning] if warning else []


def resume(conv: Conversation, session: sessions.Session, flags: ChatFlags) -> None:
    """Continue `session` in `conv`; the command-line flags still win over what it recorded."""
    conv.restore(session)
    flags.apply(conv.settings)


def profile_snapshot(profile: Optional[Profile]) -> dict:
    """The profile's values as plain JSON (for the session header; its per-engine overrides left out)."""
    if profile is None:
        return {}
    values = asdict(profile)
    values.pop("engines")
    values.pop("api_key", None)  # a secret: session files are shared and exported
    values["path"] = str(profile.path) if profile.path is not None else None
    return values


def stored(summary: Optional[Summary]) -> Optional[dict]:
    """A turn's Summary as the session file keeps it: without token_ids and text."""
    if summary is None:
        return None
    data = summary.to_dict()
    del data["token_ids"], data["text"]
    return data

