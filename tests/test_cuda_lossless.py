"""Invariant 1: at temperature 0 the CUDA engine reproduces transformers' own greedy ids, for every
block size, with and without a draft window, for each target family (float32, random tiny pairs)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines import EngineConfig, GenerationRequest, load_engine

PROMPTS = ["What is 48 + 75?", "The quick brown fox", "Hello world, speculative decoding"]
BLOCKS = [1, 2, 4, 8, 16]
NEW = 40


def greedy_reference(target_dir, prompt_ids, max_new):
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                         pad_token_id=0, min_new_tokens=max_new)
    return out[0, len(prompt_ids):].tolist()


FAMILIES = [("qwen3", False), ("qwen3_moe", False), ("llama", False), ("qwen3", True), ("qwen3_5", False),
            ("qwen3_5_moe", False), ("qwen3_5", True)]


@pytest.mark.parametrize("family,last_layer", FAMILIES)
@pytest.mark.parametrize("window", [None, 5])
def test_greedy_ids_match_transformers(pairs, family, last_layer, window):
    target, draft = pairs(family, last_layer)
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", draft_window=window))
    for prompt in PROMPTS:
        ids = engine.prepare(GenerationRequest(prompt=prompt))
        expected = greedy_reference(target, ids, NEW)
        for block in BLOCKS:
            list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=NEW, temperature=0,
                                                   block_size=block, stop_ids=[])))
            summary = engine.last_summary
            assert summary.token_ids == expected, f"block {block}, prompt {prompt!r}"
            assert summary.generated_tokens == NEW
