"""The structured-output fields of a request, in every form clients send, read into one `Constraint`
(engines/guided.py): OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs`
(`json`, `regex`, `choice`, `grammar`, `json_object`) and the older `guided_json`, `guided_regex`,
`guided_choice` and `guided_grammar`. At most one of them per request; each refused in one sentence naming
its field (a 400) when it is malformed or llguidance cannot compile it."""

from __future__ import annotations

import json
from typing import Any, Optional

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.guided import Constraint

ANY_OBJECT = {"type": "object"}  # json_object: any JSON object
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
STRUCTURED = ("json", "regex", "choice", "grammar", "json_object")


def request_constraint(body: dict) -> Optional[Constraint]:
    """The request's constraint, or None for free text. Raises UserError naming the field."""
    found = []
    fmt = body.get("response_format")
    if fmt is not None:
        constraint = _response_format(fmt)
        if constraint is not None:
            found.append(constraint)
    if body.get("structured_outputs") is not None:
        found.append(_structured_outputs(body["structured_outputs"]))
    for key, kind in GUIDED.items():
        if body.get(key) is not None:
            found.append(_constraint(kind, body[key], key))
    if len(found) > 1:
        raise UserError(f"{found[0].field} and {found[1].field} both constrain the output; send one of them.")
    if not found:
        return None
    found[0].check()
    return found[0]


def _response_format(fmt: Any) -> Optional[Constraint]:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json", ANY_OBJECT, "response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise UserError("response_format.json_schema must be {name, schema, strict}, its schema a JSON object.")
        return Constraint("json", spec.get("schema") or ANY_OBJECT, "response_format.json_schema")
    raise UserError(f"response_format type {kind!r} is not one of text, json_object or json_schema.")


def _structured_outputs(spec: Any) -> Constraint:
    if not isinstance(spec, dict):
        raise UserError("structured_outputs must be an object with one of json, regex, choice, grammar or json_object.")
    given = [key for key in STRUCTURED if spec.get(key) not in (None, False)]
    if len(given) != 1:
        raise UserError("structured_outputs must set exactly one of json, regex, choice, grammar or json_object; "
                        f"it sets {', '.join(given) or 'none'}.")
    key = given[0]
    if key == "json_object":
        return Constraint("json", ANY_OBJECT, "structured_outputs.json_object")
    return _constraint(key, spec[key], f"structured_outputs.{key}")


def _constraint(kind: str, value: Any, field: str) -> Constraint:
    """A JSON schema may come as an object or as its text (vLLM takes both)."""
    if kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise UserError(f"{field} is neither a JSON schema object nor its JSON text.") from None
    return Constraint(kind, value, field)
