"""`dflash chat --plain`: a prompt-toolkit REPL for SSH sessions and small terminals.

Same engines, same conversation controller, same sessions as the TUI, and its commands (the sampling
settings, sessions, export, copy). Interactive: a history file in the data dir, enter sends, ctrl+j (or escape enter)
adds a line, ctrl+t toggles thinking, ctrl+x ctrl+e edits the line in $EDITOR, ctrl+c stops an answer,
clears a line, and twice at an empty prompt quits; keys typed while an answer streams reach the next prompt
as typed. With stdin not a terminal it reads one prompt per line and prints each answer (scriptable).
Streaming text is coloured by origin unless NO_COLOR is set or stdout is not a terminal.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional, TextIO

from dflash_tui.core import sessions
from dflash_tui.core.conversation import (
    ActiveTurn,
    ChatFlags,
    Conversation,
    draft_arch,
    open_conversation,
    resume,
    running_draft,
    running_draft_kind,
    split_thinking,
)
from dflash_tui.core.figures import UNKNOWN, draft_text, fixed, known
from dflash_tui.core.knobs import KNOB, parse_setting
from dflash_tui.core.sessions import Session  # (the class: `sessions` is also a method's name here)
from dflash_tui.core.settings import loading_line, profile_for
from dflash_tui.core.structured import schema_constraint
from dflash_tui.core.terminal import clipboard, color_enabled, counted, edit_in_editor, is_terminal, printable, typing_hidden
from dflash_tui.engines import files, load_engine
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.process import quiet_loaders

ANSI = {"draft": "\033[1;32m", "target": "\033[36m", "ghost": "\033[2;9;31m", "dim": "\033[2m", "reset": "\033[0m",
        "think": "\033[2;3m", "warn": "\033[33m"}
HELP = """commands:
  /thinking [on|off]  thinking for the next turns (also ctrl+t; gpt-oss: /thinking [low|medium|high], its effort)
  /block N            block size (1 = plain decoding)
  /temperature T      sampling from the next turn, checked as the palette checks it; also /top_p, /top_k,
                      /min_p, /max_new_tokens, /seed (default: the model's; alone: the value in use)
  /json FILE          answers from the next turn on are JSON matching the schema in FILE (after the reasoning
                      when thinking is on); /json off frees them; /json alone: the schema in use
  /ghosts             show rejected draft tokens
  /stats              the last turn's figures (speedup: measured against a timed block-1 step, – until then)
  /continue           go on with the last answer where it was stopped (a stopped answer is not sent as history)
  /copy               copy the last answer, its thinking left out (through the terminal: OSC 52)
  /system TEXT        set the system prompt (/system alone clears it)
  /rename TEXT        give this session a title (/rename alone clears it: the first prompt shows)
  /sessions [ID]      saved sessions, last used first (● this one); with an id, or its start, resume that one
  /export [md|json] [FILE]
                      write this session (mode 0600); no FILE: the exports folder, as the sessions picker does
  /new                start a new session
  /quit               leave (also ctrl+d, or ctrl+c twice)
keys: ctrl+t thinking · ctrl+j new line · ctrl+x ctrl+e the line in $EDITOR · ctrl+c clears the line"""
SHOWN_TURNS = 3  # of a resumed session, shown before its prompt
SETTINGS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens", "seed")  # /block has its own; a draft reloads


class Repl:
    def __init__(self, conversation: Conversation, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                 colour: Optional[bool] = None, flags: Optional[ChatFlags] = None):
        self.conv = conversation
        self.flags = flags or ChatFlags()  # the command line's: they win over what a resumed session recorded
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
        block = s.block_size if self.conv.engine.reports_steps else UNKNOWN  # a foreign server runs its own
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
                for warning in self.conv.set_block(int(arg)):
                    self.info(warning)
                self.info(f"block size {self.conv.settings.block_size}")
            except ValueError:
                self.info("usage: /block N (1 = plain decoding)")
            except UserError as exc:
                self.info(str(exc))
        elif name in SETTINGS:
            self.set_value(name, arg)
        elif name == "json":
            self.json_schema(arg)
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
        elif name == "copy":
            self.copy()
        elif name == "sessions":
            self.sessions(arg)
        elif name == "export":
            self.export(arg)
        elif name == "new":
            self.conv.new_session()
            self.info("new session")
        elif name in ("help", "?"):
            self.info(HELP)
        else:
            self.info(f"unknown command /{name}; /help lists them")

    def json_schema(self, arg: str) -> None:
        """/json FILE constrains the next turns' answers to a JSON schema (structured outputs, engines/guided.py;
        recorded with each turn, so a replay constrains the same way); /json off frees them."""
        if not arg:
            c = self.conv.settings.constraint
            self.info(f"answers follow the schema from {c.field}" if c else "answers are free text (/json FILE constrains them)")
            return
        if arg.lower() == "off":
            self.conv.settings.constraint = None
            self.info("answers are free text from the next turn")
            return
        try:
            constraint = schema_constraint(arg, f"/json {arg}")
        except UserError as exc:
            self.info(str(exc))
            return
        self.conv.settings.constraint = constraint
        self.info(f"answers are JSON matching {arg} from the next turn")

    def set_value(self, name: str, arg: str) -> None:
        """/temperature 0.7, /top_k 20, …: read and checked as the palette reads a typed setting (core/knobs.py);
        alone, the value in use."""
        if not arg:
            self.info(f"{self.conv.settings.setting(KNOB[name])} now; /{KNOB[name].example} sets it")
            return
        try:
            setting = parse_setting(f"{name} {arg}")
        except UserError as exc:
            self.info(str(exc))
            return
        assert setting is not None  # the name is a knob's and a value follows it
        for warning in self.conv.apply_setting(setting):
            self.info(warning)
        self.info(f"From the next turn: {setting}.")

    def copy(self) -> None:
        """The last answer without its thinking, as the TUI's f3 copies it, to the terminal's clipboard."""
        turn = self.conv.turns[-1] if self.conv.turns else None
        if turn is None:
            self.info("There is no answer to copy yet.")
            return
        if not is_terminal(self.out):
            self.info("/copy asks the terminal for its clipboard; the output here is not a terminal.")
            return
        _, text, _ = split_thinking(turn.answer, bool(turn.thinking), self.conv.format)
        self.out.write(clipboard(text))
        self.out.flush()
        self.info(f"Copied the answer ({len(text)} characters).")

    def sessions(self, arg: str) -> None:
        """No id: the saved sessions as the picker orders them; an id: resume that one, as the picker's enter."""
        if not arg:
            found = sessions.by_last_use(sessions.list_sessions())
            self.info("\n".join(sessions.listing(found, self.conv.session_id)) if found else "No sessions yet.")
            return
        try:
            session = sessions.load_session(arg)
        except UserError as exc:
            self.info(str(exc))
            return
        if session.id == self.conv.session_id:
            self.info(f"Session {session.id} is the one open here.")
            return
        try:  # open in another dflash: one sentence, the chat here stays
            self.resume(session, show=True)
        except UserError as exc:
            self.info(str(exc))

    def resume(self, session: Session, show: bool) -> None:
        """Continue `session` here (the command-line flags still win over what it recorded); `show`: print its
        last turns, as a terminal shows what it continues (not into a script's output). UserError: refused
        (open in another dflash), nothing changed."""
        for warning in session.warnings:
            self.info(warning)
        resume(self.conv, session, self.flags)
        self.info(f"resumed session {session.id} ({counted(len(session.turns), 'turn')})")
        if show:
            self.show_turns()

    def show_turns(self) -> None:
        """The chat's last turns, its thinking dim as it streamed; their origins are not kept in colour."""
        shown = self.conv.turns[-SHOWN_TURNS:]
        if len(self.conv.turns) > len(shown):
            self.info(f"… {counted(len(self.conv.turns) - len(shown), 'earlier turn')} "
                      f"(dflash sessions show {self.conv.session_id})")
        for turn in shown:
            if turn.continues is None:
                self.out.write(f"{self.paint('you>', 'dim')} {printable(turn.user)}\n")
            start, end, _ = self.conv.format.layout(turn.answer, bool(turn.thinking))
            self.out.write(self.paint(turn.answer[:end], "think") + self.paint(turn.answer[end:], "answer")
                           if start < end else self.paint(turn.answer, "answer"))
            self.out.write("\n")
        self.out.flush()

    def export(self, arg: str) -> None:
        """/export [md|json] [FILE]: the session as saved, through the one export writer (mode 0600); without a
        format a FILE ending in .json is JSON."""
        fmt, _, rest = arg.partition(" ")
        if fmt not in sessions.EXPORT_FORMATS:
            fmt, rest = ("json" if arg.endswith(".json") else "md"), arg
        rest = rest.strip()
        session_id = self.conv.session_id
        if self.conv.writer is None or session_id is None:
            self.info("There is no session to export yet: it is saved with the first answer.")
            return
        try:
            path = sessions.export_session(sessions.load_session(session_id), fmt,
                                           Path(rest) if rest else None)
        except UserError as exc:
            self.info(str(exc))
            return
        self.info(printable(f"Exported to {path}"))

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
        """Stream a turn (a new one, or a stopped one continued), then time block 1 while the prompt waits.
        ctrl+c stops the answer, and does nothing while block 1 is timed after it."""
        previous = None
        if threading_main():
            previous = signal.signal(signal.SIGINT, lambda *_: active.cancel())
        try:
            self._stream(active)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _stream(self, active: ActiveTurn) -> None:
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
        from prompt_toolkit.application import get_app, run_in_terminal
        from prompt_toolkit.filters import Condition
        from prompt_toolkit.key_binding import KeyBindings

        history = self.history(sessions.private_dir(sessions.data_dir()) / "repl_history")
        kb = KeyBindings()
        cleared = False  # the last ctrl+c dropped a line (the next one at an empty prompt only warns)

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

        @kb.add("c-c")
        def _(event):  # as a shell: a line is dropped; at an empty prompt the loop warns, then quits
            nonlocal cleared
            cleared = bool(event.current_buffer.text)
            event.app.exit(exception=KeyboardInterrupt())

        @kb.add("c-d", filter=Condition(lambda: bool(get_app().current_buffer.text)))
        def _(event):  # readline's delete-char: the character under the cursor (prompt-toolkit's needs one before it)
            event.current_buffer.delete(event.arg)

        @kb.add("c-x", "c-e")
        async def _(event):
            buffer = event.current_buffer

            def edit() -> Optional[str]:
                try:
                    return edit_in_editor(buffer.text)
                except UserError as exc:
                    self.info(str(exc))
                    return None

            text = await run_in_terminal(edit)
            if text is not None:
                buffer.text = text
                buffer.cursor_position = len(text)

        session: PromptSession[str] = PromptSession(history=history, key_bindings=kb, multiline=False,
                                bottom_toolbar=lambda: f" {self.status()} · ctrl+t thinking · ctrl+j newline · /help ",
                                prompt_continuation="… ")
        kind = running_draft_kind(self.conv.engine)
        self.info(f"dflash · {self.conv.engine_name} on {self.conv.engine.device}{f' · {kind}' if kind else ''} · "
                  "/help for commands · ctrl+d quits")
        saved = len(sessions.session_paths())
        if saved and not self.conv.turns:  # a fresh chat: say how to pick up the last one instead
            self.info(f"{counted(saved, 'saved session')}: dflash chat --plain -c continues the last one")
        warned = False  # a ctrl+c at an empty prompt said that a second one quits
        with typing_hidden(raw=True):  # between prompts (an answer, a command) keys wait as typed for the next
            while not self.quit:
                try:
                    line = session.prompt("you> ")
                except KeyboardInterrupt:
                    if warned and not cleared:
                        break
                    warned = not cleared
                    if warned:
                        self.info("ctrl+c again quits (so do ctrl+d and /quit)")
                    continue
                except EOFError:
                    break
                warned = False
                try:
                    self.handle(line)
                except KeyboardInterrupt:  # ctrl+c between the steps of a command: it stopped there
                    self.info("interrupted")


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
    repl = Repl(conv, out=out, err=err, flags=flags)
    conv.on_notice = repl.info
    for notice in notices:
        repl.info(notice)
    interactive = stdin.isatty() and out.isatty()
    if session is not None:  # a refusal here (open elsewhere) is the command's error: exit 2
        repl.resume(session, show=interactive)
    if interactive:
        repl.run_interactive()
    else:
        repl.run_piped(stdin)
    conv.close()
    if conv.writer is not None:
        repl.info(conv.writer.farewell())
    return 1 if repl.failed else 0
