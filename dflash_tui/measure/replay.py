"""Replay a recorded session across block sizes (no UI framework here; the CLI and the TUI show it).

Every recorded turn that completed is re-run with its recorded prompt ids (so every block size sees the
identical prompt, history included) at every block size, on one engine loaded once: a short warm-up
generation first (not counted), then `repeats` passes over all turns; a row shows the fastest pass and
keeps every pass's rate (runs.py). Block 1 (plain
decoding) is always part of the run: it is the baseline of the speedup column. At temperature 0 the
outputs must equal the recording (same target) and each other; any difference is reported with the turn,
the first differing position and the target's top-2 logit margin there (a margin within numerical noise
means a bf16 reduction-order tie, not a bug). A replay whose target is not the recorded one (another
engine's profile override, such as a quantized MLX build) is marked "different target" and compared
across block sizes only.

The comparison is saved next to the session as `<session>.replay-<YYYYmmdd-HHMMSS>.json`:

    {
      "schema": "dflash-replay/2",             # /1 files (one pass, no repeats) still load
      "session": "20261129-194200-3fa9",       "session_path": ".../20261129-194200-3fa9.jsonl",
      "created": "2026-11-29T20:10:00+00:00",
      "engine": "cuda", "device": "cpu", "dtype": "float32",
      "target": "/path/of/replayed/target",    "recorded_target": "/path/of/recorded/target",
      "draft": "z-lab/Qwen3-8B-DFlash-b16",     "draft_arch": "dflash" | "dflash2",  # the draft replayed (null: none;
                                               # both absent from files written before they were recorded)
      "recorded_engine": "cuda",               "same_target": true,
      "temperature": 0.0,                       "greedy": true,
      "block_sizes": [1, 2, 4, 8, 16],
      "turns": [{"index": 0, "user": "What is 48 + 75?", "prompt_tokens": 21, "recorded_tokens": 40,
                 "recorded_block_size": 16}],
      "rows": [{                                 # one per block size, in block_sizes order
        "block_size": 4,
        "generated_tokens": 40, "steps": 14,     # verify steps (the prefill token is not a step)
        "tau": 2.79,                             # mean acceptance length over all turns
        "histogram": [3, 2, 4, 5],               # steps with acceptance length 1..block_size
                                                 # (steps, tau, histogram: null when the server did not say)
        "decode_tokens_per_s": 312.0,            # the fastest pass, all turns: (tokens - 1 per turn) / decode s
        "repeats": 3, "repeat_rates": [312.0, 298.5, 305.1],  # each pass's rate; spread = max - min
        "speedup": 2.1,                          # decode_tokens_per_s / block 1's (block 1 row: 1.0)
        "ttft_s": 0.012,                         # mean time to first token
        "peak_memory_bytes": 123456, "peak_memory_kind": "device" | "process-lifetime-rss",  # null: unknown
        "identical_to_recording": true | false | null,     # every pass; null: sampled, a different target, or no recorded ids
        "identical_across_block_sizes": true | false | null,  # vs the block 1 row; null when sampled
        "turns": [{"index": 0, "token_ids": [...], "pieces": [["Hel", "draft"], ["lo", "target"]],
                   "acceptance_lengths": [...], "generated_tokens": 40, "decode_tokens_per_s": 300.0,
                   "ttft_s": 0.01, "finish_reason": "stop"}]
      }],
      "differences": [{"turn": 0, "block_size": 8, "against": "recording" | "block 1", "position": 17,
                       "expected": 42, "got": 43, "margin": 0.0012, "top2": [42, 43]}],
      "warnings": ["..."]
    }
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dflash_tui.core import sessions
from dflash_tui.core.conversation import draft_arch, running_draft
from dflash_tui.core.figures import draft_text, fixed
from dflash_tui.core.terminal import counted, printable
from dflash_tui.engines import files
from dflash_tui.engines.config import MAX_BLOCK_SIZE, SAMPLING_FIELDS, EngineConfig, GenerationRequest
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.guided import Constraint
from dflash_tui.measure.report import CHECK, CROSS, format_bytes, histogram_text, millis, repeats_note, spread_cell, table, times
from dflash_tui.measure.report import chart as report_chart
from dflash_tui.measure.runs import (
    Counter,
    ProgressFn,
    Record,
    Run,
    Totals,
    add_speedups,
    best_pass,
    check_repeats,
    load_json,
    run,
)

SCHEMA = "dflash-replay/2"
SCHEMAS = ("dflash-replay/1", SCHEMA)  # what loads: /1 rows lack repeats (one pass each)
DEFAULT_BLOCK_SIZES = (1, 2, 4, 8, 16)
DEFAULT_REPEATS = 3
_SCHEMA_TEXT = __doc__.split("`<session>.replay-<YYYYmmdd-HHMMSS>.json`:", 1)[1]
JSON_SCHEMA_HELP = f"\b\nThe saved comparison and --json (schema \"{SCHEMA}\"):\n" + "\n".join(
    line[4:] for line in _SCHEMA_TEXT.splitlines() if line.startswith("    "))


class ReplayCancelled(Exception):
    """The person stopped the replay (the TUI's escape)."""


# -- input -----------------------------------------------------------------------------------------


def parse_block_sizes(text, add_one: bool = True) -> list[int]:
    """'1,2,4,8,16' -> [1, 2, 4, 8, 16] (sorted, unique; block 1 added as the speedup baseline)."""
    if isinstance(text, (list, tuple)):
        parts = [str(p) for p in text]
    else:
        parts = re.split(r"\s*,\s*|\s+", str(text).strip())  # commas, spaces or both between the sizes
    if parts == [""]:
        raise UserError("--block-sizes is empty; give a comma-separated list such as 1,2,4,8,16.")
    if "" in parts:
        raise UserError(f"--block-sizes {printable(repr(str(text)))} has an empty entry; give a comma-separated list "
                        "such as 1,2,4,8,16.")
    sizes = set()
    for part in parts:
        try:
            value = int(part)
        except ValueError:
            raise UserError(f"Block size {printable(repr(part))} is not a whole number; give a comma-separated list such as "
                            "1,2,4,8,16.") from None
        if not 1 <= value <= MAX_BLOCK_SIZE:
            raise UserError(f"Block size {value} is out of range; choose block sizes from 1 to {MAX_BLOCK_SIZE}.")
        sizes.add(value)
    if add_one:
        sizes.add(1)
    return sorted(sizes)


@dataclass
class RecordedTurn:
    index: int
    user: str
    prompt_ids: list[int]
    recorded_ids: list[int]
    settings: dict

    def request(self, block_size: int, temperature: Optional[float] = None,
                cancel: Optional[threading.Event] = None) -> GenerationRequest:
        s = self.settings
        sampling: dict[str, Any] = {name: s.get(name) for name in SAMPLING_FIELDS}
        if temperature is not None:
            sampling["temperature"] = temperature
        request = GenerationRequest(
            prompt_ids=list(self.prompt_ids), block_size=block_size,
            max_new_tokens=int(s.get("max_new_tokens") or max(len(self.recorded_ids), 1)),
            seed=int(s.get("seed") or 0), thinking=bool(s.get("thinking", True)),
            constraint=Constraint.from_dict(s["constraint"]) if s.get("constraint") else None, **sampling,
        )
        if cancel is not None:
            request.cancel = cancel
        return request


def recorded_turns(session: sessions.Session) -> list[RecordedTurn]:
    """The turns that completed (cancelled and failed ones are not replayed)."""
    out = []
    for position, turn in enumerate(session.turns):
        if turn.get("status", "completed") != "completed" or not turn.get("prompt_ids"):
            continue
        out.append(RecordedTurn(index=int(turn.get("index", position)), user=turn.get("user", ""),
                                prompt_ids=[int(i) for i in turn["prompt_ids"]],
                                recorded_ids=[int(i) for i in turn.get("emitted_ids") or []],
                                settings=dict(turn.get("settings") or {})))
    if not out:
        raise UserError(f"Session {session.id} has no completed turn to replay (cancelled turns are skipped); "
                        "pick another with `dflash sessions list`.")
    return out


def engine_config_for(session: sessions.Session, engine: Optional[str] = None, device: Optional[str] = None,
                      dtype: Optional[str] = None) -> EngineConfig:
    """What to load for a replay: on the recorded engine, the recorded target and draft (exactly); on
    another engine, the session's profile resolved for that engine (its [engines.<name>] overrides may
    name another target, e.g. a quantized MLX build)."""
    from dflash_tui.engines import choose_engine

    header = session.header
    snapshot = header.get("profile") or {}
    recorded_engine = header.get("engine")
    chosen = choose_engine(engine or recorded_engine or "auto")
    flags = {"device": device, "dtype": dtype}
    if chosen != recorded_engine and snapshot.get("path") and Path(snapshot["path"]).is_file():
        from dflash_tui.core.profiles import load_profile

        return load_profile(snapshot["path"]).engine_config(chosen, **flags)
    target = header.get("target_path") or header.get("target")
    if not target:
        raise UserError(f"Session {session.id} does not record its target; it cannot be replayed.")
    draft = header.get("draft_path") or header.get("draft")
    recorded_dtype = header.get("dtype")
    if recorded_dtype not in ("float32", "float16", "bfloat16") or chosen != recorded_engine:
        recorded_dtype = snapshot.get("dtype") or "auto"
    if device is not None or dtype is not None:  # a bad flag is blamed on the command line, not on the session
        EngineConfig(target=str(target), engine=chosen, source="the command line", device=device or "auto",
                     dtype=dtype or "auto")
    return EngineConfig(
        target=str(target), draft=str(draft) if draft else None, engine=chosen, device=device or "auto",
        dtype=dtype or recorded_dtype, draft_window=snapshot.get("draft_window"),
        source=f"session {session.id}",
    )


def _same_path(a, b) -> bool:
    if not a or not b:
        return False
    try:
        return Path(str(a)).resolve() == Path(str(b)).resolve()
    except OSError:
        return str(a) == str(b)


def same_target(session: sessions.Session, engine) -> bool:
    """Whether `engine` runs the target the session was recorded with (same checkpoint)."""
    header = session.header
    path = engine.target_info.path
    if _same_path(path, header.get("target_path")):
        return True
    config = engine.config
    return bool(config.target) and config.target == header.get("target") and \
        not header.get("target_path")


# -- running ---------------------------------------------------------------------------------------


def run_turn(engine, request: GenerationRequest) -> Run:
    """One generation (ReplayCancelled when the person stopped it)."""
    record = run(engine, request)
    if record.finish_reason == "cancelled":
        raise ReplayCancelled()
    return record


def first_difference(a: list[int], b: list[int]) -> Optional[int]:
    """The first position where two id lists differ (a length difference counts), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


TURN_KEYS = ("token_ids", "pieces", "acceptance_lengths", "generated_tokens", "decode_tokens_per_s", "ttft_s",
             "finish_reason")  # what a row keeps of each turn's run


@dataclass(eq=False)
class ReplayRow(Totals):
    """One block size (module docstring)."""

    identical_to_recording: Optional[bool] = None  # None: sampled, a different target, or no recorded ids
    identical_across_block_sizes: Optional[bool] = None  # vs the first row; None when sampled
    turns: list[dict] = field(default_factory=list)


@dataclass(eq=False)
class ReplayResult(Record):
    """A whole comparison, as it is saved next to its session (module docstring)."""

    NESTED = {"rows": ReplayRow}

    schema: str = SCHEMA
    session: str = ""
    session_path: str = ""
    created: str = ""
    engine: str = ""
    device: str = ""
    dtype: str = ""
    target: str = ""
    draft: Optional[str] = None  # the draft replayed, as it was given (hub id or path); None: none, or not recorded
    draft_arch: Optional[str] = None  # its architecture: 'dflash' (DFlash 1) or 'dflash2'
    recorded_target: Optional[str] = None
    recorded_engine: Optional[str] = None
    same_target: bool = False
    temperature: float = 0.0
    greedy: bool = False
    block_sizes: list[int] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    rows: list[ReplayRow] = field(default_factory=list)
    differences: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def aggregate(block_size: int, turns: list[RecordedTurn], passes: list[list[Run]]) -> ReplayRow:
    """The row of one block size: the fastest pass's numbers and turns, every pass's rate."""
    kept = [{"index": t.index, **{k: v for k, v in vars(r).items() if k in TURN_KEYS}}
            for t, r in zip(turns, best_pass(passes))]
    return ReplayRow.of(block_size, passes, turns=kept)


def effective_temperature(engine, turns: list[RecordedTurn], temperature: Optional[float]) -> float:
    """The temperature the replay samples at (a request's None takes the generation_config's)."""
    from dflash_tui.engines.sampling import resolve_sampling

    values = {resolve_sampling(t.request(1, temperature), engine.generation_config).temperature for t in turns}
    return max(values)


def run_replay(engine, session: sessions.Session, block_sizes: list[int], temperature: Optional[float] = None,
               progress: Optional[ProgressFn] = None, cancel: Optional[threading.Event] = None,
               warmup: bool = True, repeats: int = DEFAULT_REPEATS) -> ReplayResult:
    """Re-run every completed turn `repeats` times at every block size on `engine`; the comparison (module
    docstring)."""
    check_repeats(repeats)
    turns = recorded_turns(session)
    block_sizes = parse_block_sizes(block_sizes)
    has_draft = engine.draft_info is not None
    warnings = list(session.warnings)
    if not has_draft and any(b > 1 for b in block_sizes):
        warnings.append("The replayed target has no draft; only block size 1 runs.")
        block_sizes = [1]
    cancel = cancel or threading.Event()
    temp = effective_temperature(engine, turns, temperature)
    greedy = temp <= 0
    # Compared with the recording only where it holds ids from the same target: a server that streams text
    # alone (llama.cpp, say) records none, and those turns are compared between block sizes only.
    same = same_target(session, engine)
    matched = same and all(t.recorded_ids for t in turns)

    def check() -> None:
        if cancel.is_set():
            raise ReplayCancelled()

    counter = Counter(len(block_sizes) * (len(turns) * repeats + (1 if warmup else 0)), progress, check)
    results: dict[int, list[list[Run]]] = {}  # block size -> passes -> one run per turn
    for block in block_sizes:
        if warmup:  # first calls pay one-time costs (allocations, kernels); keep them out of the timings
            counter.tick(f"warm-up, block {block}")
            warm = turns[0].request(block, temperature, cancel)
            warm.max_new_tokens = min(8, warm.max_new_tokens)
            run_turn(engine, warm)
        results[block] = []
        for n in range(1, repeats + 1):
            results[block].append([])
            for turn in turns:
                counter.tick(f"block {block} · run {n}/{repeats} · turn {turn.index + 1}")
                results[block][-1].append(run_turn(engine, turn.request(block, temperature, cancel)))
    counter.end("comparing")

    rows = [aggregate(b, turns, results[b]) for b in block_sizes]
    add_speedups(rows, block_1=True)
    differences = []
    margins: dict[tuple, tuple] = {}

    def margin_at(turn: RecordedTurn, ids: list[int], position: int):
        key = (turn.index, tuple(ids[:position]))
        if key not in margins:
            found = engine.top2_margin(turn.prompt_ids + list(ids[:position]))
            margins[key] = (found.value, found.top2)
        return margins[key]

    if greedy:  # every pass is checked, not only the fastest one
        reference = results[block_sizes[0]][0]
        seen: set[tuple] = set()
        for row, block in zip(rows, block_sizes):
            same_rec, same_ref = True, True
            for turn, run, ref in ((t, r, f) for one in results[block] for t, r, f in zip(turns, one, reference)):
                checks = [("block %d" % block_sizes[0], ref.token_ids)] if block != block_sizes[0] else []
                if matched:
                    checks.insert(0, ("recording", turn.recorded_ids))
                for against, expected in checks:
                    pos = first_difference(expected, run.token_ids)
                    key = (block, turn.index, against, tuple(run.token_ids))
                    if pos is None or key in seen:
                        continue  # no difference, or one another pass already listed
                    seen.add(key)
                    if against == "recording":
                        same_rec = False
                    else:
                        same_ref = False
                    margin, top2 = margin_at(turn, expected, pos)
                    differences.append({
                        "turn": turn.index, "block_size": block, "against": against, "position": pos,
                        "expected": expected[pos] if pos < len(expected) else None,
                        "got": run.token_ids[pos] if pos < len(run.token_ids) else None,
                        "margin": margin, "top2": top2,
                    })
            row.identical_to_recording = same_rec if matched else None
            row.identical_across_block_sizes = same_ref
    else:
        warnings.append(f"Sampled at temperature {temp:g}: outputs are not compared (replay with --temperature 0 "
                        "to check that every block size gives the identical text).")
    header = session.header
    return ReplayResult(
        session=session.id, session_path=str(session.path), created=sessions.now_iso(),
        engine=engine.name, device=engine.device, dtype=engine.dtype, target=str(engine.target_info.path),
        draft=running_draft(engine), draft_arch=draft_arch(engine),
        recorded_target=header.get("target_path") or header.get("target"),
        recorded_engine=header.get("engine"), same_target=same, temperature=temp, greedy=greedy,
        block_sizes=block_sizes,
        turns=[{"index": t.index, "user": t.user, "prompt_tokens": len(t.prompt_ids),
                "recorded_tokens": len(t.recorded_ids), "recorded_block_size": t.settings.get("block_size")}
               for t in turns],
        rows=rows, differences=differences, warnings=warnings,
    )


def comparison_folder(session_path: Path) -> Path:
    """Where a session's comparisons go: beside it when it is one of dflash's own session files, else (a file
    elsewhere, or a link) in the data folder's `replays/`: dflash never writes beside a file it does not own."""
    if sessions.own_problem(session_path) is None:
        return session_path.parent
    return sessions.data_dir() / "replays"


def save_comparison(comparison: ReplayResult, session_path: Optional[Path] = None) -> Path:
    """Write the comparison into dflash's own folders (comparison_folder; never touching the session itself),
    as a new file (engines/files.py). A folder that cannot take it (read-only, full) is one sentence naming the
    file, and no partial file stays."""
    session_path = Path(session_path or comparison["session_path"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = session_path.with_suffix("").name
    folder = sessions.private_dir(comparison_folder(session_path))
    data = (json.dumps(comparison.to_dict(), ensure_ascii=False, indent=1) + "\n").encode("utf-8")
    n = 1
    while True:
        path = folder / f"{base}.replay-{stamp}{f'-{n}' if n > 1 else ''}.json"
        try:
            files.write_file(path, data, mode=0o600, replace=False)
            return path
        except FileExistsError:
            n += 1
        except OSError as exc:
            raise UserError(printable(f"The comparison cannot be saved to {path} ({exc.strerror}); free space or "
                                      "make the sessions folder writable, or pass --no-save (--json prints it)."))\
                from None


def saved_comparisons(session_path: Path) -> list[Path]:
    return sessions.companion_files(comparison_folder(Path(session_path)) / Path(session_path).name)


# -- presenting ------------------------------------------------------------------------------------

def identity_mark(row: ReplayRow, comparison: ReplayResult) -> str:
    """✓ / ✗ text for a row: identical to the recording and across block sizes."""
    if not comparison["greedy"]:
        return "sampled"
    parts = []
    if comparison["same_target"]:
        parts.append(f"{CHECK if row['identical_to_recording'] else CROSS} recording")
    else:
        parts.append("different target")
    if row["identical_across_block_sizes"] is not None and row["block_size"] != comparison["block_sizes"][0]:
        parts.append(f"{CHECK if row['identical_across_block_sizes'] else CROSS} block {comparison['block_sizes'][0]}")
    return " · ".join(parts)


IDENTICAL_COLUMN = 1  # the answer to "is it lossless?" comes first, where an 80-column screen shows it


def table_rows(comparison: ReplayResult) -> tuple[list[str], list[list[str]]]:
    """Column titles and the cells of the comparison table (shared by the CLI and the TUI), the most read
    ones first: a narrow screen cuts from the right."""
    titles = ["block", "identical", "tok/s", "spread", "runs", "speedup", "tau", "acceptance 1..B", "TTFT", "peak mem"]
    cells = []
    for row in comparison["rows"]:
        peak = format_bytes(row["peak_memory_bytes"]) + ("*" if row["peak_memory_kind"] == "process-lifetime-rss" else "")
        cells.append([str(row["block_size"]), identity_mark(row, comparison), f"{row['decode_tokens_per_s']:.1f}",
                      spread_cell(row), str(row["repeats"]), times(row["speedup"]), fixed(row["tau"]),
                      histogram_text(row["histogram"]), millis(row["ttft_s"]), peak])
    return titles, cells


def draft_line(comparison: ReplayResult) -> Optional[str]:
    """'draft draft2 (DFlash 2)': which draft the table's rows ran; None for a target alone (its rows are block 1
    only) and for a comparison saved before the draft was recorded."""
    draft = comparison["draft"]
    return printable(f"draft {draft_text(draft, comparison['draft_arch'])}") if draft else None


def format_table(comparison: ReplayResult, colour: bool = False) -> str:
    titles, cells = table_rows(comparison)
    lines = table(titles, cells, left=(IDENTICAL_COLUMN, 7), marks=IDENTICAL_COLUMN, colour=colour)
    lines.append(repeats_note(comparison["rows"]))
    if any(r["peak_memory_kind"] == "process-lifetime-rss" for r in comparison["rows"]):
        lines.append("* process peak RSS over the whole run (no device memory counter on this engine/device)")
    return "\n".join(lines)


def verdict(comparison: ReplayResult) -> str:
    """One sentence: are the outputs identical?"""
    if not comparison["greedy"]:
        return f"Sampled at temperature {comparison['temperature']:g}: outputs not compared."
    n = len(comparison["turns"])
    blocks = ", ".join(str(b) for b in comparison["block_sizes"])
    diffs = comparison["differences"]
    if not diffs:
        against = "the recording and each other" if comparison["same_target"] else \
            "each other (different target: not compared to the recording)"
        runs = sorted({r["repeats"] for r in comparison["rows"]})
        every = f" in every run ({'/'.join(map(str, runs))} per block size)" if runs != [1] else ""
        return f"{CHECK} All {counted(n, 'turn')} identical at block sizes {blocks}{every}: equal to {against}."
    return f"{CROSS} {counted(len(diffs), 'difference')} found (listed below)."


def difference_lines(comparison: ReplayResult) -> list[str]:
    out = []
    for d in comparison["differences"]:
        margin = "unknown" if d["margin"] is None else f"{d['margin']:.4g}"
        out.append(f"turn {d['turn'] + 1}, block {d['block_size']} vs {d['against']}: first differs at token "
                   f"{d['position']} (expected {d['expected']}, got {d['got']}); target top-2 margin there {margin}")
    return out


def chart(comparison: ReplayResult, colour: bool = False, width: int = 80, height: int = 14) -> str:
    """The speedup and tau of every row as bar charts (report.chart)."""
    return report_chart(comparison["rows"], colour, width, height)


def report(comparison: ReplayResult, colour: bool = False, width: int = 80) -> str:
    """The whole human-readable comparison: header, table, chart, verdict and differences."""
    c = comparison
    target = "same target as recorded" if c["same_target"] else f"different target ({c['target']})"
    drafted = draft_line(c)  # which draft the rows ran
    head = printable(f"replay of session {c['session']} · {c['engine']} engine on {c['device']} · {c['dtype']} · "
                     f"{target} · {f'{drafted} · ' if drafted else ''}temperature {c['temperature']:g} · "
                     f"{len(c['turns'])} turn{'s' if len(c['turns']) != 1 else ''}")
    parts = [head, "", format_table(c, colour), "", chart(c, colour, width), "", verdict(c)]
    parts += difference_lines(c)
    return "\n".join(parts)


def load_comparison(path: Path) -> ReplayResult:
    """A saved comparison, from this version or an older one."""
    return ReplayResult.from_dict(load_json(path, SCHEMAS, "replay comparison"))
