"""The DFlash decoding library: engines that stream `StepEvent`s and end with a `Summary`.

Framework-free here; `engines.cuda` (PyTorch + transformers) and `engines.mlx` (MLX) are imported
only when chosen. The contract is docs/engine-contract.md.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path
from typing import Optional

from dflash_tui.engines.config import EngineConfig, GenerationRequest
from dflash_tui.engines.engine import EngineLike, Progress
from dflash_tui.engines.errors import CheckpointError, EngineUnavailable, UserError
from dflash_tui.engines.events import CONTRACT_VERSION, StepEvent, Summary
from dflash_tui.engines.probe import Block1Probe

__all__ = [
    "EngineConfig", "GenerationRequest", "StepEvent", "Summary", "CONTRACT_VERSION", "EngineLike", "UserError",
    "CheckpointError", "EngineUnavailable", "Block1Probe", "load_engine", "choose_engine", "describe_auto", "available_memory",
]

# On a CPU without CUDA or Metal, the PyTorch engine decodes faster than MLX's CPU backend
# (benchmarks/engine_speed.py; README, "Engines").
CPU_DEFAULT = "cuda"
# In a checkout (the Makefile beside the package's folder, reached through the link) `make install` is
# the other way in; an installed wheel has no Makefile to run.
_CHECKOUT = (Path(__file__).resolve().parents[1] / "Makefile").is_file()
INSTALL_HINT = {
    "cuda": "install it with `pip install 'dflash-tui[cuda]'`" + (" (or `make install`)" if _CHECKOUT else ""),
    "mlx": "install it with `pip install 'dflash-tui[mlx]'` (mlx[cpu] on Linux" + ("; or `make install`)" if _CHECKOUT else ")"),
}


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def choose_engine(name: str = "auto") -> str:
    """'cuda', 'mlx' or 'remote' for an engine name, `auto` resolved as docs/design.md, "Choosing an engine", says."""
    if name == "remote":  # a server does the decoding (engines/remote); nothing to install here
        return name
    if name not in ("auto", "cuda", "mlx"):
        raise UserError(f"Engine '{name}' is unknown; choose auto, cuda, mlx or remote.")
    if name != "auto":
        needed = "torch" if name == "cuda" else "mlx"
        if not _has(needed) or not _has("transformers"):
            raise EngineUnavailable(f"The {name} engine needs {needed}, which is not installed; {INSTALL_HINT[name]}.")
        return name
    apple_silicon = sys.platform == "darwin" and platform.machine() == "arm64"
    if apple_silicon and _has("mlx"):
        return "mlx"
    if _has("torch"):
        import torch

        if torch.cuda.is_available() or CPU_DEFAULT == "cuda" or not _has("mlx"):
            return "cuda"
    if _has("mlx"):
        return "mlx"
    raise EngineUnavailable(f"Neither engine is installed; {INSTALL_HINT['cuda']}, or {INSTALL_HINT['mlx']}.")


def load_engine(config: EngineConfig, progress: Optional[Progress] = None) -> EngineLike:
    """Load target, draft and tokenizer on the chosen engine (checks run before any weight loads).
    `progress` hears each stage as it starts (loading the target, the draft, capturing CUDA graphs)."""
    name = choose_engine(config.engine)
    if name == "remote":
        from dflash_tui.engines.remote import RemoteEngine

        return RemoteEngine(config)
    if name == "cuda":
        from dflash_tui.engines.cuda.engine import CudaEngine

        return CudaEngine(config, progress)
    try:
        from dflash_tui.engines.mlx.engine import MlxEngine
    except ImportError:
        raise EngineUnavailable(f"The MLX engine is not available in this build; {INSTALL_HINT['mlx']}.") from None
    return MlxEngine(config, progress)


def describe_auto() -> str:
    """What `--engine auto` resolves to here, and on which device (for `dflash doctor`)."""
    try:
        engine = choose_engine("auto")
    except UserError as exc:
        return f"nothing ({exc})"
    if engine == "cuda":
        import torch

        if torch.cuda.is_available():
            names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
            return f"cuda engine on {torch.cuda.device_count()} GPU(s): {', '.join(names)}"
        return "cuda engine on the CPU (no CUDA device)"
    import mlx.core as mx

    return f"mlx engine on {'the Metal GPU' if mx.is_available(mx.gpu) else 'the CPU'}"


def available_memory() -> tuple[int, str]:
    """Memory the weights of `auto` would go to, and a phrase naming it: the free memory of every
    visible GPU (the cuda engine's own fit check), else the available RAM."""
    if _has("torch"):
        import torch

        from dflash_tui.engines.cuda.memory import free_bytes

        return free_bytes(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    import psutil

    return psutil.virtual_memory().available, "this machine's available RAM"
