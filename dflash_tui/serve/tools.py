"""Tool calling as vLLM does it for the families dflash runs: `tools` rendered by the target's own chat
template, the model's tool-call text parsed into OpenAI `tool_calls`.

Formats (picked from the chat template's text):
- `hermes` (Qwen3, Qwen3.5): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, and inside
  the same tags the XML function form of Qwen3-Coder: `<function=NAME><parameter=KEY>VALUE</parameter></function>`;
- `llama3_json` (Llama 3.1): the whole answer is `{"name": ..., "parameters": {...}}` (after an optional
  `<|python_tag|>`), several separated by `;`;
- `harmony` (gpt-oss): a message to `functions.NAME` on the commentary channel, e.g.
  `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>` (the
  recipient may also stand in the role part, as the template renders history). `<|call|>` is a stop id, so
  the call's body ends the reply. This parser reads the raw reply (every channel: `raw`), not the content
  left after the reasoning split, since a call is neither thinking nor answer.
- `gemma4` (Gemma 4): `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>` after the answer's text, its
  arguments in the template's own syntax: bare keys, strings between `<|"|>` delimiters, objects, lists,
  numbers, true, false and null (`gemma_value`). `<|tool_response>` is a stop id, so a call ends the reply.

A forced `tool_choice` (`required` or a named function) is a grammar over the offered tools in the
template's format (serve/forced_calls.py); harmony's answer starts with the call's header (`harmony_opening`).
A call that does not parse (an unforced one) comes back as text, with finish_reason "stop".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from dflash_tui.core.sessions import read_regular
from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.reasoning import GEMMA4, GEMMA_CALL_CLOSE, GEMMA_CALL_OPEN, GEMMA_STRING, HARMONY, format_of
from dflash_tui.engines.text import printable

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


def template_text(tokenizer) -> str:
    """The target's chat template ('' without one, or without a tokenizer: a remote engine's may have none)."""
    template = (tokenizer.chat_template if tokenizer is not None else None) or ""
    if isinstance(template, dict):  # named templates: the default one, or any with a tools branch
        template = template.get("tool_use") or template.get("default") or ""
    return str(template)


def tool_format(tokenizer) -> Optional[str]:
    """`hermes`, `llama3_json`, `harmony`, `gemma4`, or None when the template has no tools branch."""
    text = template_text(tokenizer)
    if format_of(tokenizer) is HARMONY:
        return "harmony" if "functions." in text else None
    if format_of(tokenizer) is GEMMA4:
        return "gemma4" if GEMMA_CALL_OPEN in text else None
    if HERMES_OPEN in text or "<function=" in text:
        return "hermes"
    if "tools" in text and ("<|python_tag|>" in text or "ipython" in text or '"parameters"' in text):
        return "llama3_json"
    return None


def harmony_opening(choice: Any) -> str:
    """The message header a forced harmony call starts with ('' when tool_choice forces none): it leaves the
    analysis channel out, and serve/forced_calls.py's grammar continues it."""
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if name:
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
    return "<|channel|>commentary to=functions." if choice == "required" else ""


# -- parsing ----------------------------------------------------------------------------------------


def _call(name: Any, arguments: Any) -> Optional[dict]:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):
        try:
            arguments = parse_json(arguments)
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


def _xml_value(raw: str) -> Any:
    text = raw.strip("\n")
    try:
        return parse_json(text)
    except ValueError:
        return text


XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def parse_hermes_block(body: str) -> Optional[dict]:
    """One `<tool_call>` body: JSON, or the XML function form."""
    text = body.strip()
    if text.startswith("<function="):
        match = XML_FUNCTION.fullmatch(text)
        if not match:
            return None
        params = {m.group(1).strip(): _xml_value(m.group(2)) for m in XML_PARAMETER.finditer(match.group(2))}
        return _call(match.group(1).strip(), params)
    try:
        data = parse_json(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return _call(data.get("name"), data.get("arguments", data.get("parameters")))


def parse_llama_json(text: str) -> Optional[list[dict]]:
    """The whole answer as Llama 3.1 JSON calls (`;`-separated), or None when it is not one."""
    text = text.strip()
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG):].strip()
    if not text.startswith("{"):
        return None
    decoder = json.JSONDecoder()
    calls, at = [], 0
    while at < len(text):
        try:
            data, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than any real call's
            return None
        call = _call(data.get("name"), data.get("parameters", data.get("arguments"))) if isinstance(data, dict) else None
        if call is None:
            return None
        calls.append(call)
        at = end
        while at < len(text) and text[at] in " \n\t;":
            at += 1
    return calls or None


GEMMA_CALL = re.compile(r"\s*call:([\w-]+)(.*)", re.S)
GEMMA_KEY = re.compile(r"[\w.-]+")
GEMMA_LITERAL = re.compile(r"[^\s,}\]]+")


def parse_gemma_call(body: str) -> Optional[dict]:
    """One `<|tool_call>` body, `call:NAME{...}`; None when it is not one."""
    match = GEMMA_CALL.fullmatch(body)
    if not match:
        return None
    try:
        arguments = gemma_value(match.group(2))
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than any real call's
        return None
    return _call(match.group(1), arguments) if isinstance(arguments, dict) else None


def gemma_value(text: str) -> Any:
    """A value in Gemma 4's argument syntax (what the template's `format_argument` writes, keys bare or
    quoted) as Python; a JSON string is taken too. ValueError when `text` is not exactly one value."""
    value, at = _gemma_value(text, _skip(text, 0))
    if _skip(text, at) != len(text):
        raise ValueError("text after the value")
    return value


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _gemma_value(text: str, at: int) -> tuple[Any, int]:
    if text.startswith(GEMMA_STRING, at):
        end = text.find(GEMMA_STRING, at + len(GEMMA_STRING))
        if end < 0:
            raise ValueError("a string that never ends")
        return text[at + len(GEMMA_STRING):end], end + len(GEMMA_STRING)
    if text.startswith('"', at):
        return json.JSONDecoder().raw_decode(text, at)
    if text.startswith(("{", "["), at):
        return _gemma_container(text, at)
    match = GEMMA_LITERAL.match(text, at)
    if not match:
        raise ValueError("no value")
    return json.loads(match.group()), match.end()  # a number, true, false or null


def _gemma_container(text: str, at: int) -> tuple[Any, int]:
    is_object = text[at] == "{"
    close = "}" if is_object else "]"
    out: Any = {} if is_object else []
    at = _skip(text, at + 1)
    if text.startswith(close, at):
        return out, at + 1
    while True:
        if is_object:
            key, at = _gemma_key(text, at)
            at = _skip(text, at)
            if not text.startswith(":", at):
                raise ValueError("a key without its value")
            out[key], at = _gemma_value(text, _skip(text, at + 1))
        else:
            value, at = _gemma_value(text, at)
            out.append(value)
        at = _skip(text, at)
        if text.startswith(close, at):
            return out, at + 1
        if not text.startswith(",", at):
            raise ValueError("items not separated by commas")
        at = _skip(text, at + 1)


def _gemma_key(text: str, at: int) -> tuple[str, int]:
    if text.startswith((GEMMA_STRING, '"'), at):
        key, at = _gemma_value(text, at)
        if isinstance(key, str):
            return key, at
        raise ValueError("a key that is not text")
    match = GEMMA_KEY.match(text, at)
    if not match:
        raise ValueError("no key")
    return match.group(), match.end()


ParseCall = Callable[[str], Optional[dict]]  # a call block's body -> the call, None when it does not parse
# the formats whose calls stand between an opening and a closing tag in the answer, and their body parsers
TAGGED: dict[str, tuple[str, str, ParseCall]] = {"hermes": (HERMES_OPEN, HERMES_CLOSE, parse_hermes_block),
                                                 "gemma4": (GEMMA_CALL_OPEN, GEMMA_CALL_CLOSE, parse_gemma_call)}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolOutput:
    """What one piece of content gives: text to send now, and calls completed in it."""

    text: str = ""
    calls: list[dict] = field(default_factory=list)


class ToolCallParser:
    """Content text as it streams -> text and completed tool calls. Text that may be the start of a call
    is held back; a call that never completes or does not parse is given back as text at the end."""

    raw = False  # it reads the content after the reasoning split

    def __init__(self, fmt: str, opening: str = ""):
        self.fmt = fmt
        self.parse: Optional[ParseCall]
        self.open, self.close, self.parse = TAGGED.get(fmt, ("", "", None))
        self.buffer = opening  # a forced opening is part of the answer the model continues
        self.inside = bool(opening) and fmt in TAGGED
        self.whole = bool(opening) and fmt == "llama3_json"
        self.started = False  # any content seen (Llama calls are the whole answer)
        self.calls = 0

    def _call(self, call: dict) -> dict:
        self.calls += 1
        return {"id": new_call_id(), **call}

    def add(self, text: str) -> ToolOutput:
        out = ToolOutput()
        if not text:
            return out
        if self.fmt == "llama3_json":
            if self.whole:
                self.buffer += text
                return out
            if not self.started:
                stripped = (self.buffer + text).lstrip()
                if not stripped:
                    self.buffer += text
                    return out
                self.started = True
                if stripped.startswith("{") or stripped.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(stripped):
                    self.whole = True
                    self.buffer += text
                    return out
                out.text, self.buffer = self.buffer + text, ""
                return out
            out.text = text
            return out
        self.buffer += text
        while True:
            if self.inside:
                end = self.buffer.find(self.close)
                if end < 0:
                    return out
                body = self.buffer[len(self.open):end] if self.buffer.startswith(self.open) else self.buffer[:end]
                assert self.parse is not None  # only a tagged format gets here: llama3_json returned above
                call = self.parse(body)
                if call is None:  # malformed: the block goes out as text
                    out.text += self.buffer[:end + len(self.close)]
                else:
                    out.calls.append(self._call(call))
                self.buffer = self.buffer[end + len(self.close):]
                self.inside = False
                continue
            start = self.buffer.find(self.open)
            if start >= 0:
                out.text += self.buffer[:start]
                self.buffer = self.buffer[start:]
                self.inside = True
                continue
            keep = 0
            for n in range(min(len(self.open) - 1, len(self.buffer)), 0, -1):
                if self.buffer.endswith(self.open[:n]):
                    keep = n
                    break
            cut = len(self.buffer) - keep
            out.text += self.buffer[:cut]
            self.buffer = self.buffer[cut:]
            return out

    def flush(self) -> ToolOutput:
        """The end of the answer: a Llama call is parsed whole; anything left unparsed is text."""
        out = ToolOutput()
        if self.fmt == "llama3_json" and self.whole:
            calls = parse_llama_json(self.buffer)
            if calls is not None:
                out.calls = [self._call(c) for c in calls]
            else:
                out.text = self.buffer
        else:
            out.text = self.buffer
        self.buffer = ""
        self.inside = False
        return out


class HarmonyCallParser:
    """harmony's calls from the raw reply as it streams: a message to `functions.NAME` is a call once it
    ends (at `<|end|>`, at the next `<|start|>`, or at the end of the reply, where `<|call|>` stopped it). Its
    body must be a JSON object; one that is not comes back as text. Other messages give nothing here (the
    reasoning split sends the thinking and the answer)."""

    raw = True  # it reads the reply as generated, every channel

    def __init__(self, opening: str = ""):
        self.text = opening  # a forced call's header is part of the reply the model continues
        self.done = 0  # messages handled

    def add(self, text: str) -> ToolOutput:
        self.text += text
        return self._take(end=False)

    def flush(self) -> ToolOutput:
        return self._take(end=True)

    def _take(self, end: bool) -> ToolOutput:
        out = ToolOutput()
        for message in HARMONY.messages(self.text)[self.done:]:
            if not (message["closed"] or end):
                break
            self.done += 1
            recipient = message["recipient"] or ""
            if not recipient.startswith("functions."):
                continue
            body = self.text[message["start"]:message["end"]].strip()
            call = _call(recipient[len("functions."):], body or "{}")
            if call is None:
                out.text += body
            else:
                out.calls.append({"id": new_call_id(), **call})
        return out


def parser_for(fmt: str, opening: str = ""):
    """The streaming parser of a tool-call format (`raw`: it reads the reply before the reasoning split)."""
    return HarmonyCallParser(opening) if fmt == "harmony" else ToolCallParser(fmt, opening)


def parse_text(fmt: str, text: str) -> tuple[str, list[dict]]:
    """A whole answer -> (content, calls): the non-streaming path and `dflash generate --tools`. A `raw`
    format's text is the whole reply and its content only what did not parse."""
    parser = parser_for(fmt)
    first, last = parser.add(text), parser.flush()
    return (first.text + last.text).strip() if first.calls or last.calls else first.text + last.text, \
        first.calls + last.calls


def wire_call(call: dict, index: int) -> dict:
    """An OpenAI `tool_calls` entry."""
    return {"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}


def load_tools_file(path: str) -> list[dict]:
    """`dflash generate --tools FILE.json`: a list of OpenAI tools (or {"tools": [...]})."""
    try:
        data = parse_json(read_regular(Path(path)))  # a FIFO or a device (/dev/zero) is refused, not read
    except OSError as exc:
        raise UserError(printable(f"The tools file {path} cannot be read ({exc.strerror}); point --tools at a "
                                  "JSON file.")) from None
    except ValueError as exc:
        raise UserError(f"The tools file {printable(path)} cannot be read as JSON ({printable(str(exc))}); write a "
                        'list of tools ([{"type": "function", "function": {"name": ...}}]).') from None
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    if not isinstance(data, list):
        raise UserError(f"The tools file {printable(path)} must hold a list of tools "
                        '([{"type": "function", "function": {"name": ..., "parameters": {...}}}]).')
    out = []
    for i, tool in enumerate(data):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise UserError(f"Tool {i} in {printable(path)} has no function name.")
        out.append({"type": "function", "function": fn})
    return out
