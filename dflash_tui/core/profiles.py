"""Per-model tuning profiles as TOML (docs/design.md, "Profiles").

Built-in profiles ship in the package `dflash_tui.profiles_data` (the repository's `profiles/`); user
profiles live in the platformdirs config dir and shadow built-ins of the same name. Files are read with
tomllib, which reports no positions for values, so the line of a bad key is found by a small
table-aware scan of the raw text. Templates are written with tomlkit so their comments survive edits.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, overload

import platformdirs
import tomlkit

from dflash_tui.core.terminal import printable
from dflash_tui.engines import choose_engine
from dflash_tui.engines.config import (
    DTYPES,
    EFFORTS,
    ENGINES,
    MAX_BLOCK_SIZE,
    MIN_TEMPERATURE,
    EngineConfig,
    Sampling,
    request_takes,
)
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import has_control
from dflash_tui.measure.prompts import NAMES as PROMPT_SETS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_PROFILE = "demo"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


@dataclass
class Profile(Sampling):
    """One profile, flattened: every setting the CLI and TUI read, with the file it came from."""

    name: str
    description: str
    path: Optional[Path]
    target: str
    draft: Optional[str]  # the draft that loads: `drafts`' first when the profile lists several
    engine: str = "auto"
    dtype: str = "auto"
    block_size: Optional[int] = None
    target_layer_ids: Optional[list[int]] = None
    draft_window: Optional[int] = None
    max_new_tokens: int = 2048
    thinking: bool = True
    needs_thinking: bool = False  # [generation] needs_thinking: answers go wrong with thinking off (the chat warns)
    reasoning_effort: Optional[str] = None  # low, medium or high, for a template that reads it (gpt-oss)
    system_prompt: str = ""
    draft_thinking: bool = True  # [dflash] thinking_trained: was the draft trained on thinking traces
    url: Optional[str] = None  # [engines.remote]: the server's API root, http://HOST:PORT/v1
    model: Optional[str] = None  # [engines.remote]: the served model (None: the server's first)
    api_key: Optional[str] = field(default=None, repr=False)  # [engines.remote] (DFLASH_API_KEY is better)
    engines: dict[str, dict] = field(default_factory=dict)  # [engines.cuda] / [engines.mlx] overrides
    bench_prompts: Optional[str] = None  # [bench] prompts: the built-in set bench and tune use (None: chat)
    examples: tuple[str, ...] = ()  # example prompts the chat's first screen offers
    drafts: tuple[str, ...] = ()  # [model] drafts: the drafts the chat's palette switches between (the first loads)

    @property
    def origin(self) -> str:
        """'built-in', 'user' or 'file' (where `dflash profile list` says it lives); 'command line' for a
        Profile built in code without a file."""
        if self.path is None:
            return "command line"
        parent = self.path.resolve().parent
        if parent == builtin_profile_dir().resolve():
            return "built-in"
        return "user" if parent == user_profile_dir().resolve() else "file"

    def resolved(self, engine: str) -> "Profile":
        """A copy with the `[engines.<engine>]` overrides applied (engine: 'cuda' or 'mlx')."""
        return dataclasses.replace(self, **self.engines.get(engine, {}))

    @overload
    def local_path(self, value: str) -> str: ...

    @overload
    def local_path(self, value: None) -> None: ...

    def local_path(self, value: Optional[str]) -> Optional[str]:
        """`value` resolved against the profile's directory when that names an existing directory
        (the built-in demo profile ships its checkpoints beside it); otherwise unchanged."""
        if value and self.path is not None and not Path(value).is_absolute():
            beside = self.path.resolve().parent / value
            if beside.is_dir():
                return str(beside)
        return value

    def with_draft(self, draft: str) -> "Profile":
        """A copy that runs `draft` (one of `drafts`, as the profile writes it) on every engine: the palette's
        switch. `[engines.*]` draft overrides go, or they would put the default draft back."""
        engines = {name: {k: v for k, v in table.items() if k != "draft"} for name, table in self.engines.items()}
        return dataclasses.replace(self, draft=draft, engines=engines)

    def engine_config(self, engine: Optional[str] = None, **flags: Any) -> EngineConfig:
        """What to load on `engine` (default: the profile's; 'auto' is resolved first so its overrides
        apply). Command-line `flags` (EngineConfig fields; None means not given) win over the profile."""
        engine = engine or self.engine
        if engine not in ENGINES:
            raise UserError(f"Engine {engine!r} is unknown; choose one of {', '.join(ENGINES)}.")
        name = choose_engine(engine) if engine == "auto" else engine
        p = self.resolved(name)
        values: dict[str, Any] = dict(
            target=self.local_path(p.target), draft=self.local_path(p.draft),  # a directory beside the file wins over a hub id
            dtype=p.dtype, block_size=p.block_size, draft_window=p.draft_window, target_layer_ids=p.target_layer_ids,
            url=p.url, model=p.model, api_key=p.api_key, max_new_tokens=p.max_new_tokens)
        given = {k: v for k, v in flags.items() if v is not None}
        if given:  # a bad flag is blamed on the command line, not on the profile
            EngineConfig(target=values["target"] or "-", engine=name, source="the command line", **given)
        values.update(given)
        origin = self.origin
        source = f"built-in profile {self.name}" if origin == "built-in" else str(self.path or origin)
        return EngineConfig(engine=name, source=source, **values)


# --- schema: (section, key) -> what the value must be -------------------------------------------


@dataclass(frozen=True)
class _Spec:
    attr: str  # the Profile field it sets
    what: str  # "an integer from 1 to 64", for messages
    example: str  # a correct line, for messages
    ok: Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v: Any) -> bool:
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _plain(v: Any) -> bool:
    """Text a terminal shows as written: no control character but newline and tab (an escape sequence in a
    profile would otherwise reach the screen in every listing and message that names it). Bidirectional marks
    are allowed (a right-to-left system prompt has them); every printer shows them escaped."""
    return isinstance(v, str) and not has_control(v)


def _text(v: Any) -> bool:
    """A one-line value (a name, a path, a URL): not empty, no control character at all."""
    return _plain(v) and v.strip() != "" and "\n" not in v and "\t" not in v


def _int_in(lo: int, hi: Optional[int] = None) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and v >= lo and (hi is None or v <= hi)


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(_plain(i) and i.strip() for i in v)


def _drafts(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_text(i) for i in v) and len(set(v)) == len(v)


def _layer_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_int(i) and i >= 0 for i in v) and len(set(v)) == len(v)


_BLOCK = _Spec("block_size", f"an integer from 1 to {MAX_BLOCK_SIZE}", "block_size = 16", _int_in(1, MAX_BLOCK_SIZE))
_WINDOW = _Spec("draft_window", "a positive integer (context positions)", "draft_window = 4096", _int_in(1))
_TARGET = _Spec("target", "a non-empty hub id or local path without control characters", 'target = "Qwen/Qwen3-8B"', _text)
_DRAFT = _Spec("draft", "a non-empty hub id or local path without control characters", 'draft = "z-lab/Qwen3-8B-DFlash-b16"', _text)
_DTYPE = _Spec("dtype", f"one of {', '.join(DTYPES)}", 'dtype = "auto"', lambda v: v in DTYPES)

SCHEMA: dict[str, dict[str, _Spec]] = {
    "": {
        "name": _Spec("name", "a non-empty string without control characters", 'name = "my-profile"', _text),
        "description": _Spec("description", "a string without control characters",
                             'description = "Qwen3-8B with its DFlash draft"', _plain),
        "examples": _Spec("examples", "a list of non-empty strings without control characters",
                          'examples = ["What is 48 + 75?"]', _texts),
    },
    "model": {
        "target": _TARGET, "draft": _DRAFT,
        "drafts": _Spec("drafts", "a non-empty list of distinct hub ids or local paths without control characters",
                        'drafts = ["z-lab/Qwen3-8B-DFlash-b16", "my/dflash2-draft"]', _drafts),
    },
    "engine": {
        "default": _Spec("engine", f"one of {', '.join(ENGINES)}", 'default = "auto"', lambda v: v in ENGINES),
        "dtype": _DTYPE,
    },
    "dflash": {
        "block_size": _BLOCK,
        "target_layer_ids": _Spec("target_layer_ids", "a non-empty list of distinct layer numbers (0 or more)",
                                  "target_layer_ids = [1, 9, 17, 25, 33]", _layer_ids),
        "draft_window": _WINDOW,
        "thinking_trained": _Spec("draft_thinking", "true or false", "thinking_trained = false",
                                  lambda v: isinstance(v, bool)),
    },
    "generation": {
        # the sampling values a request takes, checked by the request's own rules (engines/config.py)
        "temperature": _Spec("temperature", f"0 (greedy) or a number from {MIN_TEMPERATURE:g} to 100",
                             "temperature = 0.6", lambda v: _is_float(v) and request_takes("temperature")(v)),
        "top_p": _Spec("top_p", "a number above 0 and at most 1", "top_p = 0.95",
                       lambda v: _is_float(v) and request_takes("top_p")(v)),
        "top_k": _Spec("top_k", "an integer of at least 0 (0 = off)", "top_k = 20", _int_in(0)),
        "min_p": _Spec("min_p", "a number from 0 up to, not including, 1", "min_p = 0.0",
                       lambda v: _is_float(v) and request_takes("min_p")(v)),
        "max_new_tokens": _Spec("max_new_tokens", "a positive integer", "max_new_tokens = 2048", _int_in(1)),
        "thinking": _Spec("thinking", "true or false", "thinking = true", lambda v: isinstance(v, bool)),
        "needs_thinking": _Spec("needs_thinking", "true or false", "needs_thinking = true",
                                lambda v: isinstance(v, bool)),
        "reasoning_effort": _Spec("reasoning_effort", "one of low, medium or high", 'reasoning_effort = "medium"',
                                  lambda v: v in EFFORTS),
        "system_prompt": _Spec("system_prompt", "a string without control characters", 'system_prompt = ""', _plain),
    },
    "bench": {
        "prompts": _Spec("bench_prompts", f"the name of a built-in prompt set ({', '.join(PROMPT_SETS)})",
                         'prompts = "chat"', lambda v: v in PROMPT_SETS),
    },
}
OVERRIDES: dict[str, _Spec] = {"target": _TARGET, "draft": _DRAFT, "dtype": _DTYPE, "block_size": _BLOCK,
                               "draft_window": _WINDOW}
OVERRIDES.update({  # the remote engine's server (engines/remote), in [engines.remote]
    "url": _Spec("url", "an http(s) URL", 'url = "http://127.0.0.1:8000/v1"',
                 lambda v: _text(v) and v.startswith(("http://", "https://"))),
    "model": _Spec("model", "a non-empty model name", 'model = "Qwen/Qwen3-8B"', _text),
    "api_key": _Spec("api_key", "a non-empty string", 'api_key = "..."', _text),
})
OVERRIDE_ENGINES = ("cuda", "mlx", "remote")


# --- locations ----------------------------------------------------------------------------------


def config_dir() -> Path:
    """dflash's config directory: $DFLASH_CONFIG_DIR when set (tests, portable setups), else the
    platformdirs one. User profiles and the TUI's preferences live in it."""
    root = os.environ.get("DFLASH_CONFIG_DIR")
    return Path(root if root else platformdirs.user_config_dir("dflash"))


def user_profile_dir() -> Path:
    """Where user profiles live: profiles/ in the config directory."""
    return config_dir() / "profiles"


def builtin_profile_dir() -> Path:
    """The installed copy of the repository's `profiles/` (package data)."""
    return Path(str(importlib.resources.files("dflash_tui.profiles_data")))


# --- reading ------------------------------------------------------------------------------------

_KEY_PART = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\'[^\']*\'|[A-Za-z0-9_-]+)\s*')


def _split_key(text: str) -> Optional[tuple[str, ...]]:
    """'a."b c".d' -> ('a', 'b c', 'd'); None when `text` is not a plain TOML key."""
    parts, pos = [], 0
    while True:
        m = _KEY_PART.match(text, pos)
        if not m:
            return None
        part = m.group(1)
        if part.startswith('"'):
            try:  # TOML's basic-string escapes are JSON's, bar \U and \e
                part = json.loads(part)
            except ValueError:
                part = part[1:-1]
        elif part.startswith("'"):
            part = part[1:-1]
        parts.append(part)
        pos = m.end()
        if pos == len(text):
            return tuple(parts)
        if text[pos] != ".":
            return None
        pos += 1


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Line number (1-based) of every table header and key in a TOML text, by full dotted path.

    A line scan, not a parser: enough to point at a key, which tomllib cannot do."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    in_string = None
    for n, line in enumerate(text.split("\n"), 1):
        if in_string:
            if line.count(in_string) % 2:
                in_string = None
            continue
        stripped = line.strip()
        header = re.match(r"\[\[?(.*?)\]\]?\s*(#.*)?$", stripped)
        if header:
            table = _split_key(header.group(1)) or table
            for i in range(1, len(table) + 1):
                lines.setdefault(table[:i], n)
            continue
        key, eq, value = stripped.partition("=")
        path = _split_key(key) if eq else None
        if path:
            for i in range(1, len(path) + 1):
                lines.setdefault(table + path[:i], n)
            for quote in ('"""', "'''"):
                if value.count(quote) % 2:
                    in_string = quote
    return lines


def _line_of(text: str, path: tuple[str, ...]) -> Optional[int]:
    """The line of `path`, or of its nearest enclosing table or key (for inline tables)."""
    lines = _key_lines(text)
    for i in range(len(path), 0, -1):
        if path[:i] in lines:
            return lines[path[:i]]
    return None


def _unquoted(v: Any) -> Any:
    """The number inside a string like "8" (a common slip), else None."""
    for kind in (int, float):
        try:
            return kind(v) if isinstance(v, str) and len(v) < 30 else None
        except ValueError:
            pass
    return None


def _describe(v: Any) -> str:
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}"
    if isinstance(v, (int, float)):
        return f"the number {str(v) if abs(v) < 1e15 else f'{v:.3g}'}"
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "a list"
    return f"a {type(v).__name__}"


class _Reader:
    """Validates one parsed document, raising UserError sentences that point at file, key and line."""

    def __init__(self, text: str, path: Path):
        self.text, self.path = text, path

    def fail(self, key: tuple[str, ...], problem: str, fix: str) -> UserError:
        line = _line_of(self.text, key)
        where = f"{self.path}, line {line}" if line else str(self.path)
        dotted = ".".join(k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k) for k in key)
        return UserError(printable(f"{where}: {dotted} {problem}; {fix}."))

    def table(self, doc: dict, key: tuple[str, ...]) -> dict:
        value = doc.get(key[-1], {})
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table but is {_describe(value)}",
                            f"write it as a [{'.'.join(key)}] section")
        return value

    def known(self, table: dict, key: tuple[str, ...], allowed: list[str]) -> None:
        for name in table:
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"allowed here: {', '.join(allowed) or 'nothing'}"
                raise self.fail(key + (name,), "is not a known key", f"remove it or rename it ({hint})")

    def values(self, table: dict, key: tuple[str, ...], specs: dict[str, _Spec]) -> dict[str, Any]:
        out = {}
        for name, value in table.items():
            spec = specs[name]
            if not spec.ok(value):
                quoted = spec.ok(_unquoted(value))
                fix = f"remove the quotes: {name} = {value}" if quoted else f"write e.g. {spec.example}"
                raise self.fail(key + (name,), f"must be {spec.what} but is {_describe(value)}", fix)
            out[spec.attr] = value
        return out


def _parse(text: str, path: Path) -> Profile:
    """A Profile from the text of a TOML file (path is for messages and Profile.path)."""
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise UserError(printable(f"{path}: the TOML nests arrays or tables too deeply to read; a profile needs only "
                                  "a few sections of plain values.")) from None
    except (tomllib.TOMLDecodeError, ValueError) as e:  # ValueError: integers too long for int()
        m = re.search(r"(.*) \(at line (\d+), column \d+\)", str(e))
        if not m:
            raise UserError(printable(f"{path}: the TOML is malformed ({e}); check the end of the file.")) from None
        problem, line = m.group(1), int(m.group(2))
        near = text.split("\n")[line - 1].partition("=")[0].strip() if line <= len(text.split("\n")) else ""
        near = f" near {near[:40]!r}" if near else ""
        raise UserError(printable(f"{path}, line {line}: the TOML is malformed{near} ({problem.lower()}); fix the "
                                  "syntax there (strings need quotes, sections look like [model]).")) from None
    r = _Reader(text, path)
    r.known(doc, (), [*SCHEMA[""], *(s for s in SCHEMA if s), "engines"])
    fields = r.values({k: v for k, v in doc.items() if k in SCHEMA[""]}, (), SCHEMA[""])
    for section in (s for s in SCHEMA if s):
        table = r.table(doc, (section,))
        r.known(table, (section,), list(SCHEMA[section]))
        fields.update(r.values(table, (section,), SCHEMA[section]))
    overrides = {}
    all_engines = r.table(doc, ("engines",))
    r.known(all_engines, ("engines",), list(OVERRIDE_ENGINES))
    for name in all_engines:
        table = r.table(all_engines, ("engines", name))
        r.known(table, ("engines", name), list(OVERRIDES))
        overrides[name] = r.values(table, ("engines", name), OVERRIDES)
    if "target" not in fields:
        raise r.fail(("model",), "has no target, which every profile needs",
                     'add a [model] section with target = "Qwen/Qwen3-8B" (a hub id or a local path)')
    fields.setdefault("name", path.stem)
    fields.setdefault("description", "")
    drafts = fields.get("drafts")
    if drafts is not None:  # the first is the default; `draft` beside it may only restate that
        if fields.get("draft", drafts[0]) != drafts[0]:
            raise r.fail(("model", "draft"), f"is {fields['draft']!r} but drafts starts with {drafts[0]!r}, and the "
                         "first of drafts is the one that loads",
                         "remove draft (drafts alone says it), or list that draft first in drafts")
        fields["draft"] = drafts[0]
        fields["drafts"] = tuple(drafts)
    fields.setdefault("draft", None)
    fields["examples"] = tuple(fields.get("examples", ()))
    return Profile(path=path, engines=overrides, **fields)


def _read(path: Path) -> Profile:
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the read forever
            raise UserError(printable(f"{path}: the profile is not a regular file; point at a TOML file."))
        text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")  # editors on Windows write a BOM
    except UnicodeDecodeError as e:
        raise UserError(printable(f"{path}: the profile is not UTF-8 text (byte {e.start}); save it as UTF-8.")) from None
    except OSError as e:
        raise UserError(printable(f"{path}: the profile cannot be read ({e.strerror}); check the path and its "
                                  "permissions.")) from None
    return _parse(text, path)


def _named(directory: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(directory.glob("*.toml")) if p.is_file()} if directory.is_dir() else {}


def load_profile(name_or_path: str) -> Profile:
    """An existing file path wins, then `<name>.toml` in the user dir, then the built-in of that name."""
    if not name_or_path or "\x00" in name_or_path or len(name_or_path) > 1024:
        raise UserError(f"Profile {name_or_path[:40]!r} is not a name or a path; run `dflash profile list` for the names.")
    as_path = Path(name_or_path).expanduser()
    try:
        a_file = as_path.exists() and not as_path.is_dir()  # a FIFO or a device too: _read refuses it as such
    except OSError as e:  # a name too long for the file system
        raise UserError(f"Profile {name_or_path[:40]!r}… cannot be a file here ({e.strerror}); use a shorter name.") from None
    if a_file:
        return _read(as_path)
    for directory in (user_profile_dir(), builtin_profile_dir()):
        found = _named(directory).get(name_or_path)
        if found:
            return _read(found)
    if as_path.is_dir():
        raise UserError(printable(f"Profile {as_path} is a folder, not a TOML file; name the profile file in it, or run "
                                  "`dflash profile list`."))
    if as_path.suffix == ".toml" or os.sep in name_or_path:
        raise UserError(printable(f"Profile file {as_path} does not exist; check the path, or run `dflash profile list`."))
    available = sorted({*_named(builtin_profile_dir()), *_named(user_profile_dir())})
    raise UserError(printable(f"Profile '{name_or_path}' is neither a file nor a user or built-in profile; choose one "
                              f"of {', '.join(available) or '(none)'}, or create it with `dflash profile new "
                              f"{name_or_path}`."))


def list_profiles(errors: Optional[list[UserError]] = None) -> list[Profile]:
    """Built-in and user profiles by name, a user profile shadowing the built-in of the same name.

    A broken file raises its UserError, unless `errors` is given: then it is collected there and skipped,
    so one bad user file does not hide the rest."""
    paths = {**_named(builtin_profile_dir()), **_named(user_profile_dir())}
    found = []
    for name in sorted(paths):
        try:
            found.append(_read(paths[name]))
        except UserError as e:
            if errors is None:
                raise
            errors.append(e)
    return found


# --- writing ------------------------------------------------------------------------------------


def check_name(name: str) -> None:
    """Profile names become file names: letters, digits, '.', '_' and '-'."""
    if not NAME_RE.match(name):
        raise UserError(f"Profile name {name[:40]!r} is not usable as a file name; use up to 64 letters, digits, "
                        "'.', '_' and '-', starting with a letter or digit.")


def copied_profile_text(name: str, source: str) -> str:
    """Profile `source` saved under `name`, comments kept, with model paths that resolve to folders
    beside the source made absolute (a copy elsewhere would otherwise read them as hub ids)."""
    check_name(name)
    original = load_profile(source)
    if original.path is None:  # (a loaded profile has its file)
        raise UserError(f"Profile {source!r} has no file to copy.")
    doc = tomlkit.parse(original.path.read_text(encoding="utf-8").removeprefix("\ufeff"))
    doc["name"] = name
    tables = [doc.get("model", {})] + [t for t in doc.get("engines", {}).values() if isinstance(t, dict)]
    for table in tables:
        for key in ("target", "draft"):
            value = table.get(key)
            if isinstance(value, str) and original.local_path(value) != value:
                table[key] = original.local_path(value)
    model = doc.get("model", {})
    drafts = model.get("drafts") if isinstance(model, dict) else None
    if isinstance(drafts, list) and any(original.local_path(d) != d for d in drafts if isinstance(d, str)):
        model["drafts"] = [original.local_path(d) if isinstance(d, str) else d for d in drafts]
    return tomlkit.dumps(doc)


def new_profile_text(name: str) -> str:
    """A commented template that loads as is; optional keys are present but commented out."""
    check_name(name)
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"dflash profile '{name}'. Command-line flags win over these values; a key left"))
    doc.add(tomlkit.comment("out takes the built-in default. Check it with `dflash profile validate FILE`."))
    doc.add("name", name)
    doc.add("description", "Qwen3-8B with its DFlash draft")
    doc.add(tomlkit.comment('examples = ["What is 48 + 75?"]  # optional: prompts the chat\'s first screen offers'))

    def section(title: str, note: str, items: list, optional: list[str]) -> None:
        table = tomlkit.table()
        table.add(tomlkit.comment(note))
        for key, value, comment in items:
            item = tomlkit.item(value)
            table.add(key, item.comment(comment) if comment else item)
        for line in optional:
            table.add(tomlkit.comment(line))
        doc.add(tomlkit.nl())
        doc.add(title, table)

    section("model", "Hub ids or local directories; leave draft out to run the target alone.",
            [("target", "Qwen/Qwen3-8B", None), ("draft", "z-lab/Qwen3-8B-DFlash-b16", None)],
            ['drafts = ["z-lab/Qwen3-8B-DFlash-b16", "my/dflash2-draft"]  # instead of draft: the first loads, '
             "ctrl+p switches"])
    section("engine", "auto: MLX on Apple Silicon, CUDA where a CUDA device exists, else the faster CPU engine.",
            [("default", "auto", "auto, cuda or mlx"), ("dtype", "auto", "auto, float32, float16 or bfloat16")], [])
    section("dflash", "Speculative decoding settings.",
            [("block_size", 16, "1..64; 1 is plain autoregressive decoding"),
             ("thinking_trained", False, "was the draft trained on thinking traces?")],
            ["target_layer_ids = [1, 9, 17, 25, 33]  # optional; must equal the draft's own",
             "draft_window = 4096  # optional: the block attends to the last W context positions"])
    section("generation", "Left out: the target's generation_config decides.",
            [("max_new_tokens", 2048, None), ("thinking", False, None)],
            ["temperature = 0.7  # 0 = greedy", "top_p = 0.8", "top_k = 20", "min_p = 0.0", 'system_prompt = ""',
             "needs_thinking = true  # answers go wrong with thinking off: the chat warns once when it is turned off",
             'reasoning_effort = "medium"  # low, medium or high, where the template reads it (gpt-oss)'])
    section("bench", "What `dflash bench` and `dflash tune` measure on when no --dataset is given.", [],
            [f'prompts = "chat"  # a built-in prompt set: {", ".join(PROMPT_SETS)}'])
    doc.add(tomlkit.nl())
    doc.add(tomlkit.comment("Per-engine overrides of target, draft, dtype, block_size or draft_window:"))
    doc.add(tomlkit.comment("[engines.mlx]"))
    doc.add(tomlkit.comment('target = "mlx-community/Qwen3-8B-4bit"'))
    return tomlkit.dumps(doc)
