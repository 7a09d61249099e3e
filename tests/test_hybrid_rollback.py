"""Gated-delta-net rollback, each way this transformers offers (hybrid.py): after a verify pass that keeps k
of b tokens, every layer's state equals the state reached by feeding only those k tokens (Qwen3.5 layout,
dense and MoE, and Qwen3-Next), up to float32 rounding: a pass over b tokens and one over k round
differently in earlier layers (about 1e-5)."""

import pytest
import torch

from dflash_tui.engines.checkpoints import TargetInfo
from dflash_tui.engines.cuda.cache import linear_length
from dflash_tui.engines.cuda.hybrid import KEEPS_HISTORY
from dflash_tui.engines.cuda.target import Target


@pytest.fixture(scope="module", ids="-".join,
                params=[(family, way) for family in ["qwen3_5", "qwen3_5_moe", "qwen3_next"] for way in ["mixers", "history"]])
def target(pairs, request):
    family, way = request.param
    if way == "history" and not KEEPS_HISTORY:
        pytest.skip("transformers < 5.25 keeps no recurrent-state history")
    path, _ = pairs(family)
    return Target(TargetInfo.read(str(path)), torch.device("cpu"), torch.float32, [0, 2], rollback=way)


def prefilled(target, prompt):
    cache = target.new_cache()
    target.forward(torch.tensor([prompt]), 0, cache, last_only=True, capture=False)
    target.commit(cache, len(prompt), len(prompt))
    return cache


@torch.inference_mode()
@pytest.mark.parametrize("keep", [1, 2, 5, 8])
def test_states_after_rollback_equal_states_of_the_kept_prefix(target, keep):
    prompt, block = [5, 17, 33, 48, 60, 71], [80, 91, 102, 113, 124, 135, 146, 157]
    verified = prefilled(target, prompt)
    target.before_verify(verified, len(block))
    target.forward(torch.tensor([block]), len(prompt), verified, last_only=False, capture=False)
    target.commit(verified, keep, len(block))

    direct = prefilled(target, prompt)
    target.before_verify(direct, keep)
    target.forward(torch.tensor([block[:keep]]), len(prompt), direct, last_only=False, capture=False)
    target.commit(direct, keep, keep)

    assert target.rollback.mixers, "the fixture must have linear-attention layers"
    assert verified.get_seq_length() == direct.get_seq_length() == len(prompt) + keep  # (5.25: a linear layer's count)
    for i, (a, b) in enumerate(zip(verified.layers, direct.layers)):
        if i in target.rollback.mixers:
            torch.testing.assert_close(a.conv_states[0], b.conv_states[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(a.recurrent_states[0], b.recurrent_states[0], rtol=1e-4, atol=1e-4)
            assert linear_length(a) == linear_length(b)
        else:
            assert a.get_seq_length() == b.get_seq_length() == len(prompt) + keep
            torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-4)
    # and the next token sees the same model state
    nxt = torch.tensor([[block[keep - 1] + 1]])
    la, _ = target.forward(nxt, len(prompt) + keep, verified, last_only=True, capture=False)
    lb, _ = target.forward(nxt, len(prompt) + keep, direct, last_only=True, capture=False)
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)
