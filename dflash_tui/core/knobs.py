"""The chat's settings as a person types them: "temperature 0.7", "top_k 20", "min_p 0.05", "max_new_tokens
512", "seed 7", "block 3", "draft demo/draft2". One parser for every front end (the TUI's palette, the REPL),
so a setting is spelled and refused the same way everywhere. Each value is checked by the rules a request
itself is checked by (`GenerationRequest`, `check_block_size_value`), so a value taken here is one the engines
take, and a refused one is one sentence before any turn runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from dflash_tui.engines.config import GenerationRequest, check_block_size_value
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import printable

Value = Union[int, float, str, None]
DEFAULT_WORDS = ("default", "model default")  # a sampling knob back to the target's generation_config


@dataclass(frozen=True)
class Knob:
    """One setting a person can type: the `ChatSettings` field it sets ("draft": the front end reloads)."""

    name: str
    spelled: str  # the names it is typed as, a regular expression (any case)
    kind: type  # int, float or str
    example: str  # a line that sets it, for the sentence that refuses a value
    default: bool = False  # takes "default": the target's generation_config decides (None)

    def __str__(self) -> str:
        return self.name


KNOBS = (
    Knob("temperature", r"temp(?:erature)?", float, "temperature 0.7 (0 is greedy)", default=True),
    Knob("top_p", r"top[ _-]?p", float, "top_p 0.9", default=True),
    Knob("top_k", r"top[ _-]?k", int, "top_k 20 (0 is off)", default=True),
    Knob("min_p", r"min[ _-]?p", float, "min_p 0.05 (0 is off)", default=True),
    Knob("max_new_tokens", r"max(?:[ _-]?new)?[ _-]?tokens", int, "max_new_tokens 512"),
    Knob("seed", r"seed", int, "seed 7"),
    Knob("block_size", r"block(?:[ _-]?size)?", int, "block 4 (1 is the target alone)"),
    Knob("draft", r"draft", str, "draft NAME (one of the profile's drafts)"),
)
KNOB = {knob.name: knob for knob in KNOBS}
# the knob's name, then a space, ":" or "=", then the value: "top_k 20", "temp=0.7", "Block size: 3"
TYPED = re.compile(r"^\s*(?:" + "|".join(f"(?P<{k.name}>{k.spelled})" for k in KNOBS) + r")(?:\s*[:=]\s*|\s+)"
                   r"(?P<value>\S.*?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Setting:
    """A knob and a value it takes; None: the target's generation_config decides (sampling knobs only)."""

    knob: Knob
    value: Value

    @property
    def name(self) -> str:
        return self.knob.name

    def __str__(self) -> str:
        """'top_k 20', 'temperature 0.7', 'top_p model default': how a confirmation names it."""
        value = self.value
        return f"{self.name} {'model default' if value is None else f'{value:g}' if isinstance(value, float) else value}"


def parse_setting(text: str, drafts: Sequence[str] = ()) -> Optional[Setting]:
    """The setting `text` types ("top_k 20", "temp=0.7", "Block size: 3"), or None when it names no knob with a
    value. A value the knob cannot take raises UserError, one sentence saying what it takes. `drafts` is the
    profile's list the draft is chosen from."""
    match = TYPED.match(text)
    if not match:
        return None
    knob = next(k for k in KNOBS if match.group(k.name) is not None)
    return Setting(knob, _value(knob, match.group("value"), drafts))


def _value(knob: Knob, raw: str, drafts: Sequence[str]) -> Value:
    if knob.kind is str:
        return _draft(raw, drafts)
    if knob.default and raw.lower() in DEFAULT_WORDS:
        return None
    try:
        value = knob.kind(raw)
    except ValueError:
        whole = "a whole number" if knob.kind is int else "a number"
        also = " or default" if knob.default else ""
        raise UserError(printable(f"{knob} takes {whole}{also}, such as {knob.example}, not {raw!r}.")) from None
    if knob.name == "block_size":
        check_block_size_value(value, "for this chat")
    else:
        GenerationRequest(**{knob.name: value})  # the engines' own bounds, and their sentence
    return value


def _draft(raw: str, drafts: Sequence[str]) -> str:
    """One of `drafts` as the profile lists it, named in full or by its last part ("draft2" for demo/draft2)."""
    if len(drafts) < 2:
        raise UserError('There is no other draft to switch to here: a profile lists them in its [model] table as '
                        'drafts = ["…", "…"], and a server runs its own.')
    for draft in drafts:
        if raw in (draft, Path(draft).name):
            return draft
    raise UserError(printable(f"Draft {raw!r} is not one of this profile's drafts ({', '.join(drafts)})."))
