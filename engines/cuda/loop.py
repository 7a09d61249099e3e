"""The speculative loop (DESIGN.md, "The loop"), as one function.

After prefill the target cache holds the prompt; the first sampled token is not yet in it. Each step
drafts a block [last, mask x (B-1)] at positions start.., verifies it in one target pass, keeps the
drafted ids up to the first disagreement plus the target's own token there, crops the target cache to
the committed tokens minus the newest, and feeds the draft the features of the newly committed ones.
Block size 1 is plain autoregressive decoding through the same code.
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

import torch

from dflash_tui.engines.cuda.cache import CachePool, TurnCache, bucket_layers, reserve
from dflash_tui.engines.cuda.draft import DFlashDraft, DraftCache, Proposal
from dflash_tui.engines.cuda.graphs import StepGraphs
from dflash_tui.engines.cuda.target import Target
from dflash_tui.engines.engine import RawStep
from dflash_tui.engines.sampling import SamplingParams

HOST_SYNC = "dflash::host_sync"  # the profiler's name for the loop's one device-to-host copy per step


def to_host(ids: torch.Tensor) -> list[int]:
    """The ids as a Python list: the loop's one host sync per step, named so a profile can count it."""
    with torch.profiler.record_function(HOST_SYNC):
        return ids.tolist()


class Sampler:
    """Greedy, or temperature / top_k / top_p / min_p sampling from a seeded generator.

    Sampling is the exponential race: argmax(p / E) with E ~ Exp(1) drawn from the seeded generator picks
    index i with probability p_i, like `torch.multinomial`, but without its two hidden host syncs (it
    checks its input with `.item()`), so a sampled step keeps the loop's one sync."""

    def __init__(self, params: SamplingParams, device: torch.device):
        self.params = params
        self.generator = None if params.greedy else torch.Generator(device=device).manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [n, vocab] -> ids [n]."""
        if self.params.greedy:
            return logits.argmax(dim=-1)
        return self.race(self.probs(logits))

    def race(self, probs: torch.Tensor) -> torch.Tensor:
        """One sample per row of probs [n, vocab] (rows need not be normalized)."""
        race = torch.empty_like(probs).exponential_(generator=self.generator).clamp_(min=torch.finfo(probs.dtype).tiny)
        return (probs / race).argmax(dim=-1)

    def walk_noise(self, slots: int, top_k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A DFlash 2 selector walk's noise [slots, K] and temperature: Exp(1) draws and T when sampling,
        ones and 1 for the argmax walk (CandidateSelector.walk)."""
        if self.params.greedy:
            return torch.ones(slots, top_k, device=device), torch.ones((), device=device)
        noise = torch.empty(slots, top_k, device=device).exponential_(generator=self.generator)
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny), torch.full((), self.params.temperature, device=device)

    def verify(self, logits: torch.Tensor, proposal: Optional["Proposal"]) -> torch.Tensor:
        """The target's token at every block position [b], from logits [b, vocab], such that keeping the
        drafted ids up to the first position where they differ is the acceptance rule. Greedy, or a draft
        without a distribution (DFlash 1): the target's own choice (exact match). A DFlash 2 draft at T > 0:
        exact rejection sampling (docs/dflash2.md; `rejection_choice`)."""
        if self.params.greedy or proposal is None or proposal.q is None:
            return self(logits)
        return rejection_choice(self.probs(logits), proposal, self.generator, self.race)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's distribution after temperature, top_k, top_p and min_p: [n, vocab] float32."""
        p = self.params
        logits = logits.float() / p.temperature
        if p.top_k > 0:
            kth = torch.topk(logits, min(p.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative - sorted_logits.softmax(dim=-1) > p.top_p  # keep the token that crosses top_p
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        if p.min_p > 0:
            probs = logits.softmax(dim=-1)
            logits = logits.masked_fill(probs < p.min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
        return logits.softmax(dim=-1)


def acceptance(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """The chance of keeping a drafted token x: min(1, p(x) / q(x))."""
    return (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What the target samples from at the first rejection: max(0, p - q), normalized (p itself where that
    is all zero, which happens only where p = q and so no rejection can occur)."""
    rest = (p - q).clamp(min=0)
    total = rest.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp(min=torch.finfo(p.dtype).tiny), p)


def rejection_choice(p: torch.Tensor, proposal: "Proposal", generator, race) -> torch.Tensor:
    """Exact speculative sampling over one block, on the device: p [b, vocab] the target's distributions,
    the proposal's ids [b-1] drawn from q (candidates and probabilities [b-1, K]). Position j keeps x_j with
    probability acceptance(p_j(x_j), q_j(x_j)), else holds a draw from residual(p_j, q_j), which never
    equals x_j; the last position holds a draw from p (the bonus token after a fully accepted block).
    The loop then keeps the drafted ids up to the first position that differs: that is the rule."""
    n = proposal.ids.shape[0]
    q = torch.zeros_like(p[:n]).scatter_(1, proposal.candidates, proposal.q.to(p.dtype))
    x = proposal.ids[:, None]
    kept = torch.rand(n, device=p.device, generator=generator) < acceptance(p[:n].gather(1, x)[:, 0], q.gather(1, x)[:, 0])
    instead = race(residual(p[:n], q))
    return torch.cat([torch.where(kept, proposal.ids, instead), race(p[n:])])


class Clock:
    """Marks on the host (CPU) or CUDA events read after the step's one sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1000 if self.cuda else b - a


@torch.inference_mode()
def speculative_decode(
    target: Target,
    draft: Optional[DFlashDraft],
    prompt_ids: list[int],
    block_size: int,
    max_new_tokens: int,
    sampler: Sampler,
    draft_window: Optional[int] = None,
    cache=None,
    draft_cache: Optional[DraftCache] = None,
    pool: Optional[CachePool] = None,
    graphs: Optional[StepGraphs] = None,
    turn: Optional[TurnCache] = None,
    reuse: bool = False,
    split: Optional[int] = None,
) -> Iterator[RawStep]:
    """Yields the prefill token, then one RawStep per verify step, up to max_new_tokens ids.
    `cache` / `draft_cache` may be passed in to observe them between steps (tests); otherwise they come
    from `pool` (reused across requests) or are allocated for this request. With `graphs`, every step
    replays the captured block-size step (a shrunk last block padded to it).

    With `turn` (pooled caches only) the caches this request leaves are recorded in it; with `reuse` the
    request starts from the longest prefix of `prompt_ids` they hold and prefills only the rest. A hybrid
    target then prefills in two chunks cut at `split` (just after the assistant header) and keeps a
    snapshot of its linear-attention states there."""
    device, clock = target.device, Clock(target.device)
    use_draft = block_size > 1
    prompt_len = len(prompt_ids)
    room = prompt_len + max_new_tokens + block_size  # a verify writes at most one block past the committed
    tracked = turn is not None and pool is not None and cache is None and draft_cache is None
    reused = 0
    if tracked:
        if reuse:
            reused = turn.resume(prompt_ids, pool.draft_length() if use_draft else None)
        turn.ids = None  # the caches change from here on; valid again after each completed step
        if reused:
            cache = turn.cache
            pool.crop_draft(reused)
        else:
            turn.snapshots = {}
            pool.crop_draft(0)
    if cache is None:
        cache = pool.target_cache(room) if pool else target.new_cache(room)
    reserve(cache, room)
    if use_draft:
        if draft_cache is None:
            draft_cache = pool.draft_cache(draft_window, room, reused) if pool else DraftCache(draft, draft_window, room)
        draft_cache.reserve(room)
    if graphs is not None:
        captures = graphs.captures
        # None: a capture failed, run eager
        ready = graphs.ready(cache, draft_cache if use_draft else None, block_size, prompt_len - 1, room)
        if graphs.captures != captures:
            # a capture ran its warm-up passes over these buffers, whether or not it then succeeded:
            # nothing they kept survives it
            reused = 0
            if use_draft:
                draft_cache.length = 0
        graphs = ready
        for layer in bucket_layers(cache):
            layer.length = reused
    if tracked:
        turn.cache = cache

    t0 = clock.mark()
    bounds = [reused, prompt_len]
    hybrid_split = tracked and reuse and bool(target.rollback) and split is not None and reused < split <= prompt_len
    if hybrid_split and split < prompt_len:
        bounds = [reused, split, prompt_len]
    for a, b in zip(bounds, bounds[1:]):
        logits, features = target.forward(torch.tensor([prompt_ids[a:b]], device=device), a, cache, last_only=True,
                                          capture=use_draft)
        target.commit(cache, b - a, b - a)
        if use_draft:
            draft_cache.append(features)
        if hybrid_split and b == split:
            turn.snapshot(split)
    last = sampler(logits[0, -1:])  # [1], stays on the device
    (first,) = to_host(last)
    held = list(prompt_ids)  # the ids the target cache holds
    if tracked:
        turn.ids = held
    yield RawStep(drafted=[], accepted=0, emitted=[first], draft_s=0.0, verify_s=clock.seconds(t0, clock.mark()),
                  prefill=True, reused=reused)

    generated = 1
    last_id = first
    mask_id = draft_cache.draft.mask_token_id if use_draft else 0
    mask_block = torch.full((1, block_size), mask_id, dtype=torch.long, device=device)
    while generated < max_new_tokens:
        b = min(block_size, max_new_tokens - generated)  # the last block shrinks: never more than asked
        start = prompt_len + generated - 1
        on_graphs = graphs is not None and graphs.covers(start, block_size)
        if tracked:
            turn.ids = None
        t_draft = clock.mark()
        proposal = None
        if on_graphs:  # a shrunk last block runs padded to the captured size; only its first b positions count
            block, proposal = graphs.draft_step(last, start, block_size, sampler, b)
            t_verify = clock.mark()
            logits = graphs.verify_step(block_size)
        else:
            block = mask_block[:, :b].clone()
            block[0, :1] = last
            if b > 1:
                selector = draft_cache.draft.candidate_selector
                walk = sampler.walk_noise(b - 1, selector.top_k, device) if selector is not None else (None, None)
                proposal = draft_cache.propose(block, target.embed, target.lm_head, *walk)
                block[0, 1:] = proposal.ids
            t_verify = clock.mark()
            target.before_verify(cache)
            logits, features = target.forward(block, start, cache, last_only=False, capture=use_draft)
        # the target's token at every block position (a padded block's first b), by the acceptance rule
        choice = sampler.verify(logits[0, :b], proposal.first(b - 1) if proposal is not None and b > 1 else None)
        t_end = clock.mark()
        host = to_host(torch.cat([block[0, 1:b], choice]))  # the step's one host sync
        drafted, chosen = host[: b - 1], host[b - 1:]
        accepted = 0
        while accepted < b - 1 and drafted[accepted] == chosen[accepted]:
            accepted += 1
        if on_graphs:  # both caches hold the whole block: move their lengths
            graphs.commit(start, accepted + 1)
        else:
            target.commit(cache, accepted + 1, b)  # keep every committed token except the newest
            if use_draft:
                draft_cache.append(features[:, : accepted + 1])
        held.append(last_id)
        held += drafted[:accepted]
        last_id = chosen[accepted]
        if tracked:
            turn.ids = held
        last = choice[accepted: accepted + 1]
        generated += accepted + 1
        yield RawStep(
            drafted=drafted,
            accepted=accepted,
            emitted=drafted[:accepted] + [chosen[accepted]],
            draft_s=clock.seconds(t_draft, t_verify),
            verify_s=clock.seconds(t_verify, t_end),
        )
