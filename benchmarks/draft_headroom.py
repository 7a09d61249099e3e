"""What a DFlash 2 draft's candidate selector adds to its backbone, and how much more its candidates hold.

    python benchmarks/draft_headroom.py --drafts profiles/demo/draft,profiles/demo/draft2
    python benchmarks/draft_headroom.py --drafts profiles/demo/draft,profiles/demo/draft2 --prompts demo

The target first writes its greedy answer to each prompt (temperature 0, so every draft sees the same ids).
Then every position of each answer is a block's anchor once, since a verify step may start anywhere, and
each draft drafts that block from the target's context features as the decoding loop does (the batched
block pass of `train-draft`'s objective, which tests/test_train_draft.py holds equal to the loop). Per
draft, the mean acceptance length per anchor (matched slots + 1) of:
  argmax  each slot's head argmax: what a DFlash 1 draft proposes, and a DFlash 2 draft's backbone alone
  walk    the selector's argmax walk: what a DFlash 2 draft proposes at temperature 0
  top-K   an oracle selector that picks the true token wherever it is among the slot's K candidates
walk - argmax is what the selector adds; top-K bounds what any selector over those candidates could reach.
A per-anchor mean weighs every position alike, so it differs from the tau of a decode (engine_speed.py),
which only anchors where the step before stopped. The drafts run in float32.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from typing import Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.engine_speed import PROMPTS  # noqa: E402 - after the sys.path line above
from dflash_tui.core.settings import load_settings  # noqa: E402 - after the sys.path line above
from dflash_tui.engines import GenerationRequest, load_engine  # noqa: E402 - after the sys.path line above
from dflash_tui.engines.cuda.training.objective import BlockObjective  # noqa: E402 - after the sys.path line above
from dflash_tui.engines.errors import UserError  # noqa: E402 - after the sys.path line above
from dflash_tui.measure.bench import load_dataset  # noqa: E402 - after the sys.path line above

ANCHORS_PER_PASS = 64  # blocks drafted in one batched pass (bounds the attention mask's size)


@dataclass
class Headroom:
    draft: str
    argmax: float
    walk: Optional[float]  # None: a DFlash 1 draft has no selector
    top_k: Optional[float]
    k: Optional[int]
    anchors: int


def accepted(matches: torch.Tensor) -> int:
    """Acceptance length of a block whose slots match as `matches` [n] says: the leading matches + 1."""
    misses = (~matches).nonzero()
    return (int(misses[0]) if len(misses) else len(matches)) + 1


def greedy_answers(engine, prompts: list[str], thinking: bool, max_new: int) -> list[tuple[int, list[int]]]:
    """(prompt length, prompt + the target's greedy answer ids) per prompt."""
    out = []
    for text in prompts:
        ids = engine.prepare(GenerationRequest(messages=[{"role": "user", "content": text}], thinking=thinking))
        list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=max_new, temperature=0)))
        out.append((len(ids), ids + list(engine.last_summary.token_ids)))
    return out


@torch.no_grad()
def headroom(engine, name: str, answers: list[tuple[int, list[int]]], block: int) -> Headroom:
    target, draft = engine.target, engine.draft
    objective = BlockObjective(target, draft, draft.target_layer_ids, block, 1, 1.0, draft.mask_token_id, False)
    selector = draft.candidate_selector
    lengths: dict[str, list[int]] = {"argmax": [], "walk": [], "top_k": []}
    for prompt_len, seq in answers:
        ids = torch.tensor([seq], device=target.device)
        features = objective.features(ids)
        for lo in range(prompt_len - 1, len(seq) - 1, ANCHORS_PER_PASS):
            anchors = torch.arange(lo, min(lo + ANCHORS_PER_PASS, len(seq) - 1), device=ids.device)
            hidden = objective.block_hiddens(ids, features, anchors[None])[0]  # [N, B, H]
            for row, a in enumerate(anchors.tolist()):
                n = min(block - 1, len(seq) - 1 - a)
                truth = ids[0, a + 1: a + 1 + n]
                logits = draft.head_logits(hidden[row, 1: 1 + n], target.lm_head).float()
                lengths["argmax"].append(accepted(logits.argmax(-1) == truth))
                if selector is not None:
                    walk = draft.propose(hidden[row: row + 1, : 1 + n], ids[0, a: a + 1], target.lm_head).ids
                    lengths["walk"].append(accepted(walk == truth))
                    candidates = logits.topk(min(selector.top_k, logits.shape[-1]), -1).indices
                    lengths["top_k"].append(accepted((candidates == truth[:, None]).any(-1)))

    def mean(key: str) -> Optional[float]:
        return sum(lengths[key]) / len(lengths[key]) if lengths[key] else None

    return Headroom(name, mean("argmax") or 0.0, mean("walk"), mean("top_k"), selector.top_k if selector else None,
                    len(lengths["argmax"]))


def table(rows: list[Headroom], block: int) -> str:
    def cell(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"

    first = rows[0].walk or rows[0].argmax
    lines = [f"per-anchor acceptance at block {block} along the target's greedy answers ({rows[0].anchors} anchors)",
             "| draft | argmax | walk | top-K (oracle) | K | proposed vs first draft | rejected share (B - proposed) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        proposed = r.walk if r.walk is not None else r.argmax
        lines.append(f"| {r.draft} | {r.argmax:.2f} | {cell(r.walk)} | {cell(r.top_k)} | {r.k or '-'} | "
                     f"{proposed / first:.2f}x | {block - proposed:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--target")
    parser.add_argument("--drafts", required=True, help="comma list of drafts for the same target")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--prompts", default=None,
                        help="a built-in prompt set (demo, chat, code, math) or a JSONL file: each sample's first turn")
    args = parser.parse_args()
    try:
        texts = [s["turns"][0] for s in load_dataset(args.prompts)[0]] if args.prompts else PROMPTS
    except UserError as exc:
        parser.exit(2, f"{exc}\n")
    rows, answers = [], None
    for path in args.drafts.split(","):
        _, config = load_settings(args.profile, "cuda", args.target, path)
        engine = load_engine(replace(config, dtype="float32"))
        if answers is None:
            answers = greedy_answers(engine, texts, args.thinking, args.max_new_tokens)
        kind = engine.draft_info.arch if engine.draft_info else "-"
        rows.append(headroom(engine, f"{os.path.basename(os.path.normpath(path))} ({kind})", answers, args.block_size))
        print(f"  {rows[-1].draft} done", file=sys.stderr, flush=True)
        del engine
    print(table(rows, args.block_size))


if __name__ == "__main__":
    main()
