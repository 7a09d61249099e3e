"""`dflash bench`: prompt sets and the benchmark runner (no UI framework here).

Prompt sets are JSONL in the public DFlash benchmark format, one sample per line: `{"turns": ["first
user message", "second", ...]}` (other keys are ignored). A multi-turn sample runs each turn with the
earlier turns and the answers generated for them as history. Built-in sets, written by this project,
ship in `dflash_tui/prompts/`: chat, math, code and demo (the demo pair's domain: arithmetic, units,
counting, sorting). The public names gsm8k, math500, humaneval, mbpp and mt-bench load through the
optional `datasets` package when the network allows; otherwise they are one clear error.

Each block size runs every turn after one warm-up generation; block 1 (plain decoding on the same
engine) is the baseline of the speedup, and the framework's own generate (transformers' `generate` on
the CUDA engine, mlx-lm's `generate_step` on MLX) over block 1's prompt ids is a second baseline.
Throughput is decode tokens per second: (tokens - 1) / time after the first token, summed over turns.

`--json FILE` writes (schema "dflash-bench/1"):

    {
      "schema": "dflash-bench/1",
      "created": "2026-11-29T20:10:00+00:00",
      "profile": "demo", "dataset": "demo", "samples": 16, "turns": 16,
      "engine": "cuda", "device": "cpu", "dtype": "float32", "target": "...", "draft": "...",
      "max_new_tokens": 256, "temperature": 0.0, "thinking": false,
      "framework": {                              # null with --no-framework or where unavailable
        "name": "transformers generate",          # or "mlx-lm generate_step"
        "generated_tokens": 2034, "decode_tokens_per_s": 410.2, "ttft_s": 0.004,
        "identical_to_block_1": true              # null when sampled
      },
      "rows": [{                                  # one per block size, ascending; block 1 first
        "block_size": 16,
        "generated_tokens": 2034, "steps": 380,   # verify steps (the prefill token is not a step)
        "decode_tokens_per_s": 1234.5,
        "speedup": 3.09,                          # vs block 1 on the same engine (block 1: 1.0)
        "speedup_vs_framework": 3.01,             # vs the framework baseline; null without it
        "tau": 5.35,                              # mean acceptance length
        "histogram": [12, 30, ...],               # steps with acceptance length 1..block_size
        "ttft_s": 0.004,                          # mean time to first token
        "peak_memory_bytes": 123456789, "peak_memory_kind": "device" | "process-lifetime-rss",
        "identical_to_block_1": true              # every turn's ids equal block 1's; null when sampled
      }],
      "best_block_size": 16                       # the fastest row
    }
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Callable, Optional

from engines.config import GenerationRequest
from engines.errors import UserError
from engines.events import acceptance_histogram

from dflash_tui.measure.replay import DEFAULT_BLOCK_SIZES, ProgressFn, parse_block_sizes

SCHEMA = "dflash-bench/1"
BUILTIN_SETS = ("chat", "math", "code", "demo")
# name -> (hub dataset, config, split, field that holds the prompt)
PUBLIC_SETS = {
    "gsm8k": ("openai/gsm8k", "main", "test", "question"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "problem"),
    "humaneval": ("openai/openai_humaneval", None, "test", "prompt"),
    "mbpp": ("google-research-datasets/mbpp", "full", "test", "text"),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", "prompt"),
}
DEFAULT_MAX_NEW = 512
_SCHEMA_TEXT = __doc__.split('(schema "dflash-bench/1"):', 1)[1]
JSON_SCHEMA_HELP = "\b\n--json FILE writes (schema \"dflash-bench/1\"):\n" + "\n".join(
    line[4:] for line in _SCHEMA_TEXT.splitlines() if line.startswith("    "))


# -- prompt sets -----------------------------------------------------------------------------------


def parse_jsonl(text: str, where: str) -> list[dict]:
    """Samples from JSONL text in the public format; a bad line is an error naming `where:line`."""
    samples = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{where}:{number}: the line is not valid JSON ({exc.msg}); write one object per line "
                            'such as {"turns": ["What is 48 + 75?"]}.') from None
        turns = record.get("turns") if isinstance(record, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(f"{where}:{number}: the line needs \"turns\", a non-empty list of non-empty strings, "
                            'such as {"turns": ["What is 48 + 75?"]}.')
        samples.append({"turns": list(turns)})
    if not samples:
        raise UserError(f"{where} has no samples; write one JSON object per line such as "
                        '{"turns": ["What is 48 + 75?"]}.')
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
            raise UserError(f"Prompt file {path} cannot be read ({exc}); give a UTF-8 JSONL file.") from None
        samples, label = parse_jsonl(text, str(path)), path.name
    elif name.lower() in PUBLIC_SETS:
        samples, label = public_set(name.lower()), name.lower()
    elif path.suffix in (".jsonl", ".json") or "/" in name:
        raise UserError(f"Prompt file {path} does not exist; check the path.")
    else:
        raise UserError(f"Dataset '{name}' is unknown; choose a built-in set ({', '.join(BUILTIN_SETS)}), a public one "
                        f"({', '.join(PUBLIC_SETS)}) or a JSONL file.")
    return (samples[:max_samples] if max_samples else samples), label


def default_dataset(profile) -> str:
    return "demo" if profile.name == "demo" else "chat"


def max_new_for(flag: Optional[int], profile) -> int:
    if flag is not None:
        if flag < 1:
            raise UserError(f"--max-new-tokens {flag} must be at least 1.")
        return flag
    return min(profile.max_new_tokens or DEFAULT_MAX_NEW, DEFAULT_MAX_NEW)


def block_sizes_for(text: Optional[str], profile, config) -> list[int]:
    """--block-sizes, else 1,2,4,8,16 and the profile's; block 1 only without a draft."""
    if not config.draft:
        if text and any(b > 1 for b in parse_block_sizes(text)):
            raise UserError("Block sizes above 1 need a draft; this profile has none (pass --draft or use block 1).")
        return [1]
    if text:
        return parse_block_sizes(text)
    extra = [b for b in (profile.block_size, config.block_size) if b]
    return parse_block_sizes(list(DEFAULT_BLOCK_SIZES) + extra)


# -- running ---------------------------------------------------------------------------------------


def messages_for(system_prompt: str, history: list[tuple[str, str]], user: str) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt and system_prompt.strip() else []
    for question, answer in history:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": user})
    return messages


def _generate(engine, request: GenerationRequest) -> dict:
    for _ in engine.generate(request):
        pass
    s = engine.last_summary
    return {"token_ids": list(s.token_ids), "text": s.text, "acceptance_lengths": list(s.acceptance_lengths),
            "generated_tokens": s.generated_tokens, "decode_s": s.decode_s, "ttft_s": s.ttft_s,
            "peak_memory_bytes": s.peak_memory_bytes, "peak_memory_kind": s.peak_memory_kind}


def run_block(engine, samples: list[dict], block_size: int, max_new_tokens: int, temperature: float, thinking: bool,
              system_prompt: str = "", tick: Optional[Callable[[str], None]] = None) -> list[dict]:
    """Every turn of every sample at one block size; one record per turn (with its prompt ids)."""
    out = []
    for number, sample in enumerate(samples, 1):
        history: list[tuple[str, str]] = []
        for user in sample["turns"]:
            if tick:
                tick(f"block {block_size} · sample {number}")
            request = GenerationRequest(messages=messages_for(system_prompt, history, user), block_size=block_size,
                                        max_new_tokens=max_new_tokens, temperature=temperature, thinking=thinking)
            prompt_ids = engine.prepare(request)
            record = _generate(engine, GenerationRequest(
                prompt_ids=prompt_ids, block_size=block_size, max_new_tokens=max_new_tokens, temperature=temperature,
                thinking=thinking))
            record["prompt_ids"] = prompt_ids
            out.append(record)
            history.append((user, record["text"]))
    return out


def summarize(block_size: int, records: list[dict]) -> dict:
    lengths = [n for r in records for n in r["acceptance_lengths"]]
    decode_s = sum(r["decode_s"] for r in records)
    counted = sum(max(r["generated_tokens"] - 1, 0) for r in records)
    histogram = acceptance_histogram(lengths, block_size)
    return {
        "block_size": block_size, "generated_tokens": sum(r["generated_tokens"] for r in records),
        "steps": len(lengths), "decode_tokens_per_s": counted / decode_s if decode_s > 0 else 0.0,
        "speedup": None, "speedup_vs_framework": None,
        "tau": sum(lengths) / len(lengths) if lengths else 0.0, "histogram": histogram,
        "ttft_s": sum(r["ttft_s"] for r in records) / len(records) if records else 0.0,
        "peak_memory_bytes": max((r["peak_memory_bytes"] for r in records), default=0),
        "peak_memory_kind": records[0]["peak_memory_kind"] if records else "device",
        "identical_to_block_1": None,
    }


# -- the framework's own generate ------------------------------------------------------------------


def framework_generate(engine, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> dict:
    """The target alone through its framework's own generation loop (engines/baseline.py)."""
    run = engine.baseline_generate(prompt_ids, max_new_tokens, temperature)
    return {"token_ids": run.token_ids, "generated_tokens": run.generated_tokens, "ttft_s": run.ttft_s,
            "decode_s": run.decode_s}


def run_framework(engine, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                  tick: Optional[Callable[[str], None]] = None) -> list[dict]:
    out = []
    for number, ids in enumerate(prompts, 1):
        if tick:
            tick(f"{engine.baseline_name} · turn {number}")
        out.append(framework_generate(engine, ids, max_new_tokens, temperature))
    return out


# -- the whole benchmark ---------------------------------------------------------------------------


def run_bench(engine, samples: list[dict], block_sizes: list[int], max_new_tokens: int = 256,
              temperature: float = 0.0, thinking: bool = False, framework: bool = True,
              progress: Optional[ProgressFn] = None, system_prompt: str = "", dataset: str = "?",
              profile: str = "?", warmup: bool = True) -> dict:
    """Block 1, every other block size, and the framework's generate; the result dict (module docstring)."""
    from dflash_tui.core.sessions import now_iso

    block_sizes = parse_block_sizes(block_sizes)
    if engine.draft_info is None:
        block_sizes = [1]
    name = engine.baseline_name if framework else None
    n_turns = sum(len(s["turns"]) for s in samples)
    total = n_turns * (len(block_sizes) + (1 if name else 0)) + ((len(block_sizes) + (1 if name else 0)) if warmup else 0)
    state = {"done": 0}

    def tick(label: str) -> None:
        if progress:
            progress(state["done"], total, label)
        state["done"] += 1

    first_prompt = [{"turns": samples[0]["turns"][:1]}]
    records: dict[int, list[dict]] = {}
    for block in block_sizes:
        if warmup:
            tick(f"warm-up, block {block}")
            run_block(engine, first_prompt, block, min(16, max_new_tokens), temperature, thinking, system_prompt)
        records[block] = run_block(engine, samples, block, max_new_tokens, temperature, thinking, system_prompt, tick)
    rows = [summarize(b, records[b]) for b in block_sizes]
    base = rows[0]["decode_tokens_per_s"] if block_sizes[0] == 1 else None
    greedy = temperature <= 0
    for row in rows:
        if base:
            row["speedup"] = row["decode_tokens_per_s"] / base
        if greedy:
            row["identical_to_block_1"] = all(a["token_ids"] == b["token_ids"]
                                              for a, b in zip(records[row["block_size"]], records[block_sizes[0]]))
    framework_row = None
    if name:
        prompts = [r["prompt_ids"] for r in records[block_sizes[0]]]
        if warmup:
            tick(f"warm-up, {name}")
            framework_generate(engine, prompts[0], min(16, max_new_tokens), temperature)
        runs = run_framework(engine, prompts, max_new_tokens, temperature, tick)
        decode_s = sum(r["decode_s"] for r in runs)
        counted = sum(max(r["generated_tokens"] - 1, 0) for r in runs)
        framework_row = {
            "name": name, "generated_tokens": sum(r["generated_tokens"] for r in runs),
            "decode_tokens_per_s": counted / decode_s if decode_s > 0 else 0.0,
            "ttft_s": sum(r["ttft_s"] for r in runs) / len(runs),
            "identical_to_block_1": all(a["token_ids"] == b["token_ids"] for a, b in zip(runs, records[block_sizes[0]]))
            if greedy else None,
        }
        for row in rows:
            if framework_row["decode_tokens_per_s"]:
                row["speedup_vs_framework"] = row["decode_tokens_per_s"] / framework_row["decode_tokens_per_s"]
    if progress:
        progress(total, total, "done")
    best = max(rows, key=lambda r: (r["decode_tokens_per_s"], -r["block_size"]))
    return {
        "schema": SCHEMA, "created": now_iso(), "profile": profile, "dataset": dataset, "samples": len(samples),
        "turns": n_turns, "engine": engine.name, "device": engine.device, "dtype": engine.dtype,
        "target": str(engine.target_info.path), "draft": str(engine.draft_info.path) if engine.draft_info else None,
        "max_new_tokens": max_new_tokens, "temperature": temperature, "thinking": thinking,
        "framework": framework_row, "rows": rows, "best_block_size": best["block_size"],
    }


def histogram_line(histogram: list[int]) -> str:
    total = sum(histogram)
    if not total:
        return "-"
    return " · ".join(f"{n}: {100 * c / total:.0f}%" for n, c in enumerate(histogram, 1) if c)


def format_result(result: dict, colour: bool = False) -> str:
    """The benchmark as a table plus, per block size, the public benchmark's summary lines."""
    import click

    from dflash_tui.measure.replay import histogram_text

    r = result
    lines = [f"bench {r['profile']} on {r['dataset']} ({r['samples']} samples, {r['turns']} turns) · {r['engine']} engine "
             f"on {r['device']} · {r['dtype']} · temperature {r['temperature']:g} · thinking "
             f"{'on' if r['thinking'] else 'off'} · at most {r['max_new_tokens']} new tokens", ""]
    fw = r["framework"]
    titles = ["block", "tokens", "tok/s", "speedup", "vs " + (fw["name"].split()[0] if fw else "framework"), "tau",
              "acceptance 1..B", "TTFT", "same as block 1"]
    cells = []
    for row in r["rows"]:
        same = {True: "✓", False: "✗", None: "-"}[row["identical_to_block_1"]]
        cells.append([str(row["block_size"]), str(row["generated_tokens"]), f"{row['decode_tokens_per_s']:.1f}",
                      f"{row['speedup']:.2f}x" if row["speedup"] is not None else "-",
                      f"{row['speedup_vs_framework']:.2f}x" if row["speedup_vs_framework"] is not None else "-",
                      f"{row['tau']:.2f}", histogram_text(row["histogram"]), f"{row['ttft_s'] * 1000:.1f} ms", same])
    if fw:
        same = {True: "✓", False: "✗", None: "-"}[fw["identical_to_block_1"]]
        cells.append([fw["name"], str(fw["generated_tokens"]), f"{fw['decode_tokens_per_s']:.1f}", "", "1.00x", "", "",
                      f"{fw['ttft_s'] * 1000:.1f} ms", same])
    widths = [max(len(t), *(len(c[i]) for c in cells)) for i, t in enumerate(titles)]
    for values in [titles, ["-" * w for w in widths], *cells]:
        text = "  ".join(v.ljust(w) if i in (0, 6, 8) else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))
        lines.append(text.rstrip())
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
        lines.append(f"  Average acceptance length: {row['tau']:.2f}")
        lines.append(f"  Acceptance length histogram: {histogram_line(row['histogram'])}")
    lines.append("")
    lines.append(f"fastest: block size {r['best_block_size']}")
    return "\n".join(lines)
