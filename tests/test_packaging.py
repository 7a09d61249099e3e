"""Installing: the CPU torch install falls back quickly where PyTorch's CPU index is unreachable; the sdist
carries its tests, and the wheel built from it installs one top-level import name."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _probe_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel standing in for torch (so no large download can happen)."""
    wheel = folder / "dflashprobe-1.0-py3-none-any.whl"
    info = "dflashprobe-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("dflashprobe/__init__.py", "VERSION = '1.0'\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: dflashprobe\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def test_torch_install_falls_back_to_pips_own_configuration_when_the_cpu_index_is_unreachable(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _probe_wheel(wheels)
    dead = f"http://127.0.0.1:{_closed_port()}/simple"
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, TORCH_CPU_INDEX=dead, PIP_INDEX_URL=dead,
               PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_RETRIES="0")
    target = tmp_path / "site"
    run = subprocess.run(["sh", str(ROOT / "scripts" / "install_torch.sh"), f"{sys.executable} -m pip",
                          "dflashprobe==1.0", "--target", str(target), "--no-deps"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "could not be reached" in run.stderr  # the CPU index was tried first, then the fallback
    assert (target / "dflashprobe" / "__init__.py").is_file()


# A subset that touches every package and the fixtures (tiny models, profiles, the demo pair).
SDIST_SMOKE = ["tests/test_profiles.py", "tests/test_cli_generate.py::test_json_ids_equal_transformers_greedy",
               "tests/test_doctor.py::test_doctor_names_the_frameworks_and_what_auto_picks"]
# Import from the unpacked sdist, not from this checkout's editable install.
ISOLATED = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in repr(f)]; "
            "import pytest; sys.exit(pytest.main(sys.argv[1:]))")


def wheel_top_level(wheel: Path) -> tuple[set[str], set[str]]:
    """The names the wheel's top_level.txt declares, and the first path parts of its RECORD."""
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        declared = set(z.read(f"{info}/top_level.txt").decode().split())
        record = z.read(f"{info}/RECORD").decode().splitlines()
    return declared, {line.split(",")[0].split("/")[0] for line in record if line} - {info}


def test_the_sdist_carries_its_tests_and_they_pass_from_it_and_its_wheel_installs_one_top_level_name(tmp_path):
    import tarfile

    # sdist first, then the wheel built from it: the path a user's pip takes
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("dflash_tui-*.whl")
    assert wheel_top_level(wheel) == ({"dflash_tui"}, {"dflash_tui"})
    with zipfile.ZipFile(wheel) as z:
        assert {"dflash_tui/engines/__init__.py", "dflash_tui/engines/cuda/loop.py",
                "dflash_tui/profiles_data/demo.toml"} <= set(z.namelist())
    (archive,) = tmp_path.glob("dflash_tui-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / archive.name.removesuffix(".tar.gz")
    for needed in ("tests/conftest.py", "tests/tiny.py", "tests/oracles.py", "Makefile", "scripts/install_torch.sh",
                   "tests/__snapshots__/test_tui/test_snapshot_main_screen.svg", "LICENSE", ".ci/run"):
        assert f"{root.name}/{needed}" in names, needed
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    run = subprocess.run([sys.executable, "-c", ISOLATED, "-q", "-p", "no:cacheprovider", *SDIST_SMOKE],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and str(root) in subprocess.run(
        [sys.executable, "-c", "import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
         "repr(f)]; import dflash_tui; print(dflash_tui.__file__)"], cwd=root, env=env, capture_output=True,
        text=True, timeout=120).stdout
