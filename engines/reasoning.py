"""How a family's answer carries its thinking: one rule per chat format, chosen from the target's own chat
template, which every front end (the chat, `generate --hide-thinking`, sessions, `dflash serve`) reads.

- `think` (Qwen3, Qwen3.5, Llama and the rest): `<think>...</think>` then the answer; thinking is on or off
  (the template's `enable_thinking`).
- `harmony` (gpt-oss): messages on channels. The reply opens with `<|channel|>analysis<|message|>...<|end|>`
  (the thinking), then `<|start|>assistant<|channel|>final<|message|>...` (the answer, ended by `<|return|>`),
  or a tool call `... to=functions.NAME ...<|message|>{json}` (ended by `<|call|>`). There is no off: the
  template's `reasoning_effort` sets how long it thinks.
- `gemma4` (Gemma 4): a thought channel `<|channel>thought\n...<channel|>` then the answer, tool calls
  `<|tool_call>call:NAME{...}<tool_call|>` after it. Thinking on puts `<|think|>` in the system turn; off, the
  template writes an empty channel into the prompt, and a model that opens one anyway is split the same.

Harmony's and Gemma 4's markers are special tokens, which a tokenizer leaves out of decoded text;
`show_markers` makes them text, as Qwen's `<think>` is, so that every decoder (the engines', the engine
process's, the remote engine's) yields the same raw text and the split happens here. The tokens that end a
reply (harmony's `<|return|>` and `<|call|>`, Gemma 4's `<turn|>`, `<eos>` and `<|tool_response>`) stay
hidden, as an eos does.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Optional

from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.remote.thinking import THINK_CLOSE, THINK_OPEN, ThinkingSplitter, prompt_opens_thinking

CHANNEL, MESSAGE, START, END, CONSTRAIN = "<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"
SHOWN_MARKERS = (CHANNEL, MESSAGE, START, END, CONSTRAIN)
RECIPIENT = re.compile(r"\bto=([^\s<]+)")
# Gemma 4's thought channel, and its tool-call markers and string delimiter (read by serve/tools.py)
GEMMA_OPEN, GEMMA_CLOSE = "<|channel>", "<channel|>"
GEMMA_THOUGHT = f"{GEMMA_OPEN}thought\n"  # the thought channel's header
GEMMA_CALL_OPEN, GEMMA_CALL_CLOSE, GEMMA_STRING = "<|tool_call>", "<tool_call|>", '<|"|>'


class ChatFormat:
    """What every format has: `markers`, the marker texts a streamed chunk may stop inside (LayoutSplitter
    holds such an end back); `shown`, the special tokens `show_markers` makes text."""

    markers: tuple = ()
    shown: tuple = ()
    ends: tuple = ()  # the special tokens that hand the turn over (to the user or a tool): see stop_ids
    answer_after = ""  # the text that ends the reasoning and opens the answer (where a constraint starts)

    def template_messages(self, messages: list[dict]) -> list[dict]:
        """The messages as the chat template takes them (an OpenAI request's, or the chat's history)."""
        return messages

    def opened_by(self, prompt_text: str) -> bool:
        """Whether a rendered prompt (its decoded end) leaves the thinking open, so that the reply starts
        inside it: the `opened` of `splitter`."""
        return False


class ThinkFormat(ChatFormat):
    """`<think>...</think>` then the answer (a template may open the block in the prompt already)."""

    name = "think"
    answer_after = THINK_CLOSE

    def layout(self, raw: str, thinking: bool) -> tuple[int, int, int]:
        """(thinking start, thinking end, answer start) as offsets into the raw answer text.

        No thinking gives (0, 0, answer start); an unclosed block runs to the end of the text."""
        lead = len(raw) - len(raw.lstrip())
        if raw.startswith(THINK_OPEN, lead):
            start = lead + len(THINK_OPEN)
            close = raw.find(THINK_CLOSE, start)
            if close == -1:
                return start, len(raw), len(raw)
            end, answer = close, close + len(THINK_CLOSE)
        elif thinking and THINK_CLOSE in raw:
            start, end = 0, raw.index(THINK_CLOSE)
            answer = end + len(THINK_CLOSE)
        else:
            return 0, 0, lead
        while answer < len(raw) and raw[answer] == "\n":
            answer += 1
        while start < end and raw[start] == "\n":
            start += 1
        return start, end, answer

    def thought(self, raw: str) -> bool:
        """Whether the thinking in `raw` has ended (a reply that may still be thinking says False)."""
        return THINK_CLOSE in raw

    def history(self, raw: str) -> dict:
        """The assistant message a later turn resends: the raw text (the template drops earlier thinking)."""
        return {"role": "assistant", "content": raw}

    def splitter(self, opened: bool = False, prefix: str = ""):
        """(reasoning, content) deltas as the text streams (`dflash serve`)."""
        return ThinkingSplitter(opened=opened)

    def opened_by(self, prompt_text: str) -> bool:
        return prompt_opens_thinking(prompt_text)


class HarmonyFormat(ChatFormat):
    """gpt-oss's harmony: the first analysis message is the thinking, the final message the answer; other
    messages (commentary: tool calls, preambles) are neither."""

    name = "harmony"
    answer_after = f"{CHANNEL}final{MESSAGE}"
    markers = shown = SHOWN_MARKERS
    ends = ("<|return|>", "<|call|>")

    @staticmethod
    def messages(raw: str) -> list[dict]:
        """The messages in a reply as it stands: header (channel, recipient), body offsets, and whether the
        body ended. A header without its `<|message|>` yet ends the list (more is coming)."""
        out, at = [], 0
        while at < len(raw):
            body = raw.find(MESSAGE, at)
            if body == -1:
                break
            header = raw[at:body]
            channel = header.split(CHANNEL, 1)[1].split("<|", 1)[0].split() if CHANNEL in header else []
            recipient = RECIPIENT.search(header)
            start = body + len(MESSAGE)
            ends = [i for i in (raw.find(END, start), raw.find(START, start)) if i != -1]
            stop = min(ends, default=len(raw))
            out.append({"channel": channel[0] if channel else "", "recipient": recipient.group(1) if recipient else None,
                        "start": start, "end": stop, "closed": bool(ends)})
            at = stop + len(END) if raw.startswith(END, stop) else stop
        return out

    def layout(self, raw: str, thinking: bool = True) -> tuple[int, int, int]:
        """(thinking start, thinking end, answer start), as `ThinkFormat.layout`. Text that does not open
        with a harmony header is all answer (a model that ignored the format)."""
        lead = len(raw) - len(raw.lstrip())
        if not raw.startswith((CHANNEL, START), lead):
            return 0, 0, lead
        found = self.messages(raw)
        analysis = next((m for m in found if m["channel"] == "analysis" and not m["recipient"]), None)
        final = next((m for m in found if m["channel"] == "final"), None)
        answer = final["start"] if final else len(raw)
        if analysis is None:
            return (answer, answer, answer) if final else (len(raw), len(raw), len(raw))
        return analysis["start"], analysis["end"], answer

    def thought(self, raw: str) -> bool:
        found = self.messages(raw)
        return any(m["closed"] or m["channel"] != "analysis" for m in found)

    def history(self, raw: str) -> dict:
        """The final message as content and the analysis as `thinking`, the fields the template reads (it
        drops the thinking of earlier turns itself; a content with channel tags in it is an error there)."""
        start, end, answer = self.layout(raw)
        message = {"role": "assistant", "content": raw[answer:]}
        if start < end:
            message["thinking"] = raw[start:end]
        return message

    def splitter(self, opened: bool = False, prefix: str = ""):
        """`prefix`: text already in the prompt that the reply continues (a forced tool call's header)."""
        return LayoutSplitter(self, prefix)


class GemmaFormat(ChatFormat):
    """Gemma 4: a channel that opens the reply (`<|channel>thought\n`) is the thinking, up to `<channel|>`;
    what follows is the answer (tool calls included: the call parser reads them from it). The published
    template drops earlier thinking from the history itself and wants a call's arguments as an object."""

    name = "gemma4"
    answer_after = GEMMA_CLOSE
    markers = (GEMMA_OPEN, GEMMA_CLOSE)
    ends = ("<turn|>", "<|tool_response>")
    shown = (GEMMA_OPEN, GEMMA_CLOSE, GEMMA_CALL_OPEN, GEMMA_CALL_CLOSE, GEMMA_STRING)

    def layout(self, raw: str, thinking: bool = True) -> tuple[int, int, int]:
        """(thinking start, thinking end, answer start), as `ThinkFormat.layout`; `thinking` does not matter:
        a model may open the channel with thinking off. A channel whose name line has not ended yet is
        neither thinking nor answer (more is coming)."""
        lead = len(raw) - len(raw.lstrip())
        if not raw.startswith(GEMMA_OPEN, lead):
            return 0, 0, lead
        at = lead + len(GEMMA_OPEN)
        close, newline = raw.find(GEMMA_CLOSE, at), raw.find("\n", at)
        if close != -1 and (newline == -1 or close < newline):
            start = close  # a channel closed on its name line: no thinking
        elif newline != -1:
            start = newline + 1
        else:
            return len(raw), len(raw), len(raw)
        if close == -1:
            return start, len(raw), len(raw)
        answer = close + len(GEMMA_CLOSE)
        while answer < len(raw) and raw[answer] == "\n":
            answer += 1
        return start, close, answer

    def thought(self, raw: str) -> bool:
        """The channel has closed, or the reply started without one."""
        lead = raw.lstrip()
        return GEMMA_CLOSE in raw or bool(lead) and not (lead.startswith(GEMMA_OPEN) or GEMMA_OPEN.startswith(lead))

    def history(self, raw: str) -> dict:
        """The answer as content and the thinking as `reasoning_content`, the fields the template reads (it
        renders the thinking only for the turn still in progress, so earlier turns go without it)."""
        start, end, answer = self.layout(raw)
        message = {"role": "assistant", "content": raw[answer:]}
        thinking = raw[start:end].strip("\n")
        if thinking:
            message["reasoning_content"] = thinking
        return message

    def splitter(self, opened: bool = False, prefix: str = ""):
        """`opened`: the prompt opened the channel already (thinking on, after a tool's response)."""
        return LayoutSplitter(self, (GEMMA_THOUGHT if opened else "") + prefix)

    def opened_by(self, prompt_text: str) -> bool:
        return prompt_text.endswith(GEMMA_THOUGHT)

    def template_messages(self, messages: list[dict]) -> list[dict]:
        """An assistant's tool calls with their arguments as objects: OpenAI sends them as JSON text, which the
        published template refuses ("Deserialize arguments before passing to the template"). Text that is not
        a JSON object is left as it is (the template then says what is wrong)."""
        return [_with_object_arguments(m) if isinstance(m, dict) and m.get("tool_calls") else m for m in messages]


def _with_object_arguments(message: dict) -> dict:
    return {**message, "tool_calls": [_object_arguments(call) for call in message["tool_calls"]]}


def _object_arguments(call):
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        parsed = parse_json(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": parsed}} if isinstance(parsed, dict) else call


class LayoutSplitter:
    """Text as it streams -> (reasoning, content) deltas, read off a format's layout: a region never shrinks
    once text is in it. A marker arrives whole from the detokenizer (it is one token); text cut elsewhere (a
    server's chunks) has a trailing marker prefix held back until it is known."""

    def __init__(self, fmt, prefix: str = ""):
        self.fmt = fmt
        self.raw = prefix
        self.reasoning_at = self.content_at = len(prefix)  # how far each channel has been sent

    def add(self, text: str) -> tuple[str, str]:
        self.raw += text
        return self._send(len(self.raw) - _marker_prefix(self.raw, self.fmt.markers))

    def flush(self) -> tuple[str, str]:
        return self._send(len(self.raw))

    def _send(self, upto: int) -> tuple[str, str]:
        raw = self.raw[:upto]
        start, end, answer = self.fmt.layout(raw, True)
        reasoning = raw[max(start, self.reasoning_at):end]
        self.reasoning_at = max(self.reasoning_at, end)
        content = raw[max(answer, self.content_at):]
        self.content_at = max(self.content_at, len(raw))
        return reasoning, content


def _marker_prefix(text: str, markers: tuple) -> int:
    """Length of the longest end of `text` that may still grow into one of `markers`."""
    tail = text[text.rfind("<"):] if "<" in text else ""
    return len(tail) if any(m.startswith(tail) and m != tail for m in markers) else 0


THINK, HARMONY, GEMMA4 = ThinkFormat(), HarmonyFormat(), GemmaFormat()


def _template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return str(template)


@functools.lru_cache(maxsize=16)
def _format_of_template(text: str):
    if CHANNEL in text and MESSAGE in text:
        return HARMONY
    return GEMMA4 if GEMMA_OPEN in text and GEMMA_CLOSE in text else THINK


def format_of(tokenizer):
    """The format a tokenizer's chat template writes replies in (`think` without a template)."""
    return _format_of_template(_template_text(tokenizer))


def format_for(engine):
    """The format of `engine`'s answer text. The remote engine's is `think` whatever the model: it joins a
    server's reasoning deltas into `<think>` text (engines/remote/thinking.py)."""
    if getattr(engine, "name", None) == "remote":
        return THINK
    return format_of(getattr(engine, "tokenizer", None))


def stop_ids(tokenizer, eos_ids: list[int]) -> list[int]:
    """The ids a reply stops at: the checkpoint's eos ids, and the format's hand-over tokens that are in the
    vocabulary (harmony's `<|return|>` and `<|call|>`, Gemma 4's `<turn|>` and `<|tool_response>`), so that a
    tool call ends the reply even where a generation_config leaves such a token out of its eos list."""
    ids = list(eos_ids)
    for token in format_of(tokenizer).ends:
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != tokenizer.unk_token_id and found not in ids:
            ids.append(found)
    return ids


def answer_marker(tokenizer, request) -> Optional[list[int]]:
    """The ids after which a thinking request's answer starts (a constraint applies from there), or None
    when the answer starts at once: thinking off (harmony always thinks), a raw text prompt, or a template
    that never writes the marker."""
    fmt = format_of(tokenizer)
    if request.prompt is not None or not fmt.answer_after or (not request.thinking and fmt is not HARMONY):
        return None  # (prompt ids are a rendered chat here: `dflash serve` renders, then sends ids)
    if fmt.answer_after not in _template_text(tokenizer) and fmt is THINK:
        return None
    return list(tokenizer.encode(fmt.answer_after, add_special_tokens=False))


def takes_effort(tokenizer) -> bool:
    """Whether the chat template reads `reasoning_effort` (gpt-oss's does; Qwen's does not)."""
    return "reasoning_effort" in _template_text(tokenizer)


def template_kwargs(tokenizer, thinking: bool, effort: Optional[str]) -> dict:
    """The thinking arguments for `apply_chat_template`: `enable_thinking` always (a template that does not
    read it ignores it), and `reasoning_effort` when set; an effort for a template that does not read it is
    refused in one sentence rather than silently dropped."""
    kwargs: dict = {"enable_thinking": thinking}
    if effort is not None:
        if not takes_effort(tokenizer):
            raise UserError(f"reasoning_effort {effort} does nothing for this model: its chat template does not read "
                            "it (thinking is on or off here: --thinking / --no-thinking); leave it out.")
        kwargs["reasoning_effort"] = effort
    return kwargs


def show_markers(tokenizer) -> None:
    """Make the markers of a tokenizer's chat format (its `shown`: harmony's `<|channel|>`, `<|message|>`,
    `<|start|>`, `<|end|>`, `<|constrain|>`; Gemma 4's channel and tool-call markers and `<|"|>`) text when
    decoding skips special tokens, as Qwen's `<think>` is: the backend is rebuilt from its own JSON with those
    added tokens no longer flagged special. Encoding is unchanged (added tokens are matched whatever their
    flag); the tokens that end a reply, and bos, eos and pad, stay as they were."""
    shown = format_of(tokenizer).shown
    if not shown:
        return
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return
    from tokenizers import Tokenizer

    data = json.loads(backend.to_str())
    changed = False
    for token in data.get("added_tokens", []):
        if token.get("content") in shown and token.get("special"):
            token["special"] = False
            changed = True
    if changed:
        tokenizer._tokenizer = Tokenizer.from_str(json.dumps(data))  # transformers keeps its backend here
