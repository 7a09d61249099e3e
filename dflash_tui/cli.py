"""The `dflash` command line (click). Exit codes: 0 ok, 1 unexpected failure, 2 bad input."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="dflash-tui")
def main() -> None:
    """dflash: DFlash speculative decoding in your terminal.

    A block-diffusion draft proposes a block of tokens in one pass, the target verifies it in one
    pass, and the output is exactly what the target alone would write.
    """


# Subcommands register here, one line each.
