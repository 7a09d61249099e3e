"""One top-level import name: the wheel installs `dflash_tui` alone, and nothing imports the repository's
root `engines/` as a module of its own (it would be a second copy of every engine module, and PyPI's
`engines` distribution owns that name)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Imports every module of the package, then runs a real generation through the CLI, then lists any module
# named `engines` (or under it) that got loaded. Run outside the repository root, so only the installed
# package can be found; optional frameworks that are missing may fail to import and are skipped.
PROBE = """
import importlib, pkgutil, sys
import dflash_tui
for info in pkgutil.walk_packages(dflash_tui.__path__, "dflash_tui."):
    if info.name == "dflash_tui.__main__":  # it runs the command line
        continue
    if info.name.startswith(("dflash_tui.engines.mlx", "dflash_tui.profiles_data")) and "mlx" not in sys.modules:
        try:
            importlib.import_module("mlx.core")
        except ImportError:
            continue
    importlib.import_module(info.name)
from dflash_tui.cli import main
code = main(["generate", "--target", sys.argv[1], "--draft", sys.argv[2], "--engine", "cuda", "--device", "cpu",
             "--dtype", "float32", "--max-new-tokens", "6", "--json", "Hello"], prog_name="dflash", standalone_mode=False)
assert code in (0, None), code
print("LOADED", sorted(m for m in sys.modules if m == "engines" or m.startswith("engines.")))
"""


def test_no_module_named_engines_is_loaded_outside_the_repository(tmp_path, pairs):
    target, draft = pairs("qwen3")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", PROBE, str(target), str(draft)], cwd=outside, env=dict(env, OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "LOADED []" in run.stdout, run.stdout[-2000:]


def test_the_guard_sees_a_leftover_import_of_the_old_name(tmp_path):
    """The lint rule that bans `engines` fires on the forms a leftover would take (ruff's TID251)."""
    leftover = tmp_path / "leftover.py"
    leftover.write_text("from engines.config import EngineConfig\nimport engines\nfrom engines import load_engine\n")
    ruff = Path(sys.executable).with_name("ruff")
    run = subprocess.run([str(ruff), "check", "--config", str(ROOT / "pyproject.toml"), "--select", "TID251",
                          "--no-cache", str(leftover)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stdout.count("TID251") == 3, run.stdout
