"""What the installed frameworks can do for a model, asked without loading one: whether transformers and
mlx-lm run its model type, and whether this machine keeps MXFP4 experts packed. `dflash doctor` asks here, so
torch, transformers and mlx are imported inside engines/ only (docs/design.md, "Layers")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

Mxfp4 = Literal["no torch", "no CUDA device", "packed", "dequantized"]


@dataclass(frozen=True)
class Runs:
    """Whether each framework runs a model type: None when the framework is not installed."""

    transformers: Optional[bool]
    mlx_lm: Optional[bool]


def runs(model_type: str) -> Runs:
    """Which installed framework has a model class for `model_type` (a config.json's `model_type`)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        by_transformers = None
    else:
        by_transformers = model_type in CONFIG_MAPPING_NAMES
    try:
        from dflash_tui.engines.mlx.target import mlx_model_types
    except ImportError:
        by_mlx = None
    else:
        by_mlx = model_type in mlx_model_types()
    return Runs(by_transformers, by_mlx)


def mxfp4_experts() -> Mxfp4:
    """How transformers would load MXFP4 experts here (engines/cuda/memory.py's rule): packed, dequantized to
    the load dtype, or unknown for want of torch or of a CUDA device (then they load dequantized)."""
    try:
        import torch

        from dflash_tui.engines.cuda.memory import mxfp4_stays_packed
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return "packed" if mxfp4_stays_packed(torch.device("cuda")) else "dequantized"
