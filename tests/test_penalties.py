"""Presence, frequency and repetition penalties and logit_bias (engines.config.Penalties) on both engines.

They shape the target's distribution p at every verified position, each position counted with its own
prefix (the prompt, the emitted ids, and the drafted ids before it in the block):
- T = 0: with a draft that is right 4 times in 5 (tests.oracles.oracle_proposals on the penalized
  reference), blocks 4 and 8 give exactly the ids of a block-1 run with the same penalties, and accept
  long prefixes; the same through `generate` at blocks 4 and 16. A positive control that leaves the drafted
  ids out of the counts gives other ids.
- T > 0, DFlash 2 (exact rejection sampling): at a near-zero temperature p is one-hot on the penalized
  argmax, so a one-hot-q draft's accepted, rejected and bonus tokens give the same block-1 ids: the
  penalties are part of the p the rule compares with q.
- Row j of a block's p equals a block-1 sampler's p after it has seen the drafted ids before j.
- On the cuda engine's graph path (traced on the CPU) the penalized ids equal eager at one host sync a step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash_tui.engines import GenerationRequest
from dflash_tui.engines.cuda import loop as cuda_loop
from dflash_tui.engines.cuda.draft import DraftCache as CudaDraftCache
from dflash_tui.engines.cuda.draft import Proposal
from dflash_tui.engines.sampling import SamplingParams
from tests.oracles import ENGINES, engine_for, oracle_proposals

PENALTIES = dict(presence_penalty=1.5, frequency_penalty=0.7, repetition_penalty=1.3, logit_bias={9: 3.0, 12: -2.0})
PROMPT = "0123456789 0123 what is 48 + 75?"
NEW = 28


@pytest.fixture(scope="module")
def engines(pairs):
    target, draft = pairs("qwen3")
    made = {}

    def get(name):
        if name not in made:
            made[name] = engine_for(name, target, draft)
        return made[name]

    return get


def block1(engine, **kw) -> list[int]:
    request = GenerationRequest(prompt=PROMPT, max_new_tokens=NEW, temperature=0.0, block_size=1, stop_ids=[], **kw)
    list(engine.generate(request))
    return engine.last_summary.token_ids


class CudaOracle(CudaDraftCache):
    """Proposals right 4 times in 5; with `q`, a DFlash 2 style proposal whose q is one-hot on them."""

    def __init__(self, draft, reference, prompt_len, q=False):
        super().__init__(draft, None)
        self.reference, self.prompt_len, self.q = reference, prompt_len, q

    def propose(self, block, embed, lm_head, noise=None, temperature=None, steer=None):
        ids = torch.tensor(oracle_proposals(self.reference, self.length, self.prompt_len, block.shape[1] - 1))
        return Proposal(ids, ids[:, None], torch.ones(len(ids), 1)) if self.q else Proposal(ids)


def mlx_oracle(draft, reference, prompt_len):
    import mlx.core as mx

    from dflash_tui.engines.mlx.draft import DraftCache

    class MlxOracle(DraftCache):
        def propose(self, block, embed, lm_head, steer=None):
            return mx.array(oracle_proposals(reference, self.length, prompt_len, block.shape[1] - 1), dtype=mx.int32)

        def propose_sampled(self, block, embed, lm_head, temperature=0.0, noise=None, steer=None):
            ids = self.propose(block, embed, lm_head)
            return ids, (mx.arange(lm_head.weight.shape[0])[None, :] == ids[:, None]).astype(mx.float32)

    return MlxOracle(draft, None)


def oracle_run(name, engine, ids, reference, block, params, draft=None):
    """(ids, accepted per step) of the loop with the oracle draft cache."""
    draft = draft or engine.draft
    if name == "cuda":
        sampler = cuda_loop.Sampler(params, engine.target.device)
        cache, draft_cache = engine.target.new_cache(), CudaOracle(draft, reference, len(ids), q=not params.greedy)
        steps = cuda_loop.speculative_decode(engine.target, draft, ids, block, NEW, sampler, cache=cache,
                                             draft_cache=draft_cache)
    else:
        from dflash_tui.engines.mlx import loop as mlx_loop

        steps = mlx_loop.speculative_decode(engine.target, draft, ids, block, NEW, mlx_loop.Sampler(params),
                                            cache=engine.target.make_cache(),
                                            draft_cache=mlx_oracle(draft, reference, len(ids)))
    out, accepted = [], []
    for step in steps:
        out += step.emitted
        accepted += [] if step.prefill else [step.accepted]
    return out, accepted


@pytest.mark.parametrize("name", ENGINES)
def test_penalized_greedy_ids_equal_a_block1_run(engines, name, monkeypatch):
    engine = engines(name)
    reference = block1(engine, **PENALTIES)
    assert reference != block1(engine)  # the penalties change the answer
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    for block in (4, 8):
        out, accepted = oracle_run(name, engine, ids, reference, block, SamplingParams(**PENALTIES))
        assert out == reference, f"block {block}"
        assert max(accepted) >= 3  # drafted ids were kept: later positions counted them
    for block in (4, 16):  # the public path (the random draft)
        list(engine.generate(GenerationRequest(prompt=PROMPT, max_new_tokens=NEW, temperature=0.0, block_size=block,
                                               stop_ids=[], **PENALTIES)))
        assert engine.last_summary.token_ids == reference
    # positive control: a block whose positions do not count the drafted ids before them differs
    module = cuda_loop if name == "cuda" else pytest.importorskip("dflash_tui.engines.mlx.loop")
    original = module.Penalizer.__call__
    monkeypatch.setattr(module.Penalizer, "__call__", lambda self, logits, drafted: original(self, logits, None))
    assert oracle_run(name, engine, ids, reference, 8, SamplingParams(**PENALTIES))[0] != reference


@pytest.mark.parametrize("name", ENGINES)
def test_rejection_sampling_compares_q_with_the_penalized_p(engines, name, pairs, tmp_path_factory):
    """A DFlash 2 draft at T > 0: at T = 1e-6 p is one-hot on the penalized argmax; a right drafted token is
    kept, a wrong one replaced from max(0, p - q), and the ids are the penalized block-1 ids."""
    engine = engines(name)
    reference = block1(engine, **PENALTIES)
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    draft = None
    if name == "mlx":  # the MLX loop takes the rejection path for a draft with a selector only
        from dflash_tui.engines.checkpoints import DraftInfo
        from dflash_tui.engines.mlx.draft import DFlashDraft
        from tests import tiny_dflash2

        target, _ = pairs("qwen3")
        path = tiny_dflash2.make_dflash2_draft(tmp_path_factory.mktemp("penalties") / "draft2", target, [0, 2])
        draft = DFlashDraft.load(DraftInfo.read(str(path)), engine.target.dtype)
    out, accepted = oracle_run(name, engine, ids, reference, 8, SamplingParams(temperature=1e-6, seed=3, **PENALTIES),
                               draft)
    assert out == reference and max(accepted) >= 3 and min(accepted) < 7


def test_each_rows_p_is_a_block1_samplers_after_the_drafted_ids_before_it():
    """Both engines' Sampler.probs at T > 0 with top_p: row j of a block equals a block-1 sampler that has
    also seen drafted[:j]; the engines agree with each other."""
    gen = torch.Generator().manual_seed(0)
    vocab, b = 50, 6
    logits = torch.randn(b, vocab, generator=gen) * 3
    drafted = torch.tensor([4, 7, 4, 4, 9])
    prompt, emitted = [1, 2, 3, 7], torch.tensor([5, 5, 8])
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=1, **PENALTIES)

    def cuda_sampler(extra=()):
        s = cuda_loop.Sampler(params, torch.device("cpu"))
        s.start(prompt, torch.device("cpu"))
        s.penalize(logits[:1])  # sizes the counts, as the prefill's token does
        s.observe(torch.cat([emitted, torch.tensor(list(extra), dtype=torch.long)]))
        return s

    block = cuda_sampler().probs(logits, drafted)
    for j in range(b):
        single = cuda_sampler(drafted[:j].tolist()).probs(logits[j: j + 1])
        torch.testing.assert_close(block[j: j + 1], single)
    plain = cuda_loop.Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=1), torch.device("cpu"))
    assert not torch.allclose(plain.probs(logits), block)
    mx = pytest.importorskip("mlx.core")
    from dflash_tui.engines.mlx import loop as mlx_loop

    s = mlx_loop.Sampler(params)
    s.start(prompt)
    s.penalize(mx.array(logits[:1].numpy()))
    s.observe(mx.array(emitted.numpy()))
    np.testing.assert_allclose(np.array(s.probs(mx.array(logits.numpy()), mx.array(drafted.numpy()))), block.numpy(),
                               atol=1e-6)


def test_the_graph_path_penalizes_as_eager_at_one_sync_a_step(engines, monkeypatch):
    from torch.profiler import ProfilerActivity, profile

    from dflash_tui.engines.cuda import cache as cache_module
    from dflash_tui.engines.cuda.graphs import StepGraphs

    engine = engines("cuda")
    monkeypatch.setattr(cache_module, "BUCKET", 64)
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    request = dict(prompt=PROMPT, max_new_tokens=NEW, block_size=4, stop_ids=[], logprobs=True, top_logprobs=2,
                   **PENALTIES)
    eager = list(engine.generate(GenerationRequest(temperature=0.9, seed=2, **request)))
    engine.graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:  # the captures run before the first step
            graphed = list(engine.generate(GenerationRequest(temperature=0.9, seed=2, **request)))
    finally:
        engine.graphs = None
    assert engine.last_summary.graphs
    names = [e.name for e in prof.events()]
    assert names.count(cuda_loop.HOST_SYNC) == len(graphed) and names.count("aten::_local_scalar_dense") == 0
    assert [e.emitted for e in graphed] == [e.emitted for e in eager]
    np.testing.assert_allclose([v for e in graphed for v in e.logprobs], [v for e in eager for v in e.logprobs],
                               atol=1e-4)
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    engine.new_context()


def test_out_of_range_penalties_are_one_sentence_before_anything_runs(engines):
    from dflash_tui.engines.errors import UserError

    for bad, needle in [(dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-3), "frequency_penalty"),
                        (dict(repetition_penalty=0), "repetition_penalty"), (dict(logit_bias={5: 101}), r"logit_bias\[5\]"),
                        (dict(logit_bias={-1: 1}), "logit_bias key"), (dict(logit_bias=[1]), "logit_bias")]:
        with pytest.raises(UserError, match=needle):
            GenerationRequest(prompt=PROMPT, **bad)
    with pytest.raises(UserError, match="logit_bias names token id 100000"):
        list(engines("cuda").generate(GenerationRequest(prompt=PROMPT, max_new_tokens=2, logit_bias={100000: 1.0})))
