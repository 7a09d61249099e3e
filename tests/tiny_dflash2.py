"""Random tiny DFlash 2 drafts in the published layout (docs/dflash2.md), for the tiny targets of tests/tiny.py.

The backbone is tests/tiny.py's DFlash 1 draft (the same builder, the same weights for the same seed);
this module rewrites its config.json as a DFlash 2 config and adds the two convolutions of every layer and
the candidate selector to its model.safetensors. The new tensors are drawn large enough that the
convolutions and the selector change the drafted block (they are far from the identity convolution and the
zero codebooks that reduce DFlash 2 to DFlash 1); `identity=True` writes exactly that reduction instead.

Variants for the loaders' refusals and the per-layer causality: `causal` at any of the three places the
resolution reads, sliding layers, an input embedding scale, logit multipliers, tensors left out, the
selector under a DFlash 1 architecture, and the `model.` prefix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from tests import tiny

DFLASH2_ARCH = "DFlash2DraftModel"
SELECTOR = ("candidate_selector.hidden_projection.weight", "candidate_selector.predecessor_codebook",
            "candidate_selector.successor_codebook")
# where a causal flag is written: the two keys vLLM's resolution reads, in its order, and one it ignores
# (docs/dflash2.md)
CAUSAL_KEYS = ("is_causal", "dflash_config.causal", "dflash_config.is_causal")


def dflash2_tensors(config: dict, vocab: int, taps: int, groups: int, selector_dim: int, seed: int,
                    identity: bool = False, conv_std: float = 0.05, kernel_std: float = 0.4,
                    selector_std: float = 0.5) -> dict:
    """The convolution tensors of every layer and the selector's, float32 torch tensors by HF name.

    conv_std is the kernel projection's weight scale (the content term is about conv_std * sqrt(hidden)
    on a normed input), kernel_std the spread of the base taps around the identity, selector_std the
    codebooks' scale (the hidden projection uses 0.2, as the backbone)."""
    import torch

    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    if hidden % groups:
        raise ValueError(f"{groups} groups do not divide hidden {hidden}")
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    tensors = {}
    for n in range(layers):
        for part in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, taps, hidden)
            base[:, 0] = 1.0
            proj = torch.zeros(2 * taps * groups, hidden)
            if not identity:
                base = base + kernel_std * randn(2, taps, hidden)
                proj = conv_std * randn(2 * taps * groups, hidden)
            tensors[f"layers.{n}.{part}.base_kernel"] = base
            tensors[f"layers.{n}.{part}.kernel_projection.weight"] = proj
    tensors[SELECTOR[0]] = 0.2 * randn(selector_dim, hidden)
    scale = 0.0 if identity else selector_std
    tensors[SELECTOR[1]] = scale * randn(vocab, selector_dim)
    tensors[SELECTOR[2]] = scale * randn(vocab, selector_dim)
    return tensors


def make_dflash2_draft(
    out: Path,
    target: Path,
    layer_ids: Sequence[int],
    block_size: int = 16,
    layers: int = 2,
    seed: int = 1,
    *,
    taps: int = 2,
    groups: int = 4,
    selector_dim: int = 16,
    top_k: Optional[int] = 8,
    architecture: str = DFLASH2_ARCH,
    causal: Optional[bool] = None,
    causal_key: str = "is_causal",
    sliding_window: Optional[int] = None,
    layer_types: Optional[list[str]] = None,
    embedding_scale: Optional[float] = None,
    embedding_scale_in_dflash: bool = True,
    output_multiplier: Optional[float] = None,
    softcap: Optional[float] = None,
    head_keys_in_dflash: bool = True,
    sizes: bool = True,
    identity: bool = False,
    drop: Sequence[str] = (),
    with_dflash2_tensors: bool = True,
    prefix: str = "",
    **tensor_scales,
) -> Path:
    """A DFlash 2 draft for `target` in `out`; returns `out`.

    causal / causal_key: write `causal` under one of CAUSAL_KEYS (None: no flag, so the layer types decide).
    embedding_scale, output_multiplier and softcap go in dflash_config (where vLLM reads them) unless
    embedding_scale_in_dflash / head_keys_in_dflash is False (the top level, which vLLM does not read);
    sizes False leaves out conv_kernel_size, conv_group_size and selector_rank.
    sliding_window with layer_types (default: the first layer sliding, the others full).
    top_k None leaves selector_top_k out; architecture "DFlashDraftModel" with the tensors kept is a DFlash 1
    config carrying DFlash 2 tensors; with_dflash2_tensors False writes none of them; drop names tensors
    (HF names, without prefix) to leave out; prefix "model." stores every tensor under it.
    tensor_scales go to dflash2_tensors (conv_std, kernel_std, selector_std)."""
    import torch
    from safetensors.torch import load_file, save_file

    out = Path(out)
    tiny.make_draft(out, target, list(layer_ids), block_size=block_size, layers=layers, seed=seed)
    config = json.loads((out / "config.json").read_text())
    vocab = config["vocab_size"]
    config["architectures"] = [architecture]
    dflash = config["dflash_config"]
    if top_k is not None:
        dflash["selector_top_k"] = top_k
    if sizes and with_dflash2_tensors and architecture == DFLASH2_ARCH:  # the sizes vLLM, llama.cpp, z-lab index
        dflash.update(conv_kernel_size=taps, conv_group_size=config["hidden_size"] // groups, selector_rank=selector_dim)
    if causal is not None:
        if causal_key not in CAUSAL_KEYS:
            raise ValueError(f"causal_key {causal_key!r} is not one of {CAUSAL_KEYS}")
        holder = dflash if causal_key.startswith("dflash_config.") else config
        holder[causal_key.removeprefix("dflash_config.")] = causal
    if sliding_window is not None:
        config["sliding_window"] = sliding_window
        config["layer_types"] = layer_types or ["sliding_attention"] + ["full_attention"] * (layers - 1)
    elif layer_types is not None:
        config["layer_types"] = layer_types
    if embedding_scale is not None:
        (dflash if embedding_scale_in_dflash else config)["input_embedding_scale"] = embedding_scale
    if output_multiplier is not None:
        (dflash if head_keys_in_dflash else config)["output_multiplier"] = output_multiplier
    if softcap is not None:
        (dflash if head_keys_in_dflash else config)["final_logit_softcapping"] = softcap
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    weights = load_file(str(out / "model.safetensors"))
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    if with_dflash2_tensors:
        weights.update(dflash2_tensors(config, vocab, taps, groups, selector_dim, seed + 1000, identity,
                                       **tensor_scales))
    for name in drop:
        del weights[name]
    weights = {prefix + k: v.to(torch.float32).contiguous() for k, v in weights.items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# The drafts both engines' DFlash 2 tests run, by name: (family, target layer ids, make_dflash2_draft options)
DRAFTS = {
    "qwen3": ("qwen3", [0, 2], {}),
    "qwen3-variant": ("qwen3", [0, 2], dict(sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                                            embedding_scale=1.5, output_multiplier=1.3, softcap=6.0, taps=3, groups=8,
                                            causal=True, causal_key="dflash_config.causal", top_k=5)),
    "qwen3_5-last": ("qwen3_5", [1, 3], dict(sliding_window=4, layer_types=["sliding_attention"] * 2)),
    # DFlash 1 with a sliding layer: no flag, so that layer is causal inside the block
    "dflash1-sliding": ("qwen3", [0, 2], dict(with_dflash2_tensors=False, top_k=None, architecture="DFlashDraftModel",
                                              sliding_window=4)),
}


def draft_builder(pairs, tmp_path_factory, engine_name: str, variants: Optional[dict] = None):
    """A module fixture's getter: name -> (target, draft, engine) for `variants` (default DRAFTS), each draft
    written and its engine (tests.oracles.engine_for) loaded once."""
    from tests.oracles import engine_for

    variants = variants or DRAFTS
    cache = {}

    def get(name):
        if name not in cache:
            family, layer_ids, options = variants[name]
            target, _ = pairs(family)
            draft = make_dflash2_draft(tmp_path_factory.mktemp(name) / "draft", target, layer_ids, **options)
            cache[name] = (target, draft, engine_for(engine_name, target, draft))
        return cache[name]

    return get
