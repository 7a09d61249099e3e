"""The CUDA engine's invariants beyond greedy equality: cache lengths, acceptance under a draft that
is often right, seeded sampling, stop ids, cancellation, and checks that run before weights load."""

import json
import re
import shutil

import pytest
import torch

from engines import CheckpointError, EngineConfig, GenerationRequest, UserError, load_engine
from engines.cuda.draft import DraftCache
from engines.cuda.loop import Sampler, speculative_decode
from engines.sampling import SamplingParams
from tests.test_cuda_lossless import greedy_reference

NEW = 48


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def qwen3(pairs, request):
    target, draft = pairs(request.param)
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda"))
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    return engine, ids, greedy_reference(target, ids, NEW)


class OracleDraftCache(DraftCache):
    """Proposes the target's known greedy continuation, wrong at every 5th position, so steps
    accept long prefixes and reject in the middle of blocks."""

    def __init__(self, draft, window, reference, prompt_len):
        super().__init__(draft, window)
        self.reference, self.prompt_len = reference, prompt_len

    def propose(self, block, embed, lm_head):
        start = self.length - self.prompt_len + 1  # index in the reference of block position 1
        ids = []
        for k in range(block.shape[1] - 1):
            i = start + k
            right = self.reference[i] if i < len(self.reference) else 0
            ids.append(right if (i % 5) else (right + 1) % 300)
        return torch.tensor(ids)


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


def run(engine, **kw):
    events = list(engine.generate(GenerationRequest(**kw)))
    return events, engine.last_summary


def test_seeded_sampling_repeats_and_depends_on_the_seed(qwen3):
    engine, ids, _ = qwen3
    kw = dict(prompt_ids=ids, max_new_tokens=NEW, temperature=1.5, top_p=0.95, stop_ids=[], block_size=4)
    a = run(engine, seed=1, **kw)[1].token_ids
    b = run(engine, seed=1, **kw)[1].token_ids
    c = run(engine, seed=2, **kw)[1].token_ids
    assert a == b and a != c


def test_top_k_1_sampling_is_greedy(qwen3):
    engine, ids, reference = qwen3
    for block in (1, 4, 16):
        summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=1.0, top_k=1, seed=3, block_size=block, stop_ids=[])[1]
        assert summary.token_ids == reference


@pytest.mark.parametrize("block", [1, 4, 16])
def test_stop_ids_end_at_the_first_stop_token(qwen3, block):
    engine, ids, reference = qwen3
    k = 17
    stop = reference[k]
    first = reference.index(stop)
    events, summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block, stop_ids=[stop])
    assert summary.token_ids == reference[: first + 1]
    assert summary.finish_reason == "stop" and events[-1].finish_reason == "stop"


def test_last_block_shrinks_to_max_new_tokens(qwen3):
    engine, ids, reference = qwen3
    for new in (1, 2, 7):
        summary = run(engine, prompt_ids=ids, max_new_tokens=new, temperature=0, block_size=16, stop_ids=[])[1]
        assert summary.token_ids == reference[:new] and summary.finish_reason == "length"


def test_cancel_stops_within_one_step(qwen3):
    engine, ids, _ = qwen3
    request = GenerationRequest(prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=4, stop_ids=[])
    events = []
    for event in engine.generate(request):
        events.append(event)
        request.cancel.set()
    assert len(events) <= 2
    assert events[-1].finish_reason == "cancelled" and engine.last_summary.finish_reason == "cancelled"


def test_summary_fields(qwen3):
    engine, ids, _ = qwen3
    summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=8, stop_ids=[])[1]
    assert summary.generated_tokens == NEW == len(summary.token_ids)
    assert sum(summary.acceptance_lengths) == NEW - 1  # the prefill token is not a step
    assert sum(summary.histogram) == len(summary.acceptance_lengths) and len(summary.histogram) == 8
    assert summary.peak_memory_bytes > 0 and summary.engine == "cuda" and summary.device == "cpu"
    json.dumps(summary.to_dict())


# -- checks before any weight loads ----------------------------------------------------------------

def config_of(path):
    return json.loads((path / "config.json").read_text())


def edited_copy(src, dst, **changes):
    shutil.copytree(src, dst)
    config = config_of(dst)
    for key, value in changes.items():
        if key.startswith("dflash_"):
            config["dflash_config"][key.removeprefix("dflash_")] = value
        else:
            config[key] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("changes,words", [
    ({"hidden_size": 32}, "hidden size"),
    ({"vocab_size": 999}, "vocab size"),
    ({"num_target_layers": 7}, "7-layer"),
    ({"dflash_target_layer_ids": [0, 9]}, "layers [9]"),
    ({"dflash_target_layer_ids": [0, 1, 2]}, "fc width"),
    ({"dflash_mask_token_id": 5000}, "mask token id 5000"),
])
def test_mismatched_draft_is_one_clear_error(pairs, tmp_path, changes, words):
    target, draft = pairs("qwen3")
    bad = edited_copy(draft, tmp_path / "bad", **changes)
    with pytest.raises(CheckpointError, match=re.escape(words)):
        load_engine(EngineConfig(target=str(target), draft=str(bad), engine="cuda"))


def test_target_passed_as_draft(pairs):
    target, _ = pairs("qwen3")
    with pytest.raises(CheckpointError, match="not a DFlash draft"):
        load_engine(EngineConfig(target=str(target), draft=str(target), engine="cuda"))


def test_profile_layer_ids_must_equal_the_drafts(pairs):
    target, draft = pairs("qwen3")
    with pytest.raises(CheckpointError, match=r"differ from the draft's own \[0, 2\]"):
        load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", target_layer_ids=[0, 1]))


@pytest.mark.parametrize("block", [0, 65, -1])
def test_impossible_block_size(qwen3, block):
    engine, ids, _ = qwen3
    with pytest.raises(UserError, match="from 1 to 64"):
        run(engine, prompt_ids=ids, block_size=block)


def test_block_size_above_trained_warns(pairs):
    target, draft = pairs("qwen3")
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", block_size=32))
    assert any("trained block size 16" in w for w in engine.warnings)


def test_prompt_beyond_context(qwen3):
    engine, _, _ = qwen3
    with pytest.raises(UserError, match="context holds 512"):
        run(engine, prompt_ids=[5] * 600)


def test_unsupported_family(tmp_path, pairs):
    target, _ = pairs("qwen3")
    other = edited_copy(target, tmp_path / "gpt2ish", model_type="gpt2")
    with pytest.raises(UserError, match="supported families: Qwen3, Qwen3-MoE, Llama-3.x"):
        load_engine(EngineConfig(target=str(other), engine="cuda"))


def test_missing_hub_model_names_the_repo(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(CheckpointError, match="'nobody/missing-model' is not in the Hugging Face cache"):
        load_engine(EngineConfig(target="nobody/missing-model", engine="cuda"))


def test_draft_with_sliding_layers_and_yarn(pairs, tmp_path):
    """The fields newer public drafts declare: per-layer layer_types with a trained sliding window,
    and yarn rope scaling. They load, stay lossless, and the sliding layer keeps only its window."""
    from tests import tiny

    target, _ = pairs("qwen3")
    draft = tiny.make_draft(tmp_path / "draft", target, [0, 2], layer_types=["sliding_attention", "full_attention"],
                            sliding_window=4, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 128})
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda"))
    assert engine.draft.rotary.rope_type == "yarn"
    ids = engine.prepare(GenerationRequest(prompt="The quick brown fox"))
    reference = greedy_reference(target, ids, 24)
    summary = run(engine, prompt_ids=ids, max_new_tokens=24, temperature=0, block_size=8, stop_ids=[])[1]
    assert summary.token_ids == reference
    cache = DraftCache(engine.draft, None)
    cache.append(torch.zeros(1, 10, engine.draft.fc.in_features))
    assert [k.shape[2] for k in cache.keys] == [4, 10]


def test_a_target_that_cannot_fit_is_one_sentence(pairs):
    from engines.cuda.memory import check_fits, weight_bytes

    target, draft = pairs("qwen3")
    need = weight_bytes(target, torch.float32)
    assert weight_bytes(target, torch.bfloat16) * 2 == need
    check_fits(target, draft, torch.float32, torch.device("cpu"))  # the tiny pair fits here
    with pytest.raises(UserError, match=r"needs about .* GB in float32 but this machine's free RAM has 0.0 GB free"):
        check_fits(target, draft, torch.float32, torch.device("cpu"), available=need // 2)
