"""transformers' own `generate` and the target's top-2 margin, for bench and replay (engines/baseline.py)."""

from __future__ import annotations

import time

import torch

from dflash_tui.engines.baseline import BaselineRun, Margin, cut_at_stop

NAME = "transformers generate"


def generate(engine, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> BaselineRun:
    """The target alone through transformers' `generate`; the first token is timed by a streamer."""
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:  # the first call carries the prompt
                self.first = time.perf_counter()

        def end(self):
            pass

    stops = set(engine.stop_ids())
    device = engine.target.device
    clock = Clock()
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else \
        {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    started = time.perf_counter()
    with torch.no_grad():
        out = engine.target.model.generate(
            torch.tensor([prompt_ids], device=device), max_new_tokens=max_new_tokens,
            eos_token_id=sorted(stops) or None, pad_token_id=next(iter(stops), 0), streamer=clock, **sampling)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ended = time.perf_counter()
    first = clock.first or ended
    ids = cut_at_stop(out[0, len(prompt_ids):].tolist(), stops)
    return BaselineRun(token_ids=ids, ttft_s=first - started, decode_s=ended - first)


def top2_margin(engine, ids: list[int]) -> Margin:
    """The margin after `ids` from one plain forward pass of the target."""
    with torch.no_grad():
        logits = engine.target.model(input_ids=torch.tensor([ids], device=engine.target.device)).logits[0, -1].float()
    values, top = torch.topk(logits, 2)
    return Margin(float(values[0] - values[1]), [int(t) for t in top.tolist()])
