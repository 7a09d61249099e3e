"""`dflash chat --plain`: a prompt-toolkit REPL for SSH sessions and small terminals.

Same engines, same conversation controller, same sessions as the TUI. Interactive: a history file in
the data dir, enter sends, ctrl+j (or escape enter) adds a line, ctrl+t toggles thinking, ctrl+c stops
an answer. With stdin not a terminal it reads one prompt per line and prints each answer (scriptable).
Streaming text is coloured by origin unless NO_COLOR is set or stdout is not a terminal.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional, TextIO

from dflash_tui.core import sessions
from dflash_tui.core.conversation import (
    ActiveTurn,
    ChatFlags,
    Conversation,
    draft_arch,
    open_conversation,
    reports_steps,
    resume,
    running_draft,
    running_draft_kind,
)
from dflash_tui.core.figures import UNKNOWN, draft_text, fixed, known
from dflash_tui.core.settings import loading_line, profile_for
from dflash_tui.core.terminal import color_enabled, counted, printable, typing_hidden
from dflash_tui.engines import files, load_engine
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.process import quiet_loaders

ANSI = {"draft": "\033[1;32m", "target": "\033[36m", "ghost": "\033[2;9;31m", "dim": "\033[2m", "reset": "\033[0m",
        "think": "\033[2;3m", "warn": "\033[33m"}
HELP = """commands:
  /thinking [on|off]  thinking for the next turns (also ctrl+t; gpt-oss: /thinking [low|medium|high], its effort)
  /block N            block size (1 = plain decoding)
  /ghosts             show rejected draft tokens
  /stats              the last turn's figures (speedup: measured against a timed block-1 step, – until then)
  /continue           go on with the last answer where it was stopped (a stopped answer is not sent as history)
  /system TEXT        set the system prompt (/system alone clears it)
  /rename TEXT        give this session a title (/rename alone clears it: the first prompt shows)
  /new                start a new session
  /quit               leave (also ctrl+d)"""


class Repl:
    def __init__(self, conversation: Conversation, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                 colour: Optional[bool] = None):
        self.conv = conversation
        self.out, self.err = out, err
        self.colour = color_enabled(out) if colour is None else colour
        self.ghosts = False
        self.quit = False
        self.failed = False  # a turn failed (a remote server's error, an engine error): exit 1, as generate does

    # -- output ----------------------------------------------------------------------------------
    def paint(self, text: str, kind: str) -> str:
        text = printable(text)
        if not self.colour or kind not in ANSI or not text:
            return text
        return f"{ANSI[kind]}{text}{ANSI['reset']}"

    def info(self, text: str) -> None:
        self.err.write(self.paint(text, "dim") + "\n")
        self.err.flush()

    def status(self) -> str:
        s = self.conv.settings
        block = s.block_size if reports_steps(self.conv.engine) else UNKNOWN  # a foreign server runs its own
        thinking = f"effort {self.conv.effort}" if self.conv.effort else f"thinking {'ON' if s.thinking else 'OFF'}"
        kind = running_draft_kind(self.conv.engine)  # None: a server that does not say
        return f"block {block}{f' · {kind}' if kind else ''} · {thinking} · ghosts {'on' if self.ghosts else 'off'}"

    # -- commands --------------------------------------------------------------------------------
    def command(self, line: str) -> None:
        name, _, arg = line[1:].partition(" ")
        arg = arg.strip()
        if name in ("quit", "exit", "q"):
            self.quit = True
        elif name == "thinking" and self.conv.efforts:  # gpt-oss: an effort level, not on/off
            if arg and arg.lower() not in self.conv.efforts:
                self.info(f"usage: /thinking [{'|'.join(self.conv.efforts)}] (no argument: the next level)")
                return
            if arg:
                self.conv.settings.reasoning_effort = arg.lower()
            else:
                self.conv.cycle_effort()
            self.info(f"effort {self.conv.effort}")
        elif name == "thinking":
            on = (not self.conv.settings.thinking) if not arg else arg.lower() in ("on", "1", "true", "yes")
            warning = self.conv.set_thinking(on)
            if warning:
                self.info(warning)
            self.info(f"thinking {'ON' if on else 'OFF'}")
        elif name == "block":
            try:
                self.conv.set_block(int(arg))
                self.info(f"block size {self.conv.settings.block_size}")
            except ValueError:
                self.info("usage: /block N (1 = plain decoding)")
            except UserError as exc:
                self.info(str(exc))
        elif name == "ghosts":
            self.ghosts = not self.ghosts
            self.info(f"ghosts {'on' if self.ghosts else 'off'}")
        elif name == "stats":
            self.info(self.stats_text())
        elif name == "system":
            self.conv.settings.system_prompt = arg
            self.info("system prompt set" if arg else "system prompt cleared")
        elif name == "continue":
            try:
                active = self.conv.continue_turn()
            except UserError as exc:
                self.info(str(exc))
                return
            self.run_turn(active)
        elif name == "rename":  # through the chat's own writer: the title line stays in order with the turns
            try:
                self.info(sessions.renamed(sessions.rename_open(self.conv.writer, arg)))
            except UserError as exc:
                self.info(str(exc))
        elif name == "new":
            self.conv.new_session()
            self.info("new session")
        elif name in ("help", "?"):
            self.info(HELP)
        else:
            self.info(f"unknown command /{name}; /help lists them")

    def stats_text(self) -> str:
        turn = self.conv.turns[-1] if self.conv.turns else None
        if not turn or not turn.summary:
            return f"no turns yet · {self.status()}"
        m = turn.summary
        speed, kind = self.conv.summary_speedup(m)  # the TUI's figure: the turn's steps against a block-1 probe
        if m.draft_s is None or m.verify_s is None:
            split = f"draft/verify {UNKNOWN}"
        else:
            total = m.draft_s + m.verify_s
            split = f"draft {m.draft_s / total * 100:.0f}% · verify {m.verify_s / total * 100:.0f}%" if total else ""
        hist = UNKNOWN if m.histogram is None else " ".join(f"{n + 1}:{c}" for n, c in enumerate(m.histogram) if c)
        peak = UNKNOWN if m.peak_memory_bytes is None else f"{m.peak_memory_bytes / 2**20:.0f} MB ({m.peak_memory_kind})"
        lines = [
            f"{m.generated_tokens} tokens · {m.decode_tokens_per_s:.1f} tok/s · "
            + (f"speedup ≈{speed:.1f}x (measured)" if kind == "measured" else f"speedup {speed:.1f}x (block 1)"
               if speed is not None else "speedup – (not yet measured)"),
            f"tau {fixed(m.mean_acceptance_length)} (session {fixed(self.conv.session_tau())}) · acceptance {hist}",
            f"{split} · peak {peak} · context {m.prompt_tokens + m.generated_tokens}",
            f"{m.engine} · {m.device} · {m.dtype} · {self.status()}",
        ]
        draft = running_draft(self.conv.engine)
        if draft and running_draft_kind(self.conv.engine):
            lines.append(f"draft {draft_text(draft, draft_arch(self.conv.engine))}")
        return "\n".join(lines)

    # -- a turn ----------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        try:
            active = self.conv.begin(text)
        except UserError as exc:
            self.info(str(exc))
            return
        self.run_turn(active)

    def run_turn(self, active: ActiveTurn) -> None:
        """Stream a turn (a new one, or a stopped one continued), then time block 1 while the prompt waits."""
        previous = None
        if threading_main():
            previous = signal.signal(signal.SIGINT, lambda *_: active.cancel())
        raw = active.earlier  # a continuation's text so far is on screen already: it only sets the thinking layout
        thinking = active.request.thinking
        try:
            with typing_hidden():  # ctrl+c stops the answer without a ^C echoed into its text
                for event in self.conv.stream(active):
                    for piece, origin in event.pieces:
                        start, end, _ = self.conv.format.layout(raw + piece, thinking)
                        in_think = start < end and len(raw) < end
                        raw += piece
                        self.out.write(self.paint(piece, "think" if in_think and self.colour else origin))
                    if self.ghosts and event.rejected_text:
                        self.out.write(self.paint(event.rejected_text, "ghost") if self.colour
                                       else f"[{printable(event.rejected_text)}]")
                    self.out.flush()
        except UserError as exc:
            self.failed = True
            self.info(str(exc))
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        self.out.write("\n")
        self.out.flush()
        turn = active.turn
        if turn is not None and turn.summary is not None:
            m = turn.summary
            mark = (f" · {m.stopped_by}" if m.stopped_by else "") + (f" · {turn.save_error}" if turn.save_error else "")
            kind = running_draft_kind(self.conv.engine)
            self.info(f"[{m.generated_tokens} tokens · {m.decode_tokens_per_s:.1f} tok/s · "
                      f"tau {fixed(m.mean_acceptance_length)} · block {known(m.block_size)}"
                      f"{f' · {kind}' if kind else ''}{mark}]")
        if turn is not None and turn.can_continue:
            self.info(f"{'cancelled' if turn.cancelled else 'failed'}: not sent as history; /continue picks it up")
        self.conv.measure_block1()

    def handle(self, line: str) -> None:
        if line.startswith("/"):
            self.command(line.strip())
        elif line.strip():
            self.send(line)

    # -- loops -----------------------------------------------------------------------------------
    def run_piped(self, stdin: TextIO) -> None:
        if hasattr(stdin, "reconfigure"):  # an undecodable line becomes one error, not the end of the REPL
            stdin.reconfigure(errors="surrogateescape")
        for line in stdin:
            self.handle(line.rstrip("\n"))
            if self.quit:
                break

    def history(self, path):
        """The ↑ history: prompt_toolkit's file history in dflash's data folder, each prompt appended to that
        file as dflash's own (engines/files.py: no link followed, one link, in the folder) and fsynced before it
        is sent. A file that is not dflash's own is only read, and this run's prompts are kept in memory."""
        import datetime

        from prompt_toolkit.history import FileHistory, InMemoryHistory

        folder = path.parent
        try:
            if not os.path.lexists(path):
                files.write_file(path, b"", mode=0o600, replace=False)
            os.close(files.open_own(path, os.O_WRONLY | os.O_APPEND, folder, what="The history file"))
        except (OSError, UserError) as exc:
            self.info(f"{exc if isinstance(exc, UserError) else f'{path}: {exc.strerror}'} "
                      "(this run's prompts are not saved for ↑)")
            return InMemoryHistory()

        class OwnHistory(FileHistory):
            def store_string(self, string: str) -> None:
                lines = [f"\n# {datetime.datetime.now()}\n", *(f"+{line}\n" for line in string.split("\n"))]
                try:
                    fd = files.open_own(path, os.O_WRONLY | os.O_APPEND, folder, what="The history file")
                    try:
                        os.write(fd, "".join(lines).encode("utf-8", errors="surrogateescape"))
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except (OSError, UserError):
                    pass  # a convenience: the session file has the prompt

        return OwnHistory(str(path))

    def run_interactive(self) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.key_binding import KeyBindings

        history = self.history(sessions.private_dir(sessions.data_dir()) / "repl_history")
        kb = KeyBindings()

        @kb.add("c-t")
        def _(event):
            warning = self.conv.toggle_thinking()
            if warning:
                self.info(warning)
            event.app.invalidate()

        @kb.add("c-j")
        @kb.add("escape", "enter")
        def _(event):
            event.current_buffer.insert_text("\n")

        session: PromptSession[str] = PromptSession(history=history, key_bindings=kb, multiline=False,
                                bottom_toolbar=lambda: f" {self.status()} · ctrl+t thinking · ctrl+j newline · /help ",
                                prompt_continuation="… ")
        kind = running_draft_kind(self.conv.engine)
        self.info(f"dflash · {self.conv.engine_name} on {self.conv.engine.device}{f' · {kind}' if kind else ''} · "
                  "/help for commands · ctrl+d quits")
        saved = len(sessions.session_paths())
        if saved and not self.conv.turns:  # a fresh chat: say how to pick up the last one instead
            self.info(f"{counted(saved, 'saved session')}: dflash chat --plain -c continues the last one")
        while not self.quit:
            try:
                line = session.prompt("you> ")
            except KeyboardInterrupt:
                continue
            except EOFError:
                break
            self.handle(line)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run_repl(profile_ref=None, engine: Optional[str] = None, block_size: Optional[int] = None,
             thinking: Optional[bool] = None, session: Optional[sessions.Session] = None,
             max_new_tokens: Optional[int] = None, stdin: Optional[TextIO] = None, out: Optional[TextIO] = None,
             err: Optional[TextIO] = None, reasoning_effort: Optional[str] = None) -> int:
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr  # the streams of the moment
    quiet_loaders()
    profile = profile_for(profile_ref)
    config = profile.engine_config(engine, block_size=block_size)
    err.write(printable(f"{loading_line(config)}…\n"))
    err.flush()
    loaded = load_engine(config)
    flags = ChatFlags(block_size, thinking, max_new_tokens, reasoning_effort)
    conv, notices = open_conversation(loaded, profile, flags)
    for warning in loaded.warnings:
        err.write(printable(f"note: {warning}\n"))
    repl = Repl(conv, out=out, err=err)
    conv.on_notice = repl.info
    for notice in notices:
        repl.info(notice)
    if session is not None:
        for warning in session.warnings:
            repl.info(warning)
        resume(conv, session, flags)
        repl.info(f"resumed session {session.id} ({counted(len(session.turns), 'turn')})")
    if stdin.isatty() and out.isatty():
        repl.run_interactive()
    else:
        repl.run_piped(stdin)
    conv.close()
    if conv.writer is not None:
        repl.info(conv.writer.farewell())
    return 1 if repl.failed else 0
