"""The prepared GPU check (`make gpu-check`): everything the CUDA graph path must show on a real GPU, in one
run of about 5 minutes, written to OUT/gpu-check.json and OUT/gpu-check.md.

1. The CUDA-only tests (they skip on a CPU), and structured outputs' lossless tests on the cuda engine (on a GPU
   they run there: the grammar's masks built on the host between the draft and the verify).
2. `benchmarks/gpu_speed.py --shape qwen3-8b` (random weights, speed only): eager vs graphs at blocks 1 and
   16, with prompts that land in the 1k, 3k and 8k buckets, and the K/V length each step reads.
3. bf16 ids, graphs vs eager, on the demo pair with its 16 benchmark prompts and its example prompts, at
   block 16: how many answers agree, and for the others the first differing position and the target's
   top-2 margin there (a near-tie is numerical noise; a wide margin is a bug).
4. The capture time at load and the first answer's latency on the graph engine.

On a machine without CUDA it runs what it can (the tests skip, the speed section times the small shape on
the CPU, the demo section compares eager with eager) and says so: a plumbing check, not a GPU result.

    python scripts/gpu_check.py --out gpu-check            # what make gpu-check runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_tests(out: Path) -> dict:
    """The CUDA-only tests (every test that skips without a CUDA device) and the constrained ones on the cuda
    engine."""
    log = out / "cuda-tests.log"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           "tests/test_static_cache.py", "tests/test_structured.py", "-k", "cuda"], cwd=ROOT,
                          capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {"exit_code": done.returncode, "summary": last, "seconds": round(time.perf_counter() - started, 1)}


def run_speed(out: Path, cuda: bool, quick: bool) -> dict:
    rows = out / "gpu_speed.json"
    args = ["--shape", "qwen3-8b", "--prompts", "536,2500,7000", "--new", "64", "--repeats", "3"] if cuda else \
           ["--shape", "small", "--prompts", "100" if quick else "536,2500", "--new", "24", "--repeats", "1"]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "benchmarks/gpu_speed.py", "--generate", "eager", *args, "--output", str(rows)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    (out / "gpu_speed.txt").write_text(done.stdout + done.stderr)
    result = json.loads(rows.read_text()) if rows.exists() else {}
    return {"exit_code": done.returncode, "seconds": round(time.perf_counter() - started, 1), **result}


def demo_prompts(quick: bool) -> list[str]:
    from dflash_tui.core.profiles import load_profile
    from dflash_tui.measure.bench import builtin_set

    prompts = [s["turns"][0] for s in builtin_set("demo")] + list(load_profile("demo").examples)
    return prompts[:2] if quick else prompts


def run_demo(cuda: bool, quick: bool) -> dict:
    """bf16 ids of the graph engine against the eager engine on the demo pair, block 16."""
    from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine

    pair = ROOT / "profiles" / "demo"
    kw = dict(target=str(pair / "target"), draft=str(pair / "draft"), engine="cuda", device="cuda" if cuda else "cpu",
              dtype="bfloat16" if cuda else "float32", block_size=16, max_new_tokens=256)
    eager = load_engine(EngineConfig(**kw, cuda_graphs=False))
    started = time.perf_counter()
    graphed = load_engine(EngineConfig(**kw, cuda_graphs=cuda))
    load_s = time.perf_counter() - started
    graphs = getattr(graphed, "graphs", None)
    result = {"dtype": kw["dtype"], "graphs": graphs is not None, "graphs_note": getattr(graphed, "graphs_note", ""),
              "load_s": round(load_s, 2), "capture_s": round(graphs.capture_s, 2) if graphs else None,
              "captures_at_load": graphs.captures if graphs else None, "answers": []}
    for n, prompt in enumerate(demo_prompts(quick)):
        request = dict(messages=[{"role": "user", "content": prompt}], max_new_tokens=256, temperature=0, block_size=16)
        a = list(eager.generate(GenerationRequest(**request))) and eager.last_summary
        t0 = time.perf_counter()
        list(graphed.generate(GenerationRequest(**request)))
        b = graphed.last_summary
        if n == 0:
            result["first_answer_s"] = round(time.perf_counter() - t0, 3)
            result["first_answer_ttft_s"] = round(b.ttft_s, 3)
            result["captures_after_first_answer"] = graphs.captures if graphs else None
        row = {"prompt": prompt, "equal": a.token_ids == b.token_ids, "tokens": len(b.token_ids), "replayed": b.graphs}
        if not row["equal"]:
            i = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                     min(len(a.token_ids), len(b.token_ids)))
            ids = eager.prepare(GenerationRequest(messages=request["messages"])) + a.token_ids[:i]
            row.update(first_difference=i, margin=eager.top2_margin(ids).value)
        result["answers"].append(row)
    result["agree"] = sum(r["equal"] for r in result["answers"])
    return result


def markdown(report: dict) -> str:
    lines = [f"# GPU check ({report['device']}, {report['when']})", ""]
    t = report["tests"]
    lines += [f"CUDA-only tests: {t['summary']} (exit {t['exit_code']}, {t['seconds']} s)", ""]
    s = report["speed"]
    lines += [f"gpu_speed.py, shape {s.get('shape')}: ms per step (block 1: per token)", "",
              "| prompt | bucket | run | ms | live K/V | K/V read |", "|---:|---:|---|---:|---:|---:|"]
    for r in s.get("rows", []):
        live = "" if r["live_kv"] is None else f"{r['live_kv']:.0f}"
        read = "" if r["kv_read"] is None else f"{r['kv_read']:.0f}"
        lines.append(f"| {r['prompt']} | {r['bucket']} | {r['run']} | {r['ms']:.2f} | {live} | {read} |")
    d = report["demo"]
    lines += ["", f"Demo pair, {d['dtype']}, block 16, graphs {'on' if d['graphs'] else 'off'} ({d['graphs_note']}): "
              f"{d['agree']}/{len(d['answers'])} answers identical to eager; load {d['load_s']} s, capture "
              f"{d['capture_s']} s ({d['captures_at_load']} graphs), first answer {d.get('first_answer_s')} s "
              f"(TTFT {d.get('first_answer_ttft_s')} s), captures after it: {d.get('captures_after_first_answer')}", ""]
    differing = [a for a in d["answers"] if not a["equal"]]
    if differing:
        lines += ["| prompt | first difference | top-2 margin there |", "|---|---:|---:|"]
        lines += [f"| {a['prompt']} | {a['first_difference']} | {a['margin']} |" for a in differing]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu-check", help="folder for gpu-check.json, gpu-check.md and the logs")
    parser.add_argument("--quick", action="store_true", help="a plumbing run: no tests, two prompts, the small shape")
    args = parser.parse_args()
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "no CUDA device: CPU plumbing run"
    report = {"device": device, "when": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__}
    report["tests"] = {"exit_code": None, "summary": "skipped (--quick)", "seconds": 0} if args.quick else run_tests(out)
    print(f"tests: {report['tests']['summary']}", flush=True)
    report["speed"] = run_speed(out, cuda, args.quick)
    print(f"speed: {len(report['speed'].get('rows', []))} rows in {report['speed']['seconds']} s", flush=True)
    report["demo"] = run_demo(cuda, args.quick)
    print(f"demo: {report['demo']['agree']}/{len(report['demo']['answers'])} identical", flush=True)
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu-check.md").write_text(markdown(report))
    print(markdown(report))
    failed = report["tests"]["exit_code"] not in (0, None) or report["speed"]["exit_code"] != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
