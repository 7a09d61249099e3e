"""The training objective (docs/design.md, "Training a draft"), all anchors of a batch in one pass.

Random anchors are drawn among response positions; a block is [token at anchor, mask x (B-1)] at
positions anchor..anchor+B-1; it sees the target's context features at positions strictly before its
anchor and attends bidirectionally inside itself; cross-entropy on block positions 1..B-1 against the
true tokens at anchor+k, weighted exp(-(k-1)/gamma). The query rows of a sequence are all its blocks
side by side, the keys are [every context position, every block position], and a boolean mask lets
each block see context < its anchor and its own block only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_tui.engines.cuda.draft import visible


def bf16_autocast_pays(device: torch.device) -> bool:
    """Whether bfloat16 autocast speeds training up on `device`: on a GPU, and on a CPU with native bf16
    matmuls (about 1.9x per step there); CPUs without them would emulate it, slower than float32."""
    return device.type == "cuda" or (device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def default_gamma(block_size: int) -> float:
    """The loss decay: 7 for B=16 and 4 for B=8 (docs/design.md), linear in B elsewhere, at least 1."""
    return max(1.0, 4.0 + (block_size - 8) * 3.0 / 8.0)


class _StopForward(Exception):
    pass


class FeatureTap:
    """The target's context features for whole training sequences: hooks on the layers the draft reads
    (the final norm for the last layer, as transformers' hidden_states), and a stop after the highest
    of them, since nothing above it is needed."""

    def __init__(self, decoder, layer_ids: list[int]):
        self.decoder, self.layer_ids = decoder, list(layer_ids)
        self.active = False
        self.store: dict[int, torch.Tensor] = {}
        last = len(decoder.layers) - 1
        for i in self.layer_ids:
            (decoder.norm if i == last else decoder.layers[i]).register_forward_hook(self._keep(i))
        if max(self.layer_ids) < last:
            decoder.layers[max(self.layer_ids)].register_forward_hook(self._stop)

    def _keep(self, layer_id: int):
        def keep(module, args, output):
            if self.active:
                self.store[layer_id] = output[0] if isinstance(output, tuple) else output
        return keep

    def _stop(self, module, args, output):
        if self.active:
            raise _StopForward

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Features [S, T, len(layer_ids) * hidden] for right-padded ids (causal: pads never leak)."""
        self.active = True
        try:
            self.decoder(input_ids=ids, use_cache=False)
        except _StopForward:
            pass
        finally:
            self.active = False
        return torch.cat([self.store.pop(i) for i in self.layer_ids], dim=-1).float()


class BlockObjective:
    """The weighted block cross-entropy of a draft against its target's features."""

    def __init__(self, target, draft, layer_ids: list[int], block_size: int, anchors_per_seq: int, gamma: float,
                 mask_id: int, autocast: bool):
        self.target, self.draft = target, draft
        self.block_size, self.anchors_per_seq, self.gamma, self.mask_id = block_size, anchors_per_seq, gamma, mask_id
        self.autocast = autocast
        self.device = target.device
        self.features = FeatureTap(target.model.model, layer_ids)

    def loss(self, batch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """The loss of one batch of Samples, and how many label tokens it covered."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self._loss(batch, generator)

    def _loss(self, batch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        B, N, dev = self.block_size, self.anchors_per_seq, self.device
        S, T = len(batch), max(len(s.ids) for s in batch)
        ids = torch.zeros(S, T, dtype=torch.long)
        anchors = torch.zeros(S, N, dtype=torch.long)
        anchor_ok = torch.zeros(S, N, dtype=torch.bool)
        lengths = torch.zeros(S, dtype=torch.long)
        for r, s in enumerate(batch):  # per sequence, never per anchor
            seq = s.ids
            ids[r, : len(seq)] = torch.tensor(seq)
            lengths[r] = len(seq)
            lo, hi = len(s.prompt), len(seq) - 1  # anchors: response positions with at least one label after
            count = hi - lo
            if count <= 0:
                continue
            k = min(N, count)
            anchors[r, :k] = lo + torch.randperm(count, generator=generator)[:k]
            anchor_ok[r, :k] = True
        ids, anchors, anchor_ok, lengths = ids.to(dev), anchors.to(dev), anchor_ok.to(dev), lengths.to(dev)

        feats = self.features(ids)  # [S, T, n*H]
        offsets = torch.arange(B, device=dev)
        # The draft trains in float32; a bf16 target (CUDA) gives float32 features and takes bf16 into lm_head.
        hidden = self.block_hiddens(ids, feats, anchors)[:, :, 1:]  # predictions for anchor+1..anchor+B-1
        logits = self.target.lm_head(hidden.to(self.target.lm_head.weight.dtype)).float()
        label_pos = anchors[:, :, None] + offsets[1:]  # [S, N, B-1]
        valid = anchor_ok[:, :, None] & (label_pos < lengths[:, None, None])
        labels = ids.gather(1, label_pos.clamp(max=T - 1).reshape(S, -1)).view(S, N, B - 1)
        weights = torch.exp(-(offsets[1:].float() - 1) / self.gamma)[None, None, :] * valid
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view_as(weights)
        if self.draft.candidate_selector is not None:
            predecessors = ids.gather(1, (label_pos - 1).clamp(max=T - 1).reshape(S, -1)).view(S, N, B - 1)
            ce = ce + self.selector_loss(hidden, logits, predecessors, labels, weights)
        loss = (ce * weights).sum() / weights.sum().clamp(min=1e-6)
        return loss, int(valid.sum())

    def selector_loss(self, hidden, logits, predecessors, labels, weights) -> torch.Tensor:
        """DFlash 2's selector term per mask slot (docs/dflash2.md, "Training"): the cross-entropy of the
        slot's scores, given its true predecessor, against its true token where that token is among the
        top-K candidates of the head's logits; 0 where it is not."""
        draft = self.draft
        top, candidates = draft.candidate_selector.candidates(logits, draft.as_target_scores)  # (vLLM's order)
        pairs = draft.candidate_selector.pair_scores(hidden.float(), candidates, predecessors[..., None])[..., 0, :]
        scores = top + pairs
        hit = candidates == labels[..., None]
        found = hit.any(dim=-1) & (weights > 0)
        ce = F.cross_entropy(scores.reshape(-1, scores.shape[-1]), hit.float().argmax(-1).reshape(-1),
                             reduction="none").view_as(weights)
        return ce * found

    def block_hiddens(self, ids: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """The draft's final hidden states [S, N, B, H] for N blocks per sequence in one pass: block j of
        row s is [ids[s, a], mask x (B-1)] at positions a..a+B-1 (a = anchors[s, j]); it attends to the
        context at positions < a and to its own block, exactly as in the decoding loop."""
        B, dev = self.block_size, ids.device
        (S, T), N = ids.shape, anchors.shape[1]
        offsets = torch.arange(B, device=dev)
        pos = (anchors[:, :, None] + offsets).reshape(S, N * B)  # block positions [S, NB]
        tokens = torch.full((S, N, B), self.mask_id, dtype=torch.long, device=dev)
        tokens[:, :, 0] = ids.gather(1, anchors)
        d = self.draft
        with torch.no_grad():
            embeds = d.embed(self.target.embed, tokens.reshape(S, N * B)).float()
        block_anchor = anchors.repeat_interleave(B, dim=1)  # [S, NB]
        ctx_pos = torch.arange(T, device=dev)
        ctx_ok = ctx_pos[None, None, :] < block_anchor[:, :, None]  # [S, NB, T]
        block_id = torch.arange(N, device=dev).repeat_interleave(B)
        same = (block_id[:, None] == block_id[None, :]).expand(S, -1, -1)  # [S, NB, NB]
        masks = {}
        for layer in d.layers:  # per kind of layer: causal inside the block, a sliding window (draft.visible)
            key = (layer.causal, layer.self_attn.window)
            if key not in masks:
                keys = torch.cat([ctx_pos.expand(S, T), pos], dim=1)  # [S, T + NB] absolute positions
                seen = visible(pos, keys, block_anchor[:, :, None], *key)  # the context and the block rows
                masks[key] = (torch.cat([ctx_ok, same], dim=-1) & seen).unsqueeze(1)  # [S, 1, NB, T + NB]
        ctx = d.context(feats)
        cos, sin = d.rope(torch.arange(T, device=dev).expand(S, T), ctx)
        kv = [layer.self_attn.project_context(ctx, cos, sin) for layer in d.layers]
        hidden = d.block_hidden(embeds, [k for k, _ in kv], [v for _, v in kv], pos,
                                [masks[(layer.causal, layer.self_attn.window)] for layer in d.layers], block=B)
        return hidden.view(S, N, B, -1)
