"""The conversation's caches kept between turns (issue 14), on both engines and every family.

A chat whose turns start from the caches the previous turn left must give exactly the ids of the same
chat with every turn prefilled from scratch (`reuse_cache=False`): at temperature 0 and seeded
temperature > 0, every block size, the block size switched between turns, thinking on and off, a draft
window, hybrid (gated-delta) targets, after a cancelled turn. The fixtures' clear top-2 margins make
identical ids the oracle; where they differ, the message reports the target's margin there (a two-chunk
gated-delta prefill rounds differently from one chunk, about 1e-4 in the logits).
"""

from __future__ import annotations

import pytest

from dflash_tui.engines import GenerationRequest
from tests.oracles import ENGINES, engine_for

QUESTIONS = ["What is 48 + 75?", "And 12 * 3?", "Hello world, again", "Sort 5 3 9 1", "0123456789 = ?"]
NEW = 20
FAMILIES = ["qwen3", "qwen3_moe", "llama", "qwen3_5"]
SCHEDULES = {
    "block1": [1] * 5, "block2": [2] * 5, "block4": [4] * 5, "block8": [8] * 5, "block16": [16] * 5,
    "switched": [1, 16, 2, 8, 4],  # a block-1 turn leaves the draft's cache behind the target's
}


@pytest.fixture(scope="module")
def engines_for(pairs):
    built = {}

    def get(engine, family, window=None):
        key = (engine, family, window)
        if key not in built:
            target, draft = pairs(family)
            built[key] = engine_for(engine, target, draft, draft_window=window)
        return built[key]

    return get


def chat(engine, blocks, reuse, thinking=True, temperature=0.0, seed=0, system=None):
    """A conversation of len(blocks) turns; returns each turn's Summary."""
    engine.new_context()
    messages = [{"role": "system", "content": system}] if system else []
    summaries = []
    for question, block in zip(QUESTIONS, blocks):
        messages.append({"role": "user", "content": question})
        request = GenerationRequest(messages=list(messages), max_new_tokens=NEW, temperature=temperature, seed=seed,
                                    block_size=block, thinking=thinking, reuse_cache=reuse, stop_ids=[])
        list(engine.generate(request))
        summary = engine.last_summary
        summaries.append(summary)
        messages.append({"role": "assistant", "content": summary.text})
    return summaries


def first_difference(engine, prompt_ids, a, b) -> str:
    i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    margin = engine.top2_margin(prompt_ids + a[:i])
    return f"ids differ at {i}: {a[i]} vs {b[i]} (target top-2 margin there: {margin})"


def kept_chat_equals_fresh(engine, blocks, **options) -> list:
    """The chat of `blocks` on the caches kept between turns, and the same chat prefilled fresh each turn:
    the same ids turn by turn, the kept one reusing part of its prompts. Returns the kept chat's Summaries."""
    reused = chat(engine, blocks, reuse=True, **options)
    assert_same_chat(engine, reused, chat(engine, blocks, reuse=False, **options))
    return reused


def assert_same_chat(engine, reused, fresh):
    for turn, (a, b) in enumerate(zip(reused, fresh)):
        assert a.prompt_tokens == b.prompt_tokens
        if a.token_ids != b.token_ids:
            raise AssertionError(f"turn {turn + 1}: " + first_difference(engine, [], a.token_ids, b.token_ids))
        assert a.reused_prompt_tokens + a.prefilled_prompt_tokens == a.prompt_tokens
        assert b.reused_prompt_tokens == 0 and b.prefilled_prompt_tokens == b.prompt_tokens
    assert reused[0].reused_prompt_tokens == 0  # a new context starts empty
    assert sum(s.reused_prompt_tokens for s in reused[1:]) > 0


# every block size on qwen3; the other families at the trained block size and with switched sizes
CASES = [(f, s) for f in FAMILIES for s in SCHEDULES if f == "qwen3" or s in ("block16", "switched")]


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("family,schedule", CASES)
@pytest.mark.parametrize("thinking", [True, False])
def test_reused_chat_equals_fresh_chat(engines_for, engine_name, family, schedule, thinking):
    engine = engines_for(engine_name, family)
    blocks = SCHEDULES[schedule]
    reused = kept_chat_equals_fresh(engine, blocks, thinking=thinking)
    if schedule != "switched":
        # the re-rendered answer diverges inside the last answer (its text is re-tokenized), so at least
        # everything up to the previous assistant header is reused: with thinking on, the whole previous
        # prompt; hybrids restart from the snapshot taken there
        assert all(s.reused_prompt_tokens > 0 for s in reused[1:])
        if thinking:
            assert all(s.reused_prompt_tokens >= prev.prompt_tokens for prev, s in zip(reused, reused[1:]))


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_seeded_sampling_gives_the_same_chat_with_and_without_reuse(engines_for, engine_name, family):
    engine = engines_for(engine_name, family)
    reused = chat(engine, [16, 4, 16], reuse=True, temperature=0.9, seed=7)
    fresh = chat(engine, [16, 4, 16], reuse=False, temperature=0.9, seed=7)
    assert [s.token_ids for s in reused] == [s.token_ids for s in fresh]
    assert sum(s.reused_prompt_tokens for s in reused) > 0


@pytest.mark.parametrize("engine_name", ENGINES)
def test_draft_window_rewinds_to_what_a_fresh_run_reads(engines_for, engine_name):
    """With a window the draft still keeps every context entry, so cropping back to a shorter prefix
    reads exactly the entries a fresh run would: identical drafted ids, not only identical output."""
    engine = engines_for(engine_name, "qwen3", 5)
    engine.new_context()
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    steps = {}
    for reuse in (True, False):
        engine.new_context()
        list(engine.generate(GenerationRequest(messages=messages, max_new_tokens=40, temperature=0, block_size=8,
                                               reuse_cache=True, stop_ids=[])))
        answer = engine.last_summary.text
        follow = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": QUESTIONS[1]}]
        events = list(engine.generate(GenerationRequest(messages=follow, max_new_tokens=NEW, temperature=0,
                                                        block_size=8, reuse_cache=reuse, stop_ids=[])))
        steps[reuse] = [(e.drafted, e.accepted) for e in events]
        assert (engine.last_summary.reused_prompt_tokens > 0) is reuse
    assert steps[True] == steps[False]


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_cancelled_turn_then_a_new_one(engines_for, engine_name, family):
    engine = engines_for(engine_name, family)
    engine.new_context()
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    request = GenerationRequest(messages=list(messages), max_new_tokens=NEW, temperature=0, block_size=4, stop_ids=[])
    events = []
    for event in engine.generate(request):
        events.append(event)
        if len(events) == 2:
            request.cancel.set()
    assert engine.last_summary.finish_reason == "cancelled"
    partial = engine.last_summary.text
    for history in ([{"role": "assistant", "content": partial}], []):  # the partial answer sent back, or not
        follow = messages + history + [{"role": "user", "content": QUESTIONS[1]}]
        ids = {}
        for reuse in (True, False):
            list(engine.generate(GenerationRequest(messages=follow, max_new_tokens=NEW, temperature=0, block_size=4,
                                                   reuse_cache=reuse, stop_ids=[])))
            ids[reuse] = engine.last_summary.token_ids
        assert ids[True] == ids[False]


@pytest.mark.parametrize("engine_name", ENGINES)
def test_new_context_and_changed_system_prompt(engines_for, engine_name):
    engine = engines_for(engine_name, "qwen3")
    first = chat(engine, [16, 16], reuse=True)
    assert first[1].reused_prompt_tokens > 0
    engine.new_context()
    request = GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[0]}], max_new_tokens=4,
                                temperature=0, stop_ids=[], reuse_cache=True)
    list(engine.generate(request))
    assert engine.last_summary.reused_prompt_tokens == 0
    # a different system prompt changes the ids near the start: only that short prefix is shared
    other = chat(engine, [16, 16], reuse=True, system="Answer briefly.")
    plain = chat(engine, [16, 16], reuse=False, system="Answer briefly.")
    assert [s.token_ids for s in other] == [s.token_ids for s in plain]


def test_reuse_is_opt_in(engines_for):
    """Bench, replay and speed comparisons send requests without `reuse_cache`: the whole prompt is
    prefilled however much of it the kept caches hold."""
    engine = engines_for("cuda", "qwen3")
    ids = engine.prepare(GenerationRequest(prompt=QUESTIONS[0]))
    for _ in range(2):
        list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=4, temperature=0)))
        assert engine.last_summary.reused_prompt_tokens == 0
        assert engine.last_summary.prefilled_prompt_tokens == len(ids)


def test_raw_prompt_ids_extend_the_kept_ids(engines_for):
    """Requests given as ids: a prompt that extends the previous prompt and answer reuses all of it."""
    engine = engines_for("cuda", "qwen3")
    engine.new_context()
    ids = engine.prepare(GenerationRequest(prompt=QUESTIONS[0]))
    list(engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=12, temperature=0, stop_ids=[])))
    answer = engine.last_summary.token_ids
    longer = ids + answer + ids
    list(engine.generate(GenerationRequest(prompt_ids=longer, max_new_tokens=12, temperature=0, stop_ids=[],
                                           reuse_cache=True)))
    kept = engine.last_summary
    assert kept.reused_prompt_tokens == len(ids) + len(answer) - 1  # the newest token was never fed
    list(engine.generate(GenerationRequest(prompt_ids=longer, max_new_tokens=12, temperature=0, stop_ids=[],
                                           reuse_cache=False)))
    assert engine.last_summary.token_ids == kept.token_ids


def test_graph_path_static_functions_with_reuse(engines_for):
    """The graph path (its static functions, uncaptured, on the CPU) with kept caches: a capture for a
    new block size starts over; otherwise the kept caches are reused, and the ids never change."""
    from dflash_tui.engines.cuda.graphs import StepGraphs

    engine = engines_for("cuda", "llama")
    engine.graphs = StepGraphs(engine.target, engine.draft, mode="off")
    try:
        reused = chat(engine, [4, 4, 8, 8], reuse=True)
        fresh = chat(engine, [4, 4, 8, 8], reuse=False)
    finally:
        engine.graphs = None
    assert [s.token_ids for s in reused] == [s.token_ids for s in fresh]
    assert reused[1].reused_prompt_tokens > 0 and reused[3].reused_prompt_tokens > 0


def test_process_engine_new_context(pairs):
    from dflash_tui.engines import EngineConfig
    from dflash_tui.engines.process import ProcessEngine

    target, draft = pairs("qwen3")
    engine = ProcessEngine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                        dtype="float32"))
    try:
        reused = chat(engine, [16, 16], reuse=True)
        assert reused[1].reused_prompt_tokens > 0
        engine.new_context()
        list(engine.generate(GenerationRequest(messages=[{"role": "user", "content": QUESTIONS[0]}],
                                               max_new_tokens=2, temperature=0, reuse_cache=True)))
        assert engine.last_summary.reused_prompt_tokens == 0
    finally:
        engine.close()


def test_chat_reuses_caches_and_a_full_context_drops_to_three_quarters(engines_for):
    """The chat controller opts in to the kept caches; when the history outgrows the context (512
    positions on the tiny target) the oldest turns go at once down to about 75%, so the following turns
    keep a stable prefix and reuse it again."""
    from dflash_tui.core.conversation import FULL_CONTEXT_KEEP, ChatSettings, Conversation

    engine = engines_for("cuda", "qwen3")
    engine.new_context()
    conv = Conversation(engine, ChatSettings(max_new_tokens=24, temperature=0.0, block_size=8), record=False)
    limit = engine.target_info.max_positions
    dropped_at, dropped = None, 0
    for i in range(40):
        active = conv.begin(QUESTIONS[i % len(QUESTIONS)] + f" ({i})")
        list(conv.stream(active))
        summary = engine.last_summary
        if dropped_at is None and conv.dropped:
            dropped_at, dropped = i, conv.dropped
            assert summary.prompt_tokens + 24 <= int(limit * FULL_CONTEXT_KEEP)
            assert summary.reused_prompt_tokens < summary.prompt_tokens // 2  # the prefix changed: rebuilt
        elif i > 0:
            assert summary.reused_prompt_tokens > 0, f"turn {i + 1}"
        if dropped_at is not None and i > dropped_at:
            assert conv.dropped == dropped  # the next turn keeps the new prefix, and reuses it
            break
    assert dropped_at is not None and dropped > 1


@pytest.mark.asyncio
async def test_tui_shows_reused_and_prefilled_and_new_context_clears(engines_for, pairs, tmp_path, data_dir):
    pytest.importorskip("textual")
    from dflash_tui.tui.widgets import StatsPanel
    from tests.tiny import write_profile
    from tests.tui_helpers import SIZE, make_app, ready, send

    engine = engines_for("cuda", "qwen3")
    engine.new_context()
    app = make_app(write_profile(tmp_path / "tiny.toml", *pairs("qwen3"), max_new_tokens=12), engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "What is 48 + 75?")
        second = await send(pilot, "And 12 * 3?")
        summary = second.turn.summary
        assert summary.reused_prompt_tokens > 0
        stats = app._last_stats
        assert (stats.reused_tokens, stats.prefilled_tokens) == (summary.reused_prompt_tokens,
                                                                 summary.prefilled_prompt_tokens)
        panel = str(app.screen.query_one(StatsPanel).render())
        assert f"prompt {summary.reused_prompt_tokens} reused · {summary.prefilled_prompt_tokens} prefilled" in panel
        await pilot.press("ctrl+l")
        third = await send(pilot, "Sort 5 3 9 1")
        assert third.turn.summary.reused_prompt_tokens == 0
        assert third.turn.summary.prefilled_prompt_tokens == third.turn.summary.prompt_tokens
