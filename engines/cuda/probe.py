"""The block-1 probe on PyTorch (engines/probe.py): one single-token step of the target over the kept
caches, run the way the loop runs a block-1 step (a replayed graph where one is captured for these
buffers, else eager, with a hybrid target's state bookkeeping), and its exact undo: the attention
lengths go back, and a hybrid target's linear-attention states are restored from copies."""

from __future__ import annotations

from typing import Optional

import torch

from dflash_tui.engines.cuda.cache import TurnCache, bucket_layers, linear_states, restore_states
from dflash_tui.engines.cuda.graphs import StepGraphs
from dflash_tui.engines.cuda.target import Target
from dflash_tui.engines.probe import Block1Step


def block1_step(target: Target, turn: TurnCache, graphs: Optional[StepGraphs]) -> Optional[Block1Step]:
    """The probe's step over `turn`'s caches; None when nothing is kept that could be brought back."""
    ids = turn.ids
    if ids is None or not turn.holds():
        return None
    cache, length = turn.cache, len(ids)
    layers = bucket_layers(cache)
    states = linear_states(cache)  # {} unless the target is hybrid
    token = torch.tensor([[ids[-1]]], device=target.device)  # any id: the cost does not depend on it
    replay = graphs if graphs is not None and graphs.replayable(cache, 1, length) else None

    @torch.inference_mode()
    def run() -> None:
        if replay is not None:  # writes K/V at position `length` only; no length moves
            replay.draft_step(token[0], length, 1)
            logits = replay.verify_step(1)
        else:
            target.before_verify(cache, 1)
            logits, _ = target.forward(token, length, cache, last_only=False, capture=False)
        logits[0].argmax(dim=-1).tolist()  # the step's one host sync
        if replay is None:
            target.commit(cache, 1, 1)

    def undo() -> None:
        for layer in layers:
            layer.length = length
        restore_states(cache, states)

    return Block1Step(context_tokens=length, run=run, undo=undo)
