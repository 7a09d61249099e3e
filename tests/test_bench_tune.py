"""`dflash bench` and `dflash tune` on a random tiny pair: the documented --json schema, prompt sets and
their errors, and tune writing the user's copy of a profile with its comments kept. No mocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomlkit
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core.profiles import load_profile
from dflash_tui.measure import bench, tune
from engines import UserError

TOP_KEYS = {"schema", "created", "profile", "dataset", "samples", "turns", "engine", "device", "dtype", "target",
            "draft", "max_new_tokens", "temperature", "thinking", "framework", "rows", "best_block_size"}
ROW_KEYS = {"block_size", "generated_tokens", "steps", "decode_tokens_per_s", "speedup", "speedup_vs_framework", "tau",
            "histogram", "ttft_s", "peak_memory_bytes", "peak_memory_kind", "identical_to_block_1"}
FRAMEWORK_KEYS = {"name", "generated_tokens", "decode_tokens_per_s", "ttft_s", "identical_to_block_1"}

PROFILE = """\
# A tiny test profile: comments must survive tune.
name = "tiny"
description = "random tiny pair"

[model]
target = "pair/target"  # beside this file
draft = "pair/draft"

[dflash]
block_size = 16  # the trained block size

[generation]
temperature = 0.0
max_new_tokens = 12  # short: these are tests
"""


@pytest.fixture
def profile_file(pairs, tmp_path, monkeypatch):
    """A profile whose checkpoints are relative to it (as the built-in demo's are)."""
    target, draft = pairs("qwen3")
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "target").symlink_to(target)
    (tmp_path / "pair" / "draft").symlink_to(draft)
    path = tmp_path / "tiny.toml"
    path.write_text(PROFILE)
    monkeypatch.setenv("DFLASH_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_builtin_prompt_sets_load():
    for name in bench.BUILTIN_SETS:
        samples, label = bench.load_dataset(name)
        assert label == name and len(samples) >= 10
        assert all(s["turns"] and all(isinstance(t, str) and t for t in s["turns"]) for s in samples)
    samples, _ = bench.load_dataset("chat", max_samples=3)
    assert len(samples) == 3
    assert any(len(s["turns"]) > 1 for s in bench.load_dataset("chat")[0])  # multi-turn samples exist


@pytest.mark.parametrize("line, words", [
    ('{"turns": ["ok"]}\n{"turns": [}\n', ":2: the line is not valid JSON"),
    ('{"turns": ["ok"]}\n\n{"prompt": "x"}\n', ":3: the line needs \"turns\""),
    ('{"turns": []}\n', ":1: the line needs"),
    ('["a"]\n', ":1: the line needs"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path, line, words):
    path = tmp_path / "set.jsonl"
    path.write_text(line)
    with pytest.raises(UserError) as err:
        bench.load_dataset(str(path))
    assert f"{path}{words}" in str(err.value)


def test_unknown_and_public_datasets_are_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="unknown; choose a built-in set"):
        bench.load_dataset("nonsense")
    with pytest.raises(UserError, match="does not exist"):
        bench.load_dataset(str(tmp_path / "missing.jsonl"))
    # no network here: with or without the optional `datasets` package this is one sentence
    with pytest.raises(UserError, match="public dataset 'gsm8k'.*network"):
        bench.load_dataset("gsm8k")


def test_bench_json_has_the_documented_schema(profile_file, tmp_path):
    prompts = tmp_path / "two-turn.jsonl"
    prompts.write_text(json.dumps({"turns": ["What is 48 + 75?", "And 12 + 30?"]}) + "\n"
                       + json.dumps({"turns": ["The quick brown fox"], "category": "ignored"}) + "\n")
    out = tmp_path / "bench.json"
    result = invoke("bench", "--profile", profile_file, "--dataset", prompts, "--block-sizes", "4,16",
                    "--engine", "cuda", "--device", "cpu", "--json", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) == TOP_KEYS and data["schema"] == bench.SCHEMA
    assert data["samples"] == 2 and data["turns"] == 3 and data["dataset"] == "two-turn.jsonl"
    assert [r["block_size"] for r in data["rows"]] == [1, 4, 16]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert len(row["histogram"]) == row["block_size"] and sum(row["histogram"]) == row["steps"]
        assert row["identical_to_block_1"] is True  # temperature 0: lossless at every block size
    assert data["rows"][0]["speedup"] == 1.0
    assert set(data["framework"]) == FRAMEWORK_KEYS and data["framework"]["name"] == "transformers generate"
    assert data["framework"]["identical_to_block_1"] is True  # the engine equals transformers' own greedy
    assert data["best_block_size"] in (1, 4, 16)
    # the printed report: the public benchmark's lines, per block size
    for words in ("DFlash throughput", "Decoding speedup", "Average acceptance length", "Acceptance length histogram",
                  "Baseline throughput (transformers generate)"):
        assert words in result.stdout
    assert "warm-up" in result.stderr  # progress on stderr


def test_bench_mlx_framework_baseline(profile_file, tmp_path):
    pytest.importorskip("mlx.core")
    out = tmp_path / "bench.json"
    result = invoke("bench", "--profile", profile_file, "--dataset", "demo", "--max-samples", "2", "-B", "8",
                    "--engine", "mlx", "--json", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["engine"] == "mlx" and data["framework"]["name"] == "mlx-lm generate_step"
    assert data["framework"]["identical_to_block_1"] is True and data["rows"][1]["identical_to_block_1"] is True


def test_bench_help_documents_the_json_schema():
    result = invoke("bench", "--help")
    assert result.exit_code == 0
    assert "dflash-bench/1" in result.stdout and "speedup_vs_framework" in result.stdout


@pytest.mark.parametrize("args, words", [
    (["--dataset", "gsm8k"], "public dataset 'gsm8k'"),
    (["--block-sizes", "1,99"], "Block size 99 is out of range"),
    (["--max-samples", "0"], "--max-samples 0"),
])
def test_bench_bad_input_exits_2(profile_file, args, words):
    result = invoke("bench", "--profile", profile_file, *args)
    assert result.exit_code == 2 and words in result.stderr and result.stderr.count("\n") == 1


def test_bench_malformed_dataset_exits_2_with_file_and_line(profile_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["fine"]}\nnot json\n')
    result = invoke("bench", "--profile", profile_file, "--dataset", bad)
    assert result.exit_code == 2 and f"{bad}:2:" in result.stderr


def test_tune_writes_the_user_copy_and_keeps_comments(profile_file, tmp_path):
    result = invoke("tune", "--profile", profile_file, "--dataset", "demo", "--max-samples", "2", "-B", "2,4",
                    "--engine", "cuda", "--device", "cpu")
    assert result.exit_code == 0, result.output
    copy = tmp_path / "config" / "profiles" / "tiny.toml"
    assert copy.is_file() and f"wrote {copy}" in result.stdout
    text = copy.read_text()
    for comment in ("# A tiny test profile: comments must survive tune.", "# the trained block size",
                    "# short: these are tests", "# beside this file"):
        assert comment in text
    best = tomlkit.parse(text)["dflash"]["block_size"]
    assert best in (1, 2, 4) and f"best: block size {best}" in result.stdout
    if best != 16:
        assert f"[dflash] block_size: 16 -> {best}" in result.stdout
    # relative checkpoints were made absolute so the copy still loads, and the user copy now wins
    profile = load_profile("tiny")
    assert profile.origin == "user" and profile.block_size == best
    assert Path(profile.engine_config("cuda").target) == tmp_path / "pair" / "target"
    assert "block  " in result.stdout and "← best" in result.stdout
    # the original file is untouched
    assert (tmp_path / "tiny.toml").read_text() == PROFILE


def test_write_best_edits_in_place_and_reports_no_change(profile_file, tmp_path):
    profile = load_profile(str(profile_file))
    path, changes = tune.write_best(profile, {"block_size": 8, "draft_window": None})
    assert changes[0].startswith("created ") and "[dflash] block_size: 16 -> 8" in changes
    user = load_profile("tiny")
    path2, changes2 = tune.write_best(user, {"block_size": 8})
    assert path2 == path and changes2 == []
    path3, changes3 = tune.write_best(user, {"block_size": 4, "draft_window": 1024}, tune_window=True)
    assert changes3 == ["[dflash] block_size: 8 -> 4", "[dflash] draft_window: (unset) -> 1024"]
    assert "# the trained block size" in path3.read_text()


def test_write_best_without_a_change_creates_no_copy(profile_file, tmp_path):
    path, changes = tune.write_best(load_profile(str(profile_file)), {"block_size": 16})
    assert changes == [] and path == profile_file
    assert not (tmp_path / "config" / "profiles" / "tiny.toml").exists()


def test_write_best_changes_the_engine_override_that_wins(profile_file, tmp_path):
    profile_file.write_text(PROFILE + "\n[engines.mlx]\nblock_size = 8  # mlx keeps its own\n")
    path, changes = tune.write_best(load_profile(str(profile_file)), {"block_size": 4}, engine="mlx")
    assert "[engines.mlx] block_size: 8 -> 4" in changes
    doc = tomlkit.parse(path.read_text())
    assert doc["dflash"]["block_size"] == 16 and doc["engines"]["mlx"]["block_size"] == 4
    assert "# mlx keeps its own" in path.read_text()


def test_draft_windows_sweep_values(profile_file):
    profile = load_profile(str(profile_file))
    config = profile.engine_config("cuda")
    assert tune.windows_for(None, profile, config) == [None]
    config.draft_window = 4096
    assert tune.windows_for(None, profile, config) == [1024, 2048, 4096, None]
    assert tune.windows_for("64, none,64", profile, config) == [64, None]
    with pytest.raises(UserError):
        tune.windows_for("-3", profile, config)
