"""What to load (`EngineConfig`) and what to generate (`GenerationRequest`)."""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Optional, Union

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.guided import Constraint
from dflash_tui.engines.text import printable

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as ProcessEvent

ENGINES = ("auto", "cuda", "mlx", "remote")  # remote: an OpenAI-compatible server (engines/remote)
DTYPES = ("auto", "float32", "float16", "bfloat16")
MAX_BLOCK_SIZE = 64
BACKGROUND = "background"  # compile_steps / DFLASH_COMPILE: compiled in a thread after the first answer
MAX_SEED = 2**63  # seeds are 64-bit signed in torch and unsigned in MLX: [0, 2**63) fits both
MIN_TEMPERATURE = 1e-3  # below this, logits / temperature overflow to inf: use 0 (greedy) instead
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?|gpu|metal|mps")


EFFORTS = ("low", "medium", "high")  # reasoning_effort, for a chat template that reads it (gpt-oss's)
DEFAULT_EFFORT = "medium"  # gpt-oss's template when none is given


def check_effort(value, where: str = "") -> None:
    """A reasoning effort is low, medium or high (None: the template's own default)."""
    if value is not None and value not in EFFORTS:
        raise UserError(f"reasoning_effort {printable(repr(value))}{where} is not one of low, medium or high.")


def check_block_size_value(block_size, where: str) -> None:
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                   or not 1 <= block_size <= MAX_BLOCK_SIZE):
        raise UserError(f"Block size {block_size} {where} is out of range; choose a block size from 1 to {MAX_BLOCK_SIZE} "
                        "(1 = plain decoding).")


def _number(name: str, value, low: float, high: float, low_open: bool, high_open: bool, hint: str) -> None:
    """A finite number within bounds, or one sentence naming the setting and a value that works."""
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise UserError(f"{name} {value} is outside {lo}{low:g}, {high:g}{hi}; {hint}.")


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
    # CUDA engine on the CPU: decode steps compiled by inductor; True: at load, BACKGROUND: in a thread after the
    # first answer (engines/cuda/background.py), False: never; None: as DFLASH_COMPILE says (1, background, 0)
    compile_steps: Union[bool, str, None] = None
    max_new_tokens: Optional[int] = None  # the profile's answer length: load-time graph captures make room for it
    url: Optional[str] = None  # remote engine: the server's API root, http://HOST:PORT/v1
    model: Optional[str] = None  # remote engine: the served model (None: the first the server lists)
    api_key: Optional[str] = field(default=None, repr=False)  # remote engine (None: DFLASH_API_KEY)
    source: str = "command line"  # where these values came from, for error messages

    def __post_init__(self) -> None:
        """Every value checked before anything loads: bad input is one sentence, not a crash mid-load."""
        where = printable(f"in {self.source}")  # a profile's path: the user's own words
        if self.engine not in ENGINES:
            raise UserError(f"Engine {printable(repr(self.engine))} {where} is unknown; choose auto, cuda, mlx or remote.")
        if self.dtype not in DTYPES:
            raise UserError(f"dtype {printable(repr(self.dtype))} {where} is unknown; use auto, float32, float16 or bfloat16.")
        if not isinstance(self.device, str) or not DEVICE_PATTERN.fullmatch(self.device):
            raise UserError(f"Device {printable(repr(self.device))} {where} is not one dflash runs on; use auto, cpu, cuda, cuda:N "
                            "(the cuda engine) or gpu (the mlx engine).")
        check_block_size_value(self.block_size, where)
        if self.draft_window is not None and (isinstance(self.draft_window, bool) or not isinstance(self.draft_window, int)
                                              or self.draft_window < 1):
            raise UserError(f"Draft window {self.draft_window} {where} must be a positive number of positions.")


@dataclass(kw_only=True)
class Sampling:
    """The sampling settings, declared once: a request, a profile and a chat's settings carry them (keyword
    only, after their own fields). None takes the target's generation_config value; `off` is the value
    that leaves the setting out (engines/sampling.py resolves them)."""

    temperature: Optional[float] = field(default=None, metadata={"off": 0.0})  # 0: greedy
    top_p: Optional[float] = field(default=None, metadata={"off": 1.0})
    top_k: Optional[int] = field(default=None, metadata={"off": 0})
    min_p: Optional[float] = field(default=None, metadata={"off": 0.0})

    def sampling(self) -> dict:
        """The sampling values by name, to hand on: `GenerationRequest(**settings.sampling())`."""
        return {name: getattr(self, name) for name in SAMPLING_FIELDS}


SAMPLING_FIELDS = tuple(f.name for f in fields(Sampling))


@dataclass(kw_only=True)
class Penalties:
    """What a request may add to the target's logits at every verified position (OpenAI's and vLLM's
    fields), declared once like `Sampling`; `off` leaves each out. They are the request's own: no
    generation_config default, no profile key. Applied in vLLM's order to the raw logits, before
    temperature and truncation: `logit_bias` added, then the repetition penalty (a logit of a token seen in
    the prompt or the output so far is divided by it when positive, multiplied when not), then
    `frequency_penalty` x the token's count in the output so far and `presence_penalty` once if it occurs
    there, both subtracted. "So far" is that position's own prefix: inside a verified block, the drafted
    tokens before it count too (engines/cuda/loop.py, `Penalizer`)."""

    presence_penalty: Optional[float] = field(default=None, metadata={"off": 0.0})
    frequency_penalty: Optional[float] = field(default=None, metadata={"off": 0.0})
    repetition_penalty: Optional[float] = field(default=None, metadata={"off": 1.0})
    logit_bias: Optional[dict] = field(default=None, metadata={"off": {}})  # {token id: bias in [-100, 100]}

    def penalties(self) -> dict:
        return {name: getattr(self, name) for name in PENALTY_FIELDS}


PENALTY_FIELDS = tuple(f.name for f in fields(Penalties))
MAX_TOP_LOGPROBS = 20  # as vLLM and OpenAI's chat API allow


def check_penalties(request) -> None:
    """The penalty fields of a request, each in range, or one sentence naming it."""
    _number("presence_penalty", request.presence_penalty, -2.0, 2.0, False, False, "use 0 to disable it")
    _number("frequency_penalty", request.frequency_penalty, -2.0, 2.0, False, False, "use 0 to disable it")
    _number("repetition_penalty", request.repetition_penalty, 0.0, 100.0, True, False, "use 1 to disable it")
    bias = request.logit_bias
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise UserError("logit_bias must map token ids to biases between -100 and 100.")
    for key, value in bias.items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise UserError(f"logit_bias key {key!r} is not a token id; use non-negative integer ids.")
        _number(f"logit_bias[{key}]", value, -100.0, 100.0, False, False, "use a bias between -100 and 100")


@dataclass
class GenerationRequest(Sampling, Penalties):
    """One generation. Exactly one of `messages` (chat template applied), `prompt` (raw text, no
    template, no special tokens) or `prompt_ids` is given. Sampling fields left as None take the
    target's generation_config values."""

    messages: Optional[list[dict]] = None
    prompt: Optional[str] = None
    prompt_ids: Optional[list[int]] = None
    max_new_tokens: int = 256
    seed: int = 0
    block_size: Optional[int] = None  # overrides the engine's block size for this request
    thinking: bool = True
    reasoning_effort: Optional[str] = None  # low, medium or high for a template that reads it (gpt-oss); None: its default
    stop_ids: Optional[list[int]] = None  # None: every eos id of the target's generation_config
    reuse_cache: bool = False  # start from the caches the previous request left where its ids are a prefix
    # (a chat's turns: dflash_tui.core.conversation opts in); off, the whole prompt is prefilled, as bench,
    # replay and speed comparisons need
    logprobs: bool = False  # each emitted token's log-probability under the target's raw logits (StepEvent.logprobs)
    top_logprobs: int = 0  # with logprobs: the most likely ids and their log-probabilities, per emitted token
    constraint: Optional[Constraint] = None  # what the answer must match (engines/guided.py); None: free text
    # set to stop the generation; a ProcessEngine swaps in the event it shares with its child process
    cancel: Union[threading.Event, ProcessEvent] = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        """Sampling values checked where they are made, so a bad flag fails before any weight loads."""
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"max_new_tokens {n} must be a positive number of tokens.")
        if self.temperature is not None and self.temperature != 0:
            _number("Temperature", self.temperature, MIN_TEMPERATURE, 100.0, False, False,
                    "use 0 for greedy decoding, or a value such as 0.6 to sample")
        _number("top_p", self.top_p, 0.0, 1.0, True, False, "use 1 to disable it")
        _number("min_p", self.min_p, 0.0, 1.0, False, True, "use 0 to disable it")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0):
            raise UserError(f"top_k {self.top_k} must be 0 (off) or a positive number of tokens.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < MAX_SEED:
            raise UserError(f"Seed {self.seed} is outside 0 to 2**63 - 1; pick a smaller non-negative seed.")
        check_block_size_value(self.block_size, "in this request")
        check_effort(self.reasoning_effort)
        check_penalties(self)
        k = self.top_logprobs
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
            raise UserError(f"top_logprobs {k} is outside 0 to {MAX_TOP_LOGPROBS}.")


def request_takes(name: str):
    """Whether a request would take `value` for its field `name`: the one check a profile's and a session's
    recorded settings go through, so a value every request refuses is refused where it was written."""
    def ok(value) -> bool:
        try:
            GenerationRequest(prompt_ids=[], **{name: value})
        except (UserError, TypeError, ValueError, OverflowError):  # OverflowError: 10**400 for a float
            return False
        return True
    return ok
