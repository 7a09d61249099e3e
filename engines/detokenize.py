"""Streaming detokenization that never splits a UTF-8 character and knows who wrote each piece.

Tokens arrive one at a time with an origin ("draft" for accepted draft tokens, "target" for the
target's own). Text is released only once it decodes without a trailing replacement character, so a
multi-byte character spread over several tokens appears whole, attributed to the token completing it.
"""

from __future__ import annotations

from typing import Callable, Sequence

from dflash_tui.engines.events import Piece

Decode = Callable[[Sequence[int]], str]


class StreamingDetokenizer:
    def __init__(self, decode: Decode, context_ids: Sequence[int] = ()):
        self._decode = decode
        # A few context ids let tokenizers that strip a leading space (sentencepiece) decode in context.
        self._ids: list[int] = list(context_ids[-8:])
        self._prefix = 0  # start of the window decoded for context
        self._read = len(self._ids)  # ids up to here have been released as text
        # A context that stops inside a character (a continued answer cancelled mid-character, whose text
        # held that character back) leaves its incomplete tail unread, so the first new token completes it.
        while self._read and self._window_text(self._read).endswith("\ufffd"):
            self._read -= 1
        self.text = ""

    def _window_text(self, end: int) -> str:
        return self._decode(self._ids[self._prefix:end])

    def add(self, token_id: int) -> str:
        """Append one id; return the newly complete text (possibly empty)."""
        self._ids.append(token_id)
        prefix_text = self._window_text(self._read)
        full = self._window_text(len(self._ids))
        if full.endswith("\ufffd") or len(full) <= len(prefix_text):
            return ""
        new = full[len(prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += new
        return new

    def add_tokens(self, ids: Sequence[int], origins: Sequence[str]) -> list[Piece]:
        """Append ids with their origins; return text pieces merged by consecutive origin."""
        pieces: list[Piece] = []
        for token_id, origin in zip(ids, origins):
            text = self.add(token_id)
            if not text:
                continue
            if pieces and pieces[-1][1] == origin:
                pieces[-1] = (pieces[-1][0] + text, origin)
            else:
                pieces.append((text, origin))
        return pieces

    def flush(self) -> str:
        """Release whatever is held back (an incomplete character at the very end)."""
        full = self._window_text(len(self._ids))
        prefix_text = self._window_text(self._read)
        new = full[len(prefix_text):]
        self._prefix = self._read = len(self._ids)
        self.text += new
        return new

    def peek(self, ids: Sequence[int]) -> str:
        """The text `ids` would add after what has been emitted, without consuming them (for ghosts)."""
        base = self._ids[self._prefix:]
        return self._decode(base + list(ids))[len(self._decode(base)):].replace("\ufffd", "")
