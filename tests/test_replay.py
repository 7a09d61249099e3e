"""`dflash replay`: a session recorded by the real chat controller, replayed at every block size.

The session is written by `Conversation` + `SessionWriter` on a random tiny pair at temperature 0
(and on the demo pair when it has been built). No engine is mocked: the identity checks and the top-2
margins come from real generations and real forward passes. Timings are never compared with a number:
the tests check that the runs are counted and that the best and the spread are drawn from them.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import sessions
from dflash_tui.core.conversation import ChatSettings, Conversation
from dflash_tui.core.profiles import Profile
from dflash_tui.engines import EngineConfig, UserError, load_engine
from dflash_tui.measure import replay, runs
from tests import tiny, waiting

BLOCKS = [1, 2, 4, 8, 16]
QUESTIONS = ["What is 48 + 75?", "The quick brown fox"]
ROW_KEYS = {"block_size", "generated_tokens", "steps", "tau", "histogram", "decode_tokens_per_s", "speedup", "ttft_s",
            "peak_memory_bytes", "peak_memory_kind", "repeats", "repeat_rates", "identical_to_recording",
            "identical_across_block_sizes", "turns"}
TOP_KEYS = {"schema", "session", "session_path", "created", "engine", "device", "dtype", "target", "draft", "draft_arch",
            "recorded_target",
            "recorded_engine", "same_target", "temperature", "greedy", "block_sizes", "turns", "rows", "differences",
            "warnings"}
ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "profiles" / "demo"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def record_session(engine, profile, questions, block_size: int, max_new_tokens: int = 32) -> str:
    settings = ChatSettings.from_profile(profile)
    settings.max_new_tokens = max_new_tokens
    conv = Conversation(engine, settings, profile=profile)
    conv.set_block(block_size)
    for question in questions:
        active = conv.begin(question)
        for _ in conv.stream(active):
            pass
    return conv.session_id


@pytest.fixture(scope="module")
def recorded(pairs, tmp_path_factory):
    """(engine, session id, data dir): two turns recorded at block 8, temperature 0."""
    target, draft = pairs("qwen3")
    data = tmp_path_factory.mktemp("data")
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu"))
    profile = Profile(name="tiny", description="", path=None, target=str(target), draft=str(draft), temperature=0.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_DATA_DIR", str(data))
        session_id = record_session(engine, profile, QUESTIONS, 8)
    return engine, session_id, data


@pytest.fixture
def data_dir(recorded, monkeypatch):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(recorded[2]))
    return recorded[2]


def copy_session(data_dir: Path, session_id: str, name: str, edit=None, tail: str = "") -> str:
    """A copy of the recorded session under a new id, its records passed through `edit`, plus `tail` (the
    header and the turns: the prompt record written before each answer is settled by its turn, so left out)."""
    source = sessions.resolve(session_id)
    lines = [r for r in (json.loads(line) for line in source.read_text().splitlines() if line.strip())
             if r["type"] != "prompt"]
    lines[0]["id"] = name
    lines[0]["created"] = "2000-01-01T00:00:00+00:00"  # older than the recording, which stays the newest
    if edit:
        lines = edit(lines)
    path = source.parent / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + tail)
    return name


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def assert_best_of_runs(row, repeats: int) -> None:
    """A row counts its runs, shows the fastest, and its spread is the distance between them."""
    rates = row["repeat_rates"]
    assert row["repeats"] == repeats == len(rates) and all(rate > 0 for rate in rates)
    assert row["decode_tokens_per_s"] == max(rates) and all(row["decode_tokens_per_s"] >= rate for rate in rates)
    assert runs.spread(row) == max(rates) - min(rates) >= 0


def test_every_block_size_is_identical_and_block_1_is_the_baseline(recorded, data_dir):
    engine, session_id, _ = recorded
    session = sessions.load_session(session_id)
    seen = []
    comparison = replay.run_replay(engine, session, BLOCKS, progress=lambda done, total, label: seen.append(done),
                                   repeats=3)
    assert comparison["greedy"] and comparison["same_target"]
    assert [row["block_size"] for row in comparison["rows"]] == BLOCKS
    assert comparison["differences"] == []
    for row in comparison["rows"]:
        assert row["identical_to_recording"] is True and row["identical_across_block_sizes"] is True
        assert_best_of_runs(row, 3)
        assert len(row["histogram"]) == row["block_size"] and sum(row["histogram"]) == row["steps"]
        recorded_ids = [t["emitted_ids"] for t in session.turns]
        assert [t["token_ids"] for t in row["turns"]] == recorded_ids
        # the coloured pieces spell the text the recording answered
        assert ["".join(p[0] for p in t["pieces"]) for t in row["turns"]] == [t["answer"] for t in session.turns]
    assert comparison["rows"][0]["speedup"] == 1.0
    assert all(isinstance(row["speedup"], float) for row in comparison["rows"])
    assert seen == sorted(seen) and seen[-1] == len(BLOCKS) * (3 * len(QUESTIONS) + 1)  # a warm-up, then 3 runs
    text = replay.report(comparison, colour=False)
    assert "✓ All 2 turns identical at block sizes 1, 2, 4, 8, 16 in every run (3 per block size)" in text
    assert "tok/s: best of 3 runs after a warm-up" in text
    assert "\x1b[" not in text  # no colour codes when colour is off (NO_COLOR, not a tty)
    assert "speedup vs block 1" in text and "tau" in text


def test_cli_json_has_the_documented_schema_and_is_saved_next_to_the_session(recorded, data_dir):
    _, session_id, _ = recorded
    result = invoke("replay", session_id, "--block-sizes", "4,1,16", "--repeats", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == TOP_KEYS and data["schema"] == replay.SCHEMA == "dflash-replay/2"
    assert data["block_sizes"] == [1, 4, 16]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert_best_of_runs(row, 2)
        assert set(row["turns"][0]) == {"index", "token_ids", "pieces", "acceptance_lengths", "generated_tokens",
                                        "decode_tokens_per_s", "ttft_s", "finish_reason"}
        assert row["identical_to_recording"] is True
    assert data["rows"][0]["speedup"] == 1.0
    assert set(data["turns"][0]) == {"index", "user", "prompt_tokens", "recorded_tokens", "recorded_block_size"}
    saved = replay.saved_comparisons(sessions.resolve(session_id))
    assert saved and replay.load_comparison(saved[-1])["rows"] == data["rows"]
    assert "saved" in result.stderr and "block 16 · run 2/2" in result.stderr  # progress went to stderr
    # the session itself is untouched and still lists once
    assert [s.id for s in sessions.list_sessions()].count(session_id) == 1


def test_cli_table_marks_identical_outputs(recorded, data_dir):
    _, session_id, _ = recorded
    result = invoke("replay", session_id, "-B", "1,8", "--repeats", "3", "--no-save")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "✓ recording · ✓ block 1" in out and "1.00x" in out and "✓ All 2 turns identical" in out
    header, rule, *rows = out.splitlines()[2:6]
    assert header.split()[:5] == ["block", "identical", "tok/s", "spread", "runs"]
    assert [row.split()[1] for row in rows] == ["✓", "✓"] and all(" 3 " in row and "%" in row for row in rows)
    assert "best of 3 runs after a warm-up" in out
    assert "saved" not in result.stderr


def test_a_torn_last_line_still_replays(recorded, data_dir):
    engine, session_id, _ = recorded
    torn = copy_session(data_dir, session_id, "torn-session", tail='{"type": "turn", "index": 2, "user": "Hel')
    result = invoke("replay", torn, "-B", "1,4", "--repeats", "1", "--json", "--no-save")
    assert result.exit_code == 0, result.output
    assert "incomplete" in result.stderr
    data = json.loads(result.stdout)
    assert len(data["turns"]) == 2 and all(r["identical_to_recording"] for r in data["rows"])


def test_a_set_cancel_event_stops_the_replay(recorded, data_dir):
    engine, session_id, _ = recorded
    stop = threading.Event()
    stop.set()
    with pytest.raises(replay.ReplayCancelled):
        replay.run_replay(engine, sessions.load_session(session_id), [1, 2], cancel=stop)


def test_cancelled_turns_are_not_replayed(recorded, data_dir):
    engine, session_id, _ = recorded

    def cancel_first(lines):
        lines[1]["status"] = "cancelled"
        return lines

    name = copy_session(data_dir, session_id, "cancelled-session", cancel_first)
    comparison = replay.run_replay(engine, sessions.load_session(name), [1, 2], warmup=False, repeats=1)
    assert [t["index"] for t in comparison["turns"]] == [1]


def test_a_difference_is_flagged_with_position_and_top2_margin(recorded, data_dir):
    engine, session_id, _ = recorded

    def corrupt(lines):
        ids = lines[1]["emitted_ids"]
        ids[3] = (ids[3] + 1) % 256
        return lines

    name = copy_session(data_dir, session_id, "corrupt-session", corrupt)
    comparison = replay.run_replay(engine, sessions.load_session(name), [1, 4], warmup=False, repeats=2)
    assert [r["identical_to_recording"] for r in comparison["rows"]] == [False, False]
    assert [r["identical_across_block_sizes"] for r in comparison["rows"]] == [True, True]
    diffs = comparison["differences"]
    assert {(d["turn"], d["position"], d["against"]) for d in diffs} == {(0, 3, "recording")}
    assert len(diffs) == 2  # one per block size, though each of the 2 runs differs
    session = sessions.load_session(session_id)
    assert diffs[0]["got"] == session.turns[0]["emitted_ids"][3]
    assert isinstance(diffs[0]["margin"], float) and diffs[0]["margin"] >= 0
    lines = replay.difference_lines(comparison)
    assert "turn 1, block 1 vs recording: first differs at token 3" in lines[0] and "margin" in lines[0]
    assert "✗ recording" in replay.format_table(comparison)


def test_another_target_says_different_target(recorded, data_dir):
    engine, session_id, _ = recorded

    def move_target(lines):
        lines[0]["target_path"] = lines[0]["target"] = "/elsewhere/quantized-target"
        return lines

    name = copy_session(data_dir, session_id, "moved-session", move_target)
    comparison = replay.run_replay(engine, sessions.load_session(name), [1, 2], warmup=False, repeats=1)
    assert comparison["same_target"] is False
    assert all(r["identical_to_recording"] is None for r in comparison["rows"])
    assert comparison["rows"][1]["identical_across_block_sizes"] is True
    assert "different target" in replay.format_table(comparison) and "different target" in replay.report(comparison)


def test_mlx_replay_matches_the_cuda_recording_and_margins_agree(recorded, data_dir):
    pytest.importorskip("mlx.core")
    engine, session_id, _ = recorded
    session = sessions.load_session(session_id)
    config = replay.engine_config_for(session, engine="mlx")
    assert config.engine == "mlx" and config.target == session.header["target_path"]
    mlx_engine = load_engine(config)
    comparison = replay.run_replay(mlx_engine, session, [1, 4], warmup=False, repeats=1)
    assert comparison["same_target"] and not comparison["differences"]
    ids = session.turns[0]["prompt_ids"]
    cuda, mlx = engine.top2_margin(ids), mlx_engine.top2_margin(ids)
    assert cuda.top2 == mlx.top2 and abs(cuda.value - mlx.value) < 1e-3


def test_unknown_session_exits_2_in_one_sentence(data_dir):
    result = invoke("replay", "no-such-session")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: No session 'no-such-session'") and result.stderr.count("\n") == 1


def test_a_text_only_server_session_replays_locally_against_block_1(recorded, data_dir):
    """A server that streams text alone (llama.cpp, through the remote engine) records no ids: the replay on
    a local engine compares block sizes with block 1 and says nothing about the recording."""
    def from_text_only_server(lines):
        lines[0]["engine"] = "remote"
        for record in lines[1:]:
            record["emitted_ids"] = []
            if "engine" in record.get("settings", {}):
                record["settings"]["engine"] = "remote"
        return lines

    name = copy_session(data_dir, recorded[1], "text-only-session", from_text_only_server)
    result = invoke("replay", name, "--engine", "cuda", "-B", "1,4", "--repeats", "1", "--json", "--no-save")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["identical_to_recording"] for r in report["rows"]] == [None, None]
    assert [r["identical_across_block_sizes"] for r in report["rows"]] == [True, True]


def test_a_bad_device_flag_is_blamed_on_the_command_line_not_the_session(recorded, data_dir):
    result = invoke("replay", recorded[1], "--device", "banana")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "Device 'banana' in the command line" in result.stderr and "session" not in result.stderr


@pytest.mark.parametrize("args", [["--block-sizes", "0,4"], ["--block-sizes", "1,65"], ["--block-sizes", "1,x"],
                                  ["--block-sizes", ""], ["--block-sizes", "1,,4"], ["--block-sizes", "4,"],
                                  ["--repeats", "0"]])
def test_bad_block_sizes_and_repeats_exit_2(recorded, data_dir, args):
    result = invoke("replay", recorded[1], *args)
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_parse_block_sizes_adds_the_baseline():
    assert replay.parse_block_sizes("16, 4,4 8") == [1, 4, 8, 16]
    assert replay.parse_block_sizes("2", add_one=False) == [2]
    with pytest.raises(UserError, match="out of range"):
        replay.parse_block_sizes("64,65")


def test_first_difference():
    assert replay.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert replay.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert replay.first_difference([1, 2], [1, 2, 3]) == 2


def test_chart_falls_back_to_plain_text_bars():
    from dflash_tui.measure import report

    text = report._text_chart(["1", "8"], [1.0, 2.5], [1.0, 4.2])
    assert "2.50x" in text and "4.20" in text


@pytest.mark.skipif(not (DEMO / "draft" / "model.safetensors").exists() or not (DEMO / "target" / "model.safetensors").exists(),
                    reason="the demo pair (profiles/demo/) has not been built yet")
def test_demo_session_replays_identically(tmp_path, monkeypatch):
    from dflash_tui.core.settings import load_settings

    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path))
    profile, config = load_settings("demo", "cuda", device="cpu")
    engine = load_engine(config)
    session_id = record_session(engine, replace(profile, max_new_tokens=96), ["What is 48 + 75?", "hi"], 16, 96)
    result = invoke("replay", session_id, "--block-sizes", "1,4,8,16", "--repeats", "1", "--no-save")
    assert result.exit_code == 0, result.output
    assert "✓ All 2 turns identical at block sizes 1, 4, 8, 16" in result.stdout
    assert result.stdout.count("✓ recording") == 4



@pytest.mark.asyncio
async def test_tui_replay_screen_runs_and_compares_a_turn_side_by_side(recorded, data_dir, tmp_path):
    pytest.importorskip("textual")

    from textual.widgets import DataTable, Input, Static

    from dflash_tui.core.conversation import printable
    from dflash_tui.tui.app import DflashApp
    from dflash_tui.tui.screens.replay import ReplayScreen

    engine, session_id, _ = recorded
    target, draft = engine.config.target, engine.config.draft
    profile = tiny.write_profile(tmp_path / "tiny.toml", target, draft, max_new_tokens=16)
    app = DflashApp(profile=str(profile), loaded_engine=engine, animate=False, record=False)

    wait_for = waiting.until

    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.conversation is not None or app.load_error is not None)
        await pilot.pause()
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen))
        screen = app.screen
        assert screen.query_one("#replay-session", Input).value == session_id  # the newest session
        assert screen.query_one("#replay-repeats", Input).value == str(replay.DEFAULT_REPEATS) == "3"
        screen.query_one("#replay-blocks", Input).value = "1,4"
        screen.query_one("#replay-blocks", Input).focus()
        await pilot.press("enter")
        await pilot.pause()
        await wait_for(pilot, lambda: screen.comparison is not None and not screen.running)
        comparison = screen.comparison
        assert [r["block_size"] for r in comparison["rows"]] == [1, 4] and not comparison["differences"]
        table = screen.query_one("#replay-table", DataTable)
        assert table.row_count == 2
        # the table shows how many runs each row is the best of, and how far apart they were
        titles = [str(column.label) for column in table.columns.values()]
        assert titles[:5] == ["block", "identical", "tok/s", "spread", "runs"]
        for number, row in enumerate(comparison["rows"]):
            assert_best_of_runs(row, 3)
            cells = [str(cell) for cell in table.get_row_at(number)]
            assert cells[titles.index("runs")] == "3" and cells[titles.index("spread")].endswith("%")
            assert cells[titles.index("tok/s")] == f"{max(row['repeat_rates']):.1f}"
        assert "best of 3 runs after a warm-up" in str(screen.query_one("#replay-note", Static).render())
        assert "✓ All 2 turns identical" in str(screen.query_one("#replay-verdict", Static).render())
        await pilot.pause()
        columns = list(screen.query(".replay-column"))
        assert len(columns) == 2 and "block 4" in str(columns[1].render())
        session = sessions.load_session(session_id)
        assert printable(session.turns[0]["answer"]) in str(columns[0].render())
        turns = screen.query_one("#replay-turns", DataTable)
        turns.focus()
        await pilot.press("down")
        await pilot.pause()
        columns = list(screen.query(".replay-column"))
        assert printable(session.turns[1]["answer"]) in str(columns[0].render())
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ReplayScreen))
        # closing mid-run stops the worker between generations, and the app carries on
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen))
        screen = app.screen
        assert screen.comparison is not None  # the saved comparison is shown when the screen opens
        await pilot.press("enter", "escape")
        # the worker's last act is `_finished` on the app's loop (running turns False there); what it left for
        # the app is then handled by the next idle, not after a fixed pause thought to be long enough
        await wait_for(pilot, lambda: not screen.running)
        await pilot.pause()
        assert not isinstance(app.screen, ReplayScreen) and app.is_running


def test_another_engine_takes_the_profile_override_for_it(recorded, data_dir, tmp_path, pairs):
    """A session replayed on another engine loads the profile's [engines.<name>] target (a quantized
    build, say), not the recorded checkpoint."""
    engine, session_id, _ = recorded
    other, _ = pairs("llama")
    profile = tmp_path / "p.toml"
    profile.write_text(f'name = "p"\n[model]\ntarget = "{engine.config.target}"\ndraft = "{engine.config.draft}"\n'
                       f'[engines.mlx]\ntarget = "{other}"\n')

    def snapshot(lines):
        lines[0]["profile"] = {"name": "p", "path": str(profile)}
        return lines

    name = copy_session(data_dir, session_id, "override-session", snapshot)
    session = sessions.load_session(name)
    pytest.importorskip("mlx.core")
    config = replay.engine_config_for(session, engine="mlx")
    assert config.engine == "mlx" and config.target == str(other)
    same = replay.engine_config_for(session)  # the recorded engine: exactly the recorded checkpoints
    assert same.engine == "cuda" and same.target == session.header["target_path"]


def test_replay_help_documents_the_json_schema():
    result = invoke("replay", "--help")
    assert result.exit_code == 0
    assert replay.SCHEMA in result.stdout and "identical_across_block_sizes" in result.stdout
    assert "repeat_rates" in result.stdout and "--repeats" in result.stdout


def test_replay_through_the_tuis_engine_process(recorded, data_dir):
    """The chat runs its engine in a child process; the replay screen reuses it (no second copy)."""
    from dflash_tui.engines.process import ProcessEngine

    engine, session_id, _ = recorded
    served = ProcessEngine(engine.config)
    try:
        session = sessions.load_session(session_id)
        assert replay.same_target(session, served)
        comparison = replay.run_replay(served, session, [1, 4], warmup=False, repeats=1)
    finally:
        served.close()
    assert comparison["greedy"] and not comparison["differences"]
    assert all(r["identical_to_recording"] and r["identical_across_block_sizes"] for r in comparison["rows"])


# -- the replay screen at 80x24 (a saved comparison with fixed numbers: nothing timing-dependent on screen) --

SNAPSHOT_SESSION = "20260101-120000-abcd"


@pytest.fixture
def saved_replay(tmp_path, monkeypatch):
    """A fresh data folder with one session and, beside it, a saved comparison of 3 runs per block size
    (tests/fixtures/replay-3-runs.json), which the replay screen shows when it opens."""
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "screen-data"))
    writer = sessions.SessionWriter({"created": "2026-01-01T12:00:00+00:00", "profile": {"name": "tiny"},
                                     "engine": "cuda"}, session_id=SNAPSHOT_SESSION)
    writer.append_turn({"status": "completed", "user": "What is 48 + 75?", "answer": "48 + 75 = 123.", "settings": {}})
    path = sessions.resolve(SNAPSHOT_SESSION)
    saved = path.parent / f"{path.with_suffix('').name}.replay-20260101-120500.json"
    saved.write_text((FIXTURES / "replay-3-runs.json").read_text())
    return saved


def screen_app(recorded, tmp_path):
    from dflash_tui.tui.app import DflashApp

    engine = recorded[0]
    profile = tiny.write_profile(tmp_path / "tiny.toml", engine.config.target, engine.config.draft, max_new_tokens=16)
    return DflashApp(profile=str(profile), loaded_engine=engine, animate=False, record=False)


async def open_replay_screen(pilot):
    """Wait for the chat, open the replay screen (ctrl+r), wait for the saved comparison, stop the cursors."""
    from textual.widgets import Input

    from dflash_tui.tui.screens.replay import ReplayScreen
    from tests.tui_helpers import ready, steady_cursor

    app = pilot.app
    await ready(pilot)
    await steady_cursor(pilot)  # drawn at once behind the modal, in whichever blink phase the chat got here
    await pilot.press("ctrl+r")
    await waiting.until(pilot, lambda: isinstance(app.screen, ReplayScreen) and app.screen.comparison is not None)
    for field in app.screen.query(Input):
        field.cursor_blink = False
    await pilot.pause()


def test_snapshot_replay_screen_80x24(snap_compare, recorded, saved_replay, tmp_path):
    assert snap_compare(screen_app(recorded, tmp_path), terminal_size=(80, 24), run_before=open_replay_screen)


@pytest.mark.asyncio
async def test_replay_screen_at_80x24_shows_run_identity_runs_and_spread(recorded, saved_replay, tmp_path):
    """At 80x24 the run button and the columns that answer "identical?", "how fast?" and "how sure?" are
    on screen; the columns to their right are reached by scrolling the table."""
    from textual.widgets import Button, DataTable, Static

    app = screen_app(recorded, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_replay_screen(pilot)
        screen = app.screen
        button = screen.query_one("#replay-run", Button)
        assert button.region.width >= len("run") and button.region.right <= 80
        assert button.region.bottom <= 24 and screen.get_widget_at(*button.region.center)[0] is button
        table = screen.query_one("#replay-table", DataTable)
        titles = [str(column.label) for column in table.columns.values()]
        widths = [column.get_render_width(table) for column in table.columns.values()]
        shown = table.scrollable_content_region.width
        assert sum(widths[:titles.index("runs") + 1]) <= shown  # block, identical, tok/s, spread, runs
        cells = [[str(cell) for cell in table.get_row_at(n)] for n in range(table.row_count)]
        assert [row[titles.index("identical")] for row in cells] == ["✓ recording"] + ["✓ recording · ✓ block 1"] * 3
        assert [row[titles.index("runs")] for row in cells] == ["3"] * 4
        assert [row[titles.index("spread")] for row in cells] == ["6%", "5%", "7%", "12%"]
        assert "best of 3 runs after a warm-up" in str(screen.query_one("#replay-note", Static).render())
        # the rest of the table is a scroll away
        assert table.max_scroll_x > 0
        table.focus()
        await pilot.press("right")
        await waiting.until(pilot, lambda: table.scroll_x > 0)


def test_rows_of_a_foreign_servers_runs_show_unknown_figures_as_dashes_and_null():
    """Runs on a server that is not ours (tests/foreign.py) carry no steps and no memory: the row's tau,
    histogram and peak are unknown (null in the saved comparison, "–" in the table and the chart's tau 0
    bar), and the saved file loads back with them still unknown."""
    from dflash_tui.engines import GenerationRequest
    from tests.foreign import ForeignServer

    with ForeignServer() as server:
        engine = load_engine(EngineConfig(target="served", engine="remote", url=server.base))
        request = GenerationRequest(prompt_ids=[10, 11, 12], max_new_tokens=8, temperature=0.0)
        passes = [[runs.run(engine, request)], [runs.run(engine, request)]]
        engine.close()
    assert passes[0][0].acceptance_lengths is None and passes[0][0].peak_memory_bytes is None
    row = replay.ReplayRow.of(1, passes, turns=[{"index": 0, "acceptance_lengths": None, "pieces": [],
                                                   "decode_tokens_per_s": 1.0}])
    assert (row.steps, row.tau, row.histogram, row.peak_memory_bytes, row.peak_memory_kind) == (None,) * 5
    comparison = replay.ReplayResult(rows=[row], block_sizes=[1], greedy=False, temperature=0.7, turns=[{}])
    again = replay.ReplayResult.from_dict(json.loads(json.dumps(comparison.to_dict())))
    assert again.rows[0].tau is None and again.rows[0].histogram is None
    table = replay.format_table(again)
    cells = table.splitlines()[2].split()  # block, identical, tok/s, spread, runs, speedup, tau, acceptance, TTFT, peak
    assert cells[0] == "1" and cells[6:8] == ["–", "–"] and cells[-2:] == ["ms", "–"], table
    assert "process peak RSS" not in table
    replay.chart(again)  # an unknown tau draws no bar, and no error


@pytest.mark.parametrize("ids, words", [([999999], "outside the target's 320 embedding rows"),
                                        ([5] * 600, "context holds 512")])
def test_damaged_recorded_ids_are_refused_before_any_weight_loads(recorded, data_dir, monkeypatch, ids, words):
    import importlib

    def loaded(config):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(importlib.import_module("dflash_tui.cli.measure"), "load_engine", loaded)

    def edit(lines):
        lines[1]["prompt_ids"] = ids
        return lines

    name = copy_session(data_dir, recorded[1], "20000101-000000-ids" + str(len(ids)), edit)
    result = invoke("replay", name, "--block-sizes", "1", "--no-save")
    assert result.exit_code == 2 and words in result.stderr and result.stderr.count("\n") == 1, result.output
