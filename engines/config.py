"""What to load (`EngineConfig`) and what to generate (`GenerationRequest`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

ENGINES = ("auto", "cuda", "mlx")
DTYPES = ("auto", "float32", "float16", "bfloat16")
MAX_BLOCK_SIZE = 64


@dataclass
class EngineConfig:
    """A target, its DFlash draft and how to run them. `draft=None` runs the target alone (block size 1)."""

    target: str
    draft: Optional[str] = None
    engine: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    block_size: Optional[int] = None  # None: the draft's trained block size
    draft_window: Optional[int] = None  # the block attends to at most this many recent context positions
    target_layer_ids: Optional[list[int]] = None  # a profile's restatement; must equal the draft's own
    cuda_graphs: Optional[bool] = None  # CUDA engine on a GPU: replay captured decode steps; None: DFLASH_CUDA_GRAPHS=1
    source: str = "command line"  # where these values came from, for error messages


@dataclass
class GenerationRequest:
    """One generation. Exactly one of `messages` (chat template applied), `prompt` (raw text, no
    template, no special tokens) or `prompt_ids` is given. Sampling fields left as None take the
    target's generation_config values."""

    messages: Optional[list[dict]] = None
    prompt: Optional[str] = None
    prompt_ids: Optional[list[int]] = None
    max_new_tokens: int = 256
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: int = 0
    block_size: Optional[int] = None  # overrides the engine's block size for this request
    thinking: bool = True
    stop_ids: Optional[list[int]] = None  # None: every eos id of the target's generation_config
    cancel: threading.Event = field(default_factory=threading.Event)
