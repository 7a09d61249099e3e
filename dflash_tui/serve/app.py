"""The ASGI app of `dflash serve` (starlette): OpenAI chat and completions, streaming over SSE.

One engine (an `EngineLike`, normally the engine process) answers one request at a time through
`EngineWorker`; each request's events come back on its own asyncio queue and are shaped here: stop
strings held back and cut, thinking split into `reasoning_content` / `reasoning`, the step data in the
`dflash` extension field. A client that goes away cancels its request, queued or running.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Optional

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from dflash_tui.engines.config import GenerationRequest
from dflash_tui.engines.engine import EngineLike
from dflash_tui.engines.errors import MAX_DEPTH, describe, too_deep
from dflash_tui.engines.guided import Constraint
from dflash_tui.engines.hub import looks_like_hub_id
from dflash_tui.engines.prompting import chat_ids
from dflash_tui.engines.reasoning import format_for, takes_effort
from dflash_tui.engines.remote.sse import encode_event
from dflash_tui.engines.remote.thinking import ThinkingSplitter
from dflash_tui.engines.remote.wire import EXTENSION, step_to_wire

from .api import ApiError, Params, check_request, fresh_seed, new_id, now, parse, refuse_effort, usage
from .forced_calls import call_constraint
from .metrics import Metrics
from .text import StopMatcher
from .tools import ToolCallParser, harmony_opening, parser_for, template_text, tool_format, wire_call
from .worker import EngineWorker, Job, QueueFull, ShuttingDown

PUBLIC_PATHS = ("/health",)
MAX_BODY = 8 * 2**20  # bytes; --max-body
log = logging.getLogger("dflash.serve")


@dataclass
class ServeState:
    engine: EngineLike
    worker: EngineWorker
    metrics: Metrics
    names: list[str]  # served model names; the first is listed
    defaults: dict = field(default_factory=dict)  # the profile's generation settings
    reasoning_split: bool = True
    api_key: Optional[str] = None
    created: int = field(default_factory=now)
    max_body: int = MAX_BODY
    clamp_max_tokens: bool = False  # --clamp-max-tokens: cut max_tokens to the context instead of a 400
    allowed_origins: tuple = ()  # --allowed-origins: CORS (off when empty)
    host: str = "127.0.0.1"  # --host: the address it listens on
    allowed_hosts: tuple = ()  # --allowed-hosts: Host header values answered beyond the bound address and loopback
    prefix_reuse: bool = True  # --prefix-reuse: start from the caches the previous request left

    @property
    def max_positions(self) -> Optional[int]:
        return self.engine.target_info.max_positions

    def card(self, name: Optional[str] = None) -> dict:
        e = self.engine
        info = {
            "engine": e.name, "device": e.device, "dtype": e.dtype,
            "block_size": e.block_size, "trained_block_size": e.trained_block_size,
            "target": public_name(e.config.target), "draft": public_name(e.config.draft),
            "max_model_len": self.max_positions, "stop_ids": list(e.stop_ids()),
            "draft_window": e.config.draft_window,
            "generation_config": _jsonable(e.generation_config or {}),
        }
        return {"id": name or self.names[0], "object": "model", "created": self.created, "owned_by": "dflash",
                "root": info["target"] or self.names[0], "parent": None, "max_model_len": self.max_positions,
                EXTENSION: info}


def public_name(checkpoint: Optional[str]) -> Optional[str]:
    """What a client may see of a checkpoint: a hub id as it is, a local folder by its own name only (its
    absolute path says who the user is and how the disk is laid out; the server's log has it)."""
    if not checkpoint:
        return None
    if looks_like_hub_id(checkpoint) and not Path(checkpoint).expanduser().exists():
        return checkpoint
    return Path(checkpoint.rstrip("/\\")).name or checkpoint


def _jsonable(value: dict) -> dict:
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return {}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


# -- auth -------------------------------------------------------------------------------------------


class BearerAuth:
    """Checks `Authorization: Bearer KEY` on every route except /health (pure ASGI: streaming and
    disconnects pass through untouched)."""

    def __init__(self, app, key: Optional[str]):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.key or scope.get("path") in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key.encode()):
            return await self.app(scope, receive, send)
        err = ApiError(401, "A valid API key is required: send 'Authorization: Bearer KEY'.", None,
                       "invalid_api_key", "authentication_error", {"WWW-Authenticate": "Bearer"})
        await error_response(err)(scope, receive, send)


# -- the Host header ----------------------------------------------------------------------------


WILDCARDS = ("", "0.0.0.0", "::")  # a --host that listens on every interface


def host_name(header: str) -> str:
    """A Host header's name: without its port, brackets, case or trailing dot ('[::1]:8000' -> '::1')."""
    value = header.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _ip(name: str):
    try:
        return ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return None


def host_allowed(header: Optional[str], bound: str, allowed: tuple = ()) -> bool:
    """Whether a request's Host names this server: the address it listens on, a loopback name or address
    (localhost, 127.0.0.0/8, ::1), or one of --allowed-hosts ('*' allows any). Bound to every interface, an
    IP address is allowed too. Any other name is how DNS rebinding reaches a loopback server from a web page
    (the page's own name, pointed at 127.0.0.1), so it is refused. No Host at all (HTTP/1.0) is no browser's."""
    if header is None or "*" in allowed:
        return True
    name = host_name(header)
    ip = _ip(name)
    bound_name = host_name(bound)
    if name == "localhost" or name.endswith(".localhost") or (ip is not None and ip.is_loopback):
        return True
    if name == bound_name or (ip is not None and bound_name in WILDCARDS):
        return True
    return name in {host_name(a) for a in allowed}  # an entry's port, brackets and case do not matter


class HostCheck:
    """Answers only requests whose Host header names this server (`host_allowed`); any other gets 403
    with one sentence saying how to allow it (pure ASGI, outermost: before the key and CORS)."""

    def __init__(self, app, bound: str, allowed: tuple = ()):
        self.app, self.bound, self.allowed = app, bound, tuple(allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = dict(scope.get("headers") or []).get(b"host")
        header = None if raw is None else raw.decode("latin-1")
        if host_allowed(header, self.bound, self.allowed):
            return await self.app(scope, receive, send)
        name = host_name(header or "")[:80]
        log.warning("dflash serve: refused a request for Host %r (start it with --allowed-hosts %s to answer it)",
                    name, name)
        err = ApiError(403, f"This server does not answer to the host name {name!r} (a web page may be reaching it "
                       f"through DNS rebinding); if it should, start dflash serve with --allowed-hosts {name}.",
                       "Host", "host_not_allowed", "permission_error")
        await error_response(err)(scope, receive, send)


# -- streaming with disconnect detection -------------------------------------------------------


class EventStream(Response):
    """An SSE response that watches for the client going away while it streams (and while the request
    waits in the queue, when nothing is written), and then calls `on_gone` at once."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes, None], on_gone: Callable[[], None]):
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                            (b"x-accel-buffering", b"no")]
        self.body_iter, self.on_gone = body, on_gone

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        finished = False
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        if not finished:
                            self.on_gone()
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch)
            try:
                async for chunk in self.body_iter:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                finished = True
            except OSError:
                self.on_gone()
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await self.body_iter.aclose()


async def until_gone(request: Request, job: Job, worker: EngineWorker, work):
    """Run `work()` (a coroutine function) while watching for the client to disconnect; a disconnect
    cancels the job and the work. Returns work's result, or None when the client went away."""
    result: dict = {}
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    worker.cancel(job)
                    tg.cancel_scope.cancel()
                    return

        async def run() -> None:
            try:
                result["value"] = await work()
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group
                result["error"] = exc
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    if "error" in result:
        raise result["error"]
    return result.get("value")


# -- one generation, shaped ---------------------------------------------------------------------


@dataclass
class Piece:
    """One step's output after stop strings, the reasoning split and tool-call parsing."""

    reasoning: str = ""
    content: str = ""
    event: Any = None
    finish: Optional[str] = None
    summary: Any = None
    ids: list = field(default_factory=list)  # the ids this piece returns (a stop string's overrun left out)
    calls: list = field(default_factory=list)  # tool calls completed in this piece


def _ids_through(engine, before: list[int], emitted: list[int], end: int) -> list[int]:
    """The fewest of `emitted` whose text (after `before`) reaches character `end` of the answer: the
    ids a stop string leaves in (vLLM counts the ids through the stop string's last one)."""
    for k in range(1, len(emitted) + 1):
        if len(engine.decode(before + emitted[:k])) >= end:
            return emitted[:k]
    return list(emitted)


async def pieces(state: ServeState, job: Job, params: Params, split: Optional[ThinkingSplitter],
                 parser: Optional[ToolCallParser] = None) -> AsyncIterator[Piece]:
    """A Piece per event as it arrives (the one that ends the answer has `finish`), then a last Piece
    with only the `summary`. Past a stop string the engine is stopping: its last events are not sent."""
    stop = StopMatcher(params.stop)
    finish: Optional[str] = None
    returned: list[int] = []
    calls = 0
    while True:
        kind, value = await job.results.get()
        if kind == "error":
            raise value
        if kind == "summary":
            if finish is None:  # the engine was cancelled: only a client that went away gets here
                finish = "abort"
            yield Piece(summary=value, finish=finish)
            return
        event = value
        if finish is not None:
            continue
        text = stop.add(event.text)
        ids = list(event.emitted)
        if stop.matched:
            finish = "stop"
            state.worker.cancel(job)
            ids = _ids_through(state.engine, returned, ids, stop.end)
        elif event.finish_reason:
            finish = "abort" if event.finish_reason == "cancelled" else event.finish_reason
            text += stop.flush()
        returned += ids
        piece = Piece(event=event, finish=finish, ids=ids)
        if split is None:
            piece.content = text
        else:
            piece.reasoning, piece.content = split.add(text)
            if finish is not None:
                r, c = split.flush()
                piece.reasoning += r
                piece.content += c
        if parser is not None:
            got = parser.add(text if parser.raw else piece.content)  # harmony's calls are in the raw reply
            if finish is not None:
                last = parser.flush()
                got.text += last.text
                got.calls += last.calls
            piece.content, piece.calls = (piece.content if parser.raw else "") + got.text, got.calls
            calls += len(got.calls)
            if finish == "stop" and calls:  # the answer ended with its calls (not cut off by max_tokens)
                finish = piece.finish = "tool_calls"
        yield piece


def check_ids(state: ServeState, ids: list[int], param: str) -> None:
    """Token ids from a client: each in the target's vocabulary (a 400, never a tokenizer crash)."""
    vocab = state.engine.target_info.vocab_size
    if ids and vocab and not 0 <= min(ids) <= max(ids) < vocab:
        raise ApiError(400, f"Token ids must be from 0 to {vocab - 1}; got {min(ids)} .. {max(ids)}.", param)


def _constraint(params: Params, prepared: "Prepared", chat: bool) -> Optional[Constraint]:
    """What the answer must match: a forced tool_choice's calls, else the request's structured-output field
    (on /v1/completions from the first token: a raw prompt has no reasoning to wait for)."""
    if prepared.calls is not None:
        return prepared.calls
    if params.constraint is not None and not chat:
        return replace(params.constraint, after_reasoning=False)
    return params.constraint


def _generation_request(state: ServeState, params: Params, ids: list[int], thinking: bool,
                        constraint: Optional[Constraint] = None) -> GenerationRequest:
    d = state.defaults
    limit = state.max_positions
    room = limit - len(ids) if limit else None
    if params.max_tokens is not None:
        max_new = params.max_tokens
        if room is not None and max_new > room:
            if not (state.clamp_max_tokens or params.clamp_max_tokens):
                where = "messages" if params.messages is not None else "prompt"
                raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{len(ids) + max_new} tokens ({len(ids)} in the {where}, {max_new} in the completion). "
                               f"Please reduce the length of the {where} or completion.",
                               "max_completion_tokens" if params.max_tokens_key == "max_completion_tokens"
                               else "max_tokens", "context_length_exceeded")
            max_new = room
    else:
        max_new = d.get("max_new_tokens") or 256
        if room is not None:
            max_new = min(max_new, room)
    max_new = max(1, max_new)
    stop_ids = params.stop_ids
    check_ids(state, list(stop_ids or []) + params.stop_token_ids, "stop_token_ids")
    check_ids(state, list(params.logit_bias or {}), "logit_bias")
    if stop_ids is None and (params.stop_token_ids or params.ignore_eos):  # vLLM: stop_token_ids add to eos
        base = [] if params.ignore_eos else list(state.engine.stop_ids())
        stop_ids = list(dict.fromkeys(base + params.stop_token_ids))
    seed = params.seed if params.seed is not None else fresh_seed()
    sampling: dict[str, Any] = {name: value if value is not None else d.get(name)  # the request's, else the profile's
                                for name, value in params.sampling().items()}
    return check_request(lambda: GenerationRequest(
        prompt_ids=ids, max_new_tokens=max_new, **sampling, seed=seed, block_size=params.block_size,
        thinking=thinking, stop_ids=stop_ids, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty, repetition_penalty=params.repetition_penalty,
        logit_bias=params.logit_bias, logprobs=params.logprobs, top_logprobs=params.top_logprobs,
        constraint=constraint, reuse_cache=params.reuse_cache if params.reuse_cache is not None else state.prefix_reuse),
        "messages" if params.messages is not None else "prompt")


@dataclass
class Prepared:
    """A request made ready off the event loop: its prompt ids, and the tool-call format it answers in."""

    ids: list[int]
    tool_format: Optional[str] = None
    opening: str = ""  # a forced tool call's opening, already in the prompt (harmony's header)
    calls: Optional[Constraint] = None  # a forced tool_choice's grammar over the offered tools (serve/forced_calls.py)


def _prompt_ids(state: ServeState, params: Params, thinking: bool) -> Prepared:
    """The chat template and the tokenizer, then the context check: run in a worker thread, never on
    the event loop."""
    prepared = _render(state, params, thinking)
    ids = prepared.ids
    limit = state.max_positions
    if limit and len(ids) >= limit:
        where = "messages" if params.messages is not None else "prompt"
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your request has "
                       f"{len(ids)} input tokens. Please reduce the length of the input {where}.", where,
                       "context_length_exceeded")
    return prepared


def _render(state: ServeState, params: Params, thinking: bool) -> Prepared:
    engine = state.engine
    prepared = Prepared(ids=[])
    tools_in_history = params.messages is not None and any(
        m.get("tool_calls") or m["role"] == "tool" for m in params.messages)
    if params.messages is not None and (params.tools or tools_in_history):
        tokenizer = engine.tokenizer
        fmt = tool_format(tokenizer)
        use_tools = params.tools if params.tool_choice != "none" else None
        if use_tools and fmt is None:
            raise ApiError(400, "This model's chat template has no tools branch, so 'tools' cannot be used with it.",
                           "tools", "unsupported_parameter")
        forced = use_tools is not None and fmt is not None and params.tool_choice not in (None, "auto", "none")
        opening = harmony_opening(params.tool_choice) if forced and fmt == "harmony" else ""
        calls = call_constraint(fmt, use_tools, params.tool_choice, xml="<function=" in template_text(tokenizer)) \
            if forced and use_tools is not None and fmt is not None else None
        ids = check_request(lambda: chat_ids(tokenizer, params.messages, thinking and not forced,
                                             _effort(state, params), use_tools))
        if opening:
            ids += tokenizer.encode(opening, add_special_tokens=False)
        prepared = Prepared(ids=ids, tool_format=fmt if use_tools else None, opening=opening, calls=calls)
    else:
        if params.messages is not None:
            probe = check_request(lambda: GenerationRequest(messages=params.messages, thinking=thinking,
                                                            reasoning_effort=_effort(state, params)))
        elif isinstance(params.prompt, str):
            probe = check_request(lambda: GenerationRequest(prompt=params.prompt), "prompt")
        else:
            check_ids(state, list(params.prompt), "prompt")
            probe = check_request(lambda: GenerationRequest(prompt_ids=list(params.prompt)), "prompt")
        prepared.ids = check_request(lambda: engine.prepare(probe), "messages" if params.messages is not None else "prompt")
    return prepared


def _effort(state: ServeState, params: Params) -> Optional[str]:
    """The request's reasoning effort, else the served profile's; a 400 naming the field for a model whose
    template does not read it (a profile's default is simply not used there)."""
    tokenizer = state.engine.tokenizer
    takes = tokenizer is not None and takes_effort(tokenizer)
    if params.reasoning_effort is not None and not takes:
        raise refuse_effort()
    return (params.reasoning_effort or state.defaults.get("reasoning_effort")) if takes else None


def _decode_json(raw: bytes) -> Any:
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"The request body nests deeper than {MAX_DEPTH} levels.", None, "too_deep") from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.") from None
    if too_deep(value):
        raise ApiError(400, f"The request body nests deeper than {MAX_DEPTH} levels.", None, "too_deep")
    return value


def _is_json(content_type: Optional[str]) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/json"


async def _body(request: Request, state: ServeState) -> Any:
    """The JSON body: `Content-Type: application/json` only (415 for any other type and for none: a web page
    can send a POST without one, or as text/plain, cross-site without asking first; application/json it
    cannot), at most --max-body bytes (413, read no further), parsed off the event loop."""
    content_type = request.headers.get("content-type")
    if not _is_json(content_type):
        got = "none" if content_type is None else repr(content_type.split(";")[0].strip()[:60])
        raise ApiError(415, f"Send the body with Content-Type: application/json (got {got}).",
                       "Content-Type", "unsupported_media_type")
    limit = state.max_body
    too_big = ApiError(413, f"The request body is larger than this server's limit of {limit} bytes "
                       "(dflash serve --max-body).", None, "request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    raw = b"".join(chunks)
    if size < 65536:
        return _decode_json(raw)
    return await off_loop(state, _decode_json, raw)


async def off_loop(state: ServeState, fn, *args):
    """Work that may take long on a big request (parsing, templates, tokenizing), in a worker thread
    while the event loop goes on answering (/health, streams); counted in num_requests_preparing."""
    state.metrics.preparing += 1
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    finally:
        state.metrics.preparing -= 1


def guarded(handler, state: ServeState, route: Optional[str] = None):
    """Every failure of a route is a JSON error (4xx, or 500 with the cause), never a reset connection."""
    async def run(request: Request) -> Response:
        try:
            response = await handler(request)
        except ApiError as err:
            response = error_response(err)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the client still gets JSON, the connection lives
            log.exception("dflash serve: %s failed", request.url.path)
            response = error_response(ApiError(500, f"The server failed on this request ({describe(exc)}).",
                                               kind="server_error", code="internal_error"))
        if route is not None:
            state.metrics.request(route, response.status_code)
        return response

    return run


# -- routes -------------------------------------------------------------------------------------


def build_app(state: ServeState):
    metrics = state.metrics

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "draining" if state.worker.draining else "ok", "queue": state.worker.depth,
                             "running": metrics.running, "preparing": metrics.preparing},
                            status_code=503 if state.worker.draining else 200)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [state.card()]})

    async def model(request: Request) -> Response:
        name = request.path_params["model_id"]
        if name not in state.names:
            raise ApiError(404, f"The model '{name}' does not exist; this server serves {', '.join(state.names)}.",
                           "model", "model_not_found", "NotFoundError")
        return JSONResponse(state.card(name))

    async def metrics_route(request: Request) -> Response:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    async def tokenize(request: Request) -> Response:
        body = await _body(request, state)
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        chat = "messages" in body
        if not chat and not isinstance(body.get("prompt"), str):
            raise ApiError(400, "Send 'messages' (a chat) or 'prompt' (a string) to tokenize.", "prompt")
        params = parse({**body, "max_tokens": None}, state.names, chat)
        thinking = params.thinking if params.thinking is not None else state.defaults.get("thinking", True)

        ids = (await off_loop(state, _render, state, params, thinking)).ids
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_positions})

    async def detokenize(request: Request) -> Response:
        body = await _body(request, state)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ApiError(400, "'tokens' must be a list of token ids.", "tokens")
        check_ids(state, tokens, "tokens")
        return JSONResponse({"prompt": await off_loop(state, state.engine.decode, tokens)})

    async def generate(request: Request, chat: bool) -> Response:
        try:
            body = await _body(request, state)
            params = parse(body, state.names, chat)
            thinking = params.thinking if params.thinking is not None else state.defaults.get("thinking", True)
            _effort(state, params)  # refused before anything is rendered
            if params.draft_window is not None and params.draft_window != state.engine.config.draft_window:
                raise ApiError(400, f"This server runs draft window {state.engine.config.draft_window or 'none'}; a "
                               "request cannot change it (serve a profile with the draft_window you need).",
                               EXTENSION, "unsupported_parameter")
            prepared = await off_loop(state, _prompt_ids, state, params, thinking)
            ids = prepared.ids
            gen = _generation_request(state, params, ids, thinking, _constraint(params, prepared, chat))
            job = Job(request=gen, loop=anyio_loop())
            try:
                state.worker.submit(job)
            except QueueFull as full:
                metrics.rejected += 1
                raise ApiError(429, f"The queue is full ({state.worker.max_queue} requests wait for the engine); "
                               f"retry in {full.retry_after} s.", None, "queue_full", "rate_limit_error",
                               {"Retry-After": str(full.retry_after)}) from None
        except ShuttingDown as exc:
            raise ApiError(503, str(exc), None, "shutting_down", "server_error") from None
        split_on = params.separate_reasoning if params.separate_reasoning is not None else state.reasoning_split
        split = None
        fmt = format_for(state.engine)
        if chat and split_on:
            opened = thinking and not prepared.opening and fmt.opened_by(state.engine.decode(ids[-8:]))
            split = fmt.splitter(opened=opened, prefix=prepared.opening)
        parser = parser_for(prepared.tool_format, prepared.opening) if prepared.tool_format else None
        shaper = ChatShaper(params, ids, chat, state.engine.tokenizer)
        if params.stream:
            return EventStream(shaper.stream(pieces(state, job, params, split, parser)),
                               lambda: state.worker.cancel(job))

        async def collect():
            return await shaper.whole(pieces(state, job, params, split, parser))

        try:
            result = await until_gone(request, job, state.worker, collect)
        except ShuttingDown as exc:
            raise ApiError(503, str(exc), None, "shutting_down", "server_error") from None
        except Exception as exc:  # noqa: BLE001 - the engine failed this request
            raise ApiError(500, f"The engine failed: {describe(exc)}", kind="server_error") from None
        if result is None:
            return Response(status_code=499)  # nobody is listening; uvicorn drops it
        return JSONResponse(result)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, True)

    async def completions(request: Request) -> Response:
        return await generate(request, False)

    routes = [
        Route("/health", guarded(health, state), methods=["GET"]),
        Route("/v1/models", guarded(models, state), methods=["GET"]),
        Route("/v1/models/{model_id:path}", guarded(model, state), methods=["GET"]),
        Route("/metrics", guarded(metrics_route, state), methods=["GET"]),
        Route("/tokenize", guarded(tokenize, state), methods=["POST"]),
        Route("/detokenize", guarded(detokenize, state), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat_completions, state, "/v1/chat/completions"), methods=["POST"]),
        Route("/v1/completions", guarded(completions, state, "/v1/completions"), methods=["POST"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404  # starlette raises 404 and 405 as these
        message = "No such route." if status == 404 else f"Method {request.method} is not allowed here."
        return error_response(ApiError(status, f"{message} ({request.url.path})", code="not_found" if status == 404
                                       else "method_not_allowed", kind="invalid_request_error"))

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    guarded_app: Any = BearerAuth(app, state.api_key)
    if state.allowed_origins:  # off by default: a browser page may not call this server unless allowed
        from starlette.middleware.cors import CORSMiddleware

        guarded_app = CORSMiddleware(guarded_app, allow_origins=list(state.allowed_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["*"])
    return HostCheck(guarded_app, state.host, state.allowed_hosts)


def anyio_loop():
    import asyncio

    return asyncio.get_running_loop()


class ChatShaper:
    """Pieces -> OpenAI chunks (streaming) or one response object."""

    def __init__(self, params: Params, prompt_ids: list[int], chat: bool, tokenizer=None):
        self.params, self.prompt_ids, self.chat = params, prompt_ids, chat
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now()
        self.object = "chat.completion" if chat else "text_completion"
        self.calls = 0  # tool calls sent so far (their index)
        self.tokenizer = tokenizer
        self.offset = 0  # completions' text_offset: characters of token text returned so far
        self._texts: dict[int, str] = {}

    def _token(self, token: int) -> str:
        """A token's own text, special tokens included (as vLLM shows them in logprobs)."""
        if token not in self._texts:
            self._texts[token] = self.tokenizer.decode([token]) if self.tokenizer is not None else str(token)
        return self._texts[token]

    def _logprobs(self, piece: Piece) -> Optional[dict]:
        """OpenAI's logprobs object for the ids a piece returns (None unless asked): chat's
        {"content": [{token, logprob, bytes, top_logprobs}]}, completions' {tokens, token_logprobs,
        top_logprobs, text_offset}. Raw log-probabilities of the target (engines StepEvent.logprobs)."""
        if not self.params.logprobs:
            return None
        event, n = piece.event, len(piece.ids)
        values = list((event.logprobs if event is not None and event.logprobs is not None else [])[:n])
        tops = list((event.top_logprobs if event is not None and event.top_logprobs is not None else [])[:n])
        tops += [[]] * (len(values) - len(tops))
        clamp = lambda v: max(float(v), -9999.0)  # noqa: E731 - vLLM's floor for an underflowed probability
        if self.chat:
            def entry(token: int, value: float) -> dict:
                text = self._token(token)
                return {"token": text, "logprob": clamp(value), "bytes": list(text.encode("utf-8", errors="replace"))}

            return {"content": [{**entry(t, v), "top_logprobs": [entry(int(i), lp) for i, lp in top]}
                                for t, v, top in zip(piece.ids, values, tops)]}
        tokens = [self._token(t) for t in piece.ids[: len(values)]]
        offsets = []
        for text in tokens:
            offsets.append(self.offset)
            self.offset += len(text)
        top_dicts = None
        if self.params.top_logprobs:
            top_dicts = []
            for t, v, top in zip(piece.ids, values, tops):
                alternatives = {self._token(int(i)): clamp(lp) for i, lp in top}
                alternatives.setdefault(self._token(t), clamp(v))  # vLLM lists the chosen token too
                top_dicts.append(alternatives)
        return {"tokens": tokens, "token_logprobs": [clamp(v) for v in values], "top_logprobs": top_dicts,
                "text_offset": offsets}

    @staticmethod
    def _merge(total: Optional[dict], part: Optional[dict]) -> Optional[dict]:
        if part is None:
            return total
        if total is None:
            return {k: (list(v) if v is not None else None) for k, v in part.items()}
        for key, value in part.items():
            if value is not None:
                total[key] = (total[key] or []) + value
        return total

    def _delta(self, piece: Piece) -> dict:
        delta: dict = {}
        if piece.reasoning:
            delta["reasoning_content"] = piece.reasoning  # SGLang's name
            delta["reasoning"] = piece.reasoning  # current vLLM's name
        if piece.content:
            delta["content"] = piece.content
        return delta

    def _chunk(self, choice: dict, ext: Optional[dict] = None, usage_: Optional[dict] = None, choices=True) -> dict:
        out: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.params.model, "choices": [choice] if choices else []}
        if usage_ is not None:
            out["usage"] = usage_
        if ext:
            out[EXTENSION] = ext
        return out

    def _call_chunks(self, piece: Piece) -> list[dict]:
        """A completed tool call as vLLM streams one: its id and name, then its arguments as a delta."""
        out = []
        for call in piece.calls:
            index = self.calls
            self.calls += 1
            head = {"index": index, "id": call["id"], "type": "function",
                    "function": {"name": call["name"], "arguments": ""}}
            out.append({"index": 0, "delta": {"tool_calls": [head]}, "logprobs": None, "finish_reason": None})
            out.append({"index": 0, "delta": {"tool_calls": [{"index": index, "function": {"arguments": call["arguments"]}}]},
                        "logprobs": None, "finish_reason": None})
        return out

    async def stream(self, source: AsyncIterator[Piece]) -> AsyncGenerator[bytes, None]:
        returned = 0
        try:
            if self.chat:
                yield encode_event(self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}))
            async for piece in source:
                if piece.event is None:  # the end: the summary (and usage) in a chunk without choices
                    s = piece.summary
                    if self.params.include_usage or (s is not None and self.params.extension):
                        ext = {"summary": s.to_dict()} if self.params.extension and s is not None else None
                        use = usage(s, len(self.prompt_ids), returned) if self.params.include_usage else None
                        yield encode_event(self._chunk({}, ext, use, choices=False))
                    continue
                returned += len(piece.ids)
                for choice in self._call_chunks(piece):
                    yield encode_event(self._chunk(choice))
                ext = {"step": step_to_wire(piece.event)}
                if self.chat:
                    choice = {"index": 0, "delta": self._delta(piece), "logprobs": self._logprobs(piece),
                              "finish_reason": piece.finish}
                else:
                    choice = {"index": 0, "text": piece.content, "logprobs": self._logprobs(piece),
                              "finish_reason": piece.finish}
                if self.params.return_token_ids:
                    choice["token_ids"] = list(piece.ids)
                yield encode_event(self._chunk(choice, ext))
        except ShuttingDown as exc:
            yield encode_event({"error": {"message": str(exc), "type": "server_error", "param": None,
                                          "code": "shutting_down"}})
        except Exception as exc:  # noqa: BLE001 - the engine failed after the headers went out
            yield encode_event({"error": {"message": f"The engine failed: {describe(exc)}", "type": "server_error",
                                          "param": None, "code": None}})
        yield encode_event("[DONE]")

    async def whole(self, source: AsyncIterator[Piece]) -> dict:
        reasoning, content, ids, calls = [], [], [], []
        finish, summary, logprobs = "stop", None, None
        async for piece in source:
            if piece.event is not None:
                logprobs = self._merge(logprobs, self._logprobs(piece))
            reasoning.append(piece.reasoning)
            content.append(piece.content)
            ids += piece.ids
            calls += piece.calls
            if piece.finish:
                finish = piece.finish
            if piece.event is None:
                summary = piece.summary
        if self.params.logprobs and logprobs is None:
            logprobs = self._logprobs(Piece())  # no token returned: an empty list, as asked
        if self.chat:
            text = "".join(content)
            message: dict = {"role": "assistant", "content": (text.strip() or None) if calls else text}
            if any(reasoning):
                message["reasoning_content"] = message["reasoning"] = "".join(reasoning)
            if calls:
                message["tool_calls"] = [{k: v for k, v in wire_call(c, i).items() if k != "index"}
                                         for i, c in enumerate(calls)]
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": "".join(content), "logprobs": logprobs, "finish_reason": finish}
        if self.params.return_token_ids:
            choice["token_ids"] = ids
        out = {"id": self.id, "object": self.object, "created": self.created, "model": self.params.model,
               "choices": [choice], "usage": usage(summary, len(self.prompt_ids), len(ids))}
        if self.params.return_token_ids:
            out["prompt_token_ids"] = self.prompt_ids
        if summary is not None:
            out[EXTENSION] = {"summary": summary.to_dict()}
        return out
