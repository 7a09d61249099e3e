"""`dflash chat --plain`: scriptable with piped stdin, slash commands, colours, resume, and the
prompt-toolkit loop driven through a pipe input. Real engine on a random tiny pair."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflash_tui.core import sessions
from tests import tiny, waiting

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def profile(tmp_path, pairs):
    target, draft = pairs("qwen3")
    return tiny.write_profile(tmp_path / "tiny.toml", target, draft, max_new_tokens=16)


def run_plain(args, stdin_text, data_dir, extra_env=None):
    env = {**os.environ, "DFLASH_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "dflash_tui", "chat", *args], input=stdin_text.encode(),
                          capture_output=True, cwd=ROOT, env=env, timeout=300)


def test_piped_stdin_reads_prompts_line_by_line(profile, data_dir):
    script = "\n".join(["first question", "/thinking off", "/block 2", "/ghosts", "second question", "/stats",
                        "/bogus", "/new", "third question", "/block 20", "/quit", "never sent"]) + "\n"
    result = run_plain(["--profile", str(profile)], script, data_dir)
    err = result.stderr.decode()
    assert result.returncode == 0, err
    out = result.stdout.decode()
    assert "\033[" not in out  # not a terminal: no colour codes
    assert "thinking OFF" in err and "block size 2" in err and "ghosts on" in err
    assert "tau" in err and "x (measured)" in err and "unknown command /bogus" in err  # timed after each turn
    assert "Block size 20 is above the draft's trained block size 16; acceptance usually drops beyond it." in err
    assert err.count("tokens ·") == 3 + 1  # three answers, and /stats
    found = sorted(sessions.list_sessions(), key=lambda s: s.created)
    assert len(found) == 2  # /new started a second session
    all_turns = [t for s in found for t in s.turns]
    assert sorted(t["user"] for t in all_turns) == ["first question", "second question", "third question"]
    by_user = {t["user"]: t for t in all_turns}
    assert by_user["first question"]["settings"]["thinking"] is True
    assert by_user["second question"]["settings"]["thinking"] is False
    assert by_user["second question"]["settings"]["block_size"] == 2
    assert all(len(s["drafted"]) <= 1 for s in by_user["second question"]["steps"])
    assert "never sent" not in json.dumps([s.turns for s in found])


def test_a_chat_whose_session_cannot_be_written_ends_saying_so(profile, tmp_path):
    """DFLASH_DATA_DIR pointing at a file: each turn says it was not saved, and the last line does not name
    a session file that does not exist as if it did."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_plain(["--profile", str(profile)], "first question\n", blocker)
    err = result.stderr.decode()
    assert "not saved" in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("session ") and "was not saved" in last and "only on this screen" in last, last


def test_plain_resume_continues_the_session(profile, data_dir):
    first = run_plain(["--plain", "--profile", str(profile), "--no-thinking"], "remember this\n", data_dir)
    assert first.returncode == 0, first.stderr.decode()
    (session,) = sessions.list_sessions()
    again = run_plain(["--plain", "--resume", session.id[:12]], "and this\n", data_dir)
    assert again.returncode == 0, again.stderr.decode()
    assert f"resumed session {session.id} (1 turn)" in again.stderr.decode()
    turns = sessions.load_session(session.id).turns
    assert [t["user"] for t in turns] == ["remember this", "and this"]
    assert turns[1]["messages"][0] == {"role": "user", "content": "remember this"}
    assert turns[1]["settings"]["thinking"] is False  # the settings came back with the session


def test_colours_follow_origin_and_no_color(monkeypatch):
    from dflash_tui.core.terminal import color_enabled
    from dflash_tui.repl import ANSI, Repl

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert color_enabled(Tty()) and not color_enabled(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not color_enabled(Tty())
    monkeypatch.setenv("NO_COLOR", "")  # empty means unset (no-color.org)
    assert color_enabled(Tty())
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert color_enabled(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")  # NO_COLOR wins
    assert not color_enabled(io.StringIO())
    repl = Repl.__new__(Repl)
    repl.colour = True
    assert repl.paint("ab", "draft") == f"{ANSI['draft']}ab{ANSI['reset']}"
    assert repl.paint("\x1b[2J", "target") == f"{ANSI['target']}\u241b[2J{ANSI['reset']}"  # no raw escapes
    repl.colour = False
    assert repl.paint("ab", "draft") == "ab"


def test_interactive_loop_with_key_bindings(profile, data_dir, pairs):
    """prompt-toolkit on a pipe: ctrl+t toggles thinking, ctrl+j adds a line, enter sends, history file."""
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.core.settings import profile_for as load_profile
    from dflash_tui.engines import load_engine
    from dflash_tui.repl import Repl

    p = load_profile(str(profile))
    engine = load_engine(p.engine_config("cuda"))
    conv = Conversation(engine, ChatSettings.from_profile(p), profile=p)
    out, err = io.StringIO(), io.StringIO()
    repl = Repl(conv, out=out, err=err, colour=True)
    with create_pipe_input() as pipe:
        with create_app_session(input=pipe, output=DummyOutput()):
            pipe.send_text("\x14")  # ctrl+t: thinking off
            pipe.send_text("line one\nline two\r")  # ctrl+j (\n) inserts a newline; enter (\r) sends
            pipe.send_text("/quit\r")
            repl.run_interactive()
    assert conv.settings.thinking is False
    assert [t.user for t in conv.turns] == ["line one\nline two"]
    assert "\033[" in out.getvalue()  # coloured by origin
    history = (data_dir / "repl_history").read_text()
    assert "line one" in history and "/quit" in history
    assert "continues the last" not in err.getvalue()  # no session was saved before this one
    conv.close()
    # the next chat starts by saying how to pick that one up (issue 32, defect 9)
    fresh = Repl(Conversation(engine, ChatSettings.from_profile(p), profile=p), out=out, err=err)
    with create_pipe_input() as pipe:
        with create_app_session(input=pipe, output=DummyOutput()):
            pipe.send_text("/quit\r")
            fresh.run_interactive()
    assert "1 saved session: dflash chat --plain -c continues the last one" in err.getvalue()


def test_continue_and_resume_without_an_id_open_the_last_session_used(profile, data_dir):
    """Issue 32, build 6: `dflash chat -c` (`--continue`), or `--resume` without an id, continues the session
    used last (the picker's first row): the one whose file was written last, not the one created last."""
    from click.testing import CliRunner

    from dflash_tui.cli import main

    runner = CliRunner()
    none = runner.invoke(main, ["chat", "-c", "--plain", "--profile", str(profile)], input="hello\n")
    assert none.exit_code == 2 and "No session to continue" in none.output, none.output
    for prompt in ("first session", "second session"):
        started = runner.invoke(main, ["chat", "--plain", "--profile", str(profile)], input=f"{prompt}\n")
        assert started.exit_code == 0, started.output
    by_prompt = {s.turns[0]["user"]: s for s in sessions.list_sessions()}
    first, second = by_prompt["first session"], by_prompt["second session"]
    written = second.path.stat().st_mtime_ns
    os.utime(first.path, ns=(written + 10**9, written + 10**9))  # the first was written to after the second
    for args, prompt in ((["-c"], "continued"), (["--resume", "--plain"], "and again")):
        resumed = runner.invoke(main, ["chat", "--plain", *args], input=f"{prompt}\n")
        assert resumed.exit_code == 0 and f"resumed session {first.id}" in resumed.output, resumed.output
    assert [t["user"] for t in sessions.load_session(first.id).turns] == ["first session", "continued", "and again"]
    assert [t["user"] for t in sessions.load_session(second.id).turns] == ["second session"]
    both = runner.invoke(main, ["chat", "-c", "--resume", second.id, "--plain"], input="hello\n")
    assert both.exit_code == 2 and "give one of them" in both.output, both.output


def test_a_refused_long_prompt_gives_up_no_history(profile, data_dir):
    """The prompt that cannot fit is refused; the turns before it are still sent and still on file."""
    long_line = "word " * 700  # beyond the tiny target's 512 positions on its own
    result = run_plain(["--profile", str(profile)], f"first\n{long_line}\nsecond\n", data_dir)
    assert result.returncode == 0, result.stderr.decode()
    err = result.stderr.decode()
    assert "shorten it" in err and "no longer sent" not in err
    (path,) = sessions.session_paths()
    turns = sessions.read_session(path).turns
    assert [t["user"] for t in turns] == ["first", "second"]
    assert all(t.get("dropped_turns", 0) == 0 for t in turns)
    assert len(turns[1]["messages"]) == 3  # "first", its answer, then "second": nothing was dropped


def test_continue_goes_on_with_a_cancelled_answer(profile, data_dir):
    """ctrl+c stops an answer (here: the terminal cancels on its third write); the stopped answer is not
    history, /continue finishes it, and /help lists the command."""
    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.core.settings import profile_for as load_profile
    from dflash_tui.engines import load_engine
    from dflash_tui.repl import Repl

    class CancelsOnThirdWrite(io.StringIO):
        """The terminal of a user who presses ctrl+c once the first answer's third piece shows."""

        writes = 0

        def write(self, text):
            self.writes += 1
            if self.writes == 3:
                conv.last_request.cancel.set()
            return super().write(text)

    p = load_profile(str(profile))
    conv = Conversation(load_engine(p.engine_config("cuda")), ChatSettings.from_profile(p), profile=p)
    conv.settings.temperature = 0.0
    err = io.StringIO()
    repl = Repl(conv, out=CancelsOnThirdWrite(), err=err, colour=False)
    repl.handle("/continue")
    assert "no stopped answer" in err.getvalue()
    repl.handle("count to fifty")
    assert conv.turns[-1].status == "cancelled"
    assert "cancelled: not sent as history; /continue picks it up" in err.getvalue()
    repl.handle("/continue")
    assert [t.status for t in conv.turns] == ["cancelled", "completed"]
    assert conv.turns[1].answer.startswith(conv.turns[0].answer)
    repl.handle("/help")
    assert "/continue" in err.getvalue()
    conv.close()


def test_a_chat_started_with_target_and_draft_resumes_with_or_without_them(pairs, data_dir):
    target, draft = pairs("qwen3")
    pair = ["--target", str(target), "--draft", str(draft), "--max-new-tokens", "8"]
    first = run_plain(["--plain", *pair, "--no-thinking"], "remember this\n", data_dir)
    assert first.returncode == 0, first.stderr.decode()
    (session,) = sessions.list_sessions()
    again = run_plain(["--plain", "--resume", session.id], "and this\n", data_dir)  # (with the flags again: the same path)
    assert again.returncode == 0, again.stderr.decode()
    turns = sessions.load_session(session.id).turns
    assert [t["user"] for t in turns] == ["remember this", "and this"]
    assert [t["index"] for t in turns] == [0, 1]


def test_plain_chat_on_a_foreign_server_says_where_it_connects_and_shows_unknowns_as_dashes(data_dir):
    """`chat --plain --url` on a server that is not ours (tests/foreign.py): nothing local loads, so no
    "loading <target> + <draft>" line; tau, acceptance, block size and peak memory are "–", and so is
    what the session file shows of them."""
    from click.testing import CliRunner

    from dflash_tui.cli import main
    from tests.foreign import ForeignServer

    with ForeignServer() as server:
        result = CliRunner().invoke(main, ["chat", "--plain", "--url", server.base], input="hello\n/stats\n/block 4\n")
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert f"connecting to {server.base} (model the first it lists)…" in err
    assert "loading" not in err and "demo" not in err
    assert "Hello from a foreign server." in result.stdout
    assert "[6 tokens · " in err and "tau – · block –]" in err  # the line after the answer
    assert "tau – (session –) · acceptance –" in err and "peak – ·" in err  # /stats
    assert "block – · thinking" in err
    assert "runs the block size it was launched with" in err and "block size 4" not in err  # /block 4
    assert "0.00" not in err and "0 MB" not in err
    (session,) = sessions.list_sessions()
    summary = session.turns[0]["summary"]
    assert summary["mean_acceptance_length"] is None and summary["block_size"] is None
    assert session.turns[0]["settings"]["block_size"] is None  # not the profile's 16, which it never ran
    shown = CliRunner().invoke(main, ["sessions", "show", session.id])
    assert "_block – · thinking on · 6 tokens · " in shown.stdout and " · tau –_" in shown.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal (termios)")
def test_ctrl_c_stops_an_answer_without_a_caret_c_in_its_text_and_stats_show_the_tui_speedup(profile, data_dir,
                                                                                              monkeypatch):
    """Issue 32: ctrl+c in a terminal stopped the answer but the terminal echoed `^C` into its text
    (`98, 62, 4^C7`). A real pseudo-terminal: its line discipline gets ctrl+c (and a key typed ahead) while
    the answer streams and echoes neither; its modes are back after. /stats gives the TUI's speedup."""
    import pty
    import select
    import termios

    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.core.settings import profile_for as load_profile
    from dflash_tui.engines import load_engine
    from dflash_tui.repl import Repl

    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "r")
    monkeypatch.setattr(sys, "stdin", terminal)
    modes = termios.tcgetattr(slave)
    assert modes[3] & termios.ECHOCTL and modes[3] & termios.ECHO  # a terminal as a shell leaves it

    def read_until(fd, wanted: bytes) -> bytes:
        got, end = b"", waiting.limit(60)
        while wanted not in got:
            ready, _, _ = select.select([fd], [], [], end)
            assert ready, f"{wanted!r} never came: {got!r}"
            got += os.read(fd, 1024)
        return got

    class PressesCtrlC(io.StringIO):
        """The person presses ctrl+c (and types a key ahead) once the answer's third piece shows."""

        writes = 0

        def write(self, text):
            self.writes += 1
            if self.writes == 3:
                os.write(master, b"\x03q\n")
                read_until(slave, b"q\n")  # the line discipline has taken the ctrl+c before it
                conv.last_request.cancel.set()  # what the REPL's SIGINT handler does
            return super().write(text)

    p = load_profile(str(profile))
    conv = Conversation(load_engine(p.engine_config("cuda")), ChatSettings.from_profile(p), profile=p)
    err = io.StringIO()
    repl = Repl(conv, out=PressesCtrlC(), err=err, colour=False)
    try:
        repl.handle("count to fifty")
        assert conv.turns[-1].status == "cancelled"
        assert termios.tcgetattr(slave) == modes  # restored once the answer stopped
        os.write(master, b"z")
        echoed = read_until(master, b"z")  # echo is back on: everything echoed before it is in `echoed`
        assert b"^C" not in echoed and b"q" not in echoed, echoed
        repl.handle("/stats")
        speed, kind = conv.summary_speedup(conv.turns[-1].summary)
        assert kind == "measured" and f"speedup ≈{speed:.1f}x (measured)" in err.getvalue()
    finally:
        conv.close()
        terminal.close()
        os.close(master)


def test_rename_titles_the_open_session_in_order_with_its_turns_and_alone_clears_it(engine, data_dir):
    """Issue 32, build 6: /rename writes through the chat's own writer; before any answer there is none."""
    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.repl import Repl

    conv = Conversation(engine, ChatSettings(max_new_tokens=4, thinking=False))
    err = io.StringIO()
    Repl(conv, out=io.StringIO(), err=err, colour=False).run_piped(io.StringIO(
        "/rename too early\nfirst\n/rename  Sums \x1b and carries\nsecond\n/help\n"))
    conv.close()
    assert "There is no session to rename yet" in err.getvalue() and "/rename TEXT" in err.getvalue()
    assert "Session renamed 'Sums ␛ and carries'." in err.getvalue()
    session = sessions.load_session(conv.session_id)
    assert session.title == "Sums ␛ and carries" and [t["user"] for t in session.turns] == ["first", "second"]
    types = [json.loads(line)["type"] for line in session.path.read_text().splitlines()]
    assert types == ["header", "prompt", "turn", "title", "prompt", "turn"]  # each prompt on disk before its answer
    again = Conversation(engine, ChatSettings(max_new_tokens=4, thinking=False))
    again.restore(session)
    Repl(again, out=io.StringIO(), err=err, colour=False).run_piped(io.StringIO("/rename\n"))
    again.close()
    assert "Session title cleared" in err.getvalue() and sessions.load_session(session.id).title == "first"


class Terminal:
    """A real pseudo-terminal for the REPL, run in this process: it reads keys from the slave end (sys.stdin
    and prompt-toolkit's input), and `person` types on the master end as someone who waits for the screen
    does: when a text has shown up and the prompt reads keys (prompt-toolkit's raw mode, ISIG off), so that a
    ctrl+c reaches the prompt and not the signal. A run that hangs (the defects did) is ended at the limit
    by closing the master end, which the REPL reads as the end of input."""

    def __init__(self, monkeypatch):
        import pty

        self.master, slave = pty.openpty()
        self.slave = os.fdopen(slave, "r")
        monkeypatch.setattr(sys, "stdin", self.slave)
        self.out, self.err = Shown(), Shown()
        self.ended = False
        self.closing = threading.Lock()

    def reading(self) -> bool:
        import termios

        return not termios.tcgetattr(self.slave.fileno())[3] & termios.ISIG

    def person(self, *steps: tuple[str, bytes]):
        """A thread that types each step's keys once its text is in the output and the prompt reads keys."""
        def run():
            end = time.monotonic() + waiting.limit(120)
            for text, keys in steps:
                while not (text in self.out.getvalue() + self.err.getvalue() and self.reading()):
                    if time.monotonic() > end or self.ended:
                        return self.close()
                    time.sleep(0.02)
                os.write(self.master, keys)
            while time.monotonic() < end and not self.ended:  # the REPL should end by itself now
                time.sleep(0.02)
            self.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        with self.closing:
            if not self.ended:
                self.ended = True
                os.close(self.master)

    def app_session(self):
        from prompt_toolkit.application import create_app_session
        from prompt_toolkit.input import create_input
        from prompt_toolkit.output import DummyOutput

        return create_app_session(input=create_input(self.slave), output=DummyOutput())


class Shown(io.StringIO):
    """A terminal's output as the REPL writes it (a terminal: /copy and the interactive loop need one)."""

    on_write = None

    def isatty(self):
        return True

    def write(self, text):
        written = super().write(text)
        if self.on_write is not None:
            self.on_write(text)
        return written


def test_keys_typed_while_an_answer_streams_reach_the_next_prompt_as_typed(engine, data_dir, monkeypatch):
    """Issue 46: enter typed while an answer streamed became a new line (the terminal turned it into ctrl+j),
    so `/stats` enter `/ghosts` enter waited as one message of two lines, then an unknown command."""
    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.repl import Repl

    terminal = Terminal(monkeypatch)
    conv = Conversation(engine, ChatSettings(max_new_tokens=16, thinking=False))
    repl = Repl(conv, out=terminal.out, err=terminal.err, colour=False)

    def types_ahead(text):  # the answer's first piece is on screen: the person types ahead
        terminal.out.on_write = None
        os.write(terminal.master, b"/stats\r/ghosts\r/quit\r")

    terminal.out.on_write = types_ahead
    terminal.person(("dflash ·", b"count to ten\r"))
    try:
        with terminal.app_session():
            repl.run_interactive()
    finally:
        conv.close()
        terminal.close()
    err = terminal.err.getvalue()
    assert [t.user for t in conv.turns] == ["count to ten"]
    assert "unknown command" not in err and "ghosts on" in err and "(session" in err, err  # /stats' tau line
    assert repl.quit  # by /quit, typed ahead too


def test_ctrl_c_twice_quits_with_the_session_line_and_ctrl_d_deletes_forward(engine, profile, data_dir, monkeypatch):
    """Issue 46: `-c` did not show the turns it continues; one ctrl+c at an empty prompt did not say that a
    second quits (nor did a second quit, with the session line); ctrl+d with the cursor at the start of a
    line did nothing (prompt-toolkit deletes only with text before the cursor, readline the one under it).
    A ctrl+c with text drops the line, as a shell does, and does not count toward quitting."""
    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.repl import Repl, run_repl

    earlier = Conversation(engine, ChatSettings(max_new_tokens=4, thinking=False))
    Repl(earlier, out=io.StringIO(), err=io.StringIO(), colour=False).run_piped(io.StringIO("first question\n"
                                                                                           "second question\n"))
    earlier.close()
    monkeypatch.setenv("NO_COLOR", "1")
    terminal = Terminal(monkeypatch)
    terminal.person(("you> second question", b"x/ghosts\x01\x04\r"),  # ctrl+a, ctrl+d: /ghosts
                    ("ghosts on", b"abc\x03/ghosts\r"),  # the line dropped, then the next one read
                    ("ghosts off", b"\x03"),
                    ("ctrl+c again quits", b"\x03"))
    try:
        with terminal.app_session():
            code = run_repl(str(profile), session=sessions.load_session(earlier.session_id), stdin=terminal.slave,
                            out=terminal.out, err=terminal.err)
    finally:
        terminal.close()
    out, err = terminal.out.getvalue(), terminal.err.getvalue()
    assert code == 0 and "you> first question" in out and "you> second question" in out, out
    assert err.count("ctrl+c again quits") == 1, err
    assert err.rstrip().splitlines()[-1].startswith(f"session {earlier.session_id}"), err
    assert [t["user"] for t in sessions.load_session(earlier.session_id).turns] == ["first question",
                                                                                    "second question"]


def test_the_tuis_commands_in_the_repl_temperature_sessions_export_copy(engine, data_dir, tmp_path):
    """Issue 46: the REPL had no /temperature, /sessions, /export or /copy. Each goes through the code the TUI
    uses: the palette's reading of a typed setting (/top_k too), the picker's order and resume, the one export
    writer (0600; the exports folder 0700), and the OSC 52 copy of the last answer without its thinking."""
    import base64
    import stat

    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.repl import Repl

    other = Conversation(engine, ChatSettings(max_new_tokens=4, thinking=False))
    Repl(other, out=io.StringIO(), err=io.StringIO(), colour=False).run_piped(io.StringIO("an older question\n"))
    other.close()
    conv = Conversation(engine, ChatSettings(max_new_tokens=4, thinking=False))
    out, err = Shown(), io.StringIO()
    mine = tmp_path / "mine.json"
    Repl(conv, out=out, err=err, colour=False).run_piped(io.StringIO(
        "/export\n/temperature 0.3\n/top_k 20\n/top_k many\nfirst\n/temperature -1\n/temperature\n/copy\n/export\n"
        f"/export json {mine}\n/sessions\n/sessions {other.session_id[-4:]}\nafter resuming\n"))
    conv.close()
    said = err.getvalue()
    assert "There is no session to export yet" in said and "unknown command" not in said, said
    (first,) = [s for s in sessions.list_sessions() if s.turns[0]["user"] == "first"]  # the one /sessions left
    assert first.turns[0]["settings"]["temperature"] == 0.3 and "From the next turn: temperature 0.3." in said
    assert first.turns[0]["settings"]["top_k"] == 20 and "top_k takes a whole number or default" in said
    assert "Temperature -1.0 is outside" in said and "temperature 0.3 now; /temperature 0.7 (0 is greedy) sets it" in said
    answer = first.turns[0]["answer"]
    assert f"\033]52;c;{base64.b64encode(answer.encode()).decode()}\a" in out.getvalue()
    assert f"Copied the answer ({len(answer)} characters)." in said
    exported = data_dir / "exports" / f"{first.id}.md"
    assert f"Exported to {exported}" in said and f"Exported to {mine}" in said
    assert "first" in exported.read_text() and json.loads(mine.read_text())["id"] == first.id
    assert [stat.S_IMODE(p.stat().st_mode) for p in (exported, mine, exported.parent)] == [0o600, 0o600, 0o700]
    listing = said[said.index("id "):]  # the open session first (last used), marked
    assert listing.index(f"{first.id} ●") < listing.index(other.session_id)
    assert f"resumed session {other.session_id} (1 turn)" in said and "you> an older question" in out.getvalue()
    assert [t["user"] for t in sessions.load_session(other.session_id).turns] == ["an older question", "after resuming"]


def test_json_constrains_the_next_turns_and_the_session_replays_them_constrained(engine, data_dir, tmp_path):
    """/json FILE (issue 45): the next answers are JSON matching the schema (a random tiny target: the enum
    forces the whole object), each turn records its constraint, a replay of the turn at another block size
    gives the recorded ids, /json off frees the next turn, and a missing file is one sentence."""
    pytest.importorskip("llguidance")
    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.measure.replay import recorded_turns
    from dflash_tui.repl import Repl

    schema = tmp_path / "pick.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"pick": {"enum": ["left", "right"]}},
                                  "required": ["pick"]}))
    conv = Conversation(engine, ChatSettings(max_new_tokens=40, thinking=False))
    err = io.StringIO()
    Repl(conv, out=Shown(), err=err, colour=False).run_piped(io.StringIO(
        f"/json {tmp_path / 'missing.json'}\n/json {schema}\n/json\nwhich way?\n/json off\nand now?\n"))
    conv.close()
    said = err.getvalue()
    assert "The schema file" in said and "cannot be read" in said
    assert f"answers are JSON matching {schema}" in said and "answers follow the schema" in said
    session = sessions.load_session(conv.session_id)
    constrained, free = session.turns
    assert json.loads(constrained["answer"])["pick"] in ("left", "right")
    assert constrained["settings"]["constraint"]["value"]["properties"]["pick"]["enum"] == ["left", "right"]
    assert free["settings"]["constraint"] is None
    turn = recorded_turns(session)[0]
    list(engine.generate(turn.request(block_size=1)))
    assert engine.last_summary.token_ids == turn.recorded_ids
