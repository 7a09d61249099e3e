"""The app at 80x24 and its app-wide parts: quitting mid-answer, the help screen, the temperature from
the palette, the remembered theme. Real tiny engines, the real Textual app driven by its pilot."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tests import waiting

pytest.importorskip("textual")
pytest.importorskip("torch")

from textual.command import CommandList, CommandPalette  # noqa: E402 - after the importorskip above
from textual.events import MouseScrollDown  # noqa: E402 - after the importorskip above
from textual.widgets import Static  # noqa: E402 - after the importorskip above

from dflash_tui.tui.screens.chat import KEYS  # noqa: E402 - after the importorskip above
from tests.tiny import write_profile  # noqa: E402 - after the importorskip above
from tests.tui_helpers import SIZE, SMALL, make_app, press_at_once, ready, send, session_lines  # noqa: E402 - after the importorskip above


def warnings_shown(app) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "warning"]


# -- ctrl+q mid-answer -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_ctrl_q_during_an_answer_saves_the_turn_as_cancelled_then_quits(tmp_path, pair, process_engine, data_dir):
    profile = write_profile(tmp_path / "long.toml", *pair, max_new_tokens=450)
    app = make_app(profile, process_engine, block_size=1)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        await pilot.press(*"tell me a long story", "enter")
        await waiting.until(pilot, lambda: app.active is not None and app.flushes > 0)  # a partial answer on screen
        await pilot.press("ctrl+q")
        await waiting.until(pilot, lambda: not app.is_running)
    assert app.turns_done == 1 and app.finished[-1].turn.status == "cancelled"
    record = session_lines(app)[-1]
    assert record["type"] == "turn" and record["user"] == "tell me a long story"
    assert record["status"] == "cancelled" and record["summary"]["finish_reason"] == "cancelled"
    assert record["answer"] and 1 <= len(record["emitted_ids"]) < 440


# -- 80x24: stats line, help, message box ----------------------------------------------------------


@pytest.mark.asyncio
async def test_the_stats_line_fits_80_columns_with_the_main_figures(profile, engine, data_dir):
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        line = app.screen.query_one("#stats-line")
        text = str(line.render())
        visible = text[:line.content_size.width]
        for figure in ("tok/s", "speedup ", "tau ", "block ", "ctx "):
            assert figure in visible, f"{figure!r} is cut from {visible!r}"
        assert "est." not in text
        speedup = app._last_stats.speedup
        assert f"speedup {speedup.text(spread=not speedup.noisy)}" in visible


@pytest.mark.asyncio
async def test_the_footer_keeps_help_and_quit_at_80_columns(profile, engine, data_dir):
    from textual.widgets._footer import FooterKey

    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        keys = {k.key: k for k in app.screen.query(FooterKey)}
        for key in ("f1", "ctrl+q"):
            assert app.screen.region.contains_region(keys[key].region)


def test_chat_help_names_the_footers_keys():
    """`dflash chat --help` still said "ctrl+k block size" once the block size had moved to f7."""
    from click.testing import CliRunner

    from dflash_tui.cli.chat import chat

    text = " ".join(CliRunner().invoke(chat, ["--help"]).output.split())
    for binding in KEYS:
        assert not binding.show or f"{binding.key} {binding.description}" in text, (binding.key, text)


def test_the_readme_lists_the_keys_as_f1_does_and_f1_every_binding():
    """Issue 46: "the README's keys table is current". It is f1's table, row for row, and f1 names every key the
    chat binds (a key added without a line in help, or a README left behind, fails here)."""
    from pathlib import Path

    from dflash_tui.tui.screens.help import KEY_HELP

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("The keys, as f1 lists them:\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert [tuple(cell.strip() for cell in row.strip("|").split(" | ")) for row in table] == KEY_HELP
    named = " ".join(key for key, _ in KEY_HELP)
    assert [binding.key for binding in KEYS if binding.key not in named] == []


@pytest.mark.asyncio
async def test_f1_explains_every_figure_of_the_stats_line(profile, engine, data_dir):
    """Defect 8 and build 5: "draft N%" was not explained in the f1 list; every figure the stats line shows
    after a turn has its row in f1's figures."""
    import re

    from dflash_tui.tui.screens.help import FIGURES
    from dflash_tui.tui.widgets import StatsLine

    app = make_app(profile, engine, block_size=4)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        await send(pilot, "first")
        fields = [text for text, _ in app.screen.query_one(StatsLine).fields]
        labels = {re.match(r"[\d.]* ?([a-z/_]+)", text).group(1) for text in fields}
        assert {"tok/s", "speedup", "tau", "block", "ctx", "draft", "peak"} <= labels, fields
        explained = {key.split()[0] for key, _ in FIGURES}
        assert labels <= explained, (labels - explained, fields)


@pytest.mark.asyncio
async def test_help_scrolls_to_its_last_row_by_key_and_by_wheel(profile, engine, data_dir):
    from dflash_tui.tui.screens import HelpScreen

    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await waiting.until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        scroll = app.screen.query_one("#help-scroll")
        legend = app.screen.query_one("#help-legend")
        assert scroll.max_scroll_y > 0  # it does not fit: it must scroll
        assert not scroll.region.contains_region(legend.region)
        await pilot.press("end")
        await waiting.until(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y)
        await pilot.pause()
        assert scroll.region.contains_region(legend.region) and legend.region.height >= 2
        await pilot.press("home")
        await waiting.until(pilot, lambda: scroll.scroll_y == 0)
        for _ in range(scroll.max_scroll_y):  # the wheel gets there too (at least one row a notch)
            await pilot._post_mouse_events([MouseScrollDown], "#help-scroll")
            if scroll.scroll_y == scroll.max_scroll_y:
                break
        await waiting.until(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y)
        console = Console(width=200, file=io.StringIO(), record=True)
        for static in scroll.query(Static):
            console.print(static.content)
        help_text = console.export_text()
        joined = " ".join(help_text.split())
        assert "≈ measured: this turn's tokens per step over its median step time (draft, verify and the engine's " \
               "work between them)" in joined
        # ctrl+t cycles gpt-oss's effort (issue 29): f1 said only "thinking on/off" (issue 32, build 4)
        assert "thinking on/off" in joined and "reasoning effort (low, medium, high)" in joined, joined
        rows = [line.strip() for line in help_text.splitlines()]
        for binding in KEYS:  # a key the footer leaves out is still in help
            assert binding.show or any(binding.key in row.split("  ")[0].split(" / ") for row in rows), binding.key
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.asyncio
async def test_the_message_box_grows_with_its_lines_and_enter_still_sends(profile, engine, data_dir):
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        prompt = app.screen.query_one("#prompt")
        one_line = prompt.outer_size.height
        await pilot.press(*"first", "ctrl+j", *"second", "ctrl+j", *"third")
        await pilot.pause()
        assert prompt.text == "first\nsecond\nthird"
        assert prompt.outer_size.height == one_line + 2  # every line in view
        assert prompt.scroll_y == 0
        for n in range(4, 10):
            await pilot.press("ctrl+j", *f"line{n}")
        await pilot.pause()
        assert prompt.outer_size.height < 10  # it stops growing and scrolls, the conversation keeps its room
        assert prompt.max_scroll_y > 0 and prompt.scroll_y == prompt.max_scroll_y  # the cursor's line shows
        active = await send(pilot, "")
        assert active.request.messages[-1]["content"].startswith("first\nsecond\nthird\nline4")
        await pilot.pause()
        assert prompt.text == "" and prompt.outer_size.height == one_line


# -- the palette: temperature ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_temperature_from_the_palette_applies_from_the_next_turn(profile, engine, data_dir):
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        first = await send(pilot, "one")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Temperature: 0", "Temperature: 0.3", "Temperature: 0.6", "Temperature: 1"} <= set(titles)
        await pilot.press("ctrl+p")
        await waiting.until(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"Temperature: 0.6")
        commands = app.screen.query_one(CommandList)

        def highlighted() -> str:
            index = commands.highlighted
            return str(commands.get_option_at_index(index).prompt) if index is not None else ""

        def listed() -> list[str]:
            return [str(commands.get_option_at_index(i).prompt) for i in range(commands.option_count)]

        # the typed value is listed first ("Set temperature 0.6"); the fixed choice is picked with the arrows
        await waiting.until(pilot, lambda: any("Temperature: 0.6" in prompt for prompt in listed()))
        while "Temperature: 0.6" not in highlighted():
            await pilot.press("down")
        await pilot.press("enter")
        await waiting.until(pilot, lambda: app.conversation.settings.temperature == 0.6)
        await pilot.pause()
        assert "temp 0.6" in str(app.screen.query_one("#header-state").render())
        assert any("From the next turn: temperature 0.6." in n.message for n in app._notifications)
        second = await send(pilot, "two")
    assert first.request.temperature == 0.0 and second.request.temperature == 0.6
    turns = [r for r in session_lines(app) if r.get("type") == "turn"]
    assert [t["settings"]["temperature"] for t in turns] == [0.0, 0.6]


def notified(app, words: str) -> int:
    return sum(words in str(n.message) for n in app._notifications)


@pytest.mark.asyncio
async def test_every_sampling_knob_typed_in_the_palette_applies_on_enter_and_closes_it(profile, engine, data_dir):
    """Issue 46, build 3 (defect 4): the palette took temperature and top_p typed in, not top_k, min_p, max_new_tokens, seed
    or a block size ("No matches found"), and enter typed before its search had listed the value left it open,
    so the next value was appended to the query. Each value here arrives with its enter in one burst."""
    from textual.widgets import Input

    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        settings = app.conversation.settings

        async def typed(text: str) -> None:
            await pilot.press("ctrl+p")
            await waiting.until(pilot, lambda: isinstance(app.screen, CommandPalette) and
                                isinstance(app.focused, Input))
            await press_at_once(pilot, *text, "enter")
            await waiting.until(pilot, lambda: not isinstance(app.screen, CommandPalette))

        for text in ("temperature 0.45", "top_p 0.9", "top_k 20", "min_p 0.05", "max_new_tokens 30", "seed 7",
                     "block 3"):
            await typed(text)
        chosen = (0.45, 0.9, 20, 0.05, 30, 7, 3)
        assert (settings.temperature, settings.top_p, settings.top_k, settings.min_p, settings.max_new_tokens,
                settings.seed, settings.block_size) == chosen
        assert notified(app, "From the next turn: top_k 20.") == 1
        for text, said in (("top_k 2.5", "top_k takes a whole number or default, such as top_k 20 (0 is off), not '2.5'."),
                           ("min_p 1", "min_p 1.0 is outside [0, 1); use 0 to disable it."),
                           ("max_new_tokens 0", "max_new_tokens 0 must be a positive number of tokens."),
                           ("seed -1", "Seed -1 is outside 0 to 2**63 - 1; pick a smaller non-negative seed."),
                           ("block 65", "Block size 65 for this chat is out of range; choose a block size from 1 to "
                                        "64 (1 = plain decoding)."),
                           ("temperature hot", "temperature takes a number or default"),
                           ("draft other", "There is no other draft to switch to here")):
            await typed(text)
            assert notified(app, said) == 1, (text, [n.message for n in app._notifications])
        assert (settings.temperature, settings.top_p, settings.top_k, settings.min_p, settings.max_new_tokens,
                settings.seed, settings.block_size) == chosen  # a refused value changes nothing
        await pilot.press("ctrl+p", *"top_k default")  # typed slowly: the palette lists what enter will do
        commands = app.screen.query_one(CommandList)
        await waiting.until(pilot, lambda: commands.highlighted is not None and
                            "Set top_k model default" in str(commands.get_option_at_index(commands.highlighted).prompt))
        await pilot.press("enter")
        await waiting.until(pilot, lambda: settings.top_k is None)
        await pilot.pause()
        header = str(app.screen.query_one("#header-state").render())
        assert "block 3" in header and "temp 0.45 · top_p 0.9" in header, header
        turn = await send(pilot, "sampled")
    request = turn.request
    assert (request.temperature, request.top_p, request.top_k, request.min_p, request.max_new_tokens, request.seed,
            request.block_size) == (0.45, 0.9, None, 0.05, 30, 7, 3)
    (record,) = [r for r in session_lines(app) if r.get("type") == "turn"]
    assert {k: record["settings"][k] for k in ("top_k", "min_p", "max_new_tokens", "seed", "block_size")} == {
        "top_k": None, "min_p": 0.05, "max_new_tokens": 30, "seed": 7, "block_size": 3}


@pytest.mark.asyncio
async def test_a_block_size_above_the_drafts_trained_one_is_set_and_said(profile, engine, data_dir):
    """A block size above the draft's trained size runs (acceptance usually drops), but the palette and f7's path
    set it without a word: the person is told, as `dflash generate` tells them."""
    from textual.widgets import Input

    said = "Block size 20 is above the draft's trained block size 16; acceptance usually drops beyond it."
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+p")
        await waiting.until(pilot, lambda: isinstance(app.screen, CommandPalette) and isinstance(app.focused, Input))
        await press_at_once(pilot, *"block 20", "enter")
        await waiting.until(pilot, lambda: notified(app, said) == 1)
        assert app.conversation.settings.block_size == 20


# -- a known-bad setting, said before it is used ----------------------------------------------------------


@pytest.mark.asyncio
async def test_thinking_off_on_a_profile_that_needs_it_warns_once_per_session(tmp_path, pair, engine, data_dir):
    """Issue 46, build 8 (defect 10): ctrl+t on the demo turned thinking off without a word, and the next answer was wrong
    (48 + 75 = 111). A profile says so with `needs_thinking = true` (the demo's does): starting with thinking off
    says it in the conversation, turning it off says it once per session."""
    from dflash_tui.core.profiles import load_profile
    from dflash_tui.engines.errors import UserError
    from dflash_tui.tui.widgets import NoticeLine

    assert load_profile("demo").needs_thinking is True
    bad = write_profile(tmp_path / "bad.toml", *pair, extra="needs_thinking = \"yes\"\n")
    with pytest.raises(UserError, match=r"line 13: generation.needs_thinking must be true or false but is the string "
                                        r"'yes'; write e.g. needs_thinking = true\."):
        load_profile(str(bad))
    profile = write_profile(tmp_path / "needs.toml", *pair, extra="needs_thinking = true\n")
    said = "Profile tiny needs thinking (needs_thinking = true): with it off, expect wrong answers; ctrl+t turns it back on."
    app = make_app(profile, engine, thinking=False)  # --no-thinking
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await waiting.until(pilot, lambda: any(said in str(n.render()) for n in app.screen.query(NoticeLine)))
        await pilot.press("ctrl+t", "ctrl+t")  # on, and off again: said already in this session
        assert app.conversation.settings.thinking is False and notified(app, said) == 0
        await pilot.press("ctrl+n", "ctrl+t", "ctrl+t")  # a new session: on, off
        await waiting.until(pilot, lambda: notified(app, said) == 1)
        await pilot.press("ctrl+t", "ctrl+t")
        assert app.conversation.settings.thinking is False and notified(app, said) == 1
        assert "thinking OFF" in str(app.screen.query_one("#header-state").render())


# -- the theme, remembered -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_chosen_theme_is_restored_at_the_next_start(profile, engine, data_dir, config_dir):
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        assert app.theme != "nord"
        app.theme = "nord"  # what the palette's theme picker does
        await pilot.pause()
    assert json.loads((config_dir / "preferences.json").read_text()) == {"theme": "nord"}
    again = make_app(profile, engine)
    async with again.run_test(size=SMALL) as pilot:
        await ready(pilot)
        assert again.theme == "nord" and warnings_shown(again) == []


@pytest.mark.asyncio
async def test_a_corrupt_preferences_file_is_one_warning_not_a_crash(profile, engine, data_dir, config_dir):
    config_dir.mkdir()
    (config_dir / "preferences.json").write_text("{ not json")
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        assert app.conversation is not None
        assert len(warnings_shown(app)) == 1 and "preferences.json" in warnings_shown(app)[0]
        app.theme = "nord"  # a new pick replaces the bad file
        await pilot.pause()
    assert json.loads((config_dir / "preferences.json").read_text()) == {"theme": "nord"}


@pytest.mark.asyncio
async def test_an_unknown_saved_theme_is_one_warning(profile, engine, data_dir, config_dir):
    config_dir.mkdir()
    (config_dir / "preferences.json").write_text('{"theme": "no-such-theme"}')
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        assert app.theme != "no-such-theme"
        assert len(warnings_shown(app)) == 1 and "no-such-theme" in warnings_shown(app)[0]


@pytest.mark.asyncio
async def test_an_unusable_config_dir_warns_once_and_keeps_the_theme(tmp_path, profile, engine, data_dir,
                                                                     monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("DFLASH_CONFIG_DIR", str(blocked / "config"))  # under a file: nothing can be written
    app = make_app(profile, engine)
    async with app.run_test(size=SMALL) as pilot:
        await ready(pilot)
        app.theme = "nord"
        await pilot.pause()
        app.theme = "gruvbox"
        await pilot.pause()
        assert app.theme == "gruvbox" and app.is_running
        assert len(warnings_shown(app)) == 1 and "preferences.json" in warnings_shown(app)[0]


def test_preferences_round_trip_and_reject_wrong_types(tmp_path):
    from dflash_tui.tui.preferences import Preferences, load_preferences, save_preferences

    path = tmp_path / "prefs" / "preferences.json"
    assert load_preferences(path) == (Preferences(), None)
    assert save_preferences(Preferences(theme="nord"), path) is None
    assert load_preferences(path) == (Preferences(theme="nord"), None)
    path.write_text('{"theme": 3}')
    prefs, warning = load_preferences(path)
    assert prefs == Preferences() and str(path) in warning
    path.write_text("[1, 2]")
    prefs, warning = load_preferences(path)
    assert prefs == Preferences() and "not a JSON object" in warning
    under_a_file = path / "preferences.json"
    assert "this run only" in save_preferences(Preferences(theme="nord"), under_a_file)
    assert "Could not read" in load_preferences(under_a_file)[1]


# -- a server that is not ours: unknown is "–", never zero, and never the profile's block size ---------


def rendered(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


@pytest.mark.asyncio
async def test_on_a_foreign_server_the_header_and_stats_show_unknown_figures_as_dashes(data_dir):
    """The demo profile asks for block 16; a server that is not ours (tests/foreign.py) runs whatever it
    runs and does not say: the header shows no block size, the stats no tau, acceptance, split, memory
    or cache reuse, and the answer's footer agrees with the header."""
    from dflash_tui.engines import EngineConfig, load_engine
    from tests.foreign import ForeignServer

    with ForeignServer() as server:
        engine = load_engine(EngineConfig(target="served", engine="remote", url=server.base))
        app = make_app("demo", engine)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            header = rendered(app, "#header-state")
            assert "block –" in header and "block 16" not in header, header
            before = rendered(app, "#stats-line")  # no turn yet: nothing measured, nothing to be measured
            assert "tau – (–) · block – · ctx 0 · draft – · peak –" in before, before
            await pilot.press("f7")  # no block size to cycle: the server runs its own
            await pilot.pause()
            assert any("launched with" in n.message for n in app._notifications)
            await send(pilot, "hello")
            header, panel, line = (rendered(app, s) for s in ("#header-state", "#stats-panel", "#stats-line"))
            footer = str(app.query("AnswerView").last().query_one(".answer-footer").render())
        engine.close()
    assert "block –" in header and "block 16" not in header, header
    assert "tau –   (session –)" in panel and "– (not reported)" in panel, panel
    assert "draft – · verify –" in panel and "peak – · context" in panel, panel
    assert "prompt – reused · – prefilled" in panel and "block – · thinking" in panel, panel
    assert "tau – (–) · block – · ctx" in line and "draft – · peak –" in line, line
    assert "tau – · block –" in footer and "6 tokens" in footer, footer
    assert "0.00" not in panel + line + footer and "0%" not in panel


@pytest.mark.asyncio
async def test_a_remote_chat_says_it_connects_to_the_server_not_that_it_loads_a_local_pair(data_dir):
    from dflash_tui.core.settings import profile_for, with_remote
    from dflash_tui.tui.app import DflashApp
    from tests.foreign import ForeignServer

    with ForeignServer() as server:
        app = DflashApp(profile=with_remote(profile_for("demo"), server.base), engine="remote", animate=False)
        async with app.run_test(size=SMALL) as pilot:
            await ready(pilot)
            assert app.load_error is None and app.engine.name == "remote"
            what = app.loading_what
            # an engine's stages: on the loading line while loading, a toast after
            app.loading = True
            app.show_stage("capturing CUDA graphs for block 16 (2 of 2)")
            line = str(app.chat.query_one("#loading-text").render())
            app.loading = False
            app.show_stage("capturing CUDA graphs for block 8 (2 of 2)")
            await pilot.pause()
            toasts = [n.message for n in app._notifications]
            app.engine.close()
    assert what == f"Connecting to {server.base} (model the first it lists)", what
    assert line == f"{what}: capturing CUDA graphs for block 16 (2 of 2)…", line
    assert "Capturing CUDA graphs for block 8 (2 of 2)…" in toasts, toasts
