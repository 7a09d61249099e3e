"""Static K/V caches: one preallocated buffer per attention layer, sized in buckets.

A bucket is prompt + max_new_tokens + one block, rounded up to `BUCKET` positions; growing past it
allocates the next bucket (and, on the graph path, means new captures). Committing or cropping moves a
length: rejected positions stay in the buffer and are overwritten by the next verify. On the eager path
attention reads only up to the live length (a view of the buffer); on the graph path (`write_at` set) K/V
are written at device positions and attention reads the whole bucket under an explicit mask.

Buffers start zeroed, so masked positions never hold NaN bit patterns (NaN x 0 is NaN in attention).
Hybrid (gated-delta) targets keep transformers' own linear-attention layers; only their full-attention
layers use these buffers.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

BUCKET = 1024


def bucket(tokens: int) -> int:
    """Positions allocated for `tokens`: the next multiple of BUCKET (at least one bucket)."""
    return max(BUCKET, -(-tokens // BUCKET) * BUCKET)


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

    # transformers reads `keys` / `values` as the cached states: here, views of the buffers' live part
    keys = _live("k_buf")
    values = _live("v_buf")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        shape = (*key_states.shape[:2], self.capacity)
        self.k_buf = key_states.new_zeros(*shape, key_states.shape[3])
        self.v_buf = value_states.new_zeros(*shape, value_states.shape[3])
        self.is_initialized = True

    def reserve(self, tokens: int) -> None:
        """Make room for `tokens` positions (a new allocation only past the current bucket)."""
        if tokens <= self.capacity:
            return
        self.capacity = bucket(tokens)
        if self.k_buf is not None:
            old_k, old_v = self.k_buf, self.v_buf
            self.lazy_initialization(old_k, old_v)
            self.k_buf[:, :, : self.length] = old_k[:, :, : self.length]
            self.v_buf[:, :, : self.length] = old_v[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.write_at is not None:  # graph path: fixed shapes, positions on the device
            self.k_buf.index_copy_(2, self.write_at, key_states)
            self.v_buf.index_copy_(2, self.write_at, value_states)
            return self.k_buf, self.v_buf
        end = self.length + key_states.shape[2]
        self.reserve(end)
        self.k_buf[:, :, self.length: end] = key_states
        self.v_buf[:, :, self.length: end] = value_states
        self.length = end
        return self.k_buf[:, :, :end], self.v_buf[:, :, :end]

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


def bucket_cache(config, layers: Optional[list] = None, capacity: int = BUCKET) -> DynamicCache:
    """A transformers cache for `config` whose full-attention layers are BucketLayers (the given ones,
    reset, when `layers` is passed: their buffers are reused). Other layer kinds (gated delta net,
    sliding windows) stay transformers' own."""
    cache = DynamicCache(config=config)
    fresh = layers is None
    reuse = iter(layers or [])
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
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

    def draft_cache(self, window: Optional[int], tokens: int):
        from .draft import DraftCache

        if self._draft_cache is None:
            self._draft_cache = DraftCache(self.draft, window, bucket(tokens))
        self._draft_cache.reset(window)
        self._draft_cache.reserve(tokens)
        return self._draft_cache
