"""Sampling settings: the request's values, else the target's generation_config, else greedy."""

from __future__ import annotations

from dataclasses import dataclass

from .config import GenerationRequest
from .errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def resolve_sampling(request: GenerationRequest, generation_config: dict) -> SamplingParams:
    sampled = bool(generation_config.get("do_sample", False))

    def pick(value, key, greedy_default):
        if value is not None:
            return value
        if sampled and generation_config.get(key) is not None:
            return generation_config[key]
        return greedy_default

    params = SamplingParams(
        temperature=float(pick(request.temperature, "temperature", 0.0)),
        top_p=float(pick(request.top_p, "top_p", 1.0)),
        top_k=int(pick(request.top_k, "top_k", 0) or 0),
        min_p=float(pick(request.min_p, "min_p", 0.0) or 0.0),
        seed=int(request.seed),
    )
    if params.temperature < 0:
        raise UserError(f"Temperature {params.temperature} is negative; use 0 for greedy decoding or a positive value to sample.")
    if not 0 < params.top_p <= 1:
        raise UserError(f"top_p {params.top_p} is outside (0, 1]; use 1 to disable it.")
    if params.top_k < 0:
        raise UserError(f"top_k {params.top_k} is negative; use 0 to disable it.")
    if not 0 <= params.min_p < 1:
        raise UserError(f"min_p {params.min_p} is outside [0, 1); use 0 to disable it.")
    return params
