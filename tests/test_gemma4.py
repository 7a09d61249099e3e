"""Gemma 4 targets on both engines (tests/tiny.py's `gemma4` families, in the published multimodal layout:
sliding window 8, so every prompt and answer here crosses it; global layers with twice the head size, one
K/V head and keys reused as values; embeddings scaled by sqrt(hidden); final-logit softcapping):

- `gemma4` is gemma-4-31B-it's shape (dense), `gemma4_moe` adds the 26B-A4B's experts, `gemma4_shared` the
  E2B/E4B-style shared-KV layers with per-layer input embeddings.
- The cuda engine loads the language model alone (no vision or audio tower built or read), and the memory
  estimate counts exactly what loads: the weights and the per-layer K/V shapes.
- Its target passes (bucket caches, sliding layers windowed on read, blocks verified after rollbacks) give
  the logits and context features of transformers' own Gemma4ForConditionalGeneration.
- A draft right 4 times in 5 gives the greedy ids (partial acceptances roll the sliding layers back, the
  last block shrinks); a chat of five turns on kept caches equals the same chat prefilled fresh.
- The graph path's static step (traced once and replayed) gives the eager ids on the dense target, which
  `why_eager` admits; the MoE one stays eager.
- The published config form (global sizes by name) builds the same model as transformers 5's saved form.
- mlx-lm runs the translated config as transformers does; the MLX engine hands the draft transformers'
  embeddings and context features, gives mlx-lm's greedy ids, and its kept caches equal fresh prefills.
- `dflash generate --target T --draft D` runs the pair on both engines.
(The greedy ids at blocks 1-16 with and without a draft window are in test_lossless.py.)
"""

from __future__ import annotations

import json

import pytest
import torch

from dflash_tui.engines import GenerationRequest
from dflash_tui.engines.checkpoints import TargetInfo, safetensors_shapes
from dflash_tui.engines.cuda import cache as cache_module
from dflash_tui.engines.cuda.graphs import StepGraphs, why_eager
from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
from dflash_tui.engines.cuda.memory import weight_bytes
from dflash_tui.engines.cuda.target import Target
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.memory import TOWER_PREFIXES, cache_bytes
from dflash_tui.engines.sampling import SamplingParams
from tests.oracles import edited_copy, engine_for, transformers_greedy
from tests.test_cuda_engine import OracleDraftCache
from tests.test_gpt_oss import engine_logits, graph_chat
from tests.test_turn_cache import kept_chat_equals_fresh
from tests.tiny import GEMMA4_WINDOW

NEW = 40
ODD = 37  # new tokens of the mostly-right draft's runs: their last blocks do not fit exactly
VARIANTS = ["gemma4", "gemma4_moe", "gemma4_shared"]
IDS = [(7 * i + 3) % 300 for i in range(60)]


@pytest.fixture(scope="module")
def cuda_engines(pairs):
    built = {}

    def get(family):
        if family not in built:
            built[family] = engine_for("cuda", *pairs(family))
        return built[family]

    return get


def transformers_model(target):
    """transformers' own model for the checkpoint: Gemma4ForConditionalGeneration, towers and all."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    assert type(model).__name__ == "Gemma4ForConditionalGeneration"
    return model


# -- loading ----------------------------------------------------------------------------------------------

def test_the_language_model_loads_alone_and_the_estimate_counts_it(pairs, cuda_engines):
    target = pairs("gemma4_shared")[0]
    engine = cuda_engines("gemma4_shared")
    model = engine.target.model
    assert type(model).__name__ == "Gemma4ForCausalLM"
    towers = [n for n in safetensors_shapes(target) if n.startswith(TOWER_PREFIXES)]
    assert any("vision_tower" in n for n in towers) and any("audio_tower" in n for n in towers)
    assert not [n for n, _ in model.named_parameters() if "tower" in n or "embed_vision" in n or "embed_audio" in n]
    stored = {t.data_ptr(): t for t in model.state_dict().values()}  # the tied lm_head once; layer_scalar buffers
    loaded = sum(t.numel() * t.element_size() for t in stored.values())
    assert weight_bytes(target, torch.float32) == loaded
    # K/V: sliding and global layers of their own sizes, the shared-KV layers holding none
    cache = engine.target.new_cache()
    engine.target.forward(torch.tensor([IDS[:12]]), 0, cache, last_only=True, capture=False)
    layers = cache_module.bucket_layers(cache)
    assert len(layers) == 2 and {layer.k_buf.shape[-1] for layer in layers} == {16, 32}
    allocated = sum(layer.k_buf.numel() * 4 * 2 for layer in layers)
    assert cache_bytes(target, 4, positions=layers[0].capacity) == allocated


def test_an_all_bidirectional_variant_is_refused_before_loading(pairs, tmp_path):
    target = pairs("gemma4")[0]
    config = json.loads((target / "config.json").read_text())
    edited = edited_copy(target, tmp_path / "bidirectional",
                         text_config={**config["text_config"], "use_bidirectional_attention": "all"})
    (edited / "model.safetensors").write_bytes(b"not weights")  # a header read would fail on it: the refusal comes first
    with pytest.raises(UserError, match="bidirectionally"):  # TargetInfo.read: before either engine's loader
        TargetInfo.read(str(edited))


# -- the engine's target passes against transformers' model ------------------------------------------------

def published_form(target, out):
    """A copy of a tiny target whose text config names the global layers' sizes as the published configs do
    (`global_head_dim`, `num_global_key_value_heads`) instead of transformers 5's `per_layer_config`."""
    import shutil

    shutil.copytree(target, out)
    config = json.loads((out / "config.json").read_text())
    text = config["text_config"]
    overrides = text.pop("per_layer_config")
    first = overrides[str(text["layer_types"].index("full_attention"))]
    text.update(global_head_dim=first["head_dim"], num_global_key_value_heads=first["num_key_value_heads"])
    (out / "config.json").write_text(json.dumps(config))
    return out


@torch.inference_mode()
def test_the_published_config_form_reads_as_transformers_5s(pairs, tmp_path):
    """transformers builds the same model from either form, the K/V estimate reads both alike, and mlx-lm
    reads the published one as it is (no translation) with the same logits."""
    target = pairs("gemma4")[0]
    published = published_form(target, tmp_path / "published")
    ids = torch.tensor([IDS[:40]])
    expected = transformers_model(target)(ids).logits[0]
    torch.testing.assert_close(transformers_model(published)(ids).logits[0], expected, rtol=0, atol=0)
    assert cache_bytes(published, 4) == cache_bytes(target, 4)
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import numpy as np

    from dflash_tui.engines.mlx.target import gemma4_keys, load_mlx_model

    config = json.loads((published / "config.json").read_text())
    assert "text_config" not in gemma4_keys(config)
    logits = np.array(load_mlx_model(published, "gemma4", config)(mx.array([IDS[:40]])))[0]
    np.testing.assert_allclose(logits, expected.numpy(), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("family", VARIANTS)
@torch.inference_mode()
def test_verify_blocks_with_rollbacks_give_transformers_logits_and_features(pairs, family):
    """Prefill past the window, then blocks that keep 1..all of their tokens (the rest rolled back): every
    kept position's logits equal the whole sequence's in transformers' own model; and the context features
    of a prefill (last-row logits only, as the loop asks) equal its hidden_states[i + 1], post-norm for the
    last layer (the shared-KV variant's layer 2 is a shared one)."""
    target_dir = pairs(family)[0]
    reference = transformers_model(target_dir)
    target = Target(TargetInfo.read(str(target_dir)), torch.device("cpu"), torch.float32, [0, 2, 3])
    got = engine_logits(target, IDS, [12, (16, 3), (16, 1), (8, 8), (4, 2), (2, 1), (16, 9), (1, 1), (16, 5)])
    expected = reference(torch.tensor([IDS]), output_hidden_states=True)
    assert len(got) > 40
    for position, row in got.items():
        torch.testing.assert_close(row, expected.logits[0, position], rtol=1e-4, atol=1e-4, msg=f"position {position}")
    _, features = target.forward(torch.tensor([IDS[:30]]), 0, target.new_cache(), last_only=True, capture=True)
    hidden = expected.hidden_states
    want = torch.cat([hidden[1][0, :30], hidden[3][0, :30], hidden[4][0, :30]], dim=-1)
    torch.testing.assert_close(features[0], want, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_the_fixture_needs_its_window(pairs):
    """Control: transformers' own model with a window wider than the sequence gives other logits past the
    window, so the equality above covers it."""
    model = transformers_model(pairs("gemma4")[0])
    ids = torch.tensor([IDS[:40]])
    expected = model(ids).logits[0]
    model.model.language_model.config.sliding_window = 4096
    differs = (model(ids).logits[0] - expected).abs().amax(-1)
    assert differs[:GEMMA4_WINDOW].max() < 1e-5 and differs[GEMMA4_WINDOW:].max() > 1e-2


# -- through the loop --------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,block,window", [("gemma4", 4, None), ("gemma4", 16, 6), ("gemma4_moe", 16, None),
                                                 ("gemma4_shared", 8, None)])
def test_a_mostly_right_draft_rolls_sliding_layers_back_exactly(cuda_engines, pairs, family, block, window):
    engine = cuda_engines(family)
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    assert len(ids) > GEMMA4_WINDOW
    reference = transformers_greedy(pairs(family)[0], ids, ODD)
    draft_cache = OracleDraftCache(engine.draft, window, reference, len(ids))
    steps = list(speculative_decode(engine.target, engine.draft, ids, block, ODD,
                                    Sampler(SamplingParams(), engine.target.device), window,
                                    cache=engine.target.new_cache(), draft_cache=draft_cache))
    assert [t for s in steps for t in s.emitted] == reference
    accepted = [s.accepted for s in steps if not s.prefill]
    assert min(accepted) < block - 1  # rejections inside blocks: the sliding layers cropped back too
    assert max(accepted) >= min(block - 1, 3)
    done = [sum(len(s.emitted) for s in steps[:i]) for i in range(len(steps))]
    # each block is what is left when less than a block is (the last block shrinks), and at least one did
    assert all(len(s.drafted) == min(block, ODD - n) - 1 for s, n in zip(steps[1:], done[1:]))
    assert any(ODD - n < block for n in done[1:])


@pytest.mark.parametrize("family,blocks", [("gemma4", [1, 16, 2, 8, 4]), ("gemma4_shared", [16, 1, 8])])
def test_a_chat_on_kept_caches_equals_fresh_prefills(cuda_engines, family, blocks):
    """A block-1 turn leaves the draft cache behind; sizes switched between turns. The shared-KV layers keep
    no K/V of their own, and the kept caches still resume (kept_chat_equals_fresh checks that turns reused some)."""
    engine = cuda_engines(family)
    reused = kept_chat_equals_fresh(engine, blocks)
    assert reused[-1].prompt_tokens > 4 * GEMMA4_WINDOW  # the kept turns are far past the window


@pytest.mark.parametrize("engine_name", ["cuda", "mlx"])
def test_dflash_generate_runs_the_pair_from_the_command_line(pairs, engine_name):
    """`dflash generate --target T --draft D` on the tiny pair: the framework's greedy ids, and no load report
    (transformers lists every tower tensor it skips)."""
    if engine_name == "mlx":
        pytest.importorskip("mlx_lm")
    from tests.oracles import framework_greedy
    from tests.test_cli_generate import invoke, summary_of

    target, draft = pairs("gemma4")
    result = invoke("generate", "--target", str(target), "--draft", str(draft), "--engine", engine_name, "--raw",
                    "-t", "0", "--device", "cpu", "--dtype", "float32", "--json", "-n", "16", "-b", "8", "Hello world")
    assert result.exit_code == 0, result.output
    assert "LOAD REPORT" not in result.stderr and "UNEXPECTED" not in result.stderr
    summary = summary_of(result.stdout)
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(target)).encode("Hello world", add_special_tokens=False)
    assert summary["token_ids"] == framework_greedy(engine_name, target, ids, 16)[: len(summary["token_ids"])]


# -- the graph path ----------------------------------------------------------------------------------------

def test_traced_and_replayed_steps_give_the_eager_ids(cuda_engines, monkeypatch):
    """The dense target's static step (sliding layers read the whole tier under a windowed mask, global layers
    of head size 2x and keys reused as values) traced once and replayed; the chat crosses a 64-position
    bucket. On a GPU `why_eager` admits it; the MoE variant stays eager."""
    engine = cuda_engines("gemma4")
    monkeypatch.setattr(cache_module, "BUCKET", 64)
    blocks = [16, 1]
    eager = graph_chat(engine, blocks)
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    assert graph_chat(engine, blocks, graphs) == eager
    assert graphs.replays > 0 and not graphs.failed
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    engine.new_context()
    assert why_eager(engine.target, torch.device("cuda")) is None
    assert "MoE" in why_eager(cuda_engines("gemma4_moe").target, torch.device("cuda"))


# -- the MLX engine ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", VARIANTS)
def test_mlx_lm_runs_the_translated_config_as_transformers_does(pairs, family):
    """engines/mlx/target.py hands mlx-lm the text model's vocabulary size and the global layers' sizes under
    their published names (transformers 5 saves them as per_layer_config); mlx-lm, which drops the towers
    itself, then gives transformers' logits past the window (window, k_eq_v, experts, shared KV in play)."""
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    from dflash_tui.engines.mlx.memory import weight_bytes as mlx_weight_bytes
    from dflash_tui.engines.mlx.target import load_mlx_model

    target = pairs(family)[0]
    config = json.loads((target / "config.json").read_text())
    assert "global_head_dim" not in config["text_config"]  # the transformers-5 form is the one translated
    model = load_mlx_model(target, "gemma4", config)
    held = sum(a.nbytes for _, a in tree_flatten(model.parameters()))
    assert mlx_weight_bytes(target, None) == held  # the fit check leaves the towers out, as mlx-lm does
    mlx_logits = np.array(model(mx.array([IDS[:40]])))[0]
    with torch.inference_mode():
        expected = transformers_model(target)(torch.tensor([IDS[:40]])).logits[0]
    np.testing.assert_allclose(mlx_logits, expected.numpy(), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("family", ["gemma4_moe", "gemma4_shared"])
def test_mlx_engine_gives_mlx_lm_greedy_ids_on_the_variants(pairs, family):
    """The dense target runs the whole lossless suite (test_lossless.py); the MoE and shared-KV variants at
    blocks 1 and 16 (the draft embeds through the target's scaled embeddings, the shared layers hold no cache)."""
    from tests.oracles import mlx_lm_greedy

    target, draft = pairs(family)
    engine = engine_for("mlx", target, draft)
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    reference = mlx_lm_greedy(target, ids, NEW)
    for block in (1, 16):
        list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block,
                                               stop_ids=[])))
        assert engine.last_summary.token_ids == reference, f"block {block}"


def test_mlx_chat_on_kept_caches_equals_fresh_prefills(pairs):
    engine = engine_for("mlx", *pairs("gemma4"))
    assert all(type(c).__name__ == "KVCache" for c in engine.target.make_cache())  # sliding layers kept whole
    kept_chat_equals_fresh(engine, [1, 16, 8])


def test_mlx_draft_inputs_are_transformers(pairs):
    """What the MLX engine hands the draft is what it was trained on in transformers: the shared embeddings
    scaled by sqrt(hidden) (transformers' embed_tokens returns them so; mlx-lm scales inside its model, so the
    engine scales them for the draft), and the context features of hidden_states[i + 1], post-norm for the
    last layer."""
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import numpy as np

    from dflash_tui.engines.mlx.target import Target as MlxTarget

    target_dir = pairs("gemma4")[0]
    target = MlxTarget(TargetInfo.read(str(target_dir)), "float32", [0, 2, 3])
    with torch.inference_mode():
        reference = transformers_model(target_dir)
        expected = reference(torch.tensor([IDS[:30]]), output_hidden_states=True).hidden_states
        embeddings = reference.get_input_embeddings()(torch.tensor([IDS[:10]]))
    np.testing.assert_allclose(np.array(target.embed(mx.array([IDS[:10]]))), embeddings.numpy(), rtol=1e-5, atol=1e-5)
    _, features = target.forward(mx.array([IDS[:30]]), target.make_cache(), capture=True)
    want = torch.cat([expected[1][0], expected[3][0], expected[4][0]], dim=-1)
    np.testing.assert_allclose(np.array(features)[0], want.numpy(), rtol=1e-4, atol=1e-4)
