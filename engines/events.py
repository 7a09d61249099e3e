"""The engine contract's event stream: plain, JSON-serialisable dataclasses.

`generate()` yields one `StepEvent` for the token sampled from the prefill logits (not a step: `drafted`
is empty and it does not count toward tau), then one per verify step. `Summary` closes the stream.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Optional, Union

# The version of this contract (docs/engine-contract.md). Additions with a default keep the number;
# a field that changes meaning or goes away bumps it. Version 2: None means unknown (a server that is not
# `dflash serve` cannot report every figure); version 1 wrote 0 there.
CONTRACT_VERSION = 3
UNVERSIONED = 1  # the version of a Summary written before `contract` existed

Piece = tuple[str, str]  # (text, origin) with origin "draft" or "target"
TopLogprob = list[Union[int, float]]  # [id, logprob]: one of the most likely ids at a position (a JSON pair)
_EMPTY = {"int": 0, "float": 0.0, "str": "", "bool": False}


def from_dict(cls, data: dict):
    """`cls` from a dict written by any version: unknown keys are ignored, a missing field takes its
    default, or an empty value of its type, None for an Optional one (files written before a field
    existed still load)."""
    values = {}
    for f in fields(cls):
        if f.name in data:
            values[f.name] = data[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            values[f.name] = [] if str(f.type).startswith("list") else _EMPTY.get(str(f.type))
    return cls(**values)


@dataclass
class StepEvent:
    drafted: list[int]
    accepted: int
    emitted: list[int]
    pieces: list[Piece]
    rejected: list[int] = field(default_factory=list)
    rejected_text: str = ""
    draft_s: float = 0.0
    verify_s: float = 0.0
    # the step's other work in the engine (acceptance, cache commits, detokenizing), not the consumer's time
    # between events: draft_s + verify_s + loop_s is the step as the engine spent it
    loop_s: float = 0.0
    finish_reason: Optional[str] = None
    is_prefill: bool = False
    # with GenerationRequest.logprobs: per emitted id, its raw log-probability under the target (before
    # bias, penalties, temperature and truncation), and with top_logprobs [[id, logprob], ...] at that position
    logprobs: Optional[list[float]] = None
    top_logprobs: Optional[list[list[TopLogprob]]] = None

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["pieces"] = [list(p) for p in self.pieces]
        return data


def acceptance_histogram(acceptance_lengths: list[int], block_size: int) -> list[int]:
    """Counts of acceptance lengths 1..block_size (index 0 is length 1)."""
    counts = Counter(acceptance_lengths)
    return [counts.get(n, 0) for n in range(1, max(block_size, 1) + 1)]


@dataclass
class Summary:
    """What a generation measured. A field typed Optional is None where the engine cannot know it (the
    remote engine on a server other than `dflash serve`): unknown, never a measured zero. The local engines
    fill every one of them."""

    prompt_tokens: int
    generated_tokens: int
    token_ids: list[int]
    text: str
    ttft_s: float
    decode_s: float
    decode_tokens_per_s: float
    acceptance_lengths: Optional[list[int]]  # one per verify step; None: the server does not report steps
    mean_acceptance_length: Optional[float]  # tau; None: unknown
    histogram: Optional[list[int]]  # steps per acceptance length 1..block_size; None: unknown
    draft_s: Optional[float]  # None: unknown
    verify_s: Optional[float]
    peak_memory_bytes: Optional[int]  # None: unknown
    peak_memory_kind: Optional[str]  # "device" (reset per generation), "process-lifetime-rss"; None: unknown
    block_size: Optional[int]  # the block size the steps used; None: the server did not say
    engine: str
    device: str
    dtype: str
    finish_reason: str
    graphs: Optional[bool] = False  # the decode steps replayed CUDA graphs (absent in older session files)
    reused_prompt_tokens: Optional[int] = 0  # prompt tokens whose caches a previous turn left (not prefilled again)
    prefilled_prompt_tokens: Optional[int] = 0  # prompt tokens this turn's prefill ran (0 in files from before the field)
    limit: Optional[str] = None  # with finish_reason "length": "tokens" (max_new_tokens) or "context" (the window is full)
    acceptance_rule: Optional[str] = None  # "greedy", "exact-match" or "rejection" (docs/engine-contract.md); None: unknown
    grammar_s: Optional[float] = None  # a constrained request's time in the grammar (masks, walks, rollbacks); None: free
    loop_s: Optional[float] = None  # the steps' loop_s, summed; None: unknown (a server's, or a file from before it)
    contract: int = CONTRACT_VERSION  # the contract version this Summary was written under

    @property
    def stopped_by(self) -> str:
        """Why an answer ended early, in the words every front end shows ("" for a natural stop)."""
        if self.finish_reason == "cancelled":
            return "stopped: cancelled"
        if self.finish_reason == "length":
            return "stopped: context full" if self.limit == "context" else "stopped: token limit"
        return ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Summary":
        """A Summary of any version, as written: a version-1 file's 0 stays a 0 (it was measured there);
        a field the file lacks takes its default, or None (unknown) for one without a default."""
        if "contract" not in data:
            data = {**data, "contract": UNVERSIONED}
        return from_dict(cls, data)
