"""The MLX engine: the target through mlx-lm (Metal on Apple Silicon, mlx[cpu] on Linux), the DFlash
draft as an MLX module loading the same public draft checkpoint, and the loop of engines/mlx/loop.py.

Importing this module without mlx or mlx-lm raises ImportError; `engines.load_engine` turns that into
one sentence on how to install them.
"""

from __future__ import annotations

from typing import Generator, Optional

import mlx.core as mx
import mlx_lm  # noqa: F401  (an ImportError here, not later, when mlx-lm is missing)

from dflash_tui.engines.config import EngineConfig
from dflash_tui.engines.engine import Engine, Progress, RawStep
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.mlx.draft import DFlashDraft
from dflash_tui.engines.mlx.loop import Sampler, TurnCache, speculative_decode
from dflash_tui.engines.mlx.memory import check_fits
from dflash_tui.engines.mlx.probe import block1_step
from dflash_tui.engines.mlx.target import DTYPES, Target, check_target, dtype_name
from dflash_tui.engines.sampling import SamplingParams


def pick_device(name: str) -> mx.Device:
    if name in ("auto", "", None):
        return mx.default_device()
    if name == "cpu":
        return mx.Device(mx.cpu)  # mx.cpu is the device type; set_default_device and .type want a Device
    if name in ("gpu", "metal", "mps"):
        if not mx.is_available(mx.gpu):
            raise UserError(f"Device '{name}' was asked for but MLX sees no GPU here; use --device cpu or auto.")
        return mx.Device(mx.gpu)
    raise UserError(f"Device '{name}' is not an MLX device; use auto, cpu or gpu.")


class MlxEngine(Engine):
    name = "mlx"
    check_target = staticmethod(check_target)

    def __init__(self, config: EngineConfig, progress: Optional[Progress] = None):
        super().__init__(config, progress)
        if config.dtype not in ("auto", *DTYPES):
            raise UserError(f"dtype '{config.dtype}' in {config.source} is unknown; use auto, float32, float16 or bfloat16.")
        device = pick_device(config.device)
        mx.set_default_device(device)
        self.device = "gpu" if device.type == mx.DeviceType.gpu else "cpu"
        if self.device == "cpu":
            self.warnings.append("MLX runs on the CPU here (no Metal GPU).")
        layer_ids = self.draft_info.target_layer_ids if self.draft_info else []
        # auto: the checkpoint's own dtype on the GPU; float32 on the CPU, as the CUDA engine does there
        # (half-precision arithmetic on the CPU is slow and rounds differently from the CUDA engine's).
        dtype = config.dtype if config.dtype != "auto" or self.device == "gpu" else "float32"
        check_fits(self.target_info.path, self.draft_info.path if self.draft_info else None,
                   None if dtype == "auto" else dtype, self.device)
        self.progress(f"loading the target ({dtype} on {self.device})")
        self.target = Target(self.target_info, dtype, layer_ids)
        self.dtype = dtype_name(self.target.dtype)
        if self.draft_info:
            self.progress("loading the draft")
        self.draft = DFlashDraft.load(self.draft_info, self.target.dtype) if self.draft_info else None
        self.turn = TurnCache()  # the caches the last request left, for the next turn of a chat

    @property
    def model(self):
        """The mlx-lm model of the target (for mlx-lm's own generate in benchmarks)."""
        return self.target.model

    def _decode(self, prompt_ids: list[int], block_size: int, sampling: SamplingParams,
                max_new_tokens: int, reuse: bool = False, split=None, guide=None) -> Generator[RawStep, None, None]:
        return speculative_decode(self.target, self.draft, prompt_ids, block_size, max_new_tokens,
                                  Sampler(sampling), self.config.draft_window, turn=self.turn, reuse=reuse,
                                  split=split, guide=guide)

    def _forget_turns(self) -> None:
        self.turn.clear()

    def _block1_step(self):
        return block1_step(self.target, self.turn)

    def _reset_peak_memory(self) -> None:
        mx.reset_peak_memory()

    def _peak_memory(self) -> tuple[int, str]:
        return int(mx.get_peak_memory()), "device"
