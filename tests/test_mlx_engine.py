"""The MLX engine's invariants (mlx[cpu], float32 random tiny pairs): greedy ids equal mlx-lm's own
greedy generation for every block size, with and without a draft window, for each family and for a
draft that reads the last target layer; cache lengths under a draft that is often right; seeded
sampling; stop ids; cancellation; and the bad inputs of the CUDA engine's tests."""

import json
import shutil

import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from dflash_tui.engines import EngineConfig, GenerationRequest, UserError, load_engine  # noqa: E402 - after the importorskip above
from dflash_tui.engines.mlx.draft import DraftCache  # noqa: E402 - after the importorskip above
from dflash_tui.engines.mlx.loop import Sampler, speculative_decode  # noqa: E402 - after the importorskip above
from dflash_tui.engines.sampling import SamplingParams  # noqa: E402 - after the importorskip above
from tests.oracles import edited_copy, engine_for, mlx_lm_greedy, oracle_proposals, run  # noqa: E402 - after the importorskip above

PROMPTS = ["What is 48 + 75?", "The quick brown fox", "Hello world, speculative decoding"]
BLOCKS = [1, 2, 4, 8, 16]
NEW = 40
FAMILIES = [("qwen3", False), ("qwen3_moe", False), ("llama", False), ("qwen3", True)]



@pytest.fixture(scope="module")
def qwen3(pairs):
    target, draft = pairs("qwen3")
    engine = engine_for("mlx", target, draft)
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    return engine, ids, mlx_lm_greedy(target, ids, 48)


class OracleDraftCache(DraftCache):
    """A draft cache whose proposals come from tests.oracles.oracle_proposals (right 4 times in 5)."""

    def __init__(self, draft, window, reference, prompt_len):
        super().__init__(draft, window)
        self.reference, self.prompt_len = reference, prompt_len

    def propose(self, block, embed, lm_head, steer=None):
        ids = oracle_proposals(self.reference, self.length, self.prompt_len, block.shape[1] - 1)
        return mx.array(ids, dtype=mx.int32)


@pytest.mark.parametrize("block", [2, 4, 8, 16])
@pytest.mark.parametrize("window", [None, 6])
def test_cache_lengths_and_acceptance_with_a_mostly_right_draft(qwen3, block, window):
    engine, ids, reference = qwen3
    cache = engine.target.make_cache()
    draft_cache = OracleDraftCache(engine.draft, window, reference, len(ids))
    steps = speculative_decode(engine.target, engine.draft, ids, block, len(reference), Sampler(SamplingParams()),
                               window, cache=cache, draft_cache=draft_cache)
    out, accepted = [], []
    for step in steps:
        out += step.emitted
        committed = len(ids) + len(out)
        assert all(c.offset == committed - 1 for c in cache if hasattr(c, "offset"))  # committed but the newest
        assert draft_cache.length == committed - 1  # context features for positions < start
        assert draft_cache.entries() == min(committed - 1, window or committed)
        if not step.prefill:
            assert step.emitted == step.drafted[: step.accepted] + step.emitted[-1:]
            accepted.append(step.accepted)
    assert out == reference
    assert max(accepted) >= min(3, block - 1) and sum(accepted) > len(accepted) // 2


# -- targets in other forms mlx-lm loads: 4-bit quantized (mlx_lm.convert), tied embeddings ------------

@pytest.fixture(scope="module")
def variant(pairs, tmp_path_factory):
    built = {}

    def get(kind):
        if kind not in built:
            target, draft = pairs("qwen3")
            out = tmp_path_factory.mktemp(kind) / "target"
            if kind == "q4":
                from mlx_lm.convert import convert

                convert(str(target), str(out), quantize=True, q_group_size=32, q_bits=4)
            elif kind == "f16":
                import numpy as np
                from safetensors.numpy import load_file, save_file

                shutil.copytree(target, out)
                weights = load_file(str(out / "model.safetensors"))
                save_file({k: v.astype(np.float16) for k, v in weights.items()}, str(out / "model.safetensors"))
            else:  # tied: mlx-lm drops lm_head.weight and uses embed_tokens.as_linear
                edited_copy(target, out, tie_word_embeddings=True)
            built[kind] = (out, draft)
        return built[kind]

    return get


@pytest.mark.parametrize("kind", ["q4", "tied"])
def test_quantized_and_tied_targets_match_mlx_lm(variant, kind):
    target, draft = variant(kind)
    engine = engine_for("mlx", target, draft)
    assert type(engine.target.lm_head).__name__ == ("QuantizedLinear" if kind == "q4" else "method")
    ids = engine.prepare(GenerationRequest(prompt=PROMPTS[0]))
    expected = mlx_lm_greedy(target, ids, NEW)
    for block in (1, 4, 16):
        summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block, stop_ids=[])[1]
        assert summary.token_ids == expected, f"block {block}"
    assert summary.dtype == "float32"  # the activations' dtype: the quantization scales' here


def loaded_bytes(target, draft):
    """Bytes the MLX allocator holds for an engine on (target, draft), measured around its load."""
    import gc

    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    engine = engine_for("mlx", target, draft)
    model = engine.target.model  # its tapped layers are wrapped, out of model.parameters()'s reach
    layers = [getattr(layer, "_module", layer).parameters() for layer in model.layers]
    mx.eval(model.parameters(), layers, engine.draft.parameters())  # a lazy upcast takes its memory now
    gc.collect()
    return engine, mx.get_active_memory() - before


@pytest.mark.parametrize("kind", ["plain", "q4", "f16"])
def test_the_memory_estimate_counts_weights_as_the_engine_holds_them(pairs, variant, kind):
    """The fit check's weight count equals the bytes the loaded engine holds: float32 on the CPU (an f16
    checkpoint upcast), mlx_lm.convert's 4-bit packs kept packed (their scales upcast), the draft in the
    target's dtype; a pair that cannot fit is one sentence."""
    from dflash_tui.engines.mlx.memory import check_fits, weight_bytes

    target, draft = pairs("qwen3") if kind == "plain" else variant(kind)
    engine, held = loaded_bytes(target, draft)
    assert engine.dtype == "float32" and held == weight_bytes(target, "float32") + weight_bytes(draft, "float32")
    if kind == "q4":
        assert weight_bytes(target, "float32") < weight_bytes(pairs("qwen3")[0], "float32") / 3
    if kind == "f16":
        assert weight_bytes(target, None) * 2 == weight_bytes(target, "float32")
    need = weight_bytes(target, "float32")
    with pytest.raises(UserError, match=r"needs about .* GB in float32 but this machine's available RAM has 0.0 GB "
                                        r"free; run a smaller quantized build"):
        check_fits(target, draft, "float32", "cpu", available=need // 2)


def test_half_precision_checkpoint_computes_in_float32_on_the_cpu(variant):
    """dtype auto on the CPU is float32, as on the CUDA engine: the ids are mlx-lm's on the upcast weights."""
    target, draft = variant("f16")
    engine = engine_for("mlx", target, draft)
    assert engine.dtype == "float32" and engine.draft.fc.weight.dtype == mx.float32
    ids = engine.prepare(GenerationRequest(prompt=PROMPTS[1]))
    summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=8, stop_ids=[])[1]
    assert summary.token_ids == mlx_lm_greedy(target, ids, NEW, dtype=mx.float32)


def test_dtype_setting_converts_target_and_draft(pairs):
    target, draft = pairs("qwen3")
    engine = engine_for("mlx", target, draft, dtype="bfloat16")
    assert engine.dtype == "bfloat16" and engine.draft.fc.weight.dtype == mx.bfloat16
    summary = run(engine, prompt=PROMPTS[0], max_new_tokens=12, temperature=0, block_size=4, stop_ids=[])[1]
    assert summary.generated_tokens == 12 and summary.dtype == "bfloat16"
    with pytest.raises(UserError, match="dtype 'float8'"):
        engine_for("mlx", target, draft, dtype="float8")


# -- targets whose caches cannot simply be trimmed: recurrent states restored, rotating windows -----------

def make_gemma3_target(out, seed=0):
    """A tiny Gemma-3 text target: five sliding-window layers (window 6, mlx-lm's RotatingKVCache) and one
    full-attention layer, so generations run well past the window."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests import tiny

    tok = tiny.make_tokenizer(out)
    config = transformers.Gemma3TextConfig(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.2, sliding_window=6,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(out))
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}))
    return out


@pytest.fixture(scope="module")
def unusual(tmp_path_factory, pairs):
    """Targets whose caches cannot simply be trimmed: a hybrid Qwen3.5 (the shared fixture; more of it in
    test_mlx_hybrid.py) and a sliding-window Gemma-3."""
    from tests import tiny

    built = {}

    def get(kind):
        if kind == "qwen3_5":
            return pairs("qwen3_5")
        if kind not in built:
            root = tmp_path_factory.mktemp(kind)
            target = make_gemma3_target(root / "target")
            built[kind] = (target, tiny.make_draft(root / "draft", target, [0, 2]))
        return built[kind]

    return get


@pytest.mark.parametrize("kind", ["qwen3_5", "gemma3"])
@pytest.mark.parametrize("window", [None, 5])
def test_hybrid_and_sliding_targets_match_mlx_lm(unusual, kind, window):
    target, draft = unusual(kind)
    engine = engine_for("mlx", target, draft, draft_window=window)
    for prompt in PROMPTS[:2]:
        ids = engine.prepare(GenerationRequest(prompt=prompt))
        expected = mlx_lm_greedy(target, ids, NEW)
        for block in BLOCKS:
            summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block, stop_ids=[])[1]
            assert summary.token_ids == expected, f"block {block}, prompt {prompt!r}"


@pytest.mark.parametrize("kind", ["qwen3_5", "gemma3"])
@pytest.mark.parametrize("block", [4, 16])
def test_states_roll_back_under_partial_acceptance(unusual, kind, block):
    target, draft = unusual(kind)
    engine = engine_for("mlx", target, draft)
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    reference = mlx_lm_greedy(target, ids, NEW)
    cache = engine.target.make_cache()
    draft_cache = OracleDraftCache(engine.draft, None, reference, len(ids))
    out, accepted = [], []
    for step in speculative_decode(engine.target, engine.draft, ids, block, NEW, Sampler(SamplingParams()),
                                   cache=cache, draft_cache=draft_cache):
        out += step.emitted
        assert all(c.offset == len(ids) + len(out) - 1 for c in cache if hasattr(c, "offset"))
        accepted += [] if step.prefill else [step.accepted]
    assert out == reference
    assert max(accepted) >= 3 and min(accepted) < block - 1  # long prefixes kept, blocks cut in the middle


def test_sampling_filters_run(qwen3):
    engine, ids, _ = qwen3
    for kw in (dict(top_k=5), dict(min_p=0.1), dict(top_p=0.5, top_k=20, min_p=0.05)):
        summary = run(engine, prompt_ids=ids, max_new_tokens=16, temperature=0.8, seed=4, block_size=8, stop_ids=[], **kw)[1]
        assert summary.generated_tokens == 16


def test_chat_messages_and_long_prompt_prefill_in_chunks(qwen3, monkeypatch):
    import dflash_tui.engines.mlx.loop as loop

    engine, ids, _ = qwen3
    long_ids = (ids * 8)[:100]
    expected = run(engine, prompt_ids=long_ids, max_new_tokens=12, temperature=0, block_size=4, stop_ids=[])[1].token_ids
    monkeypatch.setattr(loop, "PREFILL_STEP", 7)
    chunked = run(engine, prompt_ids=long_ids, max_new_tokens=12, temperature=0, block_size=4, stop_ids=[])[1].token_ids
    assert chunked == expected
    events, summary = run(engine, messages=[{"role": "user", "content": "Hi"}], max_new_tokens=4, temperature=0)
    assert summary.generated_tokens >= 1 and events[0].is_prefill
    one = run(engine, prompt_ids=ids[:1], max_new_tokens=12, temperature=0, block_size=8, stop_ids=[])[1]
    assert one.token_ids == mlx_lm_greedy(engine.target_info.path, ids[:1], 12)


# -- bad inputs, as on the CUDA engine --------------------------------------------------------------

def test_model_type_mlx_lm_does_not_run(tmp_path, pairs):
    target, _ = pairs("qwen3")
    other = edited_copy(target, tmp_path / "unknown", model_type="not_a_real_arch")
    with pytest.raises(UserError, match="'not_a_real_arch' model, which mlx-lm .* does not run; it has .*qwen3_moe"):
        engine_for("mlx", other)


def test_unknown_device(pairs):
    target, _ = pairs("qwen3")
    with pytest.raises(UserError, match="not an MLX device"):
        engine_for("mlx", target, device="cuda:0")


def test_device_cpu_named_explicitly(pairs):
    """`--device cpu` (not only auto) runs: mx.cpu is a device type, the engine needs a device."""
    target, draft = pairs("qwen3")
    engine = engine_for("mlx", target, draft, device="cpu")
    assert engine.device == "cpu"
    assert run(engine, prompt="Hi", max_new_tokens=4, temperature=0, block_size=4, stop_ids=[])[1].generated_tokens == 4


def test_missing_mlx_is_one_sentence(monkeypatch, pairs):
    """Without mlx, importing the engine raises ImportError, which load_engine turns into a sentence."""
    import builtins
    import sys

    from dflash_tui import engines
    from dflash_tui.engines import EngineUnavailable

    real_import = builtins.__import__

    def no_mlx(name, *args, **kwargs):
        if name == "mlx" or name.startswith(("mlx.", "mlx_lm")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m.startswith("dflash_tui.engines.mlx")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_mlx)
    with pytest.raises(ImportError):
        import dflash_tui.engines.mlx.engine  # noqa: F401 - importable means the engine can run
    monkeypatch.setattr(engines, "choose_engine", lambda name: "mlx")
    target, _ = pairs("qwen3")
    with pytest.raises(EngineUnavailable, match=r"pip install 'dflash-tui\[mlx\]'"):
        load_engine(EngineConfig(target=str(target), engine="mlx"))



@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "gemma4", "qwen3"])
def test_the_draft_embeds_as_transformers_embedding_module_does(pairs, tmp_path, family):
    """The draft reads the target's token embeddings as transformers' get_input_embeddings() returns them
    (what it was trained on): scaled by sqrt(hidden) for every Gemma family, whose mlx-lm models scale
    inside their forward instead; as they are elsewhere."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_tui.engines.checkpoints import TargetInfo
    from dflash_tui.engines.mlx.target import Target
    from tests.tiny import make_target

    path = pairs(family)[0] if family in ("gemma4", "qwen3") else make_target(tmp_path / family, family)
    target = Target(TargetInfo.read(str(path)), "float32", [0, 2])
    ids = [5, 17, 33, 200, 7]
    with torch.inference_mode():
        expected = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).get_input_embeddings()(
            torch.tensor([ids])).numpy()
    np.testing.assert_allclose(np.array(target.embed(mx.array([ids]))), expected, rtol=1e-6, atol=1e-6)
