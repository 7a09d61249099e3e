"""Static K/V caches: one preallocated buffer per attention layer, sized in buckets.

A bucket is prompt + max_new_tokens + one block, rounded up to `BUCKET` positions; growing past it
allocates the next bucket (and, on the graph path, means new captures). Committing or cropping moves a
length: rejected positions stay in the buffer and are overwritten by the next verify. On the eager path
attention reads only up to the live length (a view of the buffer); on the graph path (`write_at` set) K/V
are written at device positions and attention reads the buffer up to `read_to`, the end of the step's
tier (the live length rounded up to `TIER` positions, a fixed shape per captured graph), under an
explicit mask: a step attends over at most one tier more than the live context, never the whole bucket.

Buffers start zeroed, so masked positions never hold NaN bit patterns (NaN x 0 is NaN in attention).
Hybrid (gated-delta) targets keep transformers' own linear-attention layers; only their full-attention
layers use these buffers.

Sliding-window layers (gpt-oss, Gemma) keep the whole bucket too, not a window-sized ring
(`SlidingBucketLayer`): a rejected block, a resumed turn or an edited conversation then crops them back
exactly like a full layer (a ring has overwritten what a rollback past its window would need), and the
graph path reads them with the same fixed shapes. Only the reads are windowed: on the eager path a step
gets the last W - 1 positions before its block plus the block (and transformers' mask, told that offset
by `get_mask_sizes`, applies the window inside the block); on the graph path the step's mask carries the
window. The price is memory: these layers hold K/V for every position (counted so in memory.py).
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DummyLayer, DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from dflash_tui.engines.memory import SNAPSHOTS

BUCKET = 1024
TIER = 256  # the graph path's attention reads the caches in steps of this many positions


def bucket(tokens: int) -> int:
    """Positions allocated for `tokens`: the next multiple of BUCKET (at least one bucket)."""
    return max(BUCKET, -(-tokens // BUCKET) * BUCKET)


def tier(tokens: int, capacity: int) -> int:
    """Positions a graph step reads to cover `tokens`: the next multiple of TIER, at most `capacity`."""
    return min(capacity, max(TIER, -(-tokens // TIER) * TIER))


def _live(buffer: str) -> property:
    def get(self):
        buf = getattr(self, buffer)
        return None if buf is None else buf[:, :, : self.length]

    def set(self, value):
        if value is not None:  # CacheLayerMixin.__init__ sets None; nothing else may assign
            raise AttributeError("a BucketLayer's states live in its buffers; use update()")

    return property(get, set)


class BucketLayer(CacheLayerMixin):
    """One attention layer's K/V in [batch, kv_heads, capacity, head_dim] buffers and a live length."""

    is_compileable = False
    is_croppable = True
    is_sliding = False
    k_buf: Optional[torch.Tensor] = None
    v_buf: Optional[torch.Tensor] = None

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.write_at: Optional[torch.Tensor] = None  # graph path: device positions of the tokens fed
        self.read_to = 0  # graph path: attention reads positions [0, read_to)

    # transformers reads `keys` / `values` as the cached states: here, views of the buffers' live part
    keys = _live("k_buf")
    values = _live("v_buf")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._allocate(key_states, value_states)

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New zeroed buffers of `capacity` positions, in the states' device, dtype and head shape."""
        self.device = key_states.device
        shape = (*key_states.shape[:2], self.capacity)
        self.k_buf = k_buf = key_states.new_zeros(*shape, key_states.shape[3])
        self.v_buf = v_buf = value_states.new_zeros(*shape, value_states.shape[3])
        self.is_initialized = True
        return k_buf, v_buf

    def _grow(self, old_k: torch.Tensor, old_v: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers of the bucket for `tokens` positions, holding the live ones of `old_k` / `old_v`."""
        self.capacity = bucket(tokens)
        k_buf, v_buf = self._allocate(old_k, old_v)
        k_buf[:, :, : self.length] = old_k[:, :, : self.length]
        v_buf[:, :, : self.length] = old_v[:, :, : self.length]
        return k_buf, v_buf

    def reserve(self, tokens: int) -> None:
        """Make room for `tokens` positions (a new allocation only past the current bucket)."""
        if tokens <= self.capacity:
            return
        old_k, old_v = self.k_buf, self.v_buf
        if old_k is None or old_v is None:  # sized now, made on first use
            self.capacity = bucket(tokens)
        else:
            self._grow(old_k, old_v, tokens)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        k_buf, v_buf = self.k_buf, self.v_buf
        if k_buf is None or v_buf is None:  # first use (lazy_initialization)
            k_buf, v_buf = self._allocate(key_states, value_states)
        if self.write_at is not None:  # graph path: fixed shapes, positions on the device
            k_buf.index_copy_(2, self.write_at, key_states)
            v_buf.index_copy_(2, self.write_at, value_states)
            return k_buf[:, :, : self.read_to], v_buf[:, :, : self.read_to]
        end = self.length + key_states.shape[2]
        if end > self.capacity:  # (reserve)
            k_buf, v_buf = self._grow(k_buf, v_buf, end)
        k_buf[:, :, self.length: end] = key_states
        v_buf[:, :, self.length: end] = value_states
        self.length = end
        return k_buf[:, :, :end], v_buf[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def crop(self, tokens_to_remove: int) -> None:
        """transformers 5.x semantics: a negative count of tokens to remove (0 keeps everything)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0
        self.write_at = None


class SlidingBucketLayer(BucketLayer):
    """A sliding-window layer's K/V in a whole bucket; a step attends to the last `window` positions up to
    and including each query (transformers' convention: key j is seen from query p when p - window < j <= p)."""

    is_sliding = True

    def __init__(self, capacity: int, window: int):
        super().__init__(capacity)
        self.sliding_window = window

    def _first(self) -> int:
        """The first position a block fed after the live length can see."""
        return max(0, self.length - self.sliding_window + 1)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.write_at is not None:  # graph path: the step's mask carries the window
            return super().update(key_states, value_states, *args, **kwargs)
        first = self._first()
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        return keys[:, :, first:], values[:, :, first:]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        first = self._first()
        return self.length + query_length - first, first


def bucket_cache(config, layers: Optional[list] = None, capacity: int = BUCKET) -> DynamicCache:
    """A transformers cache for `config` whose attention layers are BucketLayers, SlidingBucketLayers for
    sliding windows (the given ones, reset, when `layers` is passed: their buffers are reused). Other layer
    kinds (gated delta net) stay transformers' own."""
    cache = DynamicCache(config=config)
    fresh = layers is None
    reuse = iter(layers or [])
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:
            bucket_layer = SlidingBucketLayer(capacity, layer.sliding_window) if fresh else next(reuse)
            bucket_layer.reset()
            bucket_layer.reserve(capacity)
            cache.layers[i] = bucket_layer
        elif type(layer) is DynamicLayer:
            bucket_layer = BucketLayer(capacity) if fresh else next(reuse)
            bucket_layer.reset()
            bucket_layer.reserve(capacity)
            cache.layers[i] = bucket_layer
    return cache


def bucket_layers(cache) -> list[BucketLayer]:
    return [layer for layer in getattr(cache, "layers", []) if isinstance(layer, BucketLayer)]


def reserve(cache, tokens: int) -> None:
    for layer in bucket_layers(cache):
        layer.reserve(tokens)


class CachePool:
    """The caches one engine reuses from request to request: a new allocation only when a request
    needs a larger bucket. Requests run one at a time, so one set of buffers serves them all."""

    def __init__(self, target, draft=None):
        self.target, self.draft = target, draft
        self._layers: Optional[list[BucketLayer]] = None
        self._draft_cache = None

    def target_cache(self, tokens: int):
        cache = bucket_cache(self.target.model.config, self._layers, bucket(tokens))
        if self._layers is None:
            self._layers = bucket_layers(cache)
        self.target.start_cache(cache)
        return cache

    def draft_cache(self, window: Optional[int], tokens: int, keep: int = 0):
        from dflash_tui.engines.cuda.draft import DraftCache

        if self._draft_cache is None:
            self._draft_cache = DraftCache(self.draft, window, bucket(tokens))
        self._draft_cache.reset(window, keep)
        self._draft_cache.reserve(tokens)
        return self._draft_cache

    def draft_length(self) -> int:
        """Context positions the pooled draft cache covers (0 before its first use)."""
        return self._draft_cache.length if self._draft_cache is not None else 0

    def crop_draft(self, keep: int) -> None:
        if self._draft_cache is not None:
            self._draft_cache.length = min(self._draft_cache.length, keep)


MAX_SNAPSHOTS = SNAPSHOTS  # hybrid targets: linear-attention states kept per conversation (the latest positions)


def linear_layers(cache) -> dict[int, LinearAttentionCacheLayerMixin]:
    return {i: layer for i, layer in enumerate(getattr(cache, "layers", []))
            if isinstance(layer, LinearAttentionCacheLayerMixin)}


def linear_length(layer) -> Optional[int]:
    """The tokens a linear-attention layer counts (transformers 5.25 and later, where the cache's
    get_seq_length() reads layer 0's count, a linear layer on Qwen3.5); None where layers count nothing."""
    count = getattr(layer, "cumulative_length_linear", None)
    return None if count is None else int(count)


def set_linear_length(layer, length: Optional[int]) -> None:
    """Set that count: putting states back, or re-running a mixer, must leave it as the states are."""
    if length is not None:  # a new tensor: the probe's undo runs outside inference mode, where the old one is read-only
        layer.cumulative_length_linear = torch.full_like(layer.cumulative_length_linear, length)


def linear_states(cache) -> dict[int, tuple[torch.Tensor, torch.Tensor, Optional[int]]]:
    """A copy of every linear-attention layer's conv and recurrent state and its count (after a commit trimmed
    them)."""
    states = {}
    for i, layer in linear_layers(cache).items():
        conv, recurrent = layer.conv_states[0], layer.recurrent_states[0]
        if conv is not None and recurrent is not None:  # (set by the first pass)
            states[i] = (conv.clone(), recurrent.clone(), linear_length(layer))
    return states


def restore_states(cache, states: dict) -> None:
    """Put copies of `states` back (the model updates the recurrent state in place: never alias a snapshot)."""
    layers = cache.layers
    for i, (conv, recurrent, length) in states.items():
        layers[i].conv_states[0] = conv.clone()
        layers[i].recurrent_states[0] = recurrent.clone()
        set_linear_length(layers[i], length)


class TurnCache:
    """What a request leaves for the next one (the conversation's caches between turns).

    `ids` are the tokens the target cache holds (the prompt and every committed token but the newest),
    or None while a step is changing the caches (an interrupted step leaves nothing to reuse). The draft's
    context cache is the pool's and tracks its own length, which trails the target's after a block-1 turn.
    Attention K/V crop to any prefix; linear-attention (gated delta net) states cannot, so hybrid targets
    keep `snapshots` {position: states} at chosen points (right after the assistant header of each
    prompt) besides the live state at len(ids)."""

    def __init__(self):
        self.cache = None
        self.ids: Optional[list[int]] = None
        self.snapshots: dict[int, dict] = {}

    def clear(self) -> None:
        self.ids = None
        self.snapshots = {}

    def snapshot(self, position: int) -> None:
        self.snapshots[position] = linear_states(self.cache)
        for old in sorted(self.snapshots)[:-MAX_SNAPSHOTS]:
            del self.snapshots[old]

    def holds(self) -> bool:
        """Whether something is kept that can be brought back exactly: attention K/V in bucket layers (sliding
        windows included: they keep every position), linear-attention states, and shared-KV layers, which keep
        nothing (Gemma 4's read the K/V an earlier layer computes in the same pass); other layer kinds cannot be
        cropped back."""
        if self.ids is None or self.cache is None:
            return False
        linear = linear_layers(self.cache)
        return all(isinstance(layer, (BucketLayer, DummyLayer)) or i in linear
                   for i, layer in enumerate(getattr(self.cache, "layers", [])))

    def resume(self, prompt_ids: list[int], draft_length: Optional[int]) -> int:
        """Bring the kept target cache back to the longest prefix of `prompt_ids` it can restore exactly
        (at least one prompt token is left to prefill; never past `draft_length` when the draft is fed);
        returns that length, 0 when nothing is reusable."""
        from dflash_tui.engines.engine import common_prefix

        ids = self.ids
        if ids is None or not self.holds():
            return 0
        linear = linear_layers(self.cache)
        keep = min(common_prefix(ids, prompt_ids), len(prompt_ids) - 1)
        if draft_length is not None:
            keep = min(keep, draft_length)
        if linear:
            points = [p for p in self.snapshots if p <= keep]
            live = len(ids) if len(ids) <= keep else None
            best = max(points + ([live] if live is not None else []), default=0)
            if best and best != live:
                restore_states(self.cache, self.snapshots[best])
            keep = best
        self.snapshots = {p: s for p, s in self.snapshots.items() if p <= keep}
        if keep <= 0:
            return 0
        for layer in bucket_layers(self.cache):
            layer.length = min(layer.length, keep)
        return keep
