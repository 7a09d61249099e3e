"""`dflash tune` writing its result into the user's profile: the file is written only when it reads back as
the profile it was with exactly the tuned values changed, keeping its BOM, line endings, comments and
layout (inline tables, dotted keys); a file tune cannot edit that way, or cannot write, is left byte for
byte as it was, and one sentence says what to set by hand. Most tests call the function tune writes with
(write_best); two run the real `dflash tune` on a random tiny pair."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import tomlkit
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core.profiles import load_profile
from dflash_tui.engines import UserError
from dflash_tui.measure import tune

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HEAD = """\
# mine: every byte of this file but the tuned value must survive
name = "tiny"
description = "a profile written by hand"
"""
MODEL = """\
[model]
target = "Qwen/Qwen3-8B"  # a hub id: write_best never loads it
draft = "z-lab/Qwen3-8B-DFlash-b16"
"""
REST = """\
[generation]
temperature = 0.0
thinking = true  # keep me
"""
PROFILE = HEAD + "\n" + MODEL + "\n[dflash]\nblock_size = 16  # the trained block size\n\n" + REST


def parsed(data: bytes) -> dict:
    return tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))


def changed(before: bytes, where: tuple[str, ...], **values) -> dict:
    """The parsed profile `before` with `values` set in table `where`, and nothing else."""
    out = copy.deepcopy(parsed(before))
    table = out
    for part in where:
        table = table.setdefault(part, {})
    table.update(values)
    return out


def write(tmp_path, data: bytes, name: str = "mine.toml", **kwargs):
    path = tmp_path / name
    path.write_bytes(data)
    return path, tune.write_best(load_profile(str(path)), **kwargs)


def test_a_bom_profile_is_written_and_keeps_its_bom(tmp_path):
    """Every other command reads a profile that starts with a BOM; tune failed on it after the whole sweep
    ('unexpected EmptyKeyError: Empty key at line 1')."""
    before = ("\ufeff" + PROFILE).encode()
    path, (_, changes) = write(tmp_path, before, best={"block_size": 8}, comment="tuned")
    after = path.read_bytes()
    assert changes == ["[dflash] block_size: 16 -> 8"]
    assert after.startswith(b"\xef\xbb\xbf") and parsed(after) == changed(before, ("dflash",), block_size=8)
    assert after.decode() == before.decode().replace("16  # the trained block size", "8  # tuned")
    assert load_profile(str(path)).block_size == 8


def test_a_crlf_profile_keeps_its_line_endings(tmp_path):
    """Windows line endings were read as \\n and written back as \\n: every line of the file changed."""
    before = (PROFILE.replace("\n", "\r\n")).encode()
    path, (_, changes) = write(tmp_path, before, best={"block_size": 4, "draft_window": 1024}, tune_window=True,
                               comment="tuned")
    after = path.read_bytes()
    assert changes == ["[dflash] block_size: 16 -> 4", "[dflash] draft_window: (unset) -> 1024"]
    assert after.count(b"\r\n") == after.count(b"\n")  # the added draft_window line too
    assert parsed(after) == changed(before, ("dflash",), block_size=4, draft_window=1024)
    assert after.startswith(HEAD.replace("\n", "\r\n").encode()) and b"thinking = true  # keep me\r\n" in after


@pytest.mark.parametrize("layout, engine, where", [
    (HEAD + "dflash = {block_size = 16, thinking_trained = true}  # mine\n\n" + MODEL + REST, None, ("dflash",)),
    (HEAD + "dflash = {thinking_trained = true}\n\n" + MODEL + REST, None, ("dflash",)),  # the key added
    (PROFILE + "\n[engines]\nmlx = {block_size = 8}\n", "mlx", ("engines", "mlx")),
    (HEAD + "engines = {mlx = {block_size = 8}}\n\n" + MODEL + REST, "mlx", ("engines", "mlx")),
], ids=["inline", "inline-without-the-key", "inline-override", "nested-inline-override"])
def test_a_value_in_an_inline_table_is_set_without_a_comment_inside_the_braces(tmp_path, layout, engine, where):
    """tune wrote `dflash = {block_size = 16# dflash tune on demo: ...}`: invalid TOML, after which every
    command failed on the user's file."""
    before = layout.encode()
    path, (_, changes) = write(tmp_path, before, best={"block_size": 2}, engine=engine, comment="dflash tune on demo")
    after = path.read_bytes()
    assert changes and parsed(after) == changed(before, where, block_size=2)
    assert b"dflash tune on demo" not in after  # its line is the table's: no comment goes in the braces
    assert load_profile(str(path)).engine_config(engine or "cuda").block_size == 2


@pytest.mark.parametrize("layout", [
    HEAD + "dflash.block_size = 16  # old\n\n" + MODEL + REST,
    HEAD + "dflash.thinking_trained = true\ndflash.block_size = 16\n\n" + MODEL + REST,  # was AttributeError
], ids=["one-dotted-key", "two-dotted-keys"])
def test_dotted_keys_are_set_where_they_are(tmp_path, layout):
    before = layout.encode()
    path, (_, changes) = write(tmp_path, before, best={"block_size": 4, "draft_window": 256}, tune_window=True,
                               comment="tuned")
    after = path.read_bytes()
    assert changes == ["[dflash] block_size: 16 -> 4", "[dflash] draft_window: (unset) -> 256"]
    assert parsed(after) == changed(before, ("dflash",), block_size=4, draft_window=256)
    assert b"[dflash]" not in after  # no header that would redefine the dotted table
    assert after.startswith(HEAD.encode()) and after.endswith((MODEL + REST).encode())


def test_comments_after_the_value_and_elsewhere_survive_and_a_comment_stays_one_line(tmp_path):
    """The old comment of the changed line goes (it spoke of the old value); every other line stays byte for
    byte. A dataset path with a newline in it made the new comment two lines, the second not TOML."""
    line = 'block_size = 16 # "16" = [the trained size] # sic\n'
    before = (PROFILE.replace("block_size = 16  # the trained block size\n", line + "# below the value\n")).encode()
    result = tune.Sweep(rows=[], best=tune.TuneRow(block_size=8, decode_tokens_per_s=120.0),
                        current=tune.TuneRow(block_size=16, decode_tokens_per_s=100.0), windows=[None], repeats=3)
    comment = tune.comment_for(result, "prompts\nx = 1.jsonl", 16)
    path, (_, changes) = write(tmp_path, before, best={"block_size": 8}, comment=comment)
    after = path.read_bytes().decode()
    assert parsed(after.encode()) == changed(before, ("dflash",), block_size=8)
    new_line = next(text for text in after.splitlines(keepends=True) if text.startswith("block_size"))
    assert new_line.startswith("block_size = 8  # dflash tune on prompts x = 1.jsonl: 120.0 tok/s")
    assert after.replace(new_line, line) == before.decode()


@pytest.mark.parametrize("corrupt", [
    lambda text: text.replace("block_size = 8", "block_size = {8"),  # does not parse
    lambda text: text.replace("thinking = true", "thinking = false"),  # parses, but another value changed
], ids=["unparsable", "another-value-changed"])
def test_an_edit_that_would_not_read_back_exactly_leaves_the_file_as_it_was(tmp_path, monkeypatch, corrupt):
    """The rule, whatever the layout: tomlkit's text is written only when it reads back as the profile with
    exactly the tuned values changed. Here tomlkit is made to get it wrong, as it did for inline tables."""
    dumps = tomlkit.dumps
    monkeypatch.setattr(tomlkit, "dumps", lambda doc: corrupt(dumps(doc)))
    before = PROFILE.encode()
    path = tmp_path / "mine.toml"
    path.write_bytes(before)
    with pytest.raises(UserError) as info:
        tune.write_best(load_profile(str(path)), {"block_size": 8}, comment="tuned")
    message = str(info.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mine.toml"]
    assert message.startswith("Not written: ") and "\n" not in message and message.count(". ") == 0
    assert "set block_size = 8 in [dflash] by hand (see line 10)" in message and str(path) in message


def test_a_read_only_profile_is_left_as_it_was(tmp_path):
    """chmod a-w says 'do not change this file'; tune replaced it anyway (a rename needs only the folder)."""
    before = PROFILE.encode()
    path = tmp_path / "mine.toml"
    path.write_bytes(before)
    path.chmod(0o444)
    profile = load_profile(str(path))
    with pytest.raises(UserError, match=r"read-only, so tune left it as it was; make it writable and rerun tune, "
                                        r"or set block_size = 8 in \[dflash\] by hand\.$"):
        tune.write_best(profile, {"block_size": 8})
    with pytest.raises(UserError, match="which is read-only; make it writable, or pass --dry-run"):
        tune.check_writable(path)  # before the sweep
    assert path.read_bytes() == before and oct(path.stat().st_mode & 0o777) == oct(0o444)


@pytest.mark.parametrize("failing", ["os.open", "os.replace"])
def test_a_folder_that_cannot_be_written_is_one_sentence_and_no_half_file(tmp_path, monkeypatch, failing):
    """The folder went read-only during the sweep (or the disk filled up): one sentence with the value to set,
    the profile whole, no temporary file left beside it."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    module, name = failing.split(".")
    monkeypatch.setattr({"tempfile": tune.tempfile, "os": os}[module], name, refuse)
    before = PROFILE.encode()
    path = tmp_path / "mine.toml"
    path.write_bytes(before)
    with pytest.raises(UserError, match=r"cannot be written \(Permission denied\), so tune left it as it was; "
                                        r"set block_size = 8 in \[dflash\] by hand\.$"):
        tune.write_best(load_profile(str(path)), {"block_size": 8})
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mine.toml"]


# -- the real `dflash tune` ------------------------------------------------------------------------------

TINY = """\
name = "tiny"

[model]
target = "pair/target"
draft = "pair/draft"

[dflash]
block_size = 16  # the trained block size

[generation]
temperature = 0.0
max_new_tokens = 6

[bench]
prompts = "demo"
"""


@pytest.fixture
def tiny_profile(pairs, tmp_path, data_dir, monkeypatch):
    """A tiny pair's profile, and tune's result forced to 'block 2 wins, write it': which block size wins on
    a random pair is not the point here, the writing is."""
    target, draft = pairs("qwen3")
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "target").symlink_to(target)
    (tmp_path / "pair" / "draft").symlink_to(draft)
    real_sweep = tune.sweep

    def sweep(*args, **kwargs):
        result = real_sweep(*args, **kwargs)
        result.best = next(row for row in result.rows if row.block_size == 2)
        return result

    monkeypatch.setattr(tune, "sweep", sweep)
    monkeypatch.setattr(tune, "decide", lambda result: tune.Decision(True, "Forced to write."))
    return tmp_path / "tiny.toml"


def run_tune(path):
    return CliRunner().invoke(main, ["tune", "--profile", str(path), "--max-samples", "1", "-B", "2", "--engine",
                                     "cuda", "--device", "cpu"])


def test_tune_writes_a_bom_crlf_profile(tiny_profile):
    before = ("\ufeff" + TINY.replace("\n", "\r\n")).encode()
    tiny_profile.write_bytes(before)
    result = run_tune(tiny_profile)
    assert result.exit_code == 0, result.output
    assert "Forced to write." in result.stdout and f"wrote {tiny_profile}" in result.stdout
    after = tiny_profile.read_bytes()
    assert after.startswith(b"\xef\xbb\xbf") and after.count(b"\r\n") == after.count(b"\n")
    assert "[dflash] block_size: 16 -> 2" in result.stdout
    assert parsed(after) == changed(before, ("dflash",), block_size=2)
    assert load_profile(str(tiny_profile)).block_size == 2


def test_tune_that_cannot_write_shows_its_results_and_says_what_to_set(tiny_profile, monkeypatch):
    dumps = tomlkit.dumps
    monkeypatch.setattr(tomlkit, "dumps", lambda doc: dumps(doc) + "oops = [\n")  # tomlkit getting it wrong
    tiny_profile.write_text(TINY)
    result = run_tune(tiny_profile)
    assert result.exit_code == 2, result.output
    assert any(line.startswith("block") for line in result.stdout.splitlines()) and "best: block 2 " in result.stdout
    error = result.stderr.splitlines()[-1]  # after the progress lines: one sentence
    assert error.startswith("error: Not written: ") and "unexpected" not in result.stderr
    assert [line for line in result.stderr.splitlines() if "error" in line] == [error]
    assert error.endswith("so it left the file as it was; set block_size = 2 in [dflash] by hand (see line 8).")
    assert tiny_profile.read_text() == TINY
