"""Rollback cost of hybrid (gated delta net) targets per verify step, side by side with the verify pass.

    python benchmarks/rollback_cost.py                  # a random tiny Qwen3.5 built on the fly
    python benchmarks/rollback_cost.py --target DIR     # a real Qwen3.5 / Qwen3.6 checkpoint

For each block size: the verify pass over b tokens, our rollback (re-run only the linear-attention
mixers over the kept tokens), and the simplest alternative (restore a copy of the states and re-feed
the kept tokens through the whole target). Half the block is kept, a typical partial acceptance.
CPU ratios may not hold on a GPU, where the mixers' share of a layer's time differs.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from engines.checkpoints import TargetInfo  # noqa: E402
from engines.cuda.target import Target  # noqa: E402


def median_time(prepare, measure, repeats: int) -> float:
    """Median seconds of `measure(prepare())`; only `measure` is timed."""
    times = []
    for _ in range(repeats):
        state = prepare()
        start = time.perf_counter()
        measure(state)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cuda_rows(path: Path, block_sizes, prompt_len: int, repeats: int):
    target = Target(TargetInfo.read(str(path)), torch.device("cpu"), torch.float32, [])
    prompt = torch.arange(prompt_len).unsqueeze(0) % 200 + 5
    rows = []
    with torch.inference_mode():
        base = target.new_cache()
        target.forward(prompt, 0, base, last_only=True, capture=False)
        target.commit(base, prompt_len, prompt_len)
        for b in block_sizes:
            block = torch.arange(b).unsqueeze(0) + 40
            keep = max(1, b // 2)

            def fresh():
                cache = copy.deepcopy(base)
                target.before_verify(cache)
                return cache

            def verify(cache):
                target.forward(block, prompt_len, cache, last_only=False, capture=False)

            def verified():
                cache = fresh()
                verify(cache)
                return cache

            v = median_time(fresh, verify, repeats)
            ours = median_time(verified, lambda cache: target.commit(cache, keep, b), repeats)
            refeed = median_time(lambda: copy.deepcopy(base),  # restore the copy, feed the kept tokens again
                                 lambda cache: target.forward(block[:, :keep], prompt_len, cache, last_only=False,
                                                              capture=False), repeats)
            rows.append((b, v, ours, refeed))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="a Qwen3.5-family checkpoint directory (default: a random tiny one)")
    parser.add_argument("--block-sizes", default="4,8,16")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.target) if args.target else None
        if path is None:
            from tests.tiny import make_target

            path = make_target(Path(tmp) / "qwen3_5", "qwen3_5", hidden=256)
        rows = cuda_rows(path, [int(b) for b in args.block_sizes.split(",")], args.prompt_len, args.repeats)
    print("cuda engine (PyTorch, CPU): rollback after keeping half the block")
    print("| block | verify ms | rollback ms (mixers re-run) | rollback / verify | re-feed ms (alternative) | re-feed / verify |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b, v, ours, refeed in rows:
        print(f"| {b} | {1000 * v:.2f} | {1000 * ours:.2f} | {ours / v:.2f} | {1000 * refeed:.2f} | {refeed / v:.2f} |")


if __name__ == "__main__":
    main()
