"""logprobs and top_logprobs (GenerationRequest.logprobs) on both engines: each emitted id's raw
log-probability (before bias, penalties, temperature and truncation, vLLM's default) from the target's
verify logits at the position it was emitted from.

- A block-8 run whose draft is right 4 times in 5 (multi-row verify passes that accept, reject and end on
  the target's own token) gives a block-1 run's logprobs to 1e-3 and the same top ids, and both equal
  transformers' log_softmax over the whole sequence.
- At T > 0 with penalties and a DFlash 2 draft's rejection sampling (resampled tokens that differ from the
  drafted ones), each emitted id's logprob is still the raw one of that id.
- Through `generate`: each event carries one logprob per emitted id, cut with the ids at a stop id;
  without `logprobs` the fields stay None.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dflash_tui.engines import GenerationRequest
from dflash_tui.engines.sampling import SamplingParams
from tests.oracles import ENGINES
from tests.test_penalties import PENALTIES, PROMPT, CudaOracle, engines, mlx_oracle  # noqa: F401 - engines: the fixture

NEW = 28
TOP = 3


@pytest.fixture(scope="module")
def transformers_target(pairs):
    from transformers import AutoModelForCausalLM

    target, _ = pairs("qwen3")
    return AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()


@torch.inference_mode()
def raw_logprobs(model, prompt_ids, out_ids):
    """transformers' log_softmax at each generated position: [n, vocab]."""
    ids = torch.tensor([prompt_ids + out_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: len(prompt_ids) - 1 + len(out_ids)]
    return torch.log_softmax(logits.float(), dim=-1)


def collect(steps):
    out, logprobs, tops, accepted = [], [], [], []
    for step in steps:
        assert len(step.logprobs) == len(step.emitted)
        out += step.emitted
        logprobs += step.logprobs
        tops += step.top_logprobs
        accepted += [] if step.prefill else [step.accepted]
    return out, logprobs, tops, accepted


@pytest.mark.parametrize("name", ENGINES)
def test_block8_logprobs_equal_block1_and_transformers(engines, transformers_target, name):  # noqa: F811
    engine = engines(name)
    one = SimpleNamespace(token_ids=[], logprobs=[], top_logprobs=[])  # a block-1 run's, from its events
    for event in engine.generate(GenerationRequest(prompt=PROMPT, max_new_tokens=NEW, temperature=0.0, block_size=1,
                                                   stop_ids=[], logprobs=True, top_logprobs=TOP)):
        one.token_ids += event.emitted
        one.logprobs += event.logprobs
        one.top_logprobs += event.top_logprobs
    assert len(one.logprobs) == len(one.top_logprobs) == NEW
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    params = SamplingParams(logprobs=True, top_logprobs=TOP)
    out, logprobs, tops, accepted = collect(_steps(name, engine, ids, one.token_ids, 8, params))
    assert out == one.token_ids and max(accepted) >= 3 and min(accepted) < 7
    np.testing.assert_allclose(logprobs, one.logprobs, atol=1e-3)
    assert [[i for i, _ in row] for row in tops] == [[i for i, _ in row] for row in one.top_logprobs]
    np.testing.assert_allclose([[v for _, v in row] for row in tops], [[v for _, v in row] for row in one.top_logprobs],
                               atol=1e-3)
    want = raw_logprobs(transformers_target, ids, out)
    np.testing.assert_allclose(logprobs, want.gather(1, torch.tensor(out)[:, None])[:, 0].numpy(), atol=1e-3)
    top = torch.topk(want, TOP, dim=-1)
    assert [[i for i, _ in row] for row in tops] == top.indices.tolist()


def _steps(name, engine, ids, reference, block, params, draft=None):
    """The loop's RawSteps with tests.test_penalties' oracle draft (right 4 times in 5)."""
    draft = draft or engine.draft
    if name == "cuda":
        from dflash_tui.engines.cuda import loop

        return loop.speculative_decode(engine.target, draft, ids, block, NEW, loop.Sampler(params, engine.target.device),
                                       cache=engine.target.new_cache(),
                                       draft_cache=CudaOracle(draft, reference, len(ids), q=not params.greedy))
    from dflash_tui.engines.mlx import loop

    return loop.speculative_decode(engine.target, draft, ids, block, NEW, loop.Sampler(params),
                                   cache=engine.target.make_cache(), draft_cache=mlx_oracle(draft, reference, len(ids)))


@pytest.mark.parametrize("name", ENGINES)
def test_sampled_penalized_rejection_steps_report_the_raw_logprob_of_each_emitted_id(
        engines, transformers_target, pairs, tmp_path_factory, name):  # noqa: F811
    engine = engines(name)
    ids = engine.prepare(GenerationRequest(prompt=PROMPT))
    list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=NEW, temperature=0.0, block_size=1,
                                           stop_ids=[], **PENALTIES)))
    greedy = engine.last_summary.token_ids
    draft = None
    if name == "mlx":  # the MLX loop takes the rejection path for a draft with a selector only
        from dflash_tui.engines.checkpoints import DraftInfo
        from dflash_tui.engines.mlx.draft import DFlashDraft
        from tests import tiny_dflash2

        target, _ = pairs("qwen3")
        path = tiny_dflash2.make_dflash2_draft(tmp_path_factory.mktemp("logprobs") / "draft2", target, [0, 2])
        draft = DFlashDraft.load(DraftInfo.read(str(path)), engine.target.dtype)
    params = SamplingParams(temperature=0.05, seed=4, logprobs=True, top_logprobs=TOP, **PENALTIES)
    out, logprobs, tops, accepted = collect(_steps(name, engine, ids, greedy, 8, params, draft))
    assert max(accepted) >= 3 and min(accepted) < 7  # kept, and rejected-then-resampled (every 5th is wrong)
    want = raw_logprobs(transformers_target, ids, out)
    np.testing.assert_allclose(logprobs, want.gather(1, torch.tensor(out)[:, None])[:, 0].numpy(), atol=1e-3)
    assert [[i for i, _ in row] for row in tops] == torch.topk(want, TOP, dim=-1).indices.tolist()


@pytest.mark.parametrize("name", ENGINES)
def test_events_and_summary_carry_them_cut_at_a_stop_id(engines, name):  # noqa: F811
    engine = engines(name)
    list(engine.generate(GenerationRequest(prompt=PROMPT, max_new_tokens=12, temperature=0.0, block_size=4, stop_ids=[])))
    plain = engine.last_summary
    stop = plain.token_ids[6]
    events = list(engine.generate(GenerationRequest(prompt=PROMPT, max_new_tokens=12, temperature=0.0, block_size=4,
                                                    stop_ids=[stop], logprobs=True)))
    summary = engine.last_summary
    assert summary.token_ids == plain.token_ids[: plain.token_ids.index(stop) + 1]
    assert sum(len(e.logprobs) for e in events) == len(summary.token_ids)
    assert all(len(e.logprobs) == len(e.emitted) and e.top_logprobs is None for e in events)
    unasked = list(engine.generate(GenerationRequest(prompt=PROMPT, max_new_tokens=5, temperature=0.0, block_size=4)))
    assert all(e.logprobs is None and e.top_logprobs is None for e in unasked)
    with pytest.raises(Exception, match="top_logprobs"):
        GenerationRequest(prompt=PROMPT, logprobs=True, top_logprobs=21)
