"""Static caches and the graph path of the CUDA engine.

On the CPU: the caches never copy themselves (buffer storage stays put from step to step over a long
answer, and from request to request); the graph path's static functions (fixed shapes, device-side
positions, whole-bucket masked attention, features as explicit outputs) give the eager path's ids and
proposals when run uncaptured, and build nothing new after warm-up. With CUDA: captured graphs in float32
give the eager ids and transformers' float32 ids on the same GPU (TF32 off); bf16 agreement is measured
and printed, not asserted."""

import pytest
import torch

from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine
from dflash_tui.engines.cuda.cache import BucketLayer, bucket, bucket_layers
from dflash_tui.engines.cuda.draft import DraftCache
from dflash_tui.engines.cuda.graphs import StepGraphs, why_eager
from dflash_tui.engines.cuda.loop import Sampler, speculative_decode
from dflash_tui.engines.sampling import SamplingParams
from tests.oracles import run, transformers_greedy

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cpu_engine(pairs, family="qwen3", last_layer=False, **kw):
    target, draft = pairs(family, last_layer)
    return load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                    dtype="float32", **kw))


def storage(cache, draft_cache):
    target = [(layer.k_buf.data_ptr(), layer.v_buf.data_ptr()) for layer in bucket_layers(cache)]
    draft = [(k.data_ptr(), v.data_ptr()) for k, v in zip(draft_cache.k_bufs, draft_cache.v_bufs)]
    return target, draft


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_cache_buffers_keep_their_storage_over_a_long_answer(pairs, family):
    """(Hybrid targets: only the full-attention layers; transformers reassigns the conv states.)"""
    engine = cpu_engine(pairs, family)
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    new, block = 300, 4
    room = len(ids) + new + block
    cache, draft_cache = engine.target.new_cache(room), DraftCache(engine.draft, None, room)
    seen, lengths = set(), []
    steps = speculative_decode(engine.target, engine.draft, ids, block, new, Sampler(SamplingParams(), engine.target.device),
                               cache=cache, draft_cache=draft_cache)
    for _ in steps:
        t, d = storage(cache, draft_cache)
        seen.add((tuple(t), tuple(d)))
        lengths.append(cache.get_seq_length())
    assert len(seen) == 1, "a cache buffer moved during the answer"
    assert lengths[-1] == len(ids) + new - 1 and len(lengths) > 50
    assert all(layer.capacity == bucket(room) for layer in bucket_layers(cache))
    if family == "qwen3_5":
        assert 0 < len(bucket_layers(cache)) < len(cache.layers)


def test_pooled_caches_are_reused_across_requests(pairs):
    engine = cpu_engine(pairs)
    ids = engine.prepare(GenerationRequest(prompt="The quick brown fox"))
    run(engine, prompt_ids=ids, max_new_tokens=40, temperature=0, block_size=8, stop_ids=[])
    before = storage(engine.pool.target_cache(0), engine.pool.draft_cache(None, 0))
    for block in (1, 8, 16):
        run(engine, prompt_ids=ids, max_new_tokens=40, temperature=0, block_size=block, stop_ids=[])
    assert storage(engine.pool.target_cache(0), engine.pool.draft_cache(None, 0)) == before


def test_a_larger_request_moves_to_the_next_bucket(pairs):
    engine = cpu_engine(pairs)
    ids = engine.prepare(GenerationRequest(prompt="The quick brown fox"))
    layer = BucketLayer(4)
    layer.update(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8))
    layer.update(torch.full((1, 2, 2, 8), 2.0), torch.full((1, 2, 2, 8), 2.0))  # past the 4 slots: grows
    assert layer.capacity == bucket(5) and layer.keys.shape[2] == 5 and layer.keys[0, 0, :, 0].tolist() == [1, 1, 1, 2, 2]
    layer.crop(-2)
    assert layer.get_seq_length() == 3
    reference = transformers_greedy(engine.target_info.path, ids, 24)
    # a tiny bucket forces growth in the middle of a request: still lossless
    cache, draft_cache = engine.target.new_cache(1), DraftCache(engine.draft, None, 1)
    for layer in bucket_layers(cache):
        layer.capacity = 8
    out = []
    for step in speculative_decode(engine.target, engine.draft, ids, 4, 24, Sampler(SamplingParams(), engine.target.device),
                                   cache=cache, draft_cache=draft_cache):
        out += step.emitted
    assert out == reference


def full_blocks(steps, block, new):
    """The steps before the last block shrinks: the graph path pads that block to the captured size, so
    the draft, which reads its block both ways, may propose differently there (the ids stay the target's)."""
    out, done = [], 1
    for step in steps[1:]:
        if new - done < block:
            break
        out.append(step)
        done += len(step[2])
    return [steps[0], *out]


def graph_run(engine, graphs, ids, block, new, window=None):
    steps = speculative_decode(engine.target, engine.draft, ids, block, new, Sampler(SamplingParams(), engine.target.device),
                               window, pool=engine.pool, graphs=graphs)
    return [(s.drafted, s.accepted, s.emitted) for s in steps]


@pytest.mark.parametrize("family,last_layer", [("qwen3", False), ("llama", False), ("qwen3", True)])
@pytest.mark.parametrize("window", [None, 5])
def test_static_step_functions_give_the_eager_steps(pairs, family, last_layer, window):
    """The graph path run uncaptured: same proposals, acceptances and ids as eager, every block size;
    after the first request of a block size nothing new is built (the recompile count stays put)."""
    engine = cpu_engine(pairs, family, last_layer, draft_window=window)
    graphs = StepGraphs(engine.target, engine.draft, mode="off")
    for prompt in ("What is 48 + 75?", "Hello world, speculative decoding"):
        ids = engine.prepare(GenerationRequest(prompt=prompt))
        reference = transformers_greedy(engine.target_info.path, ids, 40)
        for block in (1, 2, 4, 8, 16):
            eager = graph_run(engine, None, ids, block, 40, window)
            replays = graphs.replays
            static = graph_run(engine, graphs, ids, block, 40, window)
            assert full_blocks(static, block, 40) == full_blocks(eager, block, 40), f"block {block}, prompt {prompt!r}"
            assert [t for s in static for t in s[2]] == [t for s in eager for t in s[2]] == reference
            assert graphs.replays > replays  # full blocks really ran on the static functions
    built = graphs.captures
    assert built == 9  # verify for 1, 2, 4, 8, 16 and the draft's block pass for 2, 4, 8, 16
    for block in (16, 1, 4):
        graph_run(engine, graphs, ids, block, 40, window)
    assert graphs.captures == built


def test_static_features_are_the_hooked_features(pairs):
    """Context features as explicit outputs (hidden_states) equal the hooks' on the eager path,
    including the last target layer's post-norm value."""
    engine = cpu_engine(pairs, "qwen3", last_layer=True)
    target = engine.target
    ids = torch.tensor([[5, 17, 33, 48, 60, 71]])
    with torch.inference_mode():
        _, hooked = target.forward(ids, 0, target.new_cache(64), last_only=False, capture=True)
        cache = target.new_cache(64)
        target.forward(ids[:, :1], 0, cache, last_only=True, capture=False)  # allocate the buffers
        cache.crop(-1)
        logits, explicit = target.static_forward(ids, torch.arange(6), cache, features=True, reach=64)
    torch.testing.assert_close(explicit, hooked, rtol=1e-5, atol=1e-5)


def test_graphs_fall_back_to_eager_and_say_why(pairs):
    engine = cpu_engine(pairs, cuda_graphs=True)
    assert engine.graphs is None and any("CUDA graphs off" in w for w in engine.warnings)
    summary = run(engine, prompt="Hi", max_new_tokens=8, temperature=0, block_size=4, stop_ids=[])[1]
    assert summary.graphs is False
    cuda_device = torch.device("cuda")
    assert "CUDA device" in why_eager(engine.target, torch.device("cpu"))
    assert why_eager(engine.target, cuda_device) is None
    assert "hybrid" in why_eager(cpu_engine(pairs, "qwen3_5").target, cuda_device)
    assert "MoE" in why_eager(cpu_engine(pairs, "qwen3_moe").target, cuda_device)
    # on the CPU the steps compile with inductor instead, where the target allows it, and say why where not
    hybrid = cpu_engine(pairs, "qwen3_5", compile_steps=True)
    assert hybrid.graphs is None and any(w.startswith("Compiled steps off: hybrid") for w in hybrid.warnings)
    assert why_eager(engine.target, torch.device("cpu"), "inductor") is None


# -- on a GPU ----------------------------------------------------------------------------------------

@pytest.fixture
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def cuda_greedy(target_dir, ids, new, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, device_map={"": "cuda"}).eval()
    out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=new, do_sample=False, eos_token_id=None,
                         pad_token_id=0, min_new_tokens=new)
    return out[0, len(ids):].tolist()


@cuda
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_cuda_graphs_float32_ids_equal_eager_and_transformers(pairs, no_tf32, family):
    target, draft = pairs(family)
    kw = dict(target=str(target), draft=str(draft), engine="cuda", device="cuda", dtype="float32")
    eager = load_engine(EngineConfig(**kw, cuda_graphs=False))
    graphed = load_engine(EngineConfig(**kw, cuda_graphs=True))
    assert graphed.graphs is not None, graphed.warnings
    ids = eager.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    reference = cuda_greedy(target, ids, 40, torch.float32)
    for block in (1, 4, 16):
        a = run(eager, prompt_ids=ids, max_new_tokens=40, temperature=0, block_size=block, stop_ids=[])[1]
        b = run(graphed, prompt_ids=ids, max_new_tokens=40, temperature=0, block_size=block, stop_ids=[])[1]
        assert a.token_ids == b.token_ids == reference, f"block {block}"
        assert b.graphs and not a.graphs
    captured = graphed.graphs.captures
    for block in (1, 4, 16):  # warm: no new capture for a block size and bucket already seen
        run(graphed, prompt_ids=ids, max_new_tokens=40, temperature=0, block_size=block, stop_ids=[])
    assert graphed.graphs.captures == captured


@cuda
def test_cuda_bf16_agreement_is_measured(pairs):
    """bf16: a 16-token verify can round differently from 1-token decoding at near-ties, so the matching
    prefix against transformers bf16 generate is reported, not asserted equal."""
    target, draft = pairs("qwen3")
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cuda",
                                      dtype="bfloat16"))
    ids = engine.prepare(GenerationRequest(prompt="What is 48 + 75?"))
    reference = cuda_greedy(target, ids, 64, torch.bfloat16)
    for block in (1, 16):
        got = run(engine, prompt_ids=ids, max_new_tokens=64, temperature=0, block_size=block, stop_ids=[])[1].token_ids
        match = next((i for i, (a, b) in enumerate(zip(got, reference)) if a != b), len(reference))
        print(f"bf16 block {block}: {match}/{len(reference)} ids match transformers bf16 generate")
        assert len(got) == 64
