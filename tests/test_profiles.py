"""TOML profiles and `dflash profile`: lookup, validation messages, overrides, the template, the CLI."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest
import tomlkit
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_tui.core import profiles
from dflash_tui.engines.errors import UserError

BUILTINS = ["qwen3-4b", "qwen3-8b", "llama3.1-8b-instruct"]
GOOD = """name = "mine"
description = "a test profile"
[model]
target = "org/target"
draft = "org/draft"
[engine]
default = "cuda"
dtype = "float32"
[dflash]
block_size = 8
draft_window = 512
thinking_trained = false
[generation]
temperature = 0.6
top_p = 0.95
top_k = 20
max_new_tokens = 64
thinking = false
[engines.mlx]
target = "org/target-4bit"
block_size = 4
"""


@pytest.fixture(autouse=True)
def user_dir(config_dir, monkeypatch) -> Path:
    """Every test gets its own empty user config dir (conftest's config_dir) and no colour."""
    monkeypatch.setenv("NO_COLOR", "1")
    return config_dir / "profiles"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- built-ins and lookup -----------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_loads_with_published_settings(name):
    p = profiles.load_profile(name)
    assert p.name == name and p.origin == "built-in" and p.path.name == f"{name}.toml"
    assert p.draft and p.target and p.description
    assert p.block_size == (10 if name.startswith("llama") else 16)
    assert p.thinking is False and p.draft_thinking is False  # the public drafts are non-thinking
    config = p.engine_config("cuda")
    assert config.source == f"built-in profile {name}" and config.draft == p.draft


def test_builtins_found_through_package_data():
    assert profiles.builtin_profile_dir().is_dir()
    assert {p.name for p in profiles.list_profiles()} >= set(BUILTINS)


def test_lookup_order_path_then_user_then_builtin(user_dir, tmp_path, monkeypatch):
    assert profiles.load_profile("qwen3-8b").origin == "built-in"
    write(user_dir / "qwen3-8b.toml", GOOD.replace('"mine"', '"qwen3-8b"'))
    shadowed = profiles.load_profile("qwen3-8b")
    assert shadowed.origin == "user" and shadowed.target == "org/target"
    listed = {p.name: p for p in profiles.list_profiles()}
    assert listed["qwen3-8b"].origin == "user" and listed["qwen3-4b"].origin == "built-in"
    assert len([p for p in profiles.list_profiles() if p.name == "qwen3-8b"]) == 1
    # A file in the working directory named like a profile wins over both.
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "qwen3-8b", GOOD.replace("org/target", "org/local"))
    local = profiles.load_profile("qwen3-8b")
    assert local.origin == "file" and local.target == "org/local"
    assert profiles.load_profile(str(tmp_path / "qwen3-8b")).target == "org/local"


def test_name_defaults_to_file_stem(tmp_path):
    p = profiles.load_profile(str(write(tmp_path / "plain.toml", '[model]\ntarget = "org/t"\n')))
    assert (p.name, p.description, p.draft, p.engine, p.dtype, p.block_size) == (
        "plain", "", None, "auto", "auto", None)
    assert p.thinking and p.draft_thinking and p.max_new_tokens == 2048


def test_unknown_profile_lists_available(user_dir):
    write(user_dir / "mine.toml", GOOD)
    with pytest.raises(UserError) as e:
        profiles.load_profile("nope")
    assert "'nope'" in str(e.value) and "mine" in str(e.value) and "qwen3-8b" in str(e.value)
    with pytest.raises(UserError, match="does not exist"):
        profiles.load_profile("missing/nope.toml")


def test_list_collects_broken_files_when_asked(user_dir):
    write(user_dir / "broken.toml", "[model\n")
    with pytest.raises(UserError, match="broken.toml"):
        profiles.list_profiles()
    errors = []
    assert {p.name for p in profiles.list_profiles(errors)} >= set(BUILTINS)
    assert len(errors) == 1 and "broken.toml" in str(errors[0])


# --- bad input: file, key and line in one sentence ----------------------------------------------

BAD = [
    # (text, key named in the message, line)
    ('[model]\ntarget = "a"\nblock_size = = 3\n', "block_size", 3),  # malformed TOML
    ('[model]\ntarget = "a"\n[dflash]\nblok_size = 8\n', "dflash.blok_size", 4),  # unknown key
    ('colour = "red"\n[model]\ntarget = "a"\n', "colour", 1),  # unknown top-level key
    ('[model]\ntarget = "a"\n[gen]\ntemperature = 1\n', "gen", 3),  # unknown section
    ('[model]\ntarget = "a"\n[engines.rocm]\ntarget = "b"\n', "engines.rocm", 3),  # unknown engine override
    ('[model]\ntarget = "a"\n[engines.mlx]\ntemperature = 0.1\n', "engines.mlx.temperature", 4),
    ('[model]\ntarget = "a"\n\n[dflash]\nblock_size = "8"\n', "dflash.block_size", 5),  # wrong type
    ('[model]\ntarget = "a"\n[dflash]\nblock_size = 0\n', "dflash.block_size", 4),  # out of range
    ('[model]\ntarget = "a"\n[dflash]\nblock_size = 65\n', "dflash.block_size", 4),
    ('[model]\ntarget = "a"\n[dflash]\nblock_size = true\n', "dflash.block_size", 4),
    ('[model]\ntarget = "a"\n[generation]\ntemperature = -0.1\n', "generation.temperature", 4),
    ('[model]\ntarget = "a"\n[generation]\ntop_p = 0\n', "generation.top_p", 4),
    ('[model]\ntarget = "a"\n[generation]\ntop_p = 1.5\n', "generation.top_p", 4),
    ('[model]\ntarget = "a"\n[generation]\ntemperature = nan\n', "generation.temperature", 4),
    # what every request refuses is refused in the profile (the request's own rules): min_p 1, a temperature
    # below the smallest one sampling takes, or above 100
    ('[model]\ntarget = "a"\n[generation]\nmin_p = 1.0\n', "generation.min_p", 4),
    ('[model]\ntarget = "a"\n[generation]\ntemperature = 0.0001\n', "generation.temperature", 4),
    ('[model]\ntarget = "a"\n[generation]\ntemperature = 101\n', "generation.temperature", 4),
    ('[model]\ntarget = "a"\n[engine]\ndefault = "rocm"\n', "engine.default", 4),
    ('[model]\ntarget = "a"\n[engine]\ndtype = "fp8"\n', "engine.dtype", 4),
    ('[model]\ntarget = "a"\n[engines.cuda]\ndtype = "int4"\n', "engines.cuda.dtype", 4),
    ('[model]\ntarget = "a"\n[dflash]\ntarget_layer_ids = [1, 1]\n', "dflash.target_layer_ids", 4),
    ('[model]\ntarget = 3\n', "model.target", 2),
    ('model = "a"\n', "model", 1),  # a section that is not a table
    ('[model]\ndraft = "a"\n', "model", 1),  # the required target is missing
    ('dflash = { block_size = "8" }\n[model]\ntarget = "a"\n', "dflash.block_size", 1),  # inline table
    ('[model]\ntarget = "a"\ndflash.block_size = 99\n', "model.dflash", 3),  # dotted key, wrong table
    ('[model]\ntarget = "a"\n[bench]\nprompts = "gsm8k"\n', "bench.prompts", 4),  # not a built-in set
    ('[model]\ntarget = "a"\n[bench]\nprompt = "demo"\n', "bench.prompt", 4),  # unknown key
    ('examples = "What is 1 + 1?"\n[model]\ntarget = "a"\n', "examples", 1),  # not a list
    ('name = "x"\nexamples = ["ok", " "]\n[model]\ntarget = "a"\n', "examples", 2),  # an empty example
]


@pytest.mark.parametrize("text,key,line", BAD)
def test_bad_input_names_file_key_and_line(tmp_path, text, key, line):
    path = write(tmp_path / "bad-profile.toml", text)
    with pytest.raises(UserError) as e:
        profiles.load_profile(str(path))
    message = str(e.value)
    assert str(path) in message and key in message and f"line {line}" in message, message
    assert "\n" not in message and message.endswith(".") and "; " in message  # one sentence with a fix


def test_bench_prompts_and_examples(tmp_path):
    demo = profiles.load_profile("demo")
    assert demo.bench_prompts == "demo" and len(demo.examples) == 3 and isinstance(demo.examples, tuple)
    assert demo.examples[0] == "What is 48 + 75?"
    plain = profiles.load_profile(str(write(tmp_path / "plain.toml", '[model]\ntarget = "org/t"\n')))
    assert plain.bench_prompts is None and plain.examples == ()
    path = write(tmp_path / "p.toml", '[model]\ntarget = "a"\n[bench]\nprompts = "gsm8k"\n')
    with pytest.raises(UserError, match=r"the name of a built-in prompt set \(chat, code, demo, math\).*"
                                        r"write e\.g\. prompts = \"chat\"\."):
        profiles.load_profile(str(path))
    path = write(tmp_path / "p.toml", '[model]\ntarget = "a"\n[bench]\nprompt = "demo"\n')
    with pytest.raises(UserError, match="did you mean 'prompts'"):
        profiles.load_profile(str(path))


def test_quoted_number_suggests_removing_quotes(tmp_path):
    path = write(tmp_path / "p.toml", '[model]\ntarget = "a"\n[dflash]\nblock_size = "8"\n')
    with pytest.raises(UserError, match=r"remove the quotes: block_size = 8\."):
        profiles.load_profile(str(path))


def test_unknown_key_suggests_close_match(tmp_path):
    path = write(tmp_path / "p.toml", '[model]\ntaget = "a"\n')
    with pytest.raises(UserError, match="did you mean 'target'"):
        profiles.load_profile(str(path))


def test_non_utf8_file(tmp_path):
    path = tmp_path / "p.toml"
    path.write_bytes(b'name = "\xff"\n')
    with pytest.raises(UserError, match="not UTF-8"):
        profiles.load_profile(str(path))


# --- overrides ----------------------------------------------------------------------------------


def test_flags_override_profile_values(tmp_path):
    p = profiles.load_profile(str(write(tmp_path / "p.toml", GOOD)))
    config = p.engine_config("cuda")
    assert (config.target, config.draft, config.dtype, config.block_size, config.draft_window) == (
        "org/target", "org/draft", "float32", 8, 512)
    assert config.engine == "cuda" and config.source == str(tmp_path / "p.toml") and config.device == "auto"
    flagged = p.engine_config("cuda", block_size=2, dtype="bfloat16", device="cpu", draft=None, target_layer_ids=[0, 2])
    assert (flagged.block_size, flagged.dtype, flagged.device, flagged.draft, flagged.target_layer_ids) == (
        2, "bfloat16", "cpu", "org/draft", [0, 2])


def test_engine_overrides_apply_only_to_their_engine(tmp_path):
    p = profiles.load_profile(str(write(tmp_path / "p.toml", GOOD)))
    assert p.engines == {"mlx": {"target": "org/target-4bit", "block_size": 4}}
    assert (p.resolved("cuda").target, p.resolved("cuda").block_size) == ("org/target", 8)
    mlx = p.resolved("mlx")
    assert (mlx.target, mlx.block_size, mlx.draft, mlx.temperature) == ("org/target-4bit", 4, "org/draft", 0.6)
    assert p.engine_config("mlx").target == "org/target-4bit"
    assert p.engine_config("mlx", block_size=12).block_size == 12
    assert p.engine_config("cuda").target == "org/target"
    with pytest.raises(UserError, match="rocm"):
        p.engine_config("rocm")
    assert p.engine_config().engine == "cuda"  # the profile's [engine] default
    flags_only = profiles.Profile(name="command line", description="", path=None, target="org/t", draft=None)
    assert flags_only.origin == "command line" and flags_only.engine_config("cuda").source == "command line"
    assert profiles.load_profile("qwen3-8b").engine_config("auto").engine in ("cuda", "mlx")


def test_target_and_draft_flags_replace_the_pair_on_every_engine(tmp_path):
    """--target replaces the profile's pair: its draft (trained for its own target) and block size go unless
    --draft names one, and the [engines.*] tables do not put the profile's checkpoints back."""
    from dflash_tui.core.settings import with_pair

    path = str(write(tmp_path / "p.toml", GOOD))
    alone = with_pair(path, target="org/mine")
    for engine in ("cuda", "mlx"):
        config = alone.engine_config(engine)
        assert (config.target, config.draft, config.block_size) == ("org/mine", None, 1)
    paired = with_pair(path, target="org/mine", draft="org/my-draft")
    assert [(c.target, c.draft, c.block_size) for c in (paired.engine_config("cuda"), paired.engine_config("mlx"))] == [
        ("org/mine", "org/my-draft", 8), ("org/mine", "org/my-draft", 8)]
    drafted = with_pair(path, draft="org/my-draft")
    assert (drafted.engine_config("mlx").target, drafted.engine_config("mlx").draft) == ("org/target-4bit", "org/my-draft")


# --- the template -------------------------------------------------------------------------------


def test_new_profile_text_round_trips_and_keeps_comments(tmp_path):
    text = profiles.new_profile_text("mine")
    p = profiles.load_profile(str(write(tmp_path / "mine.toml", text)))
    assert p.name == "mine" and p.target and p.block_size == 16
    doc = tomlkit.parse(text)
    doc["dflash"]["block_size"] = 8
    edited = tomlkit.dumps(doc)
    comments = [line for line in text.splitlines() if "#" in line]
    assert len(comments) > 10 and all(c in edited for c in comments if "block_size" not in c)
    assert profiles.load_profile(str(write(tmp_path / "mine.toml", edited))).block_size == 8
    # Every commented-out optional key is valid once uncommented.
    uncommented = re.sub(r"^# (\w+ = )", r"\1", text, flags=re.M).replace("# [engines.mlx]", "[engines.mlx]")
    q = profiles.load_profile(str(write(tmp_path / "mine.toml", uncommented)))
    assert q.temperature == 0.7 and q.draft_window == 4096 and q.engines["mlx"]["target"]
    assert q.examples == ("What is 48 + 75?",) and q.bench_prompts == "chat"
    with pytest.raises(UserError, match="file name"):
        profiles.new_profile_text("../evil")


# --- hypothesis: nothing but UserError escapes --------------------------------------------------

scalars = st.one_of(st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["auto", "cuda", "mlx", "bfloat16", "8", "0.5"]))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
known = {s: st.fixed_dictionaries({}, optional={k: values for k in keys})
         for s, keys in profiles.SCHEMA.items() if s not in ("", "model")}
documents = st.fixed_dictionaries(
    {"model": st.fixed_dictionaries({"target": st.just("org/t") | values}, optional={"draft": values, "x": values})},
    optional={**known, "name": values, "description": values, "examples": values, "extra": values,
              "engines": st.dictionaries(st.sampled_from(["cuda", "mlx", "rocm"]),
                                         st.fixed_dictionaries({}, optional={k: values for k in profiles.OVERRIDES}),
                                         max_size=2)})


def _load_text(directory: Path, text: str) -> None:
    path = write(directory / "h.toml", text)
    try:
        p = profiles.load_profile(str(path))
    except UserError as e:
        assert str(path) in str(e) and "\n" not in str(e)
    else:
        assert isinstance(p, profiles.Profile)
        for engine in ("cuda", "mlx"):
            assert p.resolved(engine).target


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_random_documents_raise_only_user_error(tmp_path, doc):
    _load_text(tmp_path, tomlkit.dumps(doc))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=string.printable + "é\x00", max_size=120)
       | st.lists(st.sampled_from(['[model]', 'target = "a"', "[dflash]", "block_size = 8", "x = [1,", '"""',
                                   "[engines.mlx]", "a.b = 1", "[[engines]]", "= 3", "top_p = 2"]), max_size=8)
       .map("\n".join))
def test_random_text_raises_only_user_error(tmp_path, text):
    _load_text(tmp_path, text)


# --- the CLI ------------------------------------------------------------------------------------


def run(*args):
    from dflash_tui.cli import main

    return CliRunner().invoke(main, ["profile", *args])


def test_cli_validate_good_and_malformed(tmp_path):
    for name in ("target", "draft"):  # validate checks that the models are here (folders or cached repos)
        (tmp_path / name).mkdir()
    good = write(tmp_path / "good.toml", GOOD.replace('"org/target"', '"target"').replace('"org/draft"', '"draft"'))
    result = run("validate", str(good))
    assert result.exit_code == 0 and result.stdout.startswith("ok: ") and "mine" in result.stdout
    bad = write(tmp_path / "bad.toml", "[model]\ntarget = \n")
    result = run("validate", str(bad))
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "bad.toml, line 2" in result.stderr
    assert "Traceback" not in result.stderr
    missing = run("validate", str(tmp_path / "none.toml"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    # a profile's name works as it does for `show` (the built-in demo's checkpoints are in the repo)
    named = run("validate", "demo")
    assert named.exit_code == 0 and named.stdout.startswith("ok: ") and "profile demo" in named.stdout
    unknown = run("validate", "no-such-profile")
    assert unknown.exit_code == 2 and "neither a file nor a user or built-in profile" in unknown.stderr


def test_cli_list_show_path_new(user_dir):
    listed = run("list")
    assert listed.exit_code == 0 and "\x1b[" not in listed.stdout
    assert all(re.search(rf"^{re.escape(n)}\s+built-in\s", listed.stdout, re.M) for n in BUILTINS)
    as_json = json.loads(run("list", "--json").stdout)
    assert {e["name"]: e["source"] for e in as_json}["qwen3-8b"] == "built-in"
    assert run("path").stdout.strip() == str(user_dir)

    created = run("new", "mine")
    assert created.exit_code == 0 and created.stdout.strip() == str(user_dir / "mine.toml")
    again = run("new", "mine")
    assert again.exit_code == 2 and "--force" in again.stderr
    assert run("new", "mine", "--force").exit_code == 0
    assert {e["name"]: e["source"] for e in json.loads(run("list", "--json").stdout)}["mine"] == "user"

    shown = run("show", "mine")
    assert shown.exit_code == 0 and str(user_dir / "mine.toml") in shown.stdout.splitlines()[0]
    assert tomlkit.parse(shown.stdout)["name"] == "mine"  # the location line is a TOML comment
    unknown = run("show", "nope")
    assert unknown.exit_code == 2 and "qwen3-8b" in unknown.stderr and len(unknown.stderr.splitlines()) == 1


def test_cli_list_reports_broken_user_file(user_dir):
    write(user_dir / "broken.toml", "[model\n")
    result = run("list")
    assert result.exit_code == 0 and "qwen3-8b" in result.stdout and "broken.toml" in result.stderr


def test_dflash_command_has_profile_group():
    from dflash_tui.cli import main

    result = CliRunner().invoke(main, ["profile", "validate", "/nonexistent/p.toml"])
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_a_folder_given_as_the_profile_is_called_a_folder_not_missing(tmp_path, config_dir, monkeypatch):
    """`-p some.toml/` or a checkpoint folder by mistake: the sentence says what the path is; a folder
    that merely shares a profile's name does not hide that profile."""
    folder = tmp_path / "mine.toml"
    folder.mkdir()
    for args in (["validate", str(folder)], ["show", str(folder)]):
        result = run(*args)
        assert result.exit_code == 2 and "is a folder, not a TOML file" in result.stderr, result.output
    (config_dir / "profiles").mkdir(parents=True)
    (config_dir / "profiles" / "mine.toml").write_text('[model]\ntarget = "org/t"\n')
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert profiles.load_profile("mine").target == "org/t"


def test_checkpoint_paths_beside_the_profile_file_resolve(tmp_path):
    from dflash_tui.core.profiles import load_profile

    (tmp_path / "models" / "t").mkdir(parents=True)
    path = tmp_path / "local.toml"
    path.write_text('name = "local"\n[model]\ntarget = "models/t"\ndraft = "org/hub-draft"\n')
    config = load_profile(str(path)).engine_config("cuda")
    assert config.target == str(tmp_path / "models" / "t")
    assert config.draft == "org/hub-draft"  # no such directory: a hub id stays a hub id


def test_a_copy_keeps_working_and_a_hand_copy_is_caught_by_validate(user_dir):
    """Copying demo.toml by hand breaks its relative model paths: validate says so (it used to say
    ok and the run asked to download 'demo/target'); `profile new --from` writes absolute paths."""
    created = run("new", "mydemo", "--from", "demo")
    assert created.exit_code == 0, created.output
    copy = user_dir / "mydemo.toml"
    doc = tomlkit.parse(copy.read_text())
    assert doc["name"] == "mydemo" and Path(doc["model"]["target"]).is_absolute()
    assert run("validate", str(copy)).exit_code == 0
    by_hand = user_dir / "byhand.toml"
    by_hand.write_text((Path(profiles.builtin_profile_dir()) / "demo.toml").read_text())
    result = run("validate", str(by_hand))
    assert result.exit_code == 2 and "is neither a folder" in result.stderr and "demo/target" in result.stderr


def test_validate_notes_a_hub_model_not_downloaded_yet_and_still_refuses_a_missing_folder(tmp_path):
    """Issue 46, build 9: validate called a profile invalid when its hub model was simply not downloaded yet;
    that is a note, exit 0. A local path that is not there stays an error (a hand copy of the demo: above)."""
    (tmp_path / "draft").mkdir()
    later = write(tmp_path / "later.toml", '[model]\ntarget = "dflash-test/not-downloaded-yet"\ndraft = "draft"\n')
    result = run("validate", str(later))
    assert result.exit_code == 0 and result.stdout.startswith("ok: ") and "not-downloaded-yet + draft" in result.stdout
    assert result.stderr == ("note: target = 'dflash-test/not-downloaded-yet' is not downloaded yet; a run downloads it "
                             "(unless HF_HUB_OFFLINE is set), or `hf download dflash-test/not-downloaded-yet` does now.\n")
    for missing in ("./models/t", str(tmp_path / "gone"), "org/models/t"):
        path = write(tmp_path / "missing.toml", f'[model]\ntarget = "{missing}"\n')
        result = run("validate", str(path))
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert f"target = {missing!r} is neither a folder" in result.stderr and len(result.stderr.splitlines()) == 1


def test_builtin_dflash2_profile_runs_its_draft_at_the_trained_block():
    """The published DFlash 2 pair (docs/dflash2.md): block 8 as its draft was trained, thinking on."""
    p = profiles.load_profile("qwen3.8-27b")
    assert (p.target, p.draft, p.block_size) == ("Qwen/Qwen3.8-27B", "z-lab/Qwen3.8-27B-DFlash2", 8)
    assert p.thinking is True and p.temperature == 0.6 and p.origin == "built-in"


# --- gpt-oss: harmony and its reasoning effort (issue 29) --------------------------------------------


def test_reasoning_effort_is_low_medium_or_high_else_one_sentence_with_its_line(tmp_path):
    path = write(tmp_path / "p.toml", '[model]\ntarget = "a"\n[generation]\nreasoning_effort = "max"\n')
    with pytest.raises(UserError) as caught:
        profiles.load_profile(str(path))
    assert str(caught.value) == (f"{path}, line 4: generation.reasoning_effort must be one of low, medium or high "
                                 "but is the string 'max'; write e.g. reasoning_effort = \"medium\".")
    path = write(tmp_path / "p.toml", '[model]\ntarget = "a"\n[generation]\nreasoning_effort = "low"\n')
    assert profiles.load_profile(str(path)).reasoning_effort == "low"
    assert profiles.load_profile(str(write(tmp_path / "q.toml", '[model]\ntarget = "a"\n'))).reasoning_effort is None
    assert 'reasoning_effort = "medium"' in profiles.new_profile_text("fresh")  # the template offers it


@pytest.mark.parametrize("name, size", [("gpt-oss-20b", "20b"), ("gpt-oss-120b", "120b")])
def test_gpt_oss_profiles_load_validate_and_print_launch_lines(name, size):
    from dflash_tui.cli import main

    p = profiles.load_profile(name)
    assert (p.origin, p.target, p.draft) == ("built-in", f"openai/gpt-oss-{size}", f"z-lab/gpt-oss-{size}-DFlash")
    assert (p.reasoning_effort, p.temperature, p.top_p, p.block_size) == ("medium", 1.0, 1.0, 16)
    assert p.resolved("mlx").target == f"lmstudio-community/gpt-oss-{size}-MLX-8bit" and p.resolved("mlx").draft == p.draft
    result = CliRunner().invoke(main, ["profile", "validate", str(p.path)])
    # the file is valid; validate also wants the models here: ok where they are cached, else the download line
    assert result.exit_code == 0 or (result.exit_code == 2 and f"hf download openai/gpt-oss-{size}" in result.output)
    vllm = CliRunner().invoke(main, ["profile", "serve-command", name, "--for", "vllm"])
    assert vllm.exit_code == 0 and vllm.stdout.startswith(f"vllm serve openai/gpt-oss-{size} --speculative-config")
    assert f'"model": "z-lab/gpt-oss-{size}-DFlash", "num_speculative_tokens": 15' in vllm.stdout
    assert "--reasoning-parser openai_gptoss --tool-call-parser openai --enable-auto-tool-choice" in vllm.stdout
    sglang = CliRunner().invoke(main, ["profile", "serve-command", name, "--for", "sglang"])
    assert sglang.exit_code == 0 and "--speculative-algorithm DFLASH" in sglang.stdout
    assert f"--speculative-draft-model-path z-lab/gpt-oss-{size}-DFlash --speculative-num-draft-tokens 16" in sglang.stdout
    assert "--reasoning-parser gpt-oss --tool-call-parser gpt-oss" in sglang.stdout
