"""z-lab's own PyTorch loop (`dflash.model.dflash_generate`, PyPI's `dflash` 0.1.0) on the CPU, run by the
python of its own venv (benchmarks/peers.py starts it): it needs its own transformers, not ours.

Reads one JSON job on stdin: {"target", "draft", "threads", "prompts": [[ids]], "max_new_tokens",
"warmup_tokens", "stop_ids", "blocks": [1, 16], "repeats"}. Writes one JSON line on stdout: per block, the timed passes
(tokens, wall seconds, decode seconds), the ids of the last pass and every step's acceptance length.

Its CLI hard-codes cuda:0 and its clock calls torch.cuda.synchronize, so the clock is swapped for a CPU one.
Block 1 is the same loop with no draft (one target token per step): z-lab's plain decoding.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def load(job: dict):
    """The target and draft at the job's precision (float32 or bfloat16) with sdpa attention, as z-lab's benchmark
    loads them (it uses bf16 on GPU)."""
    import torch
    from dflash import model as zlab
    from transformers import AutoModelForCausalLM

    zlab._cuda_time = time.perf_counter  # the CPU has nothing to synchronize
    torch.set_num_threads(job["threads"])
    dtype = getattr(torch, job.get("dtype", "float32"))
    target = AutoModelForCausalLM.from_pretrained(job["target"], dtype=dtype, attn_implementation="sdpa").eval()
    with open(Path(job["draft"]) / "config.json") as f:
        architectures = json.load(f).get("architectures") or []
    kind = zlab.DFlash2DraftModel if "DFlash2DraftModel" in architectures else zlab.DFlashDraftModel
    draft = kind.from_pretrained(job["draft"], dtype=dtype, attn_implementation="sdpa").eval()
    return zlab, target, draft


def one_pass(zlab, target, draft, job: dict, block: int, limit: int) -> tuple[list, list, list]:
    """Every prompt once: [(tokens, wall s, decode s)] per prompt, their generated ids, the acceptance lengths."""
    import torch

    timings, ids, lengths = [], [], []
    for prompt in job["prompts"]:
        start = time.perf_counter()
        out = zlab.dflash_generate(draft, target, torch.tensor([prompt]), limit, job["stop_ids"],
                                   temperature=0.0, block_size=block, return_stats=True)
        wall = time.perf_counter() - start
        new = out.output_ids[0, out.num_input_tokens:].tolist()
        timings.append((len(new), wall, out.time_per_output_token * len(new)))
        ids.append(new)
        lengths += [int(n) for n in out.acceptance_lengths]
    return timings, ids, lengths


def main() -> None:
    job = json.load(sys.stdin)
    zlab, target, draft = load(job)
    result = {}
    for block in job["blocks"]:
        passes = []
        for rep in range(job["repeats"] + 1):  # the first pass is a short warm-up
            limit = job["max_new_tokens"] if rep else job["warmup_tokens"]
            timings, ids, lengths = one_pass(zlab, target, draft, job, block, limit)
            if rep:
                passes.append(timings)
            print(f"z-lab block {block}: pass {rep}/{job['repeats']} done", file=sys.stderr, flush=True)
        result[str(block)] = {"passes": passes, "ids": ids, "lengths": lengths}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
