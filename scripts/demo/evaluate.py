"""Quality of the demo pair at temperature 0, through the real engine.

- target accuracy: share of held-out prompts answered correctly, each in its task's intended mode
  (thinking for multi-digit arithmetic, letters, comparing and sorting; direct for the rest);
- in conversation: the last turn of held-out 2-4-turn conversations, per task, with thinking on (the
  demo profile's default, what `make chat` runs); the earlier turns are in the history as the chat
  template renders them (their think blocks dropped);
- in long chats: the same on held-out 5-8-turn conversations;
- the tool task: with the convert tool offered, a call (scored right when it is one parseable
  `<tool_call>` JSON block with the right name and arguments) and the answer in words after the tool's
  result (the right number), each in both modes;
- each draft (DFlash 1 in profiles/demo/draft, DFlash 2 in profiles/demo/draft2): mean acceptance length
  (tau) at block 8 and 16 on held-out prompts, checked lossless against block 1 on the same prompts.
"""

from __future__ import annotations

import functools
import json
import time
from collections import defaultdict
from pathlib import Path

from . import corpus


def load(target: Path, draft: Path | None = None, engine: str = "cuda"):
    from dflash_tui import engines

    return engines.load_engine(engines.EngineConfig(target=str(target), draft=str(draft) if draft else None,
                                                    engine=engine, dtype="float32"))


def run(engine, record: dict, thinking: bool | None = None, block_size: int | None = None,
        max_new_tokens: int = 256):
    """The target's answer to the record's last turn. A record that offers tools (or carries tool calls
    and tool messages) goes in as prompt ids rendered with the target's own chat template, since a
    GenerationRequest carries no tools."""
    from dflash_tui import engines

    messages = record["messages"][:-1]
    thinking = record["intended_thinking"] if thinking is None else thinking
    if record.get("tools"):
        source = {"prompt_ids": prompt_ids(engine, messages, record["tools"], thinking)}
    else:
        source = {"messages": messages}
    request = engines.GenerationRequest(**source, temperature=0.0, max_new_tokens=max_new_tokens,
                                        thinking=thinking, block_size=block_size)
    for _ in engine.generate(request):
        pass
    return engine.last_summary


def prompt_ids(engine, messages: list[dict], tools: list[dict], thinking: bool) -> list[int]:
    return list(_tokenizer(str(engine.config.target)).apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, enable_thinking=thinking,
        return_dict=False))


@functools.lru_cache(maxsize=4)
def _tokenizer(target: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target)


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
            failures.append({"prompt": corpus.last_prompt(rec), "expected": rec["answer"],
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


def print_table(acc: dict, mode: str | None = None) -> None:
    print(f"{'task':11} {'mode':9} {'correct':>9} {'share':>7}")
    right = total = 0
    for task in corpus.THINK_TASKS + corpus.DIRECT_TASKS + corpus.TOOL_TASKS:
        if task not in acc["table"]:
            continue
        c, n = acc["table"][task]
        right, total = right + c, total + n
        shown = "both" if task in corpus.TOOL_TASKS else mode or ("thinking" if corpus.intended_thinking(task) else "direct")
        print(f"{task:11} {shown:9} {c:>4}/{n:<4} {100 * c / n:6.1f}%")
    print(f"{'all':11} {'':9} {right:>4}/{total:<4} {100 * right / max(1, total):6.1f}%")


def cached_accuracy(engine, target: Path, held: list[dict], work: Path) -> dict:
    """`accuracy`, kept in work/accuracy-*.json under the digests of the target weights and the prompts
    (the draft does not change a temperature-0 answer), so a rerun with the same target reuses it."""
    import hashlib

    h = hashlib.sha256(json.dumps(held, sort_keys=True).encode())
    with open(Path(target) / "model.safetensors", "rb") as f:
        h.update(f.read())
    path = Path(work) / f"accuracy-{h.hexdigest()[:16]}.json"
    if path.exists():
        return json.loads(path.read_text())
    acc = accuracy(engine, held)
    path.write_text(json.dumps(acc))
    return acc


def spread(held: list[dict], n: int) -> list[dict]:
    return [r for i, r in enumerate(held) if i % max(1, len(held) // n) == 0][:n]


def report(target: Path, drafts: dict[str, Path] | Path | None, held: list[dict], work: Path, tau_prompts: int = 24,
           held_chat: list[dict] | None = None, held_tools: list[dict] | None = None,
           held_long: list[dict] | None = None) -> dict:
    """Score the target (cached per target) and each of `drafts` ({name: folder}, e.g. {"draft": DFlash 1,
    "draft2": DFlash 2}; a bare folder is {"draft": folder}; None or {} before any draft trained). Writes
    work/quality.json and prints the tables."""
    import torch

    torch.set_num_threads(1)
    drafts = {} if drafts is None else drafts if isinstance(drafts, dict) else {"draft": Path(drafts)}
    result = {}
    engine = load(target, None)  # temperature 0: no draft changes an answer
    acc = cached_accuracy(engine, target, held, work)
    result["accuracy"] = acc
    if held_chat:
        result["conversation"] = cached_accuracy(engine, target, held_chat, work)
    if held_long:
        result["long"] = cached_accuracy(engine, target, held_long, work)
    if held_tools:
        result["tools"] = cached_accuracy(engine, target, held_tools, work)
    for name, folder in drafts.items():
        engine = load(target, folder)
        result[name] = acceptance(engine, spread(held, tau_prompts))
        if held_chat:
            result[f"{name}_conversation"] = acceptance(engine, spread(held_chat, tau_prompts), block_sizes=(16,))
        if held_long:
            result[f"{name}_long"] = acceptance(engine, spread(held_long, tau_prompts), block_sizes=(16,))
    for path in sorted(Path(work).glob("*-done.json")):  # base, chat, chat2, ..., draft, draft2
        stats = json.loads(path.read_text())
        stats.pop("key", None)
        result[path.name.removesuffix("-done.json") + "_training"] = stats
    (Path(work) / "quality.json").write_text(json.dumps(result, indent=1))
    print("\nDemo pair quality (temperature 0, held-out prompts, each task in its intended mode)")
    print_table(acc)
    for f in acc["failures"][:10]:
        print(f"  miss: {f['prompt']!r} expected {f['expected']}, got {f['got']!r}")
    if "conversation" in result:
        conv = result["conversation"]
        print("\nIn conversation (temperature 0, last turn of held-out 2-4-turn conversations, thinking on)")
        print_table(conv, mode="thinking")
        for f in conv["failures"][:10]:
            print(f"  miss: {f['prompt']!r} expected {f['expected']}, got {f['got']!r}")
    if "long" in result:
        print("\nLong chats (temperature 0, last turn of held-out 5-8-turn conversations, thinking on)")
        print_table(result["long"], mode="thinking")
        for f in result["long"]["failures"][:10]:
            print(f"  miss: {f['prompt']!r} expected {f['expected']}, got {f['got']!r}")
    if "tools" in result:
        print("\nTool task (temperature 0, convert offered; held-out calls and answers after the result, both modes)")
        print_table(result["tools"])
        for f in result["tools"]["failures"][:10]:
            print(f"  miss: {f['prompt']!r} expected {f['expected']}, got {f['got']!r}")
    for name in drafts:
        d = result[name]
        print(f"{name}: tau {d['tau_8']} at block 8, {d['tau_16']} at block 16 on {d['prompts']} prompts; "
              f"identical to block 1: {d['lossless']}")
        for part, label in (("conversation", "in conversation"), ("long", "in long chats")):
            if f"{name}_{part}" in result:
                d = result[f"{name}_{part}"]
                print(f"{name} {label}: tau {d['tau_16']} at block 16 on {d['prompts']} last turns; "
                      f"identical to block 1: {d['lossless']}")
    if not drafts:
        print("draft: none yet")
    for name, stats in result.items():
        if name.endswith("_training"):
            print(f"{name.replace('_', ' ')}: {stats}")
    return result
