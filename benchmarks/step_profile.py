"""Where a DFlash step's time goes on the CPU, and what a second thread buys each part (issue 42's profile).

    python benchmarks/step_profile.py                       # the demo pair, compiled steps, 1 and 2 threads
    python benchmarks/step_profile.py --threads 1,2 --block-size 16 --eager

Each thread count runs in a process of its own (OMP_NUM_THREADS set before torch loads): the demo pair on the
cuda engine with its decode steps compiled by inductor (as `dflash chat` adopts them), warmed up, then the
five engine_speed prompts decoded at temperature 0 under torch.profiler. The wall time of those requests per
decode step (the prefill amortized over them) is split by the profiler's self times into:

- GEMM: the matrix products inductor leaves to the BLAS (aten::mm / addmm / bmm and oneDNN's linear);
- attention: the SDPA kernel;
- fused kernels: inductor's generated C++ kernels (norms, rotary, activations, cache writes), the self time of
  its compiled graphs;
- other ops: every other aten op that still runs outside them (the loop's glue, argmax, copies);
- runtime: dynamo's cache lookup, AOT wrappers and the step's one host sync;
- Python: the rest of the wall time (the loop, the events, the detokenizer).

The last column is the second thread's speedup of each part: a part that does not scale caps the step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm", "mkldnn::_linear_pointwise",
        "aten::linear", "mkl::_mkl_linear", "aten::matmul")
RUNTIME = ("TorchDynamo Cache Lookup", "Pregraph bytecode", "Torch-Compiled Region", "AOTDispatcher",
           "dflash::host_sync")
PARTS = ("GEMM", "attention", "fused kernels", "other ops", "runtime", "Python")


def part_of(name: str) -> str:
    if name in GEMM:
        return "GEMM"
    if "scaled_dot_product" in name:
        return "attention"
    if name.startswith("## Call CompiledFxGraph"):
        return "fused kernels"
    if name.startswith(RUNTIME):
        return "runtime"
    return "other ops"


def child(block_size: int, compiled: bool, repeats: int, max_new: int) -> dict:
    """In this process (threads already set): ms per step by part."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.engine_speed import PROMPTS
    from dflash_tui.engines import GenerationRequest, load_engine
    from dflash_tui.engines.config import EngineConfig

    demo = os.path.join(ROOT, "profiles", "demo")
    engine = load_engine(EngineConfig(target=os.path.join(demo, "target"), draft=os.path.join(demo, "draft"),
                                      engine="cuda", dtype="float32", compile_steps=compiled))
    requests = [GenerationRequest(prompt_ids=engine.prepare(GenerationRequest(messages=[{"role": "user", "content": p}])),
                                  max_new_tokens=max_new, temperature=0, block_size=block_size) for p in PROMPTS]
    for request in requests * 2:  # warm-up: compiled code loaded, caches sized
        list(engine.generate(request))
    steps, wall = 0, 0.0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            for request in requests:
                started = time.perf_counter()
                list(engine.generate(request))
                wall += time.perf_counter() - started
                steps += len(engine.last_summary.acceptance_lengths)
    parts = dict.fromkeys(PARTS, 0.0)
    for event in prof.key_averages():
        parts[part_of(event.key)] += event.self_cpu_time_total / 1e3  # ms
    parts["Python"] = max(0.0, wall * 1e3 - sum(parts.values()))
    return {"threads": torch.get_num_threads(), "steps": steps, "ms_per_step": wall * 1e3 / steps,
            "parts": {k: v / steps for k, v in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--eager", action="store_true", help="profile the eager steps instead of the compiled ones")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.block_size, not args.eager, args.repeats, args.max_new_tokens)))
        return
    results = []
    for n in [int(t) for t in args.threads.split(",")]:
        print(f"  profiling at {n} thread(s)...", file=sys.stderr, flush=True)
        started = time.time()
        out = subprocess.run([sys.executable, __file__, "--child", "--block-size", str(args.block_size),
                              "--repeats", str(args.repeats), "--max-new-tokens", str(args.max_new_tokens),
                              *(["--eager"] if args.eager else [])],
                             env={**os.environ, "OMP_NUM_THREADS": str(n)}, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"the {n}-thread run failed:\n{out.stderr[-3000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  done in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    kind = "eager" if args.eager else "compiled"
    head = " | ".join(f"{r['threads']} thread{'s' if r['threads'] > 1 else ''} ms/step" for r in results)
    print(f"demo pair, {kind} steps, block {args.block_size}, {results[0]['steps']} steps per run")
    print(f"| part | {head} | share at {results[0]['threads']} | speedup {results[0]['threads']} -> {results[-1]['threads']} |")
    print("|---|" + "---:|" * (len(results) + 2))
    for part in (*PARTS, "step"):
        values = [r["ms_per_step"] if part == "step" else r["parts"][part] for r in results]
        share = values[0] / results[0]["ms_per_step"]
        speedup = values[0] / values[-1] if values[-1] else float("nan")
        cells = " | ".join(f"{v:.2f}" for v in values)
        print(f"| {part} | {cells} | {100 * share:.0f}% | {speedup:.2f}x |")


if __name__ == "__main__":
    main()
