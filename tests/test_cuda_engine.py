"""The CUDA engine's invariants beyond greedy equality: cache lengths, acceptance under a draft that
is often right, seeded sampling, stop ids, cancellation, and checks that run before weights load."""


import pytest
import torch

from dflash_tui.engines import EngineConfig, GenerationRequest, UserError, load_engine
from dflash_tui.engines.cuda.draft import DraftCache, Proposal
from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
from dflash_tui.engines.sampling import SamplingParams
from tests.oracles import edited_copy, oracle_proposals, run, transformers_greedy

NEW = 48


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def qwen3(pairs, request):
    target, draft = pairs(request.param)
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                      dtype="float32"))
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    return engine, ids, transformers_greedy(target, ids, NEW)


class OracleDraftCache(DraftCache):
    """A draft cache whose proposals come from tests.oracles.oracle_proposals (right 4 times in 5)."""

    def __init__(self, draft, window, reference, prompt_len):
        super().__init__(draft, window)
        self.reference, self.prompt_len = reference, prompt_len

    def propose(self, block, embed, lm_head, noise=None, temperature=None, steer=None):
        ids = oracle_proposals(self.reference, self.length, self.prompt_len, block.shape[1] - 1)
        return Proposal(torch.tensor(ids))


@pytest.mark.parametrize("block", [2, 4, 8, 16])
@pytest.mark.parametrize("window", [None, 6])
def test_cache_lengths_and_acceptance_with_a_mostly_right_draft(qwen3, block, window):
    engine, ids, reference = qwen3
    cache = engine.target.new_cache()
    draft_cache = OracleDraftCache(engine.draft, window, reference, len(ids))
    steps = speculative_decode(engine.target, engine.draft, ids, block, NEW, Sampler(SamplingParams(), engine.target.device),
                               window, cache=cache, draft_cache=draft_cache)
    out = []
    for step in steps:
        out += step.emitted
        committed = len(ids) + len(out)
        assert cache.get_seq_length() == committed - 1  # every committed token but the newest
        assert draft_cache.length == committed - 1  # context features for positions < start
        assert draft_cache.entries() == min(committed - 1, window or committed)
        if not step.prefill:
            assert step.emitted == step.drafted[: step.accepted] + step.emitted[-1:]
    assert out == reference
    assert max(len(s) for s in [out]) == NEW


def test_mostly_right_draft_is_accepted(qwen3):
    engine, ids, reference = qwen3
    draft_cache = OracleDraftCache(engine.draft, None, reference, len(ids))
    steps = list(speculative_decode(engine.target, engine.draft, ids, 8, NEW, Sampler(SamplingParams(), engine.target.device),
                                    draft_cache=draft_cache))
    accepted = [s.accepted for s in steps if not s.prefill]
    assert max(accepted) >= 3 and sum(accepted) > len(accepted)


# -- checks before any weight loads ----------------------------------------------------------------

def test_unsupported_family(tmp_path, pairs):
    target, _ = pairs("qwen3")
    other = edited_copy(target, tmp_path / "gpt2ish", model_type="gpt2")
    with pytest.raises(UserError, match="supported families: Qwen3, Qwen3-MoE, Llama-3.x"):
        load_engine(EngineConfig(target=str(other), engine="cuda"))


def test_draft_with_sliding_layers_and_yarn(pairs, tmp_path):
    """The fields newer public drafts declare: per-layer layer_types with a trained sliding window,
    and yarn rope scaling. They load, stay lossless, and the sliding layer keeps only its window."""
    from tests import tiny

    target, _ = pairs("qwen3")
    draft = tiny.make_draft(tmp_path / "draft", target, [0, 2], layer_types=["sliding_attention", "full_attention"],
                            sliding_window=4, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 128})
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                      dtype="float32"))
    assert engine.draft.rotary.rope_type == "yarn"
    ids = engine.prepare(GenerationRequest(prompt="The quick brown fox"))
    reference = transformers_greedy(target, ids, 24)
    summary = run(engine, prompt_ids=ids, max_new_tokens=24, temperature=0, block_size=8, stop_ids=[])[1]
    assert summary.token_ids == reference
    cache = DraftCache(engine.draft, None)
    cache.append(torch.zeros(1, 10, engine.draft.fc.in_features))
    assert [k.shape[2] for k in cache.keys] == [4, 10]


def test_a_target_that_cannot_fit_is_one_sentence(pairs):
    from dflash_tui.engines.cuda.memory import check_fits, weight_bytes

    target, draft = pairs("qwen3")
    need = weight_bytes(target, torch.float32)
    assert weight_bytes(target, torch.bfloat16) * 2 == need
    check_fits(target, draft, torch.float32, torch.device("cpu"))  # the tiny pair fits here
    with pytest.raises(UserError, match=r"needs about .* GB in float32 but this machine's available RAM has 0.0 GB free"):
        check_fits(target, draft, torch.float32, torch.device("cpu"), available=need // 2)
