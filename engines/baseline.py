"""The framework's own generate and the target's top-2 margin: what bench and replay measure against.

Each framework engine has a `baseline` module (`engines/cuda/baseline.py`, `engines/mlx/baseline.py`)
with `NAME`, `generate(engine, ...)` and `top2_margin(engine, ids)`; `Engine` calls them, so front ends
never import a framework or reach into a loaded model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class BaselineRun:
    """One generation by the framework's own loop over the target alone."""

    token_ids: list[int]
    ttft_s: float
    decode_s: float

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Margin:
    """The target's next-token logit margin: best minus second best, and those two ids. `value` is None
    where the engine cannot compute it (a margin is a diagnostic, never a failure)."""

    value: Optional[float] = None
    top2: list[int] = field(default_factory=list)


def cut_at_stop(ids: list[int], stops: set[int]) -> list[int]:
    """`ids` up to and including the first stop id (the engines' own rule)."""
    hit = next((i for i, t in enumerate(ids) if t in stops), None)
    return ids if hit is None else ids[: hit + 1]
