"""Rollback cost of hybrid (gated delta net) targets per verify step, side by side with the verify pass.

    python benchmarks/rollback_cost.py                  # a random tiny Qwen3.5 built on the fly
    python benchmarks/rollback_cost.py --target DIR     # a real Qwen3.5 / Qwen3.6 checkpoint

For each block size and engine: the verify pass over b tokens, our rollback (re-run only the
linear-attention mixers over the kept tokens, from their inputs captured during the verify pass), and
the simplest alternative (restore a copy of the states and re-feed the kept tokens through the whole
target; the MLX engine's fallback for caches it cannot recompute). Half the block is kept, a typical
partial acceptance. The MLX rows evaluate each measured part on its own (mx.eval); in the decoding loop
the rollback is lazy and runs inside the next step's graph. CPU ratios may not hold on a GPU, where the
mixers' share of a layer's time differs. The MLX rows need mlx and mlx-lm (skipped without them).
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

import torch  # noqa: E402 - after the sys.path line above

from dflash_tui.engines.checkpoints import TargetInfo  # noqa: E402 - after the sys.path line above
from dflash_tui.engines.cuda.target import Target  # noqa: E402 - after the sys.path line above


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


def mlx_rows(path: Path, block_sizes, prompt_len: int, repeats: int):
    import mlx.core as mx

    from dflash_tui.engines.mlx.target import Target as MlxTarget

    target = MlxTarget(TargetInfo.read(str(path)), "float32", [])
    prompt = mx.array([[i % 200 + 5 for i in range(prompt_len)]])

    def evaluate(cache, *extra):
        mx.eval([c.state for c in cache], *extra)

    def prefilled():
        cache = target.make_cache()
        target.forward(prompt, cache, capture=False)
        evaluate(cache)
        return cache

    rows = []
    for b in block_sizes:
        block = mx.array([[40 + i for i in range(b)]])
        keep = max(1, b // 2)

        def fresh(recompute=True):
            cache = prefilled()
            rollback = target.rollback_for(cache, recompute=recompute)
            rollback.snapshot(b)
            return cache, rollback

        def verify(state):
            cache, _ = state
            logits, _ = target.forward(block, cache, capture=False)
            evaluate(cache, logits)

        def verified(recompute):
            state = fresh(recompute)
            verify(state)
            return state

        def roll(state):
            cache, rollback = state
            rollback.rollback(b, keep, lambda k: target.forward(block[:, :k], cache, capture=False))
            evaluate(cache)

        v = median_time(fresh, verify, repeats)
        ours = median_time(lambda: verified(True), roll, repeats)
        refeed = median_time(lambda: verified(False), roll, repeats)
        rows.append((b, v, ours, refeed))
    device = "GPU" if mx.default_device().type == mx.DeviceType.gpu else "CPU"
    return rows, device


def print_table(title: str, rows) -> None:
    print(title)
    print("| block | verify ms | rollback ms (mixers re-run) | rollback / verify | re-feed ms (alternative) | re-feed / verify |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b, v, ours, refeed in rows:
        print(f"| {b} | {1000 * v:.2f} | {1000 * ours:.2f} | {ours / v:.2f} | {1000 * refeed:.2f} | {refeed / v:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="a Qwen3.5-family checkpoint directory (default: a random tiny one)")
    parser.add_argument("--block-sizes", default="4,8,16")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--engines", default="cuda,mlx", help="comma-separated: cuda, mlx")
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    block_sizes = [int(b) for b in args.block_sizes.split(",")]
    tables = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.target) if args.target else None
        if path is None:
            from tests.tiny import make_target

            path = make_target(Path(tmp) / "qwen3_5", "qwen3_5", hidden=256)
        if "cuda" in engines:
            rows = cuda_rows(path, block_sizes, args.prompt_len, args.repeats)
            tables.append(("cuda engine (PyTorch, CPU): rollback after keeping half the block", rows))
        if "mlx" in engines:
            try:
                rows, device = mlx_rows(path, block_sizes, args.prompt_len, args.repeats)
            except ImportError as exc:
                print(f"mlx engine skipped: {exc}")
            else:
                tables.append((f"mlx engine (mlx-lm, {device}): rollback after keeping half the block", rows))
    for i, (title, rows) in enumerate(tables):
        if i:
            print()
        print_table(title, rows)


if __name__ == "__main__":
    main()
