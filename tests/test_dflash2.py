"""DFlash 2 drafts on the cuda engine (float32 tiny pairs on the CPU; docs/dflash2.md).

- For a fixed context the drafted block equals the independent float64 reference
  (tests/reference_dflash2.py, fed transformers' context features): hidden states, the argmax walk, and
  the sampled walk with its q rows given the same noise; qwen3 and qwen3_5 targets, sliding and causal
  layers, an input embedding scale, a head multiplier and softcap, a draft window, the last target layer
  read, and the causality resolution on a DFlash 1 draft, both ways.
- T = 0: the ids are transformers' greedy ids at blocks 1, 2, 4, 8, 16 (the last block shrinks); a chat
  reusing the kept caches equals the chat prefilled afresh, at T = 0 and seeded T > 0.
- The captured path (traced once and replayed) gives the eager ids at T = 0 and T > 0 with the selector
  walk inside the draft step, at one host sync per step.
- Inconsistent DFlash 2 checkpoints are refused in one sentence before any weight loads.
The rejection rule's exactness is tests/test_rejection.py's; the MLX engine's is tests/test_mlx_dflash2.py.
"""

import pytest

torch = pytest.importorskip("torch")

from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine  # noqa: E402 - after the importorskip
from dflash_tui.engines.cuda.draft import DraftCache  # noqa: E402
from dflash_tui.engines.cuda.graphs import StepGraphs  # noqa: E402
from dflash_tui.engines.errors import CheckpointError  # noqa: E402
from tests import tiny_dflash2  # noqa: E402
from tests.oracles import run, transformers_greedy  # noqa: E402
from tests.reference_dflash2 import ReferenceDraft, target_context_features  # noqa: E402
from tests.test_turn_cache import kept_chat_equals_fresh  # noqa: E402
from tests.tiny_dflash2 import DRAFTS  # noqa: E402

PROMPT = "What is 48 + 75?"
NEW = 24
VARIANTS = {**DRAFTS,
            # the same DFlash 1 draft told explicitly that its sliding layer is not causal
            "dflash1-sliding-noncausal": ("qwen3", [0, 2], {**DRAFTS["dflash1-sliding"][2], "causal": False})}


@pytest.fixture(scope="module")
def built(pairs, tmp_path_factory):
    """(target, draft, engine) by VARIANTS name; engines loaded once."""
    return tiny_dflash2.draft_builder(pairs, tmp_path_factory, "cuda", VARIANTS)


@torch.inference_mode()
def drafted(engine, features, anchor: int, size: int, window=None, noise=None, temperature=None):
    """The engine's block for context features [1, n, F] and an anchor: (hidden, ids, q rows [s, V])."""
    cache = DraftCache(engine.draft, window)
    cache.append(features)
    block = torch.full((1, size), engine.draft.mask_token_id)
    block[0, 0] = anchor
    hidden = cache.hidden(engine.draft.embed(engine.target.embed, block))
    proposal = engine.draft.propose(hidden, block[0, :1], engine.target.lm_head, noise, temperature)
    q = None
    if proposal.q is not None:
        q = torch.zeros(size - 1, engine.target.lm_head.weight.shape[0]).scatter_(1, proposal.candidates, proposal.q)
    return hidden[0], proposal.ids.tolist(), q


@pytest.mark.parametrize("name", list(VARIANTS))
def test_draft_block_matches_the_reference(built, name):
    target, draft, engine = built(name)
    reference = ReferenceDraft(draft, target)
    assert (engine.draft.candidate_selector is not None) == reference.has_selector
    assert [layer.causal for layer in engine.draft.layers] == reference.causal
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    expected = target_context_features(target, ids, VARIANTS[name][1])
    with torch.inference_mode():
        logits, features = engine.target.forward(torch.tensor([ids]), 0, engine.target.new_cache(64), last_only=True,
                                                 capture=True)
    torch.testing.assert_close(features[0], expected.float(), atol=2e-4, rtol=1e-4)
    anchor = int(logits[0, -1].argmax())
    for size, window in ((16, None), (5, None), (8, 6)):
        want = reference.draft_block(expected, anchor, size, draft_window=window)
        hidden, got, _ = drafted(engine, features, anchor, size, window)
        torch.testing.assert_close(hidden.double(), want.hidden, atol=2e-4, rtol=1e-4)
        assert got == want.ids, f"block {size}, window {window}"
        if reference.has_selector:
            noise = torch.empty(size - 1, reference.top_k, dtype=torch.float64).exponential_(
                generator=torch.Generator().manual_seed(size))
            want = reference.draft_block(expected, anchor, size, temperature=0.8, exponentials=noise,
                                         draft_window=window)
            _, got, q = drafted(engine, features, anchor, size, window, noise.float(), torch.tensor(0.8))
            assert got == want.ids
            torch.testing.assert_close(q.double(), want.q, atol=1e-5, rtol=1e-4)


def test_causality_is_resolved_both_ways_on_a_dflash1_draft(built):
    """The same sliding DFlash 1 weights: causal by default, not causal when the config says so; the
    blocks differ, and each matched the reference above."""
    _, _, causal = built("dflash1-sliding")
    _, _, open_ = built("dflash1-sliding-noncausal")
    assert causal.draft.layers[0].causal and not open_.draft.layers[0].causal
    ids = causal.prepare(GenerationRequest(prompt=PROMPT))
    with torch.inference_mode():
        _, features = causal.target.forward(torch.tensor([ids]), 0, causal.target.new_cache(64), last_only=True,
                                            capture=True)
    assert not torch.allclose(drafted(causal, features, ids[-1], 8)[0], drafted(open_, features, ids[-1], 8)[0])


@pytest.mark.parametrize("name", ["qwen3", "qwen3-variant", "qwen3_5-last"])
def test_greedy_ids_match_transformers(built, name):
    target, _, engine = built(name)
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    expected = transformers_greedy(target, ids, NEW)
    for block in (1, 2, 4, 8, 16):  # NEW - 1 is no multiple of the block: the last blocks shrink
        summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block, stop_ids=[])[1]
        assert summary.token_ids == expected, f"block {block}"


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kept_caches_between_turns_give_the_fresh_chat(built, temperature):
    _, _, engine = built("qwen3_5-last")
    reused = kept_chat_equals_fresh(engine, [16, 4, 8], temperature=temperature, seed=7)
    assert {s.acceptance_rule for s in reused} == {"rejection" if temperature else "greedy"}


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_captured_draft_step_walks_the_selector_as_eager(built, temperature):
    """Traced once and replayed (the CPU stand-in for a CUDA graph): the selector walk and its noise buffer
    inside the draft step give the eager chat's ids, at one host sync per step."""
    from tests.test_graph_proofs import assert_graph_chat_is_eager, sync_counts

    _, _, engine = built("qwen3-variant")
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    assert_graph_chat_is_eager(engine, graphs, [4, 16], temperature)  # a block switched between turns
    assert graphs.replays > 0
    steps, syncs, hidden = sync_counts(engine, graphs, temperature)  # block 4: replays what was captured
    assert syncs == steps and hidden == 0


@pytest.mark.parametrize("change,needle", [
    (dict(drop=["candidate_selector.successor_codebook"]), "no tensor candidate_selector.successor_codebook"),
    (dict(with_dflash2_tensors=False), "declares a DFlash 2 draft but has no tensor"),
    (dict(architecture="DFlashDraftModel", top_k=None), "carries DFlash 2 tensors"),
    (dict(top_k=None), "selector_top_k"),
    (dict(drop=["layers.1.mlp_conv.base_kernel"]), "layers.1.mlp_conv.base_kernel"),
])
def test_inconsistent_dflash2_checkpoints_are_refused_in_one_sentence(pairs, tmp_path, change, needle):
    target, _ = pairs("qwen3")
    draft = tiny_dflash2.make_dflash2_draft(tmp_path / "draft", target, [0, 2], **change)
    with pytest.raises(CheckpointError) as caught:
        load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu"))
    message = str(caught.value)
    assert needle in message and "\n" not in message, message
