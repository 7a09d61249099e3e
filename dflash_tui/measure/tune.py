"""`dflash tune`: sweep block sizes (and draft windows) on a prompt set, keep the fastest in the profile.

The sweep runs at temperature 0 on one engine: block 1 once (a draft window does not change it), then
every other block size at every draft window. The best row is the highest decode throughput (ties go
to the smaller block). It is written with tomlkit into the user's copy of the profile, so comments and
layout survive: a user profile is edited in place; a built-in one (or a profile file elsewhere) is first
copied to `user_profile_dir()/<name>.toml`, its relative checkpoint paths made absolute so they still
resolve from there. A value set in the `[engines.<engine>]` override of the engine tuned on is changed
there, since it is the one that engine reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import tomlkit

from dflash_tui.measure.bench import run_block, summarize
from dflash_tui.measure.report import histogram_text, table
from dflash_tui.measure.runs import Counter, ProgressFn
from engines.errors import UserError

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


def sweep(engine, samples: list[dict], block_sizes: list[int], windows: list[Optional[int]], max_new_tokens: int = 256,
          thinking: bool = False, system_prompt: str = "", progress: Optional[ProgressFn] = None) -> dict:
    """Rows of (block size, draft window, throughput, speedup, tau) and the best one."""
    if engine.draft_info is None:
        block_sizes = [1]
    block_sizes = sorted(set(block_sizes) | {1})
    others = [b for b in block_sizes if b > 1]
    n_turns = sum(len(s["turns"]) for s in samples)
    counter = Counter(1 + n_turns * (1 + len(others) * len(windows)), progress)
    tick = counter.tick

    def run(block: int, window: Optional[int]) -> dict:
        runs = run_block(engine, samples, block, max_new_tokens, 0.0, thinking, system_prompt, tick)
        return {**summarize(block, runs).to_dict(), "draft_window": window}

    original = engine.config.draft_window
    rows = []
    try:
        tick("warm-up")
        run_block(engine, [{"turns": samples[0]["turns"][:1]}], max(block_sizes), min(16, max_new_tokens), 0.0,
                  thinking, system_prompt)
        rows.append(run(1, None))
        for window in windows:
            engine.config.draft_window = window  # read by the engine at each generation
            for block in others:
                rows.append(run(block, window))
    finally:
        engine.config.draft_window = original
    counter.end("done")
    base_rate = rows[0]["decode_tokens_per_s"]
    for row in rows:
        row["speedup"] = row["decode_tokens_per_s"] / base_rate if base_rate else None
    best = max(rows, key=lambda r: (r["decode_tokens_per_s"], -r["block_size"]))
    return {"rows": rows, "best": best, "windows": windows}


def format_sweep(result: dict) -> str:
    show_window = result["windows"] != [None]
    titles = ["block"] + (["window"] if show_window else []) + ["tok/s", "speedup", "tau", "acceptance 1..B", ""]
    cells = []
    for row in result["rows"]:
        mark = "← best" if row is result["best"] else ""
        window = [str(row["draft_window"] or "none") if row["block_size"] > 1 else "-"] if show_window else []
        cells.append([str(row["block_size"])] + window + [
            f"{row['decode_tokens_per_s']:.1f}", f"{row['speedup']:.2f}x" if row["speedup"] else "-",
            f"{row['tau']:.2f}", histogram_text(row["histogram"]), mark])
    return "\n".join(table(titles, cells, left=(len(titles) - 2, len(titles) - 1)))


# -- writing the profile ---------------------------------------------------------------------------


def user_copy_path(profile) -> Path:
    from dflash_tui.core.profiles import check_name, user_profile_dir

    if profile.path is None:
        raise UserError("Tune writes its result into a profile; give one with --profile (a name or a TOML file).")
    if profile.origin == "user":
        return Path(profile.path)
    check_name(profile.name)
    return user_profile_dir() / f"{profile.name}.toml"


def _absolute_paths(doc, source: Path) -> list[str]:
    """Relative target/draft values that name a directory beside `source` become absolute."""
    changed = []
    tables = [("model", doc.get("model"))]
    engines = doc.get("engines") or {}
    tables += [(f"engines.{name}", section) for name, section in engines.items()]
    for where, section in tables:
        if not section:
            continue
        for key in ("target", "draft"):
            value = section.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                beside = source.resolve().parent / value
                if beside.is_dir():
                    section[key] = str(beside)
                    changed.append(f"[{where}] {key}: {value} -> {beside} (so the copy still finds it)")
    return changed


def _set(doc, table_path: tuple[str, ...], key: str, value) -> tuple[Optional[object], bool]:
    """Set (or, for None, remove) doc[table...][key]; (old value, changed)."""
    table = doc
    for part in table_path:
        if part not in table:
            if value is None:
                return None, False
            table.add(part, tomlkit.table())
        table = table[part]
    old = table.get(key)
    old_plain = old.unwrap() if hasattr(old, "unwrap") else old
    if old_plain == value:
        return old_plain, False
    if value is None:
        del table[key]
    else:
        table[key] = value
    return old_plain, True


def write_best(profile, best: dict, tune_window: bool = False, engine: Optional[str] = None) -> tuple[Path, list[str]]:
    """Write the best block size (and draft window) into the user's copy; (path, one sentence per change,
    empty when the copy already had these values)."""
    target = user_copy_path(profile)
    notes: list[str] = []
    if target.is_file():
        text = target.read_text(encoding="utf-8")
        doc = tomlkit.parse(text)
    else:
        source = Path(profile.path)
        doc = tomlkit.parse(source.read_text(encoding="utf-8"))
        notes.append(f"created {target} from {source}")
        notes += _absolute_paths(doc, source)
    engine = engine or _engine_of(profile)
    overrides = ((doc.get("engines") or {}).get(engine) or {}) if engine else {}
    changes = list(notes)
    values = [("block_size", best["block_size"])]
    if tune_window and best["block_size"] > 1:  # block 1 has no draft: its window says nothing
        values.append(("draft_window", best.get("draft_window")))
    for key, value in values:
        where = ("engines", engine) if key in overrides else ("dflash",)
        old, changed = _set(doc, where, key, value)
        if changed:
            label = f"[{'.'.join(where)}] {key}"
            changes.append(f"{label}: {'(unset)' if old is None else old} -> {'(unset)' if value is None else value}")
    if changes == notes:  # the values are already there: write nothing (and create no copy)
        return (target if target.is_file() else Path(profile.path)), []
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".toml.tmp")
    tmp.write_text(tomlkit.dumps(doc), encoding="utf-8")
    tmp.replace(target)
    return target, changes


def _engine_of(profile) -> Optional[str]:
    engine = profile.engine
    return engine if engine in ("cuda", "mlx") else None
