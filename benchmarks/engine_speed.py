"""Decode speed side by side in one run: the framework's own generate, our block 1, DFlash per block size.

    python benchmarks/engine_speed.py                      # the demo pair, both engines where installed
    python benchmarks/engine_speed.py --profile qwen3-8b --engines cuda --block-sizes 1,4,8,16
    python benchmarks/engine_speed.py --engines cuda --drafts profiles/demo/draft,profiles/demo/draft2
    python benchmarks/engine_speed.py --engines cuda --drafts profiles/demo/draft,profiles/demo/draft2 --prompts demo
    python benchmarks/engine_speed.py --engines cuda --block-sizes 1,16 --compiled   # eager and compiled steps
    python benchmarks/engine_speed.py --block-sizes 1,16 --json-schema benchmarks/answer.schema.json   # constrained

--prompts takes a prompt set as `dflash bench` does (a built-in name or a JSONL file, docs in
dflash_tui/measure/bench.py) instead of the five prompts below; each sample's first turn is one prompt.

--drafts adds a table of drafts side by side on the same target (DFlash 1 against DFlash 2): tau and tok/s at
blocks 8 and 16, at temperature 0 and at temperature 1 (each draft with its acceptance rule: exact match
for DFlash 1, rejection sampling for DFlash 2), every pass with the same seeds for every draft. Under it, how
sure the target is at T = 1: the mean probability it gives its own greedy token along its greedy outputs of the
prompts. Where that is near 1, sampling at T = 1 equals greedy decoding, DFlash 1's exact match loses nothing to
T = 0, and rejection sampling has nothing to gain over it; --temperatures adds rows where the target is less sure.

Every row decodes the same prompts at temperature 0 up to the target's eos (so the same ids); ratios are to the
framework's own generate ("vs generate") and to our block 1 ("vs block 1") on the same engine.

--json-schema adds a row per block size whose answers are constrained to that schema (structured outputs,
engines/guided.py: the reasoning free, the answer after it JSON), with the time the grammar took per step
(masks along each drafted block, the draft's steering, the rollbacks).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dflash_tui.core.settings import load_settings  # noqa: E402 - after the sys.path line above
from dflash_tui.core.structured import schema_constraint  # noqa: E402 - after the sys.path line above
from dflash_tui.engines import GenerationRequest, load_engine  # noqa: E402 - after the sys.path line above
from dflash_tui.engines.errors import UserError  # noqa: E402 - after the sys.path line above
from dflash_tui.engines.events import acceptance_histogram  # noqa: E402 - after the sys.path line above
from dflash_tui.engines.prompting import load_tokenizer  # noqa: E402 - after the sys.path line above
from dflash_tui.measure.bench import load_dataset  # noqa: E402 - after the sys.path line above

PROMPTS = [  # the demo's domain, answered with a reasoning trace (thinking on by default)
    "What is 48 + 75?",
    "What is 327 + 589?",
    "What is 904 - 358?",
    "How much is 8 times 12?",
    "Sort these numbers from smallest to largest: 42, 7, 19, 88, 3.",
]
BARS = " ▁▂▃▄▅▆▇█"


@dataclass
class Row:
    """One run's passes over all prompts: each pass's (tokens, seconds), and the step figures summed."""
    name: str
    block: int = 0  # the block size (0: the framework's generate)
    passes: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    constrained: bool = False  # answers constrained by --json-schema
    grammar_s: float = 0.0

    def add(self, rep: int, tokens: int, seconds: float) -> None:
        while len(self.passes) < rep:
            self.passes.append([0, 0.0])
        self.passes[rep - 1][0] += tokens
        self.passes[rep - 1][1] += seconds

    def rates(self) -> list[float]:
        return [t / s for t, s in self.passes if s]

    @property
    def tok_s(self) -> float:
        """The best pass: the one least disturbed by whatever else the machine was doing."""
        return max(self.rates(), default=0.0)

    @property
    def spread(self) -> float:
        """(fastest - slowest) / fastest over the passes: how far apart repeats of the same run land."""
        rates = self.rates()
        return (max(rates) - min(rates)) / max(rates) if rates else 0.0


def framework_generate(engine_name: str, engine, prompt_ids: list[int], max_new: int) -> tuple[int, float]:
    """The framework's own greedy generate on the same weights (transformers or mlx-lm's generate_step,
    the loop under stream_generate), stopping at the same eos ids."""
    stops = engine.stop_ids()
    if engine_name == "cuda":
        import torch

        model = engine.target.model
        ids = torch.tensor([prompt_ids], device=model.device)
        with torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=stops, pad_token_id=0)
            if ids.device.type == "cuda":
                torch.cuda.synchronize()
        return out.shape[1] - len(prompt_ids), time.perf_counter() - start
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    start = time.perf_counter()
    n = 0
    for n, (token, _) in enumerate(generate_step(mx.array(prompt_ids), engine.model, max_tokens=max_new), 1):  # noqa: B007 (n is read after the loop: tokens made)
        if int(token) in stops:
            break
    return n, time.perf_counter() - start


def measure(engine, engine_name, prompts_ids, max_new, block_sizes, repeats, compiled=None,
            constraint=None) -> list[Row]:
    """Every row over the same prompts in each pass, side by side; `compiled`: the same pair with its decode
    steps compiled (the cuda engine on the CPU, EngineConfig.compile_steps), a row per block size too;
    `constraint`: a row per block size with the answers constrained."""
    runs = [(Row(f"block {b}", b), engine) for b in block_sizes]
    if compiled is not None:
        runs += [(Row(f"block {b} compiled", b), compiled) for b in block_sizes]
    if constraint is not None:
        runs += [(Row(f"block {b} + JSON schema", b, constrained=True), engine) for b in block_sizes]
    rows = [Row("framework generate")] + [row for row, _ in runs]
    for rep in range(repeats + 1):  # the first pass is a warm-up
        for ids in prompts_ids:
            tokens, seconds = framework_generate(engine_name, engine, ids, max_new)
            if rep:
                rows[0].add(rep, tokens, seconds)
            for row, runner in runs:
                start = time.perf_counter()
                list(runner.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=max_new, temperature=0,
                                                       block_size=row.block,
                                                       constraint=constraint if row.constrained else None)))
                elapsed = time.perf_counter() - start
                s = runner.last_summary
                if rep:
                    row.add(rep, s.generated_tokens, elapsed)
                    row.lengths += s.acceptance_lengths
                    row.draft_s += s.draft_s
                    row.verify_s += s.verify_s
                    row.grammar_s += s.grammar_s or 0.0
            print(f"  {engine_name}: pass {rep}/{repeats} prompt done", file=sys.stderr, flush=True)
    return rows


def sparkline(counts: list[int]) -> str:
    """One bar per acceptance length 1..B, scaled to the most frequent length."""
    top = max(counts) or 1
    return "".join(BARS[0 if not c else max(1, round(8 * c / top))] for c in counts)


def table(engine_name: str, device: str, rows: list[Row], block_sizes: list[int]) -> str:
    base = rows[0].tok_s
    block1 = next((r.tok_s for r in rows if r.name == "block 1"), 0.0)  # the eager block 1: the honest baseline
    passes = len(rows[0].passes)
    lines = [f"engine {engine_name} on {device} (tok/s: the best of {passes} passes after a warm-up; spread: "
             "(fastest - slowest) / fastest)",
             "| run | tok/s | spread | vs generate | vs block 1 | tau | acceptance 1..B | draft ms/step | verify ms/step "
             "| grammar ms/step |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    counts = {}
    for r in rows:
        b = r.block
        steps = len(r.lengths)
        tau = f"{sum(r.lengths) / steps:.2f}" if steps else "-"
        draft = f"{1000 * r.draft_s / steps:.2f}" if steps else "-"
        verify = f"{1000 * r.verify_s / steps:.2f}" if steps else "-"
        grammar = f"{1000 * r.grammar_s / steps:.2f}" if steps and r.constrained else "-"
        vs1 = f"{r.tok_s / block1:.2f}x" if block1 else "-"
        hist = "-"
        if steps and b:
            counts[r.name] = acceptance_histogram(r.lengths, b)
            hist = f"`{sparkline(counts[r.name])}`"
        lines.append(f"| {r.name} | {r.tok_s:.1f} | {100 * r.spread:.0f}% | {r.tok_s / base:.2f}x | {vs1} | {tau} | {hist} "
                     f"| {draft} | {verify} | {grammar} |")
    lines.append("")
    lines.append("steps accepting 1, 2, ..., B tokens:")
    lines += [f"  {name}: {' '.join(map(str, c))}" for name, c in counts.items()]
    return "\n".join(lines)


@dataclass
class DraftRow:
    """One draft at one block size and temperature, over every pass (pass r uses seed r for every draft)."""
    draft: str
    rule: str = ""
    passes: list = field(default_factory=list)  # (tokens, seconds, acceptance lengths) per pass

    def rates(self) -> list[float]:
        return [t / s for t, s, _ in self.passes if s]

    @property
    def tau(self) -> float:
        lengths = [n for _, _, ls in self.passes for n in ls]
        return sum(lengths) / len(lengths) if lengths else 0.0


def target_certainty(engine, prompts_ids: list[list[int]], max_new: int) -> float:
    """The mean probability the target gives its own greedy token at temperature 1 (its raw log-probability),
    along its greedy outputs of the prompts."""
    probs: list[float] = []
    for ids in prompts_ids:
        for event in engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=max_new, temperature=0,
                                                       block_size=1, logprobs=True)):
            probs += [math.exp(lp) for lp in event.logprobs or []]
    return sum(probs) / len(probs) if probs else float("nan")


def compare_drafts(name: str, args, drafts: list[str], prompts_for, blocks=(8, 16), temperatures=(0.0, 1.0)):
    """Each draft on the same target, prompts, block sizes, temperatures and seeds: ({(t, b): [DraftRow]}, the
    target's certainty at T = 1)."""
    rows: dict = {}
    for i, draft in enumerate(drafts):
        _, config = load_settings(args.profile, name, args.target, draft)
        engine = load_engine(config)
        prompts_ids = prompts_for(engine)
        if i == 0:
            certainty = target_certainty(engine, prompts_ids, args.max_new_tokens)
        kind = engine.draft_info.arch if engine.draft_info else "-"
        for t in temperatures:
            for b in blocks:
                row = DraftRow(f"{os.path.basename(os.path.normpath(draft))} ({kind})")
                rows.setdefault((t, b), []).append(row)
                for rep in range(args.repeats + 1):  # the first pass is a warm-up
                    tokens, seconds, lengths = 0, 0.0, []
                    for ids in prompts_ids:
                        start = time.perf_counter()
                        list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=args.max_new_tokens,
                                                               temperature=t, seed=rep, block_size=b)))
                        seconds += time.perf_counter() - start
                        s = engine.last_summary
                        tokens += s.generated_tokens
                        lengths += s.acceptance_lengths
                        row.rule = s.acceptance_rule
                    if rep:
                        row.passes.append((tokens, seconds, lengths))
                print(f"  {name}: {row.draft} T={t} block {b} done", file=sys.stderr, flush=True)
    return rows, certainty


def drafts_table(name: str, rows: dict, certainty: float) -> str:
    lines = [f"drafts side by side, engine {name} (tau over every step of every pass; tok/s: the best pass; "
             "spread: (fastest - slowest) / fastest; pass r samples with seed r for every draft)",
             "| T | block | draft | acceptance rule | tau | vs first draft | rejected share (B - tau) | tok/s | spread |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for (t, b), group in rows.items():
        first = group[0].tau
        for r in group:
            rates = r.rates()
            spread = (max(rates) - min(rates)) / max(rates) if rates else 0.0
            lines.append(f"| {t:g} | {b} | {r.draft} | {r.rule} | {r.tau:.2f} | {r.tau / first:.2f}x | "
                         f"{b - r.tau:.2f} | {max(rates, default=0):.1f} | {100 * spread:.0f}% |")
    lines.append(f"\nthe target at T = 1: mean probability of its own greedy token {certainty:.4f} along its greedy outputs")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--engines", default="cuda,mlx", help="comma list; engines not installed are skipped")
    parser.add_argument("--block-sizes", default="1,2,4,8,16")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts after one warm-up")
    parser.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--temperatures", default="0,1", help="comma list, for --drafts")
    parser.add_argument("--drafts", default=None,
                        help="comma list of drafts for the same target: only the drafts-side-by-side table")
    parser.add_argument("--compiled", action="store_true",
                        help="cuda engine on the CPU: also rows with the decode steps compiled by inductor (DFLASH_COMPILE)")
    parser.add_argument("--prompts", default=None,
                        help="a built-in prompt set (demo, chat, code, math) or a JSONL file: each sample's first turn")
    parser.add_argument("--json-schema", default=None, metavar="FILE",
                        help="also rows with the answers constrained to this JSON schema (structured outputs)")
    args = parser.parse_args()
    block_sizes = [int(b) for b in args.block_sizes.split(",")]
    try:
        texts = [s["turns"][0] for s in load_dataset(args.prompts)[0]] if args.prompts else PROMPTS
        constraint = schema_constraint(args.json_schema, "--json-schema") if args.json_schema else None
    except UserError as exc:
        parser.exit(2, f"{exc}\n")

    def prompts_for(engine) -> list[list[int]]:
        tokenizer = load_tokenizer(engine.target_info.path)
        return [engine.prepare(GenerationRequest(messages=[{"role": "user", "content": p}], thinking=args.thinking))
                if tokenizer.chat_template else tokenizer.encode(p) for p in texts]

    for name in args.engines.split(","):
        try:
            profile, config = load_settings(args.profile, name, args.target, args.draft)
            engine = load_engine(config)
        except Exception as exc:  # an engine that is not installed here is skipped, and said so
            print(f"engine {name}: skipped ({exc})\n")
            continue
        if args.drafts:
            del engine
            temperatures = tuple(float(t) for t in args.temperatures.split(","))
            rows, certainty = compare_drafts(name, args, args.drafts.split(","), prompts_for, temperatures=temperatures)
            print(drafts_table(name, rows, certainty) + "\n", flush=True)
            continue
        compiled = None
        if args.compiled and name == "cuda":
            print("  cuda: compiling the decode steps (inductor; cached after the first run)", file=sys.stderr, flush=True)
            compiled = load_engine(dataclasses.replace(config, compile_steps=True))
        rows = measure(engine, name, prompts_for(engine), args.max_new_tokens, block_sizes, args.repeats, compiled,
                       constraint)
        print(table(name, engine.device, rows, block_sizes) + "\n", flush=True)


if __name__ == "__main__":
    main()
