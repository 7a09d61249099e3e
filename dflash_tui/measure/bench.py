"""`dflash bench`: prompt sets and the benchmark runner (no UI framework here).

Prompt sets are JSONL in the public DFlash benchmark format, one sample per line: `{"turns": ["first
user message", "second", ...]}` (other keys are ignored). A multi-turn sample runs each turn with the
earlier turns and the answers generated for them as history. Built-in sets, written by this project,
ship in `dflash_tui/prompts/`: chat, math, code and demo (the demo pair's domain: arithmetic, units,
counting, sorting). The public names gsm8k, math500, humaneval, mbpp and mt-bench load through the
optional `datasets` package when the network allows; otherwise they are one clear error.

Each block size runs one warm-up generation (not counted), then every turn `repeats` times (passes over
the whole set); a row is the fastest pass, and keeps every pass's rate so the spread shows (runs.py).
Block 1 (plain decoding on the same engine) is the baseline of the speedup, and the framework's own
generate (transformers' `generate` on the CUDA engine, mlx-lm's `generate_step` on MLX) over block 1's
prompt ids, repeated the same way, is a second baseline. Throughput is decode tokens per second:
(tokens - 1) / time after the first token, summed over turns.

`--json` prints, and `--output FILE` writes (schema "dflash-bench/2"):

    {
      "schema": "dflash-bench/2",                 # /1 files (one pass, no repeats) still load
      "created": "2026-11-29T20:10:00+00:00",
      "profile": "demo", "dataset": "demo", "samples": 16, "turns": 16,
      "engine": "cuda", "device": "cpu", "dtype": "float32", "target": "...", "draft": "...",
      "max_new_tokens": 256, "temperature": 0.0, "thinking": false,
      "framework": {                              # null with --no-framework or where unavailable
        "name": "transformers generate",          # or "mlx-lm generate_step"
        "generated_tokens": 2034, "decode_tokens_per_s": 410.2, "ttft_s": 0.004,
        "repeats": 3, "repeat_rates": [410.2, 399.0, 405.7],
        "identical_to_block_1": true              # null when sampled
      },
      "rows": [{                                  # one per block size, ascending; block 1 first
        "block_size": 16,
        "generated_tokens": 2034, "steps": 380,   # verify steps (the prefill token is not a step)
        "decode_tokens_per_s": 1234.5,            # the fastest pass
        "repeats": 3,                             # passes after the warm-up
        "repeat_rates": [1234.5, 1190.2, 1201.7], # each pass's decode tok/s; spread = max - min
        "speedup": 3.09,                          # best vs block 1's best, same engine (block 1: 1.0)
        "speedup_vs_framework": 3.01,             # vs the framework baseline; null without it
        "tau": 5.35,                              # mean acceptance length
        "histogram": [12, 30, ...],               # steps with acceptance length 1..block_size
                                                  # (steps, tau, histogram: null when the server did not say)
        "ttft_s": 0.004,                          # mean time to first token
        "peak_memory_bytes": 123456789, "peak_memory_kind": "device" | "process-lifetime-rss",  # null: unknown
        "identical_to_block_1": true              # every pass's ids equal block 1's; null when sampled
      }],
      "best_block_size": 16                       # the fastest row
    }
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from dflash_tui.core.figures import fixed
from dflash_tui.core.terminal import printable
from dflash_tui.engines.config import GenerationRequest
from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.measure import prompts
from dflash_tui.measure.replay import DEFAULT_BLOCK_SIZES, DEFAULT_REPEATS, parse_block_sizes
from dflash_tui.measure.report import histogram_line, histogram_text, mark, millis, repeats_note, spread_cell, table, times
from dflash_tui.measure.runs import (
    Counter,
    ProgressFn,
    Record,
    Run,
    Totals,
    add_speedups,
    best_pass,
    check_repeats,
    decode_rate,
    load_json,
    mean_ttft,
    run,
    same_ids,
)

SCHEMA = "dflash-bench/2"
SCHEMAS = ("dflash-bench/1", SCHEMA)  # what loads: /1 rows lack repeats (one pass each)
BUILTIN_SETS = prompts.NAMES
# name -> (hub dataset, config, split, field that holds the prompt)
PUBLIC_SETS = {
    "gsm8k": ("openai/gsm8k", "main", "test", "question"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "problem"),
    "humaneval": ("openai/openai_humaneval", None, "test", "prompt"),
    "mbpp": ("google-research-datasets/mbpp", "full", "test", "text"),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", "prompt"),
}
DEFAULT_MAX_NEW = 512
_SCHEMA_TEXT = __doc__.split(f'(schema "{SCHEMA}"):', 1)[1]
JSON_SCHEMA_HELP = f"\b\n--json prints, and --output FILE writes (schema \"{SCHEMA}\"):\n" + "\n".join(
    line[4:] for line in _SCHEMA_TEXT.splitlines() if line.startswith("    "))


# -- prompt sets -----------------------------------------------------------------------------------


def parse_jsonl(text: str, where: str) -> list[dict]:
    """Samples from JSONL text in the public format; a bad line is an error naming `where:line`."""
    samples = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except ValueError as exc:
            raise UserError(printable(f"{where}:{number}: the line is not valid JSON ({exc}); write one object per "
                                      'line such as {"turns": ["What is 48 + 75?"]}.')) from None
        turns = record.get("turns") if isinstance(record, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(printable(f"{where}:{number}: the line needs \"turns\", a non-empty list of non-empty "
                                      'strings, such as {"turns": ["What is 48 + 75?"]}.'))
        samples.append({"turns": list(turns)})
    if not samples:
        raise UserError(printable(f"{where} has no samples; write one JSON object per line such as "
                                  '{"turns": ["What is 48 + 75?"]}.'))
    return samples


def builtin_set(name: str) -> list[dict]:
    text = importlib.resources.files("dflash_tui.measure.prompts").joinpath(f"{name}.jsonl").read_text(encoding="utf-8")
    return parse_jsonl(text, f"built-in prompt set {name}")


def public_set(name: str) -> list[dict]:
    repo, config, split, key = PUBLIC_SETS[name]
    try:
        import datasets  # optional dependency
    except ImportError:
        raise UserError(f"The public dataset '{name}' needs the `datasets` package and the network; install it with "
                        "`pip install datasets`, or use a built-in set (" + ", ".join(BUILTIN_SETS) +
                        ") or a JSONL file.") from None
    try:
        data = datasets.load_dataset(repo, config, split=split) if config else datasets.load_dataset(repo, split=split)
    except Exception as exc:  # noqa: BLE001 - offline, missing, renamed: one sentence
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UserError(f"The public dataset '{name}' ({repo}) could not be loaded ({reason}); it needs the network, "
                        "so use a built-in set (" + ", ".join(BUILTIN_SETS) + ") or a JSONL file.") from None
    samples = []
    for row in data:
        value = row[key]
        turns = [str(t) for t in value] if isinstance(value, list) else [str(value)]
        samples.append({"turns": turns})
    return samples


def load_dataset(name: str, max_samples: Optional[int] = None) -> tuple[list[dict], str]:
    """(samples, display name) for a built-in set, a JSONL file or a public name."""
    if max_samples is not None and max_samples < 1:
        raise UserError(f"--max-samples {max_samples} must be at least 1.")
    path = Path(name).expanduser()
    if name in BUILTIN_SETS:
        samples, label = builtin_set(name), name
    elif path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(printable(f"Prompt file {path} cannot be read ({exc}); give a UTF-8 JSONL file.")) from None
        samples, label = parse_jsonl(text, str(path)), path.name
    elif name.lower() in PUBLIC_SETS:
        samples, label = public_set(name.lower()), name.lower()
    elif path.is_dir():
        raise UserError(printable(f"Prompt file {path} is a folder; name a JSONL file in it."))
    elif path.suffix in (".jsonl", ".json") or "/" in name:
        raise UserError(printable(f"Prompt file {path} does not exist; check the path."))
    else:
        raise UserError(f"Dataset {printable(repr(name))} is unknown; choose a built-in set ({', '.join(BUILTIN_SETS)}), a public one "
                        f"({', '.join(PUBLIC_SETS)}) or a JSONL file.")
    return (samples[:max_samples] if max_samples else samples), label


def default_dataset(profile) -> str:
    """The profile's `[bench] prompts`, else the general chat set (the profile's name decides nothing)."""
    return profile.bench_prompts or "chat"


def max_new_for(flag: Optional[int], profile) -> int:
    if flag is not None:
        if flag < 1:
            raise UserError(f"--max-new-tokens {flag} must be at least 1.")
        return flag
    return min(profile.max_new_tokens or DEFAULT_MAX_NEW, DEFAULT_MAX_NEW)


def block_sizes_for(text: Optional[str], profile, config) -> list[int]:
    """--block-sizes, else 1,2,4,8,16 and the profile's; block 1 only without a draft."""
    if not config.draft:
        if text is not None and any(b > 1 for b in parse_block_sizes(text)):
            raise UserError("Block sizes above 1 need a draft; this profile has none (pass --draft or use block 1).")
        return [1]
    if text is not None:  # (an empty --block-sizes is refused, not read as the defaults)
        return parse_block_sizes(text)
    extra = [b for b in (profile.block_size, config.block_size) if b]
    return parse_block_sizes(list(DEFAULT_BLOCK_SIZES) + extra)


# -- running ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class BenchRow(Totals):
    """One block size (module docstring)."""

    speedup_vs_framework: Optional[float] = None  # vs the framework baseline; None without it
    identical_to_block_1: Optional[bool] = None  # every turn's ids equal block 1's; None when sampled


@dataclass(eq=False)
class FrameworkRow(Record):
    """The framework's own generate over block 1's prompt ids."""

    name: str = ""
    generated_tokens: int = 0
    decode_tokens_per_s: float = 0.0  # the fastest pass
    ttft_s: float = 0.0
    repeats: int = 1
    repeat_rates: list[float] = field(default_factory=list)
    identical_to_block_1: Optional[bool] = None


@dataclass(eq=False)
class BenchResult(Record):
    """A whole benchmark, as `--json` prints it and `--output` writes it (module docstring)."""

    NESTED = {"framework": FrameworkRow, "rows": BenchRow}

    schema: str = SCHEMA
    created: str = ""
    profile: str = "?"
    dataset: str = "?"
    samples: int = 0
    turns: int = 0
    engine: str = ""
    device: str = ""
    dtype: str = ""
    target: str = ""
    draft: Optional[str] = None
    max_new_tokens: int = 0
    temperature: float = 0.0
    thinking: bool = False
    framework: Optional[FrameworkRow] = None
    rows: list[BenchRow] = field(default_factory=list)
    best_block_size: int = 0


def load_result(path) -> BenchResult:
    """A `--json` file, from this version or an older one."""
    return BenchResult.from_dict(load_json(path, SCHEMAS, "benchmark"))


def messages_for(system_prompt: str, history: list[tuple[str, str]], user: str) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt and system_prompt.strip() else []
    for question, answer in history:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": user})
    return messages


def run_block(engine, samples: list[dict], block_size: int, max_new_tokens: int, temperature: float, thinking: bool,
              system_prompt: str = "", tick: Optional[Callable[[str], None]] = None) -> list[Run]:
    """Every turn of every sample at one block size; one run per turn (with its prompt ids)."""
    out = []
    for number, sample in enumerate(samples, 1):
        history: list[tuple[str, str]] = []
        for user in sample["turns"]:
            if tick:
                tick(f"block {block_size} · sample {number}")
            request = GenerationRequest(messages=messages_for(system_prompt, history, user), block_size=block_size,
                                        max_new_tokens=max_new_tokens, temperature=temperature, thinking=thinking)
            record = run(engine, GenerationRequest(
                prompt_ids=engine.prepare(request), block_size=block_size, max_new_tokens=max_new_tokens,
                temperature=temperature, thinking=thinking))
            out.append(record)
            history.append((user, record.text))
    return out


def labelled(tick: Callable[[str], None], n: int, repeats: int) -> Callable[[str], None]:
    """`tick` with 'run n/N' added to each label."""
    return lambda label: tick(f"{label} · run {n}/{repeats}")


# -- the framework's own generate ------------------------------------------------------------------


def run_framework(engine, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                  tick: Optional[Callable[[str], None]] = None) -> list:
    """The target alone through its framework's own generation loop (engines/baseline.py), per prompt."""
    out = []
    for number, ids in enumerate(prompts, 1):
        if tick:
            tick(f"{engine.baseline_name} · turn {number}")
        out.append(engine.baseline_generate(ids, max_new_tokens, temperature))
    return out


# -- the whole benchmark ---------------------------------------------------------------------------


def run_bench(engine, samples: list[dict], block_sizes: list[int], max_new_tokens: int = 256,
              temperature: float = 0.0, thinking: bool = False, framework: bool = True,
              progress: Optional[ProgressFn] = None, system_prompt: str = "", dataset: str = "?",
              profile: str = "?", warmup: bool = True, repeats: int = DEFAULT_REPEATS) -> BenchResult:
    """Block 1, every other block size, and the framework's generate, each `repeats` times (module docstring)."""
    from dflash_tui.core.sessions import now_iso

    check_repeats(repeats)
    block_sizes = parse_block_sizes(block_sizes)
    if engine.draft_info is None:
        block_sizes = [1]
    name = engine.baseline_name if framework else None
    n_turns = sum(len(s["turns"]) for s in samples)
    configurations = len(block_sizes) + (1 if name else 0)
    counter = Counter(configurations * (n_turns * repeats + (1 if warmup else 0)), progress)
    tick = counter.tick

    first_prompt = [{"turns": samples[0]["turns"][:1]}]
    passes: dict[int, list[list[Run]]] = {}
    for block in block_sizes:
        if warmup:
            tick(f"warm-up, block {block}")
            run_block(engine, first_prompt, block, min(16, max_new_tokens), temperature, thinking, system_prompt)
        passes[block] = [run_block(engine, samples, block, max_new_tokens, temperature, thinking, system_prompt,
                                   labelled(tick, n, repeats)) for n in range(1, repeats + 1)]
    rows = [BenchRow.of(b, passes[b]) for b in block_sizes]
    reference = passes[block_sizes[0]][0]
    add_speedups(rows)
    greedy = temperature <= 0
    if greedy:  # every pass is checked, not only the fastest one
        for block, row in zip(block_sizes, rows):  # a row's block size may be what a server reported instead
            row.identical_to_block_1 = all(same_ids(one, reference) for one in passes[block])
    framework_row = None
    if name:
        prompt_ids = [r.prompt_ids for r in reference]
        if warmup:
            tick(f"warm-up, {name}")
            engine.baseline_generate(prompt_ids[0], min(16, max_new_tokens), temperature)
        baseline = [run_framework(engine, prompt_ids, max_new_tokens, temperature, labelled(tick, n, repeats))
                    for n in range(1, repeats + 1)]
        fastest = best_pass(baseline)
        framework_row = FrameworkRow(
            name=name, generated_tokens=sum(r.generated_tokens for r in fastest),
            decode_tokens_per_s=decode_rate(fastest), ttft_s=mean_ttft(fastest), repeats=repeats,
            repeat_rates=[decode_rate(one) for one in baseline],
            identical_to_block_1=all(same_ids(one, reference) for one in baseline) if greedy else None)
        for row in rows:
            if framework_row.decode_tokens_per_s:
                row.speedup_vs_framework = row.decode_tokens_per_s / framework_row.decode_tokens_per_s
    counter.end("done")
    best = max(rows, key=lambda r: (r.decode_tokens_per_s, -r.block_size))
    return BenchResult(
        created=now_iso(), profile=profile, dataset=dataset, samples=len(samples), turns=n_turns,
        engine=engine.name, device=engine.device, dtype=engine.dtype, target=str(engine.target_info.path),
        draft=str(engine.draft_info.path) if engine.draft_info else None, max_new_tokens=max_new_tokens,
        temperature=temperature, thinking=thinking, framework=framework_row, rows=rows,
        best_block_size=best.block_size)


def format_result(result: BenchResult, colour: bool = False) -> str:
    """The benchmark as a table plus, per block size, the public benchmark's summary lines."""
    import click

    r = result
    lines = [printable(f"bench {r['profile']} on {r['dataset']} ({r['samples']} samples, {r['turns']} turns) · "
                       f"{r['engine']} engine on {r['device']} · {r['dtype']} · temperature {r['temperature']:g} · "
                       f"thinking {'on' if r['thinking'] else 'off'} · at most {r['max_new_tokens']} new tokens"), ""]
    fw = r["framework"]
    titles = ["block", "tokens", "tok/s", "spread", "runs", "speedup", "vs " + (fw["name"].split()[0] if fw else "framework"),
              "tau", "acceptance 1..B", "TTFT", "same as block 1"]
    cells = []
    for row in r["rows"]:
        cells.append([str(row["block_size"]), str(row["generated_tokens"]), f"{row['decode_tokens_per_s']:.1f}",
                      spread_cell(row), str(row["repeats"]), times(row["speedup"]), times(row["speedup_vs_framework"]),
                      fixed(row["tau"]), histogram_text(row["histogram"]), millis(row["ttft_s"]),
                      mark(row["identical_to_block_1"])])
    if fw:
        cells.append([fw["name"], str(fw["generated_tokens"]), f"{fw['decode_tokens_per_s']:.1f}", spread_cell(fw),
                      str(fw["repeats"]), "", "1.00x", "", "", millis(fw["ttft_s"]), mark(fw["identical_to_block_1"])])
    lines += table(titles, cells, left=(0, 8, 10))
    lines.append(repeats_note(r["rows"]))
    base = next((row for row in r["rows"] if row["block_size"] == 1), None)
    for row in r["rows"]:
        if row["block_size"] == 1:
            continue
        lines.append("")
        lines.append(click.style(f"block size {row['block_size']}", bold=True) if colour else f"block size {row['block_size']}")
        if base:
            lines.append(f"  Baseline throughput (block 1): {base['decode_tokens_per_s']:.1f} tok/s")
        if fw:
            lines.append(f"  Baseline throughput ({fw['name']}): {fw['decode_tokens_per_s']:.1f} tok/s")
        lines.append(f"  DFlash throughput: {row['decode_tokens_per_s']:.1f} tok/s")
        if row["speedup"] is not None:
            lines.append(f"  Decoding speedup: {row['speedup']:.2f}x"
                         + (f" ({row['speedup_vs_framework']:.2f}x vs {fw['name']})" if row["speedup_vs_framework"] else ""))
        lines.append(f"  Average acceptance length: {fixed(row['tau'])}")
        lines.append(f"  Acceptance length histogram: {histogram_line(row['histogram'])}")
    lines.append("")
    lines.append(f"fastest: block size {r['best_block_size']}")
    return "\n".join(lines)
