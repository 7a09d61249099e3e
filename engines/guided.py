"""Structured outputs: a request's constraint (a JSON schema, a regex, a choice or a grammar) compiled by
llguidance, and the `Guide` that walks it along a drafted block (docs/structured-outputs.md).

The rule that keeps DFlash lossless under a constraint: at every verified position the target's logits are
masked with the grammar's mask *at that position*, i.e. after the drafted tokens before it. The target then
picks (or samples) only what the grammar allows there, acceptance runs as usual, and the grammar is rolled
back over what was rejected. At T = 0 that gives exactly the constrained target's own greedy ids at block 1;
at T > 0 the constrained target's distribution. The draft is steered by the same masks (DFlash 1's argmax,
DFlash 2's walk over its candidates), which only raises acceptance: a drafted token the grammar forbids could
never be accepted.

With thinking on, the reasoning is free and the constraint starts after the format's end-of-reasoning marker
(Qwen3's `</think>`, harmony's final channel, Gemma 4's closed thought channel); the whitespace a model writes
right after it is let through. With thinking off it starts at the first token.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import one_line

if TYPE_CHECKING:
    import numpy as np

KINDS = ("json", "regex", "choice", "grammar")
# Whitespace the JSON grammar allows between tokens: what models write (`{"a": 1}`, or indented JSON: a
# newline and up to 16 spaces), never an endless run (a small model masked into whitespace loops there).
JSON_WHITESPACE = r"(?:\n {0,16}| )?"
# Whitespace-only tokens let through between the reasoning and the answer (Qwen3 writes "\n\n" there); more
# would let a model that wants to say something the grammar forbids fill its answer with spaces.
OPENING_BLANKS = 2
CACHED_GRAMMARS = 64  # compiled grammars kept per process (a server sees the same schema again and again)
INSTALL = "pip install llguidance (the cuda and mlx extras bring it)"


@dataclass(frozen=True)
class Constraint:
    """What the output must match. `kind` json (`value` a JSON schema, closed as vLLM closes it: `closed`;
    {"type": "object"} for any object),
    regex (a pattern, matched whole), choice (a list of strings, one of which is the whole output) or grammar
    (Lark, or GBNF as vLLM takes it). `field` names where the user wrote it, for the one sentence a bad one
    gets (a server's request field, a CLI flag). `after_reasoning`: with thinking on, the constraint starts
    after the reasoning (a forced tool call's starts at once: its opening already left the reasoning out)."""

    kind: str
    value: Any
    field: str = "constraint"
    after_reasoning: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"{self.field}: constraint kind {self.kind!r} is not one of {', '.join(KINDS)}.")
        if self.kind == "choice" and (not isinstance(self.value, (list, tuple)) or not self.value
                                      or not all(isinstance(c, str) and c for c in self.value)):
            raise UserError(f"{self.field} must be a non-empty list of non-empty strings.")
        if self.kind in ("regex", "grammar") and (not isinstance(self.value, str) or not self.value.strip()):
            raise UserError(f"{self.field} must be a non-empty {'pattern' if self.kind == 'regex' else 'grammar'}.")
        if self.kind == "json" and not isinstance(self.value, (dict, bool)):
            raise UserError(f"{self.field} must be a JSON schema (an object).")

    def to_dict(self) -> dict:
        """As a session records it (with the turn's settings), so that a replay constrains the same way."""
        return {"kind": self.kind, "value": self.value, "field": self.field, "after_reasoning": self.after_reasoning}

    @classmethod
    def from_dict(cls, data: dict) -> "Constraint":
        """`to_dict`'s record back (a hand-edited one refused in one sentence, as the constructor does)."""
        if not isinstance(data, dict) or "kind" not in data or "value" not in data:
            raise UserError("A recorded constraint needs its kind and value.")
        return cls(data["kind"], data["value"], str(data.get("field", "constraint")),
                   bool(data.get("after_reasoning", True)))

    def check(self) -> None:
        """One sentence naming the field when llguidance cannot compile this constraint (before any engine
        work: a server answers 400)."""
        error = _llguidance().LLMatcher.validate_grammar(self.grammar())
        if error:
            raise UserError(f"{self.field} cannot be compiled: {one_line(error)[:300]}")

    def grammar(self) -> str:
        """The llguidance grammar (its JSON form) this constraint stands for."""
        LLMatcher = _llguidance().LLMatcher
        if self.kind == "json":
            try:
                return LLMatcher.grammar_from_json_schema(closed(self.value),
                                                          defaults={"whitespace_pattern": JSON_WHITESPACE})
            except ValueError as e:
                raise UserError(f"{self.field} is not a JSON schema llguidance reads: {one_line(str(e))[:300]}") from None
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            return LLMatcher.grammar_from_lark("start: " + " | ".join(lark_string(c) for c in self.value))
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(self.value)
        except Exception as e:  # noqa: BLE001 - the converter's own error types; one sentence either way
            raise UserError(f"{self.field} is not a grammar llguidance reads (Lark or GBNF): {one_line(str(e))[:300]}") from None
        return LLMatcher.grammar_from_lark(lark)


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that lists its properties and does
    not say otherwise: vLLM's default (xgrammar's strict mode), and what a client that sends a schema means
    (a small model left free to add keys writes junk keys until max_tokens)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k not in ("const", "enum", "default", "examples") else v for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def lark_string(text: str) -> str:
    """A Lark string literal for `text` exactly."""
    return json.dumps(text, ensure_ascii=False)


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401 - from_tokenizer
    except ImportError:
        raise UserError(f"Structured outputs need llguidance, which is not installed: {INSTALL}.") from None
    return llguidance


class Grammars:
    """Compiled matchers per tokenizer: llguidance's tokenizer view (built once, its vocabulary sized to the
    target's logit rows, its eos the request's stop ids) and, per grammar, a matcher kept compiled and copied
    for each request (`deep_copy`), so a schema a server sees again is not compiled again."""

    def __init__(self, tokenizer, vocab_rows: int):
        self.tokenizer, self.vocab_rows = tokenizer, vocab_rows
        self._tokenizers: dict[tuple, Any] = {}
        self._matchers: OrderedDict[tuple, Any] = OrderedDict()
        self._blank: Optional[np.ndarray] = None

    def ll_tokenizer(self, stops: tuple[int, ...]):
        if stops not in self._tokenizers:
            self._tokenizers[stops] = _llguidance().hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_rows,
                                                                       eos_token=list(stops))
        return self._tokenizers[stops]

    def matcher(self, constraint: Constraint, stops: tuple[int, ...]):
        """A fresh matcher for `constraint`, or one sentence naming its field when llguidance refuses it."""
        grammar = constraint.grammar()
        key = (grammar, stops)
        if key not in self._matchers:
            llg = _llguidance()
            tokenizer = self.ll_tokenizer(stops)
            error = llg.LLMatcher.validate_grammar(grammar, tokenizer)
            if error:
                raise UserError(f"{constraint.field} cannot be compiled: {one_line(error)[:300]}")
            matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
            if matcher.is_error():
                raise UserError(f"{constraint.field} cannot be compiled: {one_line(matcher.get_error())[:300]}")
            self._matchers[key] = matcher
            while len(self._matchers) > CACHED_GRAMMARS:
                self._matchers.popitem(last=False)
        self._matchers.move_to_end(key)
        return self._matchers[key].deep_copy()

    def blank(self, stops: tuple[int, ...]) -> np.ndarray:
        """Which ids are whitespace only (let through between the end of reasoning and the constrained answer)."""
        if self._blank is None:
            import numpy as np

            tokenizer = self.ll_tokenizer(stops)
            rows = np.zeros(self.vocab_rows, dtype=bool)
            for i in range(min(self.vocab_rows, tokenizer.vocab_size)):
                if not tokenizer.is_special_token(i):
                    text = tokenizer.decode_bytes([i])
                    rows[i] = bool(text) and not text.strip()
            self._blank = rows
        return self._blank

    def guide(self, constraint: Constraint, stops: list[int], answer_marker: Optional[list[int]]) -> "Guide":
        """The per-request walker. `answer_marker`: the ids that end the reasoning (None: thinking off, the
        constraint starts at once)."""
        ids = tuple(sorted(set(stops)))
        return Guide(self.matcher(constraint, ids), self.vocab_rows, answer_marker,
                     self.blank(ids) if answer_marker else None)


# Where a guide stands: free reasoning; after the reasoning, before the answer's first non-blank token; in it.
REASONING, OPENING, ANSWER = "reasoning", "opening", "answer"


class Guide:
    """One request's grammar state, walked along the tokens the loop commits and, inside a step, along a
    drafted block: the draft asks `allowed()` at each slot and reports its pick with `picked`, `rows()` gives
    the target's masks along the block, and `settle` then keeps what the target accepted and undoes the
    rest. A mask is a bool array over the target's vocabulary rows, or None where anything goes (the
    reasoning)."""

    def __init__(self, matcher, vocab_rows: int, marker: Optional[list[int]], blank: Optional["np.ndarray"]):
        self.matcher, self.vocab_rows = matcher, vocab_rows
        self.marker, self.blank = marker, blank
        self.phase = REASONING if marker else ANSWER
        self.recent: list[int] = []  # the last ids of the reasoning (to spot the marker), then the blanks after it
        self._undo: list[tuple[str, list[int], bool]] = []  # per speculative push: phase, recent, consumed
        self._dead = False  # a pick the grammar refused: nothing after it in this block can be accepted
        self.block: list[Optional[np.ndarray]] = []  # this block's masks so far, one per position
        self.seen = 0  # this block's picks so far
        self.seconds = 0.0  # time spent here (Summary.grammar_s): what a constraint costs a request

    def row(self) -> Optional["np.ndarray"]:
        """The mask at the current state."""
        import numpy as np

        if self.phase == REASONING:
            return None
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.vocab_rows].astype(bool)
        if self.phase == OPENING and self.blank is not None and len(self.recent) < OPENING_BLANKS:
            allowed |= self.blank
        return allowed

    def allowed(self) -> Optional["np.ndarray"]:
        """The mask at the block's next position (after a refused pick: the one before it again)."""
        started = time.perf_counter()
        mask = self.block[-1] if self._dead and self.block else self.row()
        self.block.append(mask)
        self.seconds += time.perf_counter() - started
        return mask

    def picked(self, token: int) -> None:
        """The block's next token: advance over it (speculatively, until `settle`)."""
        started = time.perf_counter()
        self.seen += 1
        if not self._dead and not self._push(token):
            self._dead = True
        self.seconds += time.perf_counter() - started

    def rows(self) -> list[Optional["np.ndarray"]]:
        """The masks at every position of the block drafted so far, [last, *picks]: position i after the
        block's first i picks."""
        self.allowed()
        return self.block

    def settle(self, kept: int, token: int) -> None:
        """The target kept the block's first `kept` picks, then wrote `token`: undo the other picks and
        advance over `token` for good."""
        started = time.perf_counter()
        while len(self._undo) > kept:
            phase, recent, consumed = self._undo.pop()
            if consumed:
                self.matcher.rollback(1)
            self.phase, self.recent = phase, recent
        self._push(token)
        self._undo.clear()
        self._dead, self.block, self.seen = False, [], 0
        self.seconds += time.perf_counter() - started

    def _push(self, token: int) -> bool:
        """Advance over `token`; False (and no change) when the grammar does not allow it."""
        before = (self.phase, list(self.recent))
        consumed = False
        if self.phase == REASONING:
            marker = self.marker or []
            self.recent = (self.recent + [token])[-len(marker):]
            if self.recent == marker:
                self.phase, self.recent = OPENING, []
        elif self.phase == OPENING and self.blank is not None and self.blank[token] \
                and len(self.recent) < OPENING_BLANKS and not self.matcher.validate_tokens([token]):
            self.recent = self.recent + [token]  # whitespace between the reasoning and the answer
        elif self.matcher.validate_tokens([token]) != 1:
            return False  # (consuming a refused token would leave the matcher in its error state for good)
        else:
            self.matcher.consume_token(token)
            consumed, self.phase = True, ANSWER
        self._undo.append((before[0], before[1], consumed))
        return True


def stack_rows(rows: list[Optional["np.ndarray"]], vocab_rows: int) -> Optional["np.ndarray"]:
    """Rows as one bool array [n, vocab] (a free row allows everything); None when every row is free."""
    import numpy as np

    if all(r is None for r in rows):
        return None
    return np.stack([np.ones(vocab_rows, dtype=bool) if r is None else r for r in rows])

