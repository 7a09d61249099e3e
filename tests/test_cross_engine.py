"""The CUDA (PyTorch) and MLX engines on the same float32 checkpoints: identical ids, identical draft
proposals step by step (a wrong port of the draft shows here even when both outputs stay lossless),
identical context features, and the draft module itself within 1e-4 given identical inputs; the newer
families (gpt-oss, Gemma 4, Qwen3.5) step by step at two block sizes."""

import json

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine  # noqa: E402 - after the importorskip above
from dflash_tui.engines.cuda.draft import DraftCache as TorchDraftCache  # noqa: E402 - after the importorskip above
from dflash_tui.engines.mlx.draft import DraftCache as MlxDraftCache  # noqa: E402 - after the importorskip above
from tests import tiny  # noqa: E402 - after the importorskip above
from tests.oracles import edited_copy, engine_for  # noqa: E402 - after the importorskip above

PROMPTS = ["What is 48 + 75?", "Hello world, speculative decoding"]
FAMILIES = [("qwen3", False), ("qwen3_moe", False), ("llama", False), ("qwen3", True)]
NEW = 32


@pytest.fixture(scope="module")
def engines_for(pairs):
    built = {}

    def get(family, last_layer, window):
        key = (family, last_layer, window)
        if key not in built:
            target, draft = pairs(family, last_layer)
            built[key] = tuple(
                load_engine(EngineConfig(target=str(target), draft=str(draft), engine=name, dtype="float32",
                                         draft_window=window))
                for name in ("cuda", "mlx")
            )
        return built[key]

    return get


def steps(engine, ids, block):
    events = list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=NEW, temperature=0,
                                                    block_size=block, stop_ids=[])))
    return [(e.drafted, e.accepted, e.emitted) for e in events], engine.last_summary.token_ids


@pytest.mark.parametrize("family,last_layer", FAMILIES)
@pytest.mark.parametrize("window", [None, 5])
def test_same_ids_and_same_proposals_step_by_step(engines_for, family, last_layer, window):
    cuda, mlx = engines_for(family, last_layer, window)
    assert (cuda.dtype, mlx.dtype) == ("float32", "float32")
    for prompt in PROMPTS:
        ids = cuda.prepare(GenerationRequest(prompt=prompt))
        assert ids == mlx.prepare(GenerationRequest(prompt=prompt))
        for block in (1, 2, 4, 8, 16):
            cuda_steps, cuda_ids = steps(cuda, ids, block)
            mlx_steps, mlx_ids = steps(mlx, ids, block)
            assert mlx_ids == cuda_ids, f"block {block}, prompt {prompt!r}"
            for i, (a, b) in enumerate(zip(cuda_steps, mlx_steps)):
                assert a == b, f"step {i}, block {block}, prompt {prompt!r}: cuda {a} vs mlx {b}"
            assert len(cuda_steps) == len(mlx_steps)


@pytest.mark.parametrize("family", ["gpt_oss", "gemma4", "qwen3_5"])
def test_the_newer_families_give_the_same_proposals_on_both_engines(engines_for, pairs, tmp_path, family):
    """gpt-oss (sinks, YaRN, experts, window), Gemma 4 (scaled embeddings the draft shares, global layers'
    own sizes, window) and Qwen3.5 (linear attention): one prompt, blocks 1 and 16, step by step. gpt-oss with
    YaRN's `truncate` on: mlx-lm 0.32 always rounds YaRN's correction range, where the published config turns
    that off for transformers, so each engine equals its own framework there but not the other (docs/families.md)."""
    if family == "gpt_oss":
        target, draft = pairs("gpt_oss")
        config = json.loads((target / "config.json").read_text())
        rounded = edited_copy(target, tmp_path / "target", rope_parameters={**config["rope_parameters"], "truncate": True})
        cuda, mlx = (engine_for(name, rounded, draft) for name in ("cuda", "mlx"))
    else:
        cuda, mlx = engines_for(family, False, None)
    ids = cuda.prepare(GenerationRequest(prompt=PROMPTS[0]))
    assert ids == mlx.prepare(GenerationRequest(prompt=PROMPTS[0]))
    for block in (1, 16):
        cuda_steps, cuda_ids = steps(cuda, ids, block)
        mlx_steps, mlx_ids = steps(mlx, ids, block)
        assert mlx_ids == cuda_ids and mlx_steps == cuda_steps, f"block {block}"


@pytest.mark.parametrize("family,last_layer", FAMILIES)
def test_context_features_agree(engines_for, family, last_layer):
    """The features both engines feed the draft (post-norm for the last target layer) agree."""
    from transformers import DynamicCache

    cuda, mlx = engines_for(family, last_layer, None)
    ids = cuda.prepare(GenerationRequest(prompt=PROMPTS[0]))
    with torch.inference_mode():
        _, expected = cuda.target.forward(torch.tensor([ids]), 0, DynamicCache(config=cuda.target.model.config),
                                          last_only=True, capture=True)
    _, got = mlx.target.forward(mx.array([ids]), mlx.target.make_cache(), capture=True)
    np.testing.assert_allclose(np.array(got), expected.numpy(), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def sliding_draft(pairs, tmp_path_factory):
    target, _ = pairs("qwen3")
    return tiny.make_draft(tmp_path_factory.mktemp("sliding") / "draft", target, [0, 2], seed=5,
                           layer_types=["sliding_attention", "full_attention"], sliding_window=3)


@pytest.mark.parametrize("window", [None, 4, 9, 300])
@pytest.mark.parametrize("kind", ["plain", "sliding"])
def test_draft_module_matches_pytorch(engines_for, pairs, sliding_draft, window, kind):
    """Identical context features and block embeddings: the MLX draft's hidden output is within 1e-4
    (the sliding kind: a causal sliding layer beside a full one, docs/dflash2.md)."""
    from dflash_tui.engines.checkpoints import DraftInfo
    from dflash_tui.engines.cuda.draft import DFlashDraft as TorchDraft
    from dflash_tui.engines.mlx.draft import DFlashDraft as MlxDraft

    if kind == "plain":
        cuda, mlx = engines_for("qwen3", False, None)
        torch_draft, mlx_draft = cuda.draft, mlx.draft
    else:
        info = DraftInfo.read(str(sliding_draft))
        torch_draft = TorchDraft.load(info, torch.device("cpu"), torch.float32)
        mlx_draft = MlxDraft.load(info, mx.float32)
    hidden = torch_draft.config["hidden_size"]
    width = len(torch_draft.target_layer_ids) * hidden
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal((1, n, width)).astype(np.float32) for n in (7, 1, 3, 2, 250, 1, 1, 300, 4)]  # past the 256-row buffers
    block = rng.standard_normal((1, 8, hidden)).astype(np.float32)

    t_cache, m_cache = TorchDraftCache(torch_draft, window), MlxDraftCache(mlx_draft, window)
    with torch.inference_mode():
        for chunk in chunks:
            t_cache.append(torch.from_numpy(chunk))
            m_cache.append(mx.array(chunk))
            assert m_cache.length == t_cache.length and m_cache.entries() == t_cache.entries()
            for (tk, tv), mk, mv in zip(zip(t_cache.keys, t_cache.values), m_cache.keys, m_cache.values):
                np.testing.assert_allclose(np.array(mk), tk.numpy(), atol=1e-4, rtol=1e-4)
                np.testing.assert_allclose(np.array(mv), tv.numpy(), atol=1e-4, rtol=1e-4)
            expected = t_cache.hidden(torch.from_numpy(block))  # the sliding layer's per-query window and causality
            got = m_cache.propose_hidden(mx.array(block))
            np.testing.assert_allclose(np.array(got), expected.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    {"rope_type": "linear", "factor": 2.0},
], ids=lambda s: s["rope_type"])
def test_draft_rope_scaling_matches_pytorch(pairs, tmp_path, scaling):
    """A draft whose config carries rope_scaling: both engines rotate context and block alike."""
    from dflash_tui.engines.checkpoints import DraftInfo
    from dflash_tui.engines.cuda.draft import DFlashDraft as TorchDraft
    from dflash_tui.engines.mlx.draft import DFlashDraft as MlxDraft

    target, _ = pairs("llama")
    info = DraftInfo.read(str(tiny.make_draft(tmp_path / "draft", target, [0, 2], rope_scaling=scaling)))
    torch_draft = TorchDraft.load(info, torch.device("cpu"), torch.float32)
    mlx_draft = MlxDraft.load(info, mx.float32)
    rng = np.random.default_rng(1)
    features = rng.standard_normal((1, 300, 2 * info.hidden_size)).astype(np.float32)
    block = rng.standard_normal((1, 8, info.hidden_size)).astype(np.float32)
    t_cache, m_cache = TorchDraftCache(torch_draft, None), MlxDraftCache(mlx_draft, None)
    with torch.inference_mode():
        t_cache.append(torch.from_numpy(features))
        expected = torch_draft.block_hidden(torch.from_numpy(block), t_cache.keys, t_cache.values,
                                            torch.arange(300, 308).unsqueeze(0))
    m_cache.append(mx.array(features))
    np.testing.assert_allclose(np.array(m_cache.propose_hidden(mx.array(block))), expected.numpy(), atol=1e-4, rtol=1e-4)
