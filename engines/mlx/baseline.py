"""mlx-lm's own `generate_step` and the target's top-2 margin, for bench and replay (engines/baseline.py)."""

from __future__ import annotations

import time
from typing import cast

import mlx.core as mx

from dflash_tui.engines.baseline import BaselineRun, Margin, cut_at_stop

NAME = "mlx-lm generate_step"


def generate(engine, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> BaselineRun:
    """The target alone through mlx-lm's `generate_step` (the loop under `stream_generate`)."""
    from mlx_lm.generate import generate_step

    if temperature > 0:
        from mlx_lm.sample_utils import make_sampler

        sampler = make_sampler(temp=temperature)
    else:
        def sampler(logits):
            return mx.argmax(logits, axis=-1)
    stops = set(engine.stop_ids())
    ids: list[int] = []
    first = None
    started = time.perf_counter()
    for step, _ in generate_step(mx.array(prompt_ids), engine.model, max_tokens=max_new_tokens, sampler=sampler):
        token = int(step)
        if first is None:
            first = time.perf_counter()
        ids.append(token)
        if token in stops:
            break
    ended = time.perf_counter()
    first = first or ended
    return BaselineRun(token_ids=cut_at_stop(ids, stops), ttft_s=first - started, decode_s=ended - first)


def top2_margin(engine, ids: list[int]) -> Margin:
    """The margin after `ids` from one plain forward pass of the target."""
    logits = engine.model(mx.array([ids]))[0, -1].astype(mx.float32)
    order = mx.argsort(-logits)[:2]
    values = logits[order]
    # (mlx's stubs type tolist() as any nesting; a 1-D array's is a flat list)
    return Margin(float((values[0] - values[1]).item()), [int(t) for t in cast(list[int], order.tolist())])
