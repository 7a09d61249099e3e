"""What the command line shows besides answers: no progress bar in a log, help that says what an option
prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main

ROOT = Path(__file__).resolve().parents[1]

# A command run with stderr to a pipe, then transformers imported as an engine would: its tqdm bars
# ("Loading weights") are off, and the command line itself did not import transformers to say so.
QUIET = """
import sys
from dflash_tui.cli import main
main(["sessions", "list"], standalone_mode=False)
imported = "transformers" in sys.modules or "huggingface_hub" in sys.modules
from transformers.utils import logging
print("IMPORTED", imported, "BARS", logging.is_progress_bar_enabled())
"""


def test_no_progress_bar_is_written_to_a_stderr_that_is_no_terminal(data_dir):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env["DFLASH_DATA_DIR"] = str(data_dir)
    run = subprocess.run([sys.executable, "-c", QUIET], env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "IMPORTED False BARS False"
    # a setting of the user's own wins
    run = subprocess.run([sys.executable, "-c", QUIET], env={**env, "HF_HUB_DISABLE_PROGRESS_BARS": "0"},
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.stdout.splitlines()[-1] == "IMPORTED False BARS True"


def test_sessions_list_json_is_one_document_as_its_help_says(data_dir):
    from dflash_tui.core import sessions

    for n in range(2):
        writer = sessions.SessionWriter({"profile": {"name": "x"}}, session_id=f"20260101-12000{n}-json")
        writer.append_turn({"index": 0, "status": "completed", "user": f"q{n}", "answer": "a", "settings": {}})
        writer.close()
    listed = CliRunner().invoke(main, ["sessions", "list", "--json"], env={"DFLASH_DATA_DIR": str(data_dir)})
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)  # the whole output parses as one JSON value
    assert isinstance(rows, list) and sorted(r["id"] for r in rows) == ["20260101-120000-json", "20260101-120001-json"]
    help_text = " ".join(CliRunner().invoke(main, ["sessions", "list", "--help"]).output.split())
    assert "one JSON document: an array" in help_text and "per line" not in help_text


# Every writer under the one colour policy: click (a command's styled header), rich on stdout and on stderr.
WRITERS = """
from dflash_tui.cli import main
from dflash_tui.cli.style import console
main(["profile", "list"], prog_name="dflash", standalone_mode=False)
console().print("[bold]rich out[/]")
console(err=True).print("[bold]rich err[/]")
"""
SGR = re.compile(r"\x1b\[[0-9;]*m")  # a colour or style, not the cursor codes a live bar moves with


def _run(code: str, env: dict, tty: bool) -> tuple[str, str]:
    """(stdout, stderr) of `python -c code`, both on one pseudo-terminal (tty) or on pipes."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}, "TERM": "xterm", **env}
    command = [sys.executable, "-c", code]
    if not tty:
        run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        return run.stdout, run.stderr
    main_fd, child_fd = os.openpty()
    proc = subprocess.Popen(command, stdout=child_fd, stderr=child_fd, env=env, cwd=ROOT)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    proc.wait(timeout=60)
    text = b"".join(chunks).decode()
    return text, text


def _writers(env: dict, tty: bool) -> dict[str, bool]:
    """Whether each writer's line came out coloured."""
    out, err = _run(WRITERS, env, tty)
    marks = {"click": ("NAME", out), "rich out": ("rich out", out), "rich err": ("rich err", err)}
    return {writer: bool(SGR.search(next(line for line in text.splitlines() if mark in line)))
            for writer, (mark, text) in marks.items()}


@pytest.mark.parametrize(("env", "forced"), [
    ({}, None), ({"FORCE_COLOR": "1"}, True), ({"NO_COLOR": "1"}, False), ({"FORCE_COLOR": "0"}, None),
    ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, False)], ids=["default", "force", "no-color", "force-0", "both"])
def test_every_writer_follows_one_colour_policy(env, forced):
    """FORCE_COLOR keeps colour in a pipe (click.echo stripped it), NO_COLOR removes it everywhere (rich kept
    bold), FORCE_COLOR=0 forces nothing (rich took it as forcing), a terminal is coloured by default."""
    for tty in (False, True):
        expected = tty if forced is None else forced
        assert _writers(env, tty) == dict.fromkeys(["click", "rich out", "rich err"], expected), (env, tty)


# bench, replay and tune report each run to measure.Progress as (done, total, label)
PROGRESS = """
from dflash_tui.cli.measure import Progress
progress = Progress()
for done, label in enumerate(["warm-up, block 1", "block 1 · run 1/2", "block 1 · run 1/2", "block [4] · run 2/2"]):
    progress(done, 4, label)
progress(4, 4, "done")
progress.close()
print("END")
"""


def test_measure_progress_is_a_rich_bar_on_a_terminal_and_lines_in_a_log():
    out, err = _run(PROGRESS, {}, tty=False)
    assert out == "END\n"
    assert err.splitlines() == ["0/4 warm-up, block 1", "1/4 block 1 · run 1/2", "3/4 block [4] · run 2/2", "4/4 done"]
    shown, _ = _run(PROGRESS, {}, tty=True)
    assert "━" in shown and "2/4" in shown and "block [4] · run 2/2" in shown  # rich's bar, redrawn per run
    assert shown.count("\x1b[2K") >= 5 and shown.rstrip().endswith("END")  # each redraw clears its line


def _commands(group, path=()):
    import click

    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_json_is_a_flag_that_prints_on_every_command_and_bench_writes_a_file_with_output(tmp_path):
    """`--json` takes no value anywhere (bench's took a file); bench writes its file with --output/-o, the
    same document --json prints."""
    from tests.foreign import ForeignServer

    with_json = {" ".join(path): [p for p in command.params if "--json" in p.opts] for path, command in _commands(main)}
    with_json = {path: params for path, params in with_json.items() if params}
    assert {"bench", "generate", "replay", "sessions list", "profile list"} <= set(with_json)
    assert all(param.is_flag for params in with_json.values() for param in params), with_json
    out = tmp_path / "bench.json"
    with ForeignServer() as server:
        args = ["bench", "--url", server.base, "--dataset", "demo", "--max-samples", "1", "--repeats", "1"]
        printed = CliRunner().invoke(main, [*args, "--json", "-o", str(out)])
        tabled = CliRunner().invoke(main, [*args, "--output", str(tmp_path / "table.json")])
    assert printed.exit_code == 0 and tabled.exit_code == 0, printed.output + tabled.output
    assert json.loads(printed.stdout) == json.loads(out.read_text())  # one document, as the file holds
    assert json.loads(out.read_text())["schema"] == "dflash-bench/2" and f"wrote {out}" in printed.stderr
    assert "fastest: block size 1" in tabled.stdout and json.loads((tmp_path / "table.json").read_text())["rows"]


def test_help_lists_every_environment_variable_the_package_reads():
    """`dflash --help` names each DFLASH_* variable read anywhere in the package, the OPENAI_API_KEY fallback
    and the colour switches."""
    read = set()
    for source in [*(ROOT / "dflash_tui").rglob("*.py"), *(ROOT / "engines").rglob("*.py")]:
        read |= set(re.findall(r"[\"'](DFLASH_[A-Z_]+)[\"']", source.read_text()))
    shown = CliRunner().invoke(main, ["--help"]).output
    assert read >= {"DFLASH_DATA_DIR", "DFLASH_CONFIG_DIR", "DFLASH_DEBUG", "DFLASH_API_KEY"}
    assert [name for name in sorted(read | {"OPENAI_API_KEY", "NO_COLOR", "FORCE_COLOR"}) if name not in shown] == []
