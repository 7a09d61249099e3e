"""What every engine shares: the `EngineLike` protocol front ends program against, and `Engine`, the
base of the framework engines (loading checks, the request -> events driver, the Summary).

A framework engine implements `_decode`, a generator of `RawStep`s (ids and timings only). The
driver here turns them into `StepEvent`s (text pieces by origin, ghosts), enforces stop ids and
cancellation between steps, and builds the `Summary`. The contract is docs/engine-contract.md.
"""

from __future__ import annotations

import gc
import importlib
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Optional, Protocol, Union, runtime_checkable

from dflash_tui.engines import hub, reasoning
from dflash_tui.engines.baseline import BaselineRun, Margin
from dflash_tui.engines.checkpoints import DraftInfo, TargetInfo, check_block_size, validate_pair
from dflash_tui.engines.config import EngineConfig, GenerationRequest
from dflash_tui.engines.detokenize import StreamingDetokenizer
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.events import StepEvent, Summary, TopLogprob, acceptance_histogram
from dflash_tui.engines.guided import Grammars, Guide
from dflash_tui.engines.probe import Block1Probe, Block1Step, time_block1
from dflash_tui.engines.prompting import check_context, load_tokenizer, prompt_ids
from dflash_tui.engines.sampling import SamplingParams, resolve_sampling


@dataclass
class RawStep:
    drafted: list[int]
    accepted: int
    emitted: list[int]
    draft_s: float
    verify_s: float
    prefill: bool = False
    reused: int = 0  # prefill step: prompt tokens taken from the kept caches (not prefilled again)
    logprobs: Optional[list[float]] = None  # per emitted id, when the request asks (raw log-probabilities)
    top_logprobs: Optional[list[list[TopLogprob]]] = None  # per emitted id: [[id, logprob], ...] (top_logprobs of them)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def assistant_header(tokenizer) -> list[int]:
    """The ids a chat template puts before an answer, thinking on or off (for Qwen3:
    `<|im_start|>assistant\n`), found by rendering one message three ways; [] when it cannot tell.
    Hybrid targets prefill in two chunks split right after the last such header (a snapshot point the
    next turn's re-rendered history still shares)."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    messages = [{"role": "user", "content": "x"}]

    def render(generation: bool, thinking: bool) -> list[int]:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=True,
                                            enable_thinking=thinking, return_dict=False)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    try:
        bare, on, off = render(False, True), render(True, True), render(True, False)
    except Exception:  # noqa: BLE001 - a template that cannot render this is simply not split
        return []
    if on[: len(bare)] != bare or off[: len(bare)] != bare:
        return []
    return on[len(bare): len(bare) + common_prefix(on[len(bare):], off[len(bare):])]


def split_after_header(ids: list[int], header: list[int]) -> Optional[int]:
    """The position just after the last occurrence of `header` in `ids` (None if absent)."""
    n = len(header)
    if not n:
        return None
    for end in range(len(ids), n - 1, -1):
        if ids[end - n: end] == header:
            return end
    return None


def process_peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def free_memory() -> None:
    """Give back what an unloaded engine held: Python objects, and the CUDA allocator's cached blocks."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class TargetLike(Protocol):
    """What a front end reads of an engine's target: `TargetInfo` here, a remote engine's `RemoteTarget`."""

    @property
    def path(self) -> Union[str, Path]: ...  # a folder here; the server's path or model id for a remote engine

    @property
    def max_positions(self) -> Optional[int]: ...  # the context size, None when unknown

    @property
    def vocab_size(self) -> Optional[int]: ...  # the target's embedding rows, None where a server does not say


class DraftLike(Protocol):
    """What a front end reads of an engine's draft: `DraftInfo` here, a remote engine's `RemoteDraft`."""

    @property
    def path(self) -> Union[str, Path]: ...

    @property
    def arch(self) -> Optional[str]: ...  # 'dflash' or 'dflash2' as its config declares; None where a server does not say


@runtime_checkable
class EngineLike(Protocol):
    """What a front end may use of an engine: `Engine` here, `ProcessEngine` (engines/process.py) and
    any engine served elsewhere satisfy it. Everything a front end reads is listed; nothing else."""

    name: str  # "cuda", "mlx" or "remote"
    device: str
    dtype: str
    config: EngineConfig
    block_size: int  # the default block size (the draft's trained one unless configured)
    warnings: list[str]  # notes from loading, one sentence each
    generation_config: dict  # the target's generation_config.json (sampling defaults)
    tokenizer: Any  # the target's (transformers); None for a remote engine that has none here (the server tokenizes)
    last_summary: Optional[Summary]  # set when a generation's stream ends

    @property
    def target_info(self) -> TargetLike: ...

    @property
    def draft_info(self) -> Optional[DraftLike]: ...  # None: the target runs alone (block size 1)

    @property
    def trained_block_size(self) -> Optional[int]: ...

    @property
    def reports_steps(self) -> bool: ...  # False: the events are a server's text chunks, not verify steps

    def prepare(self, request: GenerationRequest) -> list[int]: ...

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]: ...

    def decode(self, ids) -> str: ...

    def stop_ids(self) -> list[int]: ...

    @property
    def baseline_name(self) -> str: ...

    def baseline_generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> BaselineRun: ...

    def top2_margin(self, ids: list[int]) -> Margin: ...

    def measure_block1(self, steps: int = 4) -> Optional[Block1Probe]: ...

    def new_context(self) -> None: ...  # forget the caches kept from earlier requests

    def prepare_steps(self, block_size: int) -> bool: ...  # between requests: what a request at block_size needs

    def close(self) -> None: ...

    def kill(self) -> None: ...  # stop at once, for a process that must exit now (close waits)


Progress = Callable[[str], None]  # a stage of loading or capturing, said as it starts ("loading the target")


def _quiet(_stage: str) -> None:
    """No front end is listening."""


class Engine:
    """Base of the CUDA and MLX engines. Subclasses set name/device/dtype and implement `_decode`."""

    name = "?"
    reports_steps = True  # every event is a verify step

    def __init__(self, config: EngineConfig, progress: Optional[Progress] = None):
        self.config = config
        self.progress: Progress = progress or _quiet  # what loading is doing, for a front end to show
        self.warnings: list[str] = []
        hub.require_cached({"target": config.target, "draft": config.draft})  # offline: one sentence for both
        self.target_info = TargetInfo.read(config.target)
        self.check_target(self.target_info)  # before the tokenizer: an unknown type never reaches a loader
        self.draft_info: Optional[DraftInfo] = None
        if config.draft:
            self.draft_info = DraftInfo.read(config.draft)
            validate_pair(self.target_info, self.draft_info, config.target_layer_ids, config.source)
        self.block_size = config.block_size if config.block_size is not None else (
            self.draft_info.block_size if self.draft_info else 1)
        self.warnings += check_block_size(self.block_size, self.trained_block_size, self.draft_info is not None)
        if config.draft_window is not None and config.draft_window < 1:
            raise UserError(f"Draft window {config.draft_window} in {config.source} must be a positive number of positions.")
        self.generation_config = self.target_info.generation_config()
        self.tokenizer = load_tokenizer(self.target_info.path)
        self.last_summary: Optional[Summary] = None
        self._grammars: Optional[Grammars] = None  # compiled constraints, made at the first constrained request
        self.device = "?"
        self.dtype = "?"

    @property
    def trained_block_size(self) -> Optional[int]:
        return self.draft_info.block_size if self.draft_info else None

    def decode(self, ids) -> str:
        """Text for ids as a person reads it (special tokens such as eos are not shown)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def stop_ids(self) -> list[int]:
        return reasoning.stop_ids(self.tokenizer, self.target_info.stop_ids())

    def close(self) -> None:
        """Nothing to stop in this process; the weights go with the last reference."""

    def kill(self) -> None:
        """Nothing runs apart from this process: its exit ends the engine."""

    def new_context(self) -> None:
        """Forget the caches kept from earlier requests: the next one prefills its whole prompt."""
        self._forget_turns()

    def prepare_steps(self, block_size: int) -> bool:
        """Make ready, between requests, what a request at `block_size` will need, so that sending it does
        not wait for it (the cuda engine's graph captures); True when something was done. Doing it drops
        the caches a chat kept, as doing it at the start of that request would."""
        return False

    def measure_block1(self, steps: int = 4) -> Optional[Block1Probe]:
        """The cost of one block-1 step at the kept context, measured on top of the kept caches and rolled
        back (docs/engine-contract.md, "The block-1 probe"); None when no context is kept."""
        if steps < 1:
            raise ValueError(f"the block-1 probe needs at least one timed step, not {steps}")
        step = self._block1_step()
        if step is None:
            return None
        try:
            return time_block1(step, steps)
        except BaseException:
            self._forget_turns()  # an interrupted probe leaves nothing to reuse, as an interrupted step does
            raise

    # -- baselines, from the framework's `baseline` module (engines/baseline.py) -----------------
    def _baseline(self):
        return importlib.import_module(f"{__package__}.{self.name}.baseline")

    @property
    def baseline_name(self) -> str:
        return self._baseline().NAME

    def baseline_generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> BaselineRun:
        """The target alone through the framework's own generation loop."""
        return self._baseline().generate(self, prompt_ids, max_new_tokens, temperature)

    def top2_margin(self, ids: list[int]) -> Margin:
        """The target's next-token margin after `ids`; unknown (not an error) if it cannot be computed."""
        try:
            return self._baseline().top2_margin(self, ids)
        except Exception:  # noqa: BLE001 - a margin is a diagnostic; never fail the caller for it
            return Margin()

    # -- implemented by each engine -------------------------------------------------------------
    @classmethod
    def check_target(cls, info: TargetInfo) -> None:
        """Refuse a target family this engine does not run (one sentence), before anything loads."""

    def _decode(self, prompt_ids: list[int], block_size: int, sampling: SamplingParams,
                max_new_tokens: int, reuse: bool = False, split: Optional[int] = None,
                guide: Optional[Guide] = None) -> Generator[RawStep, None, None]:
        """RawSteps for one request. With `reuse`, start from the caches the previous request left (their
        longest prefix shared with `prompt_ids`); `split` is where a hybrid target's prefill is cut
        (right after the assistant header) and snapshotted. Either way the caches are kept afterwards.
        `guide`: a constrained request's grammar walk (engines/guided.py)."""
        raise NotImplementedError

    def _forget_turns(self) -> None:
        """Drop what the last request left in the caches (the engine's `new_context`)."""

    def _block1_step(self) -> Optional[Block1Step]:
        """A single-token target step over the kept caches and its exact undo; None when none are kept."""
        return None

    def _split(self, ids: list[int]) -> Optional[int]:
        if not hasattr(self, "_header"):
            self._header = assistant_header(self.tokenizer)
        return split_after_header(ids, self._header)

    def _reset_peak_memory(self) -> None:
        pass

    def _peak_memory(self) -> tuple[int, str]:
        return process_peak_rss(), "process-lifetime-rss"

    # -- the shared driver ----------------------------------------------------------------------
    def prepare(self, request: GenerationRequest) -> list[int]:
        """The prompt ids a request stands for (chat template applied unless raw)."""
        return prompt_ids(self.tokenizer, request)

    def acceptance_rule(self, sampling) -> str:
        """How drafted tokens are kept (docs/engine-contract.md, "Version 3"): the target's greedy ids at
        T = 0; at T > 0 exact rejection sampling with a DFlash 2 draft (its proposals carry q), else exact
        match against the target's own samples."""
        if sampling.greedy:
            return "greedy"
        return "rejection" if self.draft_info is not None and self.draft_info.arch == "dflash2" else "exact-match"

    def generate(self, request: GenerationRequest) -> Generator[StepEvent, None, None]:
        ids = self.prepare(request)
        rows = self.target_info.vocab_size
        bad = next((i for i in ids if not isinstance(i, int) or not 0 <= i < rows), None)
        if bad is not None:  # a tampered replay or a hand-written request: never an index error mid-forward
            raise UserError(f"Prompt token id {bad!r} is outside the target's {rows} embedding rows; the ids do not "
                            "belong to this target (a session recorded with another model?).")
        bias = next((i for i in (request.logit_bias or {}) if i >= rows), None)
        if bias is not None:
            raise UserError(f"logit_bias names token id {bias}, outside the target's {rows} embedding rows.")
        max_positions = self.target_info.max_positions
        check_context(len(ids), max_positions)
        block_size = request.block_size if request.block_size is not None else self.block_size
        check_block_size(block_size, self.trained_block_size, self.draft_info is not None)
        sampling = resolve_sampling(request, self.generation_config)
        stops = set(request.stop_ids if request.stop_ids is not None else self.stop_ids())
        max_new, limit = request.max_new_tokens, "tokens"
        if max_positions and max_positions - len(ids) < max_new:
            max_new, limit = max_positions - len(ids), "context"  # the answer can only fill the window
        guide = self._guide(request, stops) if request.constraint is not None else None
        return self._drive(ids, block_size, sampling, max_new, stops, request, limit, guide)

    def _guide(self, request: GenerationRequest, stops: set[int]) -> Guide:
        """The request's constraint compiled for this target (one sentence naming it when it cannot be), starting
        after the reasoning when the request thinks (engines/guided.py)."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, self.target_info.vocab_size)
        constraint = request.constraint
        assert constraint is not None
        marker = reasoning.answer_marker(self.tokenizer, request) if constraint.after_reasoning else None
        return self._grammars.guide(constraint, sorted(stops), marker)

    def _drive(self, ids, block_size, sampling, max_new, stops, request, limit: str,
               guide: Optional[Guide] = None) -> Generator[StepEvent, None, None]:
        self.last_summary = None
        self._reset_peak_memory()
        detok = StreamingDetokenizer(self.decode, ids)
        out_ids: list[int] = []
        lengths: list[int] = []
        draft_s = verify_s = ttft = 0.0
        finish = "length"
        started = time.perf_counter()
        decode_started = started
        loop_s = 0.0
        reused = 0
        steps = self._decode(ids, block_size, sampling, max_new, reuse=request.reuse_cache, split=self._split(ids),
                             guide=guide)
        try:
            resumed = started  # when the consumer last gave the thread back: its time between events is not the step's
            for raw in steps:
                emitted = raw.emitted
                hit = next((i for i, t in enumerate(emitted) if t in stops), None)
                if hit is not None:
                    emitted = emitted[: hit + 1]
                origins = ["draft"] * min(raw.accepted, len(emitted))
                origins += ["target"] * (len(emitted) - len(origins))
                rejected = raw.drafted[raw.accepted:]
                pieces = detok.add_tokens(emitted, origins)
                out_ids += emitted
                step_logprobs = raw.logprobs[: len(emitted)] if raw.logprobs is not None else None
                step_tops = raw.top_logprobs[: len(emitted)] if raw.top_logprobs is not None else None
                if raw.prefill:
                    reused = raw.reused
                    ttft = time.perf_counter() - started
                    decode_started = time.perf_counter()
                else:
                    lengths.append(raw.accepted + 1)
                    draft_s += raw.draft_s
                    verify_s += raw.verify_s
                done = hit is not None or len(out_ids) >= max_new
                if done:
                    finish = "stop" if hit is not None else "length"
                    tail = detok.flush()
                    if tail:
                        pieces.append((tail, origins[-1]))
                step_loop = 0.0 if raw.prefill else max(0.0, time.perf_counter() - resumed - raw.draft_s - raw.verify_s)
                loop_s += step_loop
                event = StepEvent(
                    drafted=raw.drafted, accepted=raw.accepted, emitted=emitted, pieces=pieces,
                    rejected=rejected, rejected_text=detok.peek(rejected) if rejected else "",
                    draft_s=raw.draft_s, verify_s=raw.verify_s, loop_s=step_loop,
                    finish_reason=finish if done else None, is_prefill=raw.prefill,
                    logprobs=step_logprobs, top_logprobs=step_tops,
                )
                if not done and request.cancel.is_set():
                    finish, event.finish_reason, done = "cancelled", "cancelled", True
                yield event
                resumed = time.perf_counter()
                if done:
                    break
        finally:
            steps.close()
        decode_s = time.perf_counter() - decode_started
        peak, kind = self._peak_memory()
        self.last_summary = Summary(
            prompt_tokens=len(ids), generated_tokens=len(out_ids), token_ids=out_ids, text=detok.text,
            ttft_s=ttft, decode_s=decode_s,
            decode_tokens_per_s=(len(out_ids) - 1) / decode_s if len(out_ids) > 1 and decode_s > 0 else 0.0,
            acceptance_lengths=lengths,
            mean_acceptance_length=sum(lengths) / len(lengths) if lengths else 0.0,
            histogram=acceptance_histogram(lengths, block_size), draft_s=draft_s, verify_s=verify_s,
            peak_memory_bytes=peak, peak_memory_kind=kind, block_size=block_size,
            engine=self.name, device=self.device, dtype=self.dtype, finish_reason=finish,
            reused_prompt_tokens=reused, prefilled_prompt_tokens=len(ids) - reused if out_ids else 0,
            limit=limit if finish == "length" else None, acceptance_rule=self.acceptance_rule(sampling),
            grammar_s=guide.seconds if guide is not None else None, loop_s=loop_s,
        )
