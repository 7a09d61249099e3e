"""Exact rejection sampling for DFlash 2 drafts (docs/dflash2.md, "Verification"), in two layers.

1. The rule itself, by enumeration: for given p, q and every drafted token, the distribution of what one
   verify position emits (the drafted token if kept, else a residual draw), and the bonus token after a
   fully accepted block, equal p exactly. A broken acceptance rule (keep when p > q) does not.
2. End to end through the cuda engine's loop: over 600 seeds, the marginal distribution of the token at
   each position past the prefill (a fully accepted block and its bonus token included) fits target-only
   sampling, whose marginals are enumerated exactly, by a chi-square test; the broken rule fails it.
"""

import pytest

torch = pytest.importorskip("torch")

from dflash_tui.engines.cuda import loop  # noqa: E402 - after the importorskip above
from dflash_tui.engines.cuda.draft import DraftCache, Proposal  # noqa: E402
from dflash_tui.engines.cuda.loop import Sampler, acceptance, rejection_choice, residual  # noqa: E402
from dflash_tui.engines.sampling import SamplingParams  # noqa: E402

F64 = torch.float64


def broken_acceptance(p_x, q_x):
    """A plausible-looking wrong rule: keep the drafted token whenever the target likes it more."""
    return (p_x > q_x).to(p_x.dtype)


def emitted_distribution(p: torch.Tensor, q: torch.Tensor, accept) -> torch.Tensor:
    """What one verify position emits, enumerated over the drafted token x ~ q: x with probability
    q(x) accept(x), else a draw from residual(p, q)."""
    xs = torch.arange(p.shape[0])
    kept = q * accept(p[xs], q[xs])
    return kept + (q - kept).sum() * residual(p[None], q[None])[0]


def random_rows(gen: torch.Generator, rows: int, vocab: int, zeros: int) -> torch.Tensor:
    """Distributions with some exact zeros (truncated targets, candidate-only proposals)."""
    x = torch.rand(rows, vocab, generator=gen, dtype=F64) ** 3
    for r in range(rows):
        x[r, torch.randperm(vocab, generator=gen)[:zeros]] = 0
    return x / x.sum(-1, keepdim=True)


@pytest.mark.parametrize("seed", range(20))
def test_each_position_emits_p_by_enumeration(seed):
    gen = torch.Generator().manual_seed(seed)
    p, q = random_rows(gen, 4, 6, seed % 3), random_rows(gen, 4, 6, 2)
    for j in range(4):
        assert torch.allclose(emitted_distribution(p[j], q[j], acceptance), p[j], atol=1e-12)
    assert any(not torch.allclose(emitted_distribution(p[j], q[j], broken_acceptance), p[j], atol=1e-3)
               for j in range(4))


def test_the_block_output_is_p_at_every_position_by_enumeration():
    """A 3-token block over a 4-token vocabulary: every drafted sequence (x1, x2) ~ q1 q2 and every
    accept/reject path, weighted exactly; the emitted sequence's distribution is p1 p2 p3 (the bonus
    token after a full acceptance included), position by position and jointly."""
    gen = torch.Generator().manual_seed(7)
    V = 4
    p, q = random_rows(gen, 3, V, 1), random_rows(gen, 2, V, 1)

    def joint(accept) -> dict:
        out: dict = {}

        def add(seq, w):
            out[seq] = out.get(seq, 0.0) + w

        for x1 in range(V):
            for x2 in range(V):
                wq = q[0, x1] * q[1, x2]
                a1, a2 = accept(p[0, x1], q[0, x1]), accept(p[1, x2], q[1, x2])
                r1, r2 = residual(p[:1], q[:1])[0], residual(p[1:2], q[1:2])[0]
                for y in range(V):
                    add((y,), wq * (1 - a1) * r1[y])  # rejected at 1: one token, the residual's
                    add((x1, y), wq * a1 * (1 - a2) * r2[y])  # kept 1, rejected at 2
                    add((x1, x2, y), wq * a1 * a2 * p[2, y])  # all kept, then the bonus from p3
        return out

    def is_p(out) -> bool:
        # emitted sequences stop early on a rejection; continuing each with the target's own sampling
        # must give exactly p1 p2 p3 for every full sequence
        for y1 in range(V):
            for y2 in range(V):
                for y3 in range(V):
                    w = out.get((y1,), 0) * p[1, y2] * p[2, y3] + out.get((y1, y2), 0) * p[2, y3] \
                        + out.get((y1, y2, y3), 0)
                    if abs(float(w) - float(p[0, y1] * p[1, y2] * p[2, y3])) > 1e-12:
                        return False
        return True

    assert is_p(joint(acceptance))
    assert not is_p(joint(broken_acceptance))


def test_rejection_choice_draws_what_the_enumeration_says():
    """The device implementation (one rand per position, an exponential race for the residual and the
    bonus) against the enumerated distribution: 20,000 draws of one 3-position block, chi-square."""
    gen = torch.Generator().manual_seed(3)
    V, draws = 6, 20000
    p = random_rows(gen, 3, V, 1).float()
    q = random_rows(gen, 2, V, 2).float()
    sampler = Sampler(SamplingParams(temperature=1.0, seed=11), torch.device("cpu"))
    candidates = torch.arange(V).expand(2, V)
    counts = torch.zeros(V)
    emitted_first = torch.zeros(V)
    for _ in range(draws):
        x = torch.stack([torch.multinomial(q[j], 1, generator=gen)[0] for j in range(2)])
        choice = rejection_choice(p, Proposal(x, candidates, q), sampler.generator, sampler.race)
        emitted_first[choice[0]] += 1
        if choice[0] == x[0]:  # position 2 is reached only when position 1 kept its draft
            counts[choice[1]] += 1
    expected_first = emitted_distribution(p[0].double(), q[0].double(), acceptance)
    assert torch.allclose(expected_first, p[0].double(), atol=1e-6)
    chi2 = (((emitted_first - draws * p[0]) ** 2) / (draws * p[0]).clamp(min=1e-9))[p[0] > 0].sum()
    assert chi2 < 25.7  # chi-square, 5 degrees of freedom, false alarm 1e-4
    reached = counts.sum()
    chi2 = (((counts - reached * p[1]) ** 2) / (reached * p[1]).clamp(min=1e-9))[p[1] > 0].sum()
    assert chi2 < 25.7


# -- end to end -------------------------------------------------------------------------------------

SEEDS = 600
BLOCK = 3
NEW = BLOCK + 2  # a fully accepted block and its bonus token fit in every run
TOP_K = 6  # the target's distribution is truncated to 6 tokens: its marginals can be enumerated exactly


class MostlyRightDraftCache(DraftCache):
    """A DFlash 2 style proposal that is often right: at each slot, the target's greedy continuation with
    probability 0.7 and the next token id with 0.3, drawn from its own generator, with that q."""

    def __init__(self, draft, greedy: list[int], prompt_len: int, seed: int):
        super().__init__(draft, None)
        self.greedy, self.prompt_len = greedy, prompt_len
        self.gen = torch.Generator().manual_seed(10_000 + seed)

    def propose(self, block, embed, lm_head, noise=None, temperature=None, steer=None):
        n = block.shape[1] - 1
        first = self.length - self.prompt_len + 1
        right = torch.tensor([self.greedy[i] if i < len(self.greedy) else 0 for i in range(first, first + n)])
        candidates = torch.stack([right, (right + 1) % 320], dim=1)
        q = torch.tensor([[0.7, 0.3]]).expand(n, 2)
        pick = (torch.rand(n, generator=self.gen) >= 0.7).long()
        return Proposal(candidates.gather(1, pick[:, None])[:, 0], candidates, q)


def sampled_counts(engine, ids, greedy, seeds: int = SEEDS) -> torch.Tensor:
    """Counts [NEW, vocab] of the token at each position over `seeds` seeded speculative runs."""
    counts = torch.zeros(NEW, 320)
    for seed in range(seeds):
        sampler = Sampler(SamplingParams(temperature=1.0, top_k=TOP_K, seed=seed), engine.target.device)
        draft_cache = MostlyRightDraftCache(engine.draft, greedy, len(ids), seed)
        out = []
        for step in loop.speculative_decode(engine.target, engine.draft, ids, BLOCK, NEW, sampler,
                                            cache=engine.target.new_cache(64), draft_cache=draft_cache):
            out += step.emitted
        counts[torch.arange(NEW), torch.tensor(out[:NEW])] += 1
    return counts


@torch.inference_mode()
def exact_marginals(engine, ids) -> torch.Tensor:
    """The target-only marginal [NEW, vocab] of the token at each position, by enumerating every prefix
    the truncated target can write (TOP_K ** (NEW - 1) of them, in batched forwards)."""
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=TOP_K, seed=0), engine.target.device)
    prefixes, weights = torch.tensor([ids]), torch.ones(1, dtype=F64)
    out = torch.zeros(NEW, 320, dtype=F64)
    for position in range(NEW):
        logits = engine.target.model(input_ids=prefixes).logits[:, -1]
        p = sampler.probs(logits).double()  # the loop's own processing of the target's logits
        out[position] = (weights[:, None] * p).sum(0)
        if position + 1 < NEW:
            prob, token = torch.topk(p, TOP_K, dim=-1)
            weights = (weights[:, None] * prob).reshape(-1)
            prefixes = torch.cat([prefixes.repeat_interleave(TOP_K, 0), token.reshape(-1, 1)], dim=1)
    return out


def chi2_fit(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """Goodness of fit of counts to p: bins of expected count under 5 are pooled into one."""
    n = counts.sum()
    expected = n * p.float()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def critical(df: int) -> float:
    """The chi-square value exceeded with probability 1e-3 at `df` degrees of freedom (Wilson-Hilferty:
    within 1% of the exact quantile from df = 3 up; z = 3.09 is the normal's 1e-3 upper quantile). Five
    positions at 1e-3 each: a false-alarm rate of 5e-3 in all, and the seeds are fixed, so a given build
    passes or fails the same way every run."""
    a = 2 / (9 * df)
    return df * (1 - a + 3.09 * a ** 0.5) ** 3


@pytest.fixture(scope="module")
def sampled(pairs):
    from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine
    from tests.oracles import transformers_greedy
    from tests.tiny_dflash2 import make_dflash2_draft

    target, _ = pairs("qwen3")
    draft = make_dflash2_draft(target.parent / "rejection-draft2", target, [0, 2])
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                      dtype="float32"))
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    return engine, ids, transformers_greedy(target, ids, NEW + BLOCK), exact_marginals(engine, ids)


def worst_fit(counts, exact) -> float:
    """The largest chi-square over the positions, as a multiple of its critical value."""
    worst = 0.0
    for position in range(NEW):
        chi2, df = chi2_fit(counts[position], exact[position])
        worst = max(worst, chi2 / critical(df))
    return worst


def test_rejection_sampling_keeps_the_target_distribution_end_to_end(sampled):
    engine, ids, greedy, exact = sampled
    counts = sampled_counts(engine, ids, greedy)
    assert worst_fit(counts, exact) < 1


def test_a_broken_acceptance_rule_fails_end_to_end(sampled, monkeypatch):
    engine, ids, greedy, exact = sampled
    monkeypatch.setattr(loop, "acceptance", broken_acceptance)
    assert worst_fit(sampled_counts(engine, ids, greedy, SEEDS // 3), exact) > 1  # its bias shows in far fewer runs
