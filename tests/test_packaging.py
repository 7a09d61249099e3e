"""Installing: the CPU torch install falls back quickly where PyTorch's CPU index is unreachable."""

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
