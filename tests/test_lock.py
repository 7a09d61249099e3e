"""The lock (constraints.txt) and the tested versions doctor ships: the lock lies inside every tested range,
doctor names a framework outside its range, and scripts/write_lock.py writes both files from a venv."""

from __future__ import annotations

import importlib
import sysconfig
from importlib import metadata
from pathlib import Path

import tomlkit
from click.testing import CliRunner
from packaging.utils import canonicalize_name
from packaging.version import Version

from dflash_tui.cli import main
from dflash_tui.core.profiles import tomllib
from scripts import write_lock

ROOT = Path(__file__).resolve().parents[1]
doctor = importlib.import_module("dflash_tui.cli.doctor")  # (the package's `doctor` is the click command)


def locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower()] = version
    return pins


def test_the_lock_pins_every_framework_inside_the_versions_the_suite_passed_with():
    pins = locked()
    tested = tomllib.loads(doctor.TESTED.read_text())
    assert set(tested) == {"torch", "transformers", "mlx", "mlx-lm"}
    for dist, span in tested.items():
        assert Version(span["lowest"]) <= Version(pins[dist]) <= Version(span["newest"]), dist
    assert "+" not in pins["torch"]  # one pin for the CPU, CUDA and macOS builds of a release


def doctor_line(runner_env=None) -> str:
    result = CliRunner().invoke(main, ["doctor"], env=runner_env)
    assert result.exit_code == 0, result.output
    (line,) = [line[16:].strip() for line in result.output.splitlines() if line.startswith("tested ")]
    return line


def test_doctor_names_each_framework_outside_the_tested_versions(tmp_path, monkeypatch):
    assert doctor_line().endswith("within the versions the suite has passed with")
    ranges = tmp_path / "tested_versions.toml"
    ranges.write_text('[torch]\nlowest = "0.1"\nnewest = "0.2"\n[transformers]\nlowest = "99.0"\nnewest = "99.1"\n'
                      '[mlx-lm]\nlowest = "0.1"\nnewest = "99"\n[not-a-distribution]\nlowest = "1"\nnewest = "2"\n')
    monkeypatch.setattr(doctor, "TESTED", ranges)
    line = doctor_line()
    torch, transformers = metadata.version("torch"), metadata.version("transformers")
    assert f"torch {torch} is newer than the versions the suite has passed with (0.1 to 0.2; pip install 'torch==0.2'" in line
    assert (f"transformers {transformers} is older than the versions the suite has passed with (99.0 to 99.1; "
            "pip install 'transformers==99.0'") in line
    assert "mlx-lm" not in line and "not-a-distribution" not in line  # inside its range; not installed


def test_write_lock_pins_this_venv_and_raises_the_newest_tested(tmp_path, monkeypatch):
    lock, tested = tmp_path / "constraints.txt", tmp_path / "tested_versions.toml"
    tested.write_text('# kept\n[transformers]\nlowest = "5.0.0"  # kept too\nnewest = "5.0.1"\n'
                      '[torch]\nlowest = "1.0"\nnewest = "999.0"\n')
    monkeypatch.setattr(write_lock, "LOCK", lock)
    monkeypatch.setattr(write_lock, "TESTED", tested)
    write_lock.main()
    pins = dict(line.split("==") for line in lock.read_text().splitlines() if not line.startswith("#"))
    assert "dflash-tui" not in pins and pins["transformers"] == metadata.version("transformers")
    assert pins["torch"] == metadata.version("torch").split("+")[0]
    site = sysconfig.get_paths()["purelib"]  # this venv's own distributions (sys.path may list others twice)
    installed = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions(path=[site])}
    assert {canonicalize_name(name) for name in pins} == installed - {"dflash-tui"}
    after = tomlkit.parse(tested.read_text())
    assert after["transformers"]["newest"] == metadata.version("transformers")  # raised to the locked version
    assert after["torch"]["newest"] == "999.0"  # never lowered
    assert "# kept" in tested.read_text() and "# kept too" in tested.read_text()
