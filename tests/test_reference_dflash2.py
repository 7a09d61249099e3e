"""The DFlash 2 test oracle (tests/reference_dflash2.py) checked on its own: each piece of arithmetic
against values worked out by hand, the visibility rules against their definitions, and the whole draft
against the reductions the spec promises (identity convolutions and zero codebooks are DFlash 1; a causal
block's rows do not see later rows; a sliding layer does not see rows a window or more back)."""

import math

import pytest

torch = pytest.importorskip("torch")

from tests import tiny_dflash2  # noqa: E402 - after the importorskip above
from tests.reference_dflash2 import (  # noqa: E402 - after the importorskip above
    ReferenceDraft,
    causal_per_layer,
    conv_coefficients,
    dynamic_conv,
    rotary,
    target_context_features,
    visibility,
)

F64 = torch.float64
CONTEXT = [5, 17, 42, 9, 77, 130, 11, 64, 200, 31, 8, 99]
ANCHOR = 42


@pytest.fixture(scope="module")
def built(pairs, tmp_path_factory):
    """The tiny qwen3 target, its context features for CONTEXT, and DFlash 2 drafts by variant name."""
    target, _ = pairs("qwen3")
    features = target_context_features(target, CONTEXT, [0, 2])
    root = tmp_path_factory.mktemp("reference-dflash2")
    variants = {
        "random": {},
        "identity": dict(identity=True),
        "dflash1": dict(with_dflash2_tensors=False, top_k=None, architecture="DFlashDraftModel"),
        "causal": dict(causal=True),
        "sliding": dict(sliding_window=4, layer_types=["sliding_attention"] * 2, causal=False),
    }
    drafts = {name: ReferenceDraft(tiny_dflash2.make_dflash2_draft(root / name, target, [0, 2], **kw), target)
              for name, kw in variants.items()}
    return features, drafts


def test_dynamic_convolution_by_hand():
    u = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=F64)
    coef = torch.zeros(3, 2, 2, dtype=F64)
    coef[:, 0] = torch.tensor([2.0, 1.0], dtype=F64)  # tap 0: the position itself
    coef[:, 1] = torch.tensor([10.0, -1.0], dtype=F64)  # tap 1: one position back (zero before the anchor)
    expected = torch.tensor([[2.0, 2.0], [6 + 10, 4 - 2], [10 + 30, 6 - 4]], dtype=F64)
    assert torch.equal(dynamic_conv(u, coef), expected)


def test_coefficients_are_base_plus_the_group_term():
    hidden, taps, groups = 4, 2, 2
    base = torch.arange(2 * taps * hidden, dtype=F64).view(2, taps, hidden)
    projection = torch.zeros(2 * taps * groups, hidden, dtype=F64)
    projection[0, 0] = 1.0  # side 0, tap 0, group 0 <- x[0]
    projection[2 * groups + 1, 1] = 3.0  # side 1, tap 0, group 1 <- 3 x[1]
    x = torch.tensor([[2.0, 5.0, 0.0, 0.0]], dtype=F64)
    coef = conv_coefficients(x, base, projection)
    expected = base.clone()[None]
    expected[0, 0, 0, :2] += 2.0  # channels 0, 1 are group 0
    expected[0, 1, 0, 2:] += 15.0  # channels 2, 3 are group 1
    assert torch.equal(coef, expected)


def test_rotary_is_identity_at_zero_and_relative():
    x = torch.randn(2, 3, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(rotary(x, torch.zeros(3, dtype=torch.long), 10000.0), x)
    q, k = x[0, :1], x[1, :1]
    dots = [float(rotary(q, torch.tensor([m + 5]), 100.0) @ rotary(k, torch.tensor([m]), 100.0).T) for m in (0, 7, 30)]
    assert max(dots) - min(dots) < 1e-12  # only the distance matters
    # frequency 0 rotates the pair (0, d/2) by the position in radians
    e = torch.zeros(1, 1, 8, dtype=F64)
    e[..., 0] = 1.0
    r = rotary(e, torch.tensor([2]), 10000.0)
    assert math.isclose(float(r[..., 0]), math.cos(2)) and math.isclose(float(r[..., 4]), math.sin(2))


def test_visibility_tables():
    full = visibility(3, 2, causal=False, window=None, draft_window=None)
    assert full.all()
    causal = visibility(3, 3, causal=True, window=None, draft_window=None)
    assert causal[:, :3].all() and causal[:, 3:].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # window 3 at query position 3 + i: keys j > i are in (3 + i - 3 < j)
    sliding = visibility(3, 2, causal=False, window=3, draft_window=None)
    assert sliding.int().tolist() == [[0, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    ahead = visibility(2, 4, causal=False, window=2, draft_window=None)  # bidirectional: both ways (vLLM)
    assert ahead.int().tolist() == [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
    both = visibility(3, 2, causal=True, window=2, draft_window=None)
    assert both.int().tolist() == [[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    drafted = visibility(4, 2, causal=False, window=None, draft_window=2)
    assert drafted.int().tolist() == [[0, 0, 1, 1, 1, 1]] * 2


@pytest.mark.parametrize("config,expected", [
    ({}, [False, False]),
    ({"layer_types": ["sliding_attention", "full_attention"]}, [True, False]),
    ({"is_causal": False, "layer_types": ["sliding_attention", "full_attention"]}, [False, False]),
    ({"dflash_config": {"is_causal": True, "causal": False}}, [False, False]),  # vLLM never reads dflash_config.is_causal
    ({"dflash_config": {"is_causal": True}}, [False, False]),
    ({"dflash_config": {"causal": True}}, [True, True]),
    ({"is_causal": False, "dflash_config": {"is_causal": True}}, [False, False]),
])
def test_causality_resolution(config, expected):
    assert causal_per_layer({"num_hidden_layers": 2, **config}) == expected


def test_selector_scores_by_hand():
    draft = ReferenceDraft.__new__(ReferenceDraft)
    draft.w = {
        "candidate_selector.hidden_projection.weight": torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=F64),
        "candidate_selector.predecessor_codebook": torch.tensor([[1.0, 1.0], [0.0, -1.0]], dtype=F64),
        "candidate_selector.successor_codebook": torch.tensor([[0.0, 0.0], [3.0, 0.0], [1.0, 1.0]], dtype=F64),
    }
    h = torch.tensor([2.0, 0.5], dtype=F64)  # z = [2, 1]
    cand, unary = torch.tensor([2, 1]), torch.tensor([0.5, 0.25], dtype=F64)
    # predecessor 0: pred * z = [2, 1]; succ[2] = [1, 1] -> 3, succ[1] = [3, 0] -> 6
    assert draft.slot_scores(h, cand, unary, 0).tolist() == [3.5, 6.25]
    # predecessor 1: pred * z = [0, -1] -> -1 and 0
    assert draft.slot_scores(h, cand, unary, 1).tolist() == [-0.5, 0.25]


def test_identity_convolution_and_zero_codebooks_are_dflash1(built):
    features, drafts = built
    reduced = drafts["identity"].draft_block(features, ANCHOR, 16)
    plain = drafts["dflash1"].draft_block(features, ANCHOR, 16)
    assert torch.allclose(reduced.hidden, plain.hidden, atol=1e-12)
    assert reduced.ids == plain.ids == [int(i) for i in plain.logits.argmax(-1)]


def test_random_convolutions_and_selector_change_the_block(built):
    """The fixture is far from the reduction: the convolutions move the hidden states, and the walk
    differs from each slot's own argmax."""
    features, drafts = built
    block = drafts["random"].draft_block(features, ANCHOR, 16)
    argmax = drafts["random"].draft_block(features, ANCHOR, 16, use_selector=False)
    plain = drafts["dflash1"].draft_block(features, ANCHOR, 16)
    assert (block.hidden - plain.hidden).abs().max() > 0.5
    assert sum(a != b for a, b in zip(block.ids, argmax.ids)) >= 3
    assert drafts["random"].draft_block(features, ANCHOR, 16).ids == block.ids  # the walk is deterministic
    assert all(c.tolist().count(i) == 1 for c, i in zip(block.candidates, block.ids))


def test_sampled_walk_and_its_q_rows(built):
    features, drafts = built
    draft = drafts["random"]
    noise = torch.empty(15, draft.top_k, dtype=F64).exponential_(generator=torch.Generator().manual_seed(3))
    block = draft.draft_block(features, ANCHOR, 16, temperature=0.7, exponentials=noise)
    assert torch.allclose(block.q.sum(-1), torch.ones(15, dtype=F64))
    for s, token in enumerate(block.ids):
        assert block.q[s, token] > 0 and block.q[s].count_nonzero() <= draft.top_k
        assert torch.allclose(block.q[s, block.candidates[s]], torch.softmax(block.scores[s] / 0.7, -1))
    # the first slot's predecessor is the anchor, every later slot's the token drawn before it
    assert torch.allclose(block.scores[1], draft.slot_scores(block.hidden[2], block.candidates[1],
                                                             block.logits[1][block.candidates[1]], block.ids[0]))
    cold = draft.draft_block(features, ANCHOR, 16, temperature=1e-4, uniforms=[0.5] * 15)
    assert cold.ids == draft.draft_block(features, ANCHOR, 16).ids  # a near-zero temperature is the argmax walk
    # uniforms: the inverse CDF over the candidates in their order
    low = draft.draft_block(features, ANCHOR, 4, temperature=1.0, uniforms=[0.0] * 3)
    assert low.ids[0] == int(low.candidates[0, 0])


def test_causal_rows_do_not_see_later_rows(built):
    features, drafts = built
    short = drafts["causal"].draft_block(features, ANCHOR, 4).hidden
    long = drafts["causal"].draft_block(features, ANCHOR, 9).hidden
    assert torch.allclose(short, long[:4], atol=1e-12)
    free_short = drafts["random"].draft_block(features, ANCHOR, 4).hidden
    free_long = drafts["random"].draft_block(features, ANCHOR, 9).hidden
    assert not torch.allclose(free_short, free_long[:4], atol=1e-6)


def test_sliding_layers_read_a_per_query_window(built):
    features, drafts = built
    n = features.shape[0]
    base = drafts["sliding"].draft_block(features, ANCHOR, 3).hidden
    old = features.clone()
    old[: n - 4 + 1] += 1.0  # positions j <= n - window are out for every block row
    assert torch.allclose(drafts["sliding"].draft_block(old, ANCHOR, 3).hidden, base, atol=1e-12)
    edge = features.clone()
    edge[n - 4 + 1] += 1.0  # visible to block row 0 only (j > n - 4 + 0)
    assert not torch.allclose(drafts["sliding"].draft_block(edge, ANCHOR, 3).hidden[0], base[0], atol=1e-6)
