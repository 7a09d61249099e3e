"""The DFlash draft in MLX: the same module as engines/cuda/draft.py, loading the same safetensors.

Each layer's queries come from the block ([last token, mask, mask, ...] embedded with the target's
embeddings). Keys and values come from the committed context features (fc(concat of target layer
outputs) -> RMSNorm, projected per layer with k_norm and RoPE at their own positions) followed by the
block itself; the block attends to all of them with no mask. Context K/V are computed once per committed
position and kept in `DraftCache`, read through the draft window (and a layer's trained sliding window);
block K/V never enter the cache. The target's embeddings and lm_head are shared, not stored here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from dflash_tui.engines.checkpoints import DraftInfo, attention_window, layer_windows
from dflash_tui.engines.errors import CheckpointError


def rope_settings(cfg: dict) -> tuple[float, Optional[dict]]:
    """(theta, scaling config) from either the 4.x keys (rope_theta, rope_scaling) or 5.x rope_parameters."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = params
    return float(theta), scaling


def make_rope(cfg: dict, head_dim: int) -> nn.Module:
    from mlx_lm.models.rope_utils import initialize_rope

    theta, scaling = rope_settings(cfg)
    return initialize_rope(head_dim, base=theta, traditional=False, scaling_config=scaling,
                           max_position_embeddings=cfg.get("max_position_embeddings"))


class DraftAttention(nn.Module):
    def __init__(self, cfg: dict, window: Optional[int]):
        super().__init__()
        hidden, self.heads, self.kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or hidden // self.heads
        self.scale = self.head_dim ** -0.5
        bias = bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.rope = make_rope(cfg, self.head_dim)
        self.window = window  # a trained sliding window (layer_types == "sliding_attention") or None

    def _split(self, x: mx.array, heads: int) -> mx.array:
        b, n, _ = x.shape
        return x.reshape(b, n, heads, self.head_dim).transpose(0, 2, 1, 3)

    def project_context(self, ctx: mx.array, offset: int):
        """K/V [b, kv_heads, n, head_dim] for context rows [b, n, hidden] at positions offset..offset+n-1."""
        k = self.rope(self.k_norm(self._split(self.k_proj(ctx), self.kv_heads)), offset=offset)
        v = self._split(self.v_proj(ctx), self.kv_heads)
        return k, v

    def __call__(self, x: mx.array, k_ctx: mx.array, v_ctx: mx.array, offset: int) -> mx.array:
        b, n, _ = x.shape
        q = self.rope(self.q_norm(self._split(self.q_proj(x), self.heads)), offset=offset)
        k_blk, v_blk = self.project_context(x, offset)
        k = mx.concatenate([k_ctx, k_blk], axis=2)
        v = mx.concatenate([v_ctx, v_blk], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=None)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: dict, window: Optional[int]):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = DraftAttention(cfg, window)
        self.mlp = MLP(hidden, cfg["intermediate_size"])
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)

    def __call__(self, h, k_ctx, v_ctx, offset: int):
        h = h + self.self_attn(self.input_layernorm(h), k_ctx, v_ctx, offset)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg
        dflash = cfg["dflash_config"]
        self.target_layer_ids: list[int] = list(dflash["target_layer_ids"])
        self.mask_token_id: int = int(dflash["mask_token_id"])
        self.block_size: int = int(cfg.get("block_size", 16))
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.layers = [DraftLayer(cfg, w) for w in layer_windows(cfg)]
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = nn.RMSNorm(hidden, eps=eps)

    @classmethod
    def load(cls, info: DraftInfo, dtype: mx.Dtype) -> "DFlashDraft":
        """The draft from its safetensors (`model.` prefixes dropped, unused extras ignored), in `dtype`."""
        from mlx.utils import tree_flatten

        model = cls(info.config)
        weights: dict[str, mx.array] = {}
        for file in sorted(Path(info.path).glob("*.safetensors")):
            weights.update(mx.load(str(file)))
        weights = {k.removeprefix("model."): v for k, v in weights.items()}
        expected = {k for k, _ in tree_flatten(model.parameters())}
        missing = sorted(expected - set(weights))
        if missing:
            raise CheckpointError(f"The draft {info.path} lacks weights {missing[:3]}; the checkpoint is incomplete, re-download it.")
        model.load_weights([(k, weights[k].astype(dtype)) for k in sorted(expected)], strict=True)
        model.eval()
        mx.eval(model.parameters())
        return model

    def context(self, features: mx.array) -> mx.array:
        """fc(concat of target layer outputs) -> RMSNorm: [b, n, len(ids)*hidden] -> [b, n, hidden]."""
        return self.hidden_norm(self.fc(features))

    def block_hidden(self, block_embeds: mx.array, k_ctx: list, v_ctx: list, offset: int) -> mx.array:
        """Final normed hidden states of the block (at positions offset..) given each layer's context K/V."""
        h = block_embeds
        for layer, k, v in zip(self.layers, k_ctx, v_ctx):
            h = layer(h, k, v, offset)
        return self.norm(h)


class DraftCache:
    """Per-layer K/V of committed context features (positions < start); the block reads the last
    `window` of them (and at most a layer's trained sliding window).

    Entries live in buffers that grow in steps (no concatenation per step). Every entry is kept, also
    those outside the window, so the cache can be cropped back to any prefix and then reads exactly what
    a fresh run over that prefix would (a conversation's next turn, engines/mlx/loop.py). The visible
    entries are exactly those engines/cuda/draft.py's DraftCache reads.
    """

    step = 256

    def __init__(self, draft: DFlashDraft, window: Optional[int]):
        self.draft = draft
        self.length = 0  # committed positions covered (including ones outside the window)
        self.set_window(window)
        n = len(draft.layers)
        self._keys: list[Optional[mx.array]] = [None] * n
        self._values: list[Optional[mx.array]] = [None] * n

    def set_window(self, window: Optional[int]) -> None:
        self.windows = [attention_window(window, layer.self_attn.window) for layer in self.draft.layers]

    def crop(self, keep: int) -> None:
        """Forget the positions from `keep` on."""
        self.length = min(self.length, max(0, keep))

    def append(self, features: mx.array) -> None:
        """Project and store context features for positions length..length+n-1."""
        n = features.shape[1]
        ctx = self.draft.context(features)
        for i, layer in enumerate(self.draft.layers):
            k, v = layer.self_attn.project_context(ctx, self.length)
            self._store(i, k, v)
        self.length += n

    def _store(self, i: int, k: mx.array, v: mx.array) -> None:
        n, used = k.shape[2], self.length
        buf_k, buf_v = self._keys[i], self._values[i]
        if buf_k is None or used + n > buf_k.shape[2]:
            rows = ((used + n + self.step - 1) // self.step + 1) * self.step
            new_k = mx.zeros((*k.shape[:2], rows, k.shape[3]), k.dtype)
            new_v = mx.zeros((*v.shape[:2], rows, v.shape[3]), v.dtype)
            if used:
                new_k[:, :, :used] = buf_k[:, :, :used]
                new_v[:, :, :used] = buf_v[:, :, :used]
            buf_k, buf_v = new_k, new_v
        buf_k[:, :, used: used + n] = k
        buf_v[:, :, used: used + n] = v
        self._keys[i], self._values[i] = buf_k, buf_v

    def _first(self, i: int) -> int:
        window = self.windows[i]
        return max(0, self.length - window) if window is not None else 0

    def view(self, i: int) -> tuple[mx.array, mx.array]:
        a, b = self._first(i), self.length
        return self._keys[i][:, :, a:b], self._values[i][:, :, a:b]

    @property
    def keys(self) -> list[mx.array]:
        return [self.view(i)[0] for i in range(len(self._keys))]

    @property
    def values(self) -> list[mx.array]:
        return [self.view(i)[1] for i in range(len(self._keys))]

    def arrays(self) -> list[mx.array]:
        """The buffers, to evaluate with the target cache."""
        return [x for x in self._keys + self._values if x is not None]

    def propose_hidden(self, block_embeds: mx.array) -> mx.array:
        views = [self.view(i) for i in range(len(self._keys))]
        return self.draft.block_hidden(block_embeds, [k for k, _ in views], [v for _, v in views], self.length)

    def propose(self, block: mx.array, embed, lm_head) -> mx.array:
        """Greedy draft ids (int32, [b-1]) for block positions 1..; block is [1, b] = [last token, mask...]."""
        hidden = self.propose_hidden(embed(block))
        return mx.argmax(lm_head(hidden[0, 1:]), axis=-1).astype(mx.int32)

    def entries(self) -> int:
        return self.length - self._first(0) if self._keys and self._keys[0] is not None else 0
