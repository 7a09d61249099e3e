"""Issue 43: what the command line takes. Every numeric flag of every command takes a finite value in its
range, else one sentence and exit 2 (section 5, "Numbers"); `doctor` and `generate -` never wait on what
never ends (section 4); HF_HUB_OFFLINE reads as huggingface_hub reads it and `--model` without a server is
refused (section 7)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dflash_tui.cli import main, numbers
from dflash_tui.core import settings
from dflash_tui.core.profiles import Profile
from dflash_tui.engines import hub
from dflash_tui.serve.cli import ByteSize
from tests import waiting

ROOT = Path(__file__).resolve().parents[1]
# the modules (dflash_tui.cli's own names `doctor` and `generate` are the click commands)
doctor = importlib.import_module("dflash_tui.cli.doctor")
generate = importlib.import_module("dflash_tui.cli.generate")


def commands(command: click.Command = main, path: tuple = ()):
    """(command path, command) for every command the CLI has."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, path + (name,))


def invocation(path: tuple, command: click.Command, *given: str) -> list[str]:
    """The words that run `command` with `given` and a placeholder for each required argument."""
    required = ["x" for p in command.params if isinstance(p, click.Argument) and p.required]
    return [*path, *given, *required]


def bad_values(kind: click.ParamType) -> list[str]:
    values = ["inf", "-inf", "nan", "NaN", "1e400", "-1e400"]
    if isinstance(kind, (click.types.IntParamType, ByteSize)):
        values += ["9" * 30, "-" + "9" * 30]
    low, high = getattr(kind, "min", None), getattr(kind, "max", None)
    step = 1 if isinstance(kind, click.types.IntParamType) else 0.5
    if low is not None:
        values.append(str(low - step))
    if high is not None:
        values.append(str(high + step))
    if isinstance(kind, ByteSize):
        values += ["0", "2G", "lots", "1e3"]
    return values


def numeric_options():
    for path, command in commands():
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, (click.types.IntParamType,
                                                                           click.types.FloatParamType, ByteSize)):
                yield path, command, param


def test_every_numeric_flag_of_every_command_refuses_a_value_that_is_not_finite_or_in_range():
    runner = CliRunner()
    seen = 0
    for path, command, param in numeric_options():
        assert isinstance(param.type, (*numbers.CHECKED, ByteSize)), (path, param.opts)  # the one rule covers it
        flag = max(param.opts, key=len)
        for value in bad_values(param.type):
            result = runner.invoke(main, invocation(path, command, f"{flag}={value}"))
            lines = result.output.strip().splitlines()
            assert result.exit_code == 2, (path, flag, value, result.output)
            assert len(lines) == 1 and flag in lines[0] and "unexpected" not in lines[0], (path, flag, value, lines)
            seen += 1
    assert seen > 100  # every command's flags were walked (generate, bench, tune, replay, train-draft, serve...)


def test_numbers_in_range_still_read_as_before():
    assert numbers.Int64().convert("12", None, None) == 12
    assert numbers.FiniteFloatRange(0, 3600).convert("2.5", None, None) == 2.5
    assert ByteSize().convert("8MB", None, None) == 8 * 2**20 and ByteSize().convert("1.5K", None, None) == 1536


@pytest.mark.parametrize("value", ["1", "0", "off", "OFF", "on", "On", "2", "yes", "no", "true", "True", "false", "",
                                   " 1", "auto"])
def test_hf_hub_offline_reads_as_huggingface_hub_reads_it(monkeypatch, value):
    from huggingface_hub.constants import _is_true

    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub.offline() is _is_true(value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", value)  # huggingface_hub's fallback
    assert hub.offline() is _is_true(value)


def test_model_without_a_server_is_refused_by_every_command_that_takes_it(data_dir):
    runner = CliRunner()
    with_model = [(path, command) for path, command in commands()
                  if any(p.name == "model" for p in command.params)]
    assert {p[-1] for p, _ in with_model} >= {"generate", "chat", "bench", "tune"}
    for path, command in with_model:
        extra = ["--plain"] if path[-1] == "chat" else []
        result = runner.invoke(main, invocation(path, command, "--model", "some-model", *extra))
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and "--model" in lines[0] and "--url" in lines[0], \
            (path, result.output)
    served = Profile(name="p", description="", path=None, target="t", draft=None, engines={"remote": {"url": "http://h:1/v1"}})
    settings.refuse_model_without_url(served, None, "m")  # the profile names its server: --model has a meaning


def _identify_in_time(path_dir: Path, monkeypatch) -> str:
    """doctor's line on the `dflash` in `path_dir`, from a thread: a hang fails the test instead of stopping it."""
    monkeypatch.setenv("PATH", str(path_dir))
    said: list[str] = []
    worker = threading.Thread(target=lambda: said.append(doctor.command_check()), daemon=True)
    worker.start()
    worker.join(waiting.limit(60))
    assert said, "doctor hung on the dflash found on PATH"
    return said[0]


def test_doctor_never_reads_a_fifo_or_a_huge_file_on_path_whole(tmp_path, monkeypatch):
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "dflash")
    (fifo_dir / "dflash").chmod(0o755)  # which() takes an executable FIFO for a command
    assert "cannot tell what it runs" in _identify_in_time(fifo_dir, monkeypatch)

    big_dir = tmp_path / "big"
    big_dir.mkdir()
    big = big_dir / "dflash"
    with open(big, "wb") as f:
        f.write(f"#!{sys.executable}\nfrom dflash_tui.cli import main\n".encode())
        f.truncate(64 * 2**30)  # sparse: 64 GB long, nothing on disk
    big.chmod(0o755)
    assert "dflash-tui" in _identify_in_time(big_dir, monkeypatch) or "this package" in doctor.command_check()
    assert doctor.head(big, 16) == b"#!" + sys.executable.encode()[:14]
    assert doctor.head(fifo_dir / "dflash") is None and doctor.head(tmp_path) is None


def test_generate_reads_at_most_its_bound_from_standard_input(monkeypatch):
    monkeypatch.setattr(generate, "STDIN_LIMIT", 1000)
    result = CliRunner().invoke(main, ["generate", "-"], input=b"x" * 1001)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "Standard input holds more than" in lines[0], result.output
    # an endless stream, at the real bound (8 MiB): refused after reading 8 MiB + 1 byte, never more
    with open(os.devnull if sys.platform == "win32" else "/dev/zero", "rb") as zero:
        proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "-"], stdin=zero, capture_output=True,
                              text=True, cwd=ROOT, timeout=waiting.limit(120), env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 2 and "more than 8,388,608 bytes" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
