"""Stop strings on streamed text: matched on the decoded text, held back while they might still match,
and left out of the output (OpenAI's `stop`)."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.buffer = ""
        self.matched = False
        self.seen = 0  # characters added so far
        self.end: int = 0  # after a match: where the stop string ends in the text added

    def add(self, text: str) -> str:
        """Text safe to send now; after a match, the text before the stop string and nothing more."""
        if self.matched:
            return ""
        self.seen += len(text)
        if not self.stops:
            return text
        self.buffer += text
        hits = [(self.buffer.find(s), s) for s in self.stops]
        hits = [(at, s) for at, s in hits if at >= 0]
        if hits:
            at, hit = min(hits)
            self.end = self.seen - len(self.buffer) + at + len(hit)
            out, self.buffer, self.matched = self.buffer[:at], "", True
            return out
        keep = 0
        for stop in self.stops:  # the longest buffer suffix that could still grow into a stop string
            for n in range(min(len(stop) - 1, len(self.buffer)), keep, -1):
                if self.buffer.endswith(stop[:n]):
                    keep = n
                    break
        out, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
        return out

    def flush(self) -> str:
        out, self.buffer = ("" if self.matched else self.buffer), ""
        return out
