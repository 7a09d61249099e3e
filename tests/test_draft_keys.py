"""Issue 44, items 1 and 2: every DFlash 1 and DFlash 2 draft key is read where, and in the order, vLLM reads
it (docs/dflash2.md, "Which keys are read where"), and the sizes a DFlash 2 draft declares are its tensors'.

Each key gets a fixture on which the two readings (ours before, vLLM's now) draft different blocks: a copy of
one random tiny draft with only its config.json edited. Where the key changes computation the block is drafted
on both engines (the CUDA engine on the CPU, and MLX) and compared with the block of a draft that says the same
thing in the plain way, or with the plain draft itself when vLLM does not read the key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_tui.engines import CheckpointError
from dflash_tui.engines.checkpoints import DraftInfo, TargetInfo, validate_pair
from tests import tiny_dflash2
from tests.oracles import engine_for

ENGINES = ["cuda", "mlx"]
CONTEXT = 12  # committed positions before the block: more than the 3-position windows below
SIZE = 8


@pytest.fixture(scope="module")
def bases(pairs, tmp_path_factory):
    """(target, {"dflash1": draft, "dflash2": draft}, a folder for the variants)."""
    target, dflash1 = pairs("qwen3")
    root = tmp_path_factory.mktemp("keys")
    dflash2 = tiny_dflash2.make_dflash2_draft(root / "dflash2", target, [0, 2])
    return target, {"dflash1": dflash1, "dflash2": dflash2}, root


def variant(base: Path, out: Path, edit) -> Path:
    """A copy of the draft `base` whose config.json `edit` (config -> None) changed; the same weights."""
    out.mkdir(parents=True)
    shutil.copy(base / "model.safetensors", out / "model.safetensors")
    config = json.loads((base / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


_engines: dict = {}


def block(engine_name: str, target: Path, draft: Path):
    """(drafted ids, final hidden states) of the engine's block after CONTEXT random context features."""
    key = (engine_name, str(target), str(draft))
    if key not in _engines:
        _engines[key] = engine_for(engine_name, target, draft)
    engine = _engines[key]
    width = len(engine.draft.target_layer_ids) * 64
    features = np.random.default_rng(0).standard_normal((1, CONTEXT, width)).astype(np.float32)
    if engine_name == "cuda":
        from tests.test_dflash2 import drafted

        hidden, ids, _ = drafted(engine, torch.from_numpy(features), 5, SIZE)
        return ids, hidden.numpy()
    import mlx.core as mx

    from tests.test_mlx_dflash2 import mlx_block

    hidden, ids, _ = mlx_block(engine, mx.array(features), 5, SIZE)
    return ids, hidden


def same(a, b) -> bool:
    return a[0] == b[0] and np.allclose(a[1], b[1], atol=1e-5, rtol=1e-5)


@pytest.fixture(autouse=True, scope="module")
def _forget_engines():
    yield
    _engines.clear()


def set_in(path: str, value):
    """An edit that sets the config key `path` ("key" or "dflash_config.key")."""
    def edit(config):
        holder = config["dflash_config"] if path.startswith("dflash_config.") else config
        holder[path.removeprefix("dflash_config.")] = value
    return edit


def edits(*steps):
    def edit(config):
        for step in steps:
            step(config)
    return edit


@pytest.mark.parametrize("engine", ENGINES)
def test_causality_reads_is_causal_then_dflash_config_causal_only(bases, engine):
    """vLLM's `_dflash_layer_causal`: dflash_config.is_causal is not read (the layers stay bidirectional), a
    top-level is_causal beats dflash_config.causal, and dflash_config.causal alone makes every layer causal."""
    target, drafts, root = bases
    plain = block(engine, target, drafts["dflash1"])
    ignored = variant(drafts["dflash1"], root / f"is_causal-in-dflash-{engine}", set_in("dflash_config.is_causal", True))
    assert same(block(engine, target, ignored), plain)
    overruled = variant(drafts["dflash1"], root / f"is_causal-first-{engine}",
                        edits(set_in("is_causal", False), set_in("dflash_config.causal", True)))
    assert same(block(engine, target, overruled), plain)
    causal = variant(drafts["dflash1"], root / f"causal-{engine}", set_in("dflash_config.causal", True))
    assert not same(block(engine, target, causal), plain)  # (the flag matters on this fixture)
    assert [layer.causal for layer in _engines[(engine, str(target), str(causal))].draft.layers] == [True, True]


@pytest.mark.parametrize("engine", ENGINES)
def test_head_keys_are_read_from_dflash_config_only(bases, engine):
    """output_multiplier, final_logit_softcapping and input_embedding_scale at the top level of a DFlash 2
    draft are not read (vLLM reads dflash_config only); in dflash_config they change the block."""
    target, drafts, root = bases
    plain = block(engine, target, drafts["dflash2"])
    values = {"output_multiplier": 0.05, "final_logit_softcapping": 2.0, "input_embedding_scale": 1.5}
    top = variant(drafts["dflash2"], root / f"head-top-{engine}", edits(*(set_in(k, v) for k, v in values.items())))
    assert same(block(engine, target, top), plain)
    for key, value in values.items():
        inside = variant(drafts["dflash2"], root / f"head-{key}-{engine}", set_in(f"dflash_config.{key}", value))
        assert not same(block(engine, target, inside), plain), key


@pytest.mark.parametrize("engine", ENGINES)
def test_the_targets_head_settings_are_never_borrowed(bases, tmp_path, engine):
    """A draft without output_multiplier / final_logit_softcapping drafts the same block whatever the target's
    config.json says about its own head (vLLM reads the draft's dflash_config only)."""
    target, drafts, _ = bases
    other = tmp_path / "target"
    shutil.copytree(target, other)
    config = json.loads((other / "config.json").read_text())
    config.update(output_multiplier=3.0, final_logit_softcapping=0.5)  # (a Qwen3 target ignores both itself)
    (other / "config.json").write_text(json.dumps(config))
    assert same(block(engine, other, drafts["dflash2"]), block(engine, target, drafts["dflash2"]))


@pytest.mark.parametrize("engine", ENGINES)
def test_the_input_embedding_scale_is_dflash2s_alone(bases, engine):
    """vLLM's DFlash 1 model has no input_embedding_scale: a DFlash 1 draft that names one drafts as without."""
    target, drafts, root = bases
    scaled = variant(drafts["dflash1"], root / f"scale-dflash1-{engine}", set_in("dflash_config.input_embedding_scale", 1.5))
    assert same(block(engine, target, scaled), block(engine, target, drafts["dflash1"]))


@pytest.mark.parametrize("arch", ["dflash1", "dflash2"])
@pytest.mark.parametrize("engine", ENGINES)
def test_use_swa_makes_every_layer_sliding_but_not_causal(bases, engine, arch):
    """dflash_config.use_swa with swa_window_size on an all-full draft is every layer sliding with that window,
    still bidirectional inside the block (vLLM's `_resolve_layer_attention` table): the same block as the
    draft that lists every layer as sliding_attention with is_causal false."""
    target, drafts, root = bases
    swa = variant(drafts[arch], root / f"use_swa-{arch}-{engine}",
                  edits(set_in("dflash_config.use_swa", True), set_in("dflash_config.swa_window_size", 3)))
    listed = variant(drafts[arch], root / f"listed-{arch}-{engine}",
                     edits(set_in("layer_types", ["sliding_attention"] * 2), set_in("sliding_window", 3),
                           set_in("is_causal", False)))
    got = block(engine, target, swa)
    assert same(got, block(engine, target, listed))
    assert not same(got, block(engine, target, drafts[arch]))  # (the window matters on this fixture)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_bidirectional_sliding_layer_sees_its_window_both_ways(bases, engine):
    """A non-causal sliding layer of window w (here 3, under the block of 8) sees block rows less than w
    positions ahead as well as back: vLLM's attention makes the window symmetric when a layer is not causal.
    The block equals the reference oracle's, which reads it that way."""
    from tests.reference_dflash2 import ReferenceDraft

    target, drafts, root = bases
    swa = variant(drafts["dflash2"], root / f"symmetric-{engine}",
                  edits(set_in("dflash_config.use_swa", True), set_in("dflash_config.swa_window_size", 3)))
    ids, hidden = block(engine, target, swa)
    features = np.random.default_rng(0).standard_normal((CONTEXT, 2 * 64))
    want = ReferenceDraft(swa, target).draft_block(torch.from_numpy(features), 5, SIZE)
    np.testing.assert_allclose(hidden, want.hidden.numpy(), atol=2e-4, rtol=1e-4)
    assert ids == want.ids


@pytest.mark.parametrize("engine", ENGINES)
def test_swa_window_size_comes_before_sliding_window(bases, engine):
    target, drafts, root = bases
    types = set_in("layer_types", ["sliding_attention", "full_attention"])
    both = variant(drafts["dflash1"], root / f"both-windows-{engine}",
                   edits(types, set_in("sliding_window", 9), set_in("dflash_config.swa_window_size", 3)))
    three = variant(drafts["dflash1"], root / f"window-3-{engine}", edits(types, set_in("sliding_window", 3)))
    nine = variant(drafts["dflash1"], root / f"window-9-{engine}", edits(types, set_in("sliding_window", 9)))
    got = block(engine, target, both)
    assert same(got, block(engine, target, three)) and not same(got, block(engine, target, nine))


@pytest.mark.parametrize("engine", ENGINES)
def test_selector_takes_the_top_k_of_raw_logits_then_scales_them(bases, engine):
    """A softcap that saturates (every positive logit capped to the same value in float32) would make the top-K
    of the softcapped logits a tie broken by token id; vLLM's `compute_candidates` takes the top-K of the raw
    logits and then applies the multiplier and the softcap to their values. The walk then matches the
    reference oracle, which reads it that way."""
    from tests.reference_dflash2 import ReferenceDraft

    target, drafts, root = bases
    capped = variant(drafts["dflash2"], root / f"capped-{engine}",
                     edits(set_in("dflash_config.final_logit_softcapping", 1e-4),
                           set_in("dflash_config.output_multiplier", 2.0)))
    ids, _ = block(engine, target, capped)
    engine_ = _engines[(engine, str(target), str(capped))]
    features = np.random.default_rng(0).standard_normal((CONTEXT, 2 * 64))
    want = ReferenceDraft(capped, target).draft_block(torch.from_numpy(features), 5, SIZE)
    assert ids == want.ids
    if engine == "cuda":
        from dflash_tui.engines.cuda.draft import DraftCache

        cache = DraftCache(engine_.draft, None)
        cache.append(torch.from_numpy(features[None].astype(np.float32)))
        hidden = cache.hidden(engine_.draft.embed(engine_.target.embed, torch.tensor([[5] + [engine_.draft.mask_token_id] * 7])))
        with torch.inference_mode():
            proposal = engine_.draft.propose(hidden, torch.tensor([5]), engine_.target.lm_head)
            raw = engine_.target.lm_head(hidden[0, 1:])
        assert proposal.candidates.tolist() == raw.topk(engine_.draft.candidate_selector.top_k).indices.tolist()


# -- the sizes a DFlash 2 draft declares (item 2) -----------------------------------------------------------

def read_pair(target: Path, draft: Path) -> DraftInfo:
    info, target_info = DraftInfo.read(str(draft)), TargetInfo.read(str(target))
    validate_pair(target_info, info)
    return info


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["dflash_config"].pop("conv_kernel_size"), "dflash_config.conv_kernel_size null"),
    (lambda c: c["dflash_config"].pop("conv_group_size"), "dflash_config.conv_group_size null"),
    (lambda c: c["dflash_config"].pop("selector_rank"), "dflash_config.selector_rank null"),
    (set_in("dflash_config.conv_kernel_size", 3), "base_kernel of shape [2, 2, 64] but its dflash_config.conv_kernel_size"),
    (set_in("dflash_config.conv_group_size", 32), "kernel_projection.weight of shape [16, 64] but its dflash_config.conv"),
    (set_in("dflash_config.conv_group_size", 7), "conv_group_size 7, which does not divide"),
    (set_in("dflash_config.selector_rank", 8), "hidden_projection.weight of shape [16, 64] but its dflash_config.selector_rank"),
    (set_in("dflash_config.selector_top_k", 10_000), "more candidates than the target's"),
])
def test_declared_dflash2_sizes_must_be_the_tensors(bases, tmp_path, edit, needle):
    target, drafts, _ = bases
    with pytest.raises(CheckpointError, match=None) as caught:
        read_pair(target, variant(drafts["dflash2"], tmp_path / "d", edit))
    message = str(caught.value)
    assert needle in message and "\n" not in message, message


def test_drafts_we_write_declare_every_size_public_readers_index(bases):
    """The demo's draft2 and the builders' drafts carry conv_kernel_size, conv_group_size, selector_rank and
    selector_top_k (vLLM, llama.cpp's converter and z-lab's loader index them) and block_size in both places."""
    demo = Path(__file__).parent.parent / "profiles" / "demo"
    info = read_pair(demo / "target", demo / "draft2")
    sizes = info.config["dflash_config"]
    assert {k: sizes[k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")} == {
        "conv_kernel_size": info.conv_taps, "conv_group_size": info.hidden_size // info.conv_groups,
        "selector_rank": info.selector_dim, "selector_top_k": info.selector_top_k}
    assert sizes["block_size"] == info.config["block_size"] == info.block_size


# -- the other keys vLLM reads from a draft config ------------------------------------------------------------

def test_layer_ids_and_mask_id_are_read_in_vllms_order(bases, tmp_path):
    """eagle_aux_hidden_state_layer_ids (hidden-state indices: layer + 1) before dflash_config.target_layer_ids;
    the top-level mask_token_id when dflash_config has none."""
    target, drafts, _ = bases

    def edit(config):
        config["eagle_aux_hidden_state_layer_ids"] = [1, 3]  # layers 0 and 2, as the fc was trained
        config["dflash_config"]["target_layer_ids"] = [1, 2]
        config["mask_token_id"] = config["dflash_config"].pop("mask_token_id")

    base = json.loads((drafts["dflash1"] / "config.json").read_text())
    info = read_pair(target, variant(drafts["dflash1"], tmp_path / "d", edit))
    assert info.target_layer_ids == [0, 2] and info.mask_token_id == base["dflash_config"]["mask_token_id"]
    assert info.config["dflash_config"]["target_layer_ids"] == [0, 2]  # what the engines build from


@pytest.mark.parametrize("edit,needle", [
    (set_in("dflash_config.block_size", 8), "block_size 16 but dflash_config.block_size 8"),
    (set_in("block_size", None), "block_size null"),
    (set_in("block_size", 1), "block_size 1, not a whole number of at least 2"),
    (set_in("sliding_window", 0), "sliding_window 0"),
    (set_in("sliding_window", -4), "sliding_window -4"),
    (set_in("dflash_config.swa_window_size", 0), "dflash_config.swa_window_size 0"),
    (set_in("dflash_config.use_swa", True), "sliding-attention layers but no window"),
    (set_in("dflash_config.final_logit_softcapping", -1.0), "dflash_config.final_logit_softcapping -1.0"),
    (set_in("is_neox_style", False), "is_neox_style false"),
    (set_in("dflash_config.attention_sink_bias", True), "attention sink biases"),
    (set_in("dflash_config.use_aux_hidden_state", False), "use_aux_hidden_state false"),
    (set_in("hidden_act", "gelu"), "hidden_act \"gelu\""),
    (set_in("target_hidden_size", 32), "target_hidden_size 32 x 2 target layers implies 64 columns"),
    (set_in("draft_vocab_size", 100), "draft_vocab_size 100"),
])
def test_draft_keys_that_cannot_be_read_are_refused(bases, tmp_path, edit, needle):
    target, drafts, _ = bases
    with pytest.raises(CheckpointError) as caught:
        read_pair(target, variant(drafts["dflash1"], tmp_path / "d", edit))
    assert needle in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_dflash_config_block_size_alone_is_read(bases, tmp_path):
    target, drafts, _ = bases

    def edit(config):
        del config["block_size"]
        config["dflash_config"]["block_size"] = 8

    assert read_pair(target, variant(drafts["dflash1"], tmp_path / "d", edit)).block_size == 8


@pytest.mark.parametrize("engine", ENGINES)
def test_the_new_readings_stay_lossless(bases, engine):
    """A DFlash 2 draft read the new ways at once (every layer sliding and bidirectional under a window shorter
    than the block, a saturating softcap after the top-K, a multiplier, an input scale): at temperature 0 the
    ids are the target's own greedy ids for every block size."""
    from dflash_tui.engines import GenerationRequest
    from tests.oracles import mlx_lm_greedy, run, transformers_greedy

    target, drafts, root = bases
    draft = variant(drafts["dflash2"], root / f"lossless-{engine}", edits(
        set_in("dflash_config.use_swa", True), set_in("dflash_config.swa_window_size", 3),
        set_in("dflash_config.final_logit_softcapping", 1e-4), set_in("dflash_config.output_multiplier", 2.0),
        set_in("dflash_config.input_embedding_scale", 1.5)))
    engine_ = engine_for(engine, target, draft)
    layers = engine_.draft.layers
    assert [layer.self_attn.window for layer in layers] == [3, 3] and not any(layer.causal for layer in layers)
    ids = engine_.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    expected = (transformers_greedy if engine == "cuda" else mlx_lm_greedy)(target, ids, 20)
    for size in (1, 3, 8, 16):
        summary = run(engine_, prompt_ids=ids, max_new_tokens=20, temperature=0, block_size=size, stop_ids=[])[1]
        assert summary.token_ids == expected, f"block {size}"
