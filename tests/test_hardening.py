"""Hostile checkpoints and outputs: code in a checkpoint never runs, pickled weights are refused, and
no command destroys a file it does not own. Every case is bad input: one sentence, exit 2, or a
clean run; never a prompt, never a traceback."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import sessions
from tests.tiny import write_profile

EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('code from a checkpoint ran')\n"


def invoke(*args, input="y\ny\ny\n"):
    """In-process, with 'y' waiting on stdin: a trust prompt that appeared would take it."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def assert_refused(result, *phrases):
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.output.strip().endswith(errors[0]), result.output
    assert "[y/N]" not in result.output and "Traceback" not in result.output
    for phrase in phrases:
        assert phrase in result.output, result.output


def plant(folder: Path, marker: Path) -> None:
    """The attack: a module that leaves a marker when imported, and configs pointing loaders at it."""
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (folder / "__init__.py").write_text(EVIL.format(marker=str(marker)))


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "a module shipped in a checkpoint was executed"


def edited_target(pairs, folder: Path, filename: str, **updates) -> Path:
    """A copy of the tiny qwen3 target with `updates` merged into one of its JSON files."""
    good, _ = pairs("qwen3")
    shutil.copytree(good, folder)
    data = json.loads((folder / filename).read_text())
    data.update(updates)
    (folder / filename).write_text(json.dumps(data))
    return folder


@pytest.fixture
def custom_type_target(pairs, tmp_path, marker):
    """A target of an unknown model type whose config maps the auto classes to its own code."""
    folder = edited_target(pairs, tmp_path / "custom", "config.json", model_type="evilnet",
                           architectures=["EvilForCausalLM"],
                           auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM",
                                     "AutoTokenizer": ["evil.EvilTokenizer", None]})
    plant(folder, marker)
    return folder


@pytest.fixture
def custom_tokenizer_target(pairs, tmp_path, marker):
    """A supported model type whose tokenizer config names a class from the checkpoint's own code."""
    folder = edited_target(pairs, tmp_path / "custom-tok", "tokenizer_config.json", tokenizer_class="EvilTokenizer",
                           auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    plant(folder, marker)
    return folder


class Payload:
    """Unpickling this runs code: what a hostile pytorch_model.bin holds."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (EVIL.format(marker=self.marker),)


@pytest.fixture
def pickle_target(pairs, tmp_path, marker):
    good, _ = pairs("qwen3")
    folder = tmp_path / "pickled"
    shutil.copytree(good, folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    return folder


def test_unknown_model_type_with_custom_code_is_refused_by_every_command(custom_type_target, pairs, tmp_path, data_dir):
    _, draft = pairs("qwen3")
    target = custom_type_target
    assert_refused(invoke("generate", "--target", target, "--raw", "-n", "4", "hi"), "evilnet")
    assert_refused(invoke("generate", "--target", target, "--engine", "cuda", "--raw", "-n", "4", "hi"), "evilnet")
    profile = write_profile(tmp_path / "evil.toml", target, draft)
    chat = invoke("chat", "--plain", "--profile", profile, input="y\nhello\n")
    assert chat.exit_code == 2 and "evilnet" in chat.output and "[y/N]" not in chat.output
    assert_refused(invoke("bench", "--profile", profile, "--block-sizes", "1", "--max-samples", "1"), "evilnet")
    assert_refused(invoke("serve", "--profile", profile, "--port", "0"), "evilnet")  # refused before it listens
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"turns": ["hi", "hello"]}) + "\n")
    assert_refused(invoke("train-draft", "--target", target, "--data", data, "--out", tmp_path / "d", "--max-steps", "1"),
                   "evilnet")


def test_replay_of_a_session_whose_target_turned_hostile_is_refused(custom_type_target, pairs, tmp_path, data_dir):
    target, draft = pairs("qwen3")
    profile = write_profile(tmp_path / "tiny.toml", target, draft, max_new_tokens=4)
    recorded = invoke("chat", "--plain", "--profile", profile, input="hello\n")
    assert recorded.exit_code == 0, recorded.output
    (path,) = sessions.session_paths()
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    for key in ("target", "target_path"):
        if key in header:
            header[key] = str(custom_type_target)
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert_refused(invoke("replay", path.stem, "--block-sizes", "1", "--no-save"), "evilnet")


def test_tokenizer_code_in_a_supported_target_never_runs(custom_tokenizer_target):
    result = invoke("generate", "--target", custom_tokenizer_target, "--raw", "-n", "4", "hi")
    assert result.exit_code in (0, 2), result.output
    assert "[y/N]" not in result.output and "Traceback" not in result.output


def test_public_drafts_shipping_code_and_auto_map_still_load(pairs, tmp_path, marker):
    """The published drafts carry dflash.py and an auto_map: both are ignored, the draft loads."""
    target, good_draft = pairs("qwen3")
    draft = tmp_path / "draft"
    shutil.copytree(good_draft, draft)
    (draft / "dflash.py").write_text(EVIL.format(marker=str(marker)))
    config = json.loads((draft / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    (draft / "config.json").write_text(json.dumps(config))
    result = invoke("generate", "--target", target, "--draft", draft, "--raw", "-n", "8", "--json", "hi")
    assert result.exit_code == 0, result.output


def test_pickled_weights_are_refused_before_loading(pickle_target, pairs, tmp_path):
    assert_refused(invoke("generate", "--target", pickle_target, "--raw", "-n", "4", "hi"), "pytorch_model.bin", "safetensors")
    _, draft = pairs("qwen3")
    pickled_draft = tmp_path / "pickled-draft"
    shutil.copytree(draft, pickled_draft)
    (pickled_draft / "model.safetensors").unlink()
    (pickled_draft / "pytorch_model.bin").write_bytes(b"not even a pickle")
    target, _ = pairs("qwen3")
    assert_refused(invoke("generate", "--target", target, "--draft", pickled_draft, "--raw", "-n", "4", "hi"),
                   "pytorch_model.bin")


def test_pickles_beside_safetensors_are_never_read(pairs, tmp_path, marker):
    good, _ = pairs("qwen3")
    folder = tmp_path / "both"
    shutil.copytree(good, folder)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    result = invoke("generate", "--target", folder, "--raw", "-n", "4", "--json", "hi")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("content, phrase", [
    (b"", "0 bytes"), (b"\x00" * 3, "3 bytes"), (b"garbage garbage garbage", "header claims"),
    ((2**62).to_bytes(8, "little") + b"{}", "header claims"), ((2).to_bytes(8, "little") + b"[]", "does not list"),
    ((5).to_bytes(8, "little") + b"{nope", "not JSON"),
])
def test_torn_or_hostile_safetensors_headers_are_one_sentence(pairs, tmp_path, content, phrase):
    good, _ = pairs("qwen3")
    folder = tmp_path / "torn"
    shutil.copytree(good, folder)
    (folder / "model.safetensors").write_bytes(content)
    assert_refused(invoke("generate", "--target", folder, "--raw", "-n", "4", "hi"), "safetensors")


# -- train-draft writes only where it owns the folder ---------------------------------------------


def _train(target, data, out, *extra):
    return invoke("train-draft", "--target", target, "--data", data, "--out", out, "--block-size", "4",
                  "--max-steps", "2", "--epochs", "1", "--batch-size", "1", "--responses", "given",
                  "--val-prompts", "0", *extra)


@pytest.fixture
def train_data(tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"turns": [f"What is {i} + {i}?", f"{i} + {i} = {2 * i}."]}) + "\n"
                            for i in range(6)))
    return data


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_train_draft_refuses_outputs_it_does_not_own_before_any_work(pairs, tmp_path, train_data):
    target, draft = pairs("qwen3")
    before_target, before_draft = _snapshot(target), _snapshot(draft)
    assert_refused(_train(target, train_data, target), "target's folder")
    assert_refused(_train(target, train_data, target / "sub"), "target's folder")
    assert_refused(_train(target, train_data, draft), "already holds a model")
    assert_refused(_train(target, train_data, train_data), "data file")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert_refused(_train(target, train_data, a_file), "is a file")
    assert_refused(_train(target, train_data, tmp_path / "new", "--work-dir", a_file), "is a file")
    assert _snapshot(target) == before_target and _snapshot(draft) == before_draft and a_file.read_text() == "mine"


@pytest.mark.parametrize("mark", ["training.json", ".dflash-train-draft"])
def test_a_file_named_like_train_drafts_mark_is_not_its_mark(pairs, tmp_path, train_data, mark):
    """The user's own training.json (a log of theirs) or a file merely named like the claim: the folder is
    still theirs, refused before any work, and nothing in it changes."""
    target, _ = pairs("qwen3")
    out = tmp_path / "mine"
    out.mkdir()
    (out / mark).write_text('{"steps": 5, "note": "my own run"}\n')
    (out / "README.md").write_text("my notes\n")
    before = _snapshot(out)
    assert_refused(_train(target, train_data, out), "no mark of train-draft's")
    assert _snapshot(out) == before


def test_data_reachable_through_a_claimed_folder_is_refused_before_any_work(pairs, tmp_path, train_data, no_weights):
    """--data inside --out by its path as given (a link in the folder to the user's file) or as a hard link of a
    file there: a responses cache written into the folder would land in the user's data."""
    from dflash_tui.engines.outputs import claim_output_dir

    target, _ = pairs("qwen3")
    before = train_data.read_bytes()
    for how in ("symlink", "hardlink"):
        out = tmp_path / how
        claim_output_dir(out, option="--out")  # an earlier run's folder: train-draft's own
        cache = out / "responses.jsonl"
        (cache.symlink_to if how == "symlink" else cache.hardlink_to)(train_data)
        data = cache if how == "symlink" else train_data
        assert_refused(_train(target, data, out, "--responses", "generate"), "is inside --out")
    assert train_data.read_bytes() == before


def test_train_draft_writes_a_complete_draft_and_a_rerun_may_replace_its_own(pairs, tmp_path, train_data):
    target, _ = pairs("qwen3")
    out = tmp_path / "my-draft"
    first = _train(target, train_data, out)
    assert first.exit_code == 0, first.output
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "training.json"} <= names
    assert not [n for n in names if n.startswith(".draft-")], names  # the staging folder is gone
    marker = json.loads((out / "training.json").read_text())
    assert marker["written_by"] == "dflash train-draft" and marker["steps"] == 2
    again = _train(target, train_data, out, "--fresh")  # its own output: replacing it is allowed
    assert again.exit_code == 0, again.output
    loads = invoke("generate", "--target", target, "--draft", out, "--raw", "-n", "4", "--json", "hi")
    assert loads.exit_code == 0, loads.output


# -- sessions: delete and export stay inside what dflash owns -------------------------------------


def _session(data_dir: Path, session_id: str) -> Path:
    writer = sessions.SessionWriter({"profile": {"name": "tiny"}}, session_id=session_id)
    writer.append_turn({"index": 0, "status": "completed", "user": "q", "answer": "a", "settings": {}})
    writer.close()
    return writer.path


def test_delete_refuses_files_outside_the_sessions_folder_and_short_prefixes(data_dir, tmp_path):
    path = _session(data_dir, "20260101-120000-abcd")
    outside = tmp_path / "notes.jsonl"
    outside.write_text(path.read_text())
    assert_refused(invoke("sessions", "delete", outside, "--yes"), "not in the sessions folder")
    assert outside.exists()
    assert_refused(invoke("sessions", "delete", "2", "--yes"), "too short")
    foreign = path.parent / "foreign.jsonl"
    foreign.write_text("hello\n")
    assert_refused(invoke("sessions", "delete", foreign, "--yes"), "header")
    assert foreign.exists() and path.exists()


def test_delete_asks_first_and_takes_the_replay_files_along(data_dir):
    path = _session(data_dir, "20260101-120000-abcd")
    replay_file = path.parent / f"{path.stem}.replay-20260101-130000.json"
    replay_file.write_text("{}")
    other = _session(data_dir, "20260102-120000-ef01")
    kept = invoke("sessions", "delete", "20260101-12", input="n\n")
    assert kept.exit_code == 0 and path.exists() and "Delete session 20260101-120000-abcd" in kept.output
    assert "Nothing deleted" in kept.output
    gone = invoke("sessions", "delete", "20260101-12", input="y\n")
    assert gone.exit_code == 0, gone.output
    assert not path.exists() and not replay_file.exists() and other.exists()


def test_delete_with_no_answer_on_stdin_needs_yes(data_dir):
    path = _session(data_dir, "20260101-120000-abcd")
    result = CliRunner().invoke(main, ["sessions", "delete", "20260101-120000-abcd"])  # stdin at its end
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("error: ")
    assert "pass --yes" in result.output
    assert path.exists()


def test_export_never_writes_into_the_sessions_folder(data_dir, tmp_path):
    path = _session(data_dir, "20260101-120000-abcd")
    before = path.read_bytes()
    assert_refused(invoke("sessions", "export", "20260101-120000-abcd", "-o", path), "is a session file")
    assert_refused(invoke("sessions", "export", "20260101-120000-abcd", "-o", path.parent / "x.md"), "sessions folder")
    assert path.read_bytes() == before
    assert_refused(invoke("sessions", "export", "20260101-120000-abcd", "-o", "/nonexistent/x.md"), "Cannot write")
    out = tmp_path / "x.md"
    assert invoke("sessions", "export", "20260101-120000-abcd", "-o", out).exit_code == 0
    assert out.stat().st_mode & 0o777 == 0o600


# -- hub checkpoints ------------------------------------------------------------------------------


def test_offline_names_every_missing_checkpoint_in_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = invoke("generate", "--target", "nobody/target-x", "--draft", "nobody/draft-y", "hi")
    assert_refused(result, "The target 'nobody/target-x' and the draft 'nobody/draft-y' are not in the Hugging Face cache",
                   "hf download nobody/target-x && hf download nobody/draft-y")


def test_a_missing_pair_without_a_terminal_names_the_download_command(tmp_path, monkeypatch, data_dir):
    """Online but not cached, and nobody at a terminal to confirm: exit 2 with `hf download`, and a
    piped chat never takes a prompt line as the answer."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = invoke("generate", "--target", "nobody/target-x", "--draft", "nobody/draft-y", "hi")
    assert_refused(result, "no terminal to confirm the download", "hf download nobody/target-x && hf download nobody/draft-y")
    profile = tmp_path / "remote.toml"
    profile.write_text('name = "p"\n[model]\ntarget = "nobody/target-x"\ndraft = "nobody/draft-y"\n')
    chat = invoke("chat", "--plain", "--profile", profile, input="y\nhello\n")
    assert chat.exit_code == 2 and "hf download nobody/target-x" in chat.output and not list(data_dir.glob("**/*.jsonl"))


@pytest.mark.parametrize("flags, phrase", [(["--block-size", "65"], "from 1 to 64"), (["--max-new-tokens", "-5"], "positive"),
                                           (["--max-new-tokens", "0"], "positive"), (["--block-size", "0"], "from 1 to 64")])
def test_chat_flags_are_checked_before_anything_loads(tmp_path, flags, phrase, data_dir):
    profile = tmp_path / "p.toml"
    profile.write_text('name = "p"\n[model]\ntarget = "nobody/never-loaded"\n')  # loading it would fail otherwise
    assert_refused(invoke("chat", "--plain", "--profile", profile, *flags, input="hello\n"), phrase)


def test_the_error_screen_shows_install_hints_literally():
    """An error naming a pip extra keeps its brackets on screen (they are not Rich markup)."""
    import asyncio

    from textual.app import App
    from textual.widgets import Static

    from dflash_tui.tui.screens.error import LoadErrorScreen

    message = "The cuda engine needs torch; install it with `pip install 'dflash-tui[cuda]'`."

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(LoadErrorScreen(message))

    async def run() -> str:
        app = Host()
        async with app.run_test() as pilot:
            await pilot.pause()
            return str(app.screen.query_one("#error-message", Static).render())

    assert "'dflash-tui[cuda]'" in asyncio.run(run())


# -- round 2: every bad input is one sentence, exit 2, before any weight loads ---------------------


@pytest.fixture
def no_weights(monkeypatch):
    """Loading weights fails the test (the CLI reports it as 'unexpected', exit 1): a timing-free marker
    that a refusal came before any weight load, and before train-draft's tokenizer."""
    def loaded(*args, **kwargs):
        raise AssertionError("weights were loaded")

    import importlib

    import dflash_tui.engines.cuda.training.trainer as trainer

    for name in ("dflash_tui.cli.generate", "dflash_tui.cli.measure", "dflash_tui.repl"):  # (cli.generate is
        monkeypatch.setattr(importlib.import_module(name), "load_engine", loaded)  # also a command's name)
    monkeypatch.setattr(trainer, "load_tokenizer", loaded)
    monkeypatch.setattr(trainer, "Target", loaded)


@pytest.fixture
def copied(pairs, tmp_path):
    """(target, draft) copies of the tiny qwen3 pair, to damage."""
    target, draft = pairs("qwen3")
    shutil.copytree(target, tmp_path / "t")
    shutil.copytree(draft, tmp_path / "d")
    return tmp_path / "t", tmp_path / "d"


def _generate(target, draft=None, *extra, prompt="hi", input=None):
    return invoke("generate", "--target", target, *(["--draft", draft] if draft else []), "-n", "2", *extra, prompt,
                  input=input)


def _edit_header(file: Path, edit) -> None:
    """Rewrite a safetensors header through `edit(header)`, the tensor bytes kept."""
    raw = file.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    edit(header)
    text = json.dumps(header).encode()
    file.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length:])


def _tensors(header: dict) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def _overlap(header):
    first, second = _tensors(header)[:2]
    start, end = header[second]["data_offsets"]
    header[second]["data_offsets"] = [start - 4, end - 4]


def _retype(dtype):
    def edit(header):
        name = next(k for k in _tensors(header) if k.endswith("norm.weight"))
        header[name]["dtype"] = dtype  # same width (4 bytes) for I32; BOOL/U8 are refused on the dtype first
    return edit


@pytest.mark.parametrize("damage, phrase", [
    (lambda f: f.write_bytes(f.read_bytes()[:-1]), "truncated"),
    (lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]), "truncated"),
    (lambda f: _edit_header(f, _overlap), "overlaps"),
    (lambda f: _edit_header(f, _retype("Q7")), "unknown dtype 'Q7'"),
    (lambda f: _edit_header(f, _retype("I32")), "not floating point"),
    (lambda f: _edit_header(f, _retype("BOOL")), "BOOL"),
    (lambda f: _edit_header(f, lambda header: header.update(__metadata__={"format": 5})), "__metadata__"),
    (lambda f: _edit_header(f, lambda header: header.update(__metadata__=[1])), "__metadata__"),
], ids=["a-byte-short", "half", "overlapping", "unknown-dtype", "int", "bool", "metadata-number", "metadata-list"])
def test_corrupt_draft_weights_are_one_sentence_before_loading(copied, no_weights, damage, phrase):
    target, draft = copied
    damage(draft / "model.safetensors")
    assert_refused(_generate(target, draft, "--raw"), "model.safetensors", phrase)


@pytest.mark.parametrize("key, value, phrase", [
    ("rope_theta", "ten thousand", "rope_theta"), ("rms_norm_eps", "tiny", "rms_norm_eps"),
    ("rope_scaling", {"rope_type": "yarn", "factor": "x"}, "rope_scaling.factor"),
    ("dflash_config", {"mask_token_id": 3, "target_layer_ids": [1, 1]}, "target_layer_ids"),
    ("rms_norm_eps", 10**400, "rms_norm_eps"),  # JSON's integers have no limit; a float has
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "rope_scaling.low_freq_factor"),
    ("architectures", 5, "architectures"),
], ids=["rope-theta-text", "eps-text", "yarn-factor-text", "repeated-layers", "eps-beyond-float", "llama3-incomplete",
        "architectures-number"])
def test_bad_draft_config_values_are_one_sentence_before_loading(copied, no_weights, key, value, phrase):
    target, draft = copied
    config = json.loads((draft / "config.json").read_text())
    config[key] = value
    (draft / "config.json").write_text(json.dumps(config))
    assert_refused(_generate(target, draft, "--raw"), "config.json", phrase)


def test_a_generation_config_that_is_not_numbers_is_one_sentence(copied, no_weights):
    target, draft = copied
    (target / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": "hot"}))
    assert_refused(_generate(target, draft, "--raw"), "generation_config.json", "temperature")


def test_a_weight_index_naming_a_pickle_is_refused_before_any_loader(copied, marker, no_weights):
    target, _ = copied
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "pytorch_model.bin"}}))
    (target / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    assert_refused(_generate(target, None, "--raw"), "pytorch_model.bin", "pickles are never opened")


def test_a_target_whose_config_and_weights_disagree_is_refused_before_loading(copied, no_weights):
    target, _ = copied
    config = json.loads((target / "config.json").read_text())
    config["vocab_size"] += 16
    (target / "config.json").write_text(json.dumps(config))
    result = _generate(target, None, "--raw")
    assert_refused(result, "embed_tokens.weight", "disagree")
    assert "MISMATCH" not in result.output


@pytest.fixture
def template_target(copied):
    def write(template: str) -> Path:
        target, _ = copied
        (target / "chat_template.jinja").write_text(template)
        return target
    return write


HOSTILE_TEMPLATES = {
    "nested-loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "huge-range": "{% for i in range(10**9) %}{{ i }}{% endfor %}",
    "huge-string": "{{ 'x' * 10**11 }}",
    "include": "{% include 'secrets.txt' %}",
    "import": "{% import 'macros.j2' as m %}",
    "sandbox": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "raise": "{{ raise_exception('no \x1b]0;pwned\x07 way') }}",
    "syntax": "{% for %}",
    "width": "{{ '%99999999999d' % 1 }}",
}


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_hostile_chat_templates_are_one_sentence_naming_the_file(template_target, no_weights, name):
    """Jinja's sandbox violations, includes, huge ranges and strings, and a nested loop (which hung
    `generate`): each is one sentence naming chat_template.jinja, exit 2, with the default limits."""
    result = _generate(template_target(HOSTILE_TEMPLATES[name]), None)
    assert_refused(result, "chat_template.jinja")
    assert "\x1b" not in result.output and "\x07" not in result.output


def test_a_prompt_that_cannot_run_is_refused_before_loading(pairs, no_weights):
    target, draft = pairs("qwen3")
    long = "word " * 700
    assert_refused(_generate(target, draft, "--raw", prompt=long), "context holds 512")  # argv
    assert_refused(_generate(target, draft, "--raw", prompt="-", input=long), "context holds 512")  # stdin
    assert_refused(invoke("generate", "--target", target, "-n", "2", "-", input=b"caf\xe9 \xff"), "not valid UTF-8")
    assert_refused(invoke("generate", "--target", target, "-n", "2", "bad \udcff byte"), "not valid UTF-8")
    assert_refused(invoke("generate", "--target", target, "-n", "2", "--raw", ""), "empty")


def test_generate_with_standard_input_closed_is_one_sentence(pairs):
    import os
    import subprocess
    import sys

    target, _ = pairs("qwen3")
    proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "--target", str(target), "-"],
                          capture_output=True, text=True, preexec_fn=lambda: os.close(0), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("error: PROMPT is '-' but standard input is closed; pipe the prompt in, or pass it "
                                   "as an argument.")


@pytest.mark.parametrize("flags, phrase", [
    (["--lr", "inf"], "'--lr': inf is not a finite number"), (["--lr", "nan"], "'--lr': nan is not a finite number"),
    (["--lr", "0"], "--lr 0"),
    (["--lr", "-1e-3"], "--lr -0.001"), (["--max-new-tokens", "-5"], "--max-new-tokens -5"),
    (["--val-max-new", "0"], "--val-max-new 0"),
])
def test_train_draft_refuses_values_that_would_train_nothing(pairs, tmp_path, train_data, no_weights, flags, phrase):
    target, _ = pairs("qwen3")
    assert_refused(_train(target, train_data, tmp_path / "out", *flags), phrase)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, phrase", [
    (["--seed", "99999999999999999999999"], "'--seed': 99999999999999999999999 does not fit in a 64-bit integer"),
    (["--seed", "-1"], "--seed -1"),
    (["--gamma", "inf"], "'--gamma': inf is not a finite number"), (["--gamma", "nan"], "'--gamma': nan is not a finite number"),
])
def test_train_draft_refuses_a_seed_or_gamma_torch_cannot_use(pairs, tmp_path, train_data, no_weights, flags, phrase):
    """Issue 34, class 17: a seed past 2**32 was an unexpected ValueError (Overflow); --gamma inf trained."""
    target, _ = pairs("qwen3")
    assert_refused(_train(target, train_data, tmp_path / "out", *flags), phrase)
    assert not (tmp_path / "out").exists()


def test_train_draft_refuses_a_stop_token_as_the_mask(pairs, tmp_path, train_data):
    """Every mask slot would read as the end of the answer: refused (by id or by text) before training starts."""
    from dflash_tui.engines.checkpoints import TargetInfo
    from dflash_tui.engines.prompting import load_tokenizer

    target, _ = pairs("qwen3")
    stop = TargetInfo.read(target).stop_ids()[0]
    for given in (str(stop), load_tokenizer(target).convert_ids_to_tokens(stop)):
        result = _train(target, train_data, tmp_path / "out", "--mask-token", given)
        assert_refused(result, "stop token")
        assert result.output.startswith("error: ")  # no blank line from a progress bar that never showed
    assert not (tmp_path / "out").exists()


def test_train_draft_refuses_an_unsupported_model_type_before_its_tokenizer(custom_type_target, tmp_path, train_data,
                                                                          no_weights):
    assert_refused(_train(custom_type_target, train_data, tmp_path / "out"), "evilnet")


def _fifo(path: Path) -> Path:
    import os

    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


@pytest.fixture
def deadline():
    """Fails a test that blocks (a FIFO opened for reading waits for a writer forever) instead of hanging."""
    import signal

    def expired(*_):
        raise TimeoutError("blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_fifos_named_like_weights_or_sessions_never_block(pairs, copied, data_dir, deadline, no_weights):
    target, draft = copied
    _fifo(draft / "model.safetensors")
    assert_refused(_generate(pairs("qwen3")[0], draft, "--raw"), "model.safetensors", "not a regular file")
    _fifo(target / "model.safetensors")
    assert_refused(_generate(target, None, "--raw"), "model.safetensors", "not a regular file")
    path = _session(data_dir, "20260101-120000-abcd")
    fifo = _fifo(path.parent / "20260101-130000-fifo.jsonl")
    listed = invoke("sessions", "list")
    assert listed.exit_code == 0 and "20260101-120000-abcd" in listed.output, listed.output
    assert_refused(invoke("sessions", "show", fifo))
    assert invoke("sessions", "show", "20260101-120000-abcd").exit_code == 0


def test_export_onto_a_fifo_nothing_reads_is_one_sentence_not_a_wait(data_dir, tmp_path, deadline):
    """An export written to a named pipe goes to its reader; with none, opening it for writing would wait
    forever: one sentence instead. A pipe with a reader still gets the export."""
    import os

    _session(data_dir, "20260101-120000-abcd")
    fifo = _fifo(tmp_path / "export.md")
    assert_refused(invoke("sessions", "export", "20260101-120000-abcd", "-o", fifo), "a pipe that nothing reads")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader holds it open (the export fits the pipe)
    try:
        assert invoke("sessions", "export", "20260101-120000-abcd", "-o", fifo).exit_code == 0
        assert os.read(reader, 1 << 16).decode().startswith("# dflash session 20260101-120000-abcd")
    finally:
        os.close(reader)


def test_a_disk_that_fills_while_the_draft_is_published_is_one_sentence(tmp_path):
    """The draft's files are written into a staging folder, then moved into place: a disk that fills on the
    way (faked: the weights' write fails with ENOSPC) is one sentence, and nothing half-written is left."""
    import errno

    from dflash_tui.engines.errors import UserError
    from dflash_tui.engines.outputs import CLAIM, claim_output_dir, publish

    out = tmp_path / "draft"
    claim_output_dir(out, option="--out")

    def write(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(UserError, match="cannot be written into .*No space left on device"):
        publish(out, write)
    assert [p.name for p in out.iterdir()] == [CLAIM]


def test_a_remote_session_resumes_on_its_server_and_never_on_the_demo_pair(data_dir):
    """Issue 34, class 8: a session recorded with `--url` resumed on the local demo pair. It resumes on
    the recorded server; with that server gone it says so (one sentence, exit 2), never another model."""
    from tests.foreign import ForeignServer

    with ForeignServer() as server:
        first = invoke("chat", "--plain", "--url", server.base, input="hello\n")
        assert first.exit_code == 0, first.output
        (session,) = sessions.list_sessions()
        again = invoke("chat", "--plain", "--resume", session.id, input="again\n")
        assert again.exit_code == 0, again.output
        assert f"connecting to {server.base}" in again.stderr and "loading" not in again.stderr
    assert [t["user"] for t in sessions.load_session(session.id).turns] == ["hello", "again"]
    gone = invoke("chat", "--plain", "--resume", session.id, input="once more\n")
    assert_refused(gone, server.base)
    assert "loading" not in gone.output


def test_library_log_lines_reach_the_terminal_escaped(pairs, tmp_path):
    """Issue 34, class 10: transformers logs config values raw ("Missing validation function … 'rope_type'=
    ESC]0;…"); every log record and warning dflash's process prints is escaped like its own text."""
    import subprocess
    import sys

    _, draft = pairs("qwen3")
    target = edited_target(pairs, tmp_path / "target", "config.json",
                           rope_scaling={"rope_type": "\x1b]0;pwned\x07", "factor": 2})
    proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "--target", str(target), "--draft",
                           str(draft), "--raw", "-n", "2", "hi"], capture_output=True, timeout=300)
    assert b"pwned" in proc.stdout + proc.stderr, proc.stderr  # the value is shown, escaped
    assert b"\x1b" not in proc.stdout + proc.stderr and b"\x07" not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.parametrize("url, phrase", [
    ("http://[::1", "Invalid IPv6 URL"), ("http://h:x/v1", "Port"), ("http://h:99999/v1", "Port"),
    ("http://h\x07/v1", "control character"), ("http://h ost/v1", "space"), ("http://:80/v1", "no host"),
    ("http://h/v1?a=1", "query"), ("http://h/v1#top", "query"), ("ftp://h/v1", "not an http(s) URL"),
])
def test_a_malformed_server_url_is_one_sentence(url, phrase):
    """Issue 34, class 17: `--url 'http://[::1'` and a port that is no number were an unexpected
    ValueError/InvalidURL; a space or a query was sent to the network as is."""
    result = invoke("generate", "--url", url, "hi")
    assert_refused(result, phrase, "http://127.0.0.1:8000/v1")
    assert "\x07" not in result.output


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_tools_file_that_is_a_pipe_or_a_device_is_refused_not_waited_on(pairs, tmp_path, kind):
    """Issue 34, class 19: `generate --tools` on a FIFO or /dev/zero hung (the timeout guards the hang;
    it measures nothing)."""
    import os
    import subprocess
    import sys

    target, _ = pairs("qwen3")
    path = tmp_path / "tools.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "--target", str(target), "--tools",
                           str(path), "-n", "2", "hi"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: The tools file {path} cannot be read (not a regular file); point --tools " \
                                  "at a JSON file."


def test_a_replay_whose_comparison_cannot_be_saved_still_prints_its_table(pairs, tmp_path, data_dir, monkeypatch):
    """Issue 34: the comparison was saved before the report was printed, so a full sessions folder
    (faked: ENOSPC creating the comparison file) hid the table the replay had measured."""
    import errno
    import os

    target, draft = pairs("qwen3")
    profile = write_profile(tmp_path / "tiny.toml", target, draft, max_new_tokens=4)
    assert invoke("chat", "--plain", "--profile", profile, input="hi\n").exit_code == 0
    (session,) = sessions.list_sessions()
    real_open = os.open

    def full(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and ".replay-" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full)
    result = invoke("replay", session.id, "-B", "1", "--repeats", "1")
    assert_refused(result, "The comparison cannot be saved", "No space left on device")
    assert "block 1" in result.stdout, result.output


def test_a_profile_or_data_file_that_is_a_pipe_or_a_device_is_named_so(pairs, tmp_path, no_weights):
    """Issue 34: a FIFO or /dev/zero given as a profile or as train-draft's data was refused as a file that
    "does not exist"; it exists, and is refused for what it is (without being opened)."""
    import os

    target, _ = pairs("qwen3")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        assert_refused(invoke("generate", "--profile", path, "hi"), f"{path}: the profile is not a regular file")
        assert_refused(_train(target, path, tmp_path / "out"), f"The data file {path} is not a regular file")


def test_profile_new_where_the_config_folder_cannot_be_made_is_one_sentence(tmp_path, monkeypatch):
    """A config folder that cannot be created or written (here: its parent is a file, a fault root's
    permissions cannot fake) was an unexpected OSError, exit 1."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DFLASH_CONFIG_DIR", str(blocker / "config"))
    assert_refused(invoke("profile", "new", "mine"), "cannot be written", "DFLASH_CONFIG_DIR")
