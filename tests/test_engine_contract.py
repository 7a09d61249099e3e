"""The engine contract on both engines: seeded sampling, stop ids, the shrinking last block,
cancellation within one step, the Summary, a worker thread, and every check that runs before weights
load (each one clear sentence)."""

import json
import re
import threading

import pytest

from dflash_tui.engines import CONTRACT_VERSION, CheckpointError, EngineLike, GenerationRequest, Summary, UserError
from tests.oracles import ENGINES, edited_copy, engine_for, framework_greedy, run

NEW = 48


@pytest.fixture(scope="module", params=[(e, f) for e in ENGINES for f in ("qwen3", "qwen3_5")],
                ids=lambda p: "-".join(p))
def loaded(pairs, request):
    """(engine, prompt ids, the framework's greedy continuation) for a random tiny pair."""
    name, family = request.param
    if name == "mlx":
        pytest.importorskip("mlx_lm")
    target, draft = pairs(family)
    engine = engine_for(name, target, draft)
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    return engine, ids, framework_greedy(name, target, ids, NEW)


def test_seeded_sampling_repeats_and_depends_on_the_seed(loaded):
    engine, ids, _ = loaded
    kw = dict(prompt_ids=ids, max_new_tokens=NEW, temperature=1.5, top_p=0.95, top_k=50, min_p=0.01, stop_ids=[],
              block_size=4)
    a = run(engine, seed=1, **kw)[1].token_ids
    b = run(engine, seed=1, **kw)[1].token_ids
    c = run(engine, seed=2, **kw)[1].token_ids
    assert a == b and a != c


def test_top_k_1_sampling_is_greedy(loaded):
    engine, ids, reference = loaded
    for block in (1, 4, 16):
        summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=1.0, top_k=1, seed=3, block_size=block,
                      stop_ids=[])[1]
        assert summary.token_ids == reference


@pytest.mark.parametrize("block", [1, 4, 16])
def test_stop_ids_end_at_the_first_stop_token(loaded, block):
    engine, ids, reference = loaded
    stop = reference[17]
    first = reference.index(stop)
    events, summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block, stop_ids=[stop])
    assert summary.token_ids == reference[: first + 1]
    assert summary.finish_reason == "stop" and events[-1].finish_reason == "stop"


def test_last_block_shrinks_to_max_new_tokens(loaded):
    engine, ids, reference = loaded
    for new in (1, 2, 7):
        summary = run(engine, prompt_ids=ids, max_new_tokens=new, temperature=0, block_size=16, stop_ids=[])[1]
        assert summary.token_ids == reference[:new] and summary.finish_reason == "length"


def test_cancel_stops_within_one_step(loaded):
    engine, ids, _ = loaded
    request = GenerationRequest(prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=4, stop_ids=[])
    events = []
    for event in engine.generate(request):
        events.append(event)
        request.cancel.set()
    assert len(events) <= 2
    assert events[-1].finish_reason == "cancelled" and engine.last_summary.finish_reason == "cancelled"


def test_summary_fields(loaded):
    engine, ids, _ = loaded
    summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=8, stop_ids=[])[1]
    assert summary.generated_tokens == NEW == len(summary.token_ids)
    assert sum(summary.acceptance_lengths) == NEW - 1  # the prefill token is not a step
    assert sum(summary.histogram) == len(summary.acceptance_lengths) and len(summary.histogram) == 8
    assert summary.peak_memory_bytes > 0 and summary.engine == engine.name
    assert (summary.device, summary.dtype) == ("cpu", "float32")
    assert summary.draft_s > 0 and summary.verify_s > 0 and summary.ttft_s > 0
    assert summary.contract == CONTRACT_VERSION
    assert None not in (summary.mean_acceptance_length, summary.block_size, summary.peak_memory_kind, summary.graphs,
                        summary.reused_prompt_tokens, summary.prefilled_prompt_tokens)  # a local engine knows them all
    assert Summary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary


def test_engines_are_engine_like_and_answer_the_baselines(loaded):
    engine, ids, reference = loaded
    assert isinstance(engine, EngineLike)
    baseline = engine.baseline_generate(ids, 8, 0.0)
    assert baseline.token_ids == reference[:8] and baseline.generated_tokens == 8
    margin = engine.top2_margin(ids)
    assert margin.top2[0] == reference[0] and margin.value >= 0


def test_a_summary_written_before_the_contract_had_a_version_still_loads():
    """A session file's summary from before `contract` and `graphs` (no token_ids or text either: the
    session leaves them out), plus a key from some later version."""
    old = {"prompt_tokens": 21, "generated_tokens": 40, "ttft_s": 0.01, "decode_s": 0.1, "decode_tokens_per_s": 390.0,
           "acceptance_lengths": [4, 8], "mean_acceptance_length": 6.0, "histogram": [0, 0, 0, 1, 0, 0, 0, 1],
           "draft_s": 0.02, "verify_s": 0.05, "peak_memory_bytes": 1 << 20, "peak_memory_kind": "device",
           "block_size": 8, "engine": "cuda", "device": "cpu", "dtype": "float32", "finish_reason": "stop",
           "from_the_future": True}
    summary = Summary.from_dict(old)
    assert summary.mean_acceptance_length == 6.0 and summary.token_ids == [] and summary.text == ""
    assert summary.graphs is False and summary.contract == 1  # written before the version: version 1


def test_version_2_says_unknown_with_none_and_version_1_zeros_load_as_written():
    """Version 2 (None: unknown) survives JSON; a version-1 summary's 0 stays 0 (it said so then); a field a
    file lacks and has no default is None (the file does not say), not a made-up 0."""
    assert CONTRACT_VERSION == 3
    unknown = {"prompt_tokens": 9, "generated_tokens": 6, "token_ids": [], "text": "hi", "ttft_s": 0.01,
               "decode_s": 0.1, "decode_tokens_per_s": 50.0, "acceptance_lengths": None,
               "mean_acceptance_length": None, "histogram": None, "draft_s": None, "verify_s": None,
               "peak_memory_bytes": None, "peak_memory_kind": None, "block_size": None, "engine": "remote",
               "device": "h (vllm)", "dtype": "?", "finish_reason": "stop", "graphs": None,
               "reused_prompt_tokens": None, "prefilled_prompt_tokens": None, "contract": 2}
    summary = Summary.from_dict(json.loads(json.dumps(unknown)))
    assert summary.to_dict() == {**unknown, "limit": None, "acceptance_rule": None, "grammar_s": None,
                                  "loop_s": None}  # later fields: unknown
    v1 = {**unknown, "acceptance_lengths": [], "mean_acceptance_length": 0.0, "histogram": [], "draft_s": 0.0,
          "verify_s": 0.0, "peak_memory_bytes": 0, "peak_memory_kind": "unknown (remote)", "block_size": 1}
    for key in ("contract", "graphs", "reused_prompt_tokens", "prefilled_prompt_tokens"):
        del v1[key]
    old = Summary.from_dict(v1)
    assert (old.contract, old.mean_acceptance_length, old.peak_memory_bytes, old.block_size) == (1, 0.0, 0, 1)
    assert (old.graphs, old.reused_prompt_tokens, old.prefilled_prompt_tokens) == (False, 0, 0)
    del v1["peak_memory_bytes"]
    assert Summary.from_dict(v1).peak_memory_bytes is None


def test_target_alone_runs_block_1(pairs, loaded):
    engine, ids, reference = loaded
    alone = engine_for(engine.name, engine.target_info.path)
    summary = run(alone, prompt_ids=ids, max_new_tokens=12, temperature=0, stop_ids=[])[1]
    assert summary.token_ids == reference[:12] and summary.block_size == 1


def test_generate_from_a_worker_thread(loaded):
    """The TUI decodes in a worker thread, on models loaded in the main one."""
    engine, ids, reference = loaded
    result = {}

    def work():
        result["ids"] = run(engine, prompt_ids=ids, max_new_tokens=16, temperature=0, block_size=4, stop_ids=[])[1].token_ids

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert result["ids"] == reference[:16]


# -- checks before any weight loads ----------------------------------------------------------------

@pytest.mark.parametrize("block", [0, 65, -1])
def test_impossible_block_size(loaded, block):
    engine, ids, _ = loaded
    with pytest.raises(UserError, match="from 1 to 64"):
        run(engine, prompt_ids=ids, block_size=block)


def test_prompt_beyond_context(loaded):
    engine, _, _ = loaded
    with pytest.raises(UserError, match="context holds 512"):
        run(engine, prompt_ids=[5] * 600)


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("changes,words", [
    ({"hidden_size": 32}, "hidden size"),
    ({"vocab_size": 999}, "vocab size"),
    ({"num_target_layers": 7}, "7-layer"),
    ({"dflash_target_layer_ids": [0, 9]}, "layers [9]"),
    ({"dflash_target_layer_ids": [0, 1, 2]}, "fc width"),
    ({"dflash_mask_token_id": 5000}, "mask token id 5000"),
])
def test_mismatched_draft_is_one_clear_error(pairs, tmp_path, engine_name, changes, words):
    target, draft = pairs("qwen3")
    bad = edited_copy(draft, tmp_path / "bad", **changes)
    with pytest.raises(CheckpointError, match=re.escape(words)):
        engine_for(engine_name, target, bad)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_target_passed_as_draft(pairs, engine_name):
    target, _ = pairs("qwen3")
    with pytest.raises(CheckpointError, match="not a DFlash draft"):
        engine_for(engine_name, target, target)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_profile_layer_ids_must_equal_the_drafts(pairs, engine_name):
    target, draft = pairs("qwen3")
    with pytest.raises(CheckpointError, match=r"differ from the draft's own \[0, 2\]"):
        engine_for(engine_name, target, draft, target_layer_ids=[0, 1])


@pytest.mark.parametrize("engine_name", ENGINES)
def test_block_size_above_trained_warns(pairs, engine_name):
    target, draft = pairs("qwen3")
    engine = engine_for(engine_name, target, draft, block_size=32)
    assert any("trained block size 16" in w for w in engine.warnings)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_missing_hub_model_names_the_repo(monkeypatch, tmp_path, engine_name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(CheckpointError, match="'nobody/missing-model' is not in the Hugging Face cache"):
        engine_for(engine_name, "nobody/missing-model")


@pytest.mark.parametrize("engine_name", ENGINES)
def test_draft_window_must_be_positive(pairs, engine_name):
    target, draft = pairs("qwen3")
    with pytest.raises(UserError, match="Draft window 0"):
        engine_for(engine_name, target, draft, draft_window=0)


def test_the_summary_says_how_drafted_tokens_were_kept(loaded):
    """Version 3: greedy at T = 0, exact match at T > 0 with a DFlash 1 draft (this pair's); a DFlash 2
    draft's rejection sampling is tests/test_dflash2.py's."""
    engine, ids, _ = loaded
    assert run(engine, prompt_ids=ids, max_new_tokens=8, temperature=0, block_size=4)[1].acceptance_rule == "greedy"
    sampled = run(engine, prompt_ids=ids, max_new_tokens=8, temperature=0.8, block_size=4, seed=1)[1]
    assert sampled.acceptance_rule == "exact-match" and sampled.contract == CONTRACT_VERSION
