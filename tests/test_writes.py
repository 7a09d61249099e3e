"""Issue 43, rule 1: no write follows a link or lands outside what dflash owns (engines/files.py).

Every writer is walked with a symbolic link, a hard link and a dangling link put where it writes, and with
files outside dflash's folders: the file outside stays byte for byte as it was, and the command either
works on a copy of its own or exits 2 with one sentence. Writers that may stream (exports) still write to a
FIFO a reader holds open; every other refuses a FIFO or a device before its work starts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import sessions
from dflash_tui.engines import files
from dflash_tui.engines.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"the victim's own bytes\nnever to change\n"
LINKS = ["symlink", "hardlink", "dangling"]


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of the user's, outside every dflash folder."""
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def plant(where: Path, kind: str, victim: Path) -> None:
    """`where` becomes a link of `kind` to `victim` (dangling: to a name beside it that does not exist yet)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        where.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, where)
    else:
        where.symlink_to(victim.with_name("not-yet.txt"))


def untouched(victim: Path) -> None:
    assert victim.read_bytes() == SECRET
    assert not victim.with_name("not-yet.txt").exists()  # a dangling link was not written through either


def one_sentence(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def turn(n: int) -> dict:
    return {"index": n, "status": "completed", "user": f"q{n}", "answer": f"a{n}", "settings": {}}


def recorded(session_id: str = "20260101-120000-abcd", turns: int = 2) -> Path:
    writer = sessions.SessionWriter({"profile": {"name": "tiny"}}, session_id=session_id)
    for n in range(turns):
        assert writer.append_turn(turn(n))
    writer.close()
    return writer.path


def cli(*args: str, stdin: str = ""):
    return CliRunner().invoke(main, list(args), input=stdin)


# -- sessions: locks, the session files, copies in ----------------------------------------------------


@pytest.mark.parametrize("kind", LINKS)
def test_a_link_where_the_lock_goes_is_refused_by_rename_and_resume(data_dir, victim, kind):
    path = recorded()
    before = path.read_bytes()
    plant(path.with_suffix(".lock"), kind, victim)
    one_sentence(cli("sessions", "rename", "abcd", "new title"), "Session lock")
    one_sentence(cli("chat", "--plain", "--resume", "abcd"), "Session lock")
    untouched(victim)
    assert path.read_bytes() == before and os.path.lexists(path.with_suffix(".lock"))  # the link left as it was


@pytest.mark.parametrize("kind", ["outside", *LINKS[:2]])
def test_a_session_that_is_not_dflashs_own_is_only_read(data_dir, tmp_path, kind):
    """Outside the data folder (a log whose header is its second line too), or a link in sessions/ to such a
    file: rename refuses in one sentence; resume continues a copy in the sessions folder."""
    mine = recorded()
    outside = tmp_path / "elsewhere" / "log.jsonl"
    outside.parent.mkdir()
    log = b"a log line\n" + mine.read_bytes() + b'{"type": "turn", "index": 2, "user": "torn'
    outside.write_bytes(log)
    mine.unlink()
    if kind == "outside":
        given = str(outside)
    else:
        plant(sessions.sessions_dir() / "20260101-120000-link.jsonl", kind, outside)
        given = "link"
    one_sentence(cli("sessions", "rename", given, "new title"), "not one of dflash's own")
    session, note = sessions.open_to_resume(sessions.load_session(given))
    writer = sessions.SessionWriter.resume(session)
    assert writer.append_turn(turn(2)) and note and "copy" in note
    writer.close()
    assert outside.read_bytes() == log and not outside.with_suffix(".lock").exists()
    assert session.path.parent == sessions.sessions_dir() and sessions.own_problem(session.path) is None
    assert [t["user"] for t in sessions.read_session(session.path).turns] == ["q0", "q1", "q2"]


def test_chat_resume_of_a_file_outside_writes_its_turns_to_a_copy(data_dir, tmp_path, profile):
    mine = recorded(turns=1)
    outside = tmp_path / "kept.jsonl"
    outside.write_bytes(mine.read_bytes())
    mine.unlink()
    before = outside.read_bytes()
    result = cli("chat", "--plain", "--profile", str(profile), "--max-new-tokens", "2", "--resume", str(outside),
                 stdin="hello\n")
    assert result.exit_code == 0, result.output
    assert "continuing a copy" in result.stderr and outside.read_bytes() == before
    (copy,) = sessions.session_paths()
    assert [t["user"] for t in sessions.read_session(copy).turns] == ["q0", "hello"]


def test_a_dangling_link_where_a_new_session_goes_is_not_written_through(data_dir, victim):
    plant(sessions.sessions_dir() / "20260101-120000-dang.jsonl", "dangling", victim)
    writer = sessions.SessionWriter({"profile": {"name": "tiny"}}, session_id="20260101-120000-dang")
    assert not writer.append_turn(turn(0)) and "exists already" in writer.error
    writer.close()
    untouched(victim)


# -- exports, bench and replay outputs ------------------------------------------------------------------


@pytest.mark.parametrize("kind", LINKS)
def test_an_export_over_a_link_replaces_the_name_and_is_private(data_dir, tmp_path, victim, kind):
    recorded()
    out = tmp_path / "export.md"
    plant(out, kind, victim)
    result = cli("sessions", "export", "abcd", "-o", str(out))
    assert result.exit_code == 0, result.output
    untouched(victim)
    assert not out.is_symlink() and "q1" in out.read_text() and stat.S_IMODE(out.stat().st_mode) == 0o600


def test_an_export_streams_to_a_fifo_with_a_reader_and_refuses_one_without(data_dir, tmp_path):
    recorded()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    one_sentence(cli("sessions", "export", "abcd", "-o", str(fifo)), "nothing reads")
    reader = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdout.write(open({str(fifo)!r}).read())"],
                              stdout=subprocess.PIPE)
    fd = os.open(fifo, os.O_WRONLY)  # waits for the reader to open its end: then the export has one
    try:
        result = cli("sessions", "export", "abcd", "-o", str(fifo))
    finally:
        os.close(fd)
    assert result.exit_code == 0, result.output
    assert b"q1" in reader.communicate(timeout=60)[0]
    with open(tmp_path / "redirected.md", "wb") as out:  # /dev/stdout that is a file: written, never renamed over
        done = subprocess.run([sys.executable, "-m", "dflash_tui", "sessions", "export", "abcd", "-o", "/dev/stdout"],
                              stdout=out, stderr=subprocess.PIPE, cwd=ROOT, env=os.environ.copy(), timeout=120)
    assert done.returncode == 0 and b"q1" in (tmp_path / "redirected.md").read_bytes(), done.stderr
    assert not any(name.startswith(".stdout") for name in os.listdir("/dev"))  # no temporary file beside it


@pytest.mark.parametrize("output", ["/dev/full", "fifo", "session", "session-link"])
def test_bench_refuses_a_device_a_fifo_or_a_session_before_the_run(data_dir, tmp_path, output):
    """Refused before anything loads: the profile named here does not even exist."""
    path = recorded()
    before = path.read_bytes()
    where = {"/dev/full": "/dev/full", "fifo": str(tmp_path / "fifo"), "session": str(path),
             "session-link": str(tmp_path / "results.json")}[output]
    if output == "fifo":
        os.mkfifo(where)
    if output == "session-link":
        os.symlink(path, where)
    one_sentence(cli("bench", "--profile", str(tmp_path / "no-such.toml"), "-o", where), "--output")
    assert path.read_bytes() == before


def test_replay_of_a_session_outside_saves_into_the_data_folder(data_dir, tmp_path, engine):
    """The comparison goes to the data folder's replays/, never beside a file dflash does not own."""
    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.measure import replay

    conv = Conversation(engine, ChatSettings(max_new_tokens=3, thinking=False))
    list(conv.stream(conv.begin("hi")))
    conv.close()
    outside = tmp_path / "away" / "s.jsonl"
    outside.parent.mkdir()
    outside.write_bytes(conv.writer.path.read_bytes())
    session = sessions.read_session(outside)
    comparison = replay.run_replay(engine, session, [1], warmup=False, repeats=1)
    saved = replay.save_comparison(comparison, outside)
    assert saved.parent == sessions.data_dir() / "replays" and os.listdir(outside.parent) == ["s.jsonl"]
    assert replay.saved_comparisons(outside) == [saved] and stat.S_IMODE(saved.stat().st_mode) == 0o600


# -- profiles, tune, preferences, the REPL's history ------------------------------------------------------


@pytest.mark.parametrize("kind", LINKS)
def test_profile_new_never_writes_through_a_link(config_dir, victim, kind):
    target = config_dir / "profiles" / "mine.toml"
    plant(target, kind, victim)
    one_sentence(cli("profile", "new", "mine"), "already exists")
    untouched(victim)
    result = cli("profile", "new", "mine", "--force")
    assert result.exit_code == 0, result.output
    untouched(victim)
    assert not target.is_symlink() and target.stat().st_nlink == 1 and 'name = "mine"' in target.read_text()


@pytest.mark.parametrize("kind", LINKS[:2])
def test_tune_replaces_a_link_in_the_profile_folder_with_its_own_copy(config_dir, tmp_path, kind):
    from dflash_tui.core.profiles import load_profile
    from dflash_tui.measure import tune

    text = 'name = "mine"\n[model]\ntarget = "Qwen/Qwen3-8B"\n[dflash]\nblock_size = 16\n'
    outside = tmp_path / "dotfiles" / "mine.toml"
    outside.parent.mkdir()
    outside.write_text(text)
    target = config_dir / "profiles" / "mine.toml"
    plant(target, kind, outside)
    path, _ = tune.write_best(load_profile("mine"), {"block_size": 8})
    assert path == target and outside.read_text() == text
    assert not target.is_symlink() and load_profile("mine").block_size == 8


@pytest.mark.parametrize("kind", LINKS)
def test_preferences_replace_a_link(config_dir, victim, kind):
    from dflash_tui.tui.preferences import Preferences, load_preferences, save_preferences

    path = config_dir / "preferences.json"
    plant(path, kind, victim)
    plant(config_dir / "preferences.tmp", "symlink", victim)  # the fixed temporary name an earlier version used
    assert save_preferences(Preferences(theme="nord")) is None
    untouched(victim)
    assert load_preferences()[0].theme == "nord" and not path.is_symlink()


@pytest.mark.parametrize("kind", LINKS)
def test_the_repl_history_is_never_written_through_a_link(data_dir, victim, kind, engine):
    import io

    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.repl import Repl

    path = sessions.private_dir(data_dir) / "repl_history"
    plant(path, kind, victim)
    err = io.StringIO()
    repl = Repl(Conversation(engine, ChatSettings(), record=False), out=io.StringIO(), err=err, colour=False)
    history = repl.history(path)
    history.store_string("a prompt")
    untouched(victim)
    assert "not saved for ↑" in err.getvalue()


def test_the_repl_history_appends_fsynced_lines_to_its_own_file(data_dir, engine):
    import io

    from dflash_tui.core.conversation import ChatSettings, Conversation
    from dflash_tui.repl import Repl

    path = sessions.private_dir(data_dir) / "repl_history"
    repl = Repl(Conversation(engine, ChatSettings(), record=False), out=io.StringIO(), err=io.StringIO(), colour=False)
    repl.history(path).store_string("first")
    assert list(repl.history(path).load_history_strings()) == ["first"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# -- train-draft ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--out", "--work-dir"])
def test_train_draft_state_and_cache_never_follow_a_link(pairs, tmp_path, victim, option):
    torch = pytest.importorskip("torch")
    from dflash_tui.engines.cuda.training import TrainConfig, Trainer
    from dflash_tui.engines.cuda.training.responses import RESPONSES_FILE, Responses

    target, _ = pairs("qwen3")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    work = tmp_path / "work"
    trainer = Trainer(TrainConfig(target=str(target), data=str(data), out=str(tmp_path / "draft"), block_size=4,
                                  draft_layers=1, **({"work_dir": str(work)} if option == "--work-dir" else {})))
    folder = trainer.work
    plant(folder / "train_state.tmp", "symlink", victim)  # the fixed name an earlier version wrote first
    plant(folder / "train_state.pt", "symlink", victim)
    saved = trainer.save_state(1, torch.optim.AdamW(trainer.draft.parameters()), [])
    untouched(victim)
    assert not saved.is_symlink() and torch.load(saved, weights_only=True)["step"] == 1
    plant(folder / RESPONSES_FILE, "hardlink", victim)
    responses = Responses(None, None, [], target, folder, 16, 4, 1, str(data), lambda *a: None)
    with pytest.raises(UserError, match="hard links"):
        responses._write([], {}, folder / RESPONSES_FILE)
    untouched(victim)
    (folder / RESPONSES_FILE).unlink()
    os.mkfifo(folder / RESPONSES_FILE)  # nothing reads it: refused at once, never waited on
    with pytest.raises(UserError, match="cannot be written"):
        responses._write([], {}, folder / RESPONSES_FILE)


# -- the rule itself --------------------------------------------------------------------------------------


def test_write_file_never_reuses_a_name_and_leaves_no_temporary_file(tmp_path, victim):
    target = tmp_path / "x"
    plant(target, "dangling", victim)
    with pytest.raises(FileExistsError):
        files.write_file(target, b"new", replace=False)
    files.write_file(target, b"new", mode=0o600)
    untouched(victim)
    assert target.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["outside", "x"]


def test_delete_is_refused_while_a_resume_is_still_loading(data_dir, profile, monkeypatch):
    """`chat --resume` takes the session's lock before anything else: a `sessions delete` from another process
    while the weights load (a fake load that runs the delete, then stops) is refused and the file kept."""
    import dflash_tui.repl as repl

    path = recorded()
    seen = {}

    def loading(config):
        seen["delete"] = subprocess.run([sys.executable, "-m", "dflash_tui", "sessions", "delete", "--yes", "abcd"],
                                        capture_output=True, text=True, cwd=ROOT, env=os.environ.copy(), timeout=120)
        raise UserError("stopped here by the test")

    monkeypatch.setattr(repl, "load_engine", loading)
    result = cli("chat", "--plain", "--profile", str(profile), "--resume", "abcd")
    assert result.exit_code == 2 and "stopped here by the test" in result.stderr
    assert seen["delete"].returncode == 2 and "open in a dflash" in seen["delete"].stderr
    assert path.exists()
