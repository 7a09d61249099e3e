"""The `dflash` command line (click). Exit codes: 0 ok, 1 unexpected failure, 2 bad input."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

import click

from dflash_tui.cli.chat import chat, sessions
from dflash_tui.cli.doctor import doctor, print_version
from dflash_tui.cli.generate import generate
from dflash_tui.cli.measure import bench, replay, tune
from dflash_tui.cli.numbers import checked
from dflash_tui.cli.profile import profile
from dflash_tui.cli.train import train_draft
from dflash_tui.core.terminal import color_forced
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import printable
from dflash_tui.serve.cli import serve, serve_command


def _quiet_broken_pipe() -> None:
    """The reader went away (`dflash profile list | head -1`): stop without a word, as other CLIs do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(0)


def _no_progress_bars_off_a_terminal() -> None:
    """transformers' "Loading weights" bar (tqdm) is noise in a pipe or a log file: off when stderr is no
    terminal. transformers takes the switch from huggingface_hub's HF_HUB_DISABLE_PROGRESS_BARS when it
    is imported (so is an engine process started from here); a library already imported (a host program,
    the tests) is switched directly. Imports neither, and a setting of the user's own wins."""
    try:
        if sys.stderr is None or sys.stderr.isatty() or "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
            return
    except (AttributeError, ValueError):  # a stderr without isatty, or a closed one
        return
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # huggingface_hub's bars too
    elif "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def _escaped_library_output() -> None:
    """Libraries print values from a checkpoint raw (transformers logs a config's rope_type as it reads
    it): every log record's message and every warning is escaped like dflash's own text. Installed once
    per process; a record whose message does not format is left as logging would show it."""
    global _escaping
    if _escaping:
        return
    _escaping = True
    import logging
    import warnings

    make_record = logging.getLogRecordFactory()

    def escaped_record(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            record.msg, record.args = printable(record.getMessage()), ()
        except Exception:  # noqa: BLE001 - logging's own handler reports a message that does not format
            pass
        return record

    logging.setLogRecordFactory(escaped_record)
    format_warning = warnings.formatwarning
    warnings.formatwarning = lambda *args, **kwargs: printable(format_warning(*args, **kwargs))


_escaping = False


class Group(click.Group):
    """Turns bad input into one sentence on stderr and exit code 2, never a traceback; click's own
    usage errors (a wrong type, a missing argument) read the same way."""

    def main(self, args: Optional[Sequence[str]] = None, prog_name: Optional[str] = None,
             complete_var: Optional[str] = None, standalone_mode: bool = True, **kwargs: Any) -> Any:
        _no_progress_bars_off_a_terminal()
        _escaped_library_output()
        # click.echo strips colour from whatever is no terminal unless its context says otherwise: it says
        # what NO_COLOR and FORCE_COLOR say (None: each stream's own terminal test, as color_enabled's)
        kwargs.setdefault("color", color_forced())
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **kwargs)
        except click.UsageError as exc:
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
            click.echo(printable(f"error: {exc.format_message()}{where}"), err=True)
            code = 2
        except click.ClickException as exc:
            click.echo(printable(f"error: {exc.format_message()}"), err=True)
            code = exc.exit_code
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context):
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, inside this handler, not at interpreter exit
            return result
        except BrokenPipeError:
            _quiet_broken_pipe()
        except UserError as exc:
            click.echo(printable(f"error: {exc}"), err=True)  # it may echo a value the user or a file gave
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as exc:
            if os.environ.get("DFLASH_DEBUG"):
                raise
            click.echo(printable(f"error: unexpected {type(exc).__name__}: {exc} (set DFLASH_DEBUG=1 for the traceback)"),
                       err=True)
            ctx.exit(1)


ENVIRONMENT = """\b
Environment:
  DFLASH_DATA_DIR     sessions, exports and the REPL history (default: the platformdirs data folder)
  DFLASH_CONFIG_DIR   your profiles and the TUI's preferences (default: the platformdirs config folder)
  DFLASH_DEBUG        any value: an unexpected error prints its traceback instead of one line
  DFLASH_API_KEY      the remote engine's key for its server (--api-key and a profile's api_key win),
                      else OPENAI_API_KEY; for `dflash serve`, the key it requires of clients
  DFLASH_CUDA_GRAPHS  1: the cuda engine on a GPU replays captured CUDA graphs
  DFLASH_COMPILE      1: the cuda engine on the CPU compiles its decode steps (inductor) at load;
                      background: after the first answer (chat's and serve's default); 0: never
  NO_COLOR            set and not empty: no colour anywhere
  FORCE_COLOR         set and not 0: colour where the output is no terminal (NO_COLOR wins)"""


@click.group(cls=Group, epilog=ENVIRONMENT,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=print_version,
              help="Print dflash-tui's version (`dflash doctor` adds the frameworks and the engine `auto` picks).")
def main() -> None:
    """dflash: DFlash speculative decoding in your terminal.

    A block-diffusion draft proposes a block of tokens in one pass, the target verifies it in one
    pass, and the output is exactly what the target alone would write.
    """


# Subcommands register here, one line each.
main.add_command(generate)
main.add_command(doctor)
main.add_command(profile)
profile.add_command(serve_command)
main.add_command(train_draft)
main.add_command(chat)
main.add_command(sessions)
main.add_command(replay)
main.add_command(bench)
main.add_command(tune)
main.add_command(serve)
checked(main)  # every numeric flag of every command: a finite value in its range, else exit 2 (cli/numbers.py)
