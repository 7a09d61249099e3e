"""Build the demo pair in profiles/demo/: corpus, tokenizer, target, evaluation, drafts (`make demo-models`).

Every stage is seeded and caches its output under .demo-work/ so that a rerun resumes or skips it
(the corpora are regenerated each run, in seconds, and rewritten only when their content changes):
  1. corpus      .demo-work/train.jsonl, heldout.jsonl (mostly single-turn)   (scripts/demo/corpus.py)
  2. tokenizer   .demo-work/tokenizer/                      (scripts/demo/tokenizer.py)
  3. base target .demo-work/base-target/, from scratch on the base corpus     (scripts/demo/train_target.py)
  4. chat corpus .demo-work/chat-train.jsonl, heldout-chat.jsonl (2-4 turns), heldout-long.jsonl (5-8
                 turns), heldout-tools.jsonl: 1-8-turn conversations, 9% of them the tool task (a convert
                 call, or the answer after its result)
  5. target      profiles/demo/target/: the base target trained further on the chat corpus
  6. draft       profiles/demo/draft/ (DFlash 1) via `dflash train-draft --responses generate` on chat
                 conversations without tools (the target writes every turn)
  7. draft2      profiles/demo/draft2/ (DFlash 2) via `dflash train-draft --arch dflash2 --init-draft
                 profiles/demo/draft` on the same conversations, reusing the responses the target wrote
                 for stage 6 (DRAFT2_STEPS steps)
  8. quality     target accuracy per task in its intended mode, on the last turn of 2-4-turn and of 5-8-turn
                 conversations (thinking on) and on the tool task, scored before the drafts train; then
                 each draft's tau at block 8 and 16  (scripts/demo/evaluate.py)
A finished stage is skipped only while the inputs recorded in its done file are unchanged (a changed
corpus retrains the targets, a changed target retrains both drafts, a changed DFlash 1 draft the DFlash 2
draft). Delete .demo-work/ to start over.
`--base-from DIR` adopts DIR (a target this recipe's base phase wrote, e.g. an earlier profiles/demo/target)
as the base phase's output instead of training it again (about 19 minutes here). The base corpus and the
tokenizer are what they were for run D's pair (the tool task is in the chat corpus only), so the retrain
that added the tool task and the DFlash 2 draft (run E) started from its target:
    OMP_NUM_THREADS=1 .venv/bin/python scripts/make_demo_models.py --base-from profiles/demo/target
(adopting copies it into .demo-work/ before the chat phase overwrites profiles/demo/target, and later runs
keep that copy). The committed target has had a chat phase already, so this chat phase starts from a
chat-trained target, not from a base-phase one as a run from scratch does: say so wherever its figures
are quoted. `--draft-init DIR` likewise starts the DFlash 1 draft from an earlier draft of this recipe (at
the DFlash 2 stage's learning rate) instead of random weights, for a target that changed by a chat round:
    OMP_NUM_THREADS=1 .venv/bin/python scripts/make_demo_models.py --base-from profiles/demo/target \
        --draft-init profiles/demo/draft --draft-steps 2000 --out /tmp/demo-retrain
(then copy target/, draft/ and draft2/ from /tmp/demo-retrain into profiles/demo/).

Runs from scratch on this project's 2-core machines, each alone on it unless said (minutes):
  A  base 3,000 steps at 2e-3 (24), one chat round 5500:6e-4 (43), target evaluation (3): 70 up to the
     draft, which was stopped unfinished. 92.1% single-turn, 95.4% on last turns in conversation.
  B  --target-steps 5500 --chat-rounds 2800:6e-4, base still at 2e-3: base (49), chat (22), evaluation (3),
     draft 3,500 steps on 1,200 conversations (26, its responses included): 100 in all. 92.5% single-turn,
     94.6% in conversation; the draft reaches tau 5.94 at block 8 and 8.3 at block 16.
  C  the defaults now, base at 6e-4 (train_target.LR): base 2,500 steps (19), chat 2000:3e-4 (16, part of it
     beside a draft experiment), evaluation (2), draft 6,000 steps on 1,600 conversations (41, its responses
     10 of them): 80 in all. 97.5% single-turn, 97.1% in conversation; the draft reaches tau 6.87 at block 8
     and 11.56 at block 16 (10.8 in conversation), outputs identical to block 1. The stages ran as separate
     invocations with these inputs (the base phase by a throwaway script calling train_target.train, then
     `--base-from` it), not yet as one timed run.
  D  the defaults, one run end to end on an AMD EPYC with AVX-512 BF16 (no AMX): base (20.4), chat (14.6),
     evaluation (2.7), draft (32.5, its responses included): 70.6 in all. 99.2% single-turn, 95.8% in
     conversation; tau 7.03 at block 8 and 11.72 at block 16 (11.36 in conversation), outputs identical to
     block 1. The pair run E retrained from.
  E  the retrain that added the tool task and the DFlash 2 draft, on an AVX2-only EPYC (float32 training,
     no native bf16), from run D's pair: `--base-from profiles/demo/target --draft-init profiles/demo/draft
     --draft-steps 2000 --draft2-steps 1200`: chat round 2000:3e-4 (36.0: 400 steps on one thread, 1,600 on
     two), evaluation (4.9), DFlash 1 draft fine-tuned from run D's (33.5, the target's 3,997 responses on
     one thread included: two threads wrote them 5x slower here), DFlash 2 draft (16.0). 99.2% single-turn,
     97.5% in conversation, tool task 47/48. The tool task adds about 8% to the chat corpus's tokens (194
     against 180 per conversation on average). A run from scratch was not timed on this CPU: its base
     phase alone takes over 90 minutes in float32 (see below).
  F  the retrain that put 5- to 8-turn conversations into the chat round (run E's target answered the last
     turn of held-out 5-8-turn chats 95.0% right, and "48 + 75 = 523" at turn 8 of a chat of sums), from
     run E's pair, one run on an AMD EPYC with AVX-512 BF16 (no AMX; bf16 autocast), one thread:
     `--base-from profiles/demo/target --draft-init profiles/demo/draft --draft-steps 2000` (the DFlash 2
     stage at its default 1,200 steps): chat round 2000:3e-4 (31.5; conversations of 246 tokens on average
     against 194), evaluation (4.1), DFlash 1 draft (27.2, the target's 6,398 responses included, at
     --max-len 640 so the long conversations fit), DFlash 2 draft (11.7): 74.7 in all. 99.2% single-turn,
     96.7% on 2-4-turn and 98.8% on 5-8-turn last turns, tool task 48/48; DFlash 1 tau 12.74 and DFlash 2
     13.31 at block 16 on held-out prompts, outputs identical to block 1. This is the committed pair.
At 2e-3 the base phase alone left sorting at 0% after 3,000 steps and 3% after 5,500; at 6e-4 it reached
77% (and 92.9% over all tasks) in 2,500.
All of these ran on a CPU with native bf16 matmuls (AMX for A-C), which the target and the draft train with.
On an AMD EPYC with AVX2 only (float32 training), one thread, a base step cost 1.57 s compiled and 1.88 s
eager (median over 30 steps), 1.09 s compiled on two threads, against 0.37 s with AMX; the defaults' base
phase alone ran at about 2.4 s a step, over 90 minutes, so the whole recipe takes hours on such a CPU.
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

from scripts.demo import corpus, evaluate, train_target  # noqa: E402
from scripts.demo import tokenizer as demo_tokenizer  # noqa: E402

TARGET_STEPS = 2500  # base phase
# The chat phase: rounds of (steps, peak learning rate), each with its own warm-up and cosine decay, the
# first from the base weights, each later one from the round before (a warm restart).
CHAT_ROUNDS = "2000:3e-4"
CHAT_BATCH = 16  # conversations are longer (160 tokens on average against 110)
DRAFT_PROMPTS = 1600  # conversations; the target writes each of their turns
DRAFT_EPOCHS = 16
DRAFT_STEPS = 6000
# The DFlash 2 stage, from the DFlash 1 draft's weights: the committed draft2's steps. A 2,500-step run, lost
# unfinished with its machine, stood at validation tau 10.96 at step 1,482 against this one's 11.33 at its end.
DRAFT2_STEPS = 1200
# Its learning rate: a pilot on run D's pair (400 conversations, 800 steps from the DFlash 1 draft)
# reached tau 12.36 at 3e-4 where 1e-3 first fell to 9.0 and was back at 11.2 after 600 steps (DFlash 1:
# 11.68 on the same held-out prompts): fine-tuning a converged backbone wants the lower rate.
DRAFT2_LR = "3e-4"


def draft_data(train: list[dict], path: Path, n: int, seed: int) -> Path:
    """The prompts the target answers for draft training, each in its record's thinking mode. Conversations
    that offer tools are left out: train-draft's data holds system, user and assistant texts only (no tools,
    tool calls or tool messages), so the drafts learn from the target's plain chat turns."""
    import random

    rng = random.Random(seed)
    plain = [r for r in train if not r.get("tools")]
    picked = rng.sample(plain, min(n, len(plain)))
    corpus.write_jsonl(path, ({"messages": r["messages"], "thinking": r["thinking"]} for r in picked))
    return path


def train_draft(args, work: Path, target: Path, out: Path, source: Path, name: str = "draft",
                steps: int | None = None, extra: tuple[str, ...] = (), responses_from: Path | None = None,
                key_extra: dict | None = None) -> None:
    """`dflash train-draft` into the work dir (its responses and resumable state stay there, in work/NAME),
    then the draft itself (config.json + model.safetensors) is copied to `out`. Skipped while the target,
    the conversations and the arguments are those recorded in NAME-done.json. `extra`: more train-draft
    arguments (the DFlash 2 stage's --arch and --init-draft); `responses_from`: an earlier stage's
    train-draft folder whose responses.jsonl (the target's answers to the same conversations) seeds this
    stage's, so the target does not write them twice."""
    steps = args.draft_steps if steps is None else steps
    data = draft_data(corpus.read_jsonl(source), work / "draft-data.jsonl", args.draft_prompts, args.seed)
    key = {"target": train_target.file_digest(target / "model.safetensors"), "data": train_target.file_digest(data),
           "steps": steps, "epochs": args.draft_epochs, "args": args.draft_args, **(key_extra or {})}
    done = work / f"{name}-done.json"
    if (out / "model.safetensors").exists() and (out / "config.json").exists() and done.exists() \
            and json.loads(done.read_text()).get("key") == key:
        print(f"{name}: {out} is up to date, skipped")
        return
    build = work / name  # train-draft's own folder: it writes only into a folder it claimed
    state = work / f"{name}-key.json"
    fresh = not state.exists() or json.loads(state.read_text()) != key  # another target or data: start over
    state.write_text(json.dumps(key))
    seed_file = None if responses_from is None else responses_from / "responses.jsonl"
    if seed_file is not None and seed_file.is_file() and not (build / "responses.jsonl").exists():
        from dflash_tui.engines.outputs import claim_output_dir

        claim_output_dir(build, option="--out")  # train-draft's claim, so that it takes the folder as its own
        shutil.copyfile(seed_file, build / "responses.jsonl")  # entries are keyed by target and data line
    cmd = [sys.executable, "-m", "dflash_tui", "train-draft", "--target", str(target), "--data", str(data),
           "--out", str(build), "--block-size", "16", "--draft-layers", "2", "--responses", "generate",
           "--seed", str(args.seed), "--epochs", str(args.draft_epochs), "--max-len", "640",
           "--max-new-tokens", "256", "--gen-batch", "16", "--dtype", "float16", "--max-steps", str(steps),
           *extra, *(["--fresh"] if fresh else []), *args.draft_args]
    print(f"{name}:", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    out.mkdir(parents=True, exist_ok=True)
    for file in ("config.json", "model.safetensors"):
        shutil.copyfile(build / file, out / file)
    done.write_text(json.dumps({"train_seconds": round(time.time() - t0, 1), "conversations": args.draft_prompts,
                                "steps": steps, "key": key}))


def train_draft2(args, work: Path, target: Path, draft: Path, out: Path, source: Path) -> None:
    """The DFlash 2 draft: train-draft --arch dflash2 starting from the DFlash 1 draft's weights (the same
    backbone: block 16, 2 layers, the same target layers), on the same conversations and the same target
    responses as the DFlash 1 stage. Retrained whenever the DFlash 1 draft changes."""
    train_draft(args, work, target, out, source, name="draft2", steps=args.draft2_steps,
                extra=("--arch", "dflash2", "--init-draft", str(draft), "--lr", DRAFT2_LR), responses_from=work / "draft",
                key_extra={"arch": "dflash2", "lr": DRAFT2_LR, "init": train_target.file_digest(draft / "model.safetensors")})


def adopt_base(src: Path, work: Path, base_dir: Path, key_of, corpus_digest: str) -> None:
    """Use `src` (a target the base phase wrote) as the base phase's output, with its tokenizer. Once
    adopted, later runs keep that copy (src may since have been overwritten by the chat phase)."""
    done = work / "base-done.json"
    if done.exists() and (base_dir / "model.safetensors").exists() and "adopted_from" in json.loads(done.read_text()):
        print(f"base target: {base_dir} was adopted before, kept")
        return
    tok_dir = work / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        tok_dir.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (src / name).exists():
                shutil.copyfile(src / name, tok_dir / name)
        (tok_dir / "corpus.digest").write_text(corpus_digest)  # the base phase's tokenizer came from this corpus
    if base_dir.resolve() != src.resolve():
        shutil.copytree(src, base_dir, dirs_exist_ok=True)
    stats = {"adopted_from": str(src), "model_digest": train_target.file_digest(base_dir / "model.safetensors"),
             "key": key_of()}
    (work / "base-done.json").write_text(json.dumps(stats))
    print(f"base target: adopted {src}")


def compute_notice() -> str:
    """What training computes in here, said before an hour of it: the stage times above were measured on a
    CPU with native bf16 matmuls (AMX); without them training runs in float32, several times slower."""
    import torch

    from dflash_tui.engines.cuda.training import bf16_autocast_pays

    if bf16_autocast_pays(torch.device("cpu")):
        return "training: bf16 autocast (this CPU has native bf16 matmuls, as the timed runs had)"
    return ("training: float32, since this CPU has no native bf16 matmuls; the stage times of --help were measured "
            "with them (AMX), and on an AVX2-only CPU a base step cost 4x as much, so expect several hours")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=ROOT / ".demo-work")
    p.add_argument("--out", type=Path, default=ROOT / "profiles" / "demo")
    p.add_argument("--train-records", type=int, default=corpus.TRAIN_RECORDS)
    p.add_argument("--heldout", type=int, default=240)
    p.add_argument("--target-steps", type=int, default=TARGET_STEPS, help="base phase steps")
    p.add_argument("--base-lr", type=float, default=train_target.LR, help="base phase peak learning rate")
    p.add_argument("--chat-records", type=int, default=corpus.CHAT_RECORDS)
    p.add_argument("--chat-rounds", default=CHAT_ROUNDS, help="STEPS:LR,... (see CHAT_ROUNDS)")
    p.add_argument("--chat-batch", type=int, default=CHAT_BATCH)
    p.add_argument("--base-from", type=Path, default=None,
                   help="adopt this target directory as the base phase's output (see above)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for target training (oversubscribed threads on a busy machine run up to 10x "
                        "slower; a second thread gained nothing with AMX, and cut a step by 30%% alone on an AVX2-only "
                        "CPU)")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="train the target without torch.compile (about twice as slow; for a machine without a C++ "
                        "compiler)")
    p.add_argument("--draft-prompts", type=int, default=DRAFT_PROMPTS)
    p.add_argument("--draft-epochs", type=int, default=DRAFT_EPOCHS)
    p.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    p.add_argument("--draft-init", type=Path, default=None,
                   help="start the DFlash 1 draft from this draft's weights at the DFlash 2 stage's learning rate "
                        "(a draft of an earlier target of this recipe; with --base-from, see above)")
    p.add_argument("--draft2-steps", type=int, default=DRAFT2_STEPS, help="DFlash 2 draft steps")
    p.add_argument("--draft-args", nargs=argparse.REMAINDER, default=[],
                   help="passed on to dflash train-draft (both draft stages; put it last)")
    p.add_argument("--skip-draft", action="store_true", help="stop after the target's evaluation (no draft)")
    p.add_argument("--skip-draft2", action="store_true", help="train the DFlash 1 draft only")
    p.add_argument("--eval-limit", type=int, default=None,
                   help="evaluate on N held-out prompts (and N conversations) spread over the tasks")
    args = p.parse_args(argv)

    work = args.work / f"seed{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    print(compute_notice(), flush=True)
    target_dir, draft_dir, draft2_dir = args.out / "target", args.out / "draft", args.out / "draft2"
    base_dir = work / "base-target"
    clock = {}

    t0 = time.time()
    train_path, held_path = corpus.build(work, args.seed, args.train_records, args.heldout)
    train = corpus.read_jsonl(train_path)
    print(f"corpus: {len(train)} training records, held-out {held_path} ({time.time() - t0:.0f} s)")
    tok_dir = work / "tokenizer"

    def base_key() -> dict:
        return train_target.phase_key(train_path, tok_dir, args.target_steps, args.seed, args.base_lr, None)

    corpus_digest = train_target.file_digest(train_path)
    if args.base_from is not None:
        adopt_base(args.base_from, work, base_dir, base_key, corpus_digest)
    tok = demo_tokenizer.build(tok_dir, train, corpus_digest)
    print(f"tokenizer: {len(tok)} tokens, mask id {tok.convert_tokens_to_ids('<|mask|>')}")
    t = time.time()
    stats = train_target.train(tok, train, work, base_dir, args.target_steps, args.seed, args.threads,
                               lr=args.base_lr, name="base", key=base_key(), compile_=args.compile)
    clock["base"] = time.time() - t
    print(f"base target: { {k: v for k, v in stats.items() if k != 'key'} }")
    del train
    t = time.time()
    files = corpus.build_chat(work, args.seed, held_path, args.chat_records, args.heldout)
    chat_path = files.train
    chat = corpus.read_jsonl(chat_path)
    print(f"chat corpus: {len(chat)} conversations, held-out {files.held_chat} and {files.held_long} "
          f"({time.time() - t:.0f} s)")
    t = time.time()
    rounds = [(int(a), float(b)) for a, b in (r.split(":") for r in args.chat_rounds.split(","))]
    start = base_dir
    for i, (steps, lr) in enumerate(rounds):
        name = "chat" if i == 0 else f"chat{i + 1}"
        out = target_dir if i == len(rounds) - 1 else work / f"{name}-target"
        seed = args.seed + 1000 * i  # another batch order in each round
        key = train_target.phase_key(chat_path, tok_dir, steps, seed, lr, start, args.chat_batch)
        stats = train_target.train(tok, chat, work, out, steps, seed, args.threads, lr=lr, init=start, name=name,
                                   key=key, batch=args.chat_batch, compile_=args.compile)
        print(f"target (chat round {i + 1}/{len(rounds)}): { {k: v for k, v in stats.items() if k != 'key'} }")
        start = out
    clock["chat"] = time.time() - t
    del chat
    held, held_chat = corpus.read_jsonl(held_path), corpus.read_jsonl(files.held_chat)
    held_long, held_tools = corpus.read_jsonl(files.held_long), corpus.read_jsonl(files.held_tools)
    if args.eval_limit:  # an even spread over the tasks (the files are grouped by task)
        held = held[:: max(1, len(held) // args.eval_limit)][: args.eval_limit]
        held_chat = held_chat[:: max(1, len(held_chat) // args.eval_limit)][: args.eval_limit]
        held_long = held_long[:: max(1, len(held_long) // args.eval_limit)][: args.eval_limit]
        held_tools = held_tools[: args.eval_limit]  # calls and answers, both modes, in turn
    t = time.time()
    # The target is scored before its draft trains, so a target that misses its bars is known an hour
    # earlier; the scores are cached per target, and the final report reuses them.
    evaluate.report(target_dir, None, held, work, held_chat=held_chat, held_tools=held_tools, held_long=held_long)
    clock["evaluate"] = time.time() - t
    if not args.skip_draft:
        t = time.time()
        init = () if args.draft_init is None else ("--init-draft", str(args.draft_init), "--lr", DRAFT2_LR)
        init_key = {} if args.draft_init is None else {
            "init": train_target.file_digest(args.draft_init / "model.safetensors"), "lr": DRAFT2_LR}
        train_draft(args, work, target_dir, draft_dir, chat_path, extra=init, key_extra=init_key)
        clock["draft"] = time.time() - t
        drafts = {"draft": draft_dir}
        if not args.skip_draft2:
            t = time.time()
            train_draft2(args, work, target_dir, draft_dir, draft2_dir, chat_path)
            clock["draft2"] = time.time() - t
            drafts["draft2"] = draft2_dir
        t = time.time()
        evaluate.report(target_dir, drafts, held, work, held_chat=held_chat, held_tools=held_tools, held_long=held_long)
        clock["evaluate"] += time.time() - t
    print("stage minutes (this run): " + ", ".join(f"{k} {v / 60:.1f}" for k, v in clock.items())
          + f"; all {(time.time() - t0) / 60:.1f}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except train_target.TooLittleData as e:
        print(f"make_demo_models: {e}", file=sys.stderr)
        raise SystemExit(2) from None
