"""Step times at a real model's shape, no download: a random target and a random draft of a named shape.

    python benchmarks/gpu_speed.py --shape qwen3-8b              # on a GPU, bf16
    OMP_NUM_THREADS=1 python benchmarks/gpu_speed.py             # on a CPU: the small shape, float32
    OMP_NUM_THREADS=1 python benchmarks/gpu_speed.py --section long --contexts 200,4000
    OMP_NUM_THREADS=1 python benchmarks/gpu_speed.py --section long --baseline /tmp/old   # side by side
    OMP_NUM_THREADS=1 python benchmarks/gpu_speed.py --section demo   # the demo pair, per-step time

Section `main` (one run, one process): transformers `generate` (eager; on a GPU also with its static cache
and torch.compile), the engine at block 1 and the engine's block-B draft+verify step, eager and (GPU only)
with CUDA graphs, for each prompt length of --prompts (choose them to land in different buckets). It
prints ms/token, ms/step, the K/V length a step attends over next to the live context length (a graph
step reads up to its tier), verify(B)/step(1), step(B)/step(1) and the speedup projected at a mean
acceptance length tau: tau x t(1) / t(B), and tau x t(generate) / t(B).

Sections `long` and `demo` report ms per step after the prefill, wall clock and this process's CPU time
(on a shared machine CPU time is what other processes leave unchanged), through the public engine API
only: `long` on the small shape at several context lengths (saved as checkpoints), with --baseline DIR
also an older checkout's engine, interleaved in the same run; `demo` on the demo pair with
engine_speed.py's prompts.

A random draft is almost never right, so every step keeps one token: a step's time is the cost of one
draft pass plus one verify pass, which is what tau multiplies. Only full-size blocks are timed (the last
block of an answer shrinks). Times are the best of --repeats runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402 - after the sys.path line above

# Public shapes: the targets' config.json values; drafts: 5 layers over the target layers the public
# DFlash drafts read (profiles/qwen3-8b.toml, profiles/llama3.1-8b-instruct.toml: spread from layer 1 to L-3).
SHAPES = {
    "qwen3-4b": dict(family="qwen3", layers=36, hidden=2560, intermediate=9728, heads=32, kv_heads=8, head_dim=128,
                     vocab=151936, tie=True, positions=40960, draft_layers=5, target_layer_ids=[1, 9, 17, 25, 33]),
    "qwen3-8b": dict(family="qwen3", layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128,
                     vocab=151936, tie=False, positions=40960, draft_layers=5, target_layer_ids=[1, 9, 17, 25, 33]),
    "llama3.1-8b": dict(family="llama", layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128,
                        vocab=128256, tie=False, positions=131072, draft_layers=5, target_layer_ids=[1, 8, 15, 22, 29]),
    # the CPU shape (the "random 6-layer pair, hidden 128")
    "small": dict(family="qwen3", layers=6, hidden=128, intermediate=384, heads=4, kv_heads=2, head_dim=32,
                  vocab=320, tie=False, positions=8192, draft_layers=2, target_layer_ids=[1, 3]),
}


def target_config(shape: dict):
    import transformers

    s = shape
    common = dict(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                  num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                  head_dim=s["head_dim"], max_position_embeddings=s["positions"], tie_word_embeddings=s["tie"],
                  initializer_range=0.2 if s["hidden"] <= 256 else 0.02, eos_token_id=0)
    if s["family"] == "llama":
        return transformers.LlamaConfig(**common, rope_theta=500000.0)
    return transformers.Qwen3Config(**common, rope_theta=1000000.0)


def draft_cfg(shape: dict, config, block: int) -> dict:
    from dflash_tui.engines.checkpoints import draft_config

    return draft_config(config.to_dict(), shape["draft_layers"], shape["target_layer_ids"], block, shape["vocab"] - 1)


def build_in_process(shape: dict, device: torch.device, dtype: torch.dtype, block: int):
    """(Target, DFlashDraft) with random weights, built on the device (no checkpoint files)."""
    from transformers import AutoModelForCausalLM

    from dflash_tui.engines.cuda.draft import DFlashDraft, rotary_embedding
    from dflash_tui.engines.cuda.target import Target

    torch.manual_seed(0)
    config = target_config(shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        cfg = draft_cfg(shape, config, block)
        draft = DFlashDraft(cfg)
    draft = draft.to(device=device, dtype=dtype).eval()
    draft.rotary = rotary_embedding(cfg).to(device)
    return Target.from_model(model, shape["target_layer_ids"]), draft


def save_pair(shape: dict, root: Path, block: int) -> tuple[Path, Path]:
    """The small shape as checkpoint folders, for the public engine API (section `long`)."""
    from transformers import AutoModelForCausalLM

    from dflash_tui.engines.cuda.draft import DFlashDraft, save_draft
    from tests import tiny

    torch.manual_seed(0)
    config = target_config(shape)
    tok = tiny.make_tokenizer(root / "target")
    config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(root / "target"))
    tiny.write_generation_config(root / "target", tok)
    cfg = draft_cfg(shape, config, block)
    cfg["dflash_config"]["mask_token_id"] = tok.convert_tokens_to_ids("<|mask|>")
    draft = DFlashDraft(cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    save_draft(draft, root / "draft")
    return root / "target", root / "draft"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_generate(model, prompt: list[int], new: int, static: bool, repeats: int) -> float:
    """ms per token of transformers generate: (t(new) - t(1)) / (new - 1), best of `repeats`."""
    device = model.device
    ids = torch.tensor([prompt], device=device)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    if static:
        kw["cache_implementation"] = "static"  # transformers compiles the decode step itself on a GPU

    def once(n: int) -> float:
        sync(device)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(device)
        return time.perf_counter() - start

    once(new)  # warm-up (and compile)
    best = min(once(new) - once(1) for _ in range(repeats))
    return 1000 * best / (new - 1)


def time_steps(target, draft, prompt: list[int], block: int, new: int, graphs, pool, repeats: int):
    """(ms per full-size step wall-clock, draft ms, verify ms, mean live K/V length, mean K/V length
    attended), best of `repeats` answers."""
    from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
    from dflash_tui.engines.sampling import SamplingParams

    best = None
    for _ in range(repeats + 1):  # the first answer warms up
        walls, drafts, verifies, live, read = [], [], [], [], []
        last, done = None, 0
        for step in speculative_decode(target, draft if block > 1 else None, prompt, block, new,
                                       Sampler(SamplingParams(), target.device), pool=pool, graphs=graphs):
            now = time.perf_counter()
            if not step.prefill and len(step.drafted) == block - 1:
                walls.append(now - last)
                drafts.append(step.draft_s)
                verifies.append(step.verify_s)
                start = len(prompt) + done - 1
                live.append(start + block)
                read.append(graphs.reach(start, block) if graphs is not None and graphs.covers(start, block) else start + block)
            done += len(step.emitted)
            last = time.perf_counter()
        n = len(walls)
        result = (1000 * sum(walls) / n, 1000 * sum(drafts) / n, 1000 * sum(verifies) / n, sum(live) / n, sum(read) / n)
        best = result if best is None or result[0] < best[0] else best
    return best


def main_section(args, shape: dict, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Prints the tables; returns their rows (for --json)."""
    from dflash_tui.engines.cuda.cache import CachePool, bucket_layers
    from dflash_tui.engines.cuda.graphs import StepGraphs

    target, draft = build_in_process(shape, device, dtype, args.block)
    out = []
    for length in [int(p) for p in str(args.prompts).split(",")]:
        prompt = torch.randint(0, shape["vocab"] - 1, (length,), generator=torch.Generator().manual_seed(1)).tolist()
        rows = []  # (name, ms, draft ms, verify ms, live, attended)
        t_gen = {}
        if args.generate != "none":
            t_gen["eager"] = time_generate(target.model, prompt, args.new, False, args.repeats)
            rows.append(("transformers generate, eager", t_gen["eager"], None, None, None, None))
        if device.type == "cuda" and args.generate == "all":
            t_gen["static+compile"] = time_generate(target.model, prompt, args.new, True, args.repeats)
            rows.append(("transformers generate, static cache + torch.compile", t_gen["static+compile"], None, None,
                         None, None))
        modes = [("eager", None)]
        capture_s = None
        if device.type == "cuda":
            modes.append(("graphs", StepGraphs(target, draft)))
        steps = {}
        for mode, graphs in modes:
            pool = CachePool(target, draft)
            for block in (1, args.block):
                steps[(mode, block)] = time_steps(target, draft, prompt, block, args.new, graphs, pool, args.repeats)
                name = f"engine block {block}, {mode}" + (" (ms/token)" if block == 1 else " (draft+verify step)")
                rows.append((name, *steps[(mode, block)]))
            if graphs is not None:
                capture_s = graphs.capture_s
                if graphs.failed:
                    print(f"graphs: {graphs.failed}")
        bucket = max(layer.capacity for layer in bucket_layers(pool.target_cache(0)))
        print(f"shape {args.shape} on {device} in {str(dtype).removeprefix('torch.')}: prompt {length} (bucket {bucket}), "
              f"{args.new} new tokens, block {args.block}, best of {args.repeats}")
        print("| run | ms | draft ms | verify ms | live K/V | K/V read |\n|---|---:|---:|---:|---:|---:|")
        for name, ms, d, v, live, read in rows:
            cells = [f"{ms:.2f}"] + ["" if x is None else f"{x:.2f}" for x in (d, v)] + \
                    ["" if x is None else f"{x:.0f}" for x in (live, read)]
            print(f"| {name} | " + " | ".join(cells) + " |")
            out.append({"prompt": length, "bucket": bucket, "run": name, "ms": ms, "draft_ms": d, "verify_ms": v,
                        "live_kv": live, "kv_read": read})
        if capture_s is not None:
            print(f"graph capture: {capture_s:.1f} s")
        print()
        print(f"| mode | verify({args.block})/step(1) | step({args.block})/step(1) | tok/s block 1 | "
              f"projected at tau {args.tau}: vs block 1 | " + " | ".join(f"vs generate {k}" for k in t_gen) + " |")
        print("|---|---:|---:|---:|---:|" + "---:|" * len(t_gen))
        for mode, _ in modes:
            one, full = steps[(mode, 1)][0], steps[(mode, args.block)]
            gen = " | ".join(f"{args.tau * t / full[0]:.2f}x" for t in t_gen.values())
            print(f"| {mode} | {full[2] / one:.2f} | {full[0] / one:.2f} | {1000 / one:.1f} | "
                  f"{args.tau * one / full[0]:.2f}x | {gen} |")
        print()
    return out


def one_answer(engine, request_kw: dict, api=None) -> tuple[float, float]:
    """(wall ms, this process's CPU ms) per step after the prefill of one answer (single-threaded, CPU
    time is what contention from other processes leaves unchanged)."""
    from dflash_tui import engines

    api = api or engines
    steps = 0
    for event in engine.generate(api.GenerationRequest(**request_kw)):
        if event.is_prefill:
            wall, cpu = time.perf_counter(), time.process_time()
        else:
            steps += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return 1000 * wall / max(steps, 1), 1000 * cpu / max(steps, 1)


def step_times(engine, request_kw: dict, repeats: int, api=None) -> tuple[float, float]:
    """The best (wall, CPU) ms per step of `repeats` answers after a warm-up answer."""
    one_answer(engine, request_kw, api)
    runs = [one_answer(engine, request_kw, api) for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def engine_packages(baseline):
    """[(label, the engine package)]: this checkout's, and with `baseline` (a folder holding an older
    checkout) that one's too: its top-level `engines` package, the layout before the engines moved into
    dflash_tui. Both load in this process under different names, so their steps are timed side by side."""
    import importlib

    from dflash_tui import engines

    found = [("this checkout", engines)]
    if baseline:
        sys.path.insert(0, str(Path(baseline).resolve()))
        name = "engines"  # the older layout's package name, imported by name from that folder only
        found.append((f"baseline {Path(baseline).name}", importlib.import_module(name)))
    return found


def long_section(args, shape: dict) -> None:
    """ms per block-B step at each context length, through load_engine, for this checkout's engine and a
    --baseline checkout's, taking turns answer by answer."""
    with tempfile.TemporaryDirectory() as tmp:
        target_dir, draft_dir = save_pair(shape, Path(tmp), args.block)
        loaded = [(label, api, api.load_engine(api.EngineConfig(target=str(target_dir), draft=str(draft_dir),
                                                                engine="cuda", device="cpu", dtype="float32")))
                  for label, api in engine_packages(args.baseline)]
        gen = torch.Generator().manual_seed(2)
        print(f"long context: small shape, cpu float32, {args.new} new tokens, best of {args.repeats}, "
              f"threads {torch.get_num_threads()}; ms per step after the prefill, wall clock and this process's CPU time")
        print(f"| context | engine | block {args.block} wall | block {args.block} cpu | block 1 wall | block 1 cpu |\n"
              "|---:|---|---:|---:|---:|---:|")
        for context in [int(c) for c in args.contexts.split(",")]:
            prompt = torch.randint(10, shape["vocab"] - 1, (context,), generator=gen).tolist()
            cells: dict[str, list[float]] = {label: [] for label, _, _ in loaded}
            for block in (args.block, 1):
                kw = dict(prompt_ids=prompt, max_new_tokens=args.new, temperature=0, block_size=block, stop_ids=[])
                for _, api, engine in loaded:  # warm-up answers
                    one_answer(engine, kw, api)
                runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in loaded}
                for _ in range(args.repeats):  # the engines take turns, answer by answer: load drifts hit both
                    for label, api, engine in loaded:
                        runs[label].append(one_answer(engine, kw, api))
                for label, timed in runs.items():
                    cells[label] += [min(r[0] for r in timed), min(r[1] for r in timed)]
            for label, values in cells.items():
                print(f"| {context} | {label} | " + " | ".join(f"{c:.2f}" for c in values) + " |", flush=True)


def demo_section(args) -> None:
    """ms per step on the demo pair (profiles/demo), block 1 and block B, the prompts engine_speed.py uses,
    each decoded to the target's eos: the whole run's best, wall clock and CPU time."""
    from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine

    root = Path(__file__).resolve().parent.parent / "profiles" / "demo"
    engine = load_engine(EngineConfig(target=str(root / "target"), draft=str(root / "draft"), engine="cuda",
                                      device="cpu", dtype="float32"))
    prompts = ["What is 48 + 75?", "What is 327 + 589?", "What is 904 - 358?", "How much is 8 times 12?",
               "Sort these numbers from smallest to largest: 42, 7, 19, 88, 3."]
    ids = [engine.prepare(GenerationRequest(messages=[{"role": "user", "content": p}])) for p in prompts]
    print(f"demo pair, cpu float32, best of {args.repeats}, threads {torch.get_num_threads()}: ms per step "
          "(mean over the 5 prompts of each prompt's best)")
    print("| block | wall ms/step | cpu ms/step |\n|---:|---:|---:|")
    for block in (1, args.block):
        times = [step_times(engine, dict(prompt_ids=p, max_new_tokens=256, temperature=0, block_size=block),
                            args.repeats) for p in ids]
        print(f"| {block} | {sum(t[0] for t in times) / len(times):.2f} | {sum(t[1] for t in times) / len(times):.2f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: qwen3-8b on a GPU, small on a CPU")
    parser.add_argument("--section", choices=["main", "long", "demo", "all"], default="main")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--prompts", default="536", help="prompt lengths in tokens (random ids), comma-separated")
    parser.add_argument("--generate", choices=["none", "eager", "all"], default="all",
                        help="transformers generate baselines to time (all: also static cache + compile on a GPU)")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="section long: also time the engine of an older checkout in DIR (layout with engines/ at its root)")
    parser.add_argument("--output", default=None, metavar="FILE", help="section main: also write its rows as JSON here")
    parser.add_argument("--new", type=int, default=128, help="new tokens per answer")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tau", type=float, default=6.5)
    parser.add_argument("--contexts", default="200,4000")
    args = parser.parse_args()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    args.shape = args.shape or ("qwen3-8b" if device.type == "cuda" else "small")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.section in ("main", "all"):
        rows = main_section(args, SHAPES[args.shape], device, dtype)
        if args.output:
            import json

            Path(args.output).write_text(json.dumps({"shape": args.shape, "device": str(device), "rows": rows}, indent=2))
    if args.section in ("long", "all"):
        long_section(args, SHAPES["small"])
    if args.section in ("demo", "all"):
        demo_section(args)


if __name__ == "__main__":
    main()
