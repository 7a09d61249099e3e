"""Will the pair fit on the MLX engine? mlx-lm keeps weights as stored: quantized ones (mlx_lm.convert's
4-bit and 8-bit packs, gpt-oss's MXFP4 experts) stay packed, and floating-point ones take the engine's
dtype when one is set (float32 on the CPU by default, engines/mlx/engine.py). From safetensors headers,
before any weight is read; the K/V, the linear states and the sentence are engines/memory.py's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from dflash_tui.engines import memory
from dflash_tui.engines.checkpoints import DTYPE_BITS, FLOAT_DTYPES, safetensors_headers

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def weight_bytes(directory: Path, dtype: Optional[str]) -> int:
    """Bytes of the language model's weights once mlx-lm holds them: integer (packed) tensors as stored,
    floating-point ones in `dtype` (None: as stored). Vision and audio towers are not loaded."""
    total = 0
    for name, entry in safetensors_headers(Path(directory)).items():
        if name.startswith(memory.TOWER_PREFIXES):
            continue
        count = math.prod(entry["shape"])
        stored = str(entry.get("dtype"))
        if dtype is not None and stored in FLOAT_DTYPES:
            total += count * ITEMSIZE[dtype]
        else:
            total += (count * DTYPE_BITS.get(stored, 16) + 7) // 8
    return total


def float_itemsize(directory: Path) -> int:
    """Bytes a value of the checkpoint's floating-point tensors takes: 4 if any is float32 or wider, else 2."""
    bits = [DTYPE_BITS[e["dtype"]] for e in safetensors_headers(Path(directory)).values() if e.get("dtype") in FLOAT_DTYPES]
    return 4 if max(bits, default=16) >= 32 else 2


def free_bytes(device: str) -> tuple[int, str]:
    """What the weights may take, and the place named with its verb: Metal's recommended working set (the
    unified memory the GPU may wire) on the GPU, the available RAM on the CPU."""
    if device == "gpu":
        import mlx.core as mx

        size = int(mx.device_info().get("max_recommended_working_set_size", 0))
        if size:
            return size, "the GPU's recommended working set has"
    return memory.available_ram(), "this machine's available RAM has"


def check_fits(target: Path, draft: Optional[Path], dtype: Optional[str], device: str,
               available: Optional[int] = None) -> None:
    """`dtype` None: the checkpoint's own (the GPU's auto); the draft runs in the target's dtype."""
    itemsize = ITEMSIZE[dtype] if dtype else float_itemsize(target)
    draft_dtype = dtype or {4: "float32", 2: "float16"}[itemsize]
    weights = weight_bytes(target, dtype) + (weight_bytes(draft, draft_dtype) if draft else 0)
    need = memory.pair_bytes(target, draft, weights, itemsize)
    have, where = free_bytes(device)
    memory.require(target, need, have if available is None else available, where, dtype or "its own dtype",
                   "run a smaller quantized build (mlx_lm.convert -q, or the profile's [engines.mlx] target), "
                   "or a smaller model")
