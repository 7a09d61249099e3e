"""Time to first token along a chat, with and without the caches kept between turns (issue 14).

    python benchmarks/turn_cache.py                     # the demo pair, the cuda engine (CPU here)
    python benchmarks/turn_cache.py --engines cuda,mlx --turns 8 --repeats 5

One 8-turn chat (the demo's kind of questions, thinking on, temperature 0, block 16) is run `--repeats`
times with reuse and as often with every turn prefilled from scratch (`reuse_cache=False`); both give the
same answers, so both see the same prompts. Each turn's TTFT is the median over repeats (Summary.ttft_s:
the prefill of target and draft context). The bar: with reuse, the median of turns 7-8 costs at most
1.3x the median of turns 1-2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dflash_tui.core.settings import load_settings  # noqa: E402 - after the sys.path line above
from dflash_tui.engines import GenerationRequest, load_engine  # noqa: E402 - after the sys.path line above

QUESTIONS = [
    "What is 48 + 75?",
    "What is 327 + 589?",
    "What is 904 - 358?",
    "How much is 8 times 12?",
    "Sort these numbers from smallest to largest: 42, 7, 19, 88, 3.",
    "What is 615 + 287?",
    "What is 700 - 123?",
    "How much is 9 times 7?",
]


def chat(engine, turns: int, reuse: bool, block_size, max_new: int, thinking: bool):
    """One chat; per turn (ttft_s, prompt tokens, reused tokens, answer ids)."""
    engine.new_context()
    messages, out = [], []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        request = GenerationRequest(messages=list(messages), max_new_tokens=max_new, temperature=0,
                                    block_size=block_size, thinking=thinking, reuse_cache=reuse)
        list(engine.generate(request))
        s = engine.last_summary
        out.append((s.ttft_s, s.prompt_tokens, s.reused_prompt_tokens, s.token_ids))
        messages.append({"role": "assistant", "content": s.text})
    return out


def measure(engine, turns, repeats, block_size, max_new, thinking):
    runs = {True: [], False: []}
    for _ in range(repeats):
        for reuse in (True, False):  # interleaved, so load on the machine hits both alike
            runs[reuse].append(chat(engine, turns, reuse, block_size, max_new, thinking))
    same = all(a[3] == b[3] for a, b in zip(runs[True][0], runs[False][0]))
    rows = []
    for t in range(turns):
        rows.append({
            "turn": t + 1,
            "prompt": runs[True][0][t][1],
            "reused": runs[True][0][t][2],
            "with": statistics.median(r[t][0] for r in runs[True]),
            "without": statistics.median(r[t][0] for r in runs[False]),
        })
    return rows, same


def table(name: str, device: str, rows: list[dict], same: bool) -> str:
    lines = [f"engine {name} on {device}: time to first token per turn (median over repeats)",
             "| turn | prompt tokens | reused | TTFT with reuse | TTFT without |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['turn']} | {r['prompt']} | {r['reused']} | {r['with'] * 1000:.1f} ms | "
                     f"{r['without'] * 1000:.1f} ms |")

    def ratio(key):
        early = statistics.median(r[key] for r in rows[:2])
        late = statistics.median(r[key] for r in rows[-2:])
        return late / early if early else float("inf")

    n = len(rows)
    bar = ratio("with")
    lines.append(f"turns {n - 1}-{n} vs 1-2 (medians): with reuse {bar:.2f}x ({'meets' if bar <= 1.3 else 'misses'} "
                 f"the 1.3x bar), without {ratio('without'):.2f}x; answers identical with and without: {same}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="demo")
    parser.add_argument("--engines", default="cuda", help="comma list; engines not installed are skipped")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    for name in args.engines.split(","):
        try:
            _, config = load_settings(args.profile, name)
            engine = load_engine(config)
        except Exception as exc:  # an engine that is not installed here is skipped, and said so
            print(f"engine {name}: skipped ({exc})\n")
            continue
        chat(engine, 2, True, args.block_size, 8, args.thinking)  # warm-up: first-call costs out of turn 1
        rows, same = measure(engine, args.turns, args.repeats, args.block_size, args.max_new_tokens, args.thinking)
        print(table(name, engine.device, rows, same) + "\n", flush=True)


if __name__ == "__main__":
    main()
