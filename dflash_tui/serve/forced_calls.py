"""A forced `tool_choice` (`required`, or one named function) as a grammar over the offered tools, in the
call format the chat template writes (serve/tools.py parses the same formats back):

- `hermes` JSON (Qwen3): `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, ARGS matching the
  tool's parameter schema; several calls, one per line, for `required`;
- `hermes` XML (Qwen3-Coder, a template that writes `<function=`): `<tool_call>\\n<function=NAME>\\n` then
  `<parameter=KEY>\\nVALUE\\n</parameter>\\n` per parameter (KEY one of the tool's, VALUE free text without
  `<`: its closing newline is part of it), then `</function>\\n</tool_call>`;
- `llama3_json` (Llama 3.1): `{"name": NAME, "parameters": ARGS}`;
- `harmony` (gpt-oss): after the forced opening `<|channel|>commentary to=functions.`, `NAME <|constrain|>json
  <|message|>` and ARGS (a named call's opening already holds its header: ARGS alone);
- `gemma4` (Gemma 4): `<|tool_call>call:NAME{KEY:VALUE,...}<tool_call|>`, KEY one of the tool's parameters,
  VALUE in the template's own syntax (strings between `<|"|>`, numbers, true, false, null, objects, lists).

The schema of a tool without `parameters` is any object. The constraint starts at once: the forced call
leaves the reasoning out, as the forced opening did before there were grammars.
"""

from __future__ import annotations

import json
from typing import Any

from dflash_tui.engines.guided import Constraint, closed, lark_string
from dflash_tui.engines.reasoning import GEMMA_CALL_CLOSE, GEMMA_CALL_OPEN, GEMMA_STRING

FIELD = "tool_choice"
# A call's JSON as the templates write it (`{"name": "f", "arguments": {"a": 1}}`): at most a space between
# tokens, so a weak model cannot spend its max_tokens on whitespace inside a call.
CALL_JSON = {"whitespace_pattern": " ?"}


def call_constraint(fmt: str, tools: list[dict], choice: Any, xml: bool = False) -> Constraint:
    """The grammar of the calls `choice` ("required" or {type: function, function: {name}}) allows."""
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    offered = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if fmt == "hermes" and xml:
        lark = _hermes_xml(offered, many=name is None)
    elif fmt == "hermes":
        lark = _rules("start: call (\"\\n\" call)*" if name is None else "start: call",
                      'call: "<tool_call>\\n" body "\\n</tool_call>"',
                      "body: " + _json(_any_call(offered, "arguments")))
    elif fmt == "llama3_json":
        lark = "start: " + _json(_any_call(offered, "parameters"))
    elif fmt == "harmony":
        if name is not None:  # the opening holds the whole header
            lark = "start: " + _json(_parameters(offered[0]))
        else:
            lark = _rules("start: " + " | ".join(f"call{i}" for i in range(len(offered))),
                          *(f'call{i}: {lark_string(fn["name"] + " ")} <|constrain|> "json" <|message|> args{i}\n'
                            f"args{i}: {_json(_parameters(fn))}" for i, fn in enumerate(offered)))
    else:  # gemma4
        lark = _gemma(offered, many=name is None)
    return Constraint("grammar", lark, FIELD, after_reasoning=False)


def _rules(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def _parameters(fn: dict) -> dict:
    params = fn.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def _json(schema: dict) -> str:
    """A Lark `%json` rule body: `schema` with the call's whitespace (llguidance reads `x-guidance`)."""
    return "%json " + json.dumps({**closed(schema), "x-guidance": CALL_JSON})


def _any_call(offered: list[dict], key: str) -> dict:
    """The JSON schema of one call object {"name": NAME, key: ARGS} to any of `offered`."""
    calls = [{"type": "object", "properties": {"name": {"const": fn["name"]}, key: _parameters(fn)},
              "required": ["name", key], "additionalProperties": False} for fn in offered]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def _keys(fn: dict) -> list[str]:
    props = _parameters(fn).get("properties")
    return list(props) if isinstance(props, dict) else []


def _alternatives(words: list[str]) -> str:
    return " | ".join(lark_string(w) for w in words) if words else '""'


def _hermes_xml(offered: list[dict], many: bool) -> str:
    lines = ['start: call ("\\n" call)*' if many else "start: call",
             "call: " + " | ".join(f"fn{i}" for i in range(len(offered))),
             "VALUE: /[^<]*/"]
    for i, fn in enumerate(offered):
        head = lark_string(f"<tool_call>\n<function={fn['name']}>\n")
        keys = _keys(fn)
        lines.append(f'fn{i}: {head} param{i}* "</function>\\n</tool_call>"')
        # VALUE takes the newline before `</parameter>` too (one lexeme: `[^<]*` would swallow it anyway)
        lines.append(f'param{i}: "<parameter=" ({_alternatives(keys)}) ">\\n" VALUE "</parameter>\\n"'
                     if keys else f'param{i}: "<parameter=" /[^>]+/ ">\\n" VALUE "</parameter>\\n"')
    return _rules(*lines)


def _gemma(offered: list[dict], many: bool) -> str:
    string = f"/{_regex_literal(GEMMA_STRING)}[^<]*{_regex_literal(GEMMA_STRING)}/"
    lines = ["start: call call*" if many else "start: call",
             "call: " + " | ".join(f"fn{i}" for i in range(len(offered))),
             'value: STRING | NUMBER | "true" | "false" | "null" | "{" (any_pair ("," any_pair)*)? "}"'
             ' | "[" (value ("," value)*)? "]"',
             'any_pair: /[A-Za-z_][A-Za-z0-9_.-]*/ ":" value',
             f"STRING: {string}",
             "NUMBER: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/"]
    for i, fn in enumerate(offered):
        head = lark_string(f"{GEMMA_CALL_OPEN}call:{fn['name']}{{")
        keys = _keys(fn)
        pair = f"({_alternatives(keys)}) \":\" value" if keys else "any_pair"
        lines.append(f"fn{i}: {head} (pair{i} (\",\" pair{i})*)? {lark_string('}' + GEMMA_CALL_CLOSE)}")
        lines.append(f"pair{i}: {pair}")
    return _rules(*lines)


def _regex_literal(text: str) -> str:
    """`text` inside a Lark /regex/ (Rust's syntax: `<` and `>` must stay bare, they are word boundaries
    escaped)."""
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}/-#&~" else c for c in text)
