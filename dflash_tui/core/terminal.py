"""What reaches a terminal: the colour policy (`NO_COLOR`, `FORCE_COLOR`) and text with its control
characters made visible, shared by the CLI, the REPL and the TUI.

`printable` is the one function every writer of text that came from outside the program (model output,
file contents, session and profile fields, values echoed back in errors and listings) passes it through;
`json_text` is its counterpart for JSON written to a terminal or a pipe."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager, suppress
from typing import Optional

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import BIDI, one_line, printable

__all__ = ["clipboard", "color_enabled", "color_forced", "edit_in_editor", "is_terminal", "json_text", "one_line",
           "printable", "typing_hidden"]


def counted(n: int, noun: str) -> str:
    """'1 turn', '3 turns': a count with its noun (regular plurals only)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def color_forced() -> Optional[bool]:
    """The environment's word on colour, whatever the stream: False when NO_COLOR is set to anything but
    the empty string (https://no-color.org; it wins), True when FORCE_COLOR is set and not "0" (e.g. for a
    pager), None when neither is: then a terminal gets colour and a pipe does not. click takes it as its
    context's `color` (cli/__init__.py) and rich consoles through cli/style.py, so every writer agrees."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "0") not in ("", "0"):
        return True
    return None


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def color_enabled(stream=None) -> bool:
    """Whether text written to `stream` (stdout by default) is coloured: `color_forced`, else whether the
    stream is a terminal."""
    forced = color_forced()
    return is_terminal(stream or sys.stdout) if forced is None else forced


# What json.dumps(ensure_ascii=False) leaves raw that a terminal may act on (C0 controls it escapes
# itself): DEL, the C1 controls, lone surrogates and the bidirectional formatting characters, as JSON \u
# escapes (they occur only inside strings, so the JSON reads back the same).
_JSON_RAW = {c: f"\\u{c:04x}" for c in [0x7F, *range(0x80, 0xA0), *range(0xD800, 0xE000), *BIDI]}


def json_text(value, **kwargs) -> str:
    """json.dumps(value, ensure_ascii=False, **kwargs) with nothing in it a terminal acts on: readable
    non-ASCII text, every control character escaped."""
    return json.dumps(value, ensure_ascii=False, **kwargs).translate(_JSON_RAW)


@contextmanager
def typing_hidden(stream=None, raw: bool = False):
    """While an answer streams to a terminal: ctrl+c is not echoed as `^C` into the answer's text (ECHOCTL),
    nor is text typed ahead (ECHO; the next prompt gets it). With `raw`, for a next prompt that reads keys
    raw (prompt-toolkit's), the keys typed ahead also reach it as typed: not a line at a time (ICANON, whose
    erase and kill keys would act on them) and enter not turned into ctrl+j (ICRNL), which the prompt reads
    as a new line, so `/stats` enter `/help` enter became one message of two lines. ctrl+c still interrupts
    (ISIG). The terminal's modes are restored after. A stream that is no terminal (a pipe, a file) is left
    alone."""
    stream = sys.stdin if stream is None else stream
    try:
        import termios

        fd = stream.fileno()
        saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    except (ImportError, AttributeError, OSError, ValueError):  # no termios (Windows), a closed or fake stream
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL | (termios.ICANON if raw else 0))
    if raw:
        quiet[0] &= ~termios.ICRNL
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with suppress(termios.error):  # a terminal that went away (a closed SSH session) keeps no modes
            termios.tcsetattr(fd, termios.TCSANOW, saved)


def clipboard(text: str) -> str:
    """The sequence (OSC 52) that asks the terminal to put `text` on its clipboard, as Textual's copy does:
    it reaches the clipboard of the machine the terminal runs on, over SSH too, where the terminal allows it."""
    import base64

    return f"\033]52;c;{base64.b64encode(text.encode('utf-8', errors='surrogateescape')).decode('ascii')}\a"


def edit_in_editor(text: str) -> str:
    """`text` as the user leaves it in $VISUAL or $EDITOR (else vi), the hand-off of a shell's ctrl+x ctrl+e:
    written to a new file only the user may read (mkstemp: 0600, never an existing name), the editor run on it
    in this terminal, the file read back (the trailing newlines an editor adds dropped) and removed. UserError
    when no editor runs, or it exits with an error status (vim's :cq): the text is then left as it was."""
    import shlex
    import subprocess
    import tempfile

    command = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    fd, path = tempfile.mkstemp(prefix="dflash-message-", suffix=".txt")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
        try:
            status = subprocess.run([*shlex.split(command), path]).returncode
        except (OSError, ValueError) as exc:  # not installed; unbalanced quotes in the variable
            reason = (exc.strerror if isinstance(exc, OSError) else None) or exc
            raise UserError(printable(f"Cannot run the editor {command!r} ({reason}); "
                                      "set $EDITOR to one that is installed.")) from None
        if status:
            raise UserError(f"The editor exited with status {status}; the message is as it was.")
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().rstrip("\n")
    finally:
        os.unlink(path)
