"""The speculative loop (DESIGN.md, "The loop"), as one function.

After prefill the target cache holds the prompt; the first sampled token is not yet in it. Each step
drafts a block [last, mask x (B-1)] at positions start.., verifies it in one target pass, keeps the
drafted ids up to the first disagreement plus the target's own token there, crops the target cache to
the committed tokens minus the newest, and feeds the draft the features of the newly committed ones.
Block size 1 is plain autoregressive decoding through the same code.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator, Optional

import torch

from dflash_tui.engines.cuda.cache import CachePool, TurnCache, bucket_layers, reserve
from dflash_tui.engines.cuda.draft import DFlashDraft, DraftCache, Proposal
from dflash_tui.engines.cuda.graphs import StepGraphs
from dflash_tui.engines.cuda.target import Target
from dflash_tui.engines.engine import RawStep
from dflash_tui.engines.events import TopLogprob
from dflash_tui.engines.guided import Guide, stack_rows
from dflash_tui.engines.sampling import SamplingParams

HOST_SYNC = "dflash::host_sync"  # the profiler's name for the loop's one device-to-host copy per step


def to_host(ids: torch.Tensor) -> list[Any]:
    """The ids as a Python list (ints; floats for a float64 tensor): the loop's one host sync per step,
    named so a profile can count it."""
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
        self.penalizer: Optional[Penalizer] = None
        self.allow: Optional[torch.Tensor] = None  # a constrained request's masks [n, vocab] for the next call

    def start(self, prompt_ids: list[int], device: torch.device) -> None:
        """A request begins: the penalties' counts start from its prompt (nothing to do without them)."""
        self.penalizer = Penalizer(self.params, prompt_ids, device) if self.params.penalized else None

    def observe(self, emitted: torch.Tensor) -> None:
        """Ids [n] (on the device) the request emitted: they count toward the penalties from now on."""
        if self.penalizer is not None:
            self.penalizer.observe(emitted)

    def penalize(self, logits: torch.Tensor, drafted: Optional[torch.Tensor] = None) -> torch.Tensor:
        """float32 logits [n, vocab] with the request's bias and penalties applied, row j counting the
        drafted ids [n - 1] before it (the block's own prefix), then a constrained request's masks (`allow`:
        -inf where the grammar forbids); the logits as they are without either."""
        logits = logits.float()
        if self.penalizer is not None:
            logits = self.penalizer(logits, drafted)
        if self.allow is not None:
            logits = logits.masked_fill(~self.allow[: logits.shape[0]], float("-inf"))
        return logits

    def __call__(self, logits: torch.Tensor, drafted: Optional[torch.Tensor] = None) -> torch.Tensor:
        """logits [n, vocab] -> ids [n] (`drafted`: the block's drafted ids [n - 1], for the penalties)."""
        if self.params.greedy:  # (without penalties or masks the logits as they are: no float32 copy)
            plain = self.penalizer is None and self.allow is None
            return (logits if plain else self.penalize(logits, drafted)).argmax(dim=-1)
        return self.race(self.probs(logits, drafted))

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

    def verify(self, logits: torch.Tensor, proposal: Optional["Proposal"],
               drafted: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The target's token at every block position [b], from logits [b, vocab], such that keeping the
        drafted ids up to the first position where they differ is the acceptance rule. Greedy, or a draft
        without a distribution (DFlash 1): the target's own choice (exact match). A DFlash 2 draft at T > 0:
        exact rejection sampling (docs/dflash2.md; `rejection_choice`). `drafted` (the block's drafted ids
        [b - 1]) gives each position's penalties its own prefix."""
        if self.params.greedy or proposal is None or proposal.q is None:
            return self(logits, drafted)
        return rejection_choice(self.probs(logits, drafted), proposal, self.generator, self.race)

    def logprob_rows(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Per position [n, 1 + 2k] float64: the raw log-probability of tokens [n] under logits [n, vocab]
        (before bias, penalties, temperature and truncation: vLLM's default "raw" logprobs), then the k =
        top_logprobs most likely ids and their log-probabilities. Stays on the device."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        parts = [lp.gather(1, tokens[:, None])]
        if self.params.top_logprobs > 0:
            top = torch.topk(lp, self.params.top_logprobs, dim=-1)
            parts += [top.indices.to(lp.dtype), top.values]
        return torch.cat(parts, dim=1).double()

    def probs(self, logits: torch.Tensor, drafted: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The target's distribution after the penalties (`penalize`), temperature, top_k, top_p and min_p:
        [n, vocab] float32."""
        p = self.params
        logits = self.penalize(logits, drafted) / p.temperature
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


class Penalizer:
    """The request's logit_bias and presence / frequency / repetition penalties (engines.config.Penalties),
    on the device: `seen` marks the ids of the prompt and the output so far (repetition), `counts` counts
    the output's ids (presence, frequency). A verified block's row j adds the drafted ids before it, so
    every position is penalized by its own prefix, as a block-1 run would be at that position."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], device: torch.device):
        self.params, self.device = params, device
        self.prompt = torch.tensor(prompt_ids, dtype=torch.long, device=device)
        # sized from the first logits (the target's vocab rows): `seen` is set with `counts`
        self.counts: Optional[torch.Tensor] = None
        self.seen: torch.Tensor
        self.bias: Optional[torch.Tensor] = None

    def _ready(self, vocab: int) -> torch.Tensor:
        """The counts, sized to `vocab` on the first call (with `seen` and `bias`)."""
        if self.counts is not None:
            return self.counts
        self.seen = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.seen[self.prompt] = True
        self.counts = counts = torch.zeros(vocab, dtype=torch.float32, device=self.device)
        self.bias = None
        if self.params.logit_bias:
            ids = [i for i in self.params.logit_bias if i < vocab]
            self.bias = torch.zeros(vocab, dtype=torch.float32, device=self.device)
            self.bias[torch.tensor(ids, dtype=torch.long, device=self.device)] = torch.tensor(
                [self.params.logit_bias[i] for i in ids], dtype=torch.float32, device=self.device)
        return counts

    def observe(self, emitted: torch.Tensor) -> None:
        if self.counts is None:
            return
        self.counts.index_add_(0, emitted, torch.ones(emitted.shape, dtype=self.counts.dtype, device=self.device))
        self.seen[emitted] = True

    def __call__(self, logits: torch.Tensor, drafted: Optional[torch.Tensor]) -> torch.Tensor:
        n, vocab = logits.shape
        counts = self._ready(vocab).expand(n, vocab)
        p = self.params
        seen = self.seen.expand(n, vocab)
        if drafted is not None and drafted.numel() and n > 1:
            ahead = torch.zeros(n, vocab, dtype=counts.dtype, device=logits.device)
            ahead[1:].scatter_(1, drafted[: n - 1, None], 1.0)
            counts = counts + ahead.cumsum(dim=0)  # row j: the output's counts plus drafted[:j]
            seen = seen | (counts > 0)
        if self.bias is not None:
            logits = logits + self.bias
        if p.repetition_penalty != 1.0:
            r = p.repetition_penalty
            logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
        if p.frequency_penalty:
            logits = logits - p.frequency_penalty * counts
        if p.presence_penalty:
            logits = logits - p.presence_penalty * (counts > 0).to(logits.dtype)
        return logits


def read_step(ids: torch.Tensor, rows: Optional[torch.Tensor]) -> tuple[list[int], Optional[list[list[float]]]]:
    """The step's one host sync: ids [n] and, when logprobs are asked for, their rows [m, width] (float64,
    which holds every id exactly) copied in the same transfer."""
    if rows is None:
        return to_host(ids), None
    host = to_host(torch.cat([ids.double(), rows.flatten()]))
    n, width = ids.shape[0], rows.shape[1]
    return [int(x) for x in host[:n]], [host[n + i * width: n + (i + 1) * width] for i in range(rows.shape[0])]


def unpack_logprobs(rows: list[list[float]], k: int) -> tuple[list[float], Optional[list[list[TopLogprob]]]]:
    """Rows from `Sampler.logprob_rows` -> (the tokens' log-probabilities, [[id, logprob] x k] per token)."""
    logprobs = [row[0] for row in rows]
    if k <= 0:
        return logprobs, None
    return logprobs, [[[int(i), v] for i, v in zip(row[1: 1 + k], row[1 + k: 1 + 2 * k])] for row in rows]


def acceptance(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """The chance of keeping a drafted token x: min(1, p(x) / q(x))."""
    return (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What the target samples from at the first rejection: max(0, p - q), normalized (p itself where that
    is all zero, which happens only where p = q and so no rejection can occur)."""
    rest = (p - q).clamp(min=0)
    total = rest.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp(min=torch.finfo(p.dtype).tiny), p)


def rejection_choice(p: torch.Tensor, proposal: Proposal, generator: Optional[torch.Generator],
                     race: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Exact speculative sampling over one block, on the device: p [b, vocab] the target's distributions,
    the proposal's ids [b-1] drawn from q (candidates and probabilities [b-1, K]). Position j keeps x_j with
    probability acceptance(p_j(x_j), q_j(x_j)), else holds a draw from residual(p_j, q_j), which never
    equals x_j; the last position holds a draw from p (the bonus token after a fully accepted block).
    The loop then keeps the drafted ids up to the first position that differs: that is the rule."""
    ids, candidates, q_candidates = proposal.ids, proposal.candidates, proposal.q
    if candidates is None or q_candidates is None:
        raise ValueError("rejection sampling needs the draft's distribution q (a DFlash 2 proposal)")
    n = ids.shape[0]
    q = torch.zeros_like(p[:n]).scatter_(1, candidates, q_candidates.to(p.dtype))
    x = ids[:, None]
    kept = torch.rand(n, device=p.device, generator=generator) < acceptance(p[:n].gather(1, x)[:, 0], q.gather(1, x)[:, 0])
    instead = race(residual(p[:n], q))
    return torch.cat([torch.where(kept, ids, instead), race(p[n:])])


def masks(guide: Optional[Guide], device: torch.device) -> Optional[torch.Tensor]:
    """A constrained request's masks along the block it just drafted ([n, vocab] bool on the device), None
    without a constraint or where every position is free (the reasoning)."""
    if guide is None:
        return None
    rows = stack_rows(guide.rows(), guide.vocab_rows)
    return None if rows is None else torch.from_numpy(rows).to(device)


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
    guide: Optional[Guide] = None,
) -> Generator[RawStep, None, None]:
    """Yields the prefill token, then one RawStep per verify step, up to max_new_tokens ids.
    `cache` / `draft_cache` may be passed in to observe them between steps (tests); otherwise they come
    from `pool` (reused across requests) or are allocated for this request. With `graphs`, every step
    replays the captured block-size step (a shrunk last block padded to it).

    With `turn` (pooled caches only) the caches this request leaves are recorded in it; with `reuse` the
    request starts from the longest prefix of `prompt_ids` they hold and prefills only the rest. A hybrid
    target then prefills in two chunks cut at `split` (just after the assistant header) and keeps a
    snapshot of its linear-attention states there.

    With `guide` (a constrained request, engines/guided.py) the draft is steered by the grammar and every
    verified position's logits are masked by the grammar at that position; such a request runs the eager
    steps (the masks are built on the host between the draft and the verify)."""
    device, clock = target.device, Clock(target.device)
    use_draft = block_size > 1
    prompt_len = len(prompt_ids)
    room = prompt_len + max_new_tokens + block_size  # a verify writes at most one block past the committed
    reused = 0
    if turn is not None and pool is not None and cache is None and draft_cache is None:
        if reuse:
            reused = turn.resume(prompt_ids, pool.draft_length() if use_draft else None)
        turn.ids = None  # the caches change from here on; valid again after each completed step
        if reused:
            cache = turn.cache
            pool.crop_draft(reused)
        else:
            turn.snapshots = {}
            pool.crop_draft(0)
    else:
        turn = None  # recorded only where the pool's caches serve this request
    if cache is None:
        cache = pool.target_cache(room) if pool else target.new_cache(room)
    reserve(cache, room)
    drafter: Optional[DraftCache] = None  # the draft's cache, with a draft (block size > 1)
    if use_draft:
        if draft_cache is not None:
            drafter = draft_cache
        elif pool:
            drafter = pool.draft_cache(draft_window, room, reused)
        elif draft is not None:
            drafter = DraftCache(draft, draft_window, room)
        else:
            raise ValueError(f"block size {block_size} needs a draft")
        drafter.reserve(room)
    if graphs is not None:
        captures = graphs.captures
        # None: a capture failed, run eager
        ready = graphs.ready(cache, drafter, block_size, prompt_len - 1, room)
        if graphs.captures != captures:
            # a capture ran its warm-up passes over these buffers, whether or not it then succeeded:
            # nothing they kept survives it
            reused = 0
            if drafter is not None:
                drafter.length = 0
        graphs = ready
        for layer in bucket_layers(cache):
            layer.length = reused
    if turn is not None:
        turn.cache = cache

    t0 = clock.mark()
    bounds = [reused, prompt_len]
    # a hybrid target's prefill is cut at `split` (its linear-attention states are kept there)
    if turn is None or not reuse or not target.rollback or split is None or not reused < split <= prompt_len:
        split = None
    elif split < prompt_len:
        bounds = [reused, split, prompt_len]
    for a, b in zip(bounds, bounds[1:]):
        logits, features = target.forward(torch.tensor([prompt_ids[a:b]], device=device), a, cache, last_only=True,
                                          capture=use_draft)
        target.commit(cache, b - a, b - a)
        if drafter is not None:
            drafter.append(features)
        if turn is not None and b == split:
            turn.snapshot(b)
    sampler.start(prompt_ids, device)
    want_logprobs, top_k = sampler.params.logprobs, sampler.params.top_logprobs
    sampler.allow = masks(guide, device)
    last = sampler(logits[0, -1:])  # [1], stays on the device
    sampler.allow = None
    sampler.observe(last)
    ids, rows = read_step(last, sampler.logprob_rows(logits[0, -1:], last) if want_logprobs else None)
    (first,) = ids
    if guide is not None:
        guide.settle(0, first)
    logprobs, tops = unpack_logprobs(rows, top_k) if rows is not None else (None, None)
    held = list(prompt_ids)  # the ids the target cache holds
    if turn is not None:
        turn.ids = held
    yield RawStep(drafted=[], accepted=0, emitted=[first], draft_s=0.0, verify_s=clock.seconds(t0, clock.mark()),
                  prefill=True, reused=reused, logprobs=logprobs, top_logprobs=tops)

    generated = 1
    last_id = first
    mask_id = drafter.draft.mask_token_id if drafter is not None else 0
    mask_block = torch.full((1, block_size), mask_id, dtype=torch.long, device=device)
    selector = drafter.draft.candidate_selector if drafter is not None else None  # DFlash 2's
    while generated < max_new_tokens:
        b = min(block_size, max_new_tokens - generated)  # the last block shrinks: never more than asked
        start = prompt_len + generated - 1
        step_graphs = graphs if graphs is not None and guide is None and graphs.covers(start, block_size) else None
        if turn is not None:
            turn.ids = None
        t_draft = clock.mark()
        proposal: Optional[Proposal] = None
        if step_graphs is not None:  # a shrunk last block runs padded to the captured size; only its first b count
            block, proposal = step_graphs.draft_step(last, start, block_size, sampler, b)
            t_verify = clock.mark()
            logits = step_graphs.verify_step(block_size)
        else:
            block = mask_block[:, :b].clone()
            block[0, :1] = last
            if b > 1 and drafter is not None:  # (b > 1: block size > 1, so there is a draft)
                noise, walk_t = sampler.walk_noise(b - 1, selector.top_k, device) if selector is not None else (None, None)
                proposal = drafter.propose(block, target.embed, target.lm_head, noise, walk_t, steer=guide)
                block[0, 1:] = proposal.ids
            t_verify = clock.mark()
            target.before_verify(cache, b)
            logits, features = target.forward(block, start, cache, last_only=False, capture=use_draft)
        # the target's token at every block position (a padded block's first b), by the acceptance rule
        sampler.allow = masks(guide, device)
        choice = sampler.verify(logits[0, :b], proposal.first(b - 1) if proposal is not None and b > 1 else None,
                                block[0, 1:b])
        sampler.allow = None
        t_end = clock.mark()
        # the emitted ids are choice[:accepted + 1] (a kept drafted id equals the choice there)
        row_tensor = sampler.logprob_rows(logits[0, :b], choice) if want_logprobs else None
        host, rows = read_step(torch.cat([block[0, 1:b], choice]), row_tensor)  # the step's one host sync
        drafted, chosen = host[: b - 1], host[b - 1:]
        accepted = 0
        while accepted < b - 1 and drafted[accepted] == chosen[accepted]:
            accepted += 1
        if step_graphs is not None:  # both caches hold the whole block: move their lengths
            step_graphs.commit(start, accepted + 1)
        else:
            target.commit(cache, accepted + 1, b)  # keep every committed token except the newest
            if drafter is not None:
                drafter.append(features[:, : accepted + 1])
        held.append(last_id)
        held += drafted[:accepted]
        last_id = chosen[accepted]
        if guide is not None:
            guide.settle(accepted, last_id)
        if turn is not None:
            turn.ids = held
        last = choice[accepted: accepted + 1]
        sampler.observe(choice[: accepted + 1])  # on the device: no sync
        generated += accepted + 1
        logprobs, tops = unpack_logprobs(rows[: accepted + 1], top_k) if rows is not None else (None, None)
        yield RawStep(
            drafted=drafted,
            accepted=accepted,
            emitted=drafted[:accepted] + [chosen[accepted]],
            draft_s=clock.seconds(t_draft, t_verify),
            verify_s=clock.seconds(t_verify, t_end),
            logprobs=logprobs,
            top_logprobs=tops,
        )
