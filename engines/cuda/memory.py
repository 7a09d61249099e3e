"""Will the pair fit on the CUDA engine? What the weights become when torch loads them (MXFP4 experts
dequantized where no kernel exists), from safetensors headers before any weight is read; the K/V, the
linear states and the sentence are engines/memory.py's.

A model that cannot fit gets one sentence (how much it needs, how much there is, what to try)
instead of an out-of-memory crash halfway through loading.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch

from dflash_tui.engines import memory
from dflash_tui.engines.checkpoints import safetensors_shapes

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
        if name.startswith(memory.TOWER_PREFIXES):
            continue
        if mxfp4 and name.endswith(MXFP4_PACKED):
            total += math.prod(shape) if mxfp4_packed else (2 * math.prod(shape) * size if name.endswith("_blocks") else 0)
        else:
            total += math.prod(shape) * size
    return total


def free_bytes(device: torch.device) -> tuple[int, str]:
    """Free memory where the weights will go, and the place named with its verb."""
    if device.type == "cuda":
        count = torch.cuda.device_count() if device.index is None else 1
        indices = range(count) if device.index is None else [device.index]
        free = sum(torch.cuda.mem_get_info(i)[0] for i in indices)
        return free, f"{count} GPU{'s have' if count > 1 else ' has'}"
    return memory.available_ram(), "this machine's available RAM has"


def check_fits(target: Path, draft: Optional[Path], dtype: torch.dtype, device: torch.device,
               available: Optional[int] = None) -> None:
    weights = weight_bytes(target, dtype, mxfp4_stays_packed(device)) + (weight_bytes(draft, dtype) if draft else 0)
    need = memory.pair_bytes(target, draft, weights, torch.empty((), dtype=dtype).element_size())
    have, where = free_bytes(device)
    memory.require(target, need, have if available is None else available, where,
                   str(dtype).removeprefix("torch."),
                   "make more GPUs visible (CUDA_VISIBLE_DEVICES) with --device auto, use --dtype bfloat16, "
                   "or run a 4-bit MLX build with --engine mlx")
