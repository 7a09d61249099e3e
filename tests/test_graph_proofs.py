"""The CUDA graph path proven on the CPU (no GPU here): what a captured step may not do shows up here.

- Traced once and replayed (`StepGraphs(mode="trace")`: the two warm-up passes a capture makes, then
  make_fx, then the trace replayed): a multi-turn chat at T = 0 and T > 0, across bucket changes, gives
  the eager ids. A positive control whose step reads a per-step Python value (which a trace, like a CUDA
  graph, freezes) fails that check, while the uncaptured static functions alone cannot see it.
- Compiled with `torch.compile(fullgraph=True)` on the eager backend: one compile per (bucket, block
  size), then zero recompiles over the same chat under `fail_on_recompile`.
- Compiled by inductor (`StepGraphs(mode="inductor")`, the CPU's fast path): a chat that switches block sizes
  gives the eager ids at T = 0 and seeded T > 0.
- The profiler counts host syncs: exactly one per loop step (`dflash::host_sync`), at T = 0 and at T > 0,
  and no `aten::_local_scalar_dense` anywhere (torch.multinomial would add two per sampled step).
- A capture that fails after its warm-up passes (which overwrite the kept caches) during a reused turn
  still gives the eager ids; load-time captures cover the profile's request; every step of an answer
  replays, a shrunk last block padded to the captured size.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from dflash_tui.engines import GenerationRequest
from dflash_tui.engines.cuda import cache as cache_module
from dflash_tui.engines.cuda.cache import TIER, bucket_layers, tier
from dflash_tui.engines.cuda.graphs import StepGraphs, capture_for_request, why_eager
from dflash_tui.engines.cuda.loop import HOST_SYNC

QUESTIONS = ["What is 48 + 75?", "And 12 * 3?", "Hello world, again", "Sort 5 3 9 1"]
NEW = 20
SMALL_BUCKET = 64  # chats cross two bucket boundaries on the tiny target


@pytest.fixture
def small_buckets(monkeypatch, engine):
    monkeypatch.setattr(cache_module, "BUCKET", SMALL_BUCKET)
    engine.pool = cache_module.CachePool(engine.target, engine.draft)  # fresh buffers at the small size
    yield
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    engine.new_context()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own steps: dynamo keeps compiled entries per code object, and every StepGraphs'
    step functions share theirs, so an entry one test compiled (inductor) would serve the next (a counted compile)."""
    yield
    torch._dynamo.reset()


@contextlib.contextmanager
def on(engine, graphs):
    engine.graphs = graphs
    try:
        yield graphs
    finally:
        engine.graphs = None


def chat(engine, blocks, temperature=0.0, seed=3, new=NEW, fresh=True):
    """One conversation, each turn starting from the caches the previous one left; every turn's ids.
    `fresh`: on new pooled caches, so that the chat grows them bucket by bucket."""
    engine.new_context()
    if fresh:
        engine.pool = cache_module.CachePool(engine.target, engine.draft)
    messages, ids = [], []
    for question, block in zip(QUESTIONS, blocks):
        messages.append({"role": "user", "content": question})
        request = GenerationRequest(messages=list(messages), max_new_tokens=new, temperature=temperature, seed=seed,
                                    block_size=block, reuse_cache=True, stop_ids=[])
        list(engine.generate(request))
        ids.append(engine.last_summary.token_ids)
        messages.append({"role": "assistant", "content": engine.last_summary.text})
    return ids


def assert_graph_chat_is_eager(engine, graphs, blocks, temperature):
    eager = chat(engine, blocks, temperature)
    with on(engine, graphs):
        graphed = chat(engine, blocks, temperature)
    assert graphed == eager


SCHEDULE = [4, 4, 1, 16]  # a block size switched mid-chat, block 1, and the context past two buckets


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_traced_once_and_replayed_a_chat_gives_the_eager_ids(engine, small_buckets, temperature):
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    assert_graph_chat_is_eager(engine, graphs, SCHEDULE, temperature)
    assert graphs.replays > 0 and graphs.captures == 7  # block 4 at two buckets, then block 1 and block 16


class LeakyGraphs(StepGraphs):
    """A deliberately broken verify step: its positions come from a Python int read when it runs (the live
    length), not from the device buffer. Eagerly that is right; captured, the value is frozen."""

    def _verify_fn(self, b, reach):
        s = self._static_for(b)

        def verify():
            positions = torch.arange(b) + bucket_layers(self.cache)[0].length
            logits, features = self.target.static_forward(s["block"], positions, self.cache, features=b > 1,
                                                          reach=reach)
            if b > 1:
                self.draft_cache.write_static(features, positions)
            return logits

        return verify


def test_a_python_value_leaking_into_a_step_fails_the_replay_proof(engine, small_buckets):
    blocks = [4, 4]
    assert_graph_chat_is_eager(engine, LeakyGraphs(engine.target, engine.draft, mode="off"), blocks, 0.0)  # unseen
    with pytest.raises(AssertionError):
        assert_graph_chat_is_eager(engine, LeakyGraphs(engine.target, engine.draft, mode="trace"), blocks, 0.0)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_steps_compiled_by_inductor_give_the_eager_ids(engine, temperature):
    """Short turns on the default buckets: one tier, so three compiled step functions (block 4's draft and
    verify, block 1's verify), each compiled once and replayed from then on."""
    assert why_eager(engine.target, torch.device("cpu"), "inductor") is None
    graphs = StepGraphs(engine.target, engine.draft, mode="inductor")
    assert_graph_chat_is_eager(engine, graphs, [4, 1, 4], temperature)
    assert graphs.captures == 3 and graphs.replays > 0 and graphs.failed is None
    if temperature == 0.0:  # the thread count changed between requests (inductor's code is built for one)
        threads = torch.get_num_threads()
        torch.set_num_threads(threads + 1)
        try:
            with on(engine, graphs):
                replays, captures = graphs.replays, graphs.captures
                again = chat(engine, [4], fresh=False)  # on the caches the steps were compiled for
            assert graphs.replays > replays and graphs.captures == captures
        finally:
            torch.set_num_threads(threads)
        assert again == chat(engine, [4])


def test_compiled_fullgraph_once_per_bucket_and_block_then_never_again(engine, small_buckets):
    graphs = StepGraphs(engine.target, engine.draft, mode="compile")
    blocks = [4, 4, 16]
    eager = chat(engine, blocks)
    with on(engine, graphs):
        first = chat(engine, blocks)
        compiles = graphs.compiles
        assert compiles == graphs.captures  # one compile per step function built, no graph break (fullgraph)
        with torch.compiler.set_stance("fail_on_recompile"):
            again = chat(engine, blocks, fresh=False)
    assert first == again == eager and graphs.compiles == compiles


def sync_counts(engine, graphs, temperature):
    from torch.profiler import ProfilerActivity, profile

    engine.new_context()
    request = GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[0]}], max_new_tokens=NEW,
                                temperature=temperature, seed=1, block_size=4, stop_ids=[])
    with on(engine, graphs), profile(activities=[ProfilerActivity.CPU]) as prof:
        steps = len(list(engine.generate(request)))
    names = [e.name for e in prof.events()]
    return steps, names.count(HOST_SYNC), names.count("aten::_local_scalar_dense")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_one_host_sync_per_step_and_none_hidden(engine, small_buckets, temperature):
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    with on(engine, graphs):
        chat(engine, [4])  # captured before the profiled request
    steps, syncs, hidden = sync_counts(engine, graphs, temperature)
    assert syncs == steps  # the prefill's token and one per verify step
    assert hidden == 0


def test_the_sync_count_sees_a_hidden_sync(engine, small_buckets):
    """The counter's positive control: torch.multinomial checks its input with .item()."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.multinomial(torch.ones(1, 8), 1)
    assert [e.name for e in prof.events()].count("aten::_local_scalar_dense") > 0


class FailsAfterWarmUp(StepGraphs):
    """A capture that runs its warm-up passes over the live caches, then fails (as a CUDA capture can)."""

    def _build(self, kind, b, fn):
        if (kind, b) == ("verify", 16):  # its warm-up writes the target's K/V at positions 0..15
            self.captures += 1
            self._static_for(b)["positions"].copy_(self._static_for(b)["arange"])
            fn()
            fn()
            raise RuntimeError("capture failed")
        super()._build(kind, b, fn)


def test_a_failed_capture_during_a_reused_turn_gives_the_eager_ids(engine):
    blocks = [4, 16, 16]  # turn 2 reuses turn 1's caches and needs a new capture, which fails
    eager = chat(engine, blocks)
    graphs = FailsAfterWarmUp(engine.target, engine.draft, mode="trace")
    with on(engine, graphs):
        graphed = chat(engine, blocks)
    assert graphs.failed and "capture failed" in graphs.failed
    assert graphed == eager
    engine.new_context()


@pytest.fixture
def short_requests(monkeypatch):
    """The profile's request made short (64 prompt tokens): fewer tiers to trace, the same rule."""
    from dflash_tui.engines.cuda import graphs

    monkeypatch.setattr(graphs, "PROMPT_ROOM", 64)
    return 64


def test_load_time_captures_cover_the_profiles_request(engine, short_requests):
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    said: list[str] = []
    assert capture_for_request(graphs, engine.pool, 16, NEW, progress=said.append)
    assert said == ["capturing CUDA graphs for block 1 (1 of 2)", "capturing CUDA graphs for block 16 (2 of 2)"]
    assert capture_for_request(graphs, engine.pool, 16, NEW, progress=said.append) and len(said) == 2  # nothing new
    built = graphs.captures
    tiers = len(range(TIER, tier(short_requests + NEW + 16, bucket_layers(engine.pool.target_cache(0))[0].capacity) + 1, TIER))
    assert built == 3 * tiers  # per tier: block 1's verify, block 16's draft and verify
    # the bucket a request of the longest prompt would ask for
    assert all(layer.capacity >= cache_module.bucket(short_requests + NEW + 16) for layer in bucket_layers(engine.pool.target_cache(0)))
    with on(engine, graphs):
        for block in (16, 1):
            list(engine.generate(GenerationRequest(prompt="What is 48 + 75?", max_new_tokens=NEW, temperature=0,
                                                   block_size=block, stop_ids=[])))
    assert graphs.captures == built
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    engine.new_context()


def test_every_step_replays_a_shrunk_last_block_included(engine):
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    with on(engine, graphs):
        chat(engine, [16])
        replays = graphs.replays
        events = list(engine.generate(GenerationRequest(prompt="Hello", max_new_tokens=NEW, temperature=0,
                                                        block_size=16, stop_ids=[])))
    assert graphs.replays - replays == len(events) - 1  # every verify step, none eager
    assert engine.last_summary.generated_tokens == NEW and engine.last_summary.graphs
    engine.new_context()


def test_a_step_attends_over_at_most_one_tier_past_the_live_context(engine, monkeypatch):
    """A recorder of the attention calls of every graph step (the static functions run uncaptured, with
    the shapes a capture fixes): target and draft read the caches up to the step's tier, never the bucket."""
    from transformers import AttentionInterface

    from dflash_tui.engines.cuda import attention, draft

    monkeypatch.setattr(cache_module, "BUCKET", 256)
    monkeypatch.setattr(cache_module, "TIER", 32)
    monkeypatch.setattr("dflash_tui.engines.cuda.graphs.TIER", 32)
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    seen = []  # (who, attended, live)

    def target_attention(module, query, key, value, attention_mask, **kwargs):
        layer = bucket_layers(engine.turn.cache)[0]
        if layer.write_at is not None:
            seen.append(("target", key.shape[2], layer.length + query.shape[2]))
        return attention.attention_forward(module, query, key, value, attention_mask, **kwargs)

    def draft_attention(q, k, v, mask, scale=None):
        if mask is not None and mask.dtype == torch.bool and engine.pool._draft_cache is not None:
            seen.append(("draft", k.shape[2], engine.pool._draft_cache.length + q.shape[2]))
        return attention.packed_gqa(q, k, v, mask, scale)

    monkeypatch.setitem(AttentionInterface._global_mapping, attention.NAME, target_attention)
    monkeypatch.setattr(draft, "packed_gqa", draft_attention)
    with on(engine, StepGraphs(engine.target, engine.draft, mode="off")):
        chat(engine, [4, 16, 4], fresh=False)
    engine.pool = cache_module.CachePool(engine.target, engine.draft)
    engine.new_context()
    assert {who for who, _, _ in seen} == {"target", "draft"}
    assert all(live <= attended < live + 32 for _, attended, live in seen), seen
    assert max(live for _, _, live in seen) > 64  # the context grew past two tiers
    assert min(attended for _, attended, _ in seen) < 128  # short contexts never paid for the 256 bucket


def converse(engine, prepared: bool):
    """Two chat turns, the block size changed between them (block 4, then 8), as the TUI's block key does."""
    from dflash_tui.core.conversation import ChatSettings, Conversation

    engine.new_context()
    conv = Conversation(engine, ChatSettings(max_new_tokens=NEW, temperature=0.0, block_size=4), record=False)
    conv.reuse_cache = True
    list(conv.stream(conv.begin(QUESTIONS[0])))
    conv.set_block(8)
    did = conv.prepare_steps() if prepared else None
    captured = getattr(engine.graphs, "captures", None)
    list(conv.stream(conv.begin(QUESTIONS[1])))
    return conv, did, captured


def test_a_new_block_size_is_captured_between_turns_not_when_sent(engine, short_requests):
    """After the block key the idle chat captures what the new size needs (the TUI does it in a worker),
    so the next turn builds nothing, and its ids are the eager ones."""
    eager, _, _ = converse(engine, prepared=False)
    graphs = StepGraphs(engine.target, engine.draft, mode="trace")
    with on(engine, graphs):
        conv, did, captured = converse(engine, prepared=True)
        assert did and not conv.prepare_steps()  # nothing left to capture for block 8
    assert graphs.captures == captured  # the second turn captured nothing
    assert [t.summary.token_ids for t in conv.turns] == [t.summary.token_ids for t in eager.turns]
    engine.new_context()


def test_steps_compiled_in_the_background_take_over_between_answers(pair, monkeypatch):
    """compile_steps="background" (engines/cuda/background.py): the first answer runs eager and starts the
    compile; an answer asked for while it compiles is served (eager, between two compiled functions); once it
    is done the next answer replays the compiled steps; every answer has the eager ids. (Room for short prompts
    only: one tier, the three step functions the test above compiles, so inductor's cache serves them.)"""
    from dflash_tui.engines import EngineConfig, load_engine
    from dflash_tui.engines.cuda import graphs as graphs_module

    monkeypatch.setattr(graphs_module, "PROMPT_ROOM", TIER - NEW - 4)

    target, draft = pair
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                      dtype="float32", block_size=4, max_new_tokens=NEW, compile_steps="background"))
    assert engine.graphs is None and "background" in engine.graphs_note
    request = GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[0]}], max_new_tokens=NEW,
                                temperature=0.0, block_size=4, stop_ids=[])

    def answer():
        engine.new_context()
        ids = [t for e in engine.generate(request) for t in e.emitted]
        return ids, engine.last_summary.graphs

    first, replayed = answer()
    background = engine._background
    assert not replayed and background.started  # the compile starts after the first answer
    during, replayed = answer()
    # eager while the compile runs; compiled only if it had ended before this answer began and was adopted
    assert during == first and bool(replayed) == (engine._background is None)
    assert background.wait(timeout=900)  # an event: the compile thread ended
    after, replayed = answer()
    assert after == first and replayed is True and engine.graphs is not None
    assert engine.graphs.captures == 3 and engine.graphs.replays > 0 and engine.graphs_note.startswith("compiled steps")
    engine.close()
