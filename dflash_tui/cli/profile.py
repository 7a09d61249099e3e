"""`dflash profile ...`: list, show, locate, check and create TOML profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import click

from dflash_tui.cli.style import styled
from dflash_tui.core import profiles
from dflash_tui.core.terminal import printable
from dflash_tui.engines import files, hub
from dflash_tui.engines.errors import UserError


@click.group()
def profile() -> None:
    """Per-model profiles: built-in ones, and yours in `dflash profile path`, which win by name."""


@profile.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array of profiles.")
def list_cmd(as_json: bool) -> None:
    """Every profile by name, with where it comes from."""
    errors: list[UserError] = []
    found = profiles.list_profiles(errors)
    if as_json:
        click.echo(json.dumps([{"name": p.name, "description": p.description, "source": p.origin,
                                "path": str(p.path), "target": p.target, "draft": p.draft,
                                "drafts": list(p.drafts or ([p.draft] if p.draft else []))} for p in found], indent=2))
    else:
        width = max([len(p.name) for p in found] + [4])
        click.echo(styled(f"{'NAME':<{width}}  {'SOURCE':<8}  DESCRIPTION", bold=True))
        for p in found:
            click.echo(printable(f"{p.name:<{width}}  {p.origin:<8}  {p.description}"))
    for e in errors:
        click.echo(styled(printable(f"skipped: {e}"), err=True, fg="yellow"), err=True)


@profile.command()
@click.argument("name")
def show(name: str) -> None:
    """The TOML text of profile NAME (a name or a file), after a comment saying where it is."""
    p = profiles.load_profile(name)
    assert p.path is not None
    click.echo(styled(printable(f"# {p.origin} profile {p.name}: {p.path}"), dim=True))
    if len(p.drafts) > 1:  # the TOML says it too; this line says what the list means
        click.echo(styled(printable(f"# drafts: {p.drafts[0]} loads; the chat's palette (ctrl+p, Draft:) switches to "
                                    f"{', '.join(p.drafts[1:])}"), dim=True))
    click.echo(printable(p.path.read_bytes().decode("utf-8", errors="replace")), nl=False)  # comments too


@profile.command()
def path() -> None:
    """The directory of your own profiles (created by `dflash profile new`)."""
    click.echo(printable(profiles.user_profile_dir()))


@profile.command()
@click.argument("file", metavar="NAME|FILE")
def validate(file: str) -> None:
    """Check profile NAME (as `show` finds it) or FILE: exit 0 when it loads (a hub model not downloaded yet is a
    note), else print what is wrong and where, and exit 2."""
    file_path = Path(file)  # (not click.Path: a name the file system cannot hold is one sentence here, not a ValueError)
    named = not os.path.lexists(file_path) and os.sep not in file and not file.endswith(".toml")
    if not named and not os.path.exists(file_path):  # a folder, a FIFO: load_profile says what it is instead
        raise UserError(printable(f"Profile file {file_path} does not exist; check the path."))
    p = profiles.load_profile(file if named else str(file_path))
    if named and p.path is not None:
        file_path = p.path
    checked: list[tuple[str, Optional[str]]] = [("target =", p.target)]
    checked += [("drafts entry", d) for d in p.drafts] if p.drafts else [("draft =", p.draft)]
    notes = [_model_note(p, file_path, role, value) for role, value in checked if value]
    draft = f" + {p.draft}" if p.draft else " (no draft)"
    if len(p.drafts) > 1:
        draft += f" (drafts to switch to: {', '.join(p.drafts[1:])})"
    click.echo(f"{styled('ok', fg='green')}: {printable(f'{file_path} is profile {p.name}: {p.target}{draft}')}")
    for note in filter(None, notes):
        click.echo(styled(printable(f"note: {note}"), err=True, fg="yellow"), err=True)


def _model_note(p: profiles.Profile, file_path: Path, role: str, value: str) -> Optional[str]:
    """None when the model `value` is here (a folder, or a hub repo in the cache); a note when it is a hub repo
    not downloaded yet (a run downloads it). A local path that is not there is an error, and so is a hub-like
    name that is a built-in profile's folder: a copy of that profile elsewhere lost the folder beside it."""
    if Path(p.local_path(value)).expanduser().is_dir() or (hub.looks_like_hub_id(value) and hub.cached(value)):
        return None
    beside = p.path.resolve().parent / value if p.path else value
    builtin = profiles.builtin_profile_dir() / value
    lost = not Path(value).is_absolute() and builtin.is_dir()
    if hub.looks_like_hub_id(value) and not lost:
        return (f"{role} {value!r} is not downloaded yet; a run downloads it (unless HF_HUB_OFFLINE is set), or "
                f"`hf download {value}` does now.")
    fix = (f"it is the built-in profiles' folder {builtin}, which a copy does not take along: write that path, or "
           "copy with `dflash profile new NAME --from PROFILE`" if lost else
           f"fix the path, or run `hf download {value}` if it is a hub id")
    raise UserError(printable(f"{file_path}: {role} {value!r} is neither a folder (none at {beside}) nor a "
                              f"downloaded hub repo; {fix}."))


@profile.command()
@click.argument("name")
@click.option("--from", "source", metavar="PROFILE", help="Start from a copy of this profile (paths made absolute).")
@click.option("--force", is_flag=True, help="Overwrite an existing profile of that name.")
def new(name: str, source: Optional[str], force: bool) -> None:
    """Write a commented template (or a copy of --from) for profile NAME to your profile directory."""
    text = profiles.copied_profile_text(name, source) if source else profiles.new_profile_text(name)
    target = profiles.user_profile_dir() / f"{name}.toml"
    exists = UserError(printable(f"Profile {target} already exists; edit it, or pass --force to overwrite it."))
    if os.path.lexists(target) and not force:  # a dangling link too: it is never written through
        raise exists
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # a new file renamed into place: --force over a link replaces the link, never what it points at
        files.write_file(target, text.encode("utf-8"), mode=None, replace=force)
    except FileExistsError:  # made meanwhile
        raise exists from None
    except OSError as exc:  # a read-only or full config folder
        raise UserError(printable(f"Profile {target} cannot be written ({exc.strerror or type(exc).__name__}); make "
                                  f"{target.parent} writable or free some space, or set DFLASH_CONFIG_DIR.")) from None
    click.echo(printable(target))
