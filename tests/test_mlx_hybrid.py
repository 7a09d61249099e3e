"""Hybrid targets (Qwen3.5 / Qwen3.5-MoE: gated delta net + full attention) on the MLX engine.

The rollback after a partial acceptance restores each linear-attention layer's pre-verify conv and
recurrent state and re-runs only its mixer over the kept tokens from the inputs captured in the verify
pass (engines/mlx/target.py, CacheRollback "mixers"). Checked here: greedy ids equal mlx-lm's own greedy
generation for every block size, with and without a draft window; after a verify keeping k of b tokens
every layer's state equals the state of a pass over the kept prefix alone (tolerance 1e-5 absolute and
relative; on mlx[cpu] 0.32 the states came out bitwise equal); an oracle draft that is right 4 times in
5 so blocks are cut mid-way, with the cache invariants checked after every step; and the CUDA and MLX
engines agreeing id for id and step for step on the same float32 checkpoints.
"""

import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine  # noqa: E402 - after the importorskip above
from dflash_tui.engines.checkpoints import TargetInfo  # noqa: E402 - after the importorskip above
from dflash_tui.engines.mlx.loop import Sampler, speculative_decode  # noqa: E402 - after the importorskip above
from dflash_tui.engines.mlx.target import Target  # noqa: E402 - after the importorskip above
from dflash_tui.engines.sampling import SamplingParams  # noqa: E402 - after the importorskip above
from tests.oracles import engine_for, mlx_lm_greedy  # noqa: E402 - after the importorskip above
from tests.test_mlx_engine import OracleDraftCache  # noqa: E402 - after the importorskip above

PROMPTS = ["What is 48 + 75?", "The quick brown fox", "Hello world, speculative decoding"]
BLOCKS = [1, 2, 4, 8, 16]
NEW = 40
PAIRS = [("qwen3_5", False), ("qwen3_5_moe", False), ("qwen3_5", True)]
TOL = dict(atol=1e-5, rtol=1e-5)


def close(a, b) -> bool:
    return a.shape == b.shape and bool(mx.allclose(a, b, **TOL))


@pytest.fixture(scope="module")
def engine_for_pair(pairs):
    built = {}

    def get(family, last_layer=False, window=None):
        key = (family, last_layer, window)
        if key not in built:
            target, draft = pairs(family, last_layer)
            built[key] = engine_for("mlx", target, draft, draft_window=window)
        return built[key]

    return get


@pytest.mark.parametrize("family,last_layer", PAIRS)
def test_hybrid_targets_take_the_mixer_rollback(engine_for_pair, family, last_layer):
    """Lossless ids for these pairs are in tests/test_lossless.py; here: the cheap path is the one used."""
    engine = engine_for_pair(family, last_layer)
    assert engine.target.rollback_for(engine.target.make_cache()).mode == "mixers"


# -- rollback unit tests: states after rollback == states of a pass over the kept prefix ----------------

@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def target(pairs, request):
    path, _ = pairs(request.param)
    return Target(TargetInfo.read(str(path)), "float32", [0, 2])


PROMPT = [5, 17, 33, 48, 60, 71]
BLOCK = [80, 91, 102, 113, 124, 135, 146, 157]


def prefilled(target):
    cache = target.make_cache()
    target.forward(mx.array([PROMPT]), cache, capture=False)
    mx.eval([c.state for c in cache])
    return cache


def assert_same_state(target, got, expected, length):
    for i, (a, b) in enumerate(zip(got, expected)):
        if i in target.mixers:
            conv, state = a.cache
            assert conv.shape[1] == target.mixers[i].conv_kernel_size - 1
            assert close(conv, b.cache[0]), f"layer {i} conv state"
            assert close(state, b.cache[1]), f"layer {i} recurrent state"
        else:
            assert a.offset == b.offset == length, f"layer {i} KV length"
            assert close(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]), f"layer {i} keys"
            assert close(a.values[..., : a.offset, :], b.values[..., : b.offset, :]), f"layer {i} values"


@pytest.mark.parametrize("recompute", [True, False], ids=["mixers", "refeed"])
@pytest.mark.parametrize("keep", [1, 2, 3, 5, 7, 8])
def test_states_after_rollback_equal_states_of_the_kept_prefix(target, keep, recompute, monkeypatch):
    assert sorted(target.mixers) == [0, 1, 2], "the fixture has three linear-attention layers, then attention"
    block = mx.array([BLOCK])
    verified = prefilled(target)
    rollback = target.rollback_for(verified, recompute=recompute)
    assert rollback.mode == ("mixers" if recompute else "refeed")
    rollback.snapshot(len(BLOCK))
    target.forward(block, verified, capture=True)
    with monkeypatch.context() as m:  # the rollback stays lazy: it joins the next step's graph, no sync of its own
        for name in ("eval", "async_eval"):
            m.setattr(mx, name, lambda *a, **k: pytest.fail("the rollback evaluated"))
        rollback.rollback(len(BLOCK), keep, lambda k: target.forward(block[:, :k], verified, capture=False))
    assert not target.mixer_capture.values and not target.mixer_capture.active  # nothing held past the step

    direct = prefilled(target)
    target.forward(block[:, :keep], direct, capture=False)
    mx.eval([c.state for c in verified] + [c.state for c in direct])
    assert_same_state(target, verified, direct, len(PROMPT) + keep)

    # and the next token sees the same model
    nxt = mx.array([[BLOCK[keep - 1] + 1]])
    assert close(target.forward(nxt, verified, capture=False)[0], target.forward(nxt, direct, capture=False)[0])


def test_a_one_token_pass_keeps_nothing(target):
    cache = prefilled(target)
    rollback = target.rollback_for(cache)
    rollback.snapshot(1)
    assert not target.mixer_capture.active
    target.forward(mx.array([[80]]), cache, capture=False)
    rollback.rollback(1, 1, None)
    direct = prefilled(target)
    target.forward(mx.array([[80]]), direct, capture=False)
    assert_same_state(target, cache, direct, len(PROMPT) + 1)


# -- an oracle draft: partial acceptances really happen; invariants after every step --------------------

@pytest.fixture(scope="module")
def reference(pairs, engine_for_pair):
    built = {}

    def get(family):
        if family not in built:
            engine = engine_for_pair(family)
            ids = engine.prepare(GenerationRequest(prompt=PROMPTS[0]))
            built[family] = ids, mlx_lm_greedy(pairs(family)[0], ids, 48)
        return built[family]

    return get


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
@pytest.mark.parametrize("block", [2, 4, 8, 16])
@pytest.mark.parametrize("window", [None, 6])
def test_oracle_draft_cuts_blocks_and_caches_stay_exact(engine_for_pair, reference, family, block, window):
    engine = engine_for_pair(family)
    target = engine.target
    ids, expected = reference(family)
    cache = target.make_cache()
    draft_cache = OracleDraftCache(engine.draft, window, expected, len(ids))
    shadow = target.make_cache()  # fed the committed tokens directly, step by step
    target.forward(mx.array([ids[:-1]]), shadow, capture=False)
    fed = len(ids) - 1
    out, accepted = [], []
    for step in speculative_decode(target, engine.draft, ids, block, len(expected), Sampler(SamplingParams()),
                                   window, cache=cache, draft_cache=draft_cache):
        out += step.emitted
        committed = ids + out
        assert all(c.offset == len(committed) - 1 for i, c in enumerate(cache) if i not in target.mixers)
        assert draft_cache.length == len(committed) - 1
        assert draft_cache.entries() == min(len(committed) - 1, window or len(committed))
        target.forward(mx.array([committed[fed:-1]]), shadow, capture=False)
        fed = len(committed) - 1
        mx.eval([c.state for c in cache] + [c.state for c in shadow])
        assert_same_state(target, cache, shadow, fed)
        if not step.prefill:
            assert step.emitted == step.drafted[: step.accepted] + step.emitted[-1:]
            accepted.append(step.accepted)
    assert out == expected
    cut = [a for a in accepted if a < block - 1]
    assert max(accepted) >= min(3, block - 1) and (block == 2 or any(0 < a for a in cut))


# -- the CUDA and MLX engines on the same checkpoints --------------------------------------------------

@pytest.fixture(scope="module")
def both(pairs):
    pytest.importorskip("torch")
    built = {}

    def get(family):
        if family not in built:
            target, draft = pairs(family)
            built[family] = tuple(load_engine(EngineConfig(target=str(target), draft=str(draft), engine=name,
                                                           dtype="float32")) for name in ("cuda", "mlx"))
        return built[family]

    return get


def steps(engine, ids, block):
    events = list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=32, temperature=0,
                                                    block_size=block, stop_ids=[])))
    return [(e.drafted, e.accepted, e.emitted) for e in events], engine.last_summary.token_ids


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
def test_cuda_and_mlx_agree_step_by_step(both, family):
    cuda, mlx = both(family)
    for prompt in PROMPTS[:2]:
        ids = cuda.prepare(GenerationRequest(prompt=prompt))
        assert ids == mlx.prepare(GenerationRequest(prompt=prompt))
        for block in BLOCKS:
            cuda_steps, cuda_ids = steps(cuda, ids, block)
            mlx_steps, mlx_ids = steps(mlx, ids, block)
            assert mlx_ids == cuda_ids, f"block {block}, prompt {prompt!r}"
            assert mlx_steps == cuda_steps, f"block {block}, prompt {prompt!r}"


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
@pytest.mark.parametrize("block", [4, 16])
def test_cuda_and_mlx_agree_under_partial_acceptance(both, reference, family, block):
    """Both engines with the same oracle draft: the same cuts, the same acceptances, the same ids."""
    torch = pytest.importorskip("torch")
    from dflash_tui.engines.cuda.loop import Sampler as TorchSampler
    from dflash_tui.engines.cuda.loop import speculative_decode as torch_decode
    from tests.test_cuda_engine import OracleDraftCache as TorchOracle

    cuda, mlx = both(family)
    ids, expected = reference(family)
    results = []
    with torch.inference_mode():
        torch_steps = torch_decode(cuda.target, cuda.draft, ids, block, len(expected),
                                   TorchSampler(SamplingParams(), torch.device("cpu")),
                                   draft_cache=TorchOracle(cuda.draft, None, expected, len(ids)))
        results.append([(s.drafted, s.accepted, s.emitted) for s in torch_steps])
    mlx_steps = speculative_decode(mlx.target, mlx.draft, ids, block, len(expected), Sampler(SamplingParams()),
                                   draft_cache=OracleDraftCache(mlx.draft, None, expected, len(ids)))
    results.append([(s.drafted, s.accepted, s.emitted) for s in mlx_steps])
    assert results[0] == results[1]
    assert [t for s in results[1] for t in s[2]] == expected
    assert any(0 < s[1] < block - 1 for s in results[1])


def test_caches_mlx_lm_cannot_recompute_fall_back_to_the_whole_refeed(tmp_path):
    """Gemma-3's sliding layers (RotatingKVCache) take the snapshot + re-feed path."""
    from tests.test_mlx_engine import make_gemma3_target

    target = Target(TargetInfo.read(str(make_gemma3_target(tmp_path / "gemma3"))), "float32", [0, 2])
    assert not target.mixers
    assert target.rollback_for(target.make_cache()).mode == "refeed"
