"""Acceptance meets its theory, on both engines (issue 44, item 3; docs/dflash2.md, "Checking acceptance").

At one verify position the rule accepts the drafted token with probability sum_x min(p(x), q(x)): p the
target's distribution after temperature and top-p, q the distribution the draft drew its token from
(DFlash 2: softmax(score / T) over the selector's candidates; DFlash 1, which keeps exact match, drafts
its argmax, a point mass, so the rate is p(argmax)). Whatever token comes out is distributed as p.

The pair: the tiny random qwen3 target with its head turned so that p and the draft's q share their
likely tokens (six "hot" rows of lm_head scaled up, the rest down); the target keeps real entropy at
T = 0.7 and 1 (checked per anchor). Anchors are positions of a sampled continuation, the ones where the
draft and target overlap most (a weak overlap makes a weak test).

Theory, independently of the engines: p from transformers' logits at each anchor with the temperature
and top-p applied here in float64, q from tests/reference_dflash2.py's float64 draft at the same anchor.
Measured, through each engine's own code: its target's logits at the anchor, its draft's hidden states
for the block [anchor, mask x 7], its DFlash 2 walk (`propose`, the first slot) with noise from its
sampler, and its acceptance code (cuda: `Sampler.verify`, which runs `rejection_choice`; mlx:
`rejection_verify` on `Sampler.probs`, as its loop calls them) on many rows at once: one row per trial,
each row an independent first slot, which is what those functions compute per block position.

Checks per engine, draft and sampling setting: the engine's p and q equal the reference's; the first
slot's acceptance rate equals E[sum_x min(p, q)] within Z standard errors; the drafted tokens are
distributed as q (the walk samples the q it reports); the emitted tokens as p (chi-square against the
target's probabilities, pooled over anchors). Z and the chi-square level are Bonferroni-corrected over
every check in this file at a family-wise false-alarm rate of 1%, and the seeds are fixed: a correct
build passes every run, and the sizes give the checks power (a rate off by a tenth is caught).
"""

from __future__ import annotations

import math
import shutil
from statistics import NormalDist

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dflash_tui.engines import GenerationRequest  # noqa: E402 - after the importorskip above
from tests import tiny_dflash2  # noqa: E402
from tests.oracles import engine_for  # noqa: E402
from tests.reference_dflash2 import ReferenceDraft, target_context_features  # noqa: E402

BLOCK = 8
ANCHORS = 8  # per draft
TRIALS = 320  # per anchor: 2560 first slots per engine, DFlash 2 draft and setting
TRIALS1 = 4 * TRIALS  # DFlash 1 (its trials cost one target sample each, and its rates are lower)
POOL = 48  # sampled tokens after the prompt, whose positions are the candidate anchors
HOT = list(range(40, 46))  # lm_head rows scaled up (ordinary byte-level tokens)
DFLASH2 = [(0.7, 1.0), (1.0, 1.0), (0.7, 0.9), (1.0, 0.9)]  # (temperature, top_p)
DFLASH1 = [(1.0, 1.0), (0.7, 0.9)]
ENGINES = ["cuda", "mlx"]
# every check below: DFlash 2 (acceptance, drafted, emitted) and DFlash 1 (acceptance, emitted) settings
CHECKS = len(ENGINES) * (3 * len(DFLASH2) + 2 * len(DFLASH1))
ALPHA = 0.01 / CHECKS  # Bonferroni: a family-wise false-alarm rate of 1%
Z = NormalDist().inv_cdf(1 - ALPHA / 2)  # two-sided


# -- the theory, independently of the engines -------------------------------------------------------------

def target_probs(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """p after temperature and top-p (the smallest set of most likely tokens whose mass reaches top_p),
    float64."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        cut = np.zeros_like(p, dtype=bool)
        cut[order[before >= top_p]] = True
        p = np.where(cut, 0.0, p)
        p /= p.sum()
    return p


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom > x), exactly (the series for integer df)."""
    h = x / 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= h / k
            total += term
        return math.exp(-h) * total
    total, term = math.erfc(math.sqrt(h)), math.sqrt(h) / math.gamma(1.5)
    for k in range(1, (df + 1) // 2):
        total += math.exp(-h) * term
        term *= h / (k + 0.5)
    return total


def chi2_pvalue(counts: np.ndarray, expected: np.ndarray) -> tuple[float, int, float]:
    """Pearson's goodness of fit of counts to expected counts (bins expected under 5 pooled into one;
    counts in a bin of expected 0 make it fail). Returns (p-value, degrees of freedom, statistic)."""
    if counts[expected <= 0].sum() > 0:
        return 0.0, 0, math.inf
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return chi2_sf(stat, df), df, stat


@pytest.fixture(scope="module")
def pair(pairs, tmp_path_factory):
    """The tiny qwen3 target with its head turned (HOT rows x2, the rest x0.2), its DFlash 1 draft, and a
    DFlash 2 draft trained at block 8."""
    from safetensors.torch import load_file, save_file

    source, draft1 = pairs("qwen3")
    root = tmp_path_factory.mktemp("acceptance")
    target = root / "target"
    shutil.copytree(source, target)
    weights = load_file(str(target / "model.safetensors"))
    scale = torch.full((weights["lm_head.weight"].shape[0], 1), 0.2)
    scale[HOT] = 2.0
    weights["lm_head.weight"] = (weights["lm_head.weight"] * scale).contiguous()
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    draft2 = tiny_dflash2.make_dflash2_draft(root / "draft2", target, [0, 2], block_size=BLOCK)
    return target, draft1, draft2


@pytest.fixture(scope="module")
def theory(pair):
    """The anchors and, per anchor, the reference's p (per setting) and q (per temperature) or the DFlash 1
    argmax: {"dflash2": [...], "dflash1": [...]}, each anchor a dict with the sequence position `at`."""
    from transformers import AutoModelForCausalLM

    target, draft1, draft2 = pair
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    engine = engine_for("cuda", target)  # only for the chat template's prompt ids
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    torch.manual_seed(4)
    with torch.no_grad():
        seq = model.generate(torch.tensor([ids]), max_new_tokens=POOL, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, eos_token_id=None, pad_token_id=0, min_new_tokens=POOL)[0].tolist()
        logits = model(torch.tensor([seq])).logits[0].double().numpy()
    features = target_context_features(target, seq, [0, 2])
    settings = sorted(set(DFLASH2 + DFLASH1))
    kinds = {}
    for kind, draft_dir, wanted in (("dflash2", draft2, DFLASH2), ("dflash1", draft1, DFLASH1)):
        reference = ReferenceDraft(draft_dir, target)
        pool = []
        for at in range(len(ids) - 1, len(seq) - 1):  # anchor seq[at], context seq[:at]
            block = reference.draft_block(features[:at], seq[at], BLOCK)
            p = {s: target_probs(logits[at], *s) for s in settings}
            if kind == "dflash2":
                cand = block.candidates[0].numpy()
                q = {}
                for t in {s[0] for s in wanted}:
                    q[t] = np.zeros(logits.shape[1])
                    q[t][cand] = torch.softmax(block.scores[0] / t, dim=-1).numpy()
                rate = {s: float(np.minimum(p[s], q[s[0]]).sum()) for s in wanted}
                pool.append(dict(at=at, anchor=seq[at], p=p, q=q, rate=rate))
            else:
                x = block.ids[0]
                pool.append(dict(at=at, anchor=seq[at], p=p, x=x, rate={s: float(p[s][x]) for s in wanted}))
        # real entropy: no setting's p is nearly one-hot at an anchor
        pool = [a for a in pool if all(a["p"][s].max() < 0.9 for s in wanted)]
        pool.sort(key=lambda a: -min(a["rate"].values()))
        kinds[kind] = pool[:ANCHORS]
    return dict(seq=seq, **kinds)


# -- measured through each engine's own code --------------------------------------------------------------

class CudaTrials:
    """First-slot trials through engines/cuda: the engine's target logits and draft hidden states at the
    anchor, its walk, and `Sampler.verify` (the loop's acceptance call) on many rows at once."""

    def __init__(self, target, draft, seq):
        self.engine = engine_for("cuda", target, draft)
        t = self.engine.target
        with torch.inference_mode():
            logits, self.features = t.forward(torch.tensor([seq]), 0, t.new_cache(len(seq) + BLOCK), last_only=False,
                                              capture=True)
        self.logits = logits[0]

    def run(self, at: int, anchor: int, temperature: float, top_p: float, seed: int, trials: int):
        from dflash_tui.engines.cuda.draft import DraftCache, Proposal
        from dflash_tui.engines.cuda.loop import Sampler
        from dflash_tui.engines.sampling import SamplingParams

        engine = self.engine
        draft, t = engine.draft, engine.target
        sampler = Sampler(SamplingParams(temperature=temperature, top_p=top_p, seed=seed), t.device)
        with torch.inference_mode():
            rows = self.logits[at].expand(trials + 1, -1)  # the trials, then a bonus row
            p = sampler.probs(rows[:1])[0].double().numpy()
            cache = DraftCache(draft, None)
            cache.append(self.features[:, :at])
            block = torch.full((1, BLOCK), draft.mask_token_id)
            block[0, 0] = anchor
            hidden = cache.hidden(draft.embed(t.embed, block))[:, :2]  # the anchor and the first slot
            anchor_id = block[0, :1]
            if draft.candidate_selector is None:  # DFlash 1: the argmax, checked by exact match
                x = draft.propose(hidden, anchor_id, t.lm_head).ids.expand(trials)
                choice = sampler.verify(rows, None, x)
                return dict(p=p, drafted=x.numpy(), accepted=(choice[:-1] == x).numpy(), emitted=choice[:-1].numpy())
            noise, temp = sampler.walk_noise(trials, draft.candidate_selector.top_k, t.device)
            walks = [draft.propose(hidden, anchor_id, t.lm_head, noise[i: i + 1], temp) for i in range(trials)]
            proposal = Proposal(*(torch.cat([getattr(w, k) for w in walks]) for k in ("ids", "candidates", "q")))
            choice = sampler.verify(rows, proposal, proposal.ids)
            q = torch.zeros_like(rows[0], dtype=torch.float64).scatter_(0, proposal.candidates[0], proposal.q[0].double())
            x = proposal.ids
            return dict(p=p, q=q.numpy(), drafted=x.numpy(), accepted=(choice[:-1] == x).numpy(),
                        emitted=choice[:-1].numpy())


class MlxTrials:
    """The same through engines/mlx: its target and draft, the walk's `propose`, and `rejection_verify`
    on `Sampler.probs` as its loop calls them (DFlash 1: the sampler's own token, exact match)."""

    def __init__(self, target, draft, seq):
        import mlx.core as mx

        self.mx = mx
        self.engine = engine_for("mlx", target, draft)
        t = self.engine.target
        logits, self.features = t.forward(mx.array([seq], dtype=mx.int32), t.make_cache(), capture=True)
        self.logits = logits[0]

    def run(self, at: int, anchor: int, temperature: float, top_p: float, seed: int, trials: int):
        from dflash_tui.engines.mlx.draft import DraftCache
        from dflash_tui.engines.mlx.loop import Sampler, rejection_verify
        from dflash_tui.engines.sampling import SamplingParams

        mx = self.mx
        draft, t = self.engine.draft, self.engine.target
        sampler = Sampler(SamplingParams(temperature=temperature, top_p=top_p, seed=seed))
        rows = mx.broadcast_to(self.logits[at][None], (trials + 1, self.logits.shape[-1]))
        p = np.array(sampler.probs(rows[:1])[0], dtype=np.float64)
        cache = DraftCache(draft, None)
        cache.append(self.features[:, :at])
        block = mx.array([[anchor] + [draft.mask_token_id] * (BLOCK - 1)], dtype=mx.int32)
        hidden = cache.propose_hidden(draft.embed(t.embed, block))[:, :2]  # the anchor and the first slot
        anchor_id = block[0, :1]
        if draft.selector is None:
            x = mx.broadcast_to(draft.propose(hidden, anchor_id, t.lm_head)[0], (trials,))
            choice = sampler(rows)
            accepted = choice[:-1] == x
            emitted = choice[:-1]
            q = None
        else:
            noise = sampler.exponential((trials, draft.selector.top_k))
            walks = [draft.propose(hidden, anchor_id, t.lm_head, temperature, noise[i: i + 1]) for i in range(trials)]
            x = mx.concatenate([w[0] for w in walks])
            qs = mx.concatenate([w[1] for w in walks])
            accepted, choice = rejection_verify(sampler.probs(rows, x), qs, x, sampler)
            emitted = mx.where(accepted > 0, x, choice[:-1])  # the loop's token at a position it stops after
            q = qs[0]
        mx.eval(x, accepted, emitted)
        out = dict(p=p, drafted=np.array(x), accepted=np.array(accepted) > 0, emitted=np.array(emitted))
        if q is not None:
            out["q"] = np.array(q, dtype=np.float64)
        return out


@pytest.fixture(scope="module")
def measured(pair, theory):
    """engine name -> kind -> trial runner (each engine loaded once, only when a test asks for it)."""
    target, draft1, draft2 = pair
    built = {}

    def get(engine: str, kind: str):
        if (engine, kind) not in built:
            if engine == "mlx":
                pytest.importorskip("mlx_lm")
            runner = CudaTrials if engine == "cuda" else MlxTrials
            built[engine, kind] = runner(target, draft2 if kind == "dflash2" else draft1, theory["seq"])
        return built[engine, kind]

    return get


def check(theory, measured, engine: str, kind: str, setting) -> None:
    temperature, top_p = setting
    runner = measured(engine, kind)
    vocab = len(theory[kind][0]["p"][setting])
    accepted = rate_sum = variance = 0.0
    drafted_counts, drafted_expected = np.zeros(vocab), np.zeros(vocab)
    emitted_counts, emitted_expected = np.zeros(vocab), np.zeros(vocab)
    trials = TRIALS if kind == "dflash2" else TRIALS1
    for n, anchor in enumerate(theory[kind]):
        got = runner.run(anchor["at"], anchor["anchor"], temperature, top_p, seed=1000 * n + 7, trials=trials)
        p = anchor["p"][setting]
        # the engine's own p and q are the reference's (to float32 rounding)
        np.testing.assert_allclose(got["p"], p, atol=2e-5)
        if kind == "dflash2":
            np.testing.assert_allclose(got["q"], anchor["q"][temperature], atol=2e-5)
            drafted_counts += np.bincount(got["drafted"], minlength=vocab)
            drafted_expected += trials * anchor["q"][temperature]
        else:
            assert set(got["drafted"].tolist()) == {anchor["x"]}
        rate = anchor["rate"][setting]
        accepted += got["accepted"].sum()
        rate_sum += trials * rate
        variance += trials * rate * (1 - rate)
        emitted_counts += np.bincount(got["emitted"], minlength=vocab)
        emitted_expected += trials * p
    n = trials * len(theory[kind])
    z = (accepted - rate_sum) / math.sqrt(variance)
    assert abs(z) < Z, (f"{engine} {kind} T={temperature} top_p={top_p}: first slot accepted {accepted / n:.4f} of "
                        f"{n}, theory {rate_sum / n:.4f} (z = {z:.2f}, bound {Z:.2f})")
    checks = [("emitted tokens against p", emitted_counts, emitted_expected)]
    if kind == "dflash2":
        checks.append(("drafted tokens against q", drafted_counts, drafted_expected))
    for what, counts, expected in checks:
        pvalue, df, stat = chi2_pvalue(counts, expected)
        assert pvalue > ALPHA, f"{engine} {kind} T={temperature} top_p={top_p}: {what}: chi2 {stat:.1f} on {df} df, p = {pvalue:.2g}"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("setting", DFLASH2, ids=lambda s: f"T{s[0]}-top_p{s[1]}")
def test_dflash2_first_slot_accepts_at_its_theory(theory, measured, engine, setting):
    check(theory, measured, engine, "dflash2", setting)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("setting", DFLASH1, ids=lambda s: f"T{s[0]}-top_p{s[1]}")
def test_dflash1_first_slot_accepts_at_its_theory(theory, measured, engine, setting):
    check(theory, measured, engine, "dflash1", setting)


def test_the_anchors_give_the_checks_power(theory):
    """The chosen anchors overlap enough for the rate check to see a rate a fifth off: Z standard errors
    are under a fifth of the rate, for every setting."""
    for kind, settings, trials in (("dflash2", DFLASH2, TRIALS), ("dflash1", DFLASH1, TRIALS1)):
        for s in settings:
            rates = [a["rate"][s] for a in theory[kind]]
            rate = sum(rates) / len(rates)
            se = math.sqrt(sum(r * (1 - r) for r in rates) * trials) / (trials * len(rates))
            assert Z * se < 0.2 * rate, (kind, s, rate, se)


def test_the_chi_square_tail_is_exact():
    """chi2_sf against known quantiles (df 1, 2, 5, 10 at 5%; df 4 at 1e-3)."""
    for x, df, tail in ((3.841459, 1, 0.05), (5.991465, 2, 0.05), (11.0705, 5, 0.05), (18.30704, 10, 0.05),
                        (18.46683, 4, 1e-3)):
        assert chi2_sf(x, df) == pytest.approx(tail, rel=1e-4)


# -- the loop feeds its acceptance code the step's own p and q ---------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_the_loop_gives_the_rule_the_steps_p_and_q(pair, measured, engine, monkeypatch):
    """The checks above call the acceptance code directly; here the real loop runs (T = 0.7, top-p 0.9,
    block 8) and what it hands that code at each step's first slot is compared with the reference: p from
    transformers' logits at the step's anchor, q from the reference draft at that anchor, and the drafted
    token is the block's."""
    from transformers import AutoModelForCausalLM

    target, _, draft2 = pair
    temperature, top_p = 0.7, 0.9
    runner = measured(engine, "dflash2")
    seen: list = []
    if engine == "cuda":
        from dflash_tui.engines.cuda import loop

        real = loop.rejection_choice

        def spy(p, proposal, generator, race):
            q = torch.zeros_like(p[0], dtype=torch.float64).scatter_(0, proposal.candidates[0], proposal.q[0].double())
            seen.append((p[0].double().numpy(), q.numpy(), proposal.ids.tolist()))
            return real(p, proposal, generator, race)

        monkeypatch.setattr(loop, "rejection_choice", spy)
    else:
        from dflash_tui.engines.mlx import loop as mlx_loop

        real_mlx = mlx_loop.rejection_verify

        def spy_mlx(p, q, drafted, sampler):
            seen.append((np.array(p[0], dtype=np.float64), np.array(q[0], dtype=np.float64), drafted.tolist()))
            return real_mlx(p, q, drafted, sampler)

        monkeypatch.setattr(mlx_loop, "rejection_verify", spy_mlx)
    ids = runner.engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    events = list(runner.engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=40, temperature=temperature,
                                                           top_p=top_p, seed=3, block_size=BLOCK, stop_ids=[])))
    steps = [e for e in events[1:] if e.drafted]
    assert len(steps) == len(seen) >= 5
    seq = ids + [t for e in events for t in e.emitted]
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].double().numpy()
    features = target_context_features(target, seq, [0, 2])
    reference = ReferenceDraft(draft2, target)
    start = len(ids)  # the first step's anchor is the prefill's token, at position len(ids)
    for step, (p, q, drafted) in zip(steps, seen):
        assert drafted == step.drafted
        np.testing.assert_allclose(p, target_probs(logits[start], temperature, top_p), atol=2e-5)
        block = reference.draft_block(features[:start], seq[start], len(drafted) + 1)  # the last blocks shrink
        want = np.zeros_like(q)
        want[block.candidates[0].numpy()] = torch.softmax(block.scores[0] / temperature, dim=-1).numpy()
        np.testing.assert_allclose(q, want, atol=2e-5)
        start += len(step.emitted)
