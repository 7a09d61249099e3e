"""Issue 43, section 3: nothing a user or a checkpoint controls reaches the terminal raw. One layer
(engines/text.py `printable`, re-exported by core/terminal.py) shows control characters (C0, C1, ESC, so
OSC and CSI sequences) and the bidirectional formatting characters as visible escapes; every printer of such
text goes through it: `sessions list/show`, `profile list/show`, doctor's PATH folder and a checkpoint's
config, and shell completion (zsh, bash, fish) through click's real completion protocol."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import sessions
from dflash_tui.core.terminal import json_text, one_line, printable

OSC_TITLE = "\x1b]0;pwned\x07"  # sets the window title
OSC_CLIPBOARD = "\x1b]52;c;ZWNobyBvd25lZA==\x1b\\"  # writes the clipboard
CSI = "\x9b31m"  # 8-bit CSI
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
HOSTILE = f"look{OSC_TITLE}here{OSC_CLIPBOARD}{CSI}{BIDI}\x07\x7fend"
# what may never reach a terminal raw: C0 but newline and tab, DEL, C1, the bidirectional controls
FORBIDDEN = {chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in (0x09, 0x0A)} | set(BIDI)


def raw_in(text: str) -> set[str]:
    return {c for c in text if c in FORBIDDEN}


def test_the_one_layer_shows_every_control_and_bidi_character_as_a_visible_escape():
    shown = printable(HOSTILE)
    assert not raw_in(shown)
    assert "<U+202E>" in shown and "<U+2066>" in shown and "<U+061C>" in shown and "␛]0;pwned␇" in shown
    assert printable(shown) == shown  # idempotent: escaping twice changes nothing
    assert "\n" not in one_line("a\nb\tc") and one_line("a\nb\tc") == "a b c"
    # JSON for a terminal keeps its meaning (the escapes are JSON's own) and carries nothing raw
    assert not raw_in(json_text({"t": HOSTILE})) and json.loads(json_text({"t": HOSTILE})) == {"t": HOSTILE}


def _hostile_session() -> str:
    """A session whose first prompt and whose title (a record in the file, as any editor could leave it)
    carry every kind of hostile character."""
    writer = sessions.SessionWriter({"created": "2026-01-01T12:00:00+00:00", "profile": {"name": "tiny"},
                                     "engine": "cuda", "device": "cpu", "dtype": "float32", "target": "t",
                                     "draft": "d"}, session_id="20260101-120000-evil")
    writer.append_turn({"index": 0, "status": "completed", "user": HOSTILE, "answer": HOSTILE,
                        "settings": {"block_size": 4}, "prompt_ids": [1], "emitted_ids": [2], "steps": [],
                        "summary": {"generated_tokens": 1}})
    writer.close()
    return writer.id


def _titled(session_id: str) -> None:
    path = sessions.resolve(session_id)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"type": "title", "title": "T" + HOSTILE}) + "\n")


SHELLS = {
    # shell: (environment of click's completion protocol for `dflash WORDS...<TAB>`)
    "zsh": lambda words: {"COMP_WORDS": " ".join(words), "COMP_CWORD": str(len(words) - 1)},
    "bash": lambda words: {"COMP_WORDS": " ".join(words), "COMP_CWORD": str(len(words) - 1)},
    "fish": lambda words: {"COMP_WORDS": " ".join(words), "COMP_CWORD": words[-1]},
}


def complete(shell: str, words: list[str]) -> str:
    env = {"_DFLASH_COMPLETE": f"{shell}_complete", **SHELLS[shell](words)}
    result = CliRunner().invoke(main, [], prog_name="dflash", env=env)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("titled", [False, True], ids=["first-prompt", "title"])
def test_session_text_is_escaped_in_every_printer_and_every_shells_completion(data_dir, titled):
    session_id = _hostile_session()
    if titled:
        _titled(session_id)
    runner = CliRunner()
    for args in (["sessions", "list"], ["sessions", "show", session_id], ["sessions", "export", session_id, "--format", "json"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0 or (titled and result.exit_code == 2), result.output
        assert not raw_in(result.output), (args, result.output)
        # the reader refuses a title record with control characters (named, escaped); a first prompt shows
        assert titled or "<U+202A>" in result.output or "\\u202a" in result.output
    for shell in SHELLS:
        for words in (["dflash", "sessions", "show", ""], ["dflash", "chat", "--resume", ""]):
            out = complete(shell, words)
            assert not raw_in(out), (shell, words, out)
            assert titled or session_id in out, (shell, words, out)
            if shell != "bash" and not titled:  # bash's protocol has no descriptions
                assert "<U+202A>" in out  # the description is there, escaped
            if shell == "zsh":  # zsh reads (type, value, description) triples, one per line
                assert len(out.strip("\n").splitlines()) % 3 == 0


def test_profile_fields_are_escaped_in_list_show_and_completion(config_dir):
    folder = config_dir / "profiles"
    folder.mkdir(parents=True)
    (folder / "evil.toml").write_text(f'name = "evil"\ndescription = "{json.dumps(HOSTILE)[1:-1]}"\n'
                                      '[model]\ntarget = "Qwen/Qwen3-8B"\n', encoding="utf-8")
    (folder / "rtl.toml").write_text('name = "rtl"\ndescription = "abc\u202edef"\n[model]\ntarget = "Qwen/Qwen3-8B"\n',
                                     encoding="utf-8")
    runner = CliRunner()
    for args in (["profile", "list"], ["profile", "show", str(folder / "evil.toml")],
                 ["profile", "show", str(folder / "rtl.toml")]):
        result = runner.invoke(main, args)
        assert not raw_in(result.output), (args, result.output)
    for shell in SHELLS:
        for words in (["dflash", "generate", "--profile", ""], ["dflash", "doctor", "--profile", ""]):
            out = complete(shell, words)
            assert "demo" in out and not raw_in(out), (shell, out)


def test_doctor_escapes_its_path_folder_and_a_checkpoints_config(tmp_path, monkeypatch):
    folder = tmp_path / f"bin{OSC_TITLE}{BIDI}"
    folder.mkdir()
    launcher = folder / "dflash"
    launcher.write_text("#!/bin/sh\nexec other-thing\n")
    launcher.chmod(0o755)
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "qwen3" + HOSTILE, "sliding_window": 8}))
    profile = tmp_path / "p.toml"
    profile.write_text(f'name = "p"\ndescription = "x"\n[model]\ntarget = "{target}"\n', encoding="utf-8")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    result = CliRunner().invoke(main, ["doctor", "--profile", str(profile)])
    assert "dflash command" in result.output and "␛]0;pwned␇" in result.output
    assert "model type qwen3" in result.output
    assert not raw_in(result.output), result.output
    assert stat.S_ISREG(launcher.stat().st_mode)


def test_completion_candidates_and_descriptions_never_carry_a_line_break(data_dir):
    writer = sessions.SessionWriter({"profile": {"name": "tiny"}}, session_id="20260101-120000-line")
    writer.append_turn({"index": 0, "status": "completed", "user": "first\u2028second\u0085third", "answer": "a",
                        "settings": {}, "prompt_ids": [1], "emitted_ids": [2], "steps": [], "summary": {}})
    writer.close()
    out = complete("zsh", ["dflash", "sessions", "show", ""])
    assert len(out.strip("\n").splitlines()) == 3 and not raw_in(out)
    assert Path(sessions.resolve(writer.id)).exists()


@pytest.mark.asyncio
async def test_the_tuis_session_list_shows_titles_escaped_and_never_as_markup(data_dir):
    from textual.app import App
    from textual.widgets import DataTable

    from dflash_tui.tui.screens import SessionsScreen

    _hostile_session()
    writer = sessions.SessionWriter({"profile": {"name": "[b]p"}}, session_id="20260101-120000-mark")
    writer.append_turn({"index": 0, "status": "completed", "user": "[red]red[/red] [link=http://x]y[/link]",
                        "answer": "a", "settings": {}, "prompt_ids": [1], "emitted_ids": [2], "steps": [],
                        "summary": {}})
    writer.close()
    app = App()
    async with app.run_test(size=(160, 30)) as pilot:
        await app.push_screen(SessionsScreen())
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        cells = [str(getattr(cell, "plain", cell)) for row in range(table.row_count) for cell in table.get_row_at(row)]
    shown = " ".join(cells)
    assert not raw_in(shown) and "<U+202A>" in shown
    assert "[red]red[/red]" in shown and "[b]p" in shown  # text, not markup


def test_a_right_to_left_system_prompt_still_loads_and_shows_escaped(config_dir):
    from dflash_tui.core.profiles import load_profile

    path = config_dir / "rtl.toml"
    config_dir.mkdir(parents=True, exist_ok=True)
    path.write_text('name = "rtl"\ndescription = "d"\n[model]\ntarget = "Qwen/Qwen3-8B"\n'
                    '[generation]\nsystem_prompt = "\u200fمرحبا\u200f"\n', encoding="utf-8")
    assert load_profile(str(path)).system_prompt == "\u200fمرحبا\u200f"  # the model gets the text as written
    shown = CliRunner().invoke(main, ["profile", "show", str(path)]).output
    assert "<U+200F>مرحبا<U+200F>" in shown and not raw_in(shown)


def test_a_session_whose_paths_have_bidirectional_marks_reads_back(data_dir):
    writer = sessions.SessionWriter({"profile": {"name": "p"}, "engine": "cuda", "device": "cpu", "dtype": "float32",
                                     "target": "/models/\u200fنموذج", "draft": "d"}, session_id="20260101-120000-rtlp")
    writer.append_turn({"index": 0, "status": "completed", "user": "q", "answer": "a", "settings": {},
                        "prompt_ids": [1], "emitted_ids": [2], "steps": [], "summary": {}})
    writer.close()
    assert sessions.load_session(writer.id).header["target"] == "/models/\u200fنموذج"  # dflash reads what it wrote
    shown = CliRunner().invoke(main, ["sessions", "show", writer.id]).output
    assert not raw_in(shown)
