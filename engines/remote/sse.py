"""Server-sent events, read line by line (the framing every OpenAI-compatible server streams in)."""

from __future__ import annotations

import json
from typing import Iterable, Iterator

from dflash_tui.engines.errors import parse_json

DONE = "[DONE]"


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data` of each event: `data:` lines joined with newlines, sent at a blank line.

    Comments (`:` lines, used as keep-alives) and other fields (`event:`, `id:`, `retry:`) are skipped.
    A stream that ends without a final blank line still yields its last event.
    """
    data: list[str] = []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def iter_sse_json(lines: Iterable[str]) -> Iterator[dict]:
    """Decoded JSON events until `[DONE]`. An `{"error": ...}` event is yielded like any other."""
    for data in iter_sse_data(lines):
        if data.strip() == DONE:
            return
        try:
            event = parse_json(data)
        except ValueError:
            raise ValueError(f"the server streamed an event that is not JSON: {data[:80]!r}") from None
        yield event


def encode_event(payload) -> bytes:
    """One SSE event for a JSON payload (or the literal `[DONE]`)."""
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
