"""The OpenAI request and response shapes `dflash serve` speaks: validation (OpenAI-style 4xx errors)
and the JSON of chunks and responses, with the DFlash step data as an extension field."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.remote.wire import EXTENSION


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
    if value < low or value > high or (low_open and value == low):
        raise _bad(f"'{key}' must be {'above' if low_open else 'at least'} {low:g} and at most {high:g}; got {value}.", key)
    return float(value)


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise _bad(f"{where}: only text content parts are supported.", "messages")
        return "".join(parts)
    raise _bad(f"{where}: 'content' must be a string or a list of text parts.", "messages")


@dataclass
class Params:
    """A validated request."""

    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    thinking: Optional[bool] = None
    separate_reasoning: Optional[bool] = None
    return_token_ids: bool = False
    extension: bool = False  # the request carried the dflash object: send the summary chunk
    block_size: Optional[int] = None
    stop_ids: Optional[list[int]] = None
    messages: Optional[list[dict]] = None
    prompt: Any = None  # text or token ids (/v1/completions)


def parse(body: Any, names: list[str], chat: bool) -> Params:
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
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
    p.include_usage = bool(options.get("include_usage", False))
    max_tokens = _int(body, "max_completion_tokens") if body.get("max_completion_tokens") is not None \
        else _int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        raise _bad(f"'{key}' must be at least 1; got {max_tokens}.", key)
    p.max_tokens = max_tokens
    p.temperature = _float(body, "temperature", 0.0, 100.0)
    p.top_p = _float(body, "top_p", 0.0, 1.0, low_open=True)
    p.min_p = _float(body, "min_p", 0.0, 1.0)
    top_k = _int(body, "top_k")
    if top_k is not None and top_k < -1:
        raise _bad(f"'top_k' must be -1 or 0 (off) or a positive number of tokens; got {top_k}.", "top_k")
    p.top_k = None if top_k is None or top_k <= 0 else top_k  # vLLM: -1 or 0 means off
    seed = _int(body, "seed", 0)
    p.seed = 0 if seed is None else seed
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
    if body.get("separate_reasoning") is not None:
        p.separate_reasoning = bool(body["separate_reasoning"])
    p.return_token_ids = bool(body.get("return_token_ids", False))
    ext = body.get(EXTENSION) or {}
    if not isinstance(ext, dict):
        raise _bad(f"'{EXTENSION}' must be an object.", EXTENSION)
    p.extension = EXTENSION in body
    p.block_size = _int(ext, "block_size", 1)
    stop_ids = ext.get("stop_ids", body.get("stop_token_ids"))
    if stop_ids is not None:
        if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
            raise _bad("'stop_ids' must be a list of token ids.", EXTENSION)
        p.stop_ids = stop_ids
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list of {role, content} objects.", "messages")
        clean = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer", "tool"):
                raise _bad(f"messages[{i}] needs a role of system, user or assistant.", "messages")
            role = "system" if m["role"] == "developer" else m["role"]
            clean.append({"role": role, "content": _text_content(m.get("content"), f"messages[{i}]")})
        p.messages = clean
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


def check_request(make) -> Any:
    """Build a GenerationRequest; the engine's own checks (UserError) become 400s."""
    try:
        return make()
    except UserError as exc:
        raise _bad(str(exc)) from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(summary, prompt_tokens: int, completion_tokens: int) -> dict:
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if summary is not None:
        tau = summary.mean_acceptance_length
        out["mean_acceptance_length"] = None if tau is None else round(tau, 4)  # None: unknown
        out["decode_tokens_per_s"] = round(summary.decode_tokens_per_s, 2)
        out["ttft_s"] = round(summary.ttft_s, 4)
    return out


def now() -> int:
    return int(time.time())
