"""Before a command loads a pair that is not downloaded: say how big it is, check it can fit, ask,
then download it here, in the parent process, with a progress bar (the TUI's engine process sends
its output nowhere). Without a terminal nobody can answer, so the command stops with the `hf
download` line instead; a piped `chat --plain` never takes a prompt line as the answer."""

from __future__ import annotations

import sys

import click

from dflash_tui.cli.style import console
from dflash_tui.engines import available_memory, hub
from dflash_tui.engines.config import EngineConfig
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import printable


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def ensure_local(config: EngineConfig) -> None:
    """Make sure the target and draft of `config` are on disk, asking before any download."""
    if config.engine == "remote":
        return
    wanted = {"target": config.target, "draft": config.draft}
    hub.require_cached(wanted)  # offline: one sentence naming all of them
    absent = hub.missing(wanted)
    if not absent:
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise hub.refuse_without_terminal(absent)
    downloads = hub.plan(absent)
    total = sum(d.bytes or 0 for d in downloads)
    have, place = available_memory()
    if total > have:  # the weights as stored are a lower bound of what loading them takes
        raise UserError(f"{' and '.join(d.repo for d in downloads)} take {_size(total)} as stored but {place} has "
                        f"{_size(have)}; pick a smaller profile, or a quantized MLX build with --engine mlx.")
    listing = ", ".join(f"the {d.role} {d.repo} ({_size(d.bytes or 0)})" for d in downloads)
    if not click.confirm(printable(f"Download {listing} into the Hugging Face cache?"), default=True, err=True):
        raise UserError(f"Nothing was downloaded; run `{' && '.join(f'hf download {d.repo}' for d in downloads)}` "
                        "when you want them, or pass local folders.")
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("downloading"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console(err=True)) as bar:
        task = bar.add_task("download", total=total or None)
        hub.fetch(downloads, lambda done, _total: bar.update(task, completed=done))
