"""The OpenAI request and response shapes `dflash serve` speaks: validation (OpenAI-style 4xx errors)
and the JSON of chunks and responses, with the DFlash step data as an extension field."""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from dflash_tui.engines.config import EFFORTS, MAX_BLOCK_SIZE, MAX_SEED, MAX_TOP_LOGPROBS, Sampling
from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.guided import Constraint
from dflash_tui.engines.remote.wire import EXTENSION
from dflash_tui.engines.text import finite_number

from .structured import GUIDED, request_constraint


class ApiError(Exception):
    """An OpenAI-style error: status, message, type, param, code."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error", headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _bad(message: str, param: Optional[str] = None, code: Optional[str] = None) -> ApiError:
    return ApiError(400, message, param, code)


def _int(body: dict, key: str, low: Optional[int] = None) -> Optional[int]:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{key}' must be an integer, not {value!r}.", key)
    if low is not None and value < low:
        raise _bad(f"'{key}' must be at least {low}; got {value}.", key)
    return value


def _float(body: dict, key: str, low: float, high: float, low_open: bool = False) -> Optional[float]:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{key}' must be a number, not {value!r}.", key)
    if not finite_number(value):  # NaN, Infinity, or 1e400 (read as infinity): no comparison refuses them
        raise _bad(f"'{key}' must be a finite number; got {str(value)[:40]}.", key)
    if value < low or value > high or (low_open and value == low):
        raise _bad(f"'{key}' must be {'above' if low_open else 'at least'} {low:g} and at most {high:g}; got {value}.", key)
    return float(value)


def _text_content(content: Any, where: str, required: bool = True) -> Optional[str]:
    if isinstance(content, str):
        return content
    if content is None:
        if required:
            raise _bad(f"{where} has no 'content'; send its text.", "messages")
        return None
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"{where}.content[{j}] is of type {kind!r}: only text content parts are supported "
                           "(this server runs a text-only model).", "messages")
        return "".join(parts)
    raise _bad(f"{where}: 'content' must be a string or a list of text parts.", "messages")


def _unsupported(field_name: str, why: str = "") -> ApiError:
    return _bad(f"'{field_name}' is not supported by dflash serve{why}; leave it out.", field_name,
                "unsupported_parameter")


def refuse_unsupported(body: dict, chat: bool) -> None:
    """A 400 naming the field for every request field this server would otherwise have to ignore (a
    client then knows at once instead of getting plain text where it asked for structure)."""
    if body.get("best_of") not in (None, 1):
        raise _unsupported("best_of", " (one engine, one answer per request)")
    if body.get("echo"):
        raise _unsupported("echo")
    if body.get("suffix"):
        raise _unsupported("suffix")
    if body.get("prompt_logprobs") is not None:
        raise _unsupported("prompt_logprobs", " (the logprobs of the generated tokens are: 'logprobs')")
    if body.get("min_tokens") not in (None, 0):
        raise _unsupported("min_tokens")
    for key in ("functions", "function_call"):
        if body.get(key) is not None:
            raise _unsupported(key, " (the legacy form: send 'tools' and 'tool_choice')")
    if not chat:
        for key in ("tools", "tool_choice", "reasoning_effort"):
            if body.get(key) is not None:
                raise _unsupported(key, " on /v1/completions (use /v1/chat/completions)")


@dataclass
class Params(Sampling):
    """A validated request (its temperature, top_p, top_k and min_p: `Sampling`'s, None where it sends none)."""

    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: Optional[int] = None
    max_tokens_key: str = "max_tokens"
    seed: Optional[int] = None  # None: a fresh random seed for this request (vLLM's default)
    stop: list[str] = field(default_factory=list)
    thinking: Optional[bool] = None
    reasoning_effort: Optional[str] = None  # low, medium or high: only for a template that reads it (gpt-oss)
    separate_reasoning: Optional[bool] = None
    return_token_ids: bool = False
    extension: bool = False  # the request carried the dflash object: send the summary chunk
    block_size: Optional[int] = None
    stop_ids: Optional[list[int]] = None  # the extension's: every stop id (replaces the eos ids)
    stop_token_ids: list[int] = field(default_factory=list)  # OpenAI/vLLM's: added to the eos ids
    ignore_eos: bool = False
    draft_window: Optional[int] = None
    clamp_max_tokens: bool = False
    reuse_cache: Optional[bool] = None  # the extension's: None takes the server's --prefix-reuse
    tools: Optional[list[dict]] = None
    tool_choice: Any = None  # None, "auto", "none", "required" or {"type": "function", "function": {"name"}}
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    logit_bias: Optional[dict] = None  # {token id: bias}
    logprobs: bool = False  # return each generated token's log-probability
    top_logprobs: int = 0  # and this many of the most likely alternatives at its position
    messages: Optional[list[dict]] = None
    prompt: Any = None  # text or token ids (/v1/completions)
    constraint: Optional[Constraint] = None  # response_format, structured_outputs or guided_* (serve/structured.py)


def parse(body: Any, names: list[str], chat: bool) -> Params:
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
    refuse_unsupported(body, chat)
    model = body.get("model")
    if model is None:
        model = names[0]
    elif not isinstance(model, str) or model not in names:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves {', '.join(names)}.", "model",
                       "model_not_found", "NotFoundError")
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise _bad("Only n=1 is supported (one engine, one answer per request).", "n")
    p = Params(model=model)
    p.stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.", "stream_options")
    if options and not p.stream:  # vLLM's rule, and its words
        raise _bad("Stream options can only be defined when `stream=True`.", "stream_options")
    p.include_usage = bool(options.get("include_usage", False))
    max_tokens = _int(body, "max_completion_tokens") if body.get("max_completion_tokens") is not None \
        else _int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        raise _bad(f"'{key}' must be at least 1; got {max_tokens}.", key)
    p.max_tokens = max_tokens
    if body.get("max_completion_tokens") is not None:
        p.max_tokens_key = "max_completion_tokens"
    p.temperature = _float(body, "temperature", 0.0, 100.0)
    p.top_p = _float(body, "top_p", 0.0, 1.0, low_open=True)
    p.min_p = _float(body, "min_p", 0.0, 1.0)
    top_k = _int(body, "top_k")
    if top_k is not None and top_k < -1:
        raise _bad(f"'top_k' must be -1 or 0 (off) or a positive number of tokens; got {top_k}.", "top_k")
    p.top_k = None if top_k is None or top_k <= 0 else top_k  # vLLM: -1 or 0 means off
    p.seed = _int(body, "seed", 0)
    if p.seed is not None and p.seed >= MAX_SEED:
        raise _bad(f"'seed' must be below 2**63; got {p.seed}.", "seed")
    p.presence_penalty = _float(body, "presence_penalty", -2.0, 2.0)
    p.frequency_penalty = _float(body, "frequency_penalty", -2.0, 2.0)
    p.repetition_penalty = _float(body, "repetition_penalty", 0.0, 100.0, low_open=True)
    p.logit_bias = _logit_bias(body.get("logit_bias"))
    p.logprobs, p.top_logprobs = _logprobs(body, chat)
    stop = body.get("stop")
    if isinstance(stop, str):
        p.stop = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        p.stop = [s for s in stop if s]
    elif stop is not None:
        raise _bad("'stop' must be a string or a list of strings.", "stop")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _bad("'chat_template_kwargs' must be an object.", "chat_template_kwargs")
    thinking = kwargs.get("enable_thinking", kwargs.get("thinking"))
    if thinking is not None and not isinstance(thinking, bool):
        raise _bad("'chat_template_kwargs.enable_thinking' must be true or false.", "chat_template_kwargs")
    p.thinking = thinking
    effort = body.get("reasoning_effort", kwargs.get("reasoning_effort"))
    if effort is not None and effort not in EFFORTS:
        raise _bad(f"'reasoning_effort' must be one of {', '.join(EFFORTS)}; got {effort!r}.", "reasoning_effort")
    p.reasoning_effort = effort
    if body.get("separate_reasoning") is not None:
        p.separate_reasoning = bool(body["separate_reasoning"])
    p.return_token_ids = bool(body.get("return_token_ids", False))
    ext = body.get(EXTENSION) or {}
    if not isinstance(ext, dict):
        raise _bad(f"'{EXTENSION}' must be an object.", EXTENSION)
    p.extension = EXTENSION in body
    p.block_size = _int(ext, "block_size", 1)
    if p.block_size is not None and p.block_size > MAX_BLOCK_SIZE:
        raise _bad(f"'{EXTENSION}.block_size' must be from 1 to {MAX_BLOCK_SIZE}; got {str(p.block_size)[:40]}.",
                   EXTENSION)
    p.draft_window = _int(ext, "draft_window", 1)
    p.clamp_max_tokens = bool(ext.get("clamp_max_tokens", False))
    if ext.get("reuse_cache") is not None:
        p.reuse_cache = bool(ext["reuse_cache"])
    p.stop_ids = _ids(ext.get("stop_ids"), "stop_ids", EXTENSION)
    p.stop_token_ids = _ids(body.get("stop_token_ids"), "stop_token_ids", "stop_token_ids") or []
    p.ignore_eos = bool(body.get("ignore_eos", False))
    try:
        p.constraint = request_constraint(body)
    except UserError as e:
        field = next((k for k in ("response_format", "structured_outputs", *GUIDED) if body.get(k) is not None), None)
        raise _bad(str(e), field) from None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list of {role, content} objects.", "messages")
        p.messages = [_message(m, i) for i, m in enumerate(messages)]
        tools_ = body.get("tools")
        if tools_ is not None:
            p.tools = check_tools(tools_)
        p.tool_choice = check_tool_choice(body.get("tool_choice"), p.tools)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if not prompt:
                raise _bad("'prompt' is empty.", "prompt")
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            pass
        else:
            raise _bad("'prompt' must be one string or one list of token ids (batches are not supported).", "prompt")
        p.prompt = prompt
    return p


def _logit_bias(value: Any) -> Optional[dict]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} -> {id: bias} (ids checked against the
    vocabulary with the request)."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise _bad("'logit_bias' must be an object mapping token ids to biases from -100 to 100.", "logit_bias")
    out = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise _bad(f"'logit_bias' key {key!r} is not a token id.", "logit_bias") from None
        if token < 0 or str(token) != str(key).strip():
            raise _bad(f"'logit_bias' key {key!r} is not a token id.", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise _bad(f"'logit_bias' value for {key} must be a number from -100 to 100; got {bias!r}.", "logit_bias")
        out[token] = float(bias)
    return out


def _logprobs(body: dict, chat: bool) -> tuple[bool, int]:
    """(logprobs wanted, top alternatives per token). Chat: `logprobs` true and `top_logprobs` 0..20;
    completions: `logprobs` an integer 0..20 (the alternatives; 0 gives the chosen tokens' only)."""
    value = body.get("logprobs")
    if chat:
        if value is not None and not isinstance(value, bool):
            raise _bad(f"'logprobs' must be true or false; got {value!r}.", "logprobs")
        top = _int(body, "top_logprobs", 0)
        if top is not None and top > MAX_TOP_LOGPROBS:
            raise _bad(f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}; got {top}.", "top_logprobs")
        if top and not value:
            raise _bad("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
        return bool(value), top or 0
    if value is None or value is False:
        return False, 0
    if value is True:
        value = 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise _bad(f"'logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS} on /v1/completions; got {value!r}.",
                   "logprobs")
    return True, value


def _ids(value: Any, name: str, param: str) -> Optional[list[int]]:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise _bad(f"'{name}' must be a list of token ids.", param)
    return list(value)


def _message(m: Any, i: int) -> dict:
    """One chat message, checked: roles, content (text only; an assistant message carrying tool_calls may
    have none), tool calls and tool results kept for the chat template."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer", "tool"):
        raise _bad(f"{where} needs a role of system, developer, user, assistant or tool.", "messages")
    role = "system" if m["role"] == "developer" else m["role"]
    calls = m.get("tool_calls") if role == "assistant" else None
    content = _text_content(m.get("content"), where, required=role != "assistant" or not calls)
    out: dict = {"role": role, "content": content if content is not None else ""}
    if calls:
        out["tool_calls"] = check_tool_calls(calls, where)
    if role == "tool":
        if m.get("tool_call_id") is not None:
            out["tool_call_id"] = str(m["tool_call_id"])
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
    return out


def check_tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of {type: function, function: {name, description, parameters}}.", "tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}] must be {{type: function, function: {{name, ...}}}}.", "tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema object.", "tools")
    return [{"type": "function", "function": t["function"]} for t in tools]


def check_tool_choice(choice: Any, tools: Optional[list[dict]]) -> Any:
    if choice is None:
        return None
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise _bad("tool_choice 'required' needs 'tools'.", "tool_choice")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and isinstance(choice.get("function"), dict) else None
    if not isinstance(name, str):
        raise _bad("'tool_choice' must be 'auto', 'none', 'required' or {type: function, function: {name}}.",
                   "tool_choice")
    if name not in [t["function"]["name"] for t in tools or []]:
        raise _bad(f"tool_choice names the function {name!r}, which is not among 'tools'.", "tool_choice")
    return {"type": "function", "function": {"name": name}}


def check_tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls must be a list.", "messages")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}.tool_calls[{j}] needs function.name.", "messages")
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):  # the API sends a JSON string; templates index it as an object
            try:
                arguments = parse_json(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise _bad(f"{where}.tool_calls[{j}].function.arguments is not valid JSON ({exc}).", "messages") \
                    from None
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


def refuse_effort() -> ApiError:
    """`reasoning_effort` for a model whose chat template does not read it (every family but gpt-oss)."""
    return _unsupported("reasoning_effort", " for this model: its chat template does not read it (thinking is on "
                        "or off here: chat_template_kwargs.enable_thinking)")


def fresh_seed() -> int:
    return secrets.randbelow(MAX_SEED)


# The request field a GenerationRequest's own refusal is about, by the words it names (engines/config.py).
_PARAM_WORDS = (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("min_p", "min_p"),
                ("seed", "seed"), ("max_new_tokens", "max_tokens"), ("block size", EXTENSION),
                ("draft window", EXTENSION), ("logit_bias", "logit_bias"), ("top_logprobs", "top_logprobs"),
                ("presence_penalty", "presence_penalty"), ("frequency_penalty", "frequency_penalty"),
                ("repetition_penalty", "repetition_penalty"), ("reasoning_effort", "reasoning_effort"))


def check_request(make, param: str = "messages") -> Any:
    """Build a GenerationRequest (or run a template); the engine's own checks (UserError) become 400s that
    name the field they are about: the one their sentence names, else `param` (what the call reads)."""
    try:
        return make()
    except UserError as exc:
        text = str(exc)
        said = text.lower()
        named = next((field for words, field in _PARAM_WORDS if words in said), param)
        raise _bad(text, named) from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(summary, prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's usage: completion_tokens counts the ids returned (a stop string's overrun is left out)."""
    out: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
    if summary is not None:
        if summary.reused_prompt_tokens is not None:
            out["prompt_tokens_details"] = {"cached_tokens": summary.reused_prompt_tokens}
        tau = summary.mean_acceptance_length
        out["mean_acceptance_length"] = None if tau is None else round(tau, 4)  # None: unknown
        out["decode_tokens_per_s"] = round(summary.decode_tokens_per_s, 2)
        out["ttft_s"] = round(summary.ttft_s, 4)
    return out


def now() -> int:
    return int(time.time())
