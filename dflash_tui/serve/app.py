"""The ASGI app of `dflash serve` (starlette): OpenAI chat and completions, streaming over SSE.

One engine (an `EngineLike`, normally the engine process) answers one request at a time through
`EngineWorker`; each request's events come back on its own asyncio queue and are shaped here: stop
strings held back and cut, thinking split into `reasoning_content` / `reasoning`, the step data in the
`dflash` extension field. A client that goes away cancels its request, queued or running.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from dflash_tui.engines.config import GenerationRequest
from dflash_tui.engines.remote.sse import encode_event
from dflash_tui.engines.remote.thinking import ThinkingSplitter, prompt_opens_thinking
from dflash_tui.engines.remote.wire import EXTENSION, step_to_wire

from .api import ApiError, Params, check_request, new_id, now, parse, usage
from .metrics import Metrics
from .text import StopMatcher
from .worker import EngineWorker, Job, QueueFull

PUBLIC_PATHS = ("/health",)


@dataclass
class ServeState:
    engine: Any
    worker: EngineWorker
    metrics: Metrics
    names: list[str]  # served model names; the first is listed
    defaults: dict = field(default_factory=dict)  # the profile's generation settings
    reasoning_split: bool = True
    api_key: Optional[str] = None
    created: int = field(default_factory=now)

    @property
    def max_positions(self) -> Optional[int]:
        return self.engine.target_info.max_positions

    def card(self) -> dict:
        e = self.engine
        target, draft = e.target_info, e.draft_info
        info = {
            "engine": e.name, "device": e.device, "dtype": e.dtype,
            "block_size": e.block_size, "trained_block_size": e.trained_block_size,
            "target": e.config.target, "draft": e.config.draft,
            "target_path": str(target.path) if target is not None else None,
            "draft_path": str(draft.path) if draft is not None else None,
            "max_model_len": self.max_positions, "stop_ids": list(e.stop_ids()),
            "generation_config": _jsonable(e.generation_config or {}),
        }
        return {"id": self.names[0], "object": "model", "created": self.created, "owned_by": "dflash",
                "root": info["target"] or self.names[0], "parent": None, "max_model_len": self.max_positions,
                EXTENSION: info}


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


# -- streaming with disconnect detection -------------------------------------------------------


class EventStream(Response):
    """An SSE response that watches for the client going away while it streams (and while the request
    waits in the queue, when nothing is written), and then calls `on_gone` at once."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], on_gone: Callable[[], None]):
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
    """One step's output after stop strings and the reasoning split."""

    reasoning: str = ""
    content: str = ""
    event: Any = None
    finish: Optional[str] = None
    summary: Any = None


async def pieces(state: ServeState, job: Job, params: Params, split: Optional[ThinkingSplitter]) -> AsyncIterator[Piece]:
    """A Piece per event as it arrives (the one that ends the answer has `finish`), then a last Piece
    with only the `summary`. Past a stop string the engine is stopping: its last events are not sent."""
    stop = StopMatcher(params.stop)
    finish: Optional[str] = None
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
        if stop.matched:
            finish = "stop"
            state.worker.cancel(job)
        elif event.finish_reason:
            finish = "abort" if event.finish_reason == "cancelled" else event.finish_reason
            text += stop.flush()
        piece = Piece(event=event, finish=finish)
        if split is None:
            piece.content = text
        else:
            piece.reasoning, piece.content = split.add(text)
            if finish is not None:
                r, c = split.flush()
                piece.reasoning += r
                piece.content += c
        yield piece


def _generation_request(state: ServeState, params: Params, ids: list[int], thinking: bool) -> GenerationRequest:
    d = state.defaults
    max_new = params.max_tokens or d.get("max_new_tokens") or 256
    limit = state.max_positions
    if limit:
        max_new = max(1, min(max_new, limit - len(ids)))
    pick = lambda key: getattr(params, key) if getattr(params, key) is not None else d.get(key)  # noqa: E731 - a one-line lookup
    return check_request(lambda: GenerationRequest(
        prompt_ids=ids, max_new_tokens=max_new, temperature=pick("temperature"), top_p=pick("top_p"),
        top_k=pick("top_k"), min_p=pick("min_p"), seed=params.seed, block_size=params.block_size,
        thinking=thinking, stop_ids=params.stop_ids))


def _prompt_ids(state: ServeState, params: Params, thinking: bool) -> list[int]:
    engine = state.engine
    if params.messages is not None:
        probe = check_request(lambda: GenerationRequest(messages=params.messages, thinking=thinking))
    elif isinstance(params.prompt, str):
        probe = check_request(lambda: GenerationRequest(prompt=params.prompt))
    else:
        probe = check_request(lambda: GenerationRequest(prompt_ids=list(params.prompt)))
    ids = check_request(lambda: engine.prepare(probe))
    vocab = engine.target_info.vocab_size
    if params.prompt is not None and not isinstance(params.prompt, str) and vocab and not 0 <= min(ids) <= max(ids) < vocab:
        raise ApiError(400, f"Token ids must be from 0 to {vocab - 1}; got {min(ids)} .. {max(ids)}.", "prompt")
    limit = state.max_positions
    if limit and len(ids) >= limit:
        raise ApiError(400, f"The prompt is {len(ids)} tokens but this model's context holds {limit}; "
                       "shorten the prompt.", "messages" if params.messages is not None else "prompt",
                       "context_length_exceeded")
    return ids


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.") from None


# -- routes -------------------------------------------------------------------------------------


def build_app(state: ServeState) -> Starlette:
    metrics = state.metrics

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "queue": state.worker.depth, "running": metrics.running})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [state.card()]})

    async def metrics_route(request: Request) -> Response:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    async def tokenize(request: Request) -> Response:
        try:
            body = await _body(request)
            if not isinstance(body, dict):
                raise ApiError(400, "The request body must be a JSON object.")
            chat = "messages" in body
            if not chat and not isinstance(body.get("prompt"), str):
                raise ApiError(400, "Send 'messages' (a chat) or 'prompt' (a string) to tokenize.", "prompt")
            params = parse({**body, "max_tokens": None}, state.names, chat)
            thinking = params.thinking if params.thinking is not None else state.defaults.get("thinking", True)
            if chat:
                probe = check_request(lambda: GenerationRequest(messages=params.messages, thinking=thinking))
            else:
                probe = check_request(lambda: GenerationRequest(prompt=params.prompt))
            ids = check_request(lambda: state.engine.prepare(probe))
        except ApiError as err:
            return error_response(err)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_positions})

    async def detokenize(request: Request) -> Response:
        try:
            body = await _body(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ApiError(400, "'tokens' must be a list of token ids.", "tokens")
        except ApiError as err:
            return error_response(err)
        return JSONResponse({"prompt": state.engine.decode(tokens)})

    async def generate(request: Request, chat: bool) -> Response:
        route = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            params = parse(await _body(request), state.names, chat)
            thinking = params.thinking if params.thinking is not None else state.defaults.get("thinking", True)
            ids = _prompt_ids(state, params, thinking)
            gen = _generation_request(state, params, ids, thinking)
            job = Job(request=gen, loop=anyio_loop())
            try:
                state.worker.submit(job)
            except QueueFull as full:
                metrics.rejected += 1
                raise ApiError(429, f"The queue is full ({state.worker.max_queue} requests wait for the engine); "
                               f"retry in {full.retry_after} s.", None, "queue_full", "rate_limit_error",
                               {"Retry-After": str(full.retry_after)}) from None
        except ApiError as err:
            metrics.request(route, err.status)
            return error_response(err)
        split_on = params.separate_reasoning if params.separate_reasoning is not None else state.reasoning_split
        split = None
        if chat and split_on:
            split = ThinkingSplitter(opened=thinking and prompt_opens_thinking(state.engine.decode(ids[-8:])))
        metrics.request(route, 200)
        shaper = ChatShaper(params, ids, chat)
        if params.stream:
            return EventStream(shaper.stream(pieces(state, job, params, split)), lambda: state.worker.cancel(job))

        async def collect():
            return await shaper.whole(pieces(state, job, params, split))

        try:
            result = await until_gone(request, job, state.worker, collect)
        except Exception as exc:  # noqa: BLE001 - the engine failed this request
            return error_response(ApiError(500, f"The engine failed: {exc}", kind="server_error"))
        if result is None:
            return Response(status_code=499)  # nobody is listening; uvicorn drops it
        return JSONResponse(result)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, True)

    async def completions(request: Request) -> Response:
        return await generate(request, False)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]

    async def not_found(request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        message = "No such route." if status == 404 else f"Method {request.method} is not allowed here."
        return error_response(ApiError(status, f"{message} ({request.url.path})", code="not_found" if status == 404
                                       else "method_not_allowed", kind="invalid_request_error"))

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    return BearerAuth(app, state.api_key)


def anyio_loop():
    import asyncio

    return asyncio.get_running_loop()


class ChatShaper:
    """Pieces -> OpenAI chunks (streaming) or one response object."""

    def __init__(self, params: Params, prompt_ids: list[int], chat: bool):
        self.params, self.prompt_ids, self.chat = params, prompt_ids, chat
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now()
        self.object = "chat.completion" if chat else "text_completion"

    def _delta(self, piece: Piece) -> dict:
        delta: dict = {}
        if piece.reasoning:
            delta["reasoning_content"] = piece.reasoning  # SGLang's name
            delta["reasoning"] = piece.reasoning  # current vLLM's name
        if piece.content:
            delta["content"] = piece.content
        return delta

    def _chunk(self, choice: dict, ext: Optional[dict] = None, usage_: Optional[dict] = None, choices=True) -> dict:
        out = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.params.model, "choices": [choice] if choices else []}
        if usage_ is not None:
            out["usage"] = usage_
        if ext:
            out[EXTENSION] = ext
        return out

    async def stream(self, source: AsyncIterator[Piece]) -> AsyncIterator[bytes]:
        try:
            if self.chat:
                yield encode_event(self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}))
            async for piece in source:
                if piece.event is None:  # the end: the summary (and usage) in a chunk without choices
                    s = piece.summary
                    if s is not None and (self.params.include_usage or self.params.extension):
                        ext = {"summary": s.to_dict()} if self.params.extension else None
                        use = usage(s, len(self.prompt_ids), s.generated_tokens) if self.params.include_usage else None
                        yield encode_event(self._chunk({}, ext, use, choices=False))
                    continue
                ext = {"step": step_to_wire(piece.event)}
                if self.chat:
                    choice = {"index": 0, "delta": self._delta(piece), "logprobs": None, "finish_reason": piece.finish}
                else:
                    choice = {"index": 0, "text": piece.content, "logprobs": None, "finish_reason": piece.finish}
                if self.params.return_token_ids:
                    choice["token_ids"] = list(piece.event.emitted)
                yield encode_event(self._chunk(choice, ext))
        except Exception as exc:  # noqa: BLE001 - the engine failed after the headers went out
            yield encode_event({"error": {"message": f"The engine failed: {exc}", "type": "server_error",
                                          "param": None, "code": None}})
        yield encode_event("[DONE]")

    async def whole(self, source: AsyncIterator[Piece]) -> dict:
        reasoning, content, ids = [], [], []
        finish, summary = "stop", None
        async for piece in source:
            reasoning.append(piece.reasoning)
            content.append(piece.content)
            if piece.event is not None:
                ids += piece.event.emitted
            if piece.finish:
                finish = piece.finish
            if piece.event is None:
                summary = piece.summary
        completion = summary.generated_tokens if summary is not None else len(ids)
        if self.chat:
            message: dict = {"role": "assistant", "content": "".join(content)}
            if any(reasoning):
                message["reasoning_content"] = message["reasoning"] = "".join(reasoning)
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": "".join(content), "logprobs": None, "finish_reason": finish}
        if self.params.return_token_ids:
            choice["token_ids"] = ids
        out = {"id": self.id, "object": self.object, "created": self.created, "model": self.params.model,
               "choices": [choice], "usage": usage(summary, len(self.prompt_ids), completion)}
        if self.params.return_token_ids:
            out["prompt_token_ids"] = self.prompt_ids
        if summary is not None:
            out[EXTENSION] = {"summary": summary.to_dict()}
        return out
