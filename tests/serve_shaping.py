"""`dflash serve`'s shaping run over text the test chooses, without a model or a socket: the pieces an engine's
detokenizer would release for it (`streamed_text`), those steps through `pieces` (stop strings, the reasoning
split, the call parser) and `ChatShaper` (the chunks, or the response object); and what the openai client
accumulates from streamed tool-call deltas."""

from __future__ import annotations

import asyncio
import json

import pytest


def streamed_text(engine, text: str, prompt_ids=()) -> list[str]:
    """`text` as the engine's detokenizer releases it, one token at a time (the pieces a turn streams)."""
    from dflash_tui.engines.detokenize import StreamingDetokenizer

    detok = StreamingDetokenizer(engine.decode, list(prompt_ids))
    pieces = [detok.add(i) for i in engine.tokenizer.encode(text, add_special_tokens=False)]
    return [p for p in pieces + [detok.flush()] if p]


def serve_run(engine, texts: list[str], stream: bool, split, parser=None):
    """The response object, or the streamed chunks (without the final [DONE]), for one step per text."""
    from dflash_tui.engines.events import StepEvent
    from dflash_tui.serve.api import Params
    from dflash_tui.serve.app import ChatShaper, ServeState, pieces
    from dflash_tui.serve.worker import Job

    async def run():
        job = Job(request=None, loop=asyncio.get_running_loop())
        for n, text in enumerate(texts):
            job.results.put_nowait(("event", StepEvent(drafted=[], accepted=0, emitted=[n], pieces=[(text, "target")],
                                                       finish_reason="stop" if n == len(texts) - 1 else None)))
        job.results.put_nowait(("summary", None))
        state = ServeState(engine=engine, worker=None, metrics=None, names=["tiny"])
        params = Params(model="tiny", stream=stream)
        shaper = ChatShaper(params, [1], chat=True)
        source = pieces(state, job, params, split, parser)
        if not stream:
            return await shaper.whole(source)
        return [json.loads(raw.decode()[6:]) for raw in [b async for b in shaper.stream(source)][:-1]]

    return asyncio.run(run())


def accumulated_calls(chunks: list[dict]) -> dict[int, dict]:
    """Each chunk validated as the openai client's ChatCompletionChunk, and the tool calls its deltas add up
    to, by index: name, arguments, and the id each delta carried (the first one only, as vLLM sends them)."""
    openai_types = pytest.importorskip("openai.types.chat")
    calls: dict[int, dict] = {}
    for chunk in chunks:
        openai_types.ChatCompletionChunk.model_validate(chunk)
        for choice in chunk["choices"]:
            for delta in choice["delta"].get("tool_calls") or []:
                slot = calls.setdefault(delta["index"], {"name": "", "arguments": "", "ids": []})
                slot["name"] += (delta.get("function") or {}).get("name") or ""
                slot["arguments"] += (delta.get("function") or {}).get("arguments") or ""
                slot["ids"].append(delta.get("id"))
    return calls
