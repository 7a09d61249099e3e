"""An independent reading of docs/dflash2.md in plain PyTorch (float64), a test oracle for the engines.

Nothing here comes from engines/: the checkpoints are read with safetensors and json, the rotary
embedding is computed from rope_theta, attention is a dense softmax over an explicit visibility table,
and every step of the spec is one short, literal line. It is slow and that is fine: it runs on a few
positions of a tiny draft.

`draft_block(...)` gives, for the context features of n committed positions, the anchor token and the
block size B, the draft's final-normed hidden states, the mask slots' head logits, and the drafted ids:
the selector walk by argmax (T = 0), or, with `temperature` and per-slot noise, the sampled walk and the
rows q it sampled from. A DFlash 1 draft (no selector tensors), or `use_selector=False`, drafts the argmax
of each slot's logits.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

F64 = torch.float64


# -- reading the checkpoints ----------------------------------------------------------------------------

def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in `directory`, float64, `model.` prefixes dropped."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        for name, value in load_file(str(file)).items():
            tensors[name.removeprefix("model.")] = value.to(F64)
    return tensors


def text_section(config: dict) -> dict:
    return config.get("text_config") or config


@dataclass
class TargetHead:
    """What the draft borrows from the target: embeddings, lm_head, and the head's logit settings."""
    embed: torch.Tensor  # [vocab, hidden]
    lm_head: torch.Tensor  # [vocab, hidden]
    multiplier: Optional[float]
    softcap: Optional[float]

    @classmethod
    def read(cls, target_dir: Path) -> "TargetHead":
        config = json.loads((Path(target_dir) / "config.json").read_text())
        text = text_section(config)
        tensors = load_tensors(target_dir)
        embed = [v for k, v in tensors.items() if k.endswith("embed_tokens.weight") and "visual" not in k]
        if len(embed) != 1:
            raise ValueError(f"{target_dir}: expected one token embedding, found {len(embed)}")
        head = tensors.get("lm_head.weight")
        if head is None:
            head = embed[0]  # tied
        return cls(embed[0], head, text.get("output_multiplier"), text.get("final_logit_softcapping"))


def target_context_features(target_dir: Path, ids: Sequence[int], layer_ids: Sequence[int]) -> torch.Tensor:
    """The target's context features for `ids` as transformers gives them: for layer i, hidden_states[i + 1]
    (the output of decoder layer i; for the last layer that entry is already final-normed, NOTES.md).
    Returns [n, len(layer_ids) * hidden] float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1).to(F64)


# -- the arithmetic, one function per line of the spec ------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE: x [heads, n, d] at absolute `positions` [n]; frequency i is theta^(-2i/d)."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=F64) / d)  # [d/2]
    angles = positions.to(F64)[:, None] * inv_freq[None, :]  # [n, d/2]
    cos, sin = torch.cos(angles).repeat(1, 2), torch.sin(angles).repeat(1, 2)
    first, second = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def softcap(logits: torch.Tensor, cap: Optional[float]) -> torch.Tensor:
    return logits if not cap else cap * torch.tanh(logits / cap)


def causal_per_layer(config: dict) -> list[bool]:
    """vLLM's `_dflash_layer_causal`: a top-level is_causal, else dflash_config.causal, decides for every
    layer; else a layer is causal when layer_types names it sliding_attention (no layer_types: none is)."""
    layers = config["num_hidden_layers"]
    dflash = config.get("dflash_config") or {}
    for value in (config.get("is_causal"), dflash.get("causal")):
        if value is not None:
            return [bool(value)] * layers
    types = config.get("layer_types")
    if not types:
        return [False] * layers
    return [t == "sliding_attention" for t in types]


def sliding_per_layer(config: dict) -> list[Optional[int]]:
    """vLLM's `_resolve_layer_attention`: dflash_config.use_swa makes every layer sliding when layer_types is
    absent or names no sliding layer; the window is dflash_config.swa_window_size, else sliding_window."""
    dflash = config.get("dflash_config") or {}
    layers, use_swa, types = config["num_hidden_layers"], bool(dflash.get("use_swa", False)), config.get("layer_types")
    if types is None or (use_swa and "sliding_attention" not in types):
        sliding = [use_swa] * layers
    else:
        sliding = [t == "sliding_attention" for t in types]
    window = dflash.get("swa_window_size", config.get("sliding_window"))
    return [window if s else None for s in sliding]


def visibility(n: int, block: int, causal: bool, window: Optional[int], draft_window: Optional[int]) -> torch.Tensor:
    """[block, n + block] booleans: may block row i (absolute position n + i) read key column j? Columns
    0..n-1 are the context at positions 0..n-1, columns n.. the block."""
    seen = torch.zeros(block, n + block, dtype=torch.bool)
    for i in range(block):
        query = n + i
        for j in range(n + block):
            if j < n and draft_window is not None and j < n - draft_window:
                continue  # the user's draft window: only the last draft_window context rows
            if j >= n and causal and j > query:
                continue  # causal inside the block
            if window is not None and not (abs(query - j) < window):
                continue  # a sliding layer: keys window or more positions away are out (both ways: vLLM's
                #           window is symmetric when the layer is not causal)
            seen[i, j] = True
    return seen


def dynamic_conv(u: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """conv(u)[i, ch] = sum over t of coef[i, t, ch] * u[i - t, ch], u[j < 0] = 0. u [B, hidden],
    coef [B, taps, hidden]."""
    out = torch.zeros_like(u)
    for i in range(u.shape[0]):
        for t in range(coef.shape[1]):
            if i - t >= 0:
                out[i] += coef[i, t] * u[i - t]
    return out


def conv_coefficients(x: torch.Tensor, base: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """[B, 2, taps, hidden]: base_kernel[s, t, ch] + c[i, s, t, ch // (hidden / groups)], where
    c = kernel_projection(x).view(B, 2, taps, groups)."""
    block, hidden = x.shape
    taps = base.shape[1]
    groups = projection.shape[0] // (2 * taps)
    c = (x @ projection.T).view(block, 2, taps, groups)
    per_channel = c.repeat_interleave(hidden // groups, dim=-1)  # channel ch reads group ch // (hidden/groups)
    return base[None] + per_channel


@dataclass
class DraftBlock:
    hidden: torch.Tensor  # [B, hidden], final-normed, block positions 0..B-1
    logits: torch.Tensor  # [B-1, vocab], the mask slots' raw head logits (the selector scales its top-K)
    ids: list[int]  # the B-1 drafted ids
    q: Optional[torch.Tensor] = None  # [B-1, vocab], the rows the sampled walk drew from (zero off-candidates)
    scores: Optional[list[torch.Tensor]] = None  # per slot, [K] scores given the walk's predecessor
    candidates: Optional[torch.Tensor] = None  # [B-1, K]


class ReferenceDraft:
    def __init__(self, draft_dir: Path, target_dir: Path):
        self.config = json.loads((Path(draft_dir) / "config.json").read_text())
        self.w = load_tensors(draft_dir)
        self.head = TargetHead.read(target_dir)
        cfg, dflash = self.config, self.config["dflash_config"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.theta = float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0)
        scaling = cfg.get("rope_scaling") or {}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise NotImplementedError("the reference computes default RoPE only")
        self.mask_id = dflash["mask_token_id"]
        self.top_k = dflash.get("selector_top_k")
        self.has_selector = "candidate_selector.predecessor_codebook" in self.w
        # vLLM's DFlash 2 model: dflash_config only, never the top level or the target; DFlash 1 reads none
        self.embedding_scale = float(dflash.get("input_embedding_scale", 1.0)) if self.has_selector else 1.0
        self.multiplier = float(dflash.get("output_multiplier", 1.0))
        self.softcap = float(dflash.get("final_logit_softcapping") or 0.0) or None
        self.causal = causal_per_layer(cfg)
        self.windows = sliding_per_layer(cfg)

    # one sublayer's convolution pair, or the identity for a DFlash 1 draft
    def _coefficients(self, n: int, part: str, x: torch.Tensor) -> Optional[torch.Tensor]:
        base = self.w.get(f"layers.{n}.{part}.base_kernel")
        if base is None:
            return None
        return conv_coefficients(x, base, self.w[f"layers.{n}.{part}.kernel_projection.weight"])

    def _attention(self, n_layer: int, u: torch.Tensor, ctx: torch.Tensor, n: int,
                   draft_window: Optional[int]) -> torch.Tensor:
        w, p = self.w, f"layers.{n_layer}.self_attn."
        block = u.shape[0]
        hd, heads, kv = self.head_dim, self.heads, self.kv_heads
        ctx_pos, blk_pos = torch.arange(n), torch.arange(n, n + block)

        def split(x, count):
            return x.view(x.shape[0], count, hd).transpose(0, 1)  # [count, rows, hd]

        q = rotary(rms_norm(split(u @ w[p + "q_proj.weight"].T, heads), w[p + "q_norm.weight"], self.eps), blk_pos, self.theta)
        k_ctx = rotary(rms_norm(split(ctx @ w[p + "k_proj.weight"].T, kv), w[p + "k_norm.weight"], self.eps), ctx_pos, self.theta)
        k_blk = rotary(rms_norm(split(u @ w[p + "k_proj.weight"].T, kv), w[p + "k_norm.weight"], self.eps), blk_pos, self.theta)
        v_ctx, v_blk = split(ctx @ w[p + "v_proj.weight"].T, kv), split(u @ w[p + "v_proj.weight"].T, kv)
        k, v = torch.cat([k_ctx, k_blk], dim=1), torch.cat([v_ctx, v_blk], dim=1)
        seen = visibility(n, block, self.causal[n_layer], self.windows[n_layer], draft_window)
        out = torch.zeros(heads, block, hd, dtype=F64)
        for h in range(heads):
            g = h // (heads // kv)  # grouped-query attention: query head h reads kv head h // (heads / kv)
            scores = (q[h] @ k[g].T) / math.sqrt(hd)
            scores = scores.masked_fill(~seen, -math.inf)
            out[h] = torch.softmax(scores, dim=-1) @ v[g]
        return out.transpose(0, 1).reshape(block, heads * hd) @ w[p + "o_proj.weight"].T

    def _mlp(self, n_layer: int, x: torch.Tensor) -> torch.Tensor:
        w, p = self.w, f"layers.{n_layer}.mlp."
        gate = x @ w[p + "gate_proj.weight"].T
        return (torch.nn.functional.silu(gate) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T

    def hidden(self, features: torch.Tensor, anchor: int, block_size: int,
               draft_window: Optional[int] = None) -> torch.Tensor:
        """Final-normed hidden states [B, hidden] of the block [anchor, mask x (B-1)] after n context rows."""
        w, eps = self.w, self.eps
        features = features.to(F64)
        n = features.shape[0]
        ctx = rms_norm(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
        tokens = torch.tensor([anchor] + [self.mask_id] * (block_size - 1))
        h = self.head.embed[tokens] * self.embedding_scale
        for layer in range(self.config["num_hidden_layers"]):
            x = rms_norm(h, w[f"layers.{layer}.input_layernorm.weight"], eps)
            coef = self._coefficients(layer, "attention_conv", x)
            u = x if coef is None else dynamic_conv(x, coef[:, 0])
            a = self._attention(layer, u, ctx, n, draft_window)
            h = h + (a if coef is None else dynamic_conv(a, coef[:, 1]))
            x = rms_norm(h, w[f"layers.{layer}.post_attention_layernorm.weight"], eps)
            coef = self._coefficients(layer, "mlp_conv", x)
            u = x if coef is None else dynamic_conv(x, coef[:, 0])
            m = self._mlp(layer, u)
            h = h + (m if coef is None else dynamic_conv(m, coef[:, 1]))
        return rms_norm(h, w["norm.weight"], eps)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.head.lm_head.T  # raw: the selector's top-K is taken before any scaling

    def slot_scores(self, h_slot: torch.Tensor, cand: torch.Tensor, unary: torch.Tensor, predecessor: int) -> torch.Tensor:
        """score(a, c) = unary[c] + sum_d pred[a, d] * z[d] * succ[cand[c], d], z = hidden_projection(h)."""
        z = self.w["candidate_selector.hidden_projection.weight"] @ h_slot
        pred = self.w["candidate_selector.predecessor_codebook"][predecessor]
        succ = self.w["candidate_selector.successor_codebook"][cand]  # [K, d]
        return unary + succ @ (pred * z)

    def draft_block(self, features: torch.Tensor, anchor: int, block_size: int, temperature: float = 0.0,
                    uniforms: Optional[Sequence[float]] = None, exponentials: Optional[torch.Tensor] = None,
                    draft_window: Optional[int] = None, use_selector: Optional[bool] = None) -> DraftBlock:
        """The drafted block. At temperature 0 the walk takes each slot's argmax (ties: the earlier, i.e.
        higher-logit candidate). At T > 0, q_s = softmax(score_s / T) over the K candidates and the slot's
        token is drawn with the given noise: `uniforms` [B-1] by the inverse CDF over the candidates in
        their order, or `exponentials` [B-1, K] by argmax(q / E) (the exponential race, the Gumbel trick)."""
        hidden = self.hidden(features, anchor, block_size, draft_window)
        logits = self.head_logits(hidden[1:])
        selector = self.has_selector if use_selector is None else use_selector
        if not selector:
            return DraftBlock(hidden, logits, [int(i) for i in logits.argmax(-1)])
        raw_top, cand = torch.topk(logits, self.top_k, dim=-1, sorted=True)
        unary = softcap(self.multiplier * raw_top, self.softcap)  # then multiplier and softcap, as vLLM
        ids, rows, scored = [], torch.zeros_like(logits), []
        predecessor = anchor
        for s in range(block_size - 1):
            score = self.slot_scores(hidden[s + 1], cand[s], unary[s], predecessor)
            scored.append(score)
            if temperature == 0:
                pick = int(torch.argmax(score))  # first maximum
            else:
                q = torch.softmax(score / temperature, dim=-1)
                rows[s, cand[s]] = q
                if exponentials is not None:
                    pick = int(torch.argmax(q / exponentials[s].to(F64)))
                elif uniforms is not None:
                    cdf = torch.cumsum(q, dim=-1)
                    pick = min(int((cdf <= float(uniforms[s])).sum()), len(q) - 1)
                else:
                    raise ValueError("sampling needs uniforms or exponentials")
            predecessor = int(cand[s, pick])
            ids.append(predecessor)
        return DraftBlock(hidden, logits, ids, rows if temperature else None, scored, cand)
