"""The DFlash draft in PyTorch: Qwen3-style layers whose keys/values also cover target context features.

Each layer's queries come from the block ([last token, mask, mask, ...] embedded with the target's
embeddings). Keys and values come from the committed context features (fc(concat of target layer
outputs) -> RMSNorm, projected per layer) followed by the block itself; the block attends to all of
them bidirectionally. Context K/V are computed once per committed position and cached; block K/V never
enter the cache. The target's embeddings and lm_head are shared, not stored here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from dflash_tui.engines.checkpoints import Dflash2Dims, DraftInfo, head_settings, layer_windows, resolve_causal
from dflash_tui.engines.cuda.attention import packed_gqa
from dflash_tui.engines.errors import CheckpointError

if TYPE_CHECKING:
    import numpy as np

    from dflash_tui.engines.guided import Guide


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding; x is [batch, heads, seq, dim], cos/sin are [batch, seq, dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class DraftAttention(nn.Module):
    def __init__(self, cfg: dict, window: Optional[int]):
        super().__init__()
        hidden, self.heads, self.kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or hidden // self.heads
        bias = bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)
        self.window = window  # a trained sliding window (layer_types == "sliding_attention") or None

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(*x.shape[:-1], heads, self.head_dim).transpose(1, 2)

    def project_context(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K/V for context features [b, n, hidden] at the positions cos/sin describe."""
        k = rotate(self.k_norm(self._split(self.k_proj(ctx), self.kv_heads)), cos, sin)
        v = self._split(self.v_proj(ctx), self.kv_heads)
        return k, v

    def forward(self, x, k_ctx, v_ctx, cos, sin, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        q = self._split(self.q_proj(x), self.heads)
        q = rotate(self.q_norm(q), cos, sin)
        k_blk, v_blk = self.project_context(x, cos, sin)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        return self._attend(x, q, k, v, mask)

    def _attend(self, x, q, k, v, mask):
        out = packed_gqa(q, k, v, mask)  # no K/V copies, the kernel every decode step uses (attention.py)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))

    def forward_buffered(self, x, k_buf, v_buf, cos, sin, span: "Span") -> torch.Tensor:
        """The block's attention over a DraftCache buffer: the block's own K/V are written just past the
        committed context (scratch, never committed) and attention reads the context and the block in place."""
        q = rotate(self.q_norm(self._split(self.q_proj(x), self.heads)), cos, sin)
        k_blk, v_blk = self.project_context(x, cos, sin)
        span.write(k_buf, k_blk)
        span.write(v_buf, v_blk)
        return self._attend(x, q, span.read(k_buf), span.read(v_buf), span.mask)


class DynamicConv(nn.Module):
    """DFlash 2's grouped dynamic depthwise convolution around one sublayer (docs/dflash2.md): one
    projection of the sublayer's normed input gives per-position coefficients for both sides, side 0
    convolves the sublayer's input and side 1 its output, over the block's positions only."""

    def __init__(self, hidden: int, taps: int, groups: int):
        super().__init__()
        self.taps, self.groups = taps, groups
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * groups, bias=False)

    def identity_(self) -> "DynamicConv":
        """Tap 0 = 1, the rest 0, no content term: the sublayer as DFlash 1 runs it."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1
            self.kernel_projection.weight.zero_()
        return self

    def coefficients(self, x: torch.Tensor, block: int) -> torch.Tensor:
        """[..., n, hidden] normed input -> [..., n // block, block, 2, taps, hidden] coefficients."""
        *lead, n, hidden = x.shape
        content = self.kernel_projection(x).view(*lead, n // block, block, 2, self.taps, self.groups, 1)
        content = content.expand(*content.shape[:-1], hidden // self.groups).reshape(*lead, n // block, block, 2,
                                                                                    self.taps, hidden)
        return self.base_kernel + content

    def convolve(self, coef: torch.Tensor, side: int, u: torch.Tensor) -> torch.Tensor:
        """Side `side` of the convolution over u [..., n, hidden], blocks of coef's block length."""
        *lead, blocks, block, _, taps, hidden = coef.shape
        u = u.reshape(*lead, blocks, block, hidden)
        out = coef[..., side, 0, :] * u
        for t in range(1, min(taps, block)):  # tap t reads t positions back; the anchor has no predecessor
            out = out + F.pad(coef[..., t:, side, t, :] * u[..., : block - t, :], (0, 0, t, 0))
        return out.reshape(*lead, blocks * block, hidden)


class DraftLayer(nn.Module):
    def __init__(self, cfg: dict, window: Optional[int], causal: bool = False, dims: Optional[Dflash2Dims] = None):
        super().__init__()
        hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = DraftAttention(cfg, window)
        self.causal = causal  # inside the block (checkpoints.resolve_causal)
        self.mlp = nn.ModuleDict(
            {
                "gate_proj": nn.Linear(hidden, inter, bias=False),
                "up_proj": nn.Linear(hidden, inter, bias=False),
                "down_proj": nn.Linear(inter, hidden, bias=False),
            }
        )
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.attention_conv = DynamicConv(hidden, dims.taps, dims.groups) if dims else None
        self.mlp_conv = DynamicConv(hidden, dims.taps, dims.groups) if dims else None

    def forward(self, h, k_ctx, v_ctx, cos, sin, mask=None, block: Optional[int] = None):
        """`block`: the length of each block along h's rows (the convolutions never cross blocks)."""
        def attend(x):
            return self.self_attn(x, k_ctx, v_ctx, cos, sin, mask)
        return self._mlp(self._wrapped(h, self.input_layernorm(h), attend, self.attention_conv, block), block)

    def forward_buffered(self, h, k_buf, v_buf, cos, sin, span: "Span"):
        def attend(x):
            return self.self_attn.forward_buffered(x, k_buf, v_buf, cos, sin, span)
        return self._mlp(self._wrapped(h, self.input_layernorm(h), attend, self.attention_conv, None), None)

    @staticmethod
    def _wrapped(h, x, sublayer, conv: Optional[DynamicConv], block: Optional[int]):
        """h + sublayer(x), with DFlash 2's convolution on both sides of the sublayer when it has one."""
        if conv is None:
            return h + sublayer(x)
        coef = conv.coefficients(x, block or x.shape[-2])
        return h + conv.convolve(coef, 1, sublayer(conv.convolve(coef, 0, x)))

    def _mlp(self, h, block: Optional[int]):
        def mlp(x):
            return self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](x)) * self.mlp["up_proj"](x))
        return self._wrapped(h, self.post_attention_layernorm(h), mlp, self.mlp_conv, block)


if TYPE_CHECKING:
    class DraftLayers(nn.ModuleList):
        """The draft's layers: an nn.ModuleList of DraftLayer (what iterating it gives, for the type checker)."""

        def __iter__(self) -> Iterator[DraftLayer]: ...
else:
    DraftLayers = nn.ModuleList


class CandidateSelector(nn.Module):
    """DFlash 2's candidate selector (docs/dflash2.md): the target head's top-K per mask slot, scored
    pairwise with the slot before, walked left to right from the verified anchor."""

    def __init__(self, hidden: int, vocab: int, dim: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden, dim, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, dim))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, dim))

    def pair_scores(self, hidden: torch.Tensor, candidates: torch.Tensor, predecessors: torch.Tensor) -> torch.Tensor:
        """<pred[a] * proj(h_s), succ[c]> for slots s: hidden [..., s, H], candidates [..., s, K],
        predecessors [..., s, P] token ids -> [..., s, P, K]."""
        z = self.hidden_projection(hidden)  # [..., s, d]
        pred = self.predecessor_codebook[predecessors] * z.unsqueeze(-2)  # [..., s, P, d]
        succ = self.successor_codebook[candidates]  # [..., s, K, d]
        return (pred @ succ.transpose(-1, -2)).float()

    def candidates(self, logits: torch.Tensor, scale) -> tuple[torch.Tensor, torch.Tensor]:
        """(unary [..., K], candidate ids [..., K]): the top-K of the raw head logits, then `scale` (the output
        multiplier and softcap) applied to their values, in vLLM's order (`compute_candidates`): a softcap
        that saturates never changes which tokens are candidates."""
        values, ids = torch.topk(logits.float(), min(self.top_k, logits.shape[-1]), dim=-1)  # sorted
        return scale(values), ids

    def walk(self, hidden: torch.Tensor, unary: torch.Tensor, candidates: torch.Tensor, anchor: torch.Tensor,
             noise: torch.Tensor, temperature: torch.Tensor, steer: Optional["Guide"] = None) -> "Proposal":
        """One block's chain: hidden [s, H] of the mask slots, their candidates' unary scores and ids [s, K]
        (`candidates`), the anchor id [1], noise [s, K] (Exp(1) draws; ones for the argmax walk) and a
        temperature tensor (1 for argmax). Each slot picks argmax(softmax(score / T) / noise): a sample of
        softmax(score / T), or with unit noise its argmax. All on the device: no host sync. With `steer` (a
        constrained request's Guide) each slot's candidates the grammar forbids after the picks before it
        are left out of its q (unless it forbids them all), which reads every pick back to the host."""
        slots = candidates.shape[0]
        listed = candidates.tolist() if steer is not None else []
        predecessors = torch.cat([anchor.view(1, 1).expand(1, candidates.shape[1]), candidates[:-1]])
        pairs = self.pair_scores(hidden, candidates, predecessors)  # [s, K (predecessor), K]
        chosen, q = [], []
        prev = torch.zeros(1, dtype=torch.long, device=unary.device)  # slot 0's predecessors are all the anchor
        for slot in range(slots):  # index_select, not pairs[slot, prev]: a tensor index would sync with the host
            score = unary[slot] + pairs[slot].index_select(0, prev)[0]
            if steer is not None:
                score = steered(score, steer.allowed(), listed[slot])
            probs = (score / temperature).softmax(-1)
            prev = (probs / noise[slot]).argmax(-1, keepdim=True)
            if steer is not None:
                steer.picked(listed[slot][int(prev)])
            chosen.append(prev)
            q.append(probs)
        index = torch.cat(chosen)
        return Proposal(candidates.gather(1, index[:, None])[:, 0], candidates, torch.stack(q))


def steered(scores: torch.Tensor, allowed: Optional["np.ndarray"], ids: Optional[list[int]] = None) -> torch.Tensor:
    """scores [n] over `ids` (every vocabulary row when None) with what a grammar's mask `allowed` forbids at
    -inf; unchanged where the mask is free (None) or forbids every one of them (that pick is refused anyway)."""
    if allowed is None:
        return scores
    keep = allowed if ids is None else allowed[ids]
    if not keep.any():
        return scores
    return scores.masked_fill(~torch.from_numpy(keep).to(scores.device), float("-inf"))


class Proposal:
    """A drafted block's ids [s] and, for a DFlash 2 draft, the distribution each was drawn from: the
    candidates [s, K] and their probabilities q [s, K] (None for DFlash 1's argmax)."""

    def __init__(self, ids: torch.Tensor, candidates: Optional[torch.Tensor] = None, q: Optional[torch.Tensor] = None):
        self.ids, self.candidates, self.q = ids, candidates, q

    def first(self, n: int) -> "Proposal":
        """The first n slots (a shrunk last block run padded to the captured size)."""
        if n == self.ids.shape[0]:
            return self
        return Proposal(self.ids[:n], *(t[:n] if t is not None else None for t in (self.candidates, self.q)))


def rope_config(cfg: dict):
    """A transformers Qwen3Config carrying the draft's rope settings (default, yarn, ...)."""
    from transformers import Qwen3Config

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
            "rope_theta", "rope_scaling", "rope_parameters")
    return Qwen3Config(**{k: cfg[k] for k in keys if cfg.get(k) is not None})


def rotary_embedding(cfg: dict) -> nn.Module:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    return Qwen3RotaryEmbedding(rope_config(cfg))


class DFlashDraft(nn.Module):
    def __init__(self, cfg: dict, dims: Optional[Dflash2Dims] = None):
        super().__init__()
        self.config = cfg
        dflash = cfg["dflash_config"]
        self.target_layer_ids: list[int] = list(dflash["target_layer_ids"])
        self.mask_token_id: int = int(dflash["mask_token_id"])
        self.block_size: int = int(cfg.get("block_size", 16))
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.dims = dims
        self.layers = DraftLayers(DraftLayer(cfg, w, c, dims) for w, c in zip(layer_windows(cfg), resolve_causal(cfg)))
        self.norm = RMSNorm(hidden, eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.rotary = rotary_embedding(cfg)
        # dflash_config's scales (checkpoints.head_settings); the embedding scale is DFlash 2's alone, as in vLLM
        embedding_scale, self.logit_multiplier, self.logit_softcap = head_settings(cfg)
        self.embedding_scale = embedding_scale if dims else 1.0
        self.candidate_selector = (CandidateSelector(hidden, cfg["vocab_size"], dims.selector_dim, dims.top_k)
                                   if dims else None)

    @classmethod
    def load(cls, info: DraftInfo, device, dtype) -> "DFlashDraft":
        from safetensors.torch import load_file

        with torch.device("meta"):
            vocab = info.vocab_size or (info.weight_shapes.get("candidate_selector.predecessor_codebook") or [0])[0]
            model = cls({**info.config, "vocab_size": vocab}, info.dflash2)
        state: dict[str, torch.Tensor] = {}
        for file in sorted(Path(info.path).glob("*.safetensors")):
            state.update(load_file(str(file)))
        state = {k.removeprefix("model."): v for k, v in state.items()}
        expected = set(model.state_dict())
        missing = sorted(expected - set(state))
        if missing:
            raise CheckpointError(f"The draft {info.path} lacks weights {missing[:3]}; the checkpoint is incomplete, re-download it.")
        state = {k: v for k, v in state.items() if k in expected}  # the public drafts may carry unused extras
        model.load_state_dict(state, assign=True, strict=True)
        model.rotary = nn.Identity()  # (its frequencies are on the meta device: not moved, replaced below)
        model = model.to(device=device, dtype=dtype).eval()
        # Rotary frequencies are not in the checkpoint and stay float32 whatever the weights' dtype.
        model.rotary = rotary_embedding(info.config).to(device)
        model.embedding_scale = info.embedding_scale
        model.logit_multiplier, model.logit_softcap = info.logit_multiplier, info.logit_softcap
        return model

    def embed(self, embedding: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The block's input embeddings: the target's, times input_embedding_scale."""
        x = embedding(ids)
        return x * self.embedding_scale if self.embedding_scale != 1.0 else x

    def head_logits(self, hidden: torch.Tensor, lm_head: nn.Linear) -> torch.Tensor:
        """The target head's raw logits for draft hidden states (the selector takes its top-K of these)."""
        return lm_head(hidden.to(lm_head.weight.device))

    def as_target_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Head logits (or their top-K values) times dflash_config.output_multiplier, then softcapped by
        dflash_config.final_logit_softcapping."""
        if self.logit_multiplier != 1.0:
            logits = logits * self.logit_multiplier
        if self.logit_softcap:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def propose(self, hidden: torch.Tensor, anchor: torch.Tensor, lm_head: nn.Linear, noise=None,
                temperature=None, steer: Optional["Guide"] = None) -> Proposal:
        """The drafted ids for a block's mask slots from its hidden states [1, b, H]: DFlash 1 takes each
        slot's argmax, DFlash 2 walks its selector (noise/temperature: CandidateSelector.walk). `steer`: a
        constrained request's Guide; each slot then picks among what the grammar allows after the picks
        before it (engines/guided.py)."""
        logits = self.head_logits(hidden[0, 1:], lm_head)
        if self.candidate_selector is None:
            if steer is None:
                return Proposal(logits.argmax(dim=-1))
            picks = []
            for row in logits:
                picks.append(int(steered(row, steer.allowed()).argmax()))
                steer.picked(picks[-1])
            return Proposal(torch.tensor(picks, dtype=torch.long, device=logits.device))
        if noise is None:
            noise = torch.ones(logits.shape[0], self.candidate_selector.top_k, device=logits.device)
            temperature = torch.ones((), device=logits.device)
        unary, candidates = self.candidate_selector.candidates(logits, self.as_target_scores)
        return self.candidate_selector.walk(hidden[0, 1:].to(logits.device), unary, candidates, anchor, noise,
                                            temperature, steer)

    def rope(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin for positions [b, n], in the dtype of `like`."""
        return self.rotary(like, positions)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """fc(concat of target layer outputs) -> RMSNorm: [b, n, len(ids)*hidden] -> [b, n, hidden]."""
        return self.hidden_norm(self.fc(features))

    def block_hidden(self, block_embeds, k_ctx: list, v_ctx: list, positions, masks: Optional[list] = None,
                     block: Optional[int] = None) -> torch.Tensor:
        """Final normed hidden states of the blocks along block_embeds' rows (each `block` long) given each
        layer's context K/V and attention mask (None: everything visible)."""
        cos, sin = self.rope(positions, block_embeds)
        h = block_embeds
        for i, (layer, k, v) in enumerate(zip(self.layers, k_ctx, v_ctx)):
            h = layer(h, k, v, cos, sin, masks[i] if masks else None, block)
        return self.norm(h)

    def block_hidden_buffered(self, block_embeds, cache: "DraftCache", positions, spans: list["Span"]) -> torch.Tensor:
        """block_hidden over the cache's buffers in place (no copy of the context), one Span per layer."""
        cos, sin = self.rope(positions, block_embeds)
        h = block_embeds
        for layer, k, v, span in zip(self.layers, cache.k_buffers, cache.v_buffers, spans):
            h = layer.forward_buffered(h, k, v, cos, sin, span)
        return self.norm(h)


def visible(queries: torch.Tensor, keys: torch.Tensor, start, causal: bool, window: Optional[int]) -> torch.Tensor:
    """Which keys (absolute positions [..., m]) each block query (absolute positions [..., n]) sees, for a
    block starting at `start`: every context row (< start) and, unless the layer is causal, every block row;
    a sliding layer of window w only rows less than w positions away: back, and for a bidirectional layer
    ahead too, as vLLM's symmetric window for non-causal attention (docs/dflash2.md)."""
    q, k = queries[..., :, None], keys[..., None, :]
    ok = (k < start) | (k <= q) if causal else torch.ones_like(q > k)
    return ok & ((q - k).abs() < window) if window else ok


class Span:
    """Where a block sits in a draft layer's buffer and what it attends to.

    Eager: python ints; the block is written at [start, start + n) and attention reads [lo, start + n).
    Graph path (`positions` set): the block is written at device positions and attention reads the buffer
    up to `reach` (the step's tier) under a mask (lo <= slot < start + n), so shapes stay fixed per graph."""

    def __init__(self, lo=0, start=0, n=0, positions: Optional[torch.Tensor] = None, mask=None, reach: int = 0):
        self.lo, self.start, self.n, self.positions, self.mask, self.reach = lo, start, n, positions, mask, reach

    def write(self, buf: torch.Tensor, x: torch.Tensor) -> None:
        if self.positions is not None:
            buf.index_copy_(2, self.positions, x)
        else:
            buf[:, :, self.start: self.start + self.n] = x

    def read(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[:, :, : self.reach] if self.positions is not None else buf[:, :, self.lo: self.start + self.n]


class DraftCache:
    """Per-layer K/V of committed context features (positions < start) in preallocated buffers sized in
    buckets (engines/cuda/cache.py); the block attends to at most the last `window` of them (and to a
    layer's trained sliding window). Appending writes in place; the block's own K/V go just past the
    committed length as scratch, so the buffers also hold one block beyond the context."""

    def __init__(self, draft: DFlashDraft, window: Optional[int], capacity: Optional[int] = None):
        from dflash_tui.engines.cuda.cache import BUCKET

        self.draft = draft
        self.capacity = capacity or BUCKET
        # per layer K/V [1, kv_heads, capacity, head_dim]: none until the first use gives their device and dtype
        self.k_buffers: list[torch.Tensor] = []
        self.v_buffers: list[torch.Tensor] = []
        self.length = 0
        self.windows: list[Optional[int]] = []
        self.reset(window)

    @property
    def k_bufs(self) -> list[Optional[torch.Tensor]]:
        """Each layer's K buffer, None before the first use."""
        return list(self.k_buffers) if self.k_buffers else [None] * len(self.draft.layers)

    @property
    def v_bufs(self) -> list[Optional[torch.Tensor]]:
        return list(self.v_buffers) if self.v_buffers else [None] * len(self.draft.layers)

    def reset(self, window: Optional[int], keep: int = 0) -> None:
        """A new window; the first `keep` committed positions stay (the whole context K/V is kept, the
        window only limits what a block reads, so a shorter prefix reads what a fresh run would)."""
        self.length = min(keep, self.length) if keep else 0  # committed positions covered (including ones outside the window)
        self.windows = [min(w for w in (window, layer.self_attn.window) if w) if (window or layer.self_attn.window)
                        else None for layer in self.draft.layers]

    def reserve(self, tokens: int, like: Optional[torch.Tensor] = None) -> None:
        """Room for `tokens` positions; allocates (zeroed) on first use, grows only past the bucket."""
        from dflash_tui.engines.cuda.cache import bucket

        old_k, old_v = self.k_buffers, self.v_buffers
        if old_k and tokens <= self.capacity:
            return
        self.capacity = max(self.capacity, bucket(tokens))
        if old_k:  # grown: the committed positions are copied over
            refs = old_k
        elif like is not None:
            refs = [like] * len(self.draft.layers)
        else:  # allocated at this capacity on first use
            return
        self.k_buffers, self.v_buffers = [], []
        for i, (layer, ref) in enumerate(zip(self.draft.layers, refs)):
            att = layer.self_attn
            shape = (1, att.kv_heads, self.capacity, att.head_dim)
            k_buf, v_buf = ref.new_zeros(shape), ref.new_zeros(shape)
            self.k_buffers.append(k_buf)
            self.v_buffers.append(v_buf)
            if old_k:
                k_buf[:, :, : self.length] = old_k[i][:, :, : self.length]
                v_buf[:, :, : self.length] = old_v[i][:, :, : self.length]

    def _lo(self, i: int) -> int:
        window = self.windows[i]
        return max(0, self.length - window) if window else 0

    @property
    def keys(self) -> list[torch.Tensor]:
        """Each layer's context keys the next block attends to (views of the buffers)."""
        return [k[:, :, self._lo(i): self.length] for i, k in enumerate(self.k_buffers)]

    @property
    def values(self) -> list[torch.Tensor]:
        return [v[:, :, self._lo(i): self.length] for i, v in enumerate(self.v_buffers)]

    def project(self, features: torch.Tensor, positions: torch.Tensor):
        """Per-layer (k, v) of context features [b, n, F] at `positions` [1, n]."""
        ctx = self.draft.context(features)
        cos, sin = self.draft.rope(positions, ctx)
        return [layer.self_attn.project_context(ctx, cos, sin) for layer in self.draft.layers]

    def append(self, features: torch.Tensor) -> None:
        """Project and store context features for positions length..length+n-1."""
        n = features.shape[1]
        positions = torch.arange(self.length, self.length + n, device=features.device).unsqueeze(0)
        kv = self.project(features, positions)
        self.reserve(self.length + n, like=kv[0][0])
        for k_buf, v_buf, (k, v) in zip(self.k_buffers, self.v_buffers, kv):
            k_buf[:, :, self.length: self.length + n] = k
            v_buf[:, :, self.length: self.length + n] = v
        self.length += n

    def write_static(self, features: torch.Tensor, positions: torch.Tensor) -> None:
        """Graph path: K/V of features [1, n, F] written at device `positions` [n]; the caller then moves
        `length` past the ones it commits (the rest are overwritten by the next block)."""
        for k_buf, v_buf, (k, v) in zip(self.k_buffers, self.v_buffers, self.project(features, positions[None])):
            k_buf.index_copy_(2, positions, k)
            v_buf.index_copy_(2, positions, v)

    def hidden(self, block_embeds: torch.Tensor) -> torch.Tensor:
        """The draft's final hidden states for a block [1, b, hidden] placed at positions length.."""
        start, n = self.length, block_embeds.shape[1]
        self.reserve(start + n, like=block_embeds)
        positions = torch.arange(start, start + n, device=block_embeds.device).unsqueeze(0)
        spans = []
        for i, layer in enumerate(self.draft.layers):
            lo, window = self._lo(i), layer.self_attn.window
            mask = None
            if layer.causal or window:
                keys = torch.arange(lo, start + n, device=positions.device)
                mask = visible(positions[0], keys, start, layer.causal, window)[None, None]
            spans.append(Span(lo, start, n, mask=mask))
        return self.draft.block_hidden_buffered(block_embeds, self, positions, spans)

    def static_hidden(self, block_embeds: torch.Tensor, positions: torch.Tensor, reach: int) -> torch.Tensor:
        """Graph path: the same at device `positions` [n] (= start..start+n-1), over the buffer up to `reach`."""
        slots = torch.arange(reach, device=positions.device)
        start, end = positions[0], positions[-1]
        masks = {}
        spans = []
        for w, layer in zip(self.windows, self.draft.layers):
            key = (w, layer.causal, layer.self_attn.window)
            if key not in masks:
                lo = (start - w).clamp(min=0) if w else 0
                mask = ((slots >= lo) & (slots <= end))[None, :]
                if layer.causal or layer.self_attn.window:
                    mask = mask & visible(positions, slots, start, layer.causal, layer.self_attn.window)
                masks[key] = mask[None, None]
            spans.append(Span(positions=positions, mask=masks[key], reach=reach))
        return self.draft.block_hidden_buffered(block_embeds, self, positions[None], spans)

    def propose(self, block: torch.Tensor, embed: nn.Module, lm_head: nn.Linear, noise=None,
                temperature=None, steer: Optional["Guide"] = None) -> Proposal:
        """The drafted ids for block positions 1.. ([b-1]); block is [1, b] = [last token, mask...]."""
        hidden = self.hidden(self.draft.embed(embed, block))
        return self.draft.propose(hidden, block[0, :1], lm_head, noise, temperature, steer)

    def entries(self) -> int:
        """Context positions the next block attends to (in the first layer)."""
        return self.length - self._lo(0)


def save_draft(model: DFlashDraft, out_dir: Path, dtype: Optional[torch.dtype] = None) -> None:
    """Write config.json + model.safetensors in the public DFlash layout."""
    import json

    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = dict(model.config)
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
