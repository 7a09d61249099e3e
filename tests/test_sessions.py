"""Sessions: append-only JSONL, fsync per turn, 0600, torn last line skipped, SIGKILL loses at most the
answer in flight, and the `dflash sessions` commands."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.core import sessions
from dflash_tui.engines.errors import UserError
from tests import tiny, waiting

ROOT = Path(__file__).resolve().parents[1]


def write(session_id="20260101-120000-abcd", turns=2, created="2026-01-01T12:00:00+00:00"):
    writer = sessions.SessionWriter({"created": created, "profile": {"name": "tiny"}, "engine": "cuda",
                                     "device": "cpu", "dtype": "float32", "target": "t", "draft": "d"},
                                    session_id=session_id)
    for n in range(turns):
        writer.append_turn({"index": n, "status": "completed" if n % 2 == 0 else "cancelled", "user": f"q{n}",
                            "answer": f"a{n}", "settings": {"block_size": 4, "thinking": n % 2 == 0},
                            "prompt_ids": [1, 2], "emitted_ids": [3], "steps": [{"drafted": [4, 5, 6], "accepted": 1}],
                            "summary": {"generated_tokens": 1, "decode_tokens_per_s": 10.0,
                                        "mean_acceptance_length": 2.0, "acceptance_lengths": [2]}})
    writer.close()
    return writer


def test_file_is_created_with_the_first_turn_mode_0600(data_dir):
    writer = sessions.SessionWriter({"profile": {"name": "x"}})
    assert not writer.path.exists()  # nothing sent, nothing left behind
    write(writer.id, turns=1)
    mode = stat.S_IMODE(writer.path.stat().st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(writer.path.parent.stat().st_mode) == 0o700
    lines = writer.path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["type"] == "header" and header["format"] == sessions.FORMAT_VERSION and header["id"] == writer.id
    assert json.loads(lines[1])["type"] == "turn"


def test_data_dir_override_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "x"))
    assert sessions.sessions_dir() == tmp_path / "x" / "sessions"
    monkeypatch.delenv("DFLASH_DATA_DIR")
    assert sessions.data_dir().name == "dflash"


def test_read_back_and_history(data_dir):
    writer = write(turns=2)
    session = sessions.load_session(writer.id)
    assert session.warnings == []
    assert [t["status"] for t in session.turns] == ["completed", "cancelled"]
    assert session.history()[1] == {"user": "q1", "answer": "a1", "status": "cancelled", "thinking": False,
                                    "summary": session.turns[1]["summary"], "prompt_ids": [1, 2], "emitted_ids": [3],
                                    "continues": None}
    assert session.last_settings() == {"block_size": 4, "thinking": False}
    assert session.title == "q0" and session.profile_name == "tiny"


def test_torn_last_line_is_skipped_with_a_warning_and_appending_continues(data_dir):
    writer = write(turns=2)
    with open(writer.path, "ab") as f:
        f.write(b'{"type":"turn","index":2,"status":"comp')  # the process died mid-write
    session = sessions.load_session(writer.id)
    assert len(session.turns) == 2
    assert len(session.warnings) == 1 and "incomplete" in session.warnings[0]
    # resuming first cuts the torn fragment (it never merges with the next record), then appends
    complete = writer.path.read_bytes().rsplit(b"\n", 1)[0] + b"\n"
    resumed = sessions.SessionWriter.resume(session)
    assert resumed.append_turn({"index": 2, "status": "completed", "user": "q2", "answer": "a2", "settings": {}})
    resumed.close()
    again = sessions.load_session(writer.id)
    assert [t["user"] for t in again.turns] == ["q0", "q1", "q2"] and again.warnings == []
    assert writer.path.read_bytes().startswith(complete)  # nothing before the torn line was touched


def test_a_session_deleted_while_in_use_starts_again_with_its_header(data_dir):
    writer = sessions.SessionWriter.resume(sessions.load_session(write(turns=1).id))
    with pytest.raises(UserError, match="is the chat open here; start a new session or resume another"):
        sessions.delete_session(sessions.resolve_own(writer.id))  # dflash itself refuses
    writer.path.unlink()  # someone removed it by hand
    writer.append_turn({"status": "completed", "user": "after", "answer": "x", "settings": {}})
    session = sessions.load_session(writer.id)
    assert session.header["id"] == writer.id and [t["user"] for t in session.turns] == ["after"]


def test_ids_resolve_by_prefix_and_unknown_ids_are_one_sentence(data_dir):
    write("20260101-120000-abcd", turns=1)
    write("20260101-130000-ef01", turns=1)
    assert sessions.resolve("20260101-13").stem == "20260101-130000-ef01"
    with pytest.raises(UserError, match="matches 2 sessions"):
        sessions.resolve("20260101")
    with pytest.raises(UserError, match="No session 'nope'"):
        sessions.resolve("nope")


def test_list_newest_first_and_delete(data_dir):
    write("20260101-120000-aaaa", turns=1, created="2026-01-01T12:00:00+00:00")
    write("20260102-120000-bbbb", turns=3, created="2026-01-02T12:00:00+00:00")
    found = sessions.list_sessions()
    assert [s.id for s in found] == ["20260102-120000-bbbb", "20260101-120000-aaaa"]
    sessions.delete_session(sessions.resolve_own("20260101-120000-aaaa"))
    assert [s.id for s in sessions.list_sessions()] == ["20260102-120000-bbbb"]
    assert sessions.deletion_text(sessions.resolve_own("20260102-120000-bbbb")) == \
        'session 20260102-120000-bbbb (3 turns, "q0")'


def test_sessions_cli(data_dir, tmp_path):
    from dflash_tui.cli import main

    write("20260101-120000-abcd", turns=2)
    runner = CliRunner()
    listed = runner.invoke(main, ["sessions", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert rows[0]["id"] == "20260101-120000-abcd" and rows[0]["turns"] == 2
    plain = runner.invoke(main, ["sessions", "list"])
    assert "20260101-120000-abcd" in plain.output and "q0" in plain.output
    shown = runner.invoke(main, ["sessions", "show", "20260101-120000-abcd"])
    assert shown.exit_code == 0 and "## Turn 2" in shown.output and "(cancelled)" in shown.output
    md = runner.invoke(main, ["sessions", "export", "20260101", "--format", "md"])
    assert md.exit_code == 0 and md.output.startswith("# dflash session 20260101-120000-abcd")
    out = tmp_path / "s.json"
    js = runner.invoke(main, ["sessions", "export", "20260101-120000-abcd", "--format", "json", "-o", str(out)])
    assert js.exit_code == 0
    exported = json.loads(out.read_text())
    assert exported["header"]["profile"]["name"] == "tiny" and len(exported["turns"]) == 2
    for args in (["sessions", "show", "nope"], ["sessions", "export", "nope"], ["sessions", "delete", "nope"],
                 ["chat", "--resume", "nope"]):
        bad = runner.invoke(main, args)
        assert bad.exit_code == 2, args
        assert "No session 'nope'" in bad.output and len(bad.output.strip().splitlines()) == 1
    deleted = runner.invoke(main, ["sessions", "delete", "20260101-120000-abcd", "--yes"])
    assert deleted.exit_code == 0 and not list((data_dir / "sessions").glob("*.jsonl"))


# -- the real thing: a `dflash chat --plain` process killed with SIGKILL mid-answer ----------------


def _reader(stream, out: queue.Queue):
    for chunk in iter(lambda: stream.read1(256), b""):
        out.put(chunk)
    out.put(None)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_mid_answer_loses_at_most_that_answer(pairs, tmp_path, data_dir):
    target, draft = pairs("qwen3")
    profile = tiny.write_profile(tmp_path / "tiny.toml", target, draft, max_new_tokens=450)
    env = {**os.environ, "DFLASH_DATA_DIR": str(data_dir), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dflash_tui", "chat", "--plain", "--profile", str(profile),
                             "--block-size", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    out_q: queue.Queue = queue.Queue()
    err_q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, out_q), daemon=True).start()
    threading.Thread(target=_reader, args=(proc.stderr, err_q), daemon=True).start()

    def wait_err(text):
        seen, end = b"", time.monotonic() + waiting.limit()
        while text.encode() not in seen:
            chunk = err_q.get(timeout=max(0.1, end - time.monotonic()))
            assert chunk is not None, seen.decode(errors="replace")
            seen += chunk
        return seen

    try:
        proc.stdin.write(b"first question\n")
        proc.stdin.flush()
        wait_err("tokens ·")  # the first answer is complete (and recorded)
        while not out_q.empty():
            out_q.get()
        proc.stdin.write(b"/stats\n")  # a command between turns is fine too
        proc.stdin.write(b"second question that will be cut\n")
        proc.stdin.flush()
        chunk = out_q.get(timeout=waiting.limit())  # text of the second answer (up to 450 tokens) is streaming
        assert chunk
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    files = list((data_dir / "sessions").glob("*.jsonl"))
    assert len(files) == 1
    session = sessions.read_session(files[0])
    assert session.warnings == []
    # the prompt was on disk before its answer began: it is an interrupted turn, not lost
    assert [t["user"] for t in session.turns] == ["first question", "second question that will be cut"]
    assert session.turns[0]["status"] == "completed" and session.turns[0]["emitted_ids"]
    cut = session.turns[1]
    assert cut["status"] == "cancelled" and cut["interrupted"] and cut["prompt_ids"] and cut["emitted_ids"] == []
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    # resumed (by the id's last 4 characters), /continue picks the interrupted turn up
    resumed = subprocess.run([sys.executable, "-m", "dflash_tui", "chat", "--plain", "--profile", str(profile),
                              "--block-size", "1", "--max-new-tokens", "8", "--resume", session.id[-4:]],
                             input=b"/continue\n", capture_output=True, cwd=ROOT, env=env, timeout=waiting.limit())
    assert resumed.returncode == 0, resumed.stderr.decode(errors="replace")
    assert b"resumed session" in resumed.stderr and b"/continue picks it up" not in resumed.stderr
    after = sessions.read_session(files[0])
    assert [t.get("continues") for t in after.turns] == [None, None, 1]
    assert after.turns[2]["user"] == "second question that will be cut" and after.turns[2]["status"] == "completed"


# -- faults: a full disk, a second writer, a hostile umask -----------------------------------------


def _turn(n: int) -> dict:
    return {"index": n, "status": "completed", "user": f"q{n}", "answer": f"a{n}", "settings": {}}


def test_a_full_disk_loses_no_turn_and_never_tears_the_file(data_dir, monkeypatch):
    """A fault-injecting os.write: half of the data lands, then ENOSPC (what a full disk does)."""
    writer = sessions.SessionWriter({"profile": {"name": "tiny"}}, session_id="20260101-120000-disk")
    assert writer.append_turn(_turn(0))
    before = writer.path.read_bytes()
    real_write = os.write

    def full_disk(fd, data):
        if len(data) > 8:
            real_write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sessions.os, "write", full_disk)
    assert not writer.append_turn(_turn(1))
    assert writer.error == "disk full" and writer.pending
    torn = sessions.load_session(writer.id)
    assert [t["user"] for t in torn.turns] == ["q0"] and "incomplete" in torn.warnings[0]
    monkeypatch.setattr(sessions.os, "write", real_write)
    assert writer.append_turn(_turn(2))  # the retry cuts the torn tail, then writes turn 1 and turn 2
    writer.close()
    again = sessions.load_session(writer.id)
    assert [t["user"] for t in again.turns] == ["q0", "q1", "q2"] and again.warnings == []
    assert writer.path.read_bytes().startswith(before)


def test_a_short_write_is_finished_not_left_torn(data_dir, monkeypatch):
    writer = sessions.SessionWriter({"profile": {"name": "tiny"}}, session_id="20260101-120000-shrt")
    real_write = os.write
    monkeypatch.setattr(sessions.os, "write", lambda fd, data: real_write(fd, data[:7]))  # 7 bytes at a time
    assert writer.append_turn(_turn(0))
    writer.close()
    assert [t["user"] for t in sessions.load_session(writer.id).turns] == ["q0"]


def test_the_repl_keeps_going_on_a_full_disk_and_saves_the_turn_later(data_dir, pairs, tmp_path, monkeypatch):
    from dflash_tui.repl import run_repl

    target, draft = pairs("qwen3")
    profile = tiny.write_profile(tmp_path / "tiny.toml", target, draft, max_new_tokens=8)
    calls = {"n": 0}
    real_append = sessions.SessionWriter._append

    def second_write_fails(self, records):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real_append(self, records)

    monkeypatch.setattr(sessions.SessionWriter, "_append", second_write_fails)
    out, err = io.StringIO(), io.StringIO()
    code = run_repl(str(profile), stdin=io.StringIO("one\ntwo\nthree\n"), out=out, err=err)
    assert code == 0, err.getvalue()
    assert err.getvalue().count("not saved: disk full") == 1
    (path,) = sessions.session_paths()
    assert [t["user"] for t in sessions.read_session(path).turns] == ["one", "two", "three"]


def test_a_second_writer_gets_one_sentence_and_delete_is_refused(data_dir):
    writer = write("20260101-120000-lock", turns=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from dflash_tui.core import sessions as s; "
         "w = s.SessionWriter.resume(s.load_session(sys.argv[1])); print('locked', flush=True); sys.stdin.read()",
         writer.id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "DFLASH_DATA_DIR": str(data_dir)})
    try:
        assert holder.stdout.readline().strip() == b"locked"  # waits for the event, not for time
        with pytest.raises(UserError, match=rf"open in another dflash \(pid {holder.pid}\)"):
            sessions.SessionWriter.resume(sessions.load_session(writer.id))
        with pytest.raises(UserError, match="is open in a dflash"):
            sessions.delete_session(sessions.resolve_own(writer.id))
    finally:
        holder.stdin.close()
        holder.wait(timeout=120)
    resumed = sessions.SessionWriter.resume(sessions.load_session(writer.id))  # free once the holder exits
    resumed.close()


def test_folders_are_private_whatever_the_umask(data_dir):
    old = os.umask(0)
    try:
        write("20260101-120000-mask", turns=1)
    finally:
        os.umask(old)
    for folder in (data_dir, data_dir / "sessions"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE((data_dir / "sessions" / "20260101-120000-mask.jsonl").stat().st_mode) == 0o600


def test_a_damaged_file_is_skipped_in_the_list_and_show_names_the_field(data_dir):
    write("20260101-120000-good", turns=1)
    bad = write("20260101-130000-badd", turns=1).path
    lines = bad.read_text().splitlines()
    turn = json.loads(lines[1])
    turn["user"] = 42
    bad.write_text(lines[0] + "\n" + json.dumps(turn) + "\n")
    skipped = []
    assert [s.id for s in sessions.list_sessions(skipped)] == ["20260101-120000-good"]
    assert "line 2: user is 42" in str(skipped[0])
    from dflash_tui.cli import main

    listed = CliRunner().invoke(main, ["sessions", "list"])
    assert listed.exit_code == 0 and "20260101-120000-good" in listed.stdout and "skipped:" in listed.stderr
    shown = CliRunner().invoke(main, ["sessions", "show", "20260101-130000-badd"])
    assert shown.exit_code == 2 and "line 2: user is 42" in shown.stderr


# -- nothing the user wrote is lost (hardening round 2) ----------------------------------------------


@pytest.mark.parametrize("field", ["decode_tokens_per_s", "ttft_s"])
def test_a_number_too_long_for_a_float_is_a_damaged_field_not_a_crash(data_dir, field):
    """JSON integers have no limit (a float's end is near 10**308): such a value in a recorded number is named
    like any damaged field, and `sessions list` still lists the other sessions."""
    from dflash_tui.cli import main

    kept = write("20260101-110000-good", turns=1)
    bad = write("20260101-120000-huge", turns=1)
    header, turn = (json.loads(line) for line in bad.path.read_text().splitlines())
    turn["summary"][field] = 10**400
    bad.path.write_text(json.dumps(header) + "\n" + json.dumps(turn) + "\n")
    listed = CliRunner().invoke(main, ["sessions", "list"])
    assert listed.exit_code == 0 and kept.id in listed.stdout and bad.id not in listed.stdout, listed.output
    shown = CliRunner().invoke(main, ["sessions", "show", bad.id])
    assert shown.exit_code == 2 and f"line 2: summary.{field} is 1000" in shown.output, shown.output


def test_a_last_line_without_its_newline_is_a_complete_turn_and_resuming_keeps_it(data_dir):
    writer = write("20260101-120000-nlnl", turns=2)
    with open(writer.path, "rb+") as f:  # an editor that strips the final newline
        f.truncate(writer.path.stat().st_size - 1)
    session = sessions.load_session(writer.id)
    assert [t["user"] for t in session.turns] == ["q0", "q1"] and session.warnings == []
    resumed = sessions.SessionWriter.resume(session)
    assert resumed.append_turn({"index": 2, "status": "completed", "user": "q2", "answer": "a2", "settings": {}})
    resumed.close()
    again = sessions.load_session(writer.id)
    assert [t["user"] for t in again.turns] == ["q0", "q1", "q2"] and again.warnings == []


def test_a_chat_started_with_relative_target_and_draft_resumes_from_another_folder(pairs, data_dir, tmp_path,
                                                                                     monkeypatch):
    """The session records the pair's folders as absolute paths: `--target ../t` typed in one folder still
    names the same checkpoint when the chat is resumed from another."""
    from dflash_tui.cli import main

    target, draft = pairs("qwen3")
    first, later = tmp_path / "here", tmp_path / "later" / "deeper"
    first.mkdir()
    later.mkdir(parents=True)
    monkeypatch.chdir(first)
    pair = ["--target", os.path.relpath(target), "--draft", os.path.relpath(draft), "--max-new-tokens", "4"]
    assert CliRunner().invoke(main, ["chat", "--plain", *pair], input="remember this\n").exit_code == 0
    (session,) = sessions.list_sessions()
    assert Path(session.header["target_path"]) == target and Path(session.header["draft_path"]) == draft
    monkeypatch.chdir(later)
    again = CliRunner().invoke(main, ["chat", "--plain", "--resume", session.id], input="and this\n")
    assert again.exit_code == 0, again.output
    assert [t["user"] for t in sessions.load_session(session.id).turns] == ["remember this", "and this"]


def test_deleting_a_session_whose_name_looks_like_a_pattern_leaves_other_sessions_files(data_dir):
    from dflash_tui.cli import main

    other = write("20261202-120000-abcd", turns=1)
    replay = other.path.with_name(f"{other.id}.replay-20261202.json")
    replay.write_text("{}")
    odd = write("20261202-*", turns=1)
    own = odd.path.with_name("20261202-*.replay-1.json")
    own.write_text("{}")
    deleted = CliRunner().invoke(main, ["sessions", "delete", "20261202-*", "--yes"])
    assert deleted.exit_code == 0, deleted.output
    assert not odd.path.exists() and not own.exists()
    assert other.path.exists() and replay.exists()


def test_export_onto_a_hard_link_of_a_session_is_refused_and_the_session_kept(data_dir, tmp_path):
    from dflash_tui.cli import main

    writer = write("20260101-120000-link", turns=2)
    before = writer.path.read_bytes()
    link = tmp_path / "notes.md"
    os.link(writer.path, link)
    result = CliRunner().invoke(main, ["sessions", "export", writer.id, "-o", str(link)])
    assert result.exit_code == 2 and "is a session file" in result.output
    assert writer.path.read_bytes() == before


def test_an_export_replaces_its_file_and_never_truncates_what_the_name_pointed_at(data_dir, tmp_path):
    writer = write("20260101-120000-repl", turns=1)
    tmp_path = tmp_path / "exports"
    tmp_path.mkdir()
    kept = tmp_path / "kept.md"
    kept.write_text("the user's notes\n")
    other_name = tmp_path / "out.md"
    os.link(kept, other_name)  # not a session: written, but through a new file
    sessions.write_export(other_name, sessions.to_markdown(sessions.load_session(writer.id)))
    assert kept.read_text() == "the user's notes\n"
    assert other_name.read_text().startswith("# dflash session") and stat.S_IMODE(other_name.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.md", "out.md"]  # no temporary file left


def test_a_version_1_session_file_still_loads_and_shows_its_figures(data_dir):
    """A file written before contract version 2, by hand as dflash 0.x wrote it: no `contract` in its
    summaries, and a turn against a foreign server that wrote 0 where version 2 writes null. Version 1's
    numbers load as they were written (0.0 was what that file said); the session's tau counts the steps
    of the turn that has them."""
    from dflash_tui.cli import main
    from dflash_tui.core.conversation import ChatSettings, Conversation, session_tau
    from dflash_tui.engines import EngineConfig, Summary, load_engine
    from tests.foreign import ForeignServer

    local = {"prompt_tokens": 21, "generated_tokens": 13, "ttft_s": 0.01, "decode_s": 0.1,
             "decode_tokens_per_s": 120.0, "acceptance_lengths": [4, 8], "mean_acceptance_length": 6.0,
             "histogram": [0, 0, 0, 1, 0, 0, 0, 1], "draft_s": 0.02, "verify_s": 0.05, "peak_memory_bytes": 1 << 20,
             "peak_memory_kind": "device", "block_size": 8, "engine": "cuda", "device": "cpu", "dtype": "float32",
             "finish_reason": "stop", "graphs": False}
    foreign = {**local, "acceptance_lengths": [], "mean_acceptance_length": 0.0, "histogram": [], "draft_s": 0.0,
               "verify_s": 0.0, "peak_memory_bytes": 0, "peak_memory_kind": "unknown (remote)", "block_size": 1,
               "engine": "remote", "device": "127.0.0.1:8000 (vllm)", "dtype": "?"}
    header = {"type": "header", "format": 1, "id": "20250101-090000-0001", "created": "2025-01-01T09:00:00+00:00",
              "profile": {"name": "tiny"}, "engine": "cuda", "device": "cpu", "dtype": "float32"}
    turns = [{"type": "turn", "index": n, "status": "completed", "user": f"q{n}", "answer": f"a{n}",
              "settings": {"block_size": summary["block_size"], "thinking": False}, "prompt_ids": [1, 2],
              "emitted_ids": [3], "steps": [], "summary": summary} for n, summary in enumerate((local, foreign))]
    folder = sessions.private_dir(sessions.sessions_dir())
    path = folder / "20250101-090000-0001.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in (header, *turns)))
    os.chmod(path, 0o600)

    session = sessions.load_session("20250101-090000-0001")
    loaded = [Summary.from_dict(t["summary"]) for t in session.turns]
    assert [s.contract for s in loaded] == [1, 1]
    assert (loaded[0].mean_acceptance_length, loaded[0].peak_memory_bytes, loaded[0].block_size) == (6.0, 1 << 20, 8)
    assert (loaded[1].mean_acceptance_length, loaded[1].peak_memory_bytes, loaded[1].block_size) == (0.0, 0, 1)
    assert (loaded[0].reused_prompt_tokens, loaded[0].prefilled_prompt_tokens) == (0, 0)  # as version 1 read them
    assert session_tau(loaded) == 6.0  # the foreign turn has no steps to count
    shown = CliRunner().invoke(main, ["sessions", "show", "20250101"])
    assert shown.exit_code == 0, shown.output
    assert "_block 8 · thinking off · 13 tokens · 120.0 tok/s · tau 6.00_" in shown.output
    assert "_block 1 · thinking off · 13 tokens · 120.0 tok/s · tau 0.00_" in shown.output

    with ForeignServer() as server:  # a chat resumes it (any engine: a server that is not ours here)
        conv = Conversation(load_engine(EngineConfig(target="served", engine="remote", url=server.base)),
                            ChatSettings(), record=False)
        conv.restore(session)
        conv.close()
        conv.engine.close()
    assert [t.summary for t in conv.turns] == loaded and conv.session_tau() == 6.0


# -- damaged fields and a full disk (hardening round 2) ------------------------------------------------


def _damage(writer, line: int, field: str, value) -> None:
    """Set the dotted `field` of record `line` (1-based) of a session file to `value`."""
    records = [json.loads(x) for x in writer.path.read_text().splitlines()]
    *outer, key = field.split(".")
    target = records[line - 1]
    for part in outer:
        target = target.setdefault(part, {})
    target[key] = value
    writer.path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_every_field_a_reader_uses_is_checked_where_the_session_is_read(data_dir):
    """A damaged nested field names its file, line and field, and one damaged session never hides the
    others: the list shows the rest, show/replay/--resume refuse in one sentence."""
    from dflash_tui.cli import main

    def run(*args):
        return CliRunner().invoke(main, list(args), input="hello\n")

    write("20260101-110000-good", turns=1)
    named = write("20260101-120000-name", turns=1)
    _damage(named, 1, "profile.name", 5)
    listed = run("sessions", "list")
    assert listed.exit_code == 0 and "20260101-110000-good" in listed.stdout, listed.output
    assert "line 1: profile.name is 5" in listed.stderr and "20260101-120000-name.jsonl" in listed.stderr
    cases = [("20260101-130000-fast", 2, "summary.decode_tokens_per_s", "fast", ("sessions", "show")),
             ("20260101-140000-abcx", 2, "settings.max_new_tokens", "abc", ("replay",)),
             ("20260101-150000-blkx", 2, "settings.block_size", "x", ("chat", "--plain", "--resume")),
             ("20260101-160000-step", 2, "steps", [{"drafted": "x", "accepted": 1}], ("chat", "--plain", "--resume")),
             ("20260101-170000-path", 1, "profile.path", ["/x"], ("replay",))]
    for session_id, line, field, value, command in cases:
        _damage(write(session_id, turns=1), line, field, value)
        result = run(*command, session_id)
        assert result.exit_code == 2, (command, result.output)
        (error,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
        assert f"{session_id}.jsonl, line {line}: {field} is {json.dumps(value)[:40]}" in error, error
        assert run("sessions", "list").exit_code == 0


def test_a_lock_whose_pid_cannot_be_written_still_locks(data_dir, monkeypatch):
    real_write = os.write

    def full_disk(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sessions.os, "write", full_disk)
    writer = sessions.SessionWriter({"profile": {"name": "tiny"}}, session_id="20260101-120000-full")
    assert not writer.append_turn(_turn(0)) and writer.error == "disk full"
    monkeypatch.setattr(sessions.os, "write", real_write)
    assert sessions.SessionLock.held_here(writer.path)
    assert writer.append_turn(_turn(1))  # space again: both turns land
    writer.close()
    assert [t["user"] for t in sessions.load_session(writer.id).turns] == ["q0", "q1"]


def test_the_repl_answers_every_prompt_when_the_disk_is_full_before_the_first_turn(data_dir, engine, pair, tmp_path,
                                                                                    monkeypatch):
    """ENOSPC from the first write on (the lock's pid, the session file): every prompt is still answered."""
    import dflash_tui.repl as repl

    monkeypatch.setattr(repl, "load_engine", lambda config: engine)
    profile = tiny.write_profile(tmp_path / "tiny.toml", *pair, max_new_tokens=4)

    def full_disk(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sessions.os, "write", full_disk)
    out, err = io.StringIO(), io.StringIO()
    assert repl.run_repl(str(profile), stdin=io.StringIO("one\ntwo\n"), out=out, err=err) == 0, err.getvalue()
    assert err.getvalue().count("not saved: disk full") == 2 and err.getvalue().count("tokens ·") == 2


def test_a_profiles_api_key_never_reaches_the_session_file():
    from dflash_tui.core.conversation import profile_snapshot
    from dflash_tui.core.profiles import Profile

    snapshot = profile_snapshot(Profile(name="p", description="", path=None, target="t", draft=None, api_key="sk-secret"))
    assert "api_key" not in snapshot and "sk-secret" not in json.dumps(snapshot)


def test_a_folder_that_cannot_be_changed_is_one_sentence_when_deleting_or_saving_a_replay(data_dir, monkeypatch):
    """A read-only sessions folder (faked: every removal and creation there fails with EROFS; a full disk
    fails the same way): `sessions delete` and a replay's save say so in one sentence naming the file, and the
    session and its replay file stay whole."""
    import errno

    from dflash_tui.cli import main
    from dflash_tui.measure import replay

    writer = write("20260101-120000-rofs", turns=1)
    companion = writer.path.with_name(f"{writer.id}.replay-20260101-130000.json")
    companion.write_text("{}\n")
    before = writer.path.read_bytes()
    folder = writer.path.parent
    real_unlink, real_open = Path.unlink, os.open

    def unlink(path, *args, **kwargs):
        if Path(path).parent == folder:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_unlink(path, *args, **kwargs)

    def create(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and Path(path).parent == folder:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setattr(os, "open", create)
    result = CliRunner().invoke(main, ["sessions", "delete", writer.id, "--yes"])
    assert result.exit_code == 2 and "Read-only file system" in result.output and "is kept" in result.output, result.output
    with pytest.raises(UserError, match="cannot be saved to .*Read-only file system.*--no-save"):
        replay.save_comparison(replay.ReplayResult(session=writer.id, session_path=str(writer.path)), writer.path)
    assert writer.path.read_bytes() == before and companion.read_text() == "{}\n"
    assert sorted(p.name for p in folder.iterdir()) == sorted([writer.path.name, companion.name])


# -- renaming (issue 32, build 6) ------------------------------------------------------------------


def test_a_title_round_trips_shows_in_the_list_and_exports_and_an_empty_one_clears_it(data_dir):
    """The last title line names the session; a line of a type this dflash does not know is skipped, as an
    older dflash skips a title line."""
    from dflash_tui.cli import main

    writer = write(turns=1)
    session = sessions.load_session(writer.id)
    assert sessions.rename_session(session, "  Sums\tand\ncarries \x1b ") == "Sums and carries ␛"
    with writer.path.open("a") as f:
        f.write(json.dumps({"type": "from-a-newer-dflash"}) + "\n")
    sessions.rename_session(session, "Sums and carries")
    named = sessions.load_session(writer.id)
    assert named.title == named.name == "Sums and carries" and named.warnings == [] and len(named.turns) == 1
    assert json.loads(writer.path.read_text().splitlines()[-1]) == {"type": "title", "title": "Sums and carries"}
    listed = CliRunner().invoke(main, ["sessions", "list"])
    assert listed.exit_code == 0 and "Sums and carries" in listed.stdout
    assert "- title: Sums and carries" in sessions.to_markdown(named)
    assert sessions.to_json(named)["title"] == "Sums and carries"
    sessions.rename_session(named, "")
    cleared = sessions.load_session(writer.id)
    assert cleared.name == "" and cleared.title == "q0" and "- title:" not in sessions.to_markdown(cleared)
    with pytest.raises(UserError, match=f"at most {sessions.TITLE_MAX} characters; this one has 201"):
        sessions.rename_session(cleared, "x" * 201)


@pytest.mark.parametrize("value", [5, "x" * (sessions.TITLE_MAX + 1), "bell\x07", "two\nlines", None])
def test_a_damaged_title_is_a_named_field(data_dir, value):
    writer = write("20260101-120000-titl", turns=1)
    record = {"type": "title"} if value is None else {"type": "title", "title": value}
    with writer.path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{writer.id}.jsonl, line 3: title is {json.dumps(value)[:40]}")):
        sessions.load_session(writer.id)


def test_renaming_a_session_open_elsewhere_or_here_is_refused_in_one_sentence(data_dir):
    writer = write("20260101-120000-open", turns=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from dflash_tui.core import sessions as s; "
         "w = s.SessionWriter.resume(s.load_session(sys.argv[1])); print('locked', flush=True); sys.stdin.read()",
         writer.id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "DFLASH_DATA_DIR": str(data_dir)})
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(UserError, match=rf"^Session {writer.id} is open in a dflash \(pid {holder.pid}\); "
                                            r"close it there before renaming it\.$"):
            sessions.rename_session(sessions.load_session(writer.id), "mine")
    finally:
        holder.stdin.close()
        holder.wait(timeout=120)
    here = sessions.SessionWriter.resume(sessions.load_session(writer.id))  # the chat open in this process
    try:
        with pytest.raises(UserError, match="is the chat open here"):
            sessions.rename_session(sessions.load_session(writer.id), "mine")
        assert sessions.rename_open(here, "through the chat") == "through the chat"
    finally:
        here.close()
    assert sessions.load_session(writer.id).title == "through the chat"
    with pytest.raises(UserError, match="no session to rename yet"):
        sessions.rename_open(None, "x")


def test_sessions_rename_cli_titles_clears_and_refuses_the_chat_open_here(data_dir):
    from dflash_tui.cli import main

    writer = write(turns=1)
    renamed = CliRunner().invoke(main, ["sessions", "rename", writer.id[:13], "Sums", "and", "carries"])
    assert renamed.exit_code == 0 and f"{writer.id}: Session renamed 'Sums and carries'." in renamed.stdout, renamed.output
    listed = CliRunner().invoke(main, ["sessions", "list"])
    assert "title" in listed.stdout.splitlines()[0] and "Sums and carries" in listed.stdout
    cleared = CliRunner().invoke(main, ["sessions", "rename", writer.id])
    assert cleared.exit_code == 0 and sessions.load_session(writer.id).title == "q0", cleared.output
    here = sessions.SessionWriter.resume(sessions.load_session(writer.id))
    try:
        refused = CliRunner().invoke(main, ["sessions", "rename", writer.id, "x"])
    finally:
        here.close()
    assert refused.exit_code == 2 and "is the chat open here" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
