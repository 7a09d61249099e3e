"""The PyTorch + transformers engine: CUDA when present, else the CPU with a visible notice."""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Callable, ContextManager, Generator, Optional

import torch

from dflash_tui.engines.config import BACKGROUND, EngineConfig, GenerationRequest
from dflash_tui.engines.cuda.background import BackgroundSteps, ModelGate
from dflash_tui.engines.cuda.cache import CachePool, TurnCache
from dflash_tui.engines.cuda.draft import DFlashDraft
from dflash_tui.engines.cuda.graphs import StepGraphs, capture_for_request, inductor_cache, why_eager
from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
from dflash_tui.engines.cuda.memory import check_fits
from dflash_tui.engines.cuda.probe import block1_step
from dflash_tui.engines.cuda.target import Target, check_family
from dflash_tui.engines.engine import Engine, Progress, RawStep
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.events import StepEvent
from dflash_tui.engines.sampling import SamplingParams

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STEP_PATHS = {"cuda": "CUDA graphs", "inductor": "Compiled steps"}  # the graph path's modes, as warnings name them


def pick_device(name: str) -> torch.device:
    if name in ("auto", "", None):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"Device '{name}' is not a torch device; use auto, cpu, cuda or cuda:N.") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"Device '{name}' is not one the cuda engine runs on; use cpu, cuda or cuda:N "
                        "(for an Apple GPU use --engine mlx).")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"Device '{name}' was asked for but torch sees no CUDA device here; use --device cpu or auto.")
    return device


class CudaEngine(Engine):
    name = "cuda"

    check_target = staticmethod(check_family)

    def __init__(self, config: EngineConfig, progress: Optional[Progress] = None):
        super().__init__(config, progress)
        device = pick_device(config.device)
        if config.dtype not in ("auto", *DTYPES):
            raise UserError(f"dtype '{config.dtype}' in {config.source} is unknown; use auto, float32, float16 or bfloat16.")
        dtype = DTYPES.get(config.dtype) or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        if device.type == "cpu":
            self.warnings.append("No CUDA device: the CUDA engine runs on the CPU.")
        self.device, self.dtype = str(device), str(dtype).removeprefix("torch.")
        check_fits(self.target_info.path, self.draft_info.path if self.draft_info else None, dtype, device)
        layer_ids = self.draft_info.target_layer_ids if self.draft_info else []
        # --device auto with several GPUs spreads the target over all of them (accelerate's device map)
        spread = config.device in ("auto", "", None) and device.type == "cuda" and torch.cuda.device_count() > 1
        self.progress(f"loading the target ({self.dtype} on {self.device})")
        self.target = Target(self.target_info, device, dtype, layer_ids, device_map="auto" if spread else None)
        device = self.target.device  # where the embeddings live; the draft sits beside them
        if self.draft_info:
            self.progress("loading the draft")
        self.draft = DFlashDraft.load(self.draft_info, device, dtype) if self.draft_info else None
        self._torch_device = device
        # every GPU holding part of the pair (one, or all of them when the target is spread)
        self._gpus = sorted({p.device.index or 0 for p in self.target.model.parameters()}) if device.type == "cuda" else []
        self.pool = CachePool(self.target, self.draft)  # static caches, reused from request to request
        self.turn = TurnCache()  # what the last request left in them, for the next turn of a chat
        self._background: Optional[BackgroundSteps] = None  # steps compiling in a thread (background.py)
        self._use: Callable[[], ContextManager] = nullcontext  # held by every use of the model from a request's thread
        self.graphs, self.graphs_note = self._graphs(config, device)

    def _graphs(self, config: EngineConfig, device: torch.device):
        """The graph path when asked for and possible (engines/cuda/graphs.py): CUDA graphs on a GPU, steps
        compiled by inductor on the CPU; captured now for the profile's request at its block size and at
        block 1, so the first answer captures nothing. Asking for the other device's kind is said, not done."""
        asked = {"cuda": config.cuda_graphs, "inductor": config.compile_steps}
        for mode, variable in (("cuda", "DFLASH_CUDA_GRAPHS"), ("inductor", "DFLASH_COMPILE")):
            if asked[mode] is None:
                value = os.environ.get(variable)
                asked[mode] = True if value == "1" else (BACKGROUND if value == BACKGROUND and mode == "inductor"
                                                         else False)
        mode = "cuda" if device.type == "cuda" else "inductor"
        other = "inductor" if mode == "cuda" else "cuda"
        if asked[other] is True:  # (a front end's quiet "background" does not count as asking)
            why = why_eager(self.target, device, other) or "on a GPU the decode steps replay as CUDA graphs instead"
            self.warnings.append(f"{STEP_PATHS[other]} off: {why}.")
        if not asked[mode]:
            return None, "eager"
        reason = why_eager(self.target, device, mode)
        if reason:
            if asked[mode] is True:
                self.warnings.append(f"{STEP_PATHS[mode]} off: {reason}; decoding eager.")
            return None, f"eager ({reason})"
        if mode == "inductor":
            inductor_cache()
        if asked[mode] == BACKGROUND:
            gate = ModelGate()
            self._use = gate.use
            self._background = BackgroundSteps(
                self.target, self.draft, gate, self.block_size if self.draft else 1,
                config.max_new_tokens or GenerationRequest.max_new_tokens, config.draft_window)
            return None, "eager (the decode steps compile in the background after the first answer)"
        graphs = StepGraphs(self.target, self.draft, mode)
        if not self._capture(graphs, self.block_size):
            self.warnings.append(f"{STEP_PATHS[mode]} off: {graphs.failed}; decoding eager.")
            return None, f"eager ({graphs.failed})"
        return graphs, f"{'graphs' if mode == 'cuda' else 'compiled steps'} ({graphs.captures} captured in {graphs.capture_s:.1f} s)"

    def prepare_steps(self, block_size: int) -> bool:
        """The graphs a request of the profile's size at `block_size` needs, captured now (between requests)."""
        with self._use():
            self._adopt()
            if self.graphs is None or self.graphs.failed:
                return False
            before = self.graphs.captures
            self._capture(self.graphs, block_size)
            if self.graphs.captures == before:
                return False
            self._forget_turns()  # the captures' warm-up passes overwrote what the caches kept
            return True

    def _adopt(self) -> None:
        """Between requests: take the steps compiled in the background once they are all there (or say why
        not); the compile is then over and forgotten."""
        background = self._background
        if background is None or not background.started or not background.wait(0):
            return
        self._background = None
        if not background.ok:
            self.graphs_note = f"eager ({background.graphs.failed or 'the background compile failed'})"
            return
        self.graphs, self.pool = background.graphs, background.pool
        self._forget_turns()  # the kept turns live in the eager caches, which go
        self.graphs_note = f"compiled steps ({self.graphs.captures} compiled in the background in {background.seconds:.1f} s)"

    def close(self) -> None:
        """Stop a background compile (after the function it is compiling, so nothing is left half-written)."""
        if self._background is not None:
            self._background.stop()
        super().close()

    def _capture(self, graphs: StepGraphs, block_size: int) -> bool:
        """What the profile's request needs at `block_size` (block 1 without a draft), on the pooled caches."""
        return capture_for_request(graphs, self.pool, block_size if self.draft else 1,
                                   self.config.max_new_tokens or GenerationRequest.max_new_tokens, self.config.draft_window,
                                   self.progress)

    def _decode(self, prompt_ids: list[int], block_size: int, sampling: SamplingParams,
                max_new_tokens: int, reuse: bool = False, split=None, guide=None) -> Generator[RawStep, None, None]:
        self._replays = self.graphs.replays if self.graphs else 0
        return speculative_decode(self.target, self.draft, prompt_ids, block_size, max_new_tokens,
                                  Sampler(sampling, self.target.lm_head.weight.device), self.config.draft_window,
                                  pool=self.pool, graphs=self.graphs, turn=self.turn, reuse=reuse, split=split,
                                  guide=guide)

    def _forget_turns(self) -> None:
        self.turn.clear()

    def _block1_step(self):
        return block1_step(self.target, self.turn, self.graphs)

    def _drive(self, *args) -> Generator[StepEvent, None, None]:
        with self._use():
            self._adopt()
            yield from super()._drive(*args)
            if self.last_summary is not None and self.graphs is not None:
                self.last_summary.graphs = self.graphs.replays > self._replays
        if self._background is not None and not self._background.started:
            self._background.start()  # after the first answer: never in a first answer's way

    def measure_block1(self, steps: int = 4):
        with self._use():
            return super().measure_block1(steps)

    def baseline_generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float):
        with self._use():
            return super().baseline_generate(prompt_ids, max_new_tokens, temperature)

    def top2_margin(self, ids: list[int]):
        with self._use():
            return super().top2_margin(ids)

    def _reset_peak_memory(self) -> None:
        for index in self._gpus:
            torch.cuda.reset_peak_memory_stats(index)

    def _peak_memory(self) -> tuple[int, str]:
        if self._torch_device.type == "cuda":
            return sum(torch.cuda.max_memory_allocated(i) for i in self._gpus), "device"
        return super()._peak_memory()
