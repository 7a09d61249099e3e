"""Thinking text in its three wire forms, both ways.

Servers send a model's thinking in one of three ways: a `reasoning_content` delta (SGLang, DeepSeek's
API, older vLLM), a `reasoning` delta (current vLLM), or inline `<think>...</think>` text inside
`content` (llama.cpp and mlx_lm.server by default, or any server asked not to split). A local engine's
text is the inline form, so:

- `ThinkingJoiner` (client side) turns deltas of any form back into inline text, which is what the
  front ends already parse;
- `ThinkingSplitter` (server side) turns inline text as it streams into (reasoning, content) deltas,
  holding back a partial tag so that no `<think>` fragment ever leaks into either channel.
"""

from __future__ import annotations

from typing import Optional

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkingJoiner:
    """Deltas in any of the three forms -> inline text (`<think>\\n...\\n</think>\\n\\n` then the answer),
    as a local engine writes it; a block the model stopped inside stays open, as a local engine shows it.

    Servers differ in the newlines around the reasoning: vLLM's and SGLang's parsers (and ours) strip them,
    mlx_lm.server sends them as the model wrote them (reasoning "\\n", ..., "\\n", then content "\\n",
    "\\n"), which doubled the blank lines. Newlines that open or close the reasoning and those that open the
    answer after it are dropped; those inside are held back until more reasoning shows they are inside."""

    def __init__(self) -> None:
        self.in_thinking = False
        self.fresh = False  # in a block that has shown no reasoning yet
        self.held = ""  # the reasoning's trailing newlines
        self.after = False  # the block just closed and the answer has shown nothing yet

    def add(self, delta: dict) -> str:
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        content = delta.get("content") or ""
        out = []
        if reasoning:
            if not self.in_thinking:
                out.append(THINK_OPEN + "\n")
                self.in_thinking = self.fresh = True
            text = self.held + reasoning
            if self.fresh:
                text = text.lstrip("\n")
            body = text.rstrip("\n")
            self.held = text[len(body):]
            self.fresh = self.fresh and not body
            out.append(body)
        if content:
            if self.in_thinking:
                out.append("\n" + THINK_CLOSE + "\n\n")
                self.in_thinking, self.held, self.after = False, "", True
            if self.after:
                content = content.lstrip("\n")
                self.after = not content
            out.append(content)
        return "".join(out)


class ThinkingSplitter:
    """Inline text -> (reasoning, content) deltas, as SGLang's and vLLM's reasoning parsers do.

    `opened`: the prompt already opened the block (a template that ends with `<think>`), so the reply
    starts inside it. Otherwise a reply that opens with `<think>` (after whitespace) is thinking until
    `</think>`; any other reply is all content.
    """

    def __init__(self, opened: bool = False) -> None:
        self.state = "thinking" if opened else "start"
        self.buffer = ""
        self.fresh = True  # no reasoning text sent yet: leading newlines are dropped

    def add(self, text: str) -> tuple[str, str]:
        self.buffer += text
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            if self.state == "start":
                stripped = self.buffer.lstrip()
                if not stripped:
                    return "".join(reasoning), "".join(content)
                if stripped.startswith(THINK_OPEN):
                    self.buffer = stripped[len(THINK_OPEN):]
                    self.state = "thinking"
                    continue
                if THINK_OPEN.startswith(stripped):
                    return "".join(reasoning), "".join(content)  # could still become the tag
                self.state = "content"
                continue
            if self.state == "thinking":
                if self.fresh:
                    self.buffer = self.buffer.lstrip("\n")
                    if not self.buffer:
                        return "".join(reasoning), "".join(content)
                at = self.buffer.find(THINK_CLOSE)
                if at >= 0:
                    reasoning.append(self.buffer[:at].rstrip("\n"))
                    self.buffer = self.buffer[at + len(THINK_CLOSE):]
                    self.state = "after"
                    continue
                keep = _partial_suffix(self.buffer, THINK_CLOSE)
                # trailing newlines before a possible close tag are held back too, so they can be dropped
                body = self.buffer[: len(self.buffer) - keep]
                held = len(body) - len(body.rstrip("\n"))
                cut = len(body) - held
                reasoning.append(self.buffer[:cut])
                self.fresh = self.fresh and cut == 0
                self.buffer = self.buffer[cut:]
                return "".join(reasoning), "".join(content)
            if self.state == "after":  # newlines between </think> and the answer are not content
                self.buffer = self.buffer.lstrip("\n")
                if not self.buffer:
                    return "".join(reasoning), "".join(content)
                self.state = "content"
                continue
            content.append(self.buffer)
            self.buffer = ""
            return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """What is held back, at the end of the reply."""
        rest, self.buffer = self.buffer, ""
        if self.state == "thinking":
            return rest, ""
        if self.state == "after":
            return "", ""
        return "", rest


def prompt_opens_thinking(prompt_text: Optional[str]) -> bool:
    """Whether a rendered prompt ends inside an open think block (the reply starts as thinking)."""
    if not prompt_text:
        return False
    at = prompt_text.rfind(THINK_OPEN)
    return at >= 0 and THINK_CLOSE not in prompt_text[at:]
