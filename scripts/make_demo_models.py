"""Build the demo pair in profiles/demo/: corpus, tokenizer, target, evaluation, draft (`make demo-models`).

Every stage is seeded and caches its output under .demo-work/ so that a rerun resumes or skips it:
  1. corpus      .demo-work/train.jsonl, heldout.jsonl      (scripts/demo/corpus.py)
  2. tokenizer   .demo-work/tokenizer/                      (scripts/demo/tokenizer.py)
  3. target      profiles/demo/target/ (+ resumable checkpoint in .demo-work/)  (scripts/demo/train_target.py)
  4. draft       profiles/demo/draft/ via `dflash train-draft --responses generate`
  5. quality     target accuracy per task in its intended mode, tau at block 8 and 16  (scripts/demo/evaluate.py)
Delete .demo-work/ (and profiles/demo/) to start over.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scripts.demo import corpus, evaluate, train_target
from scripts.demo import tokenizer as demo_tokenizer

TARGET_STEPS = 6000
DRAFT_PROMPTS = 3000
DRAFT_EPOCHS = 16
DRAFT_STEPS = 6000


def draft_data(train: list[dict], path: Path, n: int, seed: int) -> Path:
    """The prompts the target answers for draft training, each in its record's thinking mode."""
    import random

    rng = random.Random(seed)
    picked = rng.sample(train, min(n, len(train)))
    corpus.write_jsonl(path, ({"messages": r["messages"], "thinking": r["thinking"]} for r in picked))
    return path


def train_draft(args, work: Path, target: Path, out: Path) -> None:
    """`dflash train-draft` into the work dir (its responses and resumable state stay there), then the
    draft itself (config.json + model.safetensors) is copied to `out`."""
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        print(f"draft: {out} exists, skipped")
        return
    data = draft_data(corpus.read_jsonl(work / "train.jsonl"), work / "draft-data.jsonl", args.draft_prompts, args.seed)
    build = work / "draft"
    cmd = [sys.executable, "-m", "dflash_tui", "train-draft", "--target", str(target), "--data", str(data),
           "--out", str(build), "--block-size", "16", "--draft-layers", "2", "--responses", "generate",
           "--seed", str(args.seed), "--epochs", str(args.draft_epochs), "--max-len", "320",
           "--max-new-tokens", "256", "--gen-batch", "16", "--dtype", "float16", "--max-steps", str(args.draft_steps), *args.draft_args]
    print("draft:", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(build / name, out / name)
    (work / "draft-done.json").write_text(json.dumps({"train_seconds": round(time.time() - t0, 1),
                                                      "prompts": args.draft_prompts, "steps": args.draft_steps}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=ROOT / ".demo-work")
    p.add_argument("--out", type=Path, default=ROOT / "profiles" / "demo")
    p.add_argument("--train-records", type=int, default=corpus.TRAIN_RECORDS)
    p.add_argument("--heldout", type=int, default=240)
    p.add_argument("--target-steps", type=int, default=TARGET_STEPS)
    p.add_argument("--threads", type=int, default=2, help="torch threads for target training")
    p.add_argument("--draft-prompts", type=int, default=DRAFT_PROMPTS)
    p.add_argument("--draft-epochs", type=int, default=DRAFT_EPOCHS)
    p.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    p.add_argument("--draft-args", nargs=argparse.REMAINDER, default=[], help="passed on to dflash train-draft")
    p.add_argument("--skip-draft", action="store_true")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate on N held-out prompts spread over the tasks")
    args = p.parse_args(argv)

    work = args.work / f"seed{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    target_dir, draft_dir = args.out / "target", args.out / "draft"

    t0 = time.time()
    train_path, held_path = corpus.build(work, args.seed, args.train_records, args.heldout)
    train = corpus.read_jsonl(train_path)
    print(f"corpus: {len(train)} training records, held-out {held_path} ({time.time() - t0:.0f} s)")
    tok = demo_tokenizer.build(work / "tokenizer", train)
    print(f"tokenizer: {len(tok)} tokens, mask id {tok.convert_tokens_to_ids('<|mask|>')}")
    stats = train_target.train(tok, train, work, target_dir, args.target_steps, args.seed, args.threads)
    print(f"target: {stats}")
    if not args.skip_draft:
        train_draft(args, work, target_dir, draft_dir)
    held = corpus.read_jsonl(held_path)
    if args.eval_limit:  # an even spread over the tasks (the file is grouped by task)
        held = held[:: max(1, len(held) // args.eval_limit)][: args.eval_limit]
    draft = draft_dir if (draft_dir / "model.safetensors").exists() else None
    evaluate.report(target_dir, draft, held, work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
