"""The DFlash draft in MLX: the same module as engines/cuda/draft.py, loading the same safetensors.

Each layer's queries come from the block ([last token, mask, mask, ...] embedded with the target's
embeddings, times input_embedding_scale). Keys and values come from the committed context features
(fc(concat of target layer outputs) -> RMSNorm, projected per layer with k_norm and RoPE at their own
positions) followed by the block itself. Inside the block a layer is causal or not as
checkpoints.resolve_causal decides, and a sliding layer's query at position t sees keys at positions
above t - window (docs/dflash2.md); otherwise everything is visible. Context K/V are computed once per
committed position and kept in `DraftCache`, read through the draft window (and a layer's trained sliding
window); block K/V never enter the cache. The target's embeddings and lm_head are shared, not stored here.

A DFlash 2 draft adds a dynamic convolution on both sides of every attention and MLP, and a candidate
selector that walks the mask slots' top-K head candidates from the anchor (docs/dflash2.md): by argmax at
temperature 0, else sampling each slot from q = softmax(score / T) with exponential noise, keeping q.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, cast

import mlx.core as mx
import mlx.nn as nn

from dflash_tui.engines.checkpoints import Dflash2Dims, DraftInfo, attention_window, head_settings, layer_windows, resolve_causal
from dflash_tui.engines.errors import CheckpointError

if TYPE_CHECKING:
    import numpy as np

    from dflash_tui.engines.guided import Guide


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

    def __call__(self, x: mx.array, k_ctx: mx.array, v_ctx: mx.array, offset: int,
                 mask: Optional[mx.array] = None) -> mx.array:
        """`mask` [n, context + n] booleans (True: visible), None: everything visible."""
        b, n, _ = x.shape
        q = self.rope(self.q_norm(self._split(self.q_proj(x), self.heads)), offset=offset)
        k_blk, v_blk = self.project_context(x, offset)
        k = mx.concatenate([k_ctx, k_blk], axis=2)
        v = mx.concatenate([v_ctx, v_blk], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


def visible(first: int, start: int, n: int, causal: bool, window: Optional[int]) -> Optional[mx.array]:
    """[n, start - first + n] booleans: which keys (context positions first..start-1, then the block at
    start..start+n-1) each block query (positions start..start+n-1) sees; None when it sees all of them.
    Causal: block rows up to its own; a sliding window w: keys less than w positions away (back, and for a
    bidirectional layer ahead too, as vLLM's symmetric window)."""
    if not causal and not window:
        return None
    queries = mx.arange(start, start + n)[:, None]
    keys = mx.arange(first, start + n)[None, :]
    ok = (keys < start) | (keys <= queries) if causal else mx.ones((n, keys.shape[1]), dtype=mx.bool_)
    return ok & (mx.abs(queries - keys) < window) if window else ok


class DynamicConv(nn.Module):
    """DFlash 2's grouped dynamic depthwise convolution around one sublayer: one projection of the
    sublayer's normed input gives per-position coefficients for both sides (base_kernel + the group's
    content term); side 0 convolves the sublayer's input, side 1 its output, over the block only."""

    def __init__(self, hidden: int, taps: int, groups: int):
        super().__init__()
        self.taps, self.groups = taps, groups
        self.base_kernel = mx.zeros((2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * groups, bias=False)

    def coefficients(self, x: mx.array) -> mx.array:
        """[b, n, hidden] -> [b, n, 2, taps, hidden]; channel ch reads group ch // (hidden / groups)."""
        b, n, hidden = x.shape
        content = self.kernel_projection(x).reshape(b, n, 2, self.taps, self.groups, 1)
        content = mx.broadcast_to(content, (b, n, 2, self.taps, self.groups, hidden // self.groups))
        return self.base_kernel + content.reshape(b, n, 2, self.taps, hidden)

    @staticmethod
    def convolve(coef: mx.array, side: int, u: mx.array) -> mx.array:
        """sum over taps t of coef[:, i, side, t] * u[:, i - t] (zero before the anchor)."""
        n = u.shape[1]
        out = coef[:, :, side, 0] * u
        for t in range(1, min(coef.shape[3], n)):
            shifted = mx.pad(u[:, : n - t], [(0, 0), (t, 0), (0, 0)])
            out = out + coef[:, :, side, t] * shifted
        return out


def wrapped(h: mx.array, x: mx.array, sublayer, conv: Optional[DynamicConv]) -> mx.array:
    """h + sublayer(x), with DFlash 2's convolution on both sides of the sublayer when it has one."""
    if conv is None:
        return h + sublayer(x)
    coef = conv.coefficients(x)
    return h + conv.convolve(coef, 1, sublayer(conv.convolve(coef, 0, x)))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: dict, window: Optional[int], causal: bool = False, dims: Optional[Dflash2Dims] = None):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = DraftAttention(cfg, window)
        self.causal = causal  # inside the block (checkpoints.resolve_causal)
        self.mlp = MLP(hidden, cfg["intermediate_size"])
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)
        if dims is not None:
            self.attention_conv = DynamicConv(hidden, dims.taps, dims.groups)
            self.mlp_conv = DynamicConv(hidden, dims.taps, dims.groups)

    def __call__(self, h, k_ctx, v_ctx, offset: int, mask: Optional[mx.array] = None):
        def attend(x):
            return self.self_attn(x, k_ctx, v_ctx, offset, mask)

        h = wrapped(h, self.input_layernorm(h), attend, self.get("attention_conv"))
        return wrapped(h, self.post_attention_layernorm(h), self.mlp, self.get("mlp_conv"))


def steered(scores: mx.array, allowed: Optional[np.ndarray], ids: Optional[list[int]] = None) -> mx.array:
    """scores [n] over `ids` (every vocabulary row when None) with what a grammar's mask `allowed` forbids at
    -inf; unchanged where the mask is free (None) or forbids every one of them (engines/cuda/draft.py's)."""
    if allowed is None:
        return scores
    keep = allowed if ids is None else allowed[ids]
    if not keep.any():
        return scores
    return mx.where(mx.array(keep), scores, mx.array(-float("inf"), dtype=scores.dtype))


class CandidateSelector(nn.Module):
    """DFlash 2's candidate selector: per mask slot the target head's top-K logits, scored against the
    token chosen at the slot before (the anchor for slot 0):
    score(a, c) = unary[c] + sum_d predecessor_codebook[a, d] * z[d] * successor_codebook[cand[c], d],
    z = hidden_projection(h)."""

    def __init__(self, hidden: int, vocab: int, dim: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden, dim, bias=False)
        self.predecessor_codebook = mx.zeros((vocab, dim))
        self.successor_codebook = mx.zeros((vocab, dim))

    def walk(self, hidden: mx.array, logits: mx.array, anchor: mx.array, temperature: float = 0.0,
             noise: Optional[mx.array] = None, scale=None,
             steer: Optional[Guide] = None) -> tuple[mx.array, mx.array, Optional[mx.array]]:
        """hidden [s, H] and raw head logits [s, V] of the mask slots, the anchor id [1]. The candidates are
        the top-K of the raw logits; `scale` (the output multiplier and softcap) then applies to their values,
        in vLLM's order (a saturating softcap never changes the candidate set). Returns the drafted ids [s]
        (int32), the candidates [s, K] and, at temperature > 0, q [s, K] (float32) each slot was sampled from
        as argmax(q / noise) with noise [s, K] of Exp(1) draws. Lazy: no host sync. With `steer` (a
        constrained request's Guide) each slot leaves out the candidates the grammar forbids after the picks
        before it (engines/cuda/draft.py's walk), reading every pick back to the host."""
        k = min(self.top_k, logits.shape[-1])
        logits = logits.astype(mx.float32)
        part = mx.argpartition(-logits, kth=k - 1, axis=-1)[:, :k]
        values = mx.take_along_axis(logits, part, axis=-1)
        order = mx.argsort(-values, axis=-1)  # highest first: ties in the walk go to the higher logit
        candidates = mx.take_along_axis(part, order, axis=-1)
        unary = mx.take_along_axis(values, order, axis=-1)
        if scale is not None:
            unary = scale(unary)
        z = self.hidden_projection(hidden).astype(mx.float32)  # [s, d]
        succ = self.successor_codebook[candidates].astype(mx.float32) * z[:, None, :]  # [s, K, d]
        prev, ids, rows = anchor.reshape(1), [], []
        if temperature > 0 and noise is None:
            raise ValueError("a sampled walk needs its noise (Exp(1) draws [s, K])")
        listed = cast(list[list[int]], candidates.tolist()) if steer is not None else []
        for slot in range(candidates.shape[0]):
            pred = self.predecessor_codebook[prev].astype(mx.float32)  # [1, d]
            score = unary[slot] + (succ[slot] @ pred[0])
            if steer is not None:
                score = steered(score, steer.allowed(), listed[slot])
            if noise is not None and temperature > 0:  # sampled: each slot's q kept
                q = mx.softmax(score / temperature, axis=-1)
                pick = mx.argmax(q / noise[slot], axis=-1)
                rows.append(q)
            else:  # the argmax walk (the same steps without q)
                pick = mx.argmax(score, axis=-1)
            prev = mx.take(candidates[slot], pick.reshape(1))
            if steer is not None:
                steer.picked(listed[slot][cast(int, pick.item())])
            ids.append(prev)
        return mx.concatenate(ids).astype(mx.int32), candidates, mx.stack(rows) if rows else None


class DFlashDraft(nn.Module):
    def __init__(self, cfg: dict, info: Optional[DraftInfo] = None):
        """`info` (DraftInfo.read, completed by validate_pair) brings the DFlash 2 sizes and the head's
        logit settings; without it the config alone decides (a DFlash 1 draft)."""
        super().__init__()
        self.config = cfg
        dflash = cfg["dflash_config"]
        self.target_layer_ids: list[int] = list(dflash["target_layer_ids"])
        self.mask_token_id: int = int(dflash["mask_token_id"])
        self.block_size: int = int(cfg.get("block_size", 16))
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        dims = info.dflash2 if info is not None else None
        causal = info.causal if info is not None and info.causal else resolve_causal(cfg)
        self.layers = [DraftLayer(cfg, w, c, dims) for w, c in zip(layer_windows(cfg), causal)]
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = nn.RMSNorm(hidden, eps=eps)
        if info is not None:
            self.embedding_scale = info.embedding_scale
            self.logit_multiplier, self.logit_softcap = info.logit_multiplier, info.logit_softcap
        else:  # a DFlash 1 draft from its config: dflash_config's head settings (the embedding scale is DFlash 2's)
            _, self.logit_multiplier, self.logit_softcap = head_settings(cfg)
            self.embedding_scale = 1.0
        if info is not None and dims is not None:
            vocab = (info.weight_shapes.get("candidate_selector.predecessor_codebook") or [info.vocab_size])[0]
            self.candidate_selector = CandidateSelector(hidden, vocab, dims.selector_dim, dims.top_k)

    @property
    def selector(self) -> Optional[CandidateSelector]:
        """The candidate selector of a DFlash 2 draft (None for DFlash 1)."""
        return self.get("candidate_selector")

    @classmethod
    def load(cls, info: DraftInfo, dtype: mx.Dtype) -> "DFlashDraft":
        """The draft from its safetensors (`model.` prefixes dropped, unused extras ignored), in `dtype`."""
        from mlx.utils import tree_flatten

        model = cls(info.config, info)
        weights: dict[str, mx.array] = {}
        for file in sorted(Path(info.path).glob("*.safetensors")):
            # (mx.load's return type covers every format; a .safetensors file gives a dict of arrays)
            weights.update(cast(dict[str, mx.array], mx.load(str(file))))
        weights = {k.removeprefix("model."): v for k, v in weights.items()}
        # (typed list-or-dict: without `destination` it is the list of (name, array) pairs)
        expected = {k for k, _ in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))}
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

    def embed(self, embedding, ids: mx.array) -> mx.array:
        """The block's input embeddings: the target's, times input_embedding_scale."""
        x = embedding(ids)
        return x * self.embedding_scale if self.embedding_scale != 1.0 else x

    def head_logits(self, hidden: mx.array, lm_head) -> mx.array:
        """The target head's raw logits for draft hidden states (float32): the selector's top-K reads these."""
        return lm_head(hidden).astype(mx.float32)

    def as_target_scores(self, logits: mx.array) -> mx.array:
        """Logits (or their top-K values) times dflash_config.output_multiplier, then softcapped by
        dflash_config.final_logit_softcapping."""
        if self.logit_multiplier != 1.0:
            logits = logits * self.logit_multiplier
        if self.logit_softcap:
            logits = mx.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def block_hidden(self, block_embeds: mx.array, k_ctx: list, v_ctx: list, offset: int,
                     masks: Optional[list] = None) -> mx.array:
        """Final normed hidden states of the block (at positions offset..) given each layer's context K/V
        and visibility mask (None: everything visible)."""
        h = block_embeds
        for i, (layer, k, v) in enumerate(zip(self.layers, k_ctx, v_ctx)):
            h = layer(h, k, v, offset, masks[i] if masks else None)
        return self.norm(h)

    def propose(self, hidden: mx.array, anchor: mx.array, lm_head, temperature: float = 0.0,
                noise: Optional[mx.array] = None, steer: Optional[Guide] = None) -> tuple[mx.array, Optional[mx.array]]:
        """Drafted ids [s] for the mask slots of hidden [1, b, H] and, for a DFlash 2 draft sampled at
        temperature > 0, the dense rows q [s, vocab] they were drawn from (else None). DFlash 1 takes each
        slot's argmax; DFlash 2 walks its selector from `anchor` [1]. `steer`: a constrained request's
        Guide; each slot then picks among what the grammar allows after the picks before it."""
        slots = hidden[0, 1:]
        if self.selector is None:
            if steer is None:
                return mx.argmax(lm_head(slots), axis=-1).astype(mx.int32), None
            head, picks = lm_head(slots), []
            for slot in range(head.shape[0]):
                picks.append(cast(int, mx.argmax(steered(head[slot], steer.allowed())).item()))
                steer.picked(picks[-1])
            return mx.array(picks, dtype=mx.int32), None
        logits = self.head_logits(slots, lm_head)
        ids, candidates, q = self.selector.walk(slots, logits, anchor, temperature, noise, self.as_target_scores,
                                                steer)
        if q is None:
            return ids, None
        return ids, mx.put_along_axis(mx.zeros(logits.shape, dtype=mx.float32), candidates, q, axis=-1)


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
        # per layer K/V buffers, each made when its layer first stores (then the same for every layer)
        self._keys: list[mx.array] = []
        self._values: list[mx.array] = []

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
        first = i == len(self._keys)  # this layer's first entries: no buffers yet
        if first or used + n > self._keys[i].shape[2]:
            rows = ((used + n + self.step - 1) // self.step + 1) * self.step
            buf_k = mx.zeros((*k.shape[:2], rows, k.shape[3]), k.dtype)
            buf_v = mx.zeros((*v.shape[:2], rows, v.shape[3]), v.dtype)
            if first:
                self._keys.append(buf_k)
                self._values.append(buf_v)
            else:
                if used:
                    buf_k[:, :, :used] = self._keys[i][:, :, :used]
                    buf_v[:, :, :used] = self._values[i][:, :, :used]
                self._keys[i], self._values[i] = buf_k, buf_v
        else:
            buf_k, buf_v = self._keys[i], self._values[i]
        buf_k[:, :, used: used + n] = k
        buf_v[:, :, used: used + n] = v

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
        return self._keys + self._values

    def masks(self, n: int) -> list[Optional[mx.array]]:
        """Each layer's visibility for a block of n rows after the visible context (None: all visible)."""
        return [visible(self._first(i), self.length, n, layer.causal, layer.self_attn.window)
                for i, layer in enumerate(self.draft.layers)]

    def propose_hidden(self, block_embeds: mx.array) -> mx.array:
        """Final normed hidden states of a block of embeddings [1, b, H] at positions length.."""
        views = [self.view(i) for i in range(len(self.draft.layers))]
        return self.draft.block_hidden(block_embeds, [k for k, _ in views], [v for _, v in views], self.length,
                                       self.masks(block_embeds.shape[1]))

    def propose(self, block: mx.array, embed, lm_head, steer: Optional[Guide] = None) -> mx.array:
        """Draft ids (int32, [b-1]) for block positions 1..; block is [1, b] = [last token, mask...]: each
        slot's argmax (DFlash 1) or the selector's argmax walk (DFlash 2)."""
        return self.propose_sampled(block, embed, lm_head, steer=steer)[0]

    def propose_sampled(self, block: mx.array, embed, lm_head, temperature: float = 0.0,
                        noise: Optional[mx.array] = None, steer: Optional[Guide] = None) -> tuple[mx.array, Optional[mx.array]]:
        """(ids [b-1], q [b-1, vocab] or None): DFlashDraft.propose on this block."""
        hidden = self.propose_hidden(self.draft.embed(embed, block))
        return self.draft.propose(hidden, block[0, :1], lm_head, temperature, noise, steer)

    def entries(self) -> int:
        return self.length - self._first(0) if self._keys else 0
