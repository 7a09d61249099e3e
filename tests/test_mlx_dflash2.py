"""DFlash 2 drafts on the MLX engine (mlx[cpu], float32 tiny pairs; docs/dflash2.md).

- The drafted block, for a fixed context, equals the independent float64 reference
  (tests/reference_dflash2.py, fed transformers' context features): hidden states, the argmax walk, and
  the sampled walk with its q rows given the same noise; on qwen3 and qwen3_5 targets, with sliding and
  causal layers, an input embedding scale, a head multiplier and softcap, a draft window, the last target
  layer read, and the same causality resolution applied to a DFlash 1 draft.
- T = 0: the ids are mlx-lm's greedy ids at blocks 1, 2, 4, 8, 16 (the last block shrinks), and a chat
  whose turns reuse the kept caches gives the ids of the same chat prefilled afresh.
- Inconsistent DFlash 2 checkpoints are refused in one sentence; `model.`-prefixed weights load.
- T > 0: the rejection rule's emitted token is distributed as p (and a rule that always accepts is
  caught); a draft that is mostly right runs the accept, reject and bonus paths to the target's ids at a
  near-zero temperature; seeded runs repeat, with and without the kept caches.
"""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
torch = pytest.importorskip("torch")

from dflash_tui.engines import GenerationRequest  # noqa: E402 - after the importorskip above
from dflash_tui.engines.mlx.draft import DraftCache  # noqa: E402 - after the importorskip above
from dflash_tui.engines.mlx.loop import Sampler, rejection_verify, speculative_decode  # noqa: E402 - after the importorskip above
from dflash_tui.engines.sampling import SamplingParams  # noqa: E402 - after the importorskip above
from tests import tiny_dflash2  # noqa: E402 - after the importorskip above
from tests.oracles import engine_for, mlx_lm_greedy, oracle_proposals, run  # noqa: E402 - after the importorskip above
from tests.reference_dflash2 import ReferenceDraft, target_context_features  # noqa: E402 - after the importorskip above
from tests.test_turn_cache import kept_chat_equals_fresh  # noqa: E402 - after the importorskip above
from tests.tiny_dflash2 import DRAFTS  # noqa: E402 - after the importorskip above

PROMPT = "What is 48 + 75?"
NEW = 24
@pytest.fixture(scope="module")
def built(pairs, tmp_path_factory):
    """(target, draft, engine) by DRAFTS name; engines loaded once."""
    return tiny_dflash2.draft_builder(pairs, tmp_path_factory, "mlx")


def mlx_block(engine, features, anchor, size, window=None, temperature=0.0, noise=None):
    """The MLX draft's hidden states, ids and q for a block after `features` [1, n, width]."""
    cache = DraftCache(engine.draft, window)
    cache.append(features)
    block = mx.array([[anchor] + [engine.draft.mask_token_id] * (size - 1)], dtype=mx.int32)
    hidden = cache.propose_hidden(engine.draft.embed(engine.target.embed, block))
    ids, q = cache.propose_sampled(block, engine.target.embed, engine.target.lm_head, temperature, noise)
    return np.array(hidden[0]), ids.tolist(), None if q is None else np.array(q)


@pytest.mark.parametrize("name", list(DRAFTS))
def test_draft_block_matches_the_reference(built, name):
    target, draft, engine = built(name)
    reference = ReferenceDraft(draft, target)
    assert (engine.draft.selector is not None) == reference.has_selector
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    # the engine's own context features are transformers' (the last layer's after the final norm)
    expected = target_context_features(target, ids, DRAFTS[name][1])
    logits, features = engine.target.forward(mx.array([ids]), engine.target.make_cache(), capture=True)
    np.testing.assert_allclose(np.array(features[0]), expected.numpy(), atol=2e-4, rtol=1e-4)
    anchor = int(mx.argmax(logits[0, -1]))  # the first token the target would emit
    for size, window in ((16, None), (5, None), (8, 6)):
        want = reference.draft_block(expected, anchor, size, draft_window=window)
        hidden, got, _ = mlx_block(engine, features, anchor, size, window)
        np.testing.assert_allclose(hidden, want.hidden.numpy(), atol=2e-4, rtol=1e-4)
        assert got == want.ids, f"block {size}, window {window}"
        if reference.has_selector:
            noise = torch.empty(size - 1, reference.top_k, dtype=torch.float64).exponential_(
                generator=torch.Generator().manual_seed(size))
            want = reference.draft_block(expected, anchor, size, temperature=0.8, exponentials=noise, draft_window=window)
            _, got, q = mlx_block(engine, features, anchor, size, window, 0.8, mx.array(noise.float().numpy()))
            assert got == want.ids
            np.testing.assert_allclose(q, want.q.numpy(), atol=1e-5)


def test_the_fixture_selector_moves_the_block(built):
    """The random selector drafts another block than each slot's argmax (the walk matters here)."""
    target, draft, engine = built("qwen3")
    reference = ReferenceDraft(draft, target)
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    features = target_context_features(target, ids, [0, 2])
    walk = reference.draft_block(features, ids[-1], 16)
    assert walk.ids != reference.draft_block(features, ids[-1], 16, use_selector=False).ids


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5-last"])  # qwen3_5-last: sliding layers, causal by default
def test_greedy_ids_match_mlx_lm(built, name):
    target, _, engine = built(name)
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    expected = mlx_lm_greedy(target, ids, NEW)
    for block in (1, 2, 4, 8, 16):  # NEW - 1 is no multiple of the block: the last blocks shrink
        summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block, stop_ids=[])[1]
        assert summary.token_ids == expected, f"block {block}"
        assert summary.generated_tokens == NEW


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kept_caches_between_turns_give_the_fresh_chat(built, temperature):
    _, _, engine = built("qwen3_5-last")
    kept_chat_equals_fresh(engine, [16, 4], temperature=temperature, seed=7)


class ProbeSampler(Sampler):
    """A sampler whose acceptance uniforms can be replaced (zeros: every drafted token with p > 0 is
    kept, the broken rule `accept whenever p > 0`)."""

    def __init__(self, params, zero_uniforms=False):
        super().__init__(params)
        self.zero_uniforms = zero_uniforms

    def uniform(self, shape):
        value = super().uniform(shape)
        return mx.zeros(shape) if self.zero_uniforms else value


def emitted_frequencies(p, q, trials, seed, broken=False):
    """Position 0 of `trials` independent verify steps with target distribution p and draft q (x ~ q):
    the emitted token is x if kept, else the residual sample. Rows of one rejection_verify call are
    independent trials (each row has its own uniform and residual draw)."""
    rng = np.random.default_rng(seed)
    drafted = rng.choice(len(q), size=trials, p=q)
    sampler = ProbeSampler(SamplingParams(temperature=1.0, seed=seed), broken)
    p_rows = mx.array(np.tile(p, (trials + 1, 1)).astype(np.float32))
    q_rows = mx.array(np.tile(q, (trials, 1)).astype(np.float32))
    kept, tokens = rejection_verify(p_rows, q_rows, mx.array(drafted.astype(np.int32)), sampler)
    kept, tokens = np.array(kept), np.array(tokens)
    emitted = np.where(kept == 1, drafted, tokens[:-1])
    return np.bincount(emitted, minlength=len(p)) / trials, np.bincount(tokens[-1:], minlength=len(p))


def test_rejection_rule_emits_p():
    """Total variation between the emitted frequencies and p over 40,000 trials: above 0.02 has
    probability at most 2^6 exp(-2 * 40000 * 0.02^2) < 1e-12 (Bretagnolle-Huber-Carol) when the rule is
    exact. The rule that keeps every drafted token emits q instead and is caught."""
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = np.array([0.1, 0.1, 0.3, 0.05, 0.25, 0.2])  # token 5 has p = 0: never kept
    freq, bonus = emitted_frequencies(p, q, 40000, seed=3)
    assert 0.5 * np.abs(freq - p).sum() < 0.02
    assert freq[5] == 0 and bonus.sum() == 1 and p[bonus.argmax()] > 0
    broken, _ = emitted_frequencies(p, q, 40000, seed=3, broken=True)
    assert 0.5 * np.abs(broken - p).sum() > 0.1


def test_the_walk_noise_samples_q():
    """A slot picks argmax(q / E) with E the sampler's Exp(1) draws: over 40,000 rows the picks are
    distributed as q (total variation above 0.02: probability below 1e-12 as above)."""
    q = mx.array([0.4, 0.3, 0.2, 0.07, 0.03])
    noise = Sampler(SamplingParams(temperature=1.0, seed=11)).exponential((40000, 5))
    assert abs(float(noise.mean()) - 1.0) < 0.02 and float(noise.min()) >= 0
    picks = np.array(mx.argmax(q[None] / noise, axis=-1))
    assert 0.5 * np.abs(np.bincount(picks, minlength=5) / 40000 - np.array(q)).sum() < 0.02


class MostlyRightDraftCache(DraftCache):
    """A DFlash 2 draft cache proposing the target's greedy continuation, wrong at every 5th position
    (tests.oracles.oracle_proposals), with q one-hot on what it proposes."""

    def __init__(self, draft, reference, prompt_len):
        super().__init__(draft, None)
        self.reference, self.prompt_len = reference, prompt_len

    def propose_sampled(self, block, embed, lm_head, temperature=0.0, noise=None, steer=None):
        ids = mx.array(oracle_proposals(self.reference, self.length, self.prompt_len, block.shape[1] - 1), dtype=mx.int32)
        vocab = lm_head.weight.shape[0]
        return ids, (mx.arange(vocab)[None, :] == ids[:, None]).astype(mx.float32)


@pytest.mark.parametrize("name,block", [("qwen3", 4), ("qwen3", 16), ("qwen3_5-last", 8)])
def test_rejection_sampling_keeps_right_tokens_and_replaces_wrong_ones(built, name, block):
    """At a near-zero temperature (1e-6: the fixture has a top-2 margin of 1e-4) p is one-hot on the
    target's argmax: a right drafted token is kept (p/q = 1), a wrong one rejected and replaced from
    max(0, p - q) = the argmax, and a fully accepted block ends with the bonus token. The ids are the
    greedy ids and the caches stay as at T = 0 (qwen3_5: the gated-delta states rolled back too)."""
    target, _, engine = built(name)
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    reference = mlx_lm_greedy(target, ids, NEW)
    cache = engine.target.make_cache()
    draft_cache = MostlyRightDraftCache(engine.draft, reference, len(ids))
    out, accepted = [], []
    for step in speculative_decode(engine.target, engine.draft, ids, block, NEW,
                                   Sampler(SamplingParams(temperature=1e-6, seed=1)), cache=cache,
                                   draft_cache=draft_cache):
        out += step.emitted
        assert all(c.offset == len(ids) + len(out) - 1 for c in cache if hasattr(c, "offset"))
        assert draft_cache.length == len(ids) + len(out) - 1
        accepted += [] if step.prefill else [step.accepted]
    assert out == reference
    # every 5th proposal is wrong: block 4 has fully accepted blocks (the bonus token), all have rejections
    assert max(accepted) == min(4, block - 1) and min(accepted) < block - 1


def test_seeded_sampling_repeats(built):
    _, _, engine = built("qwen3-variant")
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))

    def sample(seed):
        events, summary = run(engine, prompt_ids=ids, max_new_tokens=24, temperature=1.0, seed=seed, block_size=8,
                              stop_ids=[])
        return summary.token_ids, [(e.drafted, e.accepted) for e in events]

    first = sample(5)
    assert sample(5) == first
    assert sample(6)[0] != first[0]


def test_dflash1_drafts_keep_exact_match_at_positive_temperature(built, monkeypatch):
    import dflash_tui.engines.mlx.loop as loop

    def refuse(*args):
        raise AssertionError("rejection sampling ran for a DFlash 1 draft")

    monkeypatch.setattr(loop, "rejection_verify", refuse)
    _, _, engine = built("dflash1-sliding")
    summary = run(engine, prompt=PROMPT, max_new_tokens=12, temperature=1.0, seed=2, block_size=4, stop_ids=[])[1]
    assert summary.generated_tokens == 12


@pytest.mark.parametrize("options,message", [
    (dict(drop=["candidate_selector.successor_codebook"]), "declares a DFlash 2 draft but has no tensor"),
    (dict(drop=["layers.0.attention_conv.base_kernel"]), "declares a DFlash 2 draft but has no tensor"),
    (dict(architecture="DFlashDraftModel", top_k=None), "carries DFlash 2 tensors"),
    (dict(top_k=None), "selector_top_k"),
])
def test_inconsistent_dflash2_checkpoints_are_refused_in_one_sentence(pairs, tmp_path, options, message):
    from dflash_tui.engines import CheckpointError

    target, _ = pairs("qwen3")
    draft = tiny_dflash2.make_dflash2_draft(tmp_path / "draft", target, [0, 2], **options)
    with pytest.raises(CheckpointError, match=message) as caught:
        engine_for("mlx", target, draft)
    assert "\n" not in str(caught.value)


def test_model_prefixed_weights_load_as_published(pairs, tmp_path):
    from mlx.utils import tree_flatten

    from dflash_tui.engines.checkpoints import DraftInfo
    from dflash_tui.engines.mlx.draft import DFlashDraft

    target, _ = pairs("qwen3")
    plain = DFlashDraft.load(DraftInfo.read(str(tiny_dflash2.make_dflash2_draft(tmp_path / "a", target, [0, 2]))),
                             mx.float32)
    prefixed = DFlashDraft.load(DraftInfo.read(str(tiny_dflash2.make_dflash2_draft(tmp_path / "b", target, [0, 2],
                                                                                  prefix="model."))), mx.float32)
    a, b = dict(tree_flatten(plain.parameters())), dict(tree_flatten(prefixed.parameters()))
    assert a.keys() == b.keys() and "candidate_selector.predecessor_codebook" in a
    assert all(mx.array_equal(a[k], b[k]) for k in a)
