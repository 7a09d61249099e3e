"""The speculative loop on MLX (docs/engine-contract.md, "The loop"), step for step the loop of engines/cuda/loop.py.

After prefill the target cache holds the prompt; the first sampled token is not yet in it. Each step
drafts a block [last, mask x (B-1)] at positions start.., verifies it in one target pass, keeps the
drafted ids up to the first disagreement plus the target's own token there (a DFlash 2 draft at
temperature > 0: exact rejection sampling against the draft's q instead, `rejection_verify`), rolls the target cache back
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
from typing import Generator, Optional, cast

import mlx.core as mx

from dflash_tui.engines.engine import RawStep
from dflash_tui.engines.events import TopLogprob
from dflash_tui.engines.guided import Guide, stack_rows
from dflash_tui.engines.memory import SNAPSHOTS
from dflash_tui.engines.mlx.draft import DFlashDraft, DraftCache
from dflash_tui.engines.mlx.target import Target
from dflash_tui.engines.sampling import SamplingParams

PREFILL_STEP = 2048  # prompt tokens per prefill chunk, as mlx-lm's generate_step
CLEAR_EVERY = 64  # steps between mx.clear_cache() calls
TIMING_EVERY = 16  # steps between measured draft/verify splits


class Sampler:
    """Greedy, or temperature / top_k / top_p / min_p sampling from a seeded mx.random key (the same
    filters, in the same order, as engines/cuda/loop.py's Sampler). Every random draw of a request
    (the target's samples, a DFlash 2 draft's noise, the rejection rule's uniforms) comes from this key,
    split once per draw, so a seed repeats the whole request."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.key = mx.random.key(params.seed)  # (lazy, and never drawn from when greedy)
        self.penalizer: Optional[Penalizer] = None
        self.allow: Optional[mx.array] = None  # a constrained request's masks [n, vocab] for the next call

    def start(self, prompt_ids: list[int]) -> None:
        """A request begins: the penalties' counts start from its prompt (nothing to do without them)."""
        self.penalizer = Penalizer(self.params, prompt_ids) if self.params.penalized else None

    def observe(self, emitted: mx.array) -> None:
        """Ids [n] the request emitted (lazy): they count toward the penalties from now on."""
        if self.penalizer is not None:
            self.penalizer.observe(emitted)

    def penalize(self, logits: mx.array, drafted: Optional[mx.array] = None) -> mx.array:
        """float32 logits [n, vocab] with the request's bias and penalties, row j counting the drafted ids
        [n - 1] before it (engines/cuda/loop.py's Penalizer, the same arithmetic), then a constrained
        request's masks (`allow`: -inf where the grammar forbids)."""
        logits = logits.astype(mx.float32)
        if self.penalizer is not None:
            logits = self.penalizer(logits, drafted)
        if self.allow is not None:
            logits = mx.where(self.allow[: logits.shape[0]], logits, mx.array(-float("inf"), dtype=mx.float32))
        return logits

    def logprob_rows(self, logits: mx.array, tokens: mx.array) -> mx.array:
        """Per position [n, 1 + 2k] float32 (which holds every id exactly): the raw log-probability of
        tokens [n] under logits [n, vocab] (before bias, penalties, temperature and truncation), then the
        k = top_logprobs most likely ids and their log-probabilities, most likely first. Lazy."""
        lp = logits.astype(mx.float32)
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        parts = [mx.take_along_axis(lp, tokens.astype(mx.int32)[:, None], axis=-1)]
        k = self.params.top_logprobs
        if k > 0:
            top = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
            values = mx.take_along_axis(lp, top, axis=-1)
            order = mx.argsort(-values, axis=-1)
            parts += [mx.take_along_axis(top, order, axis=-1).astype(mx.float32), mx.take_along_axis(values, order, axis=-1)]
        return mx.concatenate(parts, axis=1)

    def next_key(self) -> mx.array:
        keys = mx.random.split(self.key)
        self.key = keys[0]
        return keys[1]

    def process(self, logits: mx.array, drafted: Optional[mx.array] = None) -> mx.array:
        """logits [n, vocab] -> float32 logits after the penalties (`penalize`), temperature, top_k, top_p
        and min_p (-inf where cut)."""
        p = self.params
        neg = mx.array(-float("inf"), dtype=mx.float32)
        logits = self.penalize(logits, drafted) / p.temperature
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
        return logits

    def probs(self, logits: mx.array, drafted: Optional[mx.array] = None) -> mx.array:
        """The distribution p [n, vocab] a sample is drawn from (temperature > 0)."""
        return mx.softmax(self.process(logits, drafted), axis=-1)

    def __call__(self, logits: mx.array, drafted: Optional[mx.array] = None) -> mx.array:
        """logits [n, vocab] -> int32 ids [n] (`drafted`: the block's drafted ids [n - 1], for the penalties)."""
        if self.params.greedy:  # (without penalties or masks the logits as they are: no float32 copy)
            plain = self.penalizer is None and self.allow is None
            return mx.argmax(logits if plain else self.penalize(logits, drafted), axis=-1).astype(mx.int32)
        return mx.random.categorical(self.process(logits, drafted), axis=-1, key=self.next_key()).astype(mx.int32)

    def from_probs(self, probs: mx.array) -> mx.array:
        """One id per row of probabilities [n, vocab] (int32 [n])."""
        return mx.random.categorical(mx.log(probs), axis=-1, key=self.next_key()).astype(mx.int32)

    def uniform(self, shape: tuple) -> mx.array:
        return mx.random.uniform(shape=shape, key=self.next_key())

    def exponential(self, shape: tuple) -> mx.array:
        """Exp(1) draws (never 0: -log of a uniform in [0, 1), floored)."""
        return -mx.log1p(-mx.minimum(self.uniform(shape), 1 - 2 ** -24))


class Penalizer:
    """The request's logit_bias and presence / frequency / repetition penalties (engines.config.Penalties),
    lazy on the device, as engines/cuda/loop.py's Penalizer: the prompt's ids and the output's counts so
    far, and inside a verified block row j adds the drafted ids before it (its own prefix)."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int]):
        self.params = params
        self.prompt = mx.array(prompt_ids, dtype=mx.int32)
        # sized from the first logits (the target's vocab rows): `in_prompt` is set with `counts`
        self.counts: Optional[mx.array] = None
        self.in_prompt: mx.array
        self.bias: Optional[mx.array] = None

    def _ready(self, vocab: int) -> mx.array:
        """The counts, sized to `vocab` on the first call (with `in_prompt` and `bias`)."""
        if self.counts is not None:
            return self.counts
        self.in_prompt = mx.zeros((vocab,), dtype=mx.float32).at[self.prompt].add(1.0) > 0
        self.counts = counts = mx.zeros((vocab,), dtype=mx.float32)
        ids = [i for i in self.params.logit_bias if i < vocab]
        self.bias = None
        if ids:
            self.bias = mx.zeros((vocab,), dtype=mx.float32).at[mx.array(ids, dtype=mx.int32)].add(
                mx.array([self.params.logit_bias[i] for i in ids], dtype=mx.float32))
        return counts

    def observe(self, emitted: mx.array) -> None:
        if self.counts is not None:
            self.counts = self.counts.at[emitted.astype(mx.int32)].add(1.0)

    def __call__(self, logits: mx.array, drafted: Optional[mx.array]) -> mx.array:
        n, vocab = logits.shape
        counts = mx.broadcast_to(self._ready(vocab), (n, vocab))
        p = self.params
        if drafted is not None and drafted.size and n > 1:
            hits = (mx.arange(vocab)[None] == drafted[: n - 1, None].astype(mx.int32)).astype(mx.float32)
            ahead = mx.cumsum(mx.concatenate([mx.zeros((1, vocab), dtype=mx.float32), hits]), axis=0)
            counts = counts + ahead  # row j: the output's counts plus drafted[:j]
        if self.bias is not None:
            logits = logits + self.bias
        if p.repetition_penalty != 1.0:
            r = p.repetition_penalty
            seen = mx.logical_or(self.in_prompt, counts > 0)
            logits = mx.where(seen, mx.where(logits > 0, logits / r, logits * r), logits)
        if p.frequency_penalty:
            logits = logits - p.frequency_penalty * counts
        if p.presence_penalty:
            logits = logits - p.presence_penalty * (counts > 0).astype(mx.float32)
        return logits


def unpack_logprobs(rows: list[list[float]], k: int) -> tuple[list[float], Optional[list[list[TopLogprob]]]]:
    """Rows from `Sampler.logprob_rows` -> (the tokens' log-probabilities, [[id, logprob] x k] per token)."""
    logprobs = [row[0] for row in rows]
    if k <= 0:
        return logprobs, None
    return logprobs, [[[int(i), v] for i, v in zip(row[1: 1 + k], row[1 + k: 1 + 2 * k])] for row in rows]


def rejection_verify(p: mx.array, q: mx.array, drafted: mx.array, sampler: Sampler):
    """Exact speculative sampling of one verify step (docs/dflash2.md), lazy: p [b, vocab] the target's
    distributions at the block's positions, q [b-1, vocab] the draft's rows, drafted [b-1] ids drawn from
    them. Drafted token j is accepted with probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection
    the emitted token is a sample of normalize(max(0, p_j - q_j)), after a fully accepted block a sample of
    p_{b-1}. Returns (accepted flags [b-1] int32, the token to emit if the block stops at each position [b])."""
    rows = drafted[:, None]
    px = mx.take_along_axis(p[:-1], rows, axis=-1)[:, 0]
    qx = mx.take_along_axis(q, rows, axis=-1)[:, 0]
    accept = sampler.uniform(qx.shape) * qx < px  # u < p / q, with q(x) > 0 for a drawn x
    residual = mx.maximum(p[:-1] - q, 0)
    residual = mx.where(residual.sum(axis=-1, keepdims=True) > 0, residual, p[:-1])  # p = q: never rejected
    resampled = sampler.from_probs(residual / residual.sum(axis=-1, keepdims=True))
    bonus = sampler.from_probs(p[-1:])
    return accept.astype(mx.int32), mx.concatenate([resampled, bonus])


class TurnCache:
    """What a request leaves for the next one (the conversation's caches between turns): the target's
    cache list, the draft's context cache (its own length: it trails the target's after a block-1 turn),
    the ids the target cache holds (None while a step is changing it), and, for hybrid targets, snapshots
    {position: entries of each linear-attention ArraysCache} (MLX arrays are immutable: references are
    the copy) taken right after the assistant header; the live state at len(ids) is the other point."""

    MAX_SNAPSHOTS = SNAPSHOTS

    def __init__(self) -> None:
        self.cache: Optional[list] = None
        self.draft_cache: Optional[DraftCache] = None
        self.ids: Optional[list[int]] = None
        self.snapshots: dict[int, dict] = {}

    def clear(self) -> None:
        self.ids = None
        self.snapshots = {}

    def snapshot(self, position: int, rollback) -> None:
        cache = self.cache
        if cache is None:  # nothing kept (a request sets it before any snapshot)
            return
        self.snapshots[position] = {i: list(cache[i].cache) for i in rollback.mixers}
        for old in sorted(self.snapshots)[:-self.MAX_SNAPSHOTS]:
            del self.snapshots[old]

    def holds(self, rollback) -> bool:
        """Whether something is kept that can be brought back exactly (KV caches trimmed, linear-attention
        states restored; the "refeed" fallback's caches cannot be)."""
        return self.ids is not None and self.cache is not None and rollback.mode in ("trim", "mixers")

    def resume(self, prompt_ids: list[int], rollback, use_draft: bool) -> int:
        """Crop / restore the kept caches to the longest prefix of `prompt_ids` they can hold exactly (at
        least one prompt token left to prefill); 0 when nothing is reusable."""
        from dflash_tui.engines.engine import common_prefix

        cache, ids = self.cache, self.ids
        if cache is None or ids is None or not self.holds(rollback):
            return 0
        keep = min(common_prefix(ids, prompt_ids), len(prompt_ids) - 1)
        draft_length = self.draft_cache.length if self.draft_cache is not None else 0
        if use_draft:
            keep = min(keep, draft_length)
        if rollback.mode == "mixers":
            live = len(ids) if len(ids) <= keep else None
            best = max([p for p in self.snapshots if p <= keep] + ([live] if live is not None else []), default=0)
            if best and best != live:
                for i, entries in self.snapshots[best].items():
                    cache[i].cache = list(entries)
            keep = best
        self.snapshots = {p: s for p, s in self.snapshots.items() if p <= keep}
        if keep <= 0:
            return 0
        for i, c in enumerate(cache):
            if i not in rollback.mixers:
                c.trim(c.offset - keep)
        if self.draft_cache is not None:
            self.draft_cache.crop(keep)
        return keep


def masks(guide: Optional[Guide]) -> Optional[mx.array]:
    """A constrained request's masks along the block it just drafted ([n, vocab] bool), None without a
    constraint or where every position is free (engines/cuda/loop.py's `masks`)."""
    if guide is None:
        return None
    rows = stack_rows(guide.rows(), guide.vocab_rows)
    return None if rows is None else mx.array(rows)


def speculative_decode(target: Target, draft: Optional[DFlashDraft], prompt_ids: list[int], block_size: int,
                       max_new_tokens: int, sampler: Sampler, draft_window: Optional[int] = None,
                       **kwargs) -> Generator[RawStep, None, None]:
    """`_speculative_decode`, whose kept caches are evaluated when the request ends however it ends: a
    lazy array left pending would belong to this thread's stream, and the next request may come from
    another thread (the TUI decodes in a worker)."""
    turn = kwargs.get("turn")
    try:
        yield from _speculative_decode(target, draft, prompt_ids, block_size, max_new_tokens, sampler, draft_window,
                                       **kwargs)
    finally:
        if turn is not None and turn.ids is not None and turn.cache is not None:
            kept = [c.state for c in turn.cache] + (turn.draft_cache.arrays() if turn.draft_cache is not None else [])
            mx.eval(kept)


def _speculative_decode(
    target: Target,
    draft: Optional[DFlashDraft],
    prompt_ids: list[int],
    block_size: int,
    max_new_tokens: int,
    sampler: Sampler,
    draft_window: Optional[int] = None,
    cache: Optional[list] = None,
    draft_cache: Optional[DraftCache] = None,
    turn: Optional[TurnCache] = None,
    reuse: bool = False,
    split: Optional[int] = None,
    guide: Optional[Guide] = None,
) -> Generator[RawStep, None, None]:
    """Yields the prefill token, then one RawStep per verify step, up to max_new_tokens ids.
    `cache` / `draft_cache` may be passed in to observe them between steps (tests). With `turn` the
    caches are kept in it for the next request; with `reuse` a request starts from the longest prefix of
    `prompt_ids` they hold, and a hybrid target cuts its prefill at `split` (after the assistant header)
    and snapshots its linear-attention states there."""
    use_draft = block_size > 1
    reused = 0
    if turn is not None and cache is None and draft_cache is None:
        if turn.cache is not None:
            rollback = target.rollback_for(turn.cache)
            if reuse:
                reused = turn.resume(prompt_ids, rollback, use_draft)
        turn.ids = None  # the caches change from here on; valid again after each completed step
        if reused:
            cache = turn.cache
        else:
            cache = target.make_cache()
            turn.cache, turn.snapshots = cache, {}
            if turn.draft_cache is not None:
                turn.draft_cache.crop(0)
        if draft is not None:
            if turn.draft_cache is None:
                turn.draft_cache = DraftCache(draft, draft_window)
            turn.draft_cache.set_window(draft_window)
            turn.draft_cache.crop(reused)
            draft_cache = turn.draft_cache if use_draft else None
    else:
        turn = None  # kept only where this request makes its own caches
    cache = cache if cache is not None else target.make_cache()
    rollback = target.rollback_for(cache)
    drafter: Optional[DraftCache] = None  # the draft's cache, with a draft (block size > 1)
    if use_draft:
        if draft_cache is not None:
            drafter = draft_cache
        elif draft is not None:
            drafter = DraftCache(draft, draft_window)
        else:
            raise ValueError(f"block size {block_size} needs a draft")
    prompt = mx.array(prompt_ids, dtype=mx.int32)[None]
    # a hybrid target's prefill is cut at `split` (its linear-attention states are snapshotted there)
    if turn is None or not reuse or rollback.mode != "mixers" or split is None or not reused < split <= len(prompt_ids):
        split = None

    # Prefill as mlx-lm does: all but the last prompt token in chunks (only cache states and context
    # features evaluated, never their logits), then the last token alone for the first sampled token.
    t0 = time.perf_counter()
    done, n = reused, len(prompt_ids)
    while n - done > 1:
        chunk = min(PREFILL_STEP, n - done - 1)
        if split is not None and done < split < done + chunk:
            chunk = split - done
        _, features = target.forward(prompt[:, done: done + chunk], cache, capture=use_draft)
        if drafter is not None:
            drafter.append(features)
        mx.eval([c.state for c in cache] + (drafter.arrays() if drafter is not None else []))
        done += chunk
        if turn is not None and done == split:
            turn.snapshot(done, rollback)
    logits, features = target.forward(prompt[:, done:], cache, capture=use_draft)
    if drafter is not None:
        drafter.append(features)
    sampler.start(prompt_ids)
    want_logprobs, top_k = sampler.params.logprobs, sampler.params.top_logprobs
    sampler.allow = masks(guide)
    last = sampler(logits[0, -1:])  # [1], stays on the device
    sampler.allow = None
    sampler.observe(last)
    first_rows = sampler.logprob_rows(logits[0, -1:], last) if want_logprobs else None
    mx.eval(last, [c.state for c in cache], drafter.arrays() if drafter is not None else [],
            first_rows if first_rows is not None else [])
    if turn is not None and split == n:  # thinking on: the prompt ends with the assistant header
        turn.snapshot(n, rollback)
    first = cast(int, last.item())  # (mlx's stubs type item() as any scalar; an int32 array's is an int)
    if guide is not None:
        guide.settle(0, first)
    logprobs, tops = (unpack_logprobs(cast(list[list[float]], first_rows.tolist()), top_k) if first_rows is not None
                      else (None, None))
    held = list(prompt_ids)  # the ids the target cache holds
    if turn is not None:
        turn.ids = held
    yield RawStep(drafted=[], accepted=0, emitted=[first], draft_s=0.0, verify_s=time.perf_counter() - t0,
                  prefill=True, reused=reused, logprobs=logprobs, top_logprobs=tops)

    last_id = first
    generated, step, draft_share = 1, 0, 0.0
    mask_id = drafter.draft.mask_token_id if drafter is not None else 0
    # exact rejection sampling needs the draft's q: DFlash 2 at T > 0; DFlash 1 keeps exact match
    selector = drafter.draft.selector if drafter is not None else None
    rejection = selector is not None and not sampler.params.greedy
    walk_top_k = selector.top_k if selector is not None else 0  # the walk's candidates per slot
    mask = mx.full((max(block_size - 1, 1),), mask_id, dtype=mx.int32)
    while generated < max_new_tokens:
        b = min(block_size, max_new_tokens - generated)  # the last block shrinks: never more than asked
        if turn is not None:
            turn.ids = None
        t_start = time.perf_counter()
        timed = b > 1 and step % TIMING_EVERY == 0
        drafted: Optional[mx.array] = None
        q: Optional[mx.array] = None
        block = last
        if b > 1 and drafter is not None:  # (b > 1: block size > 1, so there is a draft)
            proposal = mx.concatenate([last, mask[: b - 1]])[None]
            if rejection:  # a DFlash 2 draft at T > 0: its walk sampled, q kept
                noise = sampler.exponential((b - 1, walk_top_k))
                drafted, q = drafter.propose_sampled(proposal, target.embed, target.lm_head,
                                                     sampler.params.temperature, noise, steer=guide)
            else:  # argmax proposals (a DFlash 2 draft's argmax walk)
                drafted = drafter.propose(proposal, target.embed, target.lm_head, steer=guide)
            block = mx.concatenate([last, drafted])
            if timed:
                mx.eval(block)
        t_mid = time.perf_counter()
        rollback.snapshot(b)
        logits, features = target.forward(block[None], cache, capture=use_draft)
        sampler.allow = masks(guide)
        if q is not None and drafted is not None:  # (q comes with drafted ids)
            agree, choice = rejection_verify(sampler.probs(logits[0], drafted), q, drafted, sampler)
            ids = mx.concatenate([drafted, choice, agree])
            # the token emitted at each position if the block stops after it: a kept drafted id, else the choice
            tokens = mx.concatenate([mx.where(agree > 0, drafted, choice[:-1]), choice[-1:]])
        else:
            choice = sampler(logits[0], drafted)  # the target's own token at every block position
            ids = mx.concatenate([drafted, choice]) if drafted is not None else choice
            tokens = choice  # a kept drafted id equals the choice there
        sampler.allow = None
        row_array = sampler.logprob_rows(logits[0], tokens) if want_logprobs else None
        rows: Optional[list[list[float]]]
        host: list[int]
        if row_array is None:
            # the one sync (mlx's stubs type tolist() as any nesting; a 1-D int32 array's is list[int])
            host = ids.tolist()  # type: ignore[assignment]
            rows = None
        else:  # the ids ride along as float32 (exact below 2**24) in the same sync
            flat: list[float] = mx.concatenate([ids.astype(mx.float32), row_array.reshape(-1)]).tolist()  # type: ignore[assignment]
            width = row_array.shape[1]
            host, flat = [int(x) for x in flat[: ids.shape[0]]], flat[ids.shape[0]:]
            rows = [flat[i * width: (i + 1) * width] for i in range(b)]
        if q is not None:
            kept = host[2 * b - 1:]
        t_end = time.perf_counter()
        drafted_ids, chosen = host[: b - 1], host[b - 1: 2 * b - 1]
        if q is None:  # exact match: kept while the target's own token agrees
            kept = [int(d == c) for d, c in zip(drafted_ids, chosen)]
        accepted = 0
        while accepted < b - 1 and kept[accepted]:
            accepted += 1
        rollback.rollback(b, accepted + 1, lambda keep, block=block: target.forward(block[None, :keep], cache, capture=False))
        if drafter is not None:
            drafter.append(features[:, : accepted + 1])
        held.append(last_id)
        held += drafted_ids[:accepted]
        last_id = chosen[accepted]
        if guide is not None:
            guide.settle(accepted, last_id)
        if turn is not None:
            turn.ids = held
        last = choice[accepted: accepted + 1]
        sampler.observe(mx.concatenate([block[1: accepted + 1], last]))  # the emitted ids, lazily
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
        logprobs, tops = unpack_logprobs(rows[: accepted + 1], top_k) if rows is not None else (None, None)
        yield RawStep(
            drafted=drafted_ids,
            accepted=accepted,
            emitted=drafted_ids[:accepted] + [chosen[accepted]],
            draft_s=draft_s,
            verify_s=verify_s,
            logprobs=logprobs,
            top_logprobs=tops,
        )
