"""The live stats: a side panel, folded into one line under the header on small terminals.

The speedup is measured, never estimated: the turn's steps (draft, verify and the engine's work between them)
against the block-1 steps timed
on the same engine at about the same context length, the median step of each (`Conversation.speedup`), with
± the spread over the turn's steps and "noisy" when the machine was busy (core/speedup.py), beside the
session's figure; until that is measured, or once the context has grown 25% past the probe, it shows "–".
So does every figure the engine cannot know (None: a server other than `dflash serve` reports no steps,
block size, memory or cache reuse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rich.text import Text
from textual.widgets import Static

from dflash_tui.core.figures import UNKNOWN, fixed, known
from dflash_tui.core.speedup import Speedup
from dflash_tui.tui.contrast import origin_styles, theme_background

BAR = " ▏▎▍▌▋▊▉█"
Field = tuple[str | Text, str]  # a fitted line's text and its style


@dataclass
class StatsData:
    """The figures on show; None is unknown (shown "–"), never zero."""

    tokens_per_s: float = 0.0
    tokens: int = 0
    tau: Optional[float] = None  # None: no turn yet, or the server does not report acceptance
    session_tau: Optional[float] = None  # over the turns whose tau is known
    session_mixed: bool = False  # the session's turns ran at more than one block size (its tau mixes them)
    histogram: Optional[list] = field(default_factory=list)  # None: the server does not report its steps
    block_size: Optional[int] = 1  # None: the server runs a block size it does not tell
    draft_s: Optional[float] = 0.0
    verify_s: Optional[float] = 0.0
    speedup: Speedup = Speedup()  # this turn's, measured against block 1 (unknown until measured)
    session_speedup: Speedup = Speedup()  # the session's measured turns together
    peak_bytes: Optional[int] = 0
    peak_kind: Optional[str] = "device"
    context_tokens: int = 0
    context_limit: Optional[int] = None
    reused_tokens: Optional[int] = 0  # the last turn's prompt tokens taken from the engine's kept caches
    prefilled_tokens: Optional[int] = 0  # and those its prefill ran
    draft_kind: Optional[str] = None  # "DFlash 1", "DFlash 2" or "no draft"; None: unknown (nothing loaded, a server)
    draft: Optional[str] = None  # the running draft's hub id or folder name
    engine: str = "?"
    device: str = "?"
    dtype: str = "?"
    thinking: bool = True
    effort: Optional[str] = None  # a family's reasoning effort (gpt-oss), shown instead of thinking on/off
    ghosts: bool = False
    state: str = "idle"  # idle, loading, generating, done, cancelled


def human_bytes(n: Optional[float]) -> str:
    if not n:  # None: unknown; 0: nothing measured yet
        return UNKNOWN
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB", "MB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def bar(fraction: float, width: int) -> str:
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    part = int((cells - full) * 8)
    return ("█" * full + (BAR[part] if part and full < width else "")).ljust(width)


def split(d: StatsData) -> Optional[tuple[float, float]]:
    """The draft's and the verify's shares of the step time; None when unknown."""
    if d.draft_s is None or d.verify_s is None:
        return None
    total = d.draft_s + d.verify_s
    return (d.draft_s / total, d.verify_s / total) if total > 0 else (0.0, 0.0)


def split_text(d: StatsData) -> str:
    shares = split(d)
    if shares is None:
        return f"draft {UNKNOWN} · verify {UNKNOWN}"
    return f"draft {shares[0] * 100:.0f}% · verify {shares[1] * 100:.0f}%"


def speedup_line(d: StatsData) -> str:
    """The one-line stats' speedup: '≈3.1x ±0.4', or '≈3.1x noisy' (at 80 columns the spread of a noisy figure
    gives way to the word), then the session's in brackets once it pools more than this turn."""
    turn, session = d.speedup, d.session_speedup
    pooled = f" ({session.text()})" if session.turns > 1 else ""
    return f"speedup {turn.text(spread=not turn.noisy)}{pooled}"


def context_text(d: StatsData) -> str:
    return f"{d.context_tokens}" + (f"/{d.context_limit}" if d.context_limit else "")


def memory_text(d: StatsData) -> str:
    label = "peak RSS" if d.peak_kind == "process-lifetime-rss" else "peak"
    return f"{label} {human_bytes(d.peak_bytes)}"


class StatsPanel(Static):
    """The side panel (wide terminals)."""

    shown: Optional[StatsData] = None  # the figures on show, drawn again when the theme changes

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._theme_changed)  # init: the styles for the theme in use

    def _theme_changed(self) -> None:
        self.origin = origin_styles(theme_background(self.app.current_theme))  # the answer's colours
        if self.shown is not None:
            self.show(self.shown)

    def show(self, d: StatsData) -> None:
        self.shown = d
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f"{d.tokens_per_s:7.1f} tok/s", style="bold")
        t.append(f"  {d.tokens} tok\n")
        speedup = d.speedup
        tag = {"measured": "" if speedup.noisy else " (measured)", "block 1": " (block 1)"}
        t.append(f"speedup {speedup.text()}{tag.get(speedup.kind, ' (not yet measured)')}\n")
        if d.session_speedup.value is not None:
            t.append(f"  session {d.session_speedup.text()}\n")
        t.append(f"tau {fixed(d.tau)}", style="bold")
        t.append(f"   (session {fixed(d.session_tau)}{', mixed blocks' if d.session_mixed else ''})\n\n")
        t.append("acceptance length\n", style="underline")
        if d.histogram is None:
            t.append(f"  {UNKNOWN} (not reported)\n")
        else:
            hist = d.histogram or [0] * max(d.block_size or 1, 1)
            total = sum(hist) or 1
            rows = [i for i, c in enumerate(hist) if c or i in (0, len(hist) - 1)]
            for i in rows:
                share = hist[i] / total
                t.append(f"{i + 1:>3} ")
                t.append(bar(share, 12), style=self.origin["draft" if i else "target"])
                t.append(f" {share * 100:4.0f}%\n")
        t.append(f"\n{split_text(d)}\n")
        t.append(f"{memory_text(d)} · context {context_text(d)}\n")
        t.append(f"prompt {known(d.reused_tokens)} reused · {known(d.prefilled_tokens)} prefilled\n\n")
        t.append(f"{d.engine} · {d.device} · {d.dtype}\n")
        if d.draft_kind is not None:
            t.append(d.draft_kind, style="bold")
            t.append(f" · {d.draft}\n" if d.draft else "\n")
        if d.effort is not None:
            t.append(f"block {known(d.block_size)} · effort ")
            t.append(d.effort, style="bold")
        else:
            t.append(f"block {known(d.block_size)} · thinking ")
            t.append("ON" if d.thinking else "OFF", style="bold")
        t.append("\n\n")
        t.append("accepted draft", style=self.origin["draft"])
        t.append("  ")
        t.append("target", style=self.origin["target"])
        t.append("\n")
        t.append("rejected", style=self.origin["ghost"])
        t.append(f" (ctrl+g {'on' if d.ghosts else 'off'})")
        self.update(t, layout=False)  # fixed size: no layout pass per frame


def fitted(fields: list[Field], width: int) -> Text:
    """`fields` (text or Text, style) joined by " · " in their order of priority: those that do not fit `width`
    are dropped whole from the end, and a "…" says so (no field is cut mid-way). 0 width: all of them."""
    t = Text(no_wrap=True, overflow="ellipsis")
    for n, (text, style) in enumerate(fields):
        sep = " · " if n else ""
        rest = n < len(fields) - 1
        size = text.cell_len if isinstance(text, Text) else len(text)
        if width and t.cell_len + len(sep) + size + (len(" …") if rest else 0) > width:
            t.append(" …" if n else "…")
            break
        t.append(sep)
        t.append(text, style=style or None)
    return t


class FittedLine(Static):
    """One line of fields that drops the least telling whole when the line is too narrow (`fitted`), and
    lays them out again on a resize."""

    fields: list[Field] = []

    def set_fields(self, fields: list[Field]) -> None:
        self.fields = fields
        self.refresh(layout=False)

    def render(self) -> Text:
        return fitted(self.fields, self.content_size.width)


class StatsLine(FittedLine):
    """The same figures in one line (small terminals), the most telling first; at 80 columns the last
    ones give way whole, with "…"; the header names the answer's colours meanwhile (header.py's
    `colour_key`), help (F1) says more."""

    def show(self, d: StatsData) -> None:
        shares = split(d)
        draft = UNKNOWN if shares is None else f"{shares[0] * 100:.0f}%"
        mixed = " mixed" if d.session_mixed else ""
        self.set_fields([(f"{d.tokens_per_s:.0f} tok/s", "bold"), (speedup_line(d), ""),
                         (f"tau {fixed(d.tau)} ({fixed(d.session_tau)}{mixed})", ""), (f"block {known(d.block_size)}", ""),
                         (f"ctx {context_text(d)}", ""), (f"draft {draft}", ""),
                         (memory_text(d).replace(" RSS", ""), "")])
