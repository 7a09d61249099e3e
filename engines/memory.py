"""Will the pair fit? The engine-neutral half of the estimate: K/V and linear-state sizes from config.json,
the towers no engine loads, and the one sentence a pair that cannot fit gets. Each engine adds what its
weights become when loaded (engines/cuda/memory.py, engines/mlx/memory.py). No torch, no mlx here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from dflash_tui.engines.errors import UserError

# Tensors of the towers a multimodal checkpoint carries beside its language model, which the engines never load
# (Qwen3.5's vision tower; Gemma 4's vision and audio towers and their embedders into the text stream).
TOWER_PREFIXES = tuple(f"{root}{name}." for root in ("", "model.") for name in (
    "visual", "vision_tower", "audio_tower", "embed_vision", "embed_audio"))
HEADROOM = 1.10  # activations, allocator slack
CACHE_POSITIONS = 4096  # K/V counted for this many positions (caches grow in buckets)
# The caches a chat keeps between turns are these same buffers; what they add is the linear-attention
# snapshots of hybrid targets: the live state plus SNAPSHOTS copies, and the copy a verify keeps for rollback.
SNAPSHOTS = 3  # engines/cuda/cache.py's MAX_SNAPSHOTS and engines/mlx/loop.py's TurnCache.MAX_SNAPSHOTS
GEMMA4_GLOBAL_HEAD_DIM = 512  # transformers' Gemma4TextConfig default where a config names none


def text_config_of(directory: Path) -> dict:
    from dflash_tui.engines.checkpoints import text_config

    return text_config(json.loads((Path(directory) / "config.json").read_text()))


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


def cache_bytes(directory: Path, itemsize: int, positions: int = CACHE_POSITIONS) -> int:
    """K/V bytes of `positions` tokens in the model's attention layers (a draft counts all of its layers: its
    context K/V), at `itemsize` bytes a value. Sliding-window layers count in full: both engines keep every
    position in them (exact rollback and kept turns), reading only their window."""
    per_position = sum(2 * heads * dim for heads, dim in kv_shapes(text_config_of(directory)))
    return per_position * positions * itemsize


def linear_state_bytes(directory: Path, itemsize: int) -> int:
    """Bytes of every linear-attention (gated delta net) layer's conv and recurrent state, counted for the
    live state, a verify's saved copy and the snapshots a chat keeps between turns; 0 without such layers.
    The states are kept in at least float32."""
    config = text_config_of(directory)
    layers = sum(t == "linear_attention" for t in config.get("layer_types") or [])
    if not layers:
        return 0
    k_heads, v_heads = config.get("linear_num_key_heads", 0), config.get("linear_num_value_heads", 0)
    k_dim, v_dim = config.get("linear_key_head_dim", 0), config.get("linear_value_head_dim", 0)
    conv = (2 * k_heads * k_dim + v_heads * v_dim) * config.get("linear_conv_kernel_dim", 4)
    recurrent = v_heads * k_dim * v_dim
    return layers * (conv + recurrent) * max(4, itemsize) * (2 + SNAPSHOTS)


def pair_bytes(target: Path, draft: Optional[Path], weights: int, itemsize: int) -> int:
    """What a pair needs in all: `weights` (the engine's count of both checkpoints as loaded) with headroom,
    the K/V of `CACHE_POSITIONS` positions in the target and the draft, and the target's linear states, all
    at `itemsize` bytes a value."""
    need = int(weights * HEADROOM) + cache_bytes(target, itemsize) + linear_state_bytes(target, itemsize)
    return need + (cache_bytes(draft, itemsize) if draft else 0)


def available_ram() -> int:
    """Available, not free: the page cache of a model just downloaded or read is reclaimable."""
    import psutil

    return int(psutil.virtual_memory().available)


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GB"


def require(target: Path, need: int, have: int, where_has: str, dtype: str, advice: str) -> None:
    """One sentence when `need` bytes exceed the `have` bytes free (0: unknown, not checked); `where_has`
    names the place with its verb ("2 GPUs have", "this machine's available RAM has")."""
    if have and need > have:
        raise UserError(f"The target {target} needs about {gib(need)} in {dtype} but {where_has} {gib(have)} free; "
                        f"{advice}.")
