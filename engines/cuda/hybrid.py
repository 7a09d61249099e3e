"""Exact rollback for hybrid targets (Qwen3.5 / Qwen3.6: gated delta net + full attention).

A verify pass pushes the whole block through every linear-attention layer, whose recurrent state is
updated in place and cannot be cropped. After accepting k drafted tokens the state must be "after the
block's first token plus the k accepted ones" (k+1 tokens, never the bonus token). We keep the states
from before the verify pass, capture each linear-attention mixer's input during it (by causality the
inputs of the kept positions are exactly what a shorter pass would have produced), and re-run only the
mixers over the kept positions. Conv states are kept whole during the pass
(`activate_past_recording`) and trimmed to the kernel size afterwards. The mixers are the library's
own modules, so rollback computes exactly what a pass over the kept tokens computes; MLPs and
attention layers are not re-run.
"""

from __future__ import annotations

import inspect

import torch


class LinearStateRollback:
    def __init__(self, model) -> None:
        layers = model.model.layers
        self.mixers = {i: layer.linear_attn for i, layer in enumerate(layers) if hasattr(layer, "linear_attn")}
        self.inputs: dict[int, torch.Tensor] = {}
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.capturing = False
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

    def start(self, cache) -> None:
        """Before any pass: keep conv inputs whole until `commit` trims them."""
        for i in self.mixers:
            cache.layers[i].activate_past_recording()

    def before_verify(self, cache) -> None:
        for i in self.mixers:
            layer = cache.layers[i]
            # conv states are re-assigned (not written in place) while recording, so a reference suffices
            self.saved[i] = (layer.conv_states[0], layer.recurrent_states[0].clone())
        self.capturing = True

    def commit(self, cache, keep: int, block_len: int) -> None:
        """Leave every layer as if only the first `keep` block tokens had been fed."""
        self.capturing = False
        remove = block_len - keep
        for i, layer in enumerate(cache.layers):
            if i not in self.mixers:
                layer.crop(-remove)
                continue
            if remove and i in self.saved:
                conv, recurrent = self.saved[i]
                layer.conv_states[0] = conv
                layer.recurrent_states[0].copy_(recurrent)
                self.mixers[i](hidden_states=self.inputs[i][:, :keep], **{self._cache_kwarg: cache})
            layer.crop(0)  # trim the recorded conv inputs back to the kernel size
        self.inputs.clear()
        self.saved.clear()
