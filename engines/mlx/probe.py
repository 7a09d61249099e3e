"""The block-1 probe on MLX (engines/probe.py): one single-token step of the target over the kept caches,
run as the loop runs a block-1 step (one graph, evaluated by its one host sync), and its exact undo: KV
caches trimmed back, a hybrid target's linear-attention entries rebound to the arrays they held (MLX
arrays are immutable, so keeping the references is the copy)."""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from dflash_tui.engines.mlx.loop import TurnCache
from dflash_tui.engines.mlx.target import Target
from dflash_tui.engines.probe import Block1Step


def block1_step(target: Target, turn: TurnCache) -> Optional[Block1Step]:
    """The probe's step over `turn`'s caches; None when nothing is kept that could be brought back."""
    cache, ids = turn.cache, turn.ids
    if cache is None or ids is None:
        return None
    rollback = target.rollback_for(cache)
    if not turn.holds(rollback):
        return None
    length = len(ids)
    saved = {i: list(cache[i].cache) for i in rollback.mixers}
    token = mx.array([[ids[-1]]], dtype=mx.int32)  # any id: the cost does not depend on it

    def run() -> None:
        logits, _ = target.forward(token, cache, capture=False)
        mx.argmax(logits[0], axis=-1).tolist()  # the step's one host sync

    def undo() -> None:
        for i, c in enumerate(cache):
            if i in saved:
                c.cache = list(saved[i])
            else:
                c.trim(c.offset - length)
        mx.eval([c.state for c in cache])  # nothing left pending on this thread's stream (engines/mlx/loop.py)

    return Block1Step(context_tokens=length, run=run, undo=undo)
