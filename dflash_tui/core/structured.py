"""The structured-output flags a person types (`generate --json-schema FILE / --regex / --choice`, the REPL's
`/json FILE`) read into one `Constraint` (engines/guided.py), each refused in one sentence naming the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from dflash_tui.core.sessions import read_regular
from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.guided import Constraint
from dflash_tui.engines.text import printable


def schema_constraint(path: str, flag: str) -> Constraint:
    """The JSON schema in the file at `path`, checked."""
    try:
        schema = parse_json(read_regular(Path(path)))  # a FIFO or a device is refused, not read
    except OSError as exc:
        raise UserError(printable(f"The schema file {path} cannot be read ({exc.strerror}); point {flag} at a JSON "
                                  "schema file.")) from None
    except ValueError as exc:
        raise UserError(printable(f"The schema file {path} is not JSON ({exc}); {flag} takes a JSON schema.")) from None
    constraint = Constraint("json", schema, flag)
    constraint.check()
    return constraint


def flags_constraint(json_schema: Optional[str], regex: Optional[str], choice: Optional[str]) -> Optional[Constraint]:
    """At most one of `generate`'s three flags, checked before anything loads."""
    given = [flag for flag, value in (("--json-schema", json_schema), ("--regex", regex), ("--choice", choice))
             if value is not None]
    if len(given) > 1:
        raise UserError(f"{' and '.join(given)} each constrain the whole answer; give one of them.")
    if json_schema is not None:
        return schema_constraint(json_schema, "--json-schema")
    if regex is not None:
        constraint = Constraint("regex", regex, "--regex")
    elif choice is not None:
        constraint = Constraint("choice", [c.strip() for c in choice.split(",") if c.strip()], "--choice")
    else:
        return None
    constraint.check()
    return constraint
