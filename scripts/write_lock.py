"""Write the lock from the venv this runs in: `python scripts/write_lock.py` (`make lock` runs it there once the
whole suite has passed in that venv).

constraints.txt is a pip constraints file: every distribution installed here, pinned exactly, so `make install`
gets the stack the suite last passed with (pip applies a pin only to what it installs: the Linux CPU lock still
fits a Mac or a CUDA machine, whose platform-only packages stay as their own pins resolve them). A local version
label is dropped (torch 2.13.0+cpu is locked as 2.13.0, which the CUDA and macOS builds of that release also
satisfy). dflash_tui/tested_versions.toml's `newest` is raised to each locked framework version.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomlkit
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
TESTED = ROOT / "dflash_tui" / "tested_versions.toml"
HEADER = """\
# The versions the whole suite last passed with (`make lock` wrote this; do not edit by hand).
# make install / chat / test install with `pip install -c constraints.txt`. Refresh: `make lock`, which
# installs the newest versions pyproject.toml admits in .venv-latest, runs the whole suite there, and
# writes this file only when it passes (README, "Install").
"""


def frozen() -> dict[str, str]:
    """{distribution: version} of every distribution in this venv but the project itself."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                         check=True, capture_output=True, text=True).stdout
    pins = {}
    for line in out.splitlines():
        name, sep, version = line.partition("==")
        if not sep or name.lower() == "dflash-tui":
            continue  # (a direct reference or the project)
        pins[name] = version.split("+")[0]
    return pins


def main() -> None:
    pins = frozen()
    LOCK.write_text(HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins, key=str.lower)))
    tested = tomlkit.parse(TESTED.read_text())
    for name, table in tested.items():
        locked = pins.get(name)
        if locked is not None and Version(locked) > Version(str(table["newest"])):
            table["newest"] = locked
    TESTED.write_text(tomlkit.dumps(tested))
    print(f"wrote {LOCK.name} ({len(pins)} pins) and {TESTED.name}")


if __name__ == "__main__":
    main()
