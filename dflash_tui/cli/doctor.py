"""`dflash doctor`: what is installed, what `auto` would pick, whether the `dflash` on PATH is this
package's, and whether a profile's pair is here and fits, in a form to paste into a bug report.
`dflash --version` is the first of those lines only, and imports no framework."""

from __future__ import annotations

import os
import platform
import re
import shutil
import stat
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

import click
from packaging.version import InvalidVersion, Version

from dflash_tui.cli import complete
from dflash_tui.cli.needs import target_needs
from dflash_tui.core.profiles import tomllib
from dflash_tui.core.terminal import printable
from dflash_tui.engines import available_memory, describe_auto, hub
from dflash_tui.engines.checkpoints import stored_bytes
from dflash_tui.engines.errors import UserError

PACKAGES = ("torch", "transformers", "mlx", "mlx-lm", "huggingface-hub", "textual")
TESTED = Path(__file__).resolve().parents[1] / "tested_versions.toml"  # the frameworks' versions the suite passed with


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> list[tuple[str, str]]:
    rows = [("dflash-tui", _version("dflash-tui")),
            ("python", f"{platform.python_version()} ({sys.platform}, {platform.machine()})")]
    rows += [(dist, _version(dist)) for dist in PACKAGES]
    rows.append(("auto-engine", describe_auto()))
    rows.append(("tested", tested_line()))
    return rows


def tested_line() -> str:
    """Whether each installed engine framework lies within the versions the suite has passed with
    (tested_versions.toml), naming any that does not, its range and the pin that brings a tested one back."""
    ranges = tomllib.loads(TESTED.read_text(encoding="utf-8"))
    inside, outside = [], []
    for dist, tested in ranges.items():
        installed = _version(dist)
        if installed == "not installed":
            continue
        low, high = Version(tested["lowest"]), Version(tested["newest"])
        try:
            release = Version(Version(installed).base_version)  # 2.13.0+cpu is 2.13.0
        except InvalidVersion:
            release = None
        span = f"{low} to {high}" if low != high else f"{low} only"
        if release is None or not low <= release <= high:
            side = "unreadable" if release is None else "newer than" if release > high else "older than"
            pin = high if release is None or release > high else low
            outside.append(f"{dist} {installed} is {side} the versions the suite has passed with ({span}; "
                           f"pip install '{dist}=={pin}' if something breaks)")
        else:
            inside.append(dist)
    if outside:
        return "; ".join(outside)
    return f"{', '.join(inside)} within the versions the suite has passed with" if inside else "no engine framework installed"


def print_version(ctx: click.Context, _param, value: bool) -> None:
    """The `--version` flag: one line, `dflash-tui 0.1.0`, without importing torch or mlx (doctor has the rest)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"dflash-tui {_version('dflash-tui')}")
    ctx.exit(0)


# What a console script runs: pip's, uv's and distlib's launchers say `from MODULE import FUNC`; setuptools'
# older ones `load_entry_point('DIST==VERSION', 'console_scripts', 'NAME')`.
_FROM_IMPORT = re.compile(r"^from\s+([\w.]+)\s+import\s+(\w+)", re.M)
_LOAD_ENTRY_POINT = re.compile(r"load_entry_point\(\s*['\"]([^'\"=<>~! ]+)")
OURS = "dflash_tui"


HEAD_BYTES = 65536  # a launcher says what it runs in its first lines; nothing past this is read


def head(path: Path, limit: int = HEAD_BYTES) -> Optional[bytes]:
    """The first `limit` bytes of the regular file at `path`; None for anything else (a FIFO, a device, a
    folder, an unreadable file). Opened without blocking (a FIFO with no writer never hangs the open) and
    checked on the open descriptor, so a file swapped after the check is not read either; never read whole."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY  # (POSIX, as dflash is: Linux and macOS)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def script_runs(path: Path) -> Optional[str]:
    """`module:function` (or `distribution dist`) that the console script at `path` runs; None when it
    cannot be told (a compiled launcher, an unreadable file, anything but a regular file)."""
    data = head(path)
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    found = _FROM_IMPORT.search(text)
    if found:
        return f"{found.group(1)}:{found.group(2)}"
    found = _LOAD_ENTRY_POINT.search(text)
    if found:
        return f"distribution {found.group(1)}"
    return OURS if OURS in text else None


def command_check(command: str = "dflash") -> str:
    """One line on the `dflash` that PATH finds: this package's, another install of it, or not ours at all
    (z-lab's `dflash` package installs a command of the same name; pip lets the last install win). The path
    is a folder on the user's PATH: it is shown escaped like any text from outside."""
    found = shutil.which(command)
    if found is None:
        return f"no `{command}` on PATH: activate the venv that installed dflash-tui, or run `python -m dflash_tui`"
    runs = script_runs(Path(found))
    if runs is None:
        return printable(f"{found}: cannot tell what it runs; if `{command} --version` does not say dflash-tui, "
                         "run `dflash-tui`")
    if runs.split(":")[0].split(".")[0] != OURS and runs != "distribution dflash-tui":
        return printable(f"{found} is NOT this package's (it runs {runs}; z-lab's `dflash` package has a command of "
                         f"the same name): run `dflash-tui` instead, or install the two in separate venvs")
    python = _shebang(Path(found))
    if python and Path(python).parent.parent.resolve() != Path(sys.prefix).resolve():
        return printable(f"{found}: dflash-tui, but another installation of it (its Python: {python})")
    return printable(f"{found}: this package's")


def _shebang(path: Path) -> Optional[str]:
    """The Python a launcher names on its first line (None for `env python`, a shell wrapper, a binary)."""
    data = head(path, 4096)
    first = (data or b"").split(b"\n", 1)[0].decode("utf-8", errors="replace")
    words = first[2:].split() if first.startswith("#!") else []
    return words[0] if words and Path(words[0]).name.startswith("python") else None


def where(name: Optional[str]) -> tuple[str, Optional[Path]]:
    """('local folder' | 'cached' | 'not downloaded', its folder when it is here)."""
    if not name:
        return "none", None
    path = Path(name).expanduser()
    if path.is_dir():
        return "local folder", path
    snapshot = hub.cached(name) if hub.looks_like_hub_id(name) else None
    return ("cached", snapshot) if snapshot else ("not downloaded", None)


@click.command()
@click.option("--profile", "-p", metavar="NAME|PATH", shell_complete=complete.profile_names,
              help="Also check this profile's pair: is it here, what its target needs, does it fit.")
def doctor(profile: Optional[str]) -> None:
    """What is installed, what `auto` picks and whether the `dflash` on PATH is this package's; with
    --profile, whether that pair is here, what its target needs (framework, windows, sinks, MXFP4, rollback)
    and whether it fits."""
    for label, value in environment():
        click.echo(printable(f"{label:<16} {value}"))
    click.echo(printable(f"{'dflash command':<16} {command_check()}"))
    if not profile:
        return
    from dflash_tui.core.profiles import load_profile

    config = load_profile(profile).engine_config()
    need, unknown = 0, []
    for role, name in (("target", config.target), ("draft", config.draft)):
        state, folder = where(name)
        size = stored_bytes(folder, role) if folder else _hub_size(role, name)
        if size is None and name:
            unknown.append(role)
        need += size or 0
        shown = f" · {_size(size)}" if size is not None else ""
        click.echo(printable(f"{role:<16} {name or '-'} ({state}{shown})"))
        if role == "target":
            needs = target_needs(folder) if folder else ["unknown until it is downloaded (read from its config.json)"]
            for line in needs:
                click.echo(printable(f"{'  needs':<16} {line}"))
    have, place = available_memory()
    verdict = ("cannot tell: the size of the " + " and ".join(unknown) + " is unknown offline" if unknown
               else "fits" if need <= have else "does NOT fit")
    click.echo(f"{'memory':<16} weights {_size(need)} as stored, {place} {_size(have)}: {verdict}")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def _hub_size(role: str, name: Optional[str]) -> Optional[int]:
    """What downloading a missing checkpoint would take, when the hub answers (None offline)."""
    if not name or not hub.looks_like_hub_id(name) or hub.offline():
        return None
    try:
        return sum(d.bytes or 0 for d in hub.plan({role: name}))
    except UserError:
        return None
