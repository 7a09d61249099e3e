"""The speedup over block 1 as the chat shows it, with how sure it is (docs/design.md, "Figures shown to the user").

A turn at block B and the block-1 probe (engines/probe.py) are compared by the same statistic, their `typical`
(median) step time: the figure is tau (the tokens a step committed, on average, which is this turn's own
count, not a timing) times block 1's typical step over this turn's typical step. Its spread comes from this
turn's steps: the figure taken at the quartiles of their times, shown as ±. When the steps' times, or the
probe's, scatter by more than NOISY of their median, something else had the machine: the figure says "noisy".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from dflash_tui.core.figures import UNKNOWN
from dflash_tui.engines.probe import Block1Probe, typical

NOISY = 0.25  # the quartiles of step times this far apart, as a share of their median: a busy machine


@dataclass(frozen=True)
class Speedup:
    """A speedup figure; None is not measured yet ("–"), never zero."""

    value: Optional[float] = None
    kind: str = ""  # "measured"; "block 1" for a block-1 turn (1.0 by definition); "" while unknown
    spread: Optional[float] = None  # ± half the figure's range over the middle half of the turn's step times
    noisy: bool = False  # the step times (the turn's or the probe's) scatter: the machine was busy
    turns: int = 0  # a session's figure: the turns it pools

    def text(self, spread: bool = True) -> str:
        """'≈3.1x ±0.4 noisy' measured (`spread`: with the ±), '1.0x' for block 1, '–' until measured."""
        if self.value is None:
            return UNKNOWN
        if self.kind != "measured":
            return f"{self.value:.1f}x"
        shown = f"≈{self.value:.1f}x" + (f" ±{self.spread:.1f}" if spread and self.spread is not None else "")
        return shown + (" noisy" if self.noisy else "")


def quartiles(times: Sequence[float]) -> tuple[float, float]:
    """The first and third quartiles of `times` (one time: itself, twice)."""
    if len(times) < 2:
        return times[0], times[0]
    first, _, third = statistics.quantiles(times, n=4, method="inclusive")
    return first, third


def scatter(times: Sequence[float]) -> float:
    """How far apart the middle half of `times` lies, as a share of their median (0 for fewer than two)."""
    if len(times) < 2 or typical(times) <= 0:
        return 0.0
    first, third = quartiles(times)
    return (third - first) / typical(times)


def turn_speedup(step_tokens: int, step_times: Sequence[float], probe: Block1Probe) -> Speedup:
    """A block-B turn's steps (the tokens they committed, each step's seconds in the engine) against the probe's
    block-1 steps; unknown without steps or with a time of nothing."""
    if not step_tokens or not step_times or min(step_times) <= 0 or probe.seconds_per_token <= 0:
        return Speedup()
    per_step = step_tokens / len(step_times) * probe.seconds_per_token  # block 1's time for a step's tokens
    first, third = quartiles(step_times)
    return Speedup(per_step / typical(step_times), "measured", spread=(per_step / first - per_step / third) / 2,
                   noisy=scatter(step_times) > NOISY or scatter(probe.times) > NOISY)


def session_speedup(turns: Iterable[tuple[int, Sequence[float], float]]) -> Speedup:
    """The session's measured turns together, each given as (tokens its steps committed, their times, block 1's
    typical step for it): the time block 1 would have taken for all their tokens over the time their steps
    took, each side at its typical step. Unknown without one."""
    block1 = steps = 0.0
    count = 0
    for tokens, times, block1_step in turns:
        block1 += tokens * block1_step
        steps += len(times) * typical(times)
        count += 1
    return Speedup(block1 / steps, "measured", turns=count) if count and steps > 0 else Speedup()
