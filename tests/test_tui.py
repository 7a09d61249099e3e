"""The Textual app, driven by the pilot on the real CUDA engine (on the CPU) with a random tiny pair.

A random pair writes gibberish, which is all the UI needs. Snapshots are taken before any generation
(no timings on screen) at fixed sizes, on an engine forced to the CPU so every machine draws the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import waiting

pytest.importorskip("textual")
pytest.importorskip("torch")

from dflash_tui.engines.events import StepEvent  # noqa: E402 - after the importorskip above
from tests.tiny import write_profile  # noqa: E402 - after the importorskip above
from tests.tui_helpers import SIZE, make_app, ready, send, session_lines, steady_cursor  # noqa: E402 - after the importorskip above

# -- pilot tests -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_prompt_streams_coloured_text_and_updates_stats(profile, data_dir):
    """The real load path (worker), then a turn: text coloured by origin, stats moving, session saved."""
    from dflash_tui.tui.widgets import AnswerView, StatsPanel

    app = make_app(profile)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.load_error is None
        active = await send(pilot, "What is 48 + 75?")
        answer = app.query(AnswerView).last()
        assert answer.status == "completed"
        origins = {kind for _, kind in answer.segments}
        assert "target" in origins and origins <= {"draft", "target", "ghost"}
        colours = {span.style.color for span in answer.answer_rich.spans}  # Markdown may add bold, italic, underline
        assert colours and colours <= {answer.styles_by_origin["draft"].color, answer.styles_by_origin["target"].color}
        stats = app._last_stats
        assert stats.tokens == active.turn.summary.generated_tokens == 48
        assert stats.tokens_per_s > 0 and stats.tau >= 1.0 and sum(stats.histogram) > 0
        panel = str(app.screen.query_one(StatsPanel).render())
        assert "tok/s" in panel and "tau" in panel and "accepted draft" in panel
        assert "est." not in panel and "est." not in str(app.screen.query_one("#stats-line").render())  # measured or "–"
        assert 1 <= app.flushes <= len(active.steps) + 1  # batches from the flush timer, not one per event
        # up recalls the last prompt
        await pilot.press("up")
        assert app.screen.query_one("#prompt").text == "What is 48 + 75?"
    lines = session_lines(app)
    assert lines[0]["type"] == "header" and lines[1]["status"] == "completed"
    assert lines[1]["emitted_ids"] == active.emitted and lines[1]["prompt_ids"] == active.prompt_ids


@pytest.mark.asyncio
async def test_ctrl_t_changes_the_template_sent(profile, engine, data_dir):
    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.conversation.settings.thinking is True
        first = await send(pilot, "hi")
        await pilot.press("ctrl+t")
        assert app.conversation.settings.thinking is False
        assert "thinking OFF" in str(app.screen.query_one("#header-state").render())
        second = await send(pilot, "hi again")
    tok = engine.tokenizer
    assert first.request.thinking is True and second.request.thinking is False
    # the chat template really received enable_thinking: the empty think block is in the prompt ids
    def generation_prompt(ids):
        return tok.decode(ids).rsplit("<|im_start|>assistant", 1)[1].strip()

    assert generation_prompt(first.prompt_ids) == ""
    assert generation_prompt(second.prompt_ids) == "<think>\n\n</think>"
    assert engine.prepare(second.request) == second.prompt_ids
    records = session_lines(app)
    assert [r["settings"]["thinking"] for r in records[1:]] == [True, False]


@pytest.mark.asyncio
async def test_escape_cancels_and_the_partial_turn_is_recorded(tmp_path, pair, process_engine, data_dir):
    """As `dflash chat` runs: the engine decodes in its own process, so keys are handled while it streams."""
    profile = write_profile(tmp_path / "long.toml", *pair, max_new_tokens=450)
    app = make_app(profile, process_engine, block_size=1)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        # escape right behind enter (keys are handled while the engine process streams); the engine
        # stops at its next step, so the answer is cut after at least its first token
        await pilot.press(*"tell me a long story", "enter", "escape")
        await waiting.until(pilot, lambda: app.turns_done == 1)
        await pilot.pause()
        active = app.finished[-1]
        assert active.turn.status == "cancelled"
        assert 1 <= len(active.emitted) < 440
        assert app.conversation.turns[-1].cancelled  # it stays in the history, marked
        footer = str(app.query("AnswerView").last().query_one(".answer-footer").render())
        assert "cancelled" in footer
        # the next turn does not resend it: a stopped answer is not one the model gave (docs/design.md)
        nxt = app.conversation.begin("go on")
        assert [m["content"] for m in nxt.messages] == ["go on"]
    record = session_lines(app)[-1]
    assert record["status"] == "cancelled" and record["emitted_ids"] == active.emitted
    assert record["summary"]["finish_reason"] == "cancelled"


@pytest.mark.asyncio
async def test_block_size_change_takes_effect_on_the_next_turn(profile, engine, data_dir):
    app = make_app(profile, engine, block_size=4)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"one", "enter", "f7")  # f7 (block size) once the first turn is under way
        assert app.conversation.settings.block_size == 8
        await waiting.until(pilot, lambda: app.turns_done == 1)
        second = await send(pilot, "two")
        first = app.finished[0]
        assert "block 8" in str(app.screen.query_one("#header-state").render())
    assert first.request.block_size == 4 and first.turn.summary.block_size == 4
    # blocks of 4 (3 drafted ids; the last blocks shrink near max_new_tokens)
    assert max(len(step["drafted"]) for step in first.steps) == 3
    assert second.request.block_size == 8 and second.turn.summary.block_size == 8
    assert max(len(step["drafted"]) for step in second.steps) == 7


@pytest.mark.asyncio
async def test_ghosts_toggle_help_and_replay(profile, engine, data_dir):
    """ctrl+g shows the rejected proposals; f1 and ctrl+r open their screens (f2 is test_tui_chat's)."""
    from dflash_tui.tui.screens import HelpScreen, ReplayScreen
    from dflash_tui.tui.widgets import AnswerView

    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "ghosts please")
        answer = app.query(AnswerView).last()
        if not any(kind == "ghost" for _, kind in answer.segments):
            pytest.skip("this random pair accepted every drafted token")
        def ghost_spans():
            return [s for s in answer.answer_rich.spans if str(s.style) == str(answer.styles_by_origin["ghost"])]
        assert not ghost_spans() and app.ghosts is False
        await pilot.press("ctrl+g")
        assert app.ghosts and ghost_spans()
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "ctrl+r")
        assert isinstance(app.screen, ReplayScreen)


@pytest.mark.asyncio
async def test_resume_restores_history_and_settings(profile, engine, data_dir):
    from dflash_tui.core import sessions
    from dflash_tui.tui.widgets import AnswerView, UserMessage

    app = make_app(profile, engine, block_size=2)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first question")
        await pilot.press("ctrl+t")
        await send(pilot, "second question")
    session_id = app.conversation.session_id
    answers = [t.answer for t in app.conversation.turns]

    session = sessions.load_session(session_id)
    again = make_app(profile, engine, resume=session)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        conv = again.conversation
        assert [t.user for t in conv.turns] == ["first question", "second question"]
        assert [t.answer for t in conv.turns] == answers
        assert conv.settings.block_size == 2 and conv.settings.thinking is False
        assert len(again.query(UserMessage)) == 2 and len(again.query(AnswerView)) == 2
        third = await send(pilot, "third")
        assert third.messages[0]["content"] == "first question"
        assert third.messages[1]["content"] == answers[0]
    assert conv.session_id == session_id
    assert len(sessions.load_session(session_id).turns) == 3


@pytest.mark.asyncio
async def test_missing_model_shows_the_error_screen(tmp_path, pair, data_dir):
    from dflash_tui.tui.screens import LoadErrorScreen

    missing = tmp_path / "no-such-model"
    profile = write_profile(tmp_path / "broken.toml", missing, pair[1])
    app = make_app(profile)
    async with app.run_test(size=SIZE) as pilot:
        await waiting.until(pilot, lambda: app.load_error is not None)
        await pilot.pause()
        assert isinstance(app.screen, LoadErrorScreen)
        message = str(app.screen.query_one("#error-message").render())
        assert "no-such-model" in message
        assert app.conversation is None
        # typing into a dead app is refused politely, not a crash
        app.pop_screen()
        await pilot.press(*"hello", "enter")
        assert app.is_running


@pytest.mark.asyncio
async def test_new_session_and_sessions_browser_resume(profile, engine, data_dir):
    from dflash_tui.tui.screens import SessionsScreen
    from dflash_tui.tui.widgets import UserMessage

    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "remember me")
        first_id = app.conversation.session_id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.conversation.turns == [] and app.conversation.session_id is None
        assert len(app.query(UserMessage)) == 0
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        await pilot.press("enter")
        await pilot.pause()
        assert app.conversation.session_id == first_id
        assert [t.user for t in app.conversation.turns] == ["remember me"]


@pytest.mark.asyncio
async def test_palette_commands_include_profiles_engines_and_system_prompt(profile, engine, data_dir):
    from dflash_tui.tui.screens import SystemPromptScreen

    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for wanted in ("Toggle thinking", "Next block size", "Edit system prompt", "Engine: cuda", "Engine: mlx",
                       "Sessions", "Replay", "Help"):
            assert wanted in titles
        assert any(t.startswith("Profile: ") for t in titles)  # built-in and user profiles, to switch to
        app.action_system_prompt()
        await pilot.pause()
        assert isinstance(app.screen, SystemPromptScreen)
        await pilot.press(*"be brief", "ctrl+s")
        await pilot.pause()
        assert app.conversation.settings.system_prompt == "be brief"
        turn = app.conversation.begin("hello")
        assert turn.messages[0] == {"role": "system", "content": "be brief"}


@pytest.mark.asyncio
async def test_engine_switch_reloads_and_keeps_history(profile, data_dir):
    """The engine before's notices go with it (issue 32: "No CUDA device" stayed after switching to mlx);
    a turn it ran keeps its figures but not its peak memory, which is not the new engine's, and its block-1
    probes go (a speedup against them would compare two engines)."""
    from dflash_tui.tui.widgets import NoticeLine

    def engine_notices():
        return [str(n.render()) for n in app.screen.query(NoticeLine) if "No CUDA device" in str(n.render())]

    app = make_app(profile)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "before the switch")
        assert len(engine_notices()) == 1 and app._last_stats.peak_bytes
        await waiting.until(pilot, lambda: app.conversation.probes)  # block 1 timed on this engine
        old = app.engine
        app.switch_engine("cuda")
        await waiting.until(pilot, lambda: app.engine is not None and app.engine is not old and not app.loading)
        await pilot.pause()
        assert [t.user for t in app.conversation.turns] == ["before the switch"]
        assert len(engine_notices()) == 1  # the new engine's own, not the old one's beside it
        assert app.conversation.probes == []  # the old engine's block-1 step is no measure of the new one's
        app.conversation.turns[-1].summary.engine = "mlx"  # as if the turn had run on the engine before
        app.chat.refresh_chrome()
        assert app._last_stats.peak_bytes is None and app._last_stats.tokens_per_s
        await send(pilot, "after")
        assert len(app.conversation.turns) == 2 and app._last_stats.peak_bytes


@pytest.mark.asyncio
async def test_a_failed_engine_switch_keeps_the_history_and_every_command_runs(tmp_path, pair, data_dir):
    """The new engine fails to load: the palette opens and each of our commands runs (ctrl+p crashed on
    the conversation left without an engine), a prompt is refused politely and kept, and the next switch
    that loads brings the history back."""
    import inspect
    import shutil

    from textual.app import App

    from dflash_tui.tui.screens import LoadErrorScreen

    target = tmp_path / "target"
    shutil.copytree(pair[0], target)
    app = make_app(write_profile(tmp_path / "moving.toml", target, pair[1]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "before the switch")
        shutil.move(target, tmp_path / "elsewhere")
        app.switch_engine("cuda")
        await waiting.until(pilot, lambda: app.load_error is not None and isinstance(app.screen, LoadErrorScreen))
        textual_own = {c.title for c in App.get_system_commands(app, app.screen)}
        ours = [c for c in app.get_system_commands(app.screen) if c.title not in textual_own
                and not c.title.startswith(("Engine:", "Profile:"))]
        assert {"Next block size", "New context", "Replay", "Toggle thinking"} <= {c.title for c in ours}
        for command in ours:
            result = command.callback()
            if inspect.isawaitable(result):
                await result
            await pilot.pause()
            assert app.is_running, command.title
            while len(app.screen_stack) > 2:  # a screen the command opened (help, sessions), over the error's
                app.pop_screen()
        app.pop_screen()  # the error screen
        await pilot.press(*"hello", "enter")
        await pilot.pause()
        assert app.is_running and app.chat._prompt.text == "hello"  # kept for when a model is loaded
        shutil.move(tmp_path / "elsewhere", target)
        app.switch_engine("cuda")
        await waiting.until(pilot, lambda: app.conversation is not None and not app.loading)
        assert [t.user for t in app.conversation.turns] == ["before the switch"]


# -- the controller without the UI ----------------------------------------------------------------


def test_context_trimming_drops_the_oldest_turns_with_a_notice(engine, data_dir):
    from dflash_tui.core.conversation import ChatSettings, Conversation, Turn

    conv = Conversation(engine, ChatSettings(max_new_tokens=64), record=False)
    notices = []
    conv.on_notice = notices.append
    long = "The quick brown fox jumps over the lazy dog. " * 2
    # every third turn was cancelled: it stays in the history but was never sent, so it is not counted
    conv.turns = [Turn(user=f"question {i} {long}", answer=long, status="cancelled" if i % 3 == 0 else "completed")
                  for i in range(12)]
    active = conv.begin("and now?")
    limit = engine.target_info.max_positions
    assert len(active.prompt_ids) + 64 <= limit
    assert conv.dropped > 0 and active.dropped == conv.dropped
    first = next(t for t in conv.turns[conv.dropped:] if t.resent)
    assert active.messages[0]["content"] == first.user
    answered = sum(t.resent for t in conv.turns[:conv.dropped])
    assert answered < conv.dropped and len(notices) == 1
    assert notices[0].startswith(f"Context full: {answered} oldest turn")
    assert f"({answered} dropped in all" in notices[0]
    # a second turn does not resend what was dropped
    assert conv.begin("again").messages[0]["content"] == first.user


def test_thinking_layout_and_answer_view_split():
    from dflash_tui.core.conversation import split_thinking, thinking_layout

    raw = "<think>\nones: 8 + 5 = 13\n</think>\n\n48 + 75 = 123."
    start, end, answer = thinking_layout(raw, True)
    assert raw[start:end].strip() == "ones: 8 + 5 = 13" and raw[answer:] == "48 + 75 = 123."
    assert thinking_layout("plain answer", False) == (0, 0, 0)
    assert thinking_layout("<think>\nstill going", True)[1] == len("<think>\nstill going")
    assert split_thinking("<think>\n\n</think>\n\nhi", False) == (None, "hi", True)
    assert split_thinking("reasoning</think>answer", True) == ("reasoning", "answer", True)


@pytest.mark.asyncio
async def test_answer_view_puts_thinking_in_a_collapsible(data_dir):
    from textual.app import App
    from textual.widgets import Collapsible

    from dflash_tui.tui.widgets import AnswerView

    class One(App):
        def compose(self):
            yield AnswerView(thinking=True)

    def event(pieces, rejected_text=""):
        return StepEvent(drafted=[], accepted=0, emitted=[0] * len(pieces), pieces=pieces, rejected_text=rejected_text)

    app = One()
    async with app.run_test(size=(80, 20)) as pilot:
        view = app.query_one(AnswerView)
        view.add_events([event([("<think>", "target"), ("\nadd ", "draft"), ("digits", "target")], "xx"),
                         event([("\n</think>\n\n", "target"), ("123", "draft")])])
        view.render_text()
        await pilot.pause()
        assert view.query_one(Collapsible).display
        assert view.thinking_text.strip() == "add digits" and view.answer_text == "123"
        assert "thinking" in view.query_one(Collapsible).title
        assert str(view.query_one(".answer-text").render()) == "123"


# -- snapshots (no generation: nothing timing-dependent on screen) ---------------------------------


def _snapshot_app(profile, engine):
    app = make_app(profile, engine)

    async def before(pilot):
        await ready(pilot)
        await steady_cursor(pilot)

    return app, before


def test_snapshot_main_screen(snap_compare, profile, engine, data_dir):
    app, before = _snapshot_app(profile, engine)
    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_main_screen_80x24_folds_stats(snap_compare, profile, engine, data_dir):
    app, before = _snapshot_app(profile, engine)
    assert snap_compare(app, terminal_size=(80, 24), run_before=before)


def test_snapshot_help(snap_compare, profile, engine, data_dir):
    app, before = _snapshot_app(profile, engine)

    async def run(pilot):
        await before(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run)


def _one_answer_session(engine):
    """A session with one answered turn and fixed figures: the chat after an answer, without timings
    that differ per run. The ids are the tiny tokenizer's; the steps give the answer its colours."""
    from dflash_tui.core import sessions
    from dflash_tui.engines import GenerationRequest

    question, answer = "What is 48 + 75?", "48 + 75 = 123: 8 + 5 is 13, carry the 1; 4 + 7 + 1 is 12."
    prompt_ids = engine.prepare(GenerationRequest(messages=[{"role": "user", "content": question}], thinking=False))
    emitted = engine.tokenizer.encode(answer, add_special_tokens=False)
    accepted = [5, 0, 9, 3, 15, 2, 7]  # drafted ids kept per step (block 16); the target adds one each
    steps, at = [], 1
    for n in accepted:
        steps.append({"drafted": emitted[at:at + n] + [7] * (15 - n), "accepted": n})
        at += n + 1
    emitted = emitted[:at]
    lengths = [n + 1 for n in accepted]
    summary = {"prompt_tokens": len(prompt_ids), "generated_tokens": len(emitted), "token_ids": emitted,
               "text": engine.decode(emitted), "ttft_s": 0.05, "decode_s": 1.0, "decode_tokens_per_s": 41.7,
               "acceptance_lengths": lengths, "mean_acceptance_length": sum(lengths) / len(lengths),
               "histogram": [lengths.count(k) for k in range(1, 17)], "draft_s": 0.2, "verify_s": 0.8,
               "peak_memory_bytes": 734003200, "peak_memory_kind": "process-lifetime-rss", "block_size": 16,
               "engine": "cuda", "device": "cpu", "dtype": "float32", "finish_reason": "stop"}
    writer = sessions.SessionWriter({"created": "2026-01-02T10:00:00+00:00", "profile": {"name": "tiny"},
                                     "engine": "cuda"}, session_id="20260102-100000-0000")
    writer.append_turn({"status": "completed", "user": question, "answer": engine.decode(emitted),
                        "settings": {"block_size": 16, "thinking": False, "temperature": 0.0}, "thinking": False,
                        "prompt_ids": prompt_ids, "emitted_ids": emitted, "steps": steps, "summary": summary})
    writer.close()
    return sessions.load_session("20260102-100000-0000")


def test_snapshot_80x24_after_an_answer(snap_compare, profile, engine, data_dir):
    app = make_app(profile, engine, resume=_one_answer_session(engine))

    async def before(pilot):
        from dflash_tui.tui.widgets import AnswerView

        await ready(pilot)
        app = pilot.app
        # the resumed answer is final once its footer is drawn (`finish`, after a refresh), and the
        # conversation shows its end (a follow, after the layout)
        await waiting.until(pilot, lambda: len(app.conversation.turns) == 1 and app.query(AnswerView)
                            and all(view.status == "completed" for view in app.query(AnswerView)))
        view = app.screen.query_one("#conversation")
        await waiting.until(pilot, lambda: view.scroll_y >= view.max_scroll_y)
        await steady_cursor(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=before)


def test_snapshot_80x24_multiline_message(snap_compare, profile, engine, data_dir):
    app, before = _snapshot_app(profile, engine)

    async def run(pilot):
        await before(pilot)
        await pilot.press(*"Three lines:", "ctrl+j", *"the second,", "ctrl+j", *"and the third stays in view.")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)


@pytest.mark.parametrize("keys", [(), ("end",)], ids=["top", "scrolled-to-the-end"])
def test_snapshot_help_80x24(snap_compare, profile, engine, data_dir, keys):
    app, before = _snapshot_app(profile, engine)

    async def run(pilot):
        await before(pilot)
        await pilot.press("f1", *keys)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)


def test_snapshot_sessions_browser(snap_compare, profile, engine, data_dir):
    from dflash_tui.core import sessions

    for n, (created, prompt) in enumerate([("2026-01-02T10:00:00+00:00", "What is 48 + 75?"),
                                           ("2026-01-03T11:30:00+00:00", "Write a haiku about drafts")]):
        writer = sessions.SessionWriter({"created": created, "profile": {"name": "tiny"}, "engine": "cuda"},
                                        session_id=f"2026010{n + 2}-100000-000{n}")
        writer.append_turn({"status": "completed", "user": prompt, "answer": "…", "settings": {}})
    app, before = _snapshot_app(profile, engine)

    async def run(pilot):
        await before(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run)


# -- the engine process the app decodes in ---------------------------------------------------------


def test_engine_process_streams_the_same_tokens(process_engine, engine):
    from dflash_tui.engines import EngineLike, GenerationRequest

    assert isinstance(process_engine, EngineLike)

    def run(e, **kw):
        request = GenerationRequest(messages=[{"role": "user", "content": "What is 48 + 75?"}], max_new_tokens=40,
                                    temperature=0.0, block_size=4, **kw)
        events = list(e.generate(request))
        return events, e.last_summary

    (a, sa), (b, sb) = run(process_engine), run(engine)
    assert [x.emitted for x in a] == [x.emitted for x in b] and sa.token_ids == sb.token_ids
    assert [x.pieces for x in a] == [x.pieces for x in b] and sa.text == sb.text
    assert process_engine.prepare(GenerationRequest(messages=[{"role": "user", "content": "x"}])) == \
        engine.prepare(GenerationRequest(messages=[{"role": "user", "content": "x"}]))
    assert (process_engine.name, process_engine.device, process_engine.block_size) == \
        (engine.name, engine.device, engine.block_size)


def test_engine_process_cancels_within_a_step_and_reports_user_errors(process_engine):
    from dflash_tui.engines import GenerationRequest, UserError

    request = GenerationRequest(messages=[{"role": "user", "content": "go"}], max_new_tokens=400, temperature=0.0,
                                block_size=1)
    seen = 0
    for _event in process_engine.generate(request):
        seen += 1
        if seen == 3:
            request.cancel.set()
    summary = process_engine.last_summary
    assert summary.finish_reason == "cancelled" and summary.generated_tokens < 400
    # a consumer that walks away mid-answer leaves the process ready for the next request
    stream = process_engine.generate(GenerationRequest(messages=[{"role": "user", "content": "go"}],
                                                       max_new_tokens=300, temperature=0.0))
    next(stream)
    stream.close()
    with pytest.raises(UserError, match="Block size 99"):
        list(process_engine.generate(GenerationRequest(messages=[{"role": "user", "content": "x"}], block_size=99)))
    events = list(process_engine.generate(GenerationRequest(messages=[{"role": "user", "content": "x"}],
                                                            max_new_tokens=5, temperature=0.0)))
    assert sum(len(e.emitted) for e in events) == 5


def test_engine_process_says_each_loading_stage_as_it_starts(pair):
    """The child's stages reach the parent while it loads (the TUI's loading line shows them; a capture
    between requests, on a GPU, comes the same way)."""
    from dflash_tui.engines import EngineConfig
    from dflash_tui.engines.process import ProcessEngine

    stages: list[str] = []
    engine = ProcessEngine(EngineConfig(target=str(pair[0]), draft=str(pair[1]), engine="cuda", device="cpu",
                                        dtype="float32"), progress=stages.append)
    try:
        assert stages == ["loading the target (float32 on cpu)", "loading the draft"]
        assert not engine.prepare_steps(8) and len(stages) == 2  # no graphs on the CPU: nothing captured, nothing said
    finally:
        engine.close()


def test_engine_process_load_error_is_the_same_user_error(tmp_path, pair):
    from dflash_tui.engines import CheckpointError, EngineConfig
    from dflash_tui.engines.process import ProcessEngine

    with pytest.raises(CheckpointError, match="nothing-here"):
        ProcessEngine(EngineConfig(target=str(tmp_path / "nothing-here"), draft=str(pair[1]), engine="cuda"))


def test_thinking_warns_once_when_the_draft_lacks_thinking_traces(tmp_path, pair, engine):
    from dflash_tui.core.conversation import DRAFT_THINKING_WARNING, ChatSettings, Conversation
    from dflash_tui.core.settings import profile_for as load_profile

    path = write_profile(tmp_path / "nothink.toml", *pair, thinking=False, block_size=16)
    text = path.read_text().replace("block_size = 16", "block_size = 16\nthinking_trained = false")
    path.write_text(text)
    profile = load_profile(str(path))
    assert profile.draft_thinking is False
    conv = Conversation(engine, ChatSettings.from_profile(profile), profile=profile, record=False)
    assert conv.settings.thinking is False
    assert conv.toggle_thinking() == DRAFT_THINKING_WARNING
    assert conv.toggle_thinking() is None and conv.toggle_thinking() is None  # once


@pytest.mark.asyncio
async def test_demo_pair_streams_both_colours(data_dir):
    """With the trained demo pair, accepted draft tokens and target tokens both show, in their colours."""
    from dflash_tui.core.profiles import load_profile
    from dflash_tui.tui.widgets import AnswerView

    try:
        config = load_profile("demo").engine_config("cuda")
    except Exception as exc:  # noqa: BLE001 - any reason the demo is missing is a skip
        pytest.skip(f"no demo profile here ({exc})")
    if not (Path(config.target).is_dir() and config.draft and Path(config.draft).is_dir()):
        pytest.skip("the demo pair is not built (make demo-models)")
    from dflash_tui.tui.app import DflashApp

    app = DflashApp(profile="demo", engine="cuda", thinking=True, animate=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        active = await send(pilot, "What is 48 + 75?")
        answer = app.query(AnswerView).last()
        kinds = {kind for _, kind in answer.segments}
        assert {"draft", "target"} <= kinds
        assert active.stats.tau > 1.0 and app._last_stats.histogram[1:] != [0] * (len(app._last_stats.histogram) - 1)


@pytest.mark.asyncio
async def test_a_turn_the_disk_could_not_take_says_so_and_is_saved_with_the_next(tmp_path, pair, data_dir, monkeypatch):
    """Disk full while a turn is written: the answer stays on screen marked "not saved: disk full",
    the app goes on, and the next turn writes both (a fault-injecting writer; no tmpfs needed)."""
    from dflash_tui.core import sessions

    real_append = sessions.SessionWriter._append
    calls = {"n": 0}

    def first_write_fails(self, records):
        records = list(records)
        if any(r.get("type") == "turn" for r in records):  # the turn's own write (its prompt record went before)
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(28, "No space left on device")
        return real_append(self, records)

    monkeypatch.setattr(sessions.SessionWriter, "_append", first_write_fails)
    profile = write_profile(tmp_path / "short.toml", *pair, max_new_tokens=6)
    app = make_app(profile, block_size=4)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        footer = str(app.query("AnswerView").last().query_one(".answer-footer").render())
        assert "not saved: disk full" in footer and "stopped: token limit" in footer
        await send(pilot, "two")
        footer = str(app.query("AnswerView").last().query_one(".answer-footer").render())
        assert "not saved" not in footer
    assert [line["user"] for line in session_lines(app) if line.get("type") == "turn"] == ["one", "two"]
