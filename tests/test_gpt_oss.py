"""gpt-oss targets on the cuda engine: learned attention sinks, alternating sliding-window and full layers,
a mixture of experts, YaRN (tests/tiny.py's `gpt_oss` family: window 8, so every prompt and answer here
crosses it).

- The sink as one extra key column of one SDPA call (attention.py) equals transformers' own eager
  gpt-oss attention, on the CPU's grouped-query call and on the packed call CUDA takes.
- The engine's target passes (bucket caches, sliding layers windowed on read, blocks verified after
  rollbacks) give transformers' eager logits for the whole sequence; the fixture's sinks and window are
  large enough that dropping either changes them (so the comparison would catch an engine that did).
- A draft right 4 times in 5 gives the greedy ids at every block size: partial acceptances roll the
  sliding layers back too.
- A chat on the caches kept between turns equals the same chat prefilled fresh.
- The graph path's static step (traced once and replayed, `StepGraphs(mode="trace")`) gives the eager ids.
(The greedy ids at blocks 1-16 with and without a draft window are in test_lossless.py.)
"""

from __future__ import annotations

import pytest
import torch

from dflash_tui.engines import GenerationRequest
from dflash_tui.engines.checkpoints import TargetInfo
from dflash_tui.engines.cuda import cache as cache_module
from dflash_tui.engines.cuda.attention import causal_mask, packed_bias_sdpa, sink_attention, sink_bias
from dflash_tui.engines.cuda.graphs import StepGraphs, why_eager
from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
from dflash_tui.engines.cuda.target import Target
from dflash_tui.engines.sampling import SamplingParams
from tests.oracles import engine_for, transformers_greedy
from tests.test_cuda_engine import OracleDraftCache
from tests.test_turn_cache import kept_chat_equals_fresh
from tests.tiny import GPT_OSS_WINDOW

NEW = 48


@pytest.fixture(scope="module")
def pair(pairs):
    return pairs("gpt_oss")


@pytest.fixture(scope="module")
def engine(pair):
    target, draft = pair
    return engine_for("cuda", target, draft)


@pytest.fixture(scope="module")
def eager_model(pair):
    """transformers' own gpt-oss, as it loads by default (eager attention: the class refuses SDPA)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float32).eval()
    assert model.config._attn_implementation == "eager"
    return model


# -- the attention function -------------------------------------------------------------------------

def eager_reference(q, k, v, mask, sinks, scale):
    """transformers' gpt-oss eager attention ([b, n, hq, d] out) on a stand-in module."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups = q.shape[1] // k.shape[1]
    module.sinks = sinks
    module.eval()
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
    return eager_attention_forward(module, q, k, v, additive, scale)[0]


@pytest.mark.parametrize("n,s,window", [(1, 30, None), (6, 30, None), (6, 30, 8), (16, 40, 8), (16, 16, None)])
def test_sink_column_equals_transformers_eager(n, s, window):
    torch.manual_seed(n * 100 + s)
    hq, hkv, d = 8, 2, 16
    q, k, v = torch.randn(1, hq, n, d), torch.randn(1, hkv, s, d), torch.randn(1, hkv, s, d)
    sinks = 2 * torch.randn(hq)
    mask = causal_mask(n, s, "cpu")
    if window:
        rows = torch.arange(n)[:, None] + (s - n)
        mask = mask & (torch.arange(s)[None, :] > rows - window)[None, None]
    expected = eager_reference(q, k, v, mask, sinks, 0.25)
    cpu = sink_attention(q, k, v, mask, sinks, 0.25).transpose(1, 2)
    torch.testing.assert_close(cpu, expected, rtol=1e-5, atol=1e-6)
    # the packed call CUDA makes (query heads of one K/V head in rows), run here on the CPU
    zero = torch.zeros(1, hkv, 1, d)
    packed = packed_bias_sdpa(q, torch.cat([k, zero], 2), torch.cat([v, zero], 2), sink_bias(mask, sinks, hq), 0.25)
    torch.testing.assert_close(packed.transpose(1, 2), expected, rtol=1e-5, atol=1e-6)
    # and the sinks matter at this size: without them the output is another one
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)
    assert (plain.transpose(1, 2) - expected).abs().max() > 1e-2


# -- the engine's target passes against transformers' eager model -------------------------------------

def engine_logits(target, ids, blocks):
    """Prefill ids[:p], then for each (size, keep) verify `size` tokens and keep `keep` of them, as the
    loop does after a partial acceptance; the logits of every position fed, by position."""
    prefill = blocks[0]
    cache = target.new_cache()
    logits = {}
    out, _ = target.forward(torch.tensor([ids[:prefill]]), 0, cache, last_only=False, capture=False)
    target.commit(cache, prefill, prefill)
    logits.update({i: out[0, i] for i in range(prefill)})
    at = prefill
    for size, keep in blocks[1:]:
        out, _ = target.forward(torch.tensor([ids[at:at + size]]), at, cache, last_only=False, capture=False)
        logits.update({at + i: out[0, i] for i in range(keep)})
        target.commit(cache, keep, size)
        at += keep
        assert cache.get_seq_length() == at
    return logits


@torch.inference_mode()
def test_verify_blocks_with_rollbacks_give_transformers_eager_logits(pair, eager_model):
    ids = [(7 * i + 3) % 300 for i in range(60)]
    target = Target(TargetInfo.read(str(pair[0])), torch.device("cpu"), torch.float32, [0, 2])
    # a prompt past the window, then blocks that keep 1..all of their tokens (the rest rolled back)
    got = engine_logits(target, ids, [12, (16, 3), (16, 1), (8, 8), (4, 2), (2, 1), (16, 9), (1, 1), (16, 5)])
    expected = eager_model(torch.tensor([ids])).logits[0]
    assert len(got) > 40
    for position, row in got.items():
        torch.testing.assert_close(row, expected[position], rtol=1e-4, atol=1e-4, msg=f"position {position}")


@torch.inference_mode()
def test_the_fixture_needs_its_sinks_and_windows(pair, eager_model):
    """Controls: transformers' own model with the sinks pushed to -inf, or with a window wider than the
    sequence, gives other logits past the window, so the equality above covers both."""
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[(7 * i + 3) % 300 for i in range(40)]])
    expected = eager_model(ids).logits[0]
    no_sinks = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float32).eval()
    for layer in no_sinks.model.layers:
        layer.self_attn.sinks.fill_(-1e9)
    assert (no_sinks(ids).logits[0] - expected).abs().max() > 1e-1
    wide = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float32, sliding_window=4096).eval()
    differs = (wide(ids).logits[0] - expected).abs().amax(-1)
    assert differs[:GPT_OSS_WINDOW].max() < 1e-5 and differs[GPT_OSS_WINDOW:].max() > 1e-1


# -- through the loop ---------------------------------------------------------------------------------

@pytest.mark.parametrize("block,window", [(4, None), (16, 6)])
def test_a_mostly_right_draft_rolls_sliding_layers_back_exactly(engine, pair, block, window):
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    assert len(ids) > GPT_OSS_WINDOW
    reference = transformers_greedy(pair[0], ids, NEW)
    draft_cache = OracleDraftCache(engine.draft, window, reference, len(ids))
    steps = list(speculative_decode(engine.target, engine.draft, ids, block, NEW,
                                    Sampler(SamplingParams(), engine.target.device), window,
                                    cache=engine.target.new_cache(), draft_cache=draft_cache))
    assert [t for s in steps for t in s.emitted] == reference
    accepted = [s.accepted for s in steps if not s.prefill]
    assert min(accepted) < block - 1  # rejections inside blocks: the sliding layers cropped back too
    assert max(accepted) >= min(block - 1, 3)


def test_a_chat_on_kept_caches_equals_fresh_prefills(engine):
    blocks = [1, 16, 2, 8]  # a block-1 turn leaves the draft cache behind; sizes switched between turns
    reused = kept_chat_equals_fresh(engine, blocks)
    assert reused[-1].prompt_tokens > 4 * GPT_OSS_WINDOW  # the kept turns are far past the window


# -- the graph path ------------------------------------------------------------------------------------

def graph_chat(engine, blocks, graphs=None):
    engine.new_context()
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    engine.graphs = graphs
    messages, out = [], []
    try:
        for question, block in zip(["What is 48 + 75?", "And 12 * 3?", "Hello world, again"], blocks):
            messages.append({"role": "user", "content": question})
            list(engine.generate(GenerationRequest(messages=list(messages), max_new_tokens=20, temperature=0,
                                                   block_size=block, reuse_cache=True, stop_ids=[])))
            out.append(engine.last_summary.token_ids)
            messages.append({"role": "assistant", "content": engine.last_summary.text})
    finally:
        engine.graphs = None
    return out


def test_traced_and_replayed_steps_give_the_eager_ids(engine, monkeypatch):
    """The static step (sliding layers read the whole tier under a windowed mask, the sinks' bias in the
    trace) traced once and replayed; the chat crosses a 64-position bucket."""
    monkeypatch.setattr(cache_module, "BUCKET", 64)
    blocks = [16, 1]
    eager = graph_chat(engine, blocks)
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    assert graph_chat(engine, blocks, graphs) == eager
    assert graphs.replays > 0 and not graphs.failed
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    engine.new_context()
    # on a GPU the engine still runs gpt-oss eagerly (docs/families.md: lifting this is left to the GPU check)
    assert "MoE" in why_eager(engine.target, torch.device("cuda"))


# -- MXFP4 experts (the published checkpoints' format) -------------------------------------------------

def test_mxfp4_experts_load_dequantized_lossless_and_counted(pair, tmp_path_factory):
    """A hand-written MXFP4 checkpoint (published tensor names and dtypes) through transformers' own MXFP4
    path: on the CPU it dequantizes the experts to the load dtype, the engine's ids equal transformers'
    greedy ids on the same checkpoint, and the memory estimate counts the experts as loaded."""
    from dflash_tui.engines.checkpoints import stored_bytes
    from dflash_tui.engines.cuda.memory import is_mxfp4, mxfp4_stays_packed, weight_bytes
    from tests.tiny import make_gpt_oss_mxfp4

    target = make_gpt_oss_mxfp4(tmp_path_factory.mktemp("mxfp4") / "target", pair[0])
    engine = engine_for("cuda", target, pair[1])
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    expected = transformers_greedy(target, ids, 24)
    assert expected != transformers_greedy(pair[0], ids, 24)  # the rounded experts are the ones that run
    for block in (1, 16):
        list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=24, temperature=0, block_size=block,
                                               stop_ids=[])))
        assert engine.last_summary.token_ids == expected, f"block {block}"
    loaded = sum(p.numel() * p.element_size() for p in engine.target.model.parameters())
    assert is_mxfp4(target) and not mxfp4_stays_packed(torch.device("cpu"))
    assert weight_bytes(target, torch.float32) == loaded
    assert weight_bytes(target, torch.float32, mxfp4_packed=True) < loaded
    assert weight_bytes(target, torch.float32) > stored_bytes(target)  # the packed file understates it


# -- the MLX engine ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mxfp4", [False, True])
def test_mlx_lm_runs_the_translated_weights_as_transformers_does(pair, tmp_path, mxfp4):
    """engines/mlx/target.py hands mlx-lm transformers' unquantized expert tensors split and transposed
    (split_gpt_oss_experts), and the published MXFP4 tensors as they are (mlx-lm keeps them packed: its
    mxfp4 quantized experts); mlx-lm's logits then equal transformers' past the window (sinks, experts,
    window all in play; transformers dequantizes MXFP4 on the CPU). Both with YaRN's `truncate` on: mlx-lm
    0.32 always rounds YaRN's correction range, while the published gpt-oss config (and this fixture) turns
    that rounding off for transformers. On the MXFP4 checkpoint the MLX engine is also lossless."""
    pytest.importorskip("mlx_lm")
    import json
    import shutil

    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from transformers import AutoModelForCausalLM

    from dflash_tui.engines.mlx.memory import weight_bytes as mlx_weight_bytes
    from dflash_tui.engines.mlx.target import load_mlx_model
    from tests.oracles import mlx_lm_greedy
    from tests.tiny import make_gpt_oss_mxfp4

    target = tmp_path / "target"
    if mxfp4:
        make_gpt_oss_mxfp4(target, pair[0])
    else:
        shutil.copytree(pair[0], target)
    config = json.loads((target / "config.json").read_text())
    config["rope_parameters"]["truncate"] = True
    (target / "config.json").write_text(json.dumps(config))
    ids = [(7 * i + 3) % 300 for i in range(40)]
    model = load_mlx_model(target, "gpt_oss", config)
    assert (type(model.layers[0].mlp.experts.gate_proj).__name__ == "QuantizedSwitchLinear") == mxfp4
    held = sum(a.nbytes for _, a in tree_flatten(model.parameters()))
    assert mlx_weight_bytes(target, None) == held  # the fit check counts MXFP4 packed, as mlx-lm holds it
    mlx_logits = np.array(model(mx.array([ids])))[0]
    with torch.inference_mode():
        expected = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)(torch.tensor([ids])).logits[0]
    np.testing.assert_allclose(mlx_logits, expected.numpy(), rtol=1e-4, atol=2e-4)
    if mxfp4:
        engine = engine_for("mlx", target, pair[1])
        prompt = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
        reference = mlx_lm_greedy(target, prompt, 24)
        for block in (1, 16):
            list(engine.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=24, temperature=0,
                                                   block_size=block, stop_ids=[])))
            assert engine.last_summary.token_ids == reference, f"block {block}"


def test_mlx_chat_on_kept_caches_equals_fresh_prefills(pair):
    pytest.importorskip("mlx_lm")
    engine = engine_for("mlx", *pair)
    assert all(type(c).__name__ == "KVCache" for c in engine.target.make_cache())  # sliding layers kept whole
    kept_chat_equals_fresh(engine, [1, 16, 2, 8])
