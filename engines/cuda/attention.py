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
cached) keeps SDPA's causal flash path, except past head size 256 (Gemma 4's global layers), which flash
does not take: there the prompt's K/V heads are repeated and the memory-efficient kernel runs it
(`causal_prefill`).

Learned attention sinks (gpt-oss: one logit per query head that joins every softmax and carries no
value) are one extra key column: K and V get a zero column, and the mask becomes an additive float bias
whose last column is the head's sink logit (q . 0 = 0, so that column's logit is exactly the sink; its
value 0 adds nothing to the output). transformers' eager gpt-oss attention computes the same softmax over
[scores, sink] and drops the sink's column. The cost: one copy of the K/V read (the concatenation, as
transformers' own SDPA path pays for `repeat_kv`) and a float bias per head instead of a shared boolean
mask; sliding layers read at most their window, so it is the full-attention layers that pay. It keeps
the kernel family and the fixed shapes the graph path needs.

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


def sink_bias(mask: torch.Tensor, sinks: torch.Tensor, heads: int) -> torch.Tensor:
    """The additive bias [b, heads, n, s + 1] for a boolean `mask` broadcastable to [b, 1, n, s]: 0 where
    attending, -inf elsewhere, and each head's sink logit in the extra last column."""
    b, _, n, s = mask.shape
    zero = torch.zeros((), dtype=sinks.dtype, device=mask.device)
    bias = torch.where(mask, zero, torch.full((), float("-inf"), dtype=sinks.dtype, device=mask.device))
    bias = bias.expand(b, heads, n, s)
    return torch.cat([bias, sinks.reshape(1, heads, 1, 1).expand(b, heads, n, 1)], dim=-1)


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                   sinks: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """softmax over [q k^T * scale (masked), sink] times [v, 0], for q [b, hq, n, d], k/v [b, hkv, s, d],
    `sinks` [hq] and a boolean mask broadcastable to [b, 1, n, s] (None: attend everywhere); [b, hq, n, d].
    One SDPA call with the sink as a zero key column whose bias is the sink logit (see the module's note)."""
    b, hq, n, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if mask is None:
        mask = torch.ones(1, 1, n, s, dtype=torch.bool, device=q.device)
    mask = mask.expand(mask.shape[0], 1, n, s)
    bias = sink_bias(mask, sinks.to(q.dtype), hq)
    k = torch.cat([k, k.new_zeros(b, hkv, 1, k.shape[3])], dim=2)
    v = torch.cat([v, v.new_zeros(b, hkv, 1, v.shape[3])], dim=2)
    if q.device.type == "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=hq != hkv)
    return packed_bias_sdpa(q, k, v, bias, scale)


def packed_bias_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                     scale: Optional[float] = None) -> torch.Tensor:
    """SDPA with a per-head additive `bias` [b, hq, n, s], the query heads of each K/V head packed into
    rows as in `packed_sdpa` (head j * groups + i's rows sit in K/V head j's block, and so do its bias rows)."""
    b, hq, n, d = q.shape
    hkv = k.shape[1]
    groups = hq // hkv
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, groups * n, d), k, v,
                                         attn_mask=bias.reshape(bias.shape[0], hkv, groups * n, bias.shape[-1]),
                                         scale=scale)
    return out.reshape(b, hq, n, v.shape[-1])


FLASH_HEAD_DIM = 256  # the largest head size CUDA's flash kernel takes


def causal_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """Causal SDPA over a prompt (q, k, v of the same length). Flash takes grouped K/V up to head size 256; past
    it (Gemma 4's global layers, 512) no fused CUDA kernel takes grouped K/V, and SDPA would fall back to the
    math path, which materializes every score. There the K/V heads are repeated for their query heads (a copy
    of the prompt's K/V, as transformers' own SDPA path makes) and the memory-efficient kernel runs it."""
    groups = q.shape[1] // k.shape[1]
    if q.device.type != "cpu" and q.shape[-1] > FLASH_HEAD_DIM and groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def causal_mask(n: int, s: int, device) -> torch.Tensor:
    """[1, 1, n, s]: the n queries are the last n of the s keys, each attending to itself and before."""
    rows = torch.arange(n, device=device)[:, None] + (s - n)
    return (torch.arange(s, device=device)[None, :] <= rows)[None, None]


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention-function interface over `packed_gqa` (outputs [b, n, hq, d], no weights);
    a layer with learned sinks (gpt-oss passes them as `s_aux`) goes through `sink_attention`. Sliding
    windows arrive in the mask (and in the K/V a sliding cache layer returns)."""
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        raise ValueError("packed_gqa does not implement soft-capping or position biases")
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    n = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask == 0  # an additive float mask: 0 where attending
    if sinks is not None:
        if attention_mask is None and n > 1 and causal:
            attention_mask = causal_mask(n, key.shape[2], query.device)
        out = sink_attention(query, key, value, attention_mask, sinks, scaling)
    elif attention_mask is None and n > 1 and causal:  # a prefill into an empty cache: the causal flash path
        out = causal_prefill(query, key[:, :, :n], value[:, :, :n], scaling)
    else:
        out = packed_gqa(query, key, value, attention_mask, scaling)
    return out.transpose(1, 2).contiguous(), None


def use_for(model) -> None:
    """Run `model`'s attention layers through `attention_forward` (masks built as for SDPA)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
