"""`dflash doctor` and `dflash --version`: what is installed, what `auto` would pick, and whether a
profile's pair is here and fits, in a form to paste into a bug report."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

import click

from dflash_tui.cli import complete
from dflash_tui.engines import available_memory, describe_auto, hub
from dflash_tui.engines.checkpoints import stored_bytes
from dflash_tui.engines.errors import UserError

PACKAGES = ("torch", "transformers", "mlx", "mlx-lm", "huggingface-hub", "textual")


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
    return rows


def print_version(ctx: click.Context, _param, value: bool) -> None:
    """The `--version` flag: the package, its frameworks and the engine `auto` would pick."""
    if not value or ctx.resilient_parsing:
        return
    for name, value in environment():
        click.echo(f"{name:<16} {value}")
    ctx.exit(0)


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
              help="Also check this profile's pair: is it here, does it fit.")
def doctor(profile: Optional[str]) -> None:
    """What is installed and what `auto` picks; with --profile, whether that pair is here and fits."""
    for name, value in environment():
        click.echo(f"{name:<16} {value}")
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
        click.echo(f"{role:<16} {name or '-'} ({state}{shown})")
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
