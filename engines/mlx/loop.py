"""The speculative loop on MLX (docs/engine-contract.md, "The loop"), step for step the loop of engines/cuda/loop.py.

After prefill the target cache holds the prompt; the first sampled token is not yet in it. Each step
drafts a block [last, mask x (B-1)] at positions start.., verifies it in one target pass, keeps the
drafted ids up to the first disagreement plus the target's own token there, rolls the target cache back
to the committed tokens minus the newest (engines/mlx/target.py's CacheRollback: KV caches trimmed,
gated-delta-net states recomputed from the verify pass's captured mixer inputs), and feeds the draft the
features of the newly committed ones.
Block size 1 is plain autoregressive decoding through the same code.

MLX is lazy: a step is one graph (draft, verify, sampling) evaluated by the step's one host sync, the
`.tolist()` of drafted + chosen ids (a hybrid target's state recompute after a partial acceptance is
part of the next step's graph). The draft/verify split of a step's time therefore cannot be read
from that sync; it is measured on every TIMING_EVERY-th step (the first included) by evaluating the
draft on its own, and the other steps split their time in the last measured proportion.
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

import mlx.core as mx

from ..engine import RawStep
from ..sampling import SamplingParams
from .draft import DFlashDraft, DraftCache
from .target import Target

PREFILL_STEP = 2048  # prompt tokens per prefill chunk, as mlx-lm's generate_step
CLEAR_EVERY = 64  # steps between mx.clear_cache() calls
TIMING_EVERY = 16  # steps between measured draft/verify splits


class Sampler:
    """Greedy, or temperature / top_k / top_p / min_p sampling from a seeded mx.random key (the same
    filters, in the same order, as engines/cuda/loop.py's Sampler)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.key = None if params.greedy else mx.random.key(params.seed)

    def __call__(self, logits: mx.array) -> mx.array:
        """logits [n, vocab] -> int32 ids [n]."""
        p = self.params
        if p.greedy:
            return mx.argmax(logits, axis=-1).astype(mx.int32)
        neg = mx.array(-float("inf"), dtype=mx.float32)
        logits = logits.astype(mx.float32) / p.temperature
        if p.top_k > 0:
            k = min(p.top_k, logits.shape[-1])
            kth = mx.topk(logits, k, axis=-1).min(axis=-1, keepdims=True)
            logits = mx.where(logits < kth, neg, logits)
        if p.top_p < 1.0:
            order = mx.argsort(-logits, axis=-1)
            probs = mx.softmax(mx.take_along_axis(logits, order, axis=-1), axis=-1)
            drop = (mx.cumsum(probs, axis=-1) - probs) > p.top_p  # keep the token that crosses top_p
            drop = mx.take_along_axis(drop, mx.argsort(order, axis=-1), axis=-1)
            logits = mx.where(drop, neg, logits)
        if p.min_p > 0:
            probs = mx.softmax(logits, axis=-1)
            logits = mx.where(probs < p.min_p * probs.max(axis=-1, keepdims=True), neg, logits)
        keys = mx.random.split(self.key)
        self.key = keys[0]
        return mx.random.categorical(logits, axis=-1, key=keys[1]).astype(mx.int32)


def speculative_decode(
    target: Target,
    draft: Optional[DFlashDraft],
    prompt_ids: list[int],
    block_size: int,
    max_new_tokens: int,
    sampler: Sampler,
    draft_window: Optional[int] = None,
    cache: Optional[list] = None,
    draft_cache: Optional[DraftCache] = None,
) -> Iterator[RawStep]:
    """Yields the prefill token, then one RawStep per verify step, up to max_new_tokens ids.
    `cache` / `draft_cache` may be passed in to observe them between steps (tests)."""
    use_draft = block_size > 1
    cache = cache if cache is not None else target.make_cache()
    rollback = target.rollback_for(cache)
    if use_draft and draft_cache is None:
        draft_cache = DraftCache(draft, draft_window)
    prompt = mx.array(prompt_ids, dtype=mx.int32)[None]

    # Prefill as mlx-lm does: all but the last prompt token in chunks (only cache states and context
    # features evaluated, never their logits), then the last token alone for the first sampled token.
    t0 = time.perf_counter()
    done, n = 0, len(prompt_ids)
    while n - done > 1:
        chunk = min(PREFILL_STEP, n - done - 1)
        _, features = target.forward(prompt[:, done: done + chunk], cache, capture=use_draft)
        if use_draft:
            draft_cache.append(features)
        mx.eval([c.state for c in cache] + (draft_cache.arrays() if use_draft else []))
        done += chunk
    logits, features = target.forward(prompt[:, done:], cache, capture=use_draft)
    if use_draft:
        draft_cache.append(features)
    last = sampler(logits[0, -1:])  # [1], stays on the device
    mx.eval(last, [c.state for c in cache], draft_cache.arrays() if use_draft else [])
    first = last.item()
    yield RawStep(drafted=[], accepted=0, emitted=[first], draft_s=0.0, verify_s=time.perf_counter() - t0, prefill=True)

    generated, step, draft_share = 1, 0, 0.0
    mask_id = draft_cache.draft.mask_token_id if use_draft else 0
    mask = mx.full((max(block_size - 1, 1),), mask_id, dtype=mx.int32)
    while generated < max_new_tokens:
        b = min(block_size, max_new_tokens - generated)  # the last block shrinks: never more than asked
        t_start = time.perf_counter()
        timed = b > 1 and step % TIMING_EVERY == 0
        drafted = None
        block = last
        if b > 1:
            proposal = mx.concatenate([last, mask[: b - 1]])[None]
            drafted = draft_cache.propose(proposal, target.embed, target.lm_head)  # greedy proposals
            block = mx.concatenate([last, drafted])
            if timed:
                mx.eval(block)
        t_mid = time.perf_counter()
        rollback.snapshot(b)
        logits, features = target.forward(block[None], cache, capture=use_draft)
        choice = sampler(logits[0])  # the target's own token at every block position
        host = (mx.concatenate([drafted, choice]) if drafted is not None else choice).tolist()  # the one sync
        t_end = time.perf_counter()
        drafted_ids, chosen = host[: b - 1], host[b - 1:]
        accepted = 0
        while accepted < b - 1 and drafted_ids[accepted] == chosen[accepted]:
            accepted += 1
        rollback.rollback(b, accepted + 1, lambda keep, block=block: target.forward(block[None, :keep], cache, capture=False))
        if use_draft:
            draft_cache.append(features[:, : accepted + 1])
        last = choice[accepted: accepted + 1]
        generated += accepted + 1
        step += 1
        if step % CLEAR_EVERY == 0:
            mx.clear_cache()
        if timed:
            draft_s, verify_s = t_mid - t_start, t_end - t_mid
            draft_share = draft_s / (t_end - t_start) if t_end > t_start else 0.0
        elif b > 1:
            draft_s = (t_end - t_start) * draft_share
            verify_s = (t_end - t_start) - draft_s
        else:
            draft_s, verify_s = 0.0, t_end - t_start
        yield RawStep(
            drafted=drafted_ids,
            accepted=accepted,
            emitted=drafted_ids[:accepted] + [chosen[accepted]],
            draft_s=draft_s,
            verify_s=verify_s,
        )
