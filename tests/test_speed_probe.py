"""The block-1 speed probe (issue 13): `measure_block1()` times single-token target steps on top of the
caches a chat keeps and rolls them back. On both engines and every family the lossless tests cover: the
probe reports the kept context length, and the chat that follows is exactly the chat without probes
(same ids, same reused prefix), greedy and seeded. Through the engine process too; None with nothing
kept and on the remote engine. Timings are only checked to be positive."""

from __future__ import annotations

import pytest

from dflash_tui.engines import Block1Probe, EngineConfig, GenerationRequest
from tests import test_turn_cache
from tests.oracles import ENGINES
from tests.test_turn_cache import FAMILIES, NEW, QUESTIONS, chat

engines_for = test_turn_cache.engines_for  # the same module-scoped fixture: engines on the tiny pairs

BLOCKS = [16, 1, 4]  # a block-1 turn leaves the draft's cache behind the target's


def chat_with_probes(engine, blocks, temperature=0.0, seed=0):
    """`chat` (reuse on, thinking on) with a probe after every turn; returns (summaries, probes)."""
    engine.new_context()
    assert engine.measure_block1() is None  # nothing kept yet
    messages, summaries, probes = [], [], []
    for question, block in zip(QUESTIONS, blocks):
        messages.append({"role": "user", "content": question})
        request = GenerationRequest(messages=list(messages), max_new_tokens=NEW, temperature=temperature, seed=seed,
                                    block_size=block, reuse_cache=True, stop_ids=[])
        list(engine.generate(request))
        summaries.append(engine.last_summary)
        probes.append(engine.measure_block1())
        messages.append({"role": "assistant", "content": engine.last_summary.text})
    return summaries, probes


def assert_probed_chat_is_unchanged(probed, plain, probes):
    for turn, (a, b, probe) in enumerate(zip(probed, plain, probes)):
        assert a.token_ids == b.token_ids, f"turn {turn + 1}: the probe changed the ids"
        assert a.reused_prompt_tokens == b.reused_prompt_tokens, f"turn {turn + 1}: the probe changed the kept prefix"
        assert isinstance(probe, Block1Probe)
        assert probe.context_tokens == a.prompt_tokens + a.generated_tokens - 1  # the newest token is never fed
        assert probe.seconds_per_token > 0 and probe.steps == 4


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.9, 7)], ids=["greedy", "seeded"])
def test_probe_measures_the_kept_context_and_leaves_the_chat_unchanged(engines_for, engine_name, family, temperature,
                                                                        seed):
    engine = engines_for(engine_name, family)
    probed, probes = chat_with_probes(engine, BLOCKS, temperature, seed)
    plain = chat(engine, BLOCKS, reuse=True, temperature=temperature, seed=seed)
    assert_probed_chat_is_unchanged(probed, plain, probes)
    assert all(s.reused_prompt_tokens > 0 for s in probed[1:])
    engine.new_context()
    assert engine.measure_block1() is None


def kept_state(engine) -> list:
    """The kept caches as plain values: each attention layer's length, each linear-attention state and count."""
    import numpy as np

    if engine.name == "cuda":
        from dflash_tui.engines.cuda.cache import bucket_layers, linear_states

        cache = engine.turn.cache
        states = [t.numpy().copy() if t is not None and hasattr(t, "numpy") else t  # (a linear layer's count)
                  for kept in linear_states(cache).values() for t in kept]
        return [layer.length for layer in bucket_layers(cache)] + states
    from mlx_lm.models.cache import ArraysCache

    values = []
    for c in engine.turn.cache:
        values += [np.array(a) for a in c.cache] if isinstance(c, ArraysCache) else [c.offset]
    return values


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("family", FAMILIES)
def test_probe_leaves_the_kept_caches_exactly_as_they_were(engines_for, engine_name, family):
    """Compared value for value, then used whole: a prompt that extends the kept ids resumes from the
    live state (a hybrid's linear-attention states at the end of the answer, not a snapshot)."""
    import numpy as np

    engine = engines_for(engine_name, family)
    engine.new_context()
    ids = engine.prepare(GenerationRequest(prompt=QUESTIONS[0]))
    list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=12, temperature=0, stop_ids=[])))
    answer = engine.last_summary.token_ids
    before = kept_state(engine)
    assert engine.measure_block1().context_tokens == len(ids) + len(answer) - 1
    after = kept_state(engine)
    assert len(after) == len(before) and all(np.array_equal(a, b) for a, b in zip(after, before))
    longer = ids + answer + ids
    runs = {}
    for reuse in (True, False):
        list(engine.generate(GenerationRequest(prompt_ids=longer, max_new_tokens=12, temperature=0, stop_ids=[],
                                               reuse_cache=reuse)))
        runs[reuse] = engine.last_summary
    assert runs[True].reused_prompt_tokens == len(ids) + len(answer) - 1
    assert runs[True].token_ids == runs[False].token_ids


def test_probe_replays_the_block1_graph_when_one_is_built_for_the_kept_caches(engines_for):
    """The graph path (its static functions, uncaptured, on the CPU): after a block-1 turn the block-1
    step exists for the kept buffers, so the probe replays it instead of running eager."""
    from dflash_tui.engines.cuda.graphs import StepGraphs

    engine = engines_for("cuda", "llama")
    engine.graphs = StepGraphs(engine.target, engine.draft, mode="off")
    try:
        engine.new_context()
        list(engine.generate(GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[0]}], max_new_tokens=NEW,
                                               temperature=0, block_size=1, reuse_cache=True, stop_ids=[])))
        replays = engine.graphs.replays
        assert engine.measure_block1(steps=3).steps == 3
        assert engine.graphs.replays == replays + 4  # one warm-up and three timed steps
        probed, probes = chat_with_probes(engine, [4, 1, 4])  # the block-1 step outlives the block-4 capture
        plain = chat(engine, [4, 1, 4], reuse=True)
    finally:
        engine.graphs = None
    assert_probed_chat_is_unchanged(probed, plain, probes)
    assert all(s.reused_prompt_tokens > 0 for s in probed[1:])


def test_an_interrupted_probe_leaves_nothing_to_reuse(engines_for, monkeypatch):
    engine = engines_for("cuda", "qwen3")
    engine.new_context()
    request = GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[0]}], max_new_tokens=NEW, temperature=0,
                                reuse_cache=True, stop_ids=[])
    list(engine.generate(request))
    with monkeypatch.context() as patch:
        patch.setattr(engine.target, "forward", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("out of memory")))
        with pytest.raises(RuntimeError, match="out of memory"):
            engine.measure_block1()
    assert engine.measure_block1() is None
    list(engine.generate(request))
    assert engine.last_summary.reused_prompt_tokens == 0


def test_probe_needs_a_timed_step(engines_for):
    engine = engines_for("cuda", "qwen3")
    chat(engine, [16], reuse=True)
    with pytest.raises(ValueError, match="at least one timed step"):
        engine.measure_block1(steps=0)
    assert engine.measure_block1(steps=1).steps == 1  # the refused call changed nothing


def test_probe_through_the_engine_process(pairs, engines_for):
    from dflash_tui.engines.process import ProcessEngine

    target, draft = pairs("qwen3_5")
    engine = ProcessEngine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                        dtype="float32"))
    try:
        probed, probes = chat_with_probes(engine, BLOCKS)
        assert engine.measure_block1(steps=2).steps == 2
        # The child decodes ahead of the events it has sent, so how many arrive after the cancel depends on
        # the machine's load (the in-process bound is test_engine_contract's); a long answer cut short is not.
        cancel = GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[2]}], max_new_tokens=10 * NEW,
                                   temperature=0, block_size=4, reuse_cache=True, stop_ids=[])
        for _ in engine.generate(cancel):  # a probe before it does not get in the way of cancelling
            cancel.cancel.set()
        summary = engine.last_summary
        assert summary.finish_reason == "cancelled" and summary.generated_tokens < 10 * NEW
    finally:
        engine.close()
    plain = chat(engines_for("cuda", "qwen3_5"), BLOCKS, reuse=True)
    assert_probed_chat_is_unchanged(probed, plain, probes)
    assert all(s.reused_prompt_tokens > 0 for s in probed[1:])


def test_remote_engine_never_measures(pairs, tmp_path):
    """A server keeps its own caches; the remote engine has nothing to time (a real `dflash serve`)."""
    serve = pytest.importorskip("tests.test_serve")
    from dflash_tui.engines import load_engine
    from tests import tiny

    profile = tiny.write_profile(tmp_path / "tiny.toml", *pairs("qwen3"), max_new_tokens=8)
    server = serve.Server(profile, log=tmp_path / "serve.log").ready()
    try:
        remote = load_engine(EngineConfig(target="served", engine="remote", url=server.base))
        assert remote.measure_block1() is None
        list(remote.generate(GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[0]}], max_new_tokens=8,
                                               temperature=0, reuse_cache=True)))
        assert remote.measure_block1() is None
        remote.close()
    finally:
        server.close()
