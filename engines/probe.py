"""The block-1 speed probe: what one plain autoregressive step of the target costs at the kept context.

A speedup shown beside a speculative answer must compare two measured decode rates at the same context
length; an estimate from tau and the draft/verify split overstated it several times. Timing a real
block-1 request would throw away the caches a chat keeps between turns, so the engine instead times a
few single-token target steps on top of those caches and rolls each one back (docs/engine-contract.md,
"The block-1 probe"). The framework engines supply the step and its rollback; the timing is here.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence


def typical(times: Sequence[float]) -> float:
    """The step time a speedup compares, the same statistic on both sides (a probe's block-1 steps, a turn's
    block-B steps): the median. A minimum depends on how many steps were timed (a turn has dozens, a probe a
    few) and a mean takes in every stall a busy machine adds; the median does neither."""
    return statistics.median(times)


@dataclass(frozen=True)
class Block1Probe:
    seconds_per_token: float  # the typical (median) timed single-token target step
    context_tokens: int  # the kept context length it was measured at
    steps: int  # how many steps were timed (after one untimed warm-up)
    times: tuple[float, ...] = ()  # each timed step: how much they scatter says whether the machine was busy


@dataclass
class Block1Step:
    """One engine's probe over its kept caches: `run` feeds one token at position `context_tokens` and
    waits for the target's choice there (the host sync a decode step ends with); `undo` puts the kept
    caches back exactly as they were before `run`."""

    context_tokens: int
    run: Callable[[], None]
    undo: Callable[[], None]


def time_block1(step: Block1Step, steps: int) -> Block1Probe:
    """One untimed warm-up, then `steps` timed runs, each undone before the next (untimed), so every run
    sees the same context; the probe keeps their `typical` time and each of them."""
    times = []
    for i in range(steps + 1):
        started = time.perf_counter()
        step.run()
        elapsed = time.perf_counter() - started
        step.undo()
        if i:
            times.append(elapsed)
    return Block1Probe(seconds_per_token=typical(times), context_tokens=step.context_tokens, steps=steps,
                       times=tuple(times))
