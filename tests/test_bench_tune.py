"""`dflash bench` and `dflash tune` on a random tiny pair: the documented --json schema, prompt sets and
their errors, repeated runs (best of N and their spread), and tune writing the user's copy of a profile
only when a size beats the current one by more than that spread, its stale comments replaced. No mocks;
no timing is compared with a number (which size wins on a random pair is not the point)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import tomlkit
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core.profiles import load_profile
from dflash_tui.engines import EngineConfig, UserError, load_engine
from dflash_tui.measure import bench, runs, tune

TOP_KEYS = {"schema", "created", "profile", "dataset", "samples", "turns", "engine", "device", "dtype", "target",
            "draft", "max_new_tokens", "temperature", "thinking", "framework", "rows", "best_block_size"}
ROW_KEYS = {"block_size", "generated_tokens", "steps", "decode_tokens_per_s", "speedup", "speedup_vs_framework", "tau",
            "histogram", "ttft_s", "peak_memory_bytes", "peak_memory_kind", "repeats", "repeat_rates",
            "identical_to_block_1"}
FRAMEWORK_KEYS = {"name", "generated_tokens", "decode_tokens_per_s", "ttft_s", "repeats", "repeat_rates",
                  "identical_to_block_1"}

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

[bench]
prompts = "demo"  # bench and tune measure on this set by default
"""


@pytest.fixture
def profile_file(pairs, tmp_path, data_dir):
    """A profile whose checkpoints are relative to it (as the built-in demo's are)."""
    target, draft = pairs("qwen3")
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "target").symlink_to(target)
    (tmp_path / "pair" / "draft").symlink_to(draft)
    path = tmp_path / "tiny.toml"
    path.write_text(PROFILE)
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_best_of_runs(row, repeats: int) -> None:
    """A row counts its runs, shows the fastest, and its spread is the distance between them."""
    rates = row["repeat_rates"]
    assert row["repeats"] == repeats == len(rates) and all(rate > 0 for rate in rates)
    assert row["decode_tokens_per_s"] == max(rates) and all(row["decode_tokens_per_s"] >= rate for rate in rates)
    assert runs.spread(row) == max(rates) - min(rates) >= 0


def test_builtin_prompt_sets_load():
    assert set(bench.BUILTIN_SETS) == {"chat", "code", "demo", "math"}  # the files in measure/prompts/
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


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="no limit on integer digits before 3.10.7")
def test_jsonl_line_past_the_integer_digit_limit_is_one_sentence(tmp_path):
    """json.loads raises a plain ValueError (no JSONDecodeError `msg`) for an integer past Python's digit limit."""
    path = tmp_path / "set.jsonl"
    path.write_text('{"turns": ["ok"], "n": ' + "1" * 5000 + "}\n")
    with pytest.raises(UserError, match=r":1: the line is not valid JSON \(Exceeds the limit"):
        bench.load_dataset(str(path))


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
                    "--repeats", "2", "--engine", "cuda", "--device", "cpu", "--output", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) == TOP_KEYS and data["schema"] == bench.SCHEMA == "dflash-bench/2"
    assert data["samples"] == 2 and data["turns"] == 3 and data["dataset"] == "two-turn.jsonl"
    assert [r["block_size"] for r in data["rows"]] == [1, 4, 16]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert len(row["histogram"]) == row["block_size"] and sum(row["histogram"]) == row["steps"]
        assert row["identical_to_block_1"] is True  # temperature 0: lossless at every block size, every run
        assert_best_of_runs(row, 2)
    assert data["rows"][0]["speedup"] == 1.0
    assert set(data["framework"]) == FRAMEWORK_KEYS and data["framework"]["name"] == "transformers generate"
    assert_best_of_runs(data["framework"], 2)
    assert data["framework"]["identical_to_block_1"] is True  # the engine equals transformers' own greedy
    assert data["best_block_size"] in (1, 4, 16)
    # the printed report: the public benchmark's lines, per block size
    for words in ("DFlash throughput", "Decoding speedup", "Average acceptance length", "Acceptance length histogram",
                  "Baseline throughput (transformers generate)"):
        assert words in result.stdout
    assert "warm-up" in result.stderr and "run 2/2" in result.stderr  # progress on stderr
    assert "best of 2 runs after a warm-up" in result.stdout and bench.load_result(out).rows[1].repeats == 2


def test_bench_mlx_framework_baseline(profile_file, tmp_path):
    pytest.importorskip("mlx.core")
    out = tmp_path / "bench.json"
    result = invoke("bench", "--profile", profile_file, "--dataset", "demo", "--max-samples", "2", "-B", "8",
                    "--repeats", "1", "--engine", "mlx", "--output", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["engine"] == "mlx" and data["framework"]["name"] == "mlx-lm generate_step"
    assert data["framework"]["identical_to_block_1"] is True and data["rows"][1]["identical_to_block_1"] is True


def test_bench_help_documents_the_json_schema():
    result = invoke("bench", "--help")
    assert result.exit_code == 0
    assert bench.SCHEMA in result.stdout and "speedup_vs_framework" in result.stdout and "repeat_rates" in result.stdout


@pytest.mark.parametrize("args, words", [
    (["--dataset", "gsm8k"], "public dataset 'gsm8k'"),
    (["--block-sizes", "1,99"], "Block size 99 is out of range"),
    (["--max-samples", "0"], "--max-samples 0"),
    (["--repeats", "0"], "runs per block size must be at least 1"),
    (["--block-sizes", ""], "--block-sizes is empty"), (["--block-sizes", "1,,4"], "has an empty entry"),
    (["--dataset", "/"], "is a folder"),
])
def test_bench_bad_input_exits_2(profile_file, args, words):
    result = invoke("bench", "--profile", profile_file, *args)
    assert result.exit_code == 2 and words in result.stderr and result.stderr.count("\n") == 1


def test_bench_malformed_dataset_exits_2_with_file_and_line(profile_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["fine"]}\nnot json\n')
    result = invoke("bench", "--profile", profile_file, "--dataset", bad)
    assert result.exit_code == 2 and f"{bad}:2:" in result.stderr


def test_the_prompt_set_comes_from_the_profile_not_its_name(profile_file, tmp_path):
    assert bench.default_dataset(load_profile(str(profile_file))) == "demo"  # [bench] prompts
    named_demo = tmp_path / "demo.toml"
    named_demo.write_text(PROFILE.replace('name = "tiny"', 'name = "demo"').split("[bench]")[0])
    assert bench.default_dataset(load_profile(str(named_demo))) == "chat"  # no key: chat, whatever the name
    assert load_profile("demo").bench_prompts == "demo"  # the built-in demo profile says so


def test_tune_refuses_to_write_after_fewer_than_3_runs(profile_file, tmp_path):
    result = invoke("tune", "--profile", profile_file, "-B", "2", "--repeats", "2", "--engine", "cuda", "--device", "cpu")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "--repeats 2" in result.stderr and "at least 3" in result.stderr and "--dry-run" in result.stderr
    assert "loading" not in result.output.lower()  # refused before the sweep
    assert not (tmp_path / "config" / "profiles" / "tiny.toml").exists()


def test_tune_sweeps_3_runs_and_writes_only_past_the_spread(profile_file, tmp_path):
    result = invoke("tune", "--profile", profile_file, "--max-samples", "1", "-B", "2", "--engine", "cuda",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "tune tiny on demo (1 samples)" in result.stdout  # the profile's [bench] prompts
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("block"))
    assert header.split()[:5] == ["block", "tok/s", "spread", "runs", "speedup"]
    rows = [line.split() for line in lines[lines.index(header) + 2:] if line[:5].strip().isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "16"]  # block 1, the asked size, and the current one
    assert all(row[3] == "3" for row in rows) and "(current)" in lines[lines.index(header) + 4]
    copy = tmp_path / "config" / "profiles" / "tiny.toml"
    if "more than the spread" in result.stdout:  # a size beat block 16 by more than its runs' spread
        text = profile_file.read_text()
        best = tomlkit.parse(text)["dflash"]["block_size"]
        assert f"[dflash] block_size: 16 -> {best}" in result.stdout and f"wrote {profile_file}" in result.stdout
        assert "# the trained block size" not in text  # it spoke of 16
        assert "  # dflash tune on demo: " in text and "best of 3, vs " in text
        for comment in ("# A tiny test profile: comments must survive tune.", "# short: these are tests",
                        "# beside this file"):
            assert comment in text
        assert load_profile(str(profile_file)).block_size == best
    else:  # within the spread, or block 16 itself was the fastest: nothing written
        assert "Kept the current setting" in result.stdout or "is the fastest; nothing to write" in result.stdout
        assert "wrote" not in result.stdout and profile_file.read_text() == PROFILE
    assert not copy.exists()  # the profile given by path is the one written, never a copy beside it


def test_a_sweep_counts_its_runs_and_measures_the_current_size(pairs):
    target, draft = pairs("qwen3")
    engine = load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                      block_size=8))
    samples = [{"turns": ["What is 48 + 75?"]}]
    result = tune.sweep(engine, samples, [4], [None], max_new_tokens=6, repeats=3)
    assert [row.block_size for row in result.rows] == [1, 4, 8] and result.current.block_size == 8 == engine.block_size
    for row in result.rows:
        assert_best_of_runs(row, 3)
    assert result.best.decode_tokens_per_s == max(row.decode_tokens_per_s for row in result.rows)
    assert "(current)" in tune.format_sweep(result) and "best of 3 runs" in tune.format_sweep(result)


def rates_row(block: int, rates: list[float]) -> tune.TuneRow:
    """A sweep row as three runs measured it (the decision reads only the rates)."""
    return tune.TuneRow(block_size=block, decode_tokens_per_s=max(rates), repeats=len(rates), repeat_rates=rates)


@pytest.mark.parametrize("best_rates, current_rates, write", [
    ([105.0, 100.0, 101.0], [100.0, 99.0, 100.0], False),  # beats by 5.0, the spread is 5.0: noise
    ([112.0, 110.0, 111.0], [100.0, 96.0, 99.0], True),  # beats by 12.0, more than either spread (2.0, 4.0)
    ([130.0, 90.0, 95.0], [100.0, 99.0, 100.0], False),  # beats by 30.0, but its own runs spread 40.0
])
def test_decide_writes_only_past_the_spread_of_both(best_rates, current_rates, write):
    best, current = rates_row(8, best_rates), rates_row(16, current_rates)
    decision = tune.decide(tune.Sweep(rows=[best, current], best=best, current=current, windows=[None], repeats=3))
    assert decision.write is write
    assert ("more than the spread" if write else "Kept the current setting: block 8") in decision.reason


def test_decide_never_writes_the_current_size_or_after_2_runs():
    same = rates_row(16, [100.0, 50.0])
    decision = tune.decide(tune.Sweep(rows=[same], best=same, current=same, windows=[None], repeats=2))
    assert not decision.write and "at least 3" in decision.reason
    same = rates_row(16, [100.0, 99.0, 98.0])
    decision = tune.decide(tune.Sweep(rows=[same], best=same, current=same, windows=[None], repeats=3))
    assert not decision.write and "block 16, is the fastest" in decision.reason


def test_comment_says_what_tune_measured():
    best, current = rates_row(1, [120.0, 118.0, 119.0]), rates_row(16, [100.0, 99.0, 98.0])
    result = tune.Sweep(rows=[best, current], best=best, current=current, windows=[None], repeats=3)
    assert tune.comment_for(result, "demo", 16) == ("dflash tune on demo: 120.0 tok/s, best of 3, vs 100.0 at the old "
                                                   "block 16; block 1 is plain decoding (DFlash off)")
    result.best = rates_row(8, [120.0, 118.0, 119.0])
    assert tune.comment_for(result, "demo", 16).endswith("; the draft was trained at 16")


def test_write_best_edits_in_place_and_replaces_stale_comments(profile_file, tmp_path):
    profile = load_profile(str(profile_file))
    path, changes = tune.write_best(profile, {"block_size": 8, "draft_window": None}, comment="measured: 8 wins")
    assert path == profile_file and changes == ["[dflash] block_size: 16 -> 8"]  # the file it was given
    text = path.read_text()
    assert "block_size = 8  # measured: 8 wins\n" in text and "# the trained block size" not in text
    assert "# short: these are tests" in text and "# bench and tune measure on this set by default" in text
    assert 'target = "pair/target"  # beside this file' in text  # still beside it: left relative
    assert not (tmp_path / "config" / "profiles").exists()
    path2, changes2 = tune.write_best(load_profile(str(profile_file)), {"block_size": 8})
    assert path2 == path and changes2 == []
    path3, changes3 = tune.write_best(load_profile(str(profile_file)), {"block_size": 4, "draft_window": 1024},
                                      tune_window=True)
    assert changes3 == ["[dflash] block_size: 8 -> 4", "[dflash] draft_window: (unset) -> 1024"]
    assert "block_size = 4\n" in path3.read_text()  # no comment given: the stale one is gone, not kept


def test_write_best_copies_a_built_in_profile_once_with_absolute_paths(tmp_path):
    from dflash_tui.core.profiles import builtin_profile_dir

    builtin = load_profile("demo")
    path, changes = tune.write_best(builtin, {"block_size": 4})
    assert path == tmp_path / "config" / "profiles" / "demo.toml" and changes[0].startswith("created ")
    user = load_profile("demo")
    assert user.origin == "user" and user.block_size == 4
    assert Path(user.engine_config("cuda").target) == builtin_profile_dir().resolve() / "demo" / "target"  # made absolute
    with pytest.raises(UserError, match="already exists; tune that one instead"):  # the built-in named by its path
        tune.write_best(load_profile(str(builtin.path)), {"block_size": 2})
    assert load_profile("demo").block_size == 4


def test_tune_never_writes_another_profile_that_shares_the_name(profile_file, config_dir):
    mine = config_dir / "profiles" / "tiny.toml"  # a user profile with the same `name` as the file given
    mine.parent.mkdir(parents=True)
    kept = PROFILE.replace("block_size = 16  # the trained block size", "block_size = 1  # keep!")
    mine.write_text(kept)
    path, changes = tune.write_best(load_profile(str(profile_file)), {"block_size": 8})
    assert path == profile_file and changes == ["[dflash] block_size: 16 -> 8"]
    assert mine.read_text() == kept


def test_tune_writes_through_a_link_keeps_permissions_and_writes_no_other_file(profile_file, tmp_path):
    """The profile given through a link (a dotfiles set-up): the file it names gets the result and the link
    stays; a private profile (it may hold an api_key) stays private; a file of the user's named like a
    temporary copy (`tiny.toml.tmp`, a link to another file) is neither written nor removed."""
    import os
    import stat

    profile_file.chmod(0o600)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    (profile_file.parent / f"{profile_file.name}.tmp").symlink_to(notes)
    link = tmp_path / "elsewhere" / "linked.toml"
    link.parent.mkdir()
    link.symlink_to(profile_file)
    path, changes = tune.write_best(load_profile(str(link)), {"block_size": 8})
    assert path == profile_file and changes == ["[dflash] block_size: 16 -> 8"]
    assert link.is_symlink() and load_profile(str(link)).block_size == 8
    assert stat.S_IMODE(os.stat(profile_file).st_mode) == 0o600
    assert notes.read_text() == "mine\n" and (profile_file.parent / f"{profile_file.name}.tmp").is_symlink()
    assert sorted(p.name for p in profile_file.parent.iterdir() if p.name.startswith(".")) == []


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
    assert "# mlx keeps its own" not in path.read_text()  # it spoke of the old value


def test_draft_windows_sweep_values(profile_file):
    profile = load_profile(str(profile_file))
    config = profile.engine_config("cuda")
    assert tune.windows_for(None, profile, config) == [None]
    config.draft_window = 4096
    assert tune.windows_for(None, profile, config) == [1024, 2048, 4096, None]
    assert tune.windows_for("64, none,64", profile, config) == [64, None]
    with pytest.raises(UserError):
        tune.windows_for("-3", profile, config)


def test_bench_on_a_foreign_server_shows_unknown_tau_acceptance_and_memory_as_dashes(tmp_path):
    """A server that is not ours (tests/foreign.py) reports no steps and no memory: the table says "–"
    and --json says null, never a measured-looking 0.00 (the block-1 row is the only one: no draft here)."""
    from tests.foreign import ForeignServer

    out = tmp_path / "bench.json"
    with ForeignServer() as server:
        result = invoke("bench", "--url", server.base, "--dataset", "demo", "--max-samples", "1", "--repeats", "1",
                        "--output", out)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["rows"]
    assert row["block_size"] == 1 and row["generated_tokens"] > 0
    assert {k: row[k] for k in ("steps", "tau", "histogram", "peak_memory_bytes", "peak_memory_kind")} == dict.fromkeys(
        ("steps", "tau", "histogram", "peak_memory_bytes", "peak_memory_kind"))
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("1 ")]
    cells = line.split()  # block, tokens, tok/s, spread, runs, speedup, vs framework, tau, acceptance, TTFT...
    assert cells[5:9] == ["1.00x", "-", "–", "–"], line


# -- checked before the work (hardening round 2) -------------------------------------------------------


@pytest.fixture
def no_weights(monkeypatch):
    """Loading an engine fails the test (exit 1, 'unexpected'): refusals must come before it."""
    import importlib

    def loaded(config):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(importlib.import_module("dflash_tui.cli.measure"), "load_engine", loaded)


def test_tune_refuses_a_config_folder_it_cannot_write_before_the_sweep(monkeypatch, no_weights):
    """The built-in profile's copy would go to a read-only folder (under /proc here, which no user, root
    included, can write): one sentence before any weight loads, as the README says."""
    monkeypatch.setenv("DFLASH_CONFIG_DIR", "/proc/dflash-test/config")
    result = invoke("tune", "--profile", "demo", "-B", "1,4", "--max-samples", "1", "--engine", "cuda")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "/proc/dflash-test/config/profiles/demo.toml" in result.stderr and "--dry-run" in result.stderr


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_max_new_tokens_0_is_refused_before_loading(profile_file, no_weights, command):
    result = invoke(command, "--profile", profile_file, "-B", "1", "--max-new-tokens", "0", "--engine", "cuda",
                    *(["--dry-run"] if command == "tune" else []))
    assert result.exit_code == 2 and "--max-new-tokens 0" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("where", ["missing/results.json", "/proc/dflash-test/results.json"])
def test_an_output_bench_could_not_write_is_refused_before_loading(profile_file, no_weights, tmp_path, where):
    """A folder that does not exist or cannot be written (/proc: no user, root included): one sentence
    before the weights load, not a traceback after the whole run."""
    output = tmp_path / where if not where.startswith("/") else where
    result = invoke("bench", "--profile", profile_file, "-B", "1", "--engine", "cuda", "-o", output)
    assert result.exit_code == 2 and "--output" in result.stderr and result.stderr.count("\n") == 1, result.output


def test_bench_output_that_fails_to_write_is_one_sentence_after_the_table(profile_file, tmp_path, monkeypatch):
    """A write that fails only when it happens (the disk fills during the run: a fake write says so) keeps the
    printed results and says why in one sentence instead of a traceback. (/dev/full itself is a device:
    refused before the run, test_writes.py.)"""
    import errno

    from dflash_tui.engines import files

    def full(fd, content, mode):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_fill", full)
    output = tmp_path / "results.json"
    result = invoke("bench", "--profile", profile_file, "-B", "1", "--max-samples", "1", "--max-new-tokens", "4",
                    "--no-framework", "--repeats", "1", "-o", output)
    assert result.exit_code == 2 and f"Cannot write --output {output} (disk full)" in result.stderr, result.output
    assert "same as block 1" in result.stdout  # the table was printed before the write failed
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no half file
