"""Rollback cost of hybrid (gated delta net) targets per verify step, side by side with the verify pass.

    python benchmarks/rollback_cost.py                  # a random tiny Qwen3.5 built on the fly
    python benchmarks/rollback_cost.py --target DIR     # a real Qwen3.5 / Qwen3.6 checkpoint

For each block size, engine and way to roll back (engines/cuda/hybrid.py): the verify pass over b
tokens, then the rollback to the kept tokens, and their sum, the cost a step pays. Ways: "mixers" (the
verify pass uses the chunked kernel; re-run only the linear-attention mixers over the kept tokens, from
their inputs captured during the verify pass), "history" (transformers 5.25 and later: the verify pass
computes the block one token at a time and keeps the state after each; the rollback picks one), and
"re-feed", the simplest alternative (restore a copy of the states and feed the kept tokens through the
whole target again; the MLX engine's fallback for caches it cannot recompute). Half the block is kept,
a typical partial acceptance, unless --keep says all (a full acceptance) or one. The MLX rows evaluate
each measured part on its own (mx.eval); in the decoding loop the rollback is lazy and runs inside the
next step's graph. CPU ratios may not hold on a GPU, where the
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
from dflash_tui.engines.cuda.hybrid import KEEPS_HISTORY  # noqa: E402 - after the sys.path line above
from dflash_tui.engines.cuda.target import Target  # noqa: E402 - after the sys.path line above

# how many of a block's b tokens the step keeps: half (a typical partial acceptance), all (a full one), one
KEEPS = {"half": lambda b: max(1, b // 2), "all": lambda b: b, "one": lambda b: 1}


def median_time(prepare, measure, repeats: int) -> float:
    """Median seconds of `measure(prepare())`; only `measure` is timed."""
    times = []
    for _ in range(repeats):
        state = prepare()
        start = time.perf_counter()
        measure(state)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cuda_rows(path: Path, block_sizes, prompt_len: int, repeats: int, keep_of):
    """(block, way, verify s, rollback s) for each way the cuda engine can take with this transformers."""
    ways = ["mixers"] + (["history"] if KEEPS_HISTORY else [])
    targets = {way: Target(TargetInfo.read(str(path)), torch.device("cpu"), torch.float32, [], rollback=way) for way in ways}
    prompt = torch.arange(prompt_len).unsqueeze(0) % 200 + 5
    rows = []
    with torch.inference_mode():
        for b in block_sizes:
            block = torch.arange(b).unsqueeze(0) + 40
            keep = keep_of(b)
            for way, target in targets.items():
                base = target.new_cache()
                target.forward(prompt, 0, base, last_only=True, capture=False)
                target.commit(base, prompt_len, prompt_len)

                def fresh(target=target, base=base):
                    cache = copy.deepcopy(base)
                    target.before_verify(cache, b)
                    return cache

                def verify(cache, target=target):
                    target.forward(block, prompt_len, cache, last_only=False, capture=False)

                def verified(fresh=fresh, verify=verify):
                    cache = fresh()
                    verify(cache)
                    return cache

                v = median_time(fresh, verify, repeats)
                rows.append((b, way, v, median_time(verified, lambda cache, target=target: target.commit(cache, keep, b), repeats)))
                if way == "mixers":  # the simplest alternative: restore the copy, feed the kept tokens again
                    refeed = median_time(lambda base=base: copy.deepcopy(base),
                                         lambda cache, target=target: target.forward(block[:, :keep], prompt_len, cache,
                                                                                     last_only=False, capture=False), repeats)
                    rows.append((b, "re-feed", v, refeed))
    return rows


def mlx_rows(path: Path, block_sizes, prompt_len: int, repeats: int, keep_of):
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
        keep = keep_of(b)

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
        rows.append((b, "mixers", v, median_time(lambda: verified(True), roll, repeats)))
        rows.append((b, "re-feed", v, median_time(lambda: verified(False), roll, repeats)))
    device = "GPU" if mx.default_device().type == mx.DeviceType.gpu else "CPU"
    return rows, device


def print_table(title: str, rows) -> None:
    """One row per block size and way; "step" is verify + rollback, the cost a verify step pays."""
    print(title)
    print("| block | way | verify ms | rollback ms | step ms | step / mixers step |")
    print("|---:|---|---:|---:|---:|---:|")
    mixers = {b: v + r for b, way, v, r in rows if way == "mixers"}
    for b, way, v, r in rows:
        print(f"| {b} | {way} | {1000 * v:.2f} | {1000 * r:.2f} | {1000 * (v + r):.2f} | {(v + r) / mixers[b]:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="a Qwen3.5-family checkpoint directory (default: a random tiny one)")
    parser.add_argument("--block-sizes", default="4,8,16")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--engines", default="cuda,mlx", help="comma-separated: cuda, mlx")
    parser.add_argument("--keep", choices=list(KEEPS), default="half", help="how much of each block is kept (default half)")
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
            rows = cuda_rows(path, block_sizes, args.prompt_len, args.repeats, KEEPS[args.keep])
            import transformers

            tables.append((f"cuda engine (PyTorch, CPU, transformers {transformers.__version__}): rollback after keeping "
                           f"{args.keep} of the block", rows))
        if "mlx" in engines:
            try:
                rows, device = mlx_rows(path, block_sizes, args.prompt_len, args.repeats, KEEPS[args.keep])
            except ImportError as exc:
                print(f"mlx engine skipped: {exc}")
            else:
                tables.append((f"mlx engine (mlx-lm, {device}): rollback after keeping {args.keep} of the block", rows))
    for i, (title, rows) in enumerate(tables):
        if i:
            print()
        print_table(title, rows)


if __name__ == "__main__":
    main()
