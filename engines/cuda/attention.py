"""Attention for the decode steps: grouped-query attention without copying K/V, under one kernel family.

transformers' SDPA wrapper repeats every K/V head `groups` times (`repeat_kv`, a copy of the whole cache
per layer) whenever a mask is given, because CUDA's masked SDPA kernels take no `enable_gqa`. A decode
step always has a mask here (a verify block over cached context; the graph path's fixed-length reads),
so instead the query heads that share a K/V head are packed into the query rows: q [b, kv * g, n, d]
becomes [b, kv, g * n, d] and the mask's rows repeat g times. That is exactly the same product, reads
each K/V head once, and runs on SDPA's memory-efficient kernel, which takes any mask and head size (the
math fallback it would otherwise hit is the slow path at head_dim 512).

Every step, eager or replayed, goes through `packed_gqa` with a boolean mask (a decode step without one
gets an all-true mask), so eager and graph steps take the same kernel and bf16 ids do not depend on the
path. The CPU has no graph path to agree with, and its SDPA kernels take grouped K/V with a mask
(`enable_gqa`), so there the call goes straight to them. A prefill (several queries, no mask, nothing
cached) keeps SDPA's causal flash path.

`use_for(model)` registers the function with transformers as "packed_gqa" and switches the model to it.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

NAME = "packed_gqa"  # no "flash" in it: transformers takes such names for flash-attention kernels


def packed_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               scale: Optional[float] = None) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v for q [b, hq, n, d], k/v [b, hkv, s, d] (hq a multiple of hkv) and a
    boolean mask broadcastable to [b, 1, n, s] (True: attend; None: attend everywhere); returns [b, hq, n, d]."""
    if q.device.type == "cpu":  # no graph path to agree with, and the CPU kernels take GQA with a mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return packed_sdpa(q, k, v, mask, scale)


def packed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                scale: Optional[float] = None) -> torch.Tensor:
    """`packed_gqa` off the CPU: the query heads of each K/V head packed into rows, one masked SDPA call."""
    b, hq, n, d = q.shape
    groups = hq // k.shape[1]
    if mask is None:
        mask = torch.ones(1, 1, 1, k.shape[2], dtype=torch.bool, device=q.device)
    if groups > 1:
        q = q.reshape(b, k.shape[1], groups * n, d)
        mask = mask.expand(*mask.shape[:2], n, mask.shape[-1]).repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, hq, n, v.shape[-1])


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention-function interface over `packed_gqa` (outputs [b, n, hq, d], no weights)."""
    if kwargs.get("sinks") is not None or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        raise ValueError("packed_gqa does not implement attention sinks, soft-capping or position biases")
    n = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and n > 1 and causal:  # a prefill into an empty cache: the causal flash path
        out = F.scaled_dot_product_attention(query, key[:, :, :n], value[:, :, :n], is_causal=True, scale=scaling,
                                             enable_gqa=query.shape[1] != key.shape[1])
    else:
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            attention_mask = attention_mask == 0  # an additive float mask: 0 where attending
        out = packed_gqa(query, key, value, attention_mask, scaling)
    return out.transpose(1, 2).contiguous(), None


def use_for(model) -> None:
    """Run `model`'s attention layers through `attention_forward` (masks built as for SDPA)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
