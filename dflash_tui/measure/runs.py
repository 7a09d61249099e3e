"""Run records, shared by bench, replay and tune (no UI framework here).

- `Run`: what one generation measured (ids, text by origin, acceptance lengths, timings, memory).
- `Totals`: what the runs of one block size add up to; a bench or replay row is `Totals` plus its own
  checks. Every block size runs its prompts `repeats` times after a warm-up (one machine's speed moves
  between runs; a single run once read 4.09x and then 18.59x): the row keeps the fastest pass (best of
  N) and every pass's rate, so the spread between them shows how far one number can be trusted.
- `Counter`: progress over a known number of runs.
- `Record`: the base of the saved results (`BenchResult`, `ReplayResult`): a dataclass with a `schema`
  version, `to_dict()` and `from_dict()`, which ignores keys it does not know and fills the ones it
  misses with the field's default, so files written by older and newer versions load. A record also
  reads as the dict it is saved as (`result["rows"][0]["tau"]`), so readers of the JSON keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, Sequence

from dflash_tui.engines.config import GenerationRequest
from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.events import acceptance_histogram

ProgressFn = Callable[[int, int, str], None]  # (done, total, what is running now)


class Record(Mapping):
    """A typed result that reads like its JSON. Subclasses are `@dataclass(eq=False)` with a default for
    every field; `NESTED` names the fields that hold records (one, or a list of them)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # set by each subclass's @dataclass
    NESTED: ClassVar[dict[str, type[Record]]] = {}

    def __getitem__(self, key: str):
        if key in self._names():
            return vars(self)[key]
        raise KeyError(key)

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def to_dict(self) -> dict:
        return {name: _plain(value) for name, value in vars(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping):
        values = {}
        for name in cls._names():
            if name not in data:
                continue  # written before the field existed: its default
            value = data[name]
            nested = cls.NESTED.get(name)
            if nested is not None and value is not None:
                value = [nested.from_dict(v) for v in value] if isinstance(value, list) else nested.from_dict(value)
            values[name] = value
        return cls(**values)


def load_json(path, schemas: tuple[str, ...], what: str) -> dict:
    """The JSON object a saved result holds, checked to be of one of `schemas` (one sentence when it is not)."""
    try:
        data = parse_json(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"{what[0].upper()}{what[1:]} {path} cannot be read ({exc}).") from None
    if not isinstance(data, dict) or data.get("schema") not in schemas:
        found = data.get("schema") if isinstance(data, dict) else None
        raise UserError(f"{path} is not a dflash {what} (schema {found!r}).")
    return data


def _plain(value):
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def merge_pieces(pieces: list) -> list[list[str]]:
    """Adjacent pieces of one origin joined: [["Hel", "draft"], ["lo", "target"]]."""
    merged: list[list[str]] = []
    for text, origin in pieces:
        if not text:
            continue
        if merged and merged[-1][1] == origin:
            merged[-1][0] += text
        else:
            merged.append([text, origin])
    return merged


@dataclass
class Run:
    """One generation, as the engine's Summary measured it (plus its text split by origin)."""

    token_ids: list[int]
    text: str
    pieces: list[list[str]]
    acceptance_lengths: Optional[list[int]]  # None: unknown (a server that does not report its steps)
    generated_tokens: int
    decode_s: float
    decode_tokens_per_s: float
    ttft_s: float
    peak_memory_bytes: Optional[int]  # None: unknown
    peak_memory_kind: Optional[str]
    finish_reason: Optional[str]
    prompt_ids: list[int] = field(default_factory=list)
    # what a server that speculates on its own reported in place of steps (vLLM, llama.cpp, SGLang): its tau and
    # block size; None where unknown or where the steps themselves are known
    server_tau: Optional[float] = None
    server_block_size: Optional[int] = None


def run(engine, request: GenerationRequest) -> Run:
    """Generate `request` to its end on `engine`; the run record."""
    pieces = []
    for event in engine.generate(request):
        pieces += event.pieces
    s = engine.last_summary
    return Run(token_ids=list(s.token_ids), text=s.text, pieces=merge_pieces(pieces),
               acceptance_lengths=None if s.acceptance_lengths is None else list(s.acceptance_lengths),
               generated_tokens=s.generated_tokens,
               decode_s=s.decode_s, decode_tokens_per_s=s.decode_tokens_per_s, ttft_s=s.ttft_s,
               peak_memory_bytes=s.peak_memory_bytes, peak_memory_kind=s.peak_memory_kind,
               finish_reason=s.finish_reason, prompt_ids=list(request.prompt_ids or []),
               server_tau=s.mean_acceptance_length if s.acceptance_lengths is None else None,
               server_block_size=s.block_size if s.acceptance_lengths is None else None)


def decode_rate(runs: list) -> float:
    """Decode tokens per second over runs: (tokens - 1 per run) / their decode seconds."""
    decode_s = sum(r.decode_s for r in runs)
    counted = sum(max(r.generated_tokens - 1, 0) for r in runs)
    return counted / decode_s if decode_s > 0 else 0.0


def mean_ttft(runs: list) -> float:
    return sum(r.ttft_s for r in runs) / len(runs) if runs else 0.0


def check_repeats(repeats: int) -> int:
    if repeats < 1:
        raise UserError(f"The number of runs per block size must be at least 1, not {repeats}; 3 or more shows how "
                        "much the speed varies between runs.")
    return repeats


def best_pass(passes: list[list]) -> list:
    """The fastest of several passes over the same prompts (highest decode rate; the first of equals)."""
    return max(passes, key=decode_rate)


def spread(row) -> Optional[float]:
    """Fastest minus slowest pass of a row, in decode tokens per second; None with fewer than two passes."""
    rates = row["repeat_rates"]
    return max(rates) - min(rates) if len(rates) >= 2 else None


def same_ids(runs: list, reference: list) -> bool:
    """Every run produced the ids of the reference run in the same place."""
    return all(a.token_ids == b.token_ids for a, b in zip(runs, reference))


@dataclass(eq=False)
class Totals(Record):
    """The runs of one block size, added up."""

    block_size: int = 0
    generated_tokens: int = 0
    # steps, tau and histogram are None (unknown) when a run's engine did not report its steps (a remote
    # server other than `dflash serve`); peak memory when none did
    steps: Optional[int] = 0  # verify steps (the prefill token is not a step)
    tau: Optional[float] = 0.0  # mean acceptance length
    histogram: Optional[list[int]] = field(default_factory=list)  # steps with acceptance length 1..block_size
    decode_tokens_per_s: float = 0.0
    speedup: Optional[float] = None  # vs block 1 on the same engine
    ttft_s: float = 0.0  # mean time to first token
    peak_memory_bytes: Optional[int] = 0
    peak_memory_kind: Optional[str] = "device"  # or "process-lifetime-rss"
    repeats: int = 1  # passes over the prompts after the warm-up; the fields above are the fastest one's
    repeat_rates: list[float] = field(default_factory=list)  # every pass's decode tokens per second

    @classmethod
    def of(cls, block_size: int, passes: list[list[Run]], **more):
        """The row of the fastest of `passes` (each one pass over the same prompts)."""
        runs = best_pass(passes)
        known = all(r.acceptance_lengths is not None for r in runs)
        lengths = [n for r in runs for n in r.acceptance_lengths or []]
        peaks = [r for r in runs if r.peak_memory_bytes is not None]
        steps: Optional[int] = len(lengths) if known else None
        tau: Optional[float] = (sum(lengths) / len(lengths) if lengths else 0.0) if known else None
        if not known and runs and all(r.server_tau for r in runs):
            # a server that speculates on its own: its steps, from each request's tau (steps = tokens / tau)
            counted = sum(max(r.generated_tokens - 1, 0) for r in runs)
            steps = round(sum(max(r.generated_tokens - 1, 0) / r.server_tau for r in runs))
            tau = counted / steps if steps else None
            served = {r.server_block_size for r in runs}
            if len(served) == 1 and None not in served:
                block_size = served.pop()
        return cls(block_size=block_size, generated_tokens=sum(r.generated_tokens for r in runs),
                   steps=steps, tau=tau,
                   histogram=acceptance_histogram(lengths, block_size) if known else None,
                   decode_tokens_per_s=decode_rate(runs), ttft_s=mean_ttft(runs),
                   peak_memory_bytes=max((r.peak_memory_bytes for r in peaks), default=0 if not runs else None),
                   peak_memory_kind=(peaks[0].peak_memory_kind if peaks else None) if runs else "device",
                   repeats=len(passes), repeat_rates=[decode_rate(p) for p in passes], **more)


def add_speedups(rows: Sequence[Totals], block_1: bool = False) -> None:
    """Each row's speedup over the block 1 row (`block_1`: the block 1 row itself says 1.0 even with no rate)."""
    base = next((r.decode_tokens_per_s for r in rows if r.block_size == 1), None)
    for row in rows:
        if block_1 and row.block_size == 1:
            row.speedup = 1.0
        elif base:
            row.speedup = row.decode_tokens_per_s / base


class Counter:
    """Progress over `total` runs: `tick(label)` reports (done, total, label) before each run. `check` runs
    first (the replay's cancel)."""

    def __init__(self, total: int, progress: Optional[ProgressFn] = None, check: Optional[Callable[[], None]] = None):
        self.total, self.progress, self.check = total, progress, check
        self.done = 0

    def tick(self, label: str) -> None:
        if self.check:
            self.check()
        if self.progress:
            self.progress(self.done, self.total, label)
        self.done += 1

    def end(self, label: str) -> None:
        if self.progress:
            self.progress(self.total, self.total, label)
