"""Which draft runs is visible (issue 44, item 4): the header, the stats and the plain REPL name DFlash 1 or
DFlash 2; `sessions show` and the replay table name the draft; the palette switches between the drafts a
profile lists (`drafts = [...]`, tests/test_profile_drafts.py). Real tiny engines: a random DFlash 1 draft and a
random DFlash 2 draft (tests/tiny_dflash2.py) for the same target; the real Textual app, driven by its pilot."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import sessions
from tests import tiny, waiting

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def drafts(pair, tmp_path_factory):
    """(target, DFlash 1 draft, DFlash 2 draft): the tiny pair's draft and a DFlash 2 one for its target."""
    from tests.tiny_dflash2 import make_dflash2_draft

    target, draft = pair
    draft2 = make_dflash2_draft(tmp_path_factory.mktemp("dflash2") / "draft2", target, [0, 2])
    return target, draft, draft2


def drafts_profile(folder: Path, target, draft, draft2) -> Path:
    """A profile beside links `dflash1` and `dflash2` to the two drafts, listing both (relative, as the demo)."""
    (folder / "dflash1").symlink_to(draft, target_is_directory=True)
    (folder / "dflash2").symlink_to(draft2, target_is_directory=True)
    path = tiny.write_profile(folder / "two.toml", target, "dflash1", max_new_tokens=8)
    path.write_text(path.read_text().replace('draft = "dflash1"', 'drafts = ["dflash1", "dflash2"]'))
    return path


# -- the TUI: the header names the kind, the palette switches, the session and `sessions show` say which ---


@pytest.mark.asyncio
async def test_the_palette_switches_to_the_second_draft_and_the_header_then_names_dflash_2(tmp_path, drafts, data_dir):
    from tests.tui_helpers import SIZE, make_app, ready, send, session_lines

    def header() -> str:
        return str(app.screen.query_one("#header-state").render())

    app = make_app(drafts_profile(tmp_path, *drafts), engine_process=False)  # the real load path, in a thread
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "block 16 · temp 0 · DFlash 1 · cuda engine" in header()
        assert "DFlash 1 · dflash1" in str(app.screen.query_one("#stats-panel").render())
        await send(pilot, "one")
        old = app.engine
        await pilot.press("ctrl+p", *"Draft: dflash2", "enter")
        await waiting.until(pilot, lambda: app.engine not in (None, old) and app.conversation is not None)
        await pilot.pause()
        assert app.engine.config.draft == str(tmp_path / "dflash2")
        assert "block 16 · temp 0 · DFlash 2 · cuda engine" in header()
        assert "DFlash 2 · dflash2" in str(app.screen.query_one("#stats-panel").render())
        assert [t.user for t in app.conversation.turns] == ["one"]  # the conversation is kept
        titles = {c.title: c.help for c in app.get_system_commands(app.screen) if c.title.startswith("Draft:")}
        assert titles == {"Draft: dflash1": "reload with this draft of the profile, keeping the conversation",
                          "Draft: dflash2": "running now"}
        await send(pilot, "two")
        head, *turns = session_lines(app)
        session_id = app.conversation.session_id
    assert (head["draft_arch"], head["draft"]) == ("dflash", str(tmp_path / "dflash1"))
    assert [(t["settings"]["draft"], t["settings"]["draft_arch"]) for t in turns] == [
        (str(tmp_path / "dflash1"), "dflash"), (str(tmp_path / "dflash2"), "dflash2")]
    shown = CliRunner().invoke(main, ["sessions", "show", session_id])
    assert shown.exit_code == 0, shown.output
    assert f"- draft: {tmp_path / 'dflash1'} (DFlash 1)" in shown.stdout
    assert "_block 16 · draft dflash1 (DFlash 1) · thinking" in shown.stdout
    assert "_block 16 · draft dflash2 (DFlash 2) · thinking" in shown.stdout
    # resuming runs the draft the last turn ran, not the profile's first
    from dflash_tui.cli.chat import profile_from_session, with_last_draft
    from dflash_tui.core import sessions as store

    session = store.load_session(session_id)
    resumed = with_last_draft(profile_from_session(session), session)
    assert resumed.engine_config("cuda").draft == str(tmp_path / "dflash2")


def test_a_session_from_before_draft_kinds_still_loads_and_shows_its_draft(data_dir):
    """No schema break: a header and turns without draft_arch (older dflash) read as before."""
    writer = sessions.SessionWriter({"created": "2026-01-01T12:00:00+00:00", "profile": {"name": "tiny"},
                                     "engine": "cuda", "target": "org/t", "draft": "org/d"},
                                    session_id="20260101-120000-abcd")
    writer.append_turn({"index": 0, "status": "completed", "user": "q", "answer": "a", "prompt_ids": [1],
                        "emitted_ids": [2], "settings": {"block_size": 4, "thinking": False}, "steps": []})
    writer.close()
    text = sessions.to_markdown(sessions.load_session("20260101-120000-abcd"))
    assert "- draft: org/d\n" in text and "_block 4 · thinking off_" in text


# -- replay and the plain REPL -------------------------------------------------------------------------


def test_the_replay_table_and_the_plain_repl_name_the_draft(drafts, data_dir):
    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.core.profiles import Profile
    from dflash_tui.engines import EngineConfig, load_engine
    from dflash_tui.measure import replay
    from dflash_tui.repl import Repl

    target, _, draft2 = drafts
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft2), engine="cuda", device="cpu",
                                      dtype="float32"))
    profile = Profile(name="tiny", description="", path=None, target=str(target), draft=str(draft2), temperature=0.0)
    settings = ChatSettings.from_profile(profile)
    settings.max_new_tokens = 6
    conv = Conversation(engine, settings, profile=profile)
    err = io.StringIO()
    repl = Repl(conv, out=io.StringIO(), err=err, colour=False)
    repl.send("hello")
    assert "· block 16 · DFlash 2 · stopped" in err.getvalue()  # the line after the answer
    stats = repl.stats_text()
    assert "block 16 · DFlash 2 · thinking" in stats and stats.endswith("draft draft2 (DFlash 2)")  # /stats

    session = sessions.load_session(conv.session_id)
    comparison = replay.run_replay(engine, session, [1, 4], warmup=False, repeats=1)
    assert (comparison["draft"], comparison["draft_arch"]) == (str(draft2), "dflash2")
    head = replay.report(comparison).splitlines()[0]
    assert " · same target as recorded · draft draft2 (DFlash 2) · temperature 0 · " in head
    saved = replay.load_comparison(replay.save_comparison(comparison, session.path))
    assert replay.draft_line(saved) == "draft draft2 (DFlash 2)"
    older = {k: v for k, v in saved.to_dict().items() if k not in ("draft", "draft_arch")}  # saved before them
    old_path = session.path.with_name("old.json")
    old_path.write_text(json.dumps(older))
    assert replay.draft_line(replay.load_comparison(old_path)) is None
    assert " · draft " not in replay.report(replay.load_comparison(old_path)).splitlines()[0]
    engine.close()
