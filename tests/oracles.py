"""What the engines are measured against: each framework's own greedy generation, plus small helpers
the engine tests share."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine

ENGINES = ["cuda", "mlx"]


def transformers_greedy(target_dir, prompt_ids, max_new):
    """transformers' own `generate(do_sample=False)` ids, never stopping early."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                         pad_token_id=0, min_new_tokens=max_new)
    return out[0, len(prompt_ids):].tolist()


def mlx_lm_greedy(target_dir, prompt_ids, max_new, dtype=None):
    """mlx-lm's own greedy ids (generate_step with an argmax sampler) on a fresh load through mlx-lm's
    loader (engines.mlx.target.load_mlx_model only maps transformers-5 config keys and per-expert
    weights to the layouts mlx-lm reads; the model code is mlx-lm's)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from dflash_tui.engines.mlx.target import load_mlx_model

    config = json.loads((target_dir / "config.json").read_text())
    model = load_mlx_model(target_dir, config["model_type"], config)
    if dtype is not None:
        model.set_dtype(dtype)
    steps = generate_step(mx.array(prompt_ids), model, max_tokens=max_new, sampler=lambda x: mx.argmax(x, axis=-1))
    return [int(token) for token, _ in steps]


def framework_greedy(engine: str, target_dir, prompt_ids, max_new):
    if engine == "mlx":
        pytest.importorskip("mlx_lm")
    return (transformers_greedy if engine == "cuda" else mlx_lm_greedy)(target_dir, prompt_ids, max_new)


def engine_for(engine: str, target, draft=None, **kw):
    """An engine on the tiny pair; the CUDA engine pinned to the CPU in float32 unless asked otherwise (the
    oracles run there: on a GPU machine `auto` would be CUDA bf16). Skips when mlx is not installed."""
    if engine == "mlx":
        pytest.importorskip("mlx_lm")
    else:
        kw = {"device": "cpu", "dtype": "float32", **kw}
    return load_engine(EngineConfig(target=str(target), draft=str(draft) if draft else None, engine=engine, **kw))


def run(engine, **kw):
    """All events of one request, and its Summary."""
    events = list(engine.generate(GenerationRequest(**kw)))
    return events, engine.last_summary


def edited_copy(src, dst, **changes):
    """A copy of a checkpoint with config.json keys changed (`dflash_x` edits dflash_config.x)."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("dflash_"):
            config["dflash_config"][key.removeprefix("dflash_")] = value
        else:
            config[key] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def oracle_proposals(reference: list[int], committed_context: int, prompt_len: int, count: int) -> list[int]:
    """What a draft that is right 4 times in 5 proposes: the target's known greedy continuation,
    wrong at every 5th position, so steps accept long prefixes and reject in the middle of blocks.
    `committed_context` is the draft cache's length (positions before the block)."""
    start = committed_context - prompt_len + 1  # index in the reference of block position 1
    ids = []
    for i in range(start, start + count):
        right = reference[i] if i < len(reference) else 0
        ids.append(right if i % 5 else (right + 1) % 300)
    return ids
