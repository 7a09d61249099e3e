"""The chat controller shared by the TUI and the plain REPL (no UI framework here).

It owns what a chat is: the history, the system prompt, the thinking flag, the block size, trimming
the oldest turns when the history outgrows the target's context (with a notice), building the
`GenerationRequest` for each turn, and recording every turn, completed or cancelled, in the session.
The front ends only show what it streams.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional

from dflash_tui.core import sessions
from dflash_tui.core.profiles import Profile
from dflash_tui.core.terminal import printable  # noqa: F401 - re-exported for older imports
from engines.checkpoints import check_block_size
from engines.config import GenerationRequest, Sampling
from engines.engine import EngineLike
from engines.errors import UserError
from engines.events import StepEvent, Summary

BLOCK_CHOICES = (1, 2, 4, 8, 16)
FULL_CONTEXT_KEEP = 0.75  # a full context drops its oldest turns down to this share at once (issue 14)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
DRAFT_THINKING_WARNING = ("This profile's draft was not trained with thinking traces: with thinking on, "
                          "expect fewer accepted draft tokens.")


@dataclass
class ChatSettings(Sampling):
    """What the next turn is generated with (the profile's values unless changed in the chat)."""

    block_size: Optional[int] = None  # None: the engine's own (the draft's trained block size)
    thinking: bool = True
    max_new_tokens: int = 512
    seed: int = 0
    system_prompt: str = ""

    @classmethod
    def from_profile(cls, profile: Profile, block_size: Optional[int] = None,
                     thinking: Optional[bool] = None) -> "ChatSettings":
        """Flags first, then the profile, then the defaults (docs/design.md, "Profiles")."""
        return cls(
            block_size=block_size if block_size is not None else profile.block_size,
            thinking=thinking if thinking is not None else profile.thinking,
            max_new_tokens=profile.max_new_tokens, system_prompt=profile.system_prompt, **profile.sampling(),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def update(self, data: dict) -> None:
        for key, value in data.items():
            if key in self.__dataclass_fields__:
                setattr(self, key, value)


@dataclass
class ChatFlags:
    """`dflash chat`'s own flags: they win over the profile and over what a resumed session recorded."""

    block_size: Optional[int] = None
    thinking: Optional[bool] = None
    max_new_tokens: Optional[int] = None

    def apply(self, settings: ChatSettings) -> ChatSettings:
        if self.block_size:
            settings.block_size = self.block_size
        if self.thinking is not None:
            settings.thinking = self.thinking
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

    @property
    def cancelled(self) -> bool:
        return self.status == "cancelled"


def split_thinking(text: str, thinking: bool = True) -> tuple[Optional[str], str, bool]:
    """(thinking text or None, answer text, thinking finished) for an answer as generated.

    A reply may open with `<think>` (Qwen3) or start inside the block when the template already opened
    it (then only `</think>` appears). An empty think block (thinking off) yields no thinking text.
    """
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN):]
        if THINK_CLOSE in body:
            inner, answer = body.split(THINK_CLOSE, 1)
            inner = inner.strip("\n")
            return (inner if inner.strip() else None), answer.lstrip("\n"), True
        return body.lstrip("\n"), "", False
    if thinking and THINK_CLOSE in text:
        inner, answer = text.split(THINK_CLOSE, 1)
        return (inner.strip("\n") or None), answer.lstrip("\n"), True
    return None, text, True


def thinking_layout(raw: str, thinking: bool) -> tuple[int, int, int]:
    """(thinking start, thinking end, answer start) as offsets into the raw answer text.

    No thinking gives (0, 0, answer start); an unclosed block runs to the end of the text."""
    lead = len(raw) - len(raw.lstrip())
    if raw.startswith(THINK_OPEN, lead):
        start = lead + len(THINK_OPEN)
        close = raw.find(THINK_CLOSE, start)
        if close == -1:
            return start, len(raw), len(raw)
        end, answer = close, close + len(THINK_CLOSE)
    elif thinking and THINK_CLOSE in raw:
        start, end = 0, raw.index(THINK_CLOSE)
        answer = end + len(THINK_CLOSE)
    else:
        return 0, 0, lead
    while answer < len(raw) and raw[answer] == "\n":
        answer += 1
    while start < end and raw[start] == "\n":
        start += 1
    return start, end, answer


@dataclass
class LiveStats:
    """Figures for the turn in progress, updated per event (cheap: the decode thread calls `add`)."""

    block_size: int = 1
    started: float = field(default_factory=time.perf_counter)
    first_at: Optional[float] = None
    last_at: Optional[float] = None
    tokens: int = 0
    lengths: list = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    prompt_tokens: int = 0

    def add(self, event: StepEvent) -> None:
        now = time.perf_counter()
        self.tokens += len(event.emitted)
        if event.is_prefill:
            self.first_at = now
        else:
            self.lengths.append(event.accepted + 1)
            self.draft_s += event.draft_s
            self.verify_s += event.verify_s
        self.last_at = now

    @property
    def tokens_per_s(self) -> float:
        if self.first_at is None or self.last_at is None or self.last_at <= self.first_at:
            return 0.0
        return (self.tokens - 1) / (self.last_at - self.first_at)

    @property
    def tau(self) -> float:
        return sum(self.lengths) / len(self.lengths) if self.lengths else 0.0

    def histogram(self) -> list[int]:
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
    block_size: int
    stats: LiveStats
    emitted: list[int] = field(default_factory=list)
    steps: list = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    recorded: bool = False
    turn: Optional[Turn] = None

    def cancel(self) -> None:
        self.request.cancel.set()


class Conversation:
    """History + settings + session for one engine. `begin()` a turn, iterate `stream()` over it."""

    def __init__(self, engine: EngineLike, settings: ChatSettings, profile: Optional[Profile] = None,
                 record: bool = True):
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
        self._warned_draft_thinking = False
        self.on_notice: Optional[Callable[[str], None]] = None
        self.reuse_cache = True  # the engine keeps its caches between turns (False: every turn prefilled whole)

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

    def cycle_block(self) -> int:
        choices = self.block_choices()
        current = self.settings.block_size
        later = [b for b in choices if b > current]
        self.settings.block_size = later[0] if later else choices[0]
        return self.settings.block_size

    def set_block(self, block_size: int) -> int:
        check_block_size(block_size, self.engine.trained_block_size, self.has_draft)
        self.settings.block_size = block_size
        return block_size

    def set_thinking(self, on: bool) -> Optional[str]:
        """Set thinking for the next turns; returns a one-time warning when the draft lacks thinking traces."""
        self.settings.thinking = on
        if on and not self._warned_draft_thinking and self.profile is not None \
                and not self.profile.draft_thinking:
            self._warned_draft_thinking = True
            return DRAFT_THINKING_WARNING
        return None

    def toggle_thinking(self) -> Optional[str]:
        return self.set_thinking(not self.settings.thinking)

    # -- building requests -----------------------------------------------------------------------
    def messages_for(self, user: str, history: list[Turn]) -> list[dict]:
        messages: list[dict] = []
        if self.settings.system_prompt.strip():
            messages.append({"role": "system", "content": self.settings.system_prompt})
        for turn in history:
            messages.append({"role": "user", "content": turn.user})
            messages.append({"role": "assistant", "content": turn.answer})
        messages.append({"role": "user", "content": user})
        return messages

    def _request(self, messages: list[dict]) -> GenerationRequest:
        s = self.settings
        return GenerationRequest(
            messages=messages, thinking=s.thinking, max_new_tokens=s.max_new_tokens, seed=s.seed,
            block_size=s.block_size, **s.sampling(),
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
        fill = limit
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
            newly = start - self.dropped
            self.dropped = start
            self.notice(f"Context full: {newly} oldest turn{'s' if newly > 1 else ''} no longer sent "
                        f"({self.dropped} dropped in all; prompt {len(ids)} of {limit} tokens).")
        request.reuse_cache = self.reuse_cache
        self.last_request = request
        block = self.settings.block_size or self.engine.block_size
        return ActiveTurn(user=user, request=request, prompt_ids=list(ids), messages=messages, dropped=self.dropped,
                          block_size=block, stats=LiveStats(block_size=block, prompt_tokens=len(ids)))

    def notice(self, text: str) -> None:
        self.notices.append(text)
        if self.on_notice:
            self.on_notice(text)

    # -- running a turn --------------------------------------------------------------------------
    def stream(self, active: ActiveTurn) -> Iterator[StepEvent]:
        """Run the turn on the engine; the turn is recorded when the stream ends, however it ends
        (finished, cancelled, or abandoned by the consumer: recorded as cancelled)."""
        error: Optional[BaseException] = None
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
            if error is None or active.emitted:
                self._finish(active, error)

    def _finish(self, active: ActiveTurn, error: Optional[BaseException]) -> None:
        if active.recorded:
            return
        active.recorded = True
        summary = self.engine.last_summary
        text = summary.text if summary is not None else active.text
        if error is not None:
            status = "error"
        elif active.finish_reason in (None, "cancelled") or (summary is not None and summary.finish_reason == "cancelled"):
            status = "cancelled"
        else:
            status = "completed"
        summary_dict = stored(summary)
        turn = Turn(user=active.user, answer=text, status=status, thinking=active.request.thinking, summary=summary)
        active.turn = turn
        if status == "error" and not active.emitted:
            return
        self.turns.append(turn)
        if self.record:
            writer = self._writer()
            saved = writer.append_turn({
                "index": len(self.turns) - 1, "status": status, "time": sessions.now_iso(),
                "user": active.user, "answer": text, "messages": active.messages, "dropped_turns": active.dropped,
                "settings": {**self.settings.to_dict(), "block_size": active.block_size,
                             "thinking": active.request.thinking, "engine": self.engine_name,
                             "device": self.engine.device, "dtype": self.engine.dtype},
                "prompt_ids": active.prompt_ids, "emitted_ids": active.emitted, "steps": active.steps,
                "finish_reason": active.finish_reason or status, "summary": summary_dict,
            })
            turn.save_error = None if saved else f"not saved: {writer.error}"

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
            "draft_path": str(draft_path) if draft_path else None,
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
        self.turns = []
        self.dropped = 0
        self.writer = None
        self.new_context()

    def new_context(self) -> None:
        """Clear the engine's kept caches: the next turn prefills its whole prompt (the history stays)."""
        clear = getattr(self.engine, "new_context", None)  # a remote server keeps its own caches
        if clear is not None:
            clear()

    def restore(self, session: sessions.Session) -> None:
        """Continue a recorded session: its history, its last settings, appending to its file."""
        self.turns = [Turn(user=t["user"], answer=t["answer"], status=t["status"], thinking=t.get("thinking"),
                           summary=Summary.from_dict(t["summary"]) if t.get("summary") else None)
                      for t in session.history()]
        self.dropped = max([t.get("dropped_turns", 0) for t in session.turns] or [0])
        settings = session.last_settings()
        self.settings.update({k: v for k, v in settings.items() if k not in ("engine", "device", "dtype")})
        if self.settings.block_size and self.settings.block_size > 1 and not self.has_draft:
            self.settings.block_size = 1
        writer = sessions.SessionWriter.resume(session) if self.record else None  # refused if open elsewhere
        if self.writer is not None and self.writer.path != session.path:
            self.writer.close()
        self.writer = writer

    # -- session statistics ----------------------------------------------------------------------
    def session_tau(self) -> float:
        lengths = [n for t in self.turns if t.summary for n in t.summary.acceptance_lengths]
        return sum(lengths) / len(lengths) if lengths else 0.0

    def block1_rate(self) -> Optional[float]:
        rates = [t.summary.decode_tokens_per_s for t in self.turns
                 if t.summary and t.summary.block_size == 1 and t.summary.engine == self.engine.name
                 and t.summary.generated_tokens > 1 and t.summary.decode_tokens_per_s]
        return sum(rates) / len(rates) if rates else None

    def speedup(self, tokens_per_s: float, tau: float, draft_s: float, verify_s: float, steps: int,
                block_size: int) -> tuple[Optional[float], str]:
        """Speedup over block 1: measured against this session's block-1 turns when there are any,
        else estimated as tau x (verify time per step) / (draft + verify time per step), i.e. taking a
        block-1 step to cost one verify pass (an upper bound on block 1's speed on a GPU)."""
        if block_size <= 1:
            return 1.0, "block 1"
        base = self.block1_rate()
        if base and tokens_per_s:
            return tokens_per_s / base, "measured"
        if steps and verify_s > 0 and tau:
            return tau * verify_s / (draft_s + verify_s), "est."
        return None, "est."


def open_conversation(engine: EngineLike, profile: Profile, flags: ChatFlags,
                      record: bool = True) -> tuple[Conversation, list[str]]:
    """A new chat on `engine` (profile resolved for it, flags applied) and the notices it starts with
    (the engine's own warnings are the caller's to show)."""
    profile = profile.resolved(engine.name)
    conv = Conversation(engine, flags.apply(ChatSettings.from_profile(profile)), profile=profile, record=record)
    warning = conv.set_thinking(True) if conv.settings.thinking else None
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
    values["path"] = str(profile.path) if profile.path is not None else None
    return values


def stored(summary: Optional[Summary]) -> Optional[dict]:
    """A turn's Summary as the session file keeps it: without token_ids and text."""
    if summary is None:
        return None
    data = summary.to_dict()
    del data["token_ids"], data["text"]
    return data

