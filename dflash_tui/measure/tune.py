"""`dflash tune`: sweep block sizes (and draft windows) on a prompt set, keep the fastest in the profile.

The sweep runs at temperature 0 on one engine, after a warm-up: block 1 (a draft window does not change
it), the profile's current setting, then every other block size at every draft window, each `repeats`
passes over the prompts. A row is its fastest pass (runs.py); the best row is the highest decode
throughput (ties go to the smaller block).

A machine's speed moves between runs, so one number decides nothing (a single run once switched DFlash
off: "block_size: 16 -> 1"). The best row is written only after at least MIN_REPEATS passes, and only
when its best beats the current setting's best by more than the spread (fastest minus slowest pass) of
either of the two; `decide` says why in one sentence either way.

It is written with tomlkit into the profile tune was given, so comments and layout survive: a user
profile or a profile file named by path is edited in place (through a link, which stays a link; keeping
its permissions, so a profile holding an api_key stays private; by way of a new temporary file of its
own, never one that was there); a built-in one is first copied to
`user_profile_dir()/<name>.toml` (never over an existing file), its relative checkpoint paths
made absolute so they still resolve from there. A value set in the `[engines.<engine>]` override of
the engine tuned on is changed there, since it is the one that engine reads. A changed line's old
comment spoke of the old value ("# the block size the draft was trained at"), so it is replaced by what
tune measured (a value in an inline table gets none: a comment cannot go inside its braces). The file
keeps its BOM and line endings, and is replaced only when the edited text reads back as the profile it
was with exactly the written values changed; otherwise (a layout tomlkit gets wrong), or when the file
is read-only, it is left as it was and one sentence says what to set by hand.
"""

from __future__ import annotations

import copy
import os
import re
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tomlkit
import tomlkit.items

from dflash_tui.core.figures import fixed
from dflash_tui.core.profiles import _line_of
from dflash_tui.core.terminal import counted, printable
from dflash_tui.engines import files
from dflash_tui.engines.errors import UserError
from dflash_tui.measure.bench import labelled, run_block
from dflash_tui.measure.replay import DEFAULT_REPEATS
from dflash_tui.measure.report import histogram_text, repeats_note, spread_cell, table
from dflash_tui.measure.runs import Counter, ProgressFn, Totals, check_repeats, spread

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MIN_REPEATS = 3  # fewer passes cannot tell a real difference from the machine's noise
NONE_WORDS = ("none", "off", "no", "0")


def windows_for(text: Optional[str], profile, config) -> list[Optional[int]]:
    """--draft-windows, else W/4, W/2, W and none when the profile sets a window W, else [None]."""
    if text:
        out: list[Optional[int]] = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if part.lower() in NONE_WORDS:
                value = None
            else:
                try:
                    value = int(part)
                except ValueError:
                    raise UserError(f"Draft window '{part}' is not a whole number; give e.g. 1024,4096,none.") from None
                if value < 1:
                    raise UserError(f"Draft window {value} must be a positive number of positions (or none).")
            if value not in out:
                out.append(value)
        return out or [None]
    window = config.draft_window
    if not window:
        return [None]
    values = sorted({max(1, window // 4), max(1, window // 2), window})
    return [*values, None]


@dataclass(eq=False)
class TuneRow(Totals):
    """One block size at one draft window."""

    draft_window: Optional[int] = None


@dataclass
class Sweep:
    """Every row, the fastest, and the profile's current setting measured the same way."""

    rows: list[TuneRow]
    best: TuneRow
    current: TuneRow
    windows: list[Optional[int]]
    repeats: int


@dataclass(frozen=True)
class Decision:
    """Whether the best row goes into the profile, and why (one sentence)."""

    write: bool
    reason: str


def sweep(engine, samples: list[dict], block_sizes: list[int], windows: list[Optional[int]], max_new_tokens: int = 256,
          thinking: bool = False, system_prompt: str = "", progress: Optional[ProgressFn] = None,
          repeats: int = DEFAULT_REPEATS) -> Sweep:
    """Every block size (with block 1 and the engine's current one) at every draft window (with the current
    one), `repeats` passes each after one warm-up."""
    check_repeats(repeats)
    current_block, current_window = engine.block_size, engine.config.draft_window
    if engine.draft_info is None:
        block_sizes, current_block = [1], 1
    block_sizes = sorted(set(block_sizes) | {1, current_block})
    if current_block > 1 and current_window not in windows:
        windows = [*windows, current_window]
    others = [b for b in block_sizes if b > 1]
    n_turns = sum(len(s["turns"]) for s in samples)
    counter = Counter(1 + repeats * n_turns * (1 + len(others) * len(windows)), progress)

    def measure(block: int, window: Optional[int]) -> TuneRow:
        passes = [run_block(engine, samples, block, max_new_tokens, 0.0, thinking, system_prompt,
                            labelled(counter.tick, n, repeats))
                  for n in range(1, repeats + 1)]
        return TuneRow.of(block, passes, draft_window=window)

    rows = []
    try:
        counter.tick("warm-up")
        run_block(engine, [{"turns": samples[0]["turns"][:1]}], max(block_sizes), min(16, max_new_tokens), 0.0,
                  thinking, system_prompt)
        rows.append(measure(1, None))
        for window in windows:
            engine.config.draft_window = window  # read by the engine at each generation
            for block in others:
                rows.append(measure(block, window))
    finally:
        engine.config.draft_window = current_window
    counter.end("done")
    base_rate = rows[0].decode_tokens_per_s
    for row in rows:
        row.speedup = row.decode_tokens_per_s / base_rate if base_rate else None
    best = max(rows, key=lambda r: (r.decode_tokens_per_s, -r.block_size))
    current = next(r for r in rows if r.block_size == current_block and (current_block == 1 or r.draft_window == current_window))
    return Sweep(rows=rows, best=best, current=current, windows=windows, repeats=repeats)


def too_few_repeats(repeats: int) -> Optional[str]:
    """Why `repeats` passes are not enough to write a setting; None when they are."""
    if repeats >= MIN_REPEATS:
        return None
    return (f"{counted(repeats, 'repeat')} cannot tell a faster block size from the machine's noise, "
            f"so tune writes only after at least {MIN_REPEATS}")


def label(row: TuneRow, result: Sweep) -> str:
    """'block 8' or 'block 8, draft window 1024' (when windows were swept)."""
    if result.windows == [None] or row.block_size == 1:
        return f"block {row.block_size}"
    return f"block {row.block_size}, draft window {row.draft_window or 'none'}"


def decide(result: Sweep) -> Decision:
    """Write the best row only after MIN_REPEATS passes, and only when its best beats the current setting's
    best by more than the larger spread of the two (module docstring)."""
    best, current = result.best, result.current
    few = too_few_repeats(result.repeats)
    if few:
        return Decision(False, f"Not written: {few}.")
    if best is current:
        return Decision(False, f"The current setting, {label(current, result)}, is the fastest; nothing to write.")
    margin = best.decode_tokens_per_s - current.decode_tokens_per_s
    noise = max(spread(best) or 0.0, spread(current) or 0.0)
    gap = (f"{label(best, result)} is faster than the current {label(current, result)} by {margin:.1f} tok/s, "
           f"{'more than' if margin > noise else 'within'} the spread of {noise:.1f} tok/s across {result.repeats} runs")
    if margin > noise:
        return Decision(True, f"{gap[0].upper()}{gap[1:]}.")
    return Decision(False, f"Kept the current setting: {gap}.")


def comment_for(result: Sweep, dataset: str, trained: Optional[int]) -> str:
    """The comment a written line gets: what tune measured, against what, and what the draft was trained at."""
    best, current = result.best, result.current
    text = (f"dflash tune on {dataset}: {best.decode_tokens_per_s:.1f} tok/s, best of {result.repeats}, vs "
            f"{current.decode_tokens_per_s:.1f} at the old {label(current, result)}")
    if best.block_size == 1:
        return text + "; block 1 is plain decoding (DFlash off)"
    if trained and best.block_size != trained:
        return text + f"; the draft was trained at {trained}"
    return text


def format_sweep(result: Sweep) -> str:
    show_window = result.windows != [None]
    titles = ["block"] + (["window"] if show_window else []) + ["tok/s", "spread", "runs", "speedup", "tau",
                                                                "acceptance 1..B", ""]
    cells = []
    for row in result.rows:
        marks = [m for m, on in (("← best", row is result.best), ("(current)", row is result.current)) if on]
        window = [str(row.draft_window or "none") if row.block_size > 1 else "-"] if show_window else []
        cells.append([str(row.block_size)] + window + [
            f"{row.decode_tokens_per_s:.1f}", spread_cell(row), str(row.repeats),
            f"{row.speedup:.2f}x" if row.speedup else "-", fixed(row.tau), histogram_text(row.histogram),
            " ".join(marks)])
    lines = table(titles, cells, left=(len(titles) - 2, len(titles) - 1))
    return "\n".join([*lines, repeats_note(result.rows)])


# -- writing the profile ---------------------------------------------------------------------------


def user_copy_path(profile) -> Path:
    """The one file tune may write: the profile it was given, a user profile (a link or hard link in the profile
    folder becomes a file of its own) or a TOML file named by path, edited where it is; for a built-in
    profile, a new copy in the user folder under the built-in's file name. Never another file that merely
    shares the profile's `name`."""
    from dflash_tui.core.profiles import check_name, user_profile_dir

    if profile.path is None:
        raise UserError("Tune writes its result into a profile; give one with --profile (a name or a TOML file).")
    if profile.origin != "built-in":
        given = Path(profile.path).absolute()
        if files.inside(given, user_profile_dir()):
            # in dflash's profile folder: a link or a hard link there is replaced by the edited copy, never
            # written through, so a file elsewhere that it named stays as it was
            return given
        return given.resolve()  # a file the user named by path (a dotfiles link: the file it names), edited there
    stem = Path(profile.path).stem
    check_name(stem)
    copy = user_profile_dir() / f"{stem}.toml"
    if copy.exists():  # it would have been loaded by name: the built-in was named by its path
        raise UserError(f"Tune would copy the built-in profile {stem} to {copy}, which already exists; "
                        f"tune that one instead (--profile {stem}).")
    return copy


def check_writable(path: Path) -> Path:
    """`path` can be written as write_best writes it (a temporary file beside it, then a rename): checked by
    making such a file in its folder, or the nearest one that exists, before any sweep, and `path` is not
    read-only; one sentence if not."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if path.exists() and _read_only(path):
        raise UserError(printable(f"Tune writes its result to {path}, which is read-only; make it writable, "
                                  "or pass --dry-run to only look."))
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(printable(f"Tune writes its result to {path}, but {folder} cannot be written "
                                  f"({exc.strerror}); make it writable, set DFLASH_CONFIG_DIR to a writable folder, "
                                  "or pass --dry-run to only look.")) from None
    return path


def _absolute_paths(plain: dict, source: Path) -> list[tuple[tuple[str, ...], str, object, str]]:
    """Relative target/draft values (and [model] drafts entries) that name a directory beside `source` become
    absolute: (table, key, new value, note) for each."""
    changed: list[tuple[tuple[str, ...], str, object, str]] = []
    drafts = (plain.get("model") or {}).get("drafts")
    if isinstance(drafts, list):
        moved = [str(source.resolve().parent / d) if isinstance(d, str) and not Path(d).is_absolute()
                 and (source.resolve().parent / d).is_dir() else d for d in drafts]
        if moved != drafts:
            changed.append((("model",), "drafts", moved, f"[model] drafts: {', '.join(map(str, drafts))} -> "
                            f"{', '.join(map(str, moved))} (so the copy still finds them)"))
    tables: list[tuple[tuple[str, ...], object]] = [(("model",), plain.get("model"))]
    engines = plain.get("engines") or {}
    tables += [(("engines", name), section) for name, section in engines.items()]
    for where, section in tables:
        if not isinstance(section, dict):
            continue
        for key in ("target", "draft"):
            value = section.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                beside = source.resolve().parent / value
                if beside.is_dir():
                    changed.append((where, key, str(beside),
                                    f"[{'.'.join(where)}] {key}: {value} -> {beside} (so the copy still finds it)"))
    return changed


def _set(doc, table_path: tuple[str, ...], key: str, value, comment: Optional[str] = None) -> None:
    """Set (or, for None, remove) doc[table...][key], its line's comment replaced by `comment` (or dropped).
    A value in an inline table gets no comment: the line is the table's, and a comment inside its braces
    would end the TOML there."""
    table = doc
    for part in table_path:
        if part not in table:
            if value is None:
                return
            table.add(part, tomlkit.table())
        table = table[part]
    if value is None:
        if key in table:
            del table[key]
        return
    table[key] = value
    item = table[key]  # tomlkit keeps the old line's comment, of the old value, in the item's trivia
    if isinstance(item, tomlkit.items.Item) and not isinstance(table, tomlkit.items.InlineTable):
        item.trivia.comment_ws, item.trivia.comment = ("  ", f"# {comment}") if comment else ("", "")


def _expected(plain: dict, edits) -> dict:
    """The parsed profile with `edits` ((table, key, value or None to remove) each) made: what the written file
    must read as, and nothing else."""
    out = copy.deepcopy(plain)
    for where, key, value in edits:
        table = out
        for part in where:
            table = table.setdefault(part, {})
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return out


def _read_toml(path: Path) -> tuple[str, bool, dict]:
    """(text without a BOM, newlines as they are; whether it had a BOM; the parsed profile), read as
    profiles.py reads it."""
    try:
        text = path.read_bytes().decode("utf-8")
        plain = tomllib.loads(text.removeprefix("\ufeff"))
    except (OSError, ValueError):  # (checked when it was loaded; changed since)
        raise UserError(printable(f"Tune cannot read {path} again to write its result; check it with "
                                  "`dflash profile validate`.")) from None
    return text.removeprefix("\ufeff"), text.startswith("\ufeff"), plain


def _by_hand(edits) -> str:
    """'set block_size = 8 in [dflash] by hand': what the user can do for a profile tune left as it was."""
    tables: dict[tuple[str, ...], list[str]] = {}
    for where, key, value in edits:
        tables.setdefault(where, []).append(f"remove {key}" if value is None else f"set {key} = {value}")
    return " and ".join(f"{' and '.join(parts)} in [{'.'.join(where)}]" for where, parts in tables.items()) + " by hand"


def _edited(text: str, plain: dict, edits, comment: Optional[str]) -> Optional[str]:
    """`text` with `edits` made by tomlkit, its layout and comments kept; None when the result would not
    read back as exactly `plain` with the edits (an inline table or dotted keys tomlkit mishandles, any other
    layout it gets wrong): then nothing is written rather than a guess."""
    if comment:  # a newline or control character in it (a dataset's path) would end the comment
        comment = "".join(c if c.isprintable() else " " for c in comment)
    crlf = "\r\n" in text and "\n" not in text.replace("\r\n", "")
    try:
        doc = tomlkit.parse(text)
        for where, key, value in edits:
            _set(doc, where, key, value, comment)
        out = tomlkit.dumps(doc)
        if crlf:  # lines tomlkit adds end in \n
            out = re.sub(r"(?<!\r)\n", "\r\n", out)
        if tomllib.loads(out) != _expected(plain, edits):
            return None
    except Exception:  # noqa: BLE001 - whatever tomlkit trips on, the file is left as it was
        return None
    return out


def write_best(profile, best, tune_window: bool = False, engine: Optional[str] = None,
               comment: Optional[str] = None) -> tuple[Path, list[str]]:
    """Write the best block size (and draft window) of `best` (a TuneRow or a dict with those keys) into the
    user's copy, each changed line's comment replaced by `comment`; (path, one sentence per change, empty
    when the copy already had these values).

    The file keeps its BOM and line endings, and is written only when it reads back as the profile it was
    with exactly these values changed; else (a layout tomlkit cannot edit), or when it is read-only or its
    folder cannot be written, it is left as it was and a UserError says which line to set by hand."""
    target = user_copy_path(profile)
    source = target if target.is_file() else Path(profile.path)
    text, bom, plain = _read_toml(source)
    notes: list[str] = []
    edits: list[tuple[tuple[str, ...], str, object]] = []
    if source != target:
        notes.append(f"created {target} from {source}")
        for where, key, value, note in _absolute_paths(plain, source):
            edits.append((where, key, value))
            notes.append(note)
    engine = engine or _engine_of(profile)
    overrides = (plain.get("engines") or {}).get(engine) or {} if engine else {}
    changes = list(notes)
    values = [("block_size", best["block_size"])]
    if tune_window and best["block_size"] > 1:  # block 1 has no draft: its window says nothing
        values.append(("draft_window", best.get("draft_window")))
    wanted = []
    for key, value in values:
        where = ("engines", engine) if engine and key in overrides else ("dflash",)
        section = plain
        for part in where:
            section = section.get(part) or {}
        old = section.get(key)
        if old != value:
            wanted.append((where, key, value))
            changes.append(f"[{'.'.join(where)}] {key}: {'(unset)' if old is None else old} -> "
                           f"{'(unset)' if value is None else value}")
    if not wanted:  # the values are already there: write nothing (and create no copy)
        return (target if target.is_file() else Path(profile.path)), []
    how = _by_hand(wanted)
    if target.exists() and _read_only(target):
        raise UserError(printable(f"Not written: {target} is read-only, so tune left it as it was; make it "
                                  f"writable and rerun tune, or {how}."))
    out = _edited(text, plain, edits + wanted, comment)
    if out is None:
        line = _line_of(text, (*wanted[0][0], wanted[0][1])) if source == target else None
        raise UserError(printable(f"Not written: tune cannot edit the layout of {target} without changing more "
                                  f"than these values, so it left the file as it was; "
                                  f"{how}{f' (see line {line})' if line else ''}."))
    try:
        _replace(target, ("\ufeff" if bom else "") + out)
    except OSError as exc:
        raise UserError(printable(f"Not written: {target} cannot be written ({exc.strerror}), so tune left it as "
                                  f"it was; {how}.")) from None
    return target, changes


def _read_only(path: Path) -> bool:
    """The user marked `path` read-only (no write bit: root may write anyway, but tune respects the mark),
    or this user cannot write it."""
    try:
        return not (os.stat(path).st_mode & 0o222) or not os.access(path, os.W_OK)
    except OSError:
        return False


def _replace(target: Path, text: str) -> None:
    """`text` as the new content of `target`, written fresh and renamed over it (engines/files.py): readers
    never see half a profile, not even after a crash, and a link or a hard link in its place is replaced as a
    name, never written through. The file keeps its permissions (a new one, or one that was a link: the
    umask's)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(target)
        mode: Optional[int] = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    files.write_file(target, text.encode("utf-8"), mode=mode)


def _engine_of(profile) -> Optional[str]:
    engine = profile.engine
    return engine if engine in ("cuda", "mlx") else None
