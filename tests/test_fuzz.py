"""Hostile input, generated: flags, profiles, session files, checkpoint configs and bytes.

Whatever the input, the CLI answers with exit code 0 (it was fine after all) or 2 (one sentence saying
what is wrong), never a traceback and never "unexpected". Seeded (derandomized) and bounded, so the
suite stays deterministic and within its time budget; everything runs in-process through CliRunner.
"""

from __future__ import annotations

import json
import math
import shutil
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_tui.cli import main

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def run(*args, input=None):
    result = CliRunner().invoke(main, [str(a) for a in args], input=input)
    return result


def assert_clean(result, allowed=(0, 2)):
    """Exit 0 or 2; on 2 the last line is one 'error:' sentence; never a traceback."""
    out = result.output
    assert result.exit_code in allowed, (result.exit_code, out, result.exception)
    assert "Traceback" not in out and "unexpected" not in out, out
    if result.exit_code == 2:
        assert out.strip().splitlines()[-1].startswith("error: "), out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests import tiny as build

    root = tmp_path_factory.mktemp("fuzz")
    target = build.make_target(root / "target", "qwen3")
    draft = build.make_draft(root / "draft", target, [0, 2])
    return target, draft


# -- flags ---------------------------------------------------------------------------------------

floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-300, -0.0, 0.6, 2.0, 1e308]))
flag_values = st.fixed_dictionaries({}, optional={
    "--temperature": floats,
    "--top-p": floats,
    "--min-p": floats,
    "--top-k": st.integers(-2**65, 2**65),
    "--seed": st.sampled_from([-1, 0, 2**63 - 1, 2**63, 2**64, 10**30]),
    "--max-new-tokens": st.integers(-10, 6),
    "--block-size": st.integers(-3, 80),
    "--draft-window": st.integers(-3, 5),
    "--device": st.sampled_from(["meta", "mps", "cuda:99", "cpu", "", "gpu", "xla", "cuda:x", "auto", "metal"]),
})


@FUZZ
@given(flags=flag_values)
def test_generate_flags(tiny, flags):
    target, draft = tiny
    args = ["generate", "--target", target, "--draft", draft, "--raw", "--json", "--engine", "cuda"]
    if "--max-new-tokens" not in flags:
        args += ["--max-new-tokens", "4"]
    for name, value in flags.items():
        args += [name, repr(value) if isinstance(value, float) and not math.isfinite(value) else value]
    assert_clean(run(*args, "hello"))


@FUZZ
@given(text=st.lists(st.characters(codec="utf-8") | st.sampled_from(["\udcff", "\udc80", "\x00", "\x1b[2J"]),
                     max_size=12).map("".join))
def test_generate_prompts_of_any_characters(tiny, text):
    target, draft = tiny
    assert_clean(run("generate", "--target", target, "--draft", draft, "--raw", "--json", "-n", "2",
                     "--engine", "cuda", text))


def test_chat_plain_survives_invalid_utf8_on_stdin(tiny, tmp_path, data_dir):
    from tests.tiny import write_profile

    target, draft = tiny
    profile = write_profile(tmp_path / "p.toml", target, draft, max_new_tokens=4)
    result = run("chat", "--plain", "--profile", profile, input=b"\xff\xfe broken\nhello\n")
    assert_clean(result, allowed=(0,))


# -- profiles ------------------------------------------------------------------------------------

keys = st.sampled_from(["name", "description", "model", "target", "draft", "engine", "default", "dtype", "dflash",
                        "block_size", "draft_window", "target_layer_ids", "generation", "temperature", "top_p",
                        "max_new_tokens", "thinking", "system_prompt", "engines", "mlx", "bench", "x", ""])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), floats, st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                      max_leaves=8)


def _toml(document: dict) -> str:
    import tomlkit

    clean = json.loads(json.dumps(document, default=str).replace("NaN", "null").replace("Infinity", "null"))

    def drop_none(v):
        if isinstance(v, dict):
            return {k: drop_none(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [drop_none(x) for x in v if x is not None]
        return v

    return tomlkit.dumps(drop_none(clean))


@FUZZ
@given(document=st.dictionaries(keys, values, max_size=6), prefix=st.sampled_from(["", "\ufeff", "name = 'x'\n"]))
def test_profiles_of_any_shape(tiny, tmp_path_factory, document, prefix):
    path = tmp_path_factory.mktemp("p") / "fuzz.toml"
    try:
        text = _toml(document)
    except Exception:
        text = "x = 1\n"
    path.write_text(prefix + text, encoding="utf-8")
    assert_clean(run("profile", "validate", path))
    assert_clean(run("generate", "--profile", path, "-n", "2", "--engine", "cuda", "hi"))


@pytest.mark.parametrize("text", [
    "a = " + "[" * 5000 + "]" * 5000,  # nesting deep enough to exhaust a recursive parser
    "[" + ".".join(["t"] * 3000) + "]\n",
    f"name = \"{'n' * 300}\"\n",
    "\ufeffname = 'bom'\n",
    "name = \"\\u0000\"\n",
    "\x00\x01\x02",
], ids=["deep-array", "deep-table", "long-name", "bom", "nul-name", "binary"])
def test_profiles_that_break_parsers(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    assert_clean(run("profile", "validate", path))
    assert_clean(run("profile", "show", path))


def test_profile_names_that_are_not_names():
    for name in ["../x", "a" * 300, "", "/etc/passwd", "x\x00y", "con:"]:
        assert_clean(run("profile", "show", name), allowed=(2,))
        assert_clean(run("profile", "new", name), allowed=(2,))


# -- session files -------------------------------------------------------------------------------

weird = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5), st.lists(st.integers(), max_size=2),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.booleans(), floats)


def _good_session(folder: Path, session_id: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{session_id}.jsonl"
    header = {"type": "header", "format": 1, "id": session_id, "created": "2026-01-01T12:00:00+00:00",
              "profile": {"name": "tiny"}, "engine": "cuda"}
    turn = {"type": "turn", "index": 0, "status": "completed", "user": "hello", "answer": "hi", "settings": {}}
    path.write_text(json.dumps(header) + "\n" + json.dumps(turn) + "\n")
    return path


@FUZZ
@given(field=st.sampled_from(["format", "created", "id", "profile", "engine", "type"]), value=weird,
       turn_field=st.sampled_from(["user", "answer", "settings", "summary", "status", "index", "prompt_ids", "steps"]),
       turn_value=weird, raw=st.binary(max_size=30))
def test_malformed_session_files_never_break_listing(tmp_path_factory, monkeypatch, field, value, turn_field,
                                                     turn_value, raw):
    data = tmp_path_factory.mktemp("data")
    monkeypatch.setenv("DFLASH_DATA_DIR", str(data))
    folder = data / "sessions"
    good = _good_session(folder, "20260101-120000-good")
    bad = _good_session(folder, "20260101-130000-badd")
    lines = bad.read_text().splitlines()
    header, turn = json.loads(lines[0]), json.loads(lines[1])
    header[field] = value
    turn[turn_field] = turn_value
    bad.write_text(json.dumps(header) + "\n" + json.dumps(turn) + "\n")
    (folder / "20260101-140000-raww.jsonl").write_bytes(raw)
    listed = run("sessions", "list", "--json")
    assert_clean(listed, allowed=(0,))
    assert "20260101-120000-good" in listed.stdout
    for ident in ("20260101-120000-good", "20260101-130000-badd", "20260101-140000-raww"):
        assert_clean(run("sessions", "show", ident))
        assert_clean(run("sessions", "export", ident, "--format", "json"))
    assert good.exists()


def test_sessions_show_escapes_terminal_control_sequences(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path))
    path = _good_session(tmp_path / "sessions", "20260101-120000-esc1")
    lines = path.read_text().splitlines()
    turn = json.loads(lines[1])
    turn["user"] = "title\x1b]0;pwned\x07 \x1b[2J"
    path.write_text(lines[0] + "\n" + json.dumps(turn) + "\n")
    for args in (["sessions", "show", "20260101-120000-esc1"], ["sessions", "list"]):
        result = run(*args)
        assert result.exit_code == 0 and "\x1b" not in result.output and "\x07" not in result.output


# -- checkpoints ---------------------------------------------------------------------------------

config_keys = st.sampled_from(["hidden_size", "num_hidden_layers", "vocab_size", "model_type", "num_attention_heads",
                               "max_position_embeddings", "num_key_value_heads", "head_dim", "intermediate_size",
                               "text_config", "eos_token_id"])


@FUZZ
@given(key=config_keys, value=weird, draft_key=st.sampled_from(["hidden_size", "num_hidden_layers", "block_size",
                                                                 "dflash_config", "num_target_layers", "vocab_size"]),
       draft_value=weird, which=st.sampled_from(["target", "draft"]))
def test_checkpoint_configs_of_any_shape(tiny, tmp_path_factory, key, value, draft_key, draft_value, which):
    target, draft = tiny
    root = tmp_path_factory.mktemp("ck")
    t, d = root / "t", root / "d"
    shutil.copytree(target, t)
    shutil.copytree(draft, d)
    folder, field, new = (t, key, value) if which == "target" else (d, draft_key, draft_value)
    config = json.loads((folder / "config.json").read_text())
    config[field] = new
    (folder / "config.json").write_text(json.dumps(config))
    assert_clean(run("generate", "--target", t, "--draft", d, "--raw", "-n", "2", "--engine", "cuda", "hi"))


@pytest.mark.parametrize("body", ["[]", "null", "\"text\"", "{", "", "{\"hidden_size\": \"64\"}"])
def test_config_json_that_is_not_an_object(tiny, tmp_path, body):
    target, _ = tiny
    folder = tmp_path / "t"
    shutil.copytree(target, folder)
    (folder / "config.json").write_text(body)
    assert_clean(run("generate", "--target", folder, "--raw", "-n", "2", "hi"), allowed=(2,))


def test_draft_whose_config_and_weights_disagree(tiny, tmp_path):
    target, draft = tiny
    folder = tmp_path / "d"
    shutil.copytree(draft, folder)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = config["intermediate_size"] * 2
    (folder / "config.json").write_text(json.dumps(config))
    result = run("generate", "--target", target, "--draft", folder, "--raw", "-n", "2", "hi")
    assert_clean(result, allowed=(2,))
    assert "intermediate" in result.output or "mlp" in result.output


def test_target_missing_a_layers_tensors_is_refused(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    target, _ = tiny
    folder = tmp_path / "t"
    shutil.copytree(target, folder)
    weights = load_file(str(folder / "model.safetensors"))
    missing = sorted(k for k in weights if ".layers.1." in k)
    save_file({k: v for k, v in weights.items() if k not in missing}, str(folder / "model.safetensors"))
    result = run("generate", "--target", folder, "--raw", "-n", "2", "hi")
    assert_clean(result, allowed=(2,))
    assert "layers.1." in result.output


def test_a_draft_passed_as_the_target_is_refused(tiny):
    _, draft = tiny
    assert_clean(run("generate", "--target", draft, "--raw", "-n", "2", "hi"), allowed=(2,))


# -- names that are not ids ----------------------------------------------------------------------

@FUZZ
@given(ident=st.text(string.printable, max_size=12))
def test_any_session_id(tmp_path_factory, monkeypatch, ident):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path_factory.mktemp("ids")))
    for command in ("show", "export", "delete"):
        assert_clean(run("sessions", command, ident, *(["--yes"] if command == "delete" else [])))


def _recorded_then_edited(tiny, tmp_path, monkeypatch, max_new_tokens: int, edit) -> str:
    """A one-turn chat recorded with the real CLI, then its turn record changed by `edit`: the id."""
    from tests.tiny import write_profile

    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    target, draft = tiny
    profile = write_profile(tmp_path / "p.toml", target, draft, max_new_tokens=max_new_tokens)
    assert run("chat", "--plain", "--profile", profile, input="hello\n").exit_code == 0
    (path,) = (tmp_path / "data" / "sessions").glob("*.jsonl")
    header, turn = path.read_text().splitlines()
    record = json.loads(turn)
    edit(record)
    path.write_text(header + "\n" + json.dumps(record) + "\n")
    return path.stem


@pytest.mark.parametrize("ids", [[999999], [-1], [1, 2, 10**30]])
def test_replay_of_tampered_prompt_ids(tiny, tmp_path, monkeypatch, ids):
    """A session whose recorded prompt ids were edited: replay says so in one sentence."""
    session_id = _recorded_then_edited(tiny, tmp_path, monkeypatch, 4, lambda record: record.update(prompt_ids=ids))
    assert_clean(run("replay", session_id, "--block-sizes", "1", "--no-save"), allowed=(2,))


def test_cuda_engine_refuses_devices_it_does_not_run(tiny):
    target, draft = tiny
    result = run("generate", "--target", target, "--engine", "cuda", "--device", "mps", "--raw", "-n", "2", "hi")
    assert_clean(result, allowed=(2,))
    assert "--engine mlx" in result.output


def test_a_bad_flag_is_blamed_on_the_command_line_not_the_profile():
    result = run("generate", "--profile", "demo", "--draft-window", "0", "hi")
    assert_clean(result, allowed=(2,))
    assert "command line" in result.output and "built-in profile" not in result.output


def test_replay_exits_1_and_says_where_when_outputs_differ(tiny, tmp_path, monkeypatch):
    def change_token_2(record):  # the recording no longer matches
        record["emitted_ids"][2] = (record["emitted_ids"][2] + 1) % 300

    session_id = _recorded_then_edited(tiny, tmp_path, monkeypatch, 6, change_token_2)
    result = run("replay", session_id, "--block-sizes", "1,4", "--no-save")
    assert result.exit_code == 1 and "outputs differ: turn 0" in result.output and "at token 2" in result.output


def test_tune_refuses_a_profile_it_cannot_write_before_the_sweep(tiny, tmp_path):
    """A profile whose name is not a file name (here '../x') is refused before any model loads."""
    target, draft = tiny
    profile = tmp_path / "bad.toml"
    profile.write_text(f'name = "../x"\n[model]\ntarget = "{target}"\ndraft = "{draft}"\n')
    result = run("tune", "--profile", profile, "--block-sizes", "1,4", "--max-samples", "1")
    assert_clean(result, allowed=(2,))
    assert "not usable as a file name" in result.output and "loading" not in result.output.lower()
