"""JSON the user wrote or pointed at, read everywhere by one rule (engines.errors.parse_json): nesting too
deep for Python's stack, an integer past its digit limit, or a session field dflash never writes is one
sentence naming the file (and line) with exit 2, or a 400 from the server; never "unexpected ..."."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import sessions
from dflash_tui.engines.errors import UserError
from tests import tiny

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on it
BIG_INT = '{"turns": ["hi"], "n": ' + "7" * 5000 + "}"  # past Python's 4300-digit limit for int()
GOOD_ID = "20260101-110000-good"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], input="")


def assert_refused(result, *phrases):
    """Exit 2 with one `error:` sentence, no traceback, nothing 'unexpected'."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    for phrase in phrases:
        assert phrase in errors[0], errors[0]


def write_session(session_id: str) -> Path:
    """A one-turn session as the cuda engine records it."""
    writer = sessions.SessionWriter({"created": "2026-01-01T12:00:00+00:00", "profile": {"name": "tiny"},
                                     "engine": "cuda", "device": "cpu", "dtype": "float32", "target": "t",
                                     "draft": "d"}, session_id=session_id)
    writer.append_turn({"index": 0, "status": "completed", "user": "q", "answer": "a",
                        "settings": {"block_size": 4, "max_new_tokens": 8, "seed": 0, "temperature": 0.0},
                        "prompt_ids": [1, 2], "emitted_ids": [3], "steps": []})
    writer.close()
    return writer.path


# -- JSON nested too deep: every reader of user JSON ----------------------------------------------------


def test_a_deeply_nested_session_file_is_skipped_by_the_list_and_refused_by_show_and_replay(data_dir):
    write_session(GOOD_ID)
    (data_dir / "sessions" / "20260101-120000-deep.jsonl").write_text(DEEP + "\n")
    listed = invoke("sessions", "list")
    assert listed.exit_code == 0 and GOOD_ID in listed.stdout, listed.output
    assert "20260101-120000-deep.jsonl" in listed.stderr and "unexpected" not in listed.output
    for command in (("sessions", "show"), ("replay",)):
        assert_refused(invoke(*command, "20260101-120000-deep"), "20260101-120000-deep.jsonl", "no header line")


def test_a_deeply_nested_turn_line_is_a_skipped_line_not_a_crash(data_dir):
    path = write_session("20260101-120000-turn")
    path.write_text(path.read_text() + DEEP + "\n")
    shown = invoke("sessions", "show", "20260101-120000-turn")
    assert shown.exit_code == 0 and "line 3" in shown.output and "unexpected" not in shown.output, shown.output


def test_a_prompt_set_nested_too_deep_names_its_line(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"turns": ["hi"]}\n' + DEEP + "\n")
    assert_refused(invoke("bench", "-d", data), f"{data}:2: the line is not valid JSON (", "nests deeper than 64")


@pytest.mark.parametrize("payload, reason", [(DEEP, "nests deeper than"), (BIG_INT, "4300 digits")],
                         ids=["deep", "big-integer"])
def test_training_data_too_deep_or_with_a_huge_integer_names_its_line(pairs, tmp_path, payload, reason):
    target, _ = pairs("qwen3")
    data = tmp_path / "train.jsonl"
    data.write_text('{"turns": ["hi", "hello"]}\n' + payload + "\n")
    result = invoke("train-draft", "--target", target, "--data", data, "--out", tmp_path / "draft")
    assert_refused(result, f"{data}:2: not valid JSON (", reason)
    assert not (tmp_path / "draft").exists()


@pytest.mark.parametrize("payload, reason", [(DEEP, "nests deeper than"), (BIG_INT, "4300 digits")],
                         ids=["deep", "big-integer"])
def test_a_checkpoint_config_too_deep_or_with_a_huge_integer_is_one_sentence(pairs, tmp_path, payload, reason):
    """config.json is JSON the user pointed at too (a big integer was an unexpected ValueError)."""
    import shutil

    target, _ = pairs("qwen3")
    copy = tmp_path / "target"
    shutil.copytree(target, copy)
    (copy / "config.json").write_text(payload)
    assert_refused(invoke("generate", "--target", copy, "--raw", "hi"), f"{copy / 'config.json'} cannot be read", reason)


def test_a_saved_comparison_and_a_server_stream_too_deep_are_refused_by_the_same_rule(tmp_path):
    """A replay comparison next to a session (the TUI's replay screen reads it), and an event or error body
    from a remote server: nesting too deep is a ValueError or one sentence, never a RecursionError."""
    from dflash_tui.engines.remote.client import error_text
    from dflash_tui.engines.remote.sse import iter_sse_json
    from dflash_tui.measure.replay import load_comparison

    saved = tmp_path / "s.replay-1.json"
    saved.write_text(DEEP)
    with pytest.raises(UserError, match="nests deeper than"):
        load_comparison(saved)
    with pytest.raises(ValueError, match="not JSON"):
        list(iter_sse_json([f"data: {DEEP}", ""]))
    assert error_text(DEEP.encode()).startswith("[[[")


def test_a_tools_file_nested_too_deep_is_one_sentence(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(DEEP)
    assert_refused(invoke("generate", "--tools", tools, "hi"), f"The tools file {tools} cannot be read as JSON",
                   "nests deeper than")


def test_tool_call_arguments_nested_too_deep_are_a_400_not_a_500(pairs, tmp_path):
    """An assistant message's function.arguments is JSON inside a string: parsed by the same rule as the body."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from tests.test_serve import Server

    profile = tiny.write_profile(tmp_path / "tiny.toml", *pairs("qwen3"), max_new_tokens=4)
    log = tmp_path / "serve.log"
    server = Server(profile, log=log).ready()
    try:
        call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": DEEP}}
        body = {"model": "tiny", "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "1"}]}
        response = httpx.post(server.base + "/chat/completions", json=body, timeout=60)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "messages"
        assert "messages[1].tool_calls[0].function.arguments is not valid JSON" in error["message"]
        assert httpx.get(server.root + "/health", timeout=10).status_code == 200
    finally:
        server.close()
    assert "Traceback" not in log.read_text()


# -- session fields dflash never writes: refused where the file is read, naming file, line and field ----


@pytest.mark.parametrize("line, field, value", [
    (1, "engine", "tpu"), (1, "profile.engine", "tpu"), (1, "profile.dtype", "float8"),
    (2, "emitted_ids", []), (2, "status", "done"), (2, "settings.engine", "tpu"), (2, "settings.top_p", 5),
    (2, "settings.min_p", 2), (2, "settings.temperature", 1000), (2, "settings.seed", 2**64),
    (2, "settings.reasoning_effort", "max"),
])
def test_a_session_field_replay_relies_on_is_checked_where_the_file_is_read(data_dir, line, field, value):
    write_session(GOOD_ID)
    session_id = "20260101-120000-edit"
    path = write_session(session_id)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    *outer, key = field.split(".")
    holder = records[line - 1]
    for part in outer:
        holder = holder.setdefault(part, {})
    holder[key] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    where = f"{session_id}.jsonl, line {line}: {field} is {json.dumps(value)}"
    listed = invoke("sessions", "list")
    assert listed.exit_code == 0 and GOOD_ID in listed.stdout and session_id not in listed.stdout, listed.output
    assert where in listed.stderr, listed.stderr
    assert_refused(invoke("replay", session_id, "--no-save"), where)


def test_a_completed_turn_without_ids_is_damaged_from_a_local_engine_only(data_dir):
    """A local engine records every id it emits, the stop token at least; a server that streams text only
    (llama.cpp, through the remote engine) leaves emitted_ids empty, and that file is dflash's own."""
    path = write_session("20260101-120000-text")
    header, turn = (json.loads(x) for x in path.read_text().splitlines())
    turn["emitted_ids"] = []
    for engine, loads in (("cuda", False), ("mlx", False), ("remote", True)):
        header["engine"] = engine
        path.write_text(json.dumps(header) + "\n" + json.dumps(turn) + "\n")
        if loads:
            assert sessions.read_session(path).turns[0]["emitted_ids"] == []
        else:
            with pytest.raises(UserError, match="line 2: emitted_ids is \\[\\]"):
                sessions.read_session(path)
