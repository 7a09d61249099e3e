"""Exact rollback for hybrid targets (Qwen3.5 / Qwen3.6 / Qwen3-Next: gated delta net + attention).

A verify pass pushes the whole block through every linear-attention layer, whose recurrent state is
updated in place and cannot be cropped. After accepting k drafted tokens the state must be "after the
block's first token plus the k accepted ones" (k+1 tokens, never the bonus token). Conv states are kept
whole during a pass (`activate_past_recording`) and trimmed by `crop`. For the recurrent state there are
two ways, chosen by `ROLLBACK` (docs/families.md, "Hybrid rollback", has the measurements):

- "mixers" (every transformers 5.x): keep the states from before the verify pass, capture each
  linear-attention mixer's input during it (by causality the inputs of the kept positions are exactly
  what a shorter pass would have produced), and re-run only the mixers over the kept positions. The
  verify pass uses the library's chunked kernel; MLPs and attention layers are not re-run.
- "history" (transformers 5.25 and later): `activate_past_recording(recurrent_states_to_keep=b)` makes
  the layer compute the block's b tokens one at a time (the recurrent kernel a one-token decode step
  uses) and keep the state after each, and `crop` puts back the one after the kept tokens.

From 5.25 on, recording with no argument records None and every forward fails (`min(None, seq_len)`),
so both ways pass a count there: 0 outside a "history" verify pass.
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from dflash_tui.engines.cuda.cache import linear_length, set_linear_length

# transformers 5.25 added `recurrent_states_to_keep`; earlier 5.x record conv inputs only.
KEEPS_HISTORY = "recurrent_states_to_keep" in inspect.signature(LinearAttentionCacheLayerMixin.activate_past_recording).parameters
ROLLBACK = "mixers"  # the faster of the two wherever measured (benchmarks/rollback_cost.py)


class LinearStateRollback:
    def __init__(self, model, mode: str = ROLLBACK) -> None:
        if mode not in ("mixers", "history") or (mode == "history" and not KEEPS_HISTORY):
            raise ValueError(f"rollback {mode!r}: 'mixers', or 'history' with transformers 5.25 or later")
        layers = model.model.layers
        self.mixers = {i: layer.linear_attn for i, layer in enumerate(layers) if hasattr(layer, "linear_attn")}
        self.mode = mode
        self.inputs: dict[int, torch.Tensor] = {}
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor, int | None]] = {}
        self.capturing = False
        if self.mode == "mixers":
            for i, mixer in self.mixers.items():
                mixer.register_forward_pre_hook(self._capture(i), with_kwargs=True)
        params = inspect.signature(next(iter(self.mixers.values())).forward).parameters if self.mixers else {}
        self._cache_kwarg = "cache" if "cache" in params else "cache_params"

    def __bool__(self) -> bool:
        return bool(self.mixers)

    def _capture(self, i: int):
        def hook(module, args, kwargs):
            if self.capturing:
                self.inputs[i] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        return hook

    def _record(self, cache, keep_states: int) -> None:
        """Record conv inputs until the next crop and, where transformers can, the recurrent state after each of
        the last `keep_states` tokens of the next pass."""
        kwargs = {"recurrent_states_to_keep": keep_states} if KEEPS_HISTORY else {}
        for i in self.mixers:
            cache.layers[i].activate_past_recording(**kwargs)

    def start(self, cache) -> None:
        """Before any pass: keep conv inputs whole until `commit` trims them."""
        self._record(cache, 0)

    def before_verify(self, cache, block_len: int) -> None:
        if self.mode == "history":
            self._record(cache, block_len)
            return
        for i in self.mixers:
            layer = cache.layers[i]
            # conv states are re-assigned (not written in place) while recording, so a reference suffices
            self.saved[i] = (layer.conv_states[0], layer.recurrent_states[0].clone(), linear_length(layer))
        self.capturing = True

    def commit(self, cache, keep: int, block_len: int) -> None:
        """Leave every layer as if only the first `keep` block tokens had been fed."""
        self.capturing = False
        remove = block_len - keep
        if self.mode == "history":
            for layer in cache.layers:  # a linear layer puts back its recorded state after the kept tokens
                layer.crop(-remove)
            self._record(cache, 0)
            return
        for i, layer in enumerate(cache.layers):
            if i not in self.mixers:
                layer.crop(-remove)
                continue
            if remove and i in self.saved:
                conv, recurrent, length = self.saved[i]
                layer.conv_states[0] = conv
                layer.recurrent_states[0].copy_(recurrent)
                self.mixers[i](hidden_states=self.inputs[i][:, :keep], **{self._cache_kwarg: cache})
                set_linear_length(layer, None if length is None else length + keep)  # the re-run counted again
            layer.crop(0)  # trim the recorded conv inputs back to the kernel size
        self.inputs.clear()
        self.saved.clear()
