"""The decode steps' attention (engines/cuda/attention.py): packing the query heads that share a K/V head
into query rows is the same product as transformers' copy of every K/V head (`repeat_kv`), with and without
a mask, for one query and for a block. It runs on the GPU; here it is checked on the CPU against an
independent reading (explicit softmax over repeated heads)."""

import pytest
import torch

from dflash_tui.engines.cuda.attention import packed_gqa, packed_sdpa


def reference(q, k, v, mask, scale):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("groups", [1, 4])
def test_packed_heads_give_the_repeated_heads_product(n, masked, groups):
    torch.manual_seed(n + groups)
    q, k, v = torch.randn(1, 2 * groups, n, 16), torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16)
    mask = None
    if masked:
        mask = torch.rand(1, 1, n, 30) > 0.4
        mask[..., -1] = True  # every row attends somewhere
    expected = reference(q, k, v, mask, 0.25)
    torch.testing.assert_close(packed_sdpa(q, k, v, mask, 0.25), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_gqa(q, k, v, mask, 0.25), expected, rtol=1e-5, atol=1e-5)
