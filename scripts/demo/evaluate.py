"""Quality of the demo pair at temperature 0, through the real engine.

- target accuracy: share of held-out prompts answered correctly, each in its task's intended mode
  (thinking for multi-digit arithmetic and letter counting, direct for the rest);
- the draft: mean acceptance length (tau) at block 8 and 16 on held-out prompts, checked lossless
  against block 1 on the same prompts.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

from . import corpus


def load(target: Path, draft: Path | None = None, engine: str = "cuda"):
    import engines

    return engines.load_engine(engines.EngineConfig(target=str(target), draft=str(draft) if draft else None,
                                                    engine=engine, dtype="float32"))


def run(engine, record: dict, thinking: bool | None = None, block_size: int | None = None,
        max_new_tokens: int = 256):
    import engines

    messages = record["messages"][:-1]
    request = engines.GenerationRequest(messages=messages, temperature=0.0, max_new_tokens=max_new_tokens,
                                        thinking=record["intended_thinking"] if thinking is None else thinking,
                                        block_size=block_size)
    for _ in engine.generate(request):
        pass
    return engine.last_summary


def accuracy(engine, held: list[dict], max_new_tokens: int = 256, progress: bool = True) -> dict:
    """{task: [correct, total]} in each task's intended mode, plus the failures."""
    from tqdm import tqdm

    table: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    failures = []
    for rec in tqdm(held, desc="accuracy", disable=not progress, dynamic_ncols=True):
        text = run(engine, rec, max_new_tokens=max_new_tokens).text
        ok = corpus.is_correct(rec, text)
        table[rec["task"]][0] += ok
        table[rec["task"]][1] += 1
        if not ok:
            failures.append({"prompt": rec["messages"][-2]["content"], "expected": rec["answer"],
                             "got": corpus.final_answer(text)[:120]})
    return {"table": dict(table), "failures": failures}


def acceptance(engine, held: list[dict], block_sizes=(8, 16), max_new_tokens: int = 256,
               progress: bool = True) -> dict:
    """tau per block size on `held` (intended modes) and whether every output equals block 1's."""
    from tqdm import tqdm

    out = {"prompts": len(held), "lossless": True}
    base = [run(engine, r, block_size=1, max_new_tokens=max_new_tokens).token_ids
            for r in tqdm(held, desc="block 1", disable=not progress, dynamic_ncols=True)]
    for b in block_sizes:
        lengths, t0 = [], time.time()
        for r, ids in zip(tqdm(held, desc=f"block {b}", disable=not progress, dynamic_ncols=True), base):
            s = run(engine, r, block_size=b, max_new_tokens=max_new_tokens)
            lengths.extend(s.acceptance_lengths)
            out["lossless"] &= s.token_ids == ids
        out[f"tau_{b}"] = round(sum(lengths) / max(1, len(lengths)), 2)
        out[f"seconds_{b}"] = round(time.time() - t0, 1)
    return out


def print_table(acc: dict) -> None:
    print(f"{'task':10} {'mode':9} {'correct':>9} {'share':>7}")
    right = total = 0
    for task in corpus.THINK_TASKS + corpus.DIRECT_TASKS:
        if task not in acc["table"]:
            continue
        c, n = acc["table"][task]
        right, total = right + c, total + n
        mode = "thinking" if corpus.intended_thinking(task) else "direct"
        print(f"{task:10} {mode:9} {c:>4}/{n:<4} {100 * c / n:6.1f}%")
    print(f"{'all':10} {'':9} {right:>4}/{total:<4} {100 * right / max(1, total):6.1f}%")


def report(target: Path, draft: Path | None, held: list[dict], work: Path, tau_prompts: int = 24) -> dict:
    import torch

    torch.set_num_threads(1)
    result = {}
    engine = load(target, draft)
    acc = accuracy(engine, held)
    result["accuracy"] = acc
    if draft is not None:
        picked = [r for i, r in enumerate(held) if i % max(1, len(held) // tau_prompts) == 0][:tau_prompts]
        result["draft"] = acceptance(engine, picked)
    for name in ("target-done.json", "draft-done.json"):
        if (Path(work) / name).exists():
            result[name.removesuffix("-done.json") + "_training"] = json.loads((Path(work) / name).read_text())
    (Path(work) / "quality.json").write_text(json.dumps(result, indent=1))
    print("\nDemo pair quality (temperature 0, held-out prompts, each task in its intended mode)")
    print_table(acc)
    for f in acc["failures"][:10]:
        print(f"  miss: {f['prompt']!r} expected {f['expected']}, got {f['got']!r}")
    if "draft" in result:
        d = result["draft"]
        print(f"draft: tau {d['tau_8']} at block 8, {d['tau_16']} at block 16 on {d['prompts']} prompts; "
              f"identical to block 1: {d['lossless']}")
    else:
        print("draft: none yet")
    for name in ("target_training", "draft_training"):
        if name in result:
            print(f"{name.replace('_', ' ')}: {result[name]}")
    return result
