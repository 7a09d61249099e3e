"""Sampling settings: the request's values, else the target's generation_config, else greedy."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from dflash_tui.engines.config import PENALTY_FIELDS, SAMPLING_FIELDS, GenerationRequest, Penalties, Sampling
from dflash_tui.engines.errors import UserError

# the value that leaves each setting out, from its one declaration (engines.config.Sampling)
OFF = {f.name: f.metadata["off"] for f in fields(Sampling) + fields(Penalties)}


@dataclass
class SamplingParams(Sampling, Penalties):
    """Sampling settings resolved for one generation: every field set (None becomes its `OFF` value, so
    `SamplingParams()` is greedy), in the field's own type. The penalties shape the target's distribution
    p (greedy picks its argmax); `logprobs` / `top_logprobs` ask the loop for the emitted tokens' raw
    log-probabilities (RawStep.logprobs)."""

    # The inherited settings again, in the type they hold here (never None), defaulting to their `OFF`
    # value; keyword-only and in their declared order, as in `Sampling` and `Penalties`.
    temperature: float = field(default=OFF["temperature"], kw_only=True)
    top_p: float = field(default=OFF["top_p"], kw_only=True)
    top_k: int = field(default=OFF["top_k"], kw_only=True)
    min_p: float = field(default=OFF["min_p"], kw_only=True)
    presence_penalty: float = field(default=OFF["presence_penalty"], kw_only=True)
    frequency_penalty: float = field(default=OFF["frequency_penalty"], kw_only=True)
    repetition_penalty: float = field(default=OFF["repetition_penalty"], kw_only=True)
    logit_bias: dict[int, float] = field(default_factory=dict, kw_only=True)
    seed: int = 0
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        for name, off in OFF.items():
            value = getattr(self, name)
            setattr(self, name, off if value is None else type(off)(value))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty or bias changes the logits."""
        return any(getattr(self, name) != OFF[name] for name in PENALTY_FIELDS)


def resolve_sampling(request: GenerationRequest, generation_config: dict) -> SamplingParams:
    """The request's values, else (when the target samples by default) its generation_config's, else off."""
    sampled = bool(generation_config.get("do_sample", False))

    def pick(name):
        value = getattr(request, name)
        if value is None and sampled:
            return generation_config.get(name)
        return value

    params = SamplingParams(seed=int(request.seed), **{name: pick(name) for name in SAMPLING_FIELDS},
                            **{name: getattr(request, name) for name in PENALTY_FIELDS},
                            logprobs=bool(request.logprobs), top_logprobs=int(request.top_logprobs or 0))
    params.logit_bias = {int(k): float(v) for k, v in params.logit_bias.items() if v}
    if params.temperature < 0:
        raise UserError(f"Temperature {params.temperature} is negative; use 0 for greedy decoding or a positive value to sample.")
    if not 0 < params.top_p <= 1:
        raise UserError(f"top_p {params.top_p} is outside (0, 1]; use 1 to disable it.")
    if params.top_k < 0:
        raise UserError(f"top_k {params.top_k} is negative; use 0 to disable it.")
    if not 0 <= params.min_p < 1:
        raise UserError(f"min_p {params.min_p} is outside [0, 1); use 0 to disable it.")
    return params
