"""Issue 43, rule 2: the user's prompt is never lost.

- Each prompt is on disk (fsynced) before its answer starts: a chat killed mid-answer resumes with it as an
  interrupted turn that f6 / `/continue` picks up, and ↑ recalls it. (The real SIGKILL of a real
  `dflash chat --plain` process is test_sessions.py::test_sigkill_mid_answer_loses_at_most_that_answer;
  here the TUI resumes the file such a kill leaves.)
- Rename and resume never delete a complete last record whose newline is missing or became NUL bytes;
  only a record truly cut short is dropped.
- Session ids are taken by a unique prefix or suffix of at least 4 characters.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import sessions
from dflash_tui.engines.errors import UserError
from tests import waiting

ID = "20260101-120000-abcd"


def turn(n: int) -> dict:
    return {"type": "turn", "index": n, "status": "completed", "user": f"q{n}", "answer": f"a{n}", "settings": {}}


def session_file(tail: bytes, turns: int = 2) -> bytes:
    """A session of `turns` whole lines, then `tail` as written."""
    path = sessions.private_dir(sessions.sessions_dir()) / f"{ID}.jsonl"
    lines = [{"type": "header", "format": 1, "id": ID, "created": "2026-01-01T12:00:00+00:00"},
             *(turn(n) for n in range(turns))]
    data = "".join(json.dumps(r) + "\n" for r in lines).encode() + tail
    path.write_bytes(data)
    path.chmod(0o600)
    return data


LAST = json.dumps(turn(2)).encode()


@pytest.mark.parametrize("tail, kept", [
    (LAST + b"\0\0\0\0", 3),                       # its newline, and what followed, became zeros
    (LAST + b"\n\0\0\0", 3),                       # zeros after a whole line
    (LAST, 3),                                     # a whole record without its newline
    (LAST + b"\0" + LAST[:25], 3),                 # a whole record, zeros, a record cut short
    (LAST[:25], 2),                                # a record cut short
])
def test_rename_and_resume_keep_a_whole_last_record(data_dir, tail, kept):
    for how in ("rename", "resume"):
        session_file(tail)
        assert len(sessions.load_session(ID).turns) == kept
        if how == "rename":
            result = CliRunner().invoke(main, ["sessions", "rename", ID, "named"])
            assert result.exit_code == 0, result.output
        else:
            session, _ = sessions.open_to_resume(sessions.load_session(ID))
            writer = sessions.SessionWriter.resume(session)
            assert writer.append_turn({**turn(kept), "type": "turn"})
            writer.close()
        after = sessions.load_session(ID)
        users = [t["user"] for t in after.turns]
        assert users == [f"q{n}" for n in range(kept + (how == "resume"))] and after.warnings == [], (how, users)
        assert sessions.own_problem(after.path) is None and b"\0" not in after.path.read_bytes()[-len(LAST) - 2:]


@pytest.mark.parametrize("tail", [b"[1, 2]", b"[" * 100 + b"]" * 100, b'"text"'])
def test_a_valid_json_last_line_dflash_does_not_read_is_still_never_cut(data_dir, tail):
    before = session_file(tail)
    result = CliRunner().invoke(main, ["sessions", "rename", ID, "named"])
    assert result.exit_code == 0, result.output
    assert sessions.load_session(ID).path.read_bytes().startswith(before + b"\n")


def test_ids_by_a_unique_prefix_or_suffix_and_ambiguity_in_one_sentence(data_dir):
    for stem in ("20260101-130000-ef01", "20260102-120000-abce"):
        session_file(b"")
        (sessions.sessions_dir() / f"{ID}.jsonl").rename(sessions.sessions_dir() / f"{stem}.jsonl")
    session_file(b"")  # ID itself
    assert sessions.resolve("ef01").stem == "20260101-130000-ef01"        # a suffix
    assert sessions.resolve("0-ef01").stem == "20260101-130000-ef01"
    assert sessions.resolve("20260102").stem == "20260102-120000-abce"    # a prefix
    with pytest.raises(UserError, match=r"^Session id '20260101' matches 2 sessions \(20260101-120000-abcd, "
                                        r"20260101-130000-ef01\); give more of the id\.$"):
        sessions.resolve("20260101")
    with pytest.raises(UserError, match="^No session '-120000-abc' in"):  # in the middle: neither begins nor ends one
        sessions.resolve("-120000-abc")
    with pytest.raises(UserError, match="too short"):
        sessions.resolve("ef0")
    for command in (["sessions", "show", "ef01"], ["sessions", "rename", "ef01", "x"], ["sessions", "export", "ef01"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["sessions", "delete", "--yes", "2026"])
    assert result.exit_code == 2 and "matches 3 sessions" in result.stderr and result.stderr.count("\n") == 1


def test_a_prompt_is_on_disk_before_its_answer_starts(engine, data_dir):
    """The prompt record is written (and fsynced) before the engine yields its first token."""
    from dflash_tui.core.conversation import ChatSettings, Conversation

    conv = Conversation(engine, ChatSettings(max_new_tokens=8, thinking=False))
    stream = conv.stream(conv.begin("keep me"))
    next(stream)  # the first token: the file already holds the prompt, and no turn yet
    records = [json.loads(line) for line in conv.writer.path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["header", "prompt"] and records[1]["user"] == "keep me"
    assert records[1]["prompt_ids"] and sessions.read_session(conv.writer.path).turns[0]["interrupted"]
    list(stream)
    conv.close()
    session = sessions.read_session(conv.writer.path)
    assert [(t["user"], t["status"]) for t in session.turns] == [("keep me", "completed")]


@pytest.mark.asyncio
async def test_the_tui_resumes_an_interrupted_turn_recalls_it_and_f6_continues_it(profile, engine, data_dir):
    """The file a kill mid-answer leaves (the prompt record, no turn record) resumed in the TUI: the turn shows
    as stopped, ↑ recalls its prompt, and f6 answers it."""
    from tests.tui_helpers import SIZE, make_app, ready

    app = make_app(profile, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"first", "enter")
        await waiting.until(pilot, lambda: app.turns_done == 1)
        path = app.conversation.writer.path
    lines = path.read_bytes().splitlines(keepends=True)
    assert [json.loads(line)["type"] for line in lines] == ["header", "prompt", "turn"]
    path.write_bytes(b"".join(lines[:2]))  # killed before the answer's turn record
    again = make_app(profile, engine, resume=sessions.load_session(path.stem))
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        turns = again.conversation.turns
        assert [(t.user, t.status, t.can_continue) for t in turns] == [("first", "cancelled", True)]
        await pilot.press("up")
        assert again.chat._prompt.text == "first"
        await pilot.press("ctrl+u", "f6")
        await waiting.until(pilot, lambda: again.turns_done == 1)
        assert [(t.user, t.status, t.continues) for t in again.conversation.turns][-1] == ("first", "completed", 0)
