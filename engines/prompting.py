"""Turning a request into prompt ids with the target's own tokenizer and chat template.

transformers is used for the tokenizer only (both engines need it; it pulls in no torch here).

A chat template is code from the checkpoint. transformers renders it in Jinja's immutable sandbox, which
stops attribute escapes but not work: a nested loop, `range(10**9)` or `'x' * 10**11` would hang or
exhaust memory. `bound_templates()` has transformers compile every chat template in this process with
`BoundedEnvironment` instead: the same sandbox, plus a budget per render (steps, seconds, characters of
output and of any one value), no include/import/extends, and sizes checked before a string is
multiplied, formatted, indented, tab-expanded or given a replacement. No thread is involved: the budget
is counted in the render's own calls, loop iterations and output chunks. Any failure of a template is
one UserError naming its file.
"""

from __future__ import annotations

import functools
import os
import re
import string
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dflash_tui.engines.config import GenerationRequest
from dflash_tui.engines.errors import UserError, describe
from dflash_tui.engines.reasoning import format_of, show_markers, template_kwargs
from dflash_tui.engines.text import printable


@dataclass
class RenderLimits:
    """What one render of a chat template may use. Real templates take a few hundred steps per message
    and render in milliseconds; these are far beyond that and far below a hang."""

    steps: int = 2_000_000  # calls, attribute and item reads, operators, loop iterations, output chunks
    seconds: float = 5.0
    chars: int = 16 * 2**20  # the output, and any one string or list made while rendering


LIMITS = RenderLimits()


class TemplateLimitError(Exception):
    """A chat template went past its render budget (RenderLimits)."""


_state = threading.local()


class _Budget:
    def __init__(self, limits: RenderLimits):
        self.limits = limits
        self.steps = 0
        self.chars = 0
        self.deadline = time.monotonic() + limits.seconds

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.limits.steps:
            raise TemplateLimitError(f"it ran past its limit of {self.limits.steps:,} steps (a loop that never ends?)")
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"it ran past its limit of {self.limits.seconds:g} seconds")

    def size(self, n: int, what: str = "a value") -> None:
        if n > self.limits.chars:
            raise TemplateLimitError(f"it made {what} of {n:,} characters or items, past its limit of "
                                     f"{self.limits.chars:,}")

    def output(self, n: int) -> None:
        self.tick()
        self.chars += n
        self.size(self.chars, "output")


def _budget() -> _Budget:
    budget = getattr(_state, "budget", None)
    if budget is None:  # a render outside BoundedTemplate (e.g. a library's own use): a fresh budget each time
        budget = _Budget(LIMITS)
    return budget


_PERCENT_SPEC = re.compile(r"%[#0\- +]*(\d*)(?:\.(\d*))?")


def _check_format(fmt: str) -> None:
    """A %- or {}-format string whose widths or precisions would build a huge string is refused first."""
    numbers = [n for m in _PERCENT_SPEC.finditer(fmt) for n in m.groups() if n]
    try:
        numbers += [n for _, _, spec, _ in string.Formatter().parse(fmt) if spec for n in re.findall(r"\d+", spec)]
    except ValueError:
        pass
    for n in numbers:
        if len(n) > 9 or int(n) > _budget().limits.chars:
            raise TemplateLimitError(f"it formats with a width of {n}, past its limit of {_budget().limits.chars:,}")


def _check_numbers(values) -> None:
    """No argument asks for more characters than a render may make (center(10**11), indent(10**11))."""
    limit = _budget().limits.chars
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise TemplateLimitError(f"it passes the number {value:.3g}, past its limit of {limit:,}")


def _whole(value, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _check_growth(name: str, text, args: tuple, kwargs: dict) -> None:
    """A call on `text` whose result grows with the product of its arguments is charged that size before it
    runs: indent (the width on every line), expandtabs (the tab size for every tab), replace (the new text
    for every match), join (the separator between every two items: the filter's `d`, or the string whose
    method it is). Each argument alone is within the budget; one such call made 10**10 characters."""
    def arg(i: int, key: str, default=None):
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "join":  # the filter: join(items, d); the method: sep.join(items)
        items, sep = (arg(0, "iterable"), text) if isinstance(text, str) else (text, arg(0, "d", ""))
        if not isinstance(sep, str) or not isinstance(items, (list, tuple, str)):
            return
        _budget().size(len(sep) * max(len(items) - 1, 0), "a value (join)")
        return
    if not isinstance(text, str):
        return
    if name == "indent":
        width = arg(0, "width", 4)
        added = (len(width) if isinstance(width, str) else _whole(width)) * (text.count("\n") + 1)
    elif name == "expandtabs":
        added = _whole(arg(0, "tabsize", 8)) * text.count("\t")
    elif name == "replace" and isinstance(arg(0, "old"), str) and isinstance(arg(1, "new"), str):
        matches = text.count(arg(0, "old"))
        count = _whole(arg(2, "count"), -1)
        added = len(arg(1, "new")) * (matches if count < 0 else min(count, matches))
    else:
        return
    _budget().size(len(text) + added, f"a value ({name})")


def _sized(value) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set)) else 0


def _budgeted_filter(name: str, fn):
    @functools.wraps(fn)  # keeps jinja's pass_context & co.
    def run(*args, **kwargs):
        budget = _budget()
        budget.tick()
        _check_numbers([*args, *kwargs.values()])
        values = args[1:] if getattr(fn, "jinja_pass_arg", None) else args  # past jinja's context argument
        if values:
            _check_growth(name, values[0], values[1:], kwargs)
        if name == "format":
            _check_format(next((a for a in args if isinstance(a, str)), ""))
        result = fn(*args, **kwargs)
        budget.size(_sized(result))
        return result

    return run


def _iterate(value):
    """Every loop's iterable goes through this (BoundedEnvironment._parse): one step per iteration."""
    budget = _budget()
    for item in value:
        budget.tick()
        yield item


def _sized_concat(value):
    """Every `~` concatenation goes through this: a string doubled in a loop stops at the size limit."""
    _budget().size(_sized(value))
    return value


LOOP_FILTER, CONCAT_FILTER = "dflash_loop_budget", "dflash_concat_budget"


@functools.lru_cache(maxsize=1)
def _environment_class():
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox with a render budget (see the module docstring)."""

        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.globals.pop("lipsum", None)  # lipsum(10**9) is work no budget step would see
            self.filters = {name: _budgeted_filter(name, fn) for name, fn in self.filters.items()}
            self.filters[LOOP_FILTER] = _iterate
            self.filters[CONCAT_FILTER] = _sized_concat

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            if next(tree.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)), None) is not None:
                raise SecurityError("a chat template may not include, import or extend another template")

            def wrap(node, filter_name):
                return nodes.Filter(node, filter_name, [], [], None, None, lineno=node.lineno).set_environment(self)

            for node in [tree, *tree.find_all(nodes.Node)]:
                for field_name in node.fields:
                    value = getattr(node, field_name, None)
                    if isinstance(value, nodes.Concat):
                        setattr(node, field_name, wrap(value, CONCAT_FILTER))
                    elif isinstance(value, list):
                        setattr(node, field_name, [wrap(v, CONCAT_FILTER) if isinstance(v, nodes.Concat) else v
                                                   for v in value])
                if isinstance(node, nodes.For):
                    node.iter = wrap(node.iter, LOOP_FILTER)
            return tree

        def call_binop(self, context, operator, left, right):
            budget = _budget()
            budget.tick()
            sizes = _sized(left), _sized(right)
            if operator == "*":
                count = right if isinstance(left, (str, list, tuple)) else left
                if isinstance(count, int) and not isinstance(count, bool):
                    budget.size(max(sizes) * max(count, 0), "a repeated value")
                if all(isinstance(v, int) for v in (left, right)) and left.bit_length() + right.bit_length() > 2**16:
                    raise TemplateLimitError("it multiplies numbers too large to be a chat prompt's")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and (
                    right > 2**16 or right * left.bit_length() > 2**16):
                raise TemplateLimitError(f"it raises a number to the power {right}, too large to be a chat prompt's")
            elif operator == "+" and all(isinstance(v, (str, list, tuple)) for v in (left, right)):
                budget.size(sum(sizes), "a joined value")
            elif operator == "%" and isinstance(left, str):
                _check_format(left)
                _check_numbers(right if isinstance(right, (tuple, list)) else [right])
            result = super().call_binop(context, operator, left, right)
            budget.size(_sized(result))
            return result

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
            budget = _budget()
            budget.tick()
            _check_numbers([*args, *kwargs.values()])
            method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format where it is read
            name, owner = getattr(method, "__name__", None), getattr(method, "__self__", None)
            if name in ("format", "format_map") and isinstance(owner, str):
                _check_format(owner)
            _check_growth(str(name), owner, args, kwargs)
            result = super().call(__context, __obj, *args, **kwargs)
            budget.size(_sized(result))
            return result

        def getattr(self, obj, attribute):
            _budget().tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _budget().tick()
            return super().getitem(obj, argument)

    return BoundedEnvironment


class BoundedTemplate:
    """A compiled chat template whose every render runs on a fresh budget (what transformers calls:
    `render`, `generate` and `environment`)."""

    def __init__(self, template, limits: Optional[RenderLimits] = None):
        self.template = template
        self.environment = template.environment
        self.limits = limits

    def generate(self, *args, **kwargs):
        budget = _Budget(self.limits or LIMITS)
        previous = getattr(_state, "budget", None)
        _state.budget = budget
        try:
            for chunk in self.template.generate(*args, **kwargs):
                budget.output(len(chunk))
                yield chunk
        finally:
            _state.budget = previous

    def render(self, *args, **kwargs) -> str:
        return "".join(self.generate(*args, **kwargs))


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> BoundedTemplate:
    """A chat template compiled as transformers compiles it (same options, filters and globals), in
    BoundedEnvironment."""
    from transformers.utils import chat_template_utils

    original = getattr(chat_template_utils, "_dflash_original_compile", chat_template_utils._compile_jinja_template)
    # transformers' own environment (its extensions, filters, globals), taken from an empty template: the
    # template itself is never compiled there, where `'x' * 10**9` would be folded into a constant
    reference = original("").environment
    environment = _environment_class()(trim_blocks=reference.trim_blocks, lstrip_blocks=reference.lstrip_blocks,
                                       extensions=[type(e) for e in reference.extensions.values()])
    environment.filters.update({name: _budgeted_filter(name, fn) for name, fn in reference.filters.items()
                                if name not in environment.filters or name == "tojson"})
    environment.globals.update({k: v for k, v in reference.globals.items() if k != "lipsum"})
    return BoundedTemplate(environment.from_string(source))


_bind_lock = threading.Lock()


def bound_templates() -> None:
    """Have transformers compile every chat template in this process with BoundedEnvironment (once)."""
    from transformers.utils import chat_template_utils

    with _bind_lock:
        if hasattr(chat_template_utils, "_dflash_original_compile"):
            return
        # our marker on transformers' module (the original kept there, so the swap is made once per process)
        chat_template_utils._dflash_original_compile = chat_template_utils._compile_jinja_template  # type: ignore[attr-defined]
        chat_template_utils._compile_jinja_template = compile_template


# The tokenizer a preflight loaded, handed to the engine that loads next from the same folder (files
# unchanged): the tokenizer files are read once. Taken once; a tokenizer is never shared beyond that.
_HANDOFF: dict[tuple, object] = {}


def _tokenizer_key(path: Path) -> Optional[tuple]:
    stamps = []
    try:
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.name.startswith(("tokenizer", "chat_template", "special_tokens", "added_tokens", "vocab",
                                      "merges")):
                st = entry.stat()
                stamps.append((entry.name, st.st_mtime_ns, st.st_size, st.st_ino))
        return (str(Path(path).resolve()), tuple(stamps))
    except OSError:
        return None


def load_tokenizer(path: Path):
    bound_templates()
    key = _tokenizer_key(Path(path))
    handed = _HANDOFF.pop(key, None) if key is not None else None
    if handed is not None:
        return handed
    from transformers import AutoTokenizer

    try:  # never run a checkpoint's tokenizer code: transformers raises instead of prompting
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:
        raise UserError(f"The tokenizer in {printable(path)} cannot be loaded ({printable(describe(exc))}); "
                        "re-download the target.") from None
    show_markers(tokenizer)  # harmony's and Gemma 4's markers read as text, as Qwen's <think> does (engines/reasoning.py)
    return tokenizer


def prompt_ids(tokenizer, request: GenerationRequest) -> list[int]:
    given = [x is not None for x in (request.messages, request.prompt, request.prompt_ids)]
    if sum(given) != 1:
        raise UserError("A generation request needs exactly one of messages, prompt or prompt_ids.")
    for text in [request.prompt] + [m.get("content") for m in request.messages or [] if isinstance(m, dict)]:
        check_text(text)
    if request.prompt_ids is not None:
        ids = list(request.prompt_ids)
    elif request.prompt is not None:  # (verbose=False: a prompt past the context is said once, by preflight)
        ids = tokenizer.encode(request.prompt, add_special_tokens=False, verbose=False)
    elif request.messages is not None:  # (exactly one of the three is given: checked above)
        ids = chat_ids(tokenizer, request.messages, request.thinking, request.reasoning_effort)
    if not ids:
        raise UserError("The prompt is empty; type something to send.")
    return ids


def check_text(text) -> None:
    """Text a tokenizer can take: a string of valid Unicode (undecodable input bytes arrive as lone
    surrogates, which no tokenizer encodes)."""
    if text is None:
        return
    if not isinstance(text, str):
        raise UserError(f"A message's content is {type(text).__name__}, not text; send a string.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(f"The prompt has bytes that are not valid UTF-8 (at character {exc.start}); "
                        "re-type it or fix the file's encoding.") from None


def template_file(tokenizer) -> str:
    """The file a tokenizer's chat template came from, for messages."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or "."))
    for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            return str(folder / name)
    return f"the tokenizer of {folder}"


def chat_ids(tokenizer, messages: list[dict], thinking: bool, effort: Optional[str] = None,
             tools: Optional[list[dict]] = None) -> list[int]:
    """The chat template applied (with `tools` when given), bounded as every render is; the messages as the
    template's chat format takes them (engines/reasoning.py)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("The target's tokenizer has no chat template; use --raw to send plain text.")
    size = sum(len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str))
    if size > LIMITS.chars:  # the prompt, not the template, is past what a render may make
        raise UserError(f"The prompt is {size:,} characters, past the {LIMITS.chars:,} a chat template may render "
                        "(and far past any context); shorten it.")
    bound_templates()
    kwargs = template_kwargs(tokenizer, thinking, effort)
    if tools:
        kwargs["tools"] = tools
    try:
        out = tokenizer.apply_chat_template(format_of(tokenizer).template_messages(messages), add_generation_prompt=True,
                                            tokenize=True, return_dict=False, **kwargs)
    except UserError:
        raise
    except TemplateLimitError as exc:
        raise UserError(f"The chat template in {printable(template_file(tokenizer))} was stopped: {exc}; fix or "
                        "replace that file, or use --raw to send plain text.") from None
    except Exception as exc:  # noqa: BLE001 - the template is the checkpoint's code: any failure is its
        raise UserError(f"The chat template in {printable(template_file(tokenizer))} failed "
                        f"({printable(describe(exc))}); fix or replace that file, or use --raw to send plain text."
                        ) from None
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def check_context(prompt_len: int, max_positions: Optional[int]) -> None:
    if max_positions and prompt_len >= max_positions:
        raise UserError(
            f"The prompt is {prompt_len} tokens but the target's context holds {max_positions}; "
            "shorten the prompt or start a new session."
        )


def preflight(config, requests: list[GenerationRequest]) -> None:
    """Every check a local engine makes before its weights load (the pair's configs and safetensors headers,
    the model family, the tokenizer), then every check of `requests` (the prompt's text and template, its
    ids, the context, the block size, the sampling values): a prompt that cannot run is refused before any
    weight loads, not after. The remote engine loads nothing here: nothing to check first."""
    from dflash_tui.engines import choose_engine
    from dflash_tui.engines.engine import Engine

    name = choose_engine(config.engine)
    if name == "remote":
        return
    if name == "cuda":
        from dflash_tui.engines.cuda.target import check_family
    else:
        from dflash_tui.engines.mlx.target import check_target as check_family

    class Checks(Engine):
        check_target = staticmethod(check_family)

    checks = Checks(config)
    for request in requests:
        checks.generate(request).close()  # the checks run as the call begins; the stream never starts
    key = _tokenizer_key(Path(checks.target_info.path))
    if key is not None:
        _HANDOFF.clear()
        _HANDOFF[key] = checks.tokenizer
