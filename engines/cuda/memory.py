"""Will the pair fit? An estimate from safetensors headers, before any weight is read.

A model that cannot fit gets one sentence (how much it needs, how much there is, what to try)
instead of an out-of-memory crash halfway through loading.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch

from dflash_tui.engines.checkpoints import safetensors_shapes
from dflash_tui.engines.errors import UserError

# Tensors of the towers a multimodal checkpoint carries beside its language model, which the engine never loads
# (Qwen3.5's vision tower; Gemma 4's vision and audio towers and their embedders into the text stream).
TOWER_PREFIXES = tuple(f"{root}{name}." for root in ("", "model.") for name in (
    "visual", "vision_tower", "audio_tower", "embed_vision", "embed_audio"))
HEADROOM = 1.10  # activations, allocator slack
CACHE_POSITIONS = 4096  # K/V counted for this many positions (caches grow in 1,024-position buckets)
# The caches a chat keeps between turns (engines/cuda/cache.py's TurnCache) are these same pooled
# buffers; what they add is the linear-attention snapshots of hybrid targets: the live state plus
# MAX_SNAPSHOTS copies, and the copies a verify keeps for rollback.


MXFP4_PACKED = ("_blocks", "_scales")  # gpt-oss experts: two e2m1 values a byte, one exponent byte per 32


def is_mxfp4(directory: Path) -> bool:
    import json

    from dflash_tui.engines.checkpoints import text_config

    config = json.loads((Path(directory) / "config.json").read_text())
    quant = config.get("quantization_config") or text_config(config).get("quantization_config") or {}
    return isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"


def mxfp4_stays_packed(device: torch.device) -> bool:
    """Whether transformers keeps MXFP4 experts packed on `device` (its Mxfp4HfQuantizer's rule): on a CUDA
    device of compute capability 7.5 or more with Triton >= 3.4 and the `kernels` package installed. Anywhere
    else (the CPU, where the engine never asks for kernels; CUDA without them) it dequantizes them to the
    load dtype."""
    if device.type != "cuda":
        return False
    from transformers.utils import is_kernels_available, is_triton_available

    index = device.index if device.index is not None else 0
    return (torch.cuda.get_device_capability(index) >= (7, 5) and is_triton_available("3.4.0")
            and is_kernels_available())


def weight_bytes(directory: Path, dtype: torch.dtype, mxfp4_packed: bool = False) -> int:
    """Bytes the language-model weights take in `dtype` (vision and audio towers are not loaded). MXFP4 expert tensors
    count as what they become: dequantized, 2 values per `_blocks` byte in `dtype` and the `_scales` gone;
    kept packed (`mxfp4_packed`), their own bytes."""
    size = torch.empty((), dtype=dtype).element_size()
    mxfp4 = is_mxfp4(directory)
    total = 0
    for name, shape in safetensors_shapes(Path(directory)).items():
        if name.startswith(TOWER_PREFIXES):
            continue
        if mxfp4 and name.endswith(MXFP4_PACKED):
            total += math.prod(shape) if mxfp4_packed else (2 * math.prod(shape) * size if name.endswith("_blocks") else 0)
        else:
            total += math.prod(shape) * size
    return total


def free_bytes(device: torch.device) -> tuple[int, str]:
    """Free memory where the weights will go, and a phrase naming that place."""
    if device.type == "cuda":
        count = torch.cuda.device_count() if device.index is None else 1
        indices = range(count) if device.index is None else [device.index]
        free = sum(torch.cuda.mem_get_info(i)[0] for i in indices)
        return free, f"{count} GPU{'s' if count > 1 else ''}"
    import psutil

    # available, not free: the page cache of a model just downloaded or read is reclaimable
    return psutil.virtual_memory().available, "this machine's available RAM"


def cache_bytes(directory: Path, dtype: torch.dtype, positions: int = CACHE_POSITIONS) -> int:
    """K/V bytes of `positions` tokens in the model's attention layers (a draft counts all of its layers: its
    context K/V), from config.json. Sliding-window layers count in full: cache.py keeps every position in
    them (exact rollback and kept turns), reading only their window."""
    import json

    from dflash_tui.engines.checkpoints import text_config

    config = text_config(json.loads((Path(directory) / "config.json").read_text()))
    per_position = sum(2 * heads * dim for heads, dim in kv_shapes(config))
    return per_position * positions * torch.empty((), dtype=dtype).element_size()


GEMMA4_GLOBAL_HEAD_DIM = 512  # transformers' Gemma4TextConfig default where a config names none


def kv_shapes(config: dict) -> list[tuple[int, int]]:
    """(K/V heads, head size) of every layer that caches K/V: linear-attention layers and Gemma 4's shared-KV
    layers cache none, and Gemma 4's global layers have their own sizes (`global_head_dim`,
    `num_global_key_value_heads` with `attention_k_eq_v`, or transformers 5's `per_layer_config`; keys reused
    as values are still cached twice, as the values are normed apart from the keys)."""
    types = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    overrides = config.get("per_layer_config") or {}
    cached = len(types) - (config.get("num_kv_shared_layers") or 0)
    shapes = []
    for i, kind in enumerate(types[:cached]):
        if kind == "linear_attention":
            continue
        heads, dim = kv_heads, head_dim
        if kind == "full_attention" and config.get("model_type") == "gemma4_text":
            dim = config.get("global_head_dim") or GEMMA4_GLOBAL_HEAD_DIM
            if config.get("attention_k_eq_v") and config.get("num_global_key_value_heads"):
                heads = config["num_global_key_value_heads"]
        layer = overrides.get(str(i)) or {}
        shapes.append((layer.get("num_key_value_heads") or heads, layer.get("head_dim") or dim))
    return shapes


def linear_state_bytes(directory: Path, dtype: torch.dtype) -> int:
    """Bytes of every linear-attention (gated delta net) layer's conv and recurrent state, counted for the
    live state, a verify's saved copy and the snapshots a chat keeps between turns; 0 without such layers."""
    import json

    from dflash_tui.engines.checkpoints import text_config
    from dflash_tui.engines.cuda.cache import MAX_SNAPSHOTS

    config = text_config(json.loads((Path(directory) / "config.json").read_text()))
    layers = sum(t == "linear_attention" for t in config.get("layer_types") or [])
    if not layers:
        return 0
    k_heads, v_heads = config.get("linear_num_key_heads", 0), config.get("linear_num_value_heads", 0)
    k_dim, v_dim = config.get("linear_key_head_dim", 0), config.get("linear_value_head_dim", 0)
    conv = (2 * k_heads * k_dim + v_heads * v_dim) * config.get("linear_conv_kernel_dim", 4)
    recurrent = v_heads * k_dim * v_dim
    per_copy = layers * (conv + recurrent) * max(4, torch.empty((), dtype=dtype).element_size())
    return per_copy * (2 + MAX_SNAPSHOTS)


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GB"


def check_fits(target: Path, draft: Optional[Path], dtype: torch.dtype, device: torch.device,
               available: Optional[int] = None) -> None:
    need = weight_bytes(target, dtype, mxfp4_stays_packed(device)) + (weight_bytes(draft, dtype) if draft else 0)
    need = int(need * HEADROOM) + cache_bytes(target, dtype) + (cache_bytes(draft, dtype) if draft else 0)
    need += linear_state_bytes(target, dtype)
    have, where = free_bytes(device)
    have = have if available is None else available
    if have and need > have:
        raise UserError(
            f"The target {target} needs about {gib(need)} in {str(dtype).removeprefix('torch.')} but {where} "
            f"{'has' if 'RAM' in where else 'have'} {gib(have)} free; make more GPUs visible (CUDA_VISIBLE_DEVICES) "
            "with --device auto, use --dtype bfloat16, or run a 4-bit MLX build with --engine mlx."
        )
