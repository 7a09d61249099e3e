"""Sessions: one append-only JSONL file per chat, so a turn once answered is never lost.

Line 1 is the header (format version, created, profile snapshot, engine, device, dtype, target and
draft with their revisions, chat template hash); every later line is one turn, completed, cancelled or
failed (its status): the messages sent, the settings, the prompt ids, the emitted ids, the per-step
drafted and accepted counts and the Summary; a turn that continues a stopped one names its index
(`continues`) and holds the whole answer. A turn taken back (regenerated, or its prompt edited and resent)
keeps its line; a later `{"type": "retract", "index": i}` line says the chat dropped it, so readers leave
it out (a dflash that predates retractions skips a line of a type it does not know). A `{"type": "title",
"title": t}` line names the session (the last one counts; "" clears it); older readers skip it the same way.
Before its answer starts, each turn's prompt is written as a `{"type": "prompt", ...}` line (the turn's
fields known then); its turn line settles it, as does `{"type": "unanswered", "index": i}` for a turn that
failed before any token. A prompt line left unsettled (the process was killed mid-answer) reads as an
interrupted turn: stopped, with no answer, continued from its prompt ids.
Each line is written whole, flushed and fsynced; files are mode 0600. A torn last line (the process died
while writing it) is skipped with a warning; a run of NUL bytes separates lines as a newline does (a crash
can turn a newline into zeros). Nothing is rewritten in place: resuming a session appends to the same
file, after cutting only a last record truly cut short (repair_tail). Files are written through
engines/files.py: a session that is not dflash's own file (outside the sessions folder, a link, a hard
link) is only read, and resuming it continues a copy (copy_in).

Location: `platformdirs.user_data_dir("dflash")/sessions`, or `$DFLASH_DATA_DIR/sessions`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Iterable, Optional

from dflash_tui.core import search
from dflash_tui.core.figures import draft_kind, draft_text, fixed, known
from dflash_tui.core.terminal import counted, printable
from dflash_tui.engines import files
from dflash_tui.engines.config import DTYPES, ENGINES, SAMPLING_FIELDS, request_takes
from dflash_tui.engines.errors import UserError, parse_json
from dflash_tui.engines.text import finite_number as _number
from dflash_tui.engines.text import has_control

FORMAT_VERSION = 1
SUFFIX = ".jsonl"
LOCK_SUFFIX = ".lock"
TITLE_MAX = 200  # characters of a session's name: a listing row, not a document


def data_dir() -> Path:
    """The dflash data directory (sessions, REPL history); `DFLASH_DATA_DIR` overrides it."""
    override = os.environ.get("DFLASH_DATA_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("dflash", appauthor=False))


def sessions_dir() -> Path:
    return data_dir() / "sessions"


def private_dir(folder: Path) -> Path:
    """`folder` and any parent created for it, mode 0700 whatever the umask (they hold conversations)."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
    return folder


def new_session_id(now: Optional[float] = None) -> str:
    """Sortable and short: `20261129-194200-3fa9`."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


def now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def template_hash(tokenizer) -> Optional[str]:
    """The hash of the chat template a session's prompts are rendered with, for its header. `tokenizer` is a
    transformers tokenizer (every one has `chat_template`, None when it holds none), or None: a remote engine
    without the target's tokenizer in the local HF cache."""
    template = tokenizer.chat_template if tokenizer is not None else None
    if not template:
        return None
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return "sha256:" + hashlib.sha256(template.encode()).hexdigest()[:16]


def revision_of(path) -> Optional[str]:
    """The hub commit of a checkpoint in the HF cache (`.../snapshots/<sha>`), else None."""
    if path is None:
        return None
    parts = Path(str(path)).parts
    if "snapshots" in parts[:-1]:
        return parts[parts.index("snapshots") + 1]
    return None


# -- writing ---------------------------------------------------------------------------------------


def _pid_in(fd: int) -> str:
    """The pid a lock file holds, as text ("?" when it holds none or cannot be read)."""
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return "?"
    return text if text.isdigit() else "?"


class SessionLock:
    """An advisory `flock` on `<id>.lock` beside the session, holding the owner's pid, for as long as a
    dflash writes the session: a second writer gets one sentence instead of interleaving turns.
    (`flock`, not `lockf`: lockf locks drop when the process closes any descriptor of the file.)"""

    _held: dict[Path, "SessionLock"] = {}  # this process's locks: resuming an open session here reuses it

    def __init__(self, session_path: Path):
        self.path = session_path.with_suffix(LOCK_SUFFIX)
        self.fd: Optional[int] = None

    @classmethod
    def acquire(cls, session_path: Path, session_id: str) -> "SessionLock":
        """The lock, or one sentence when another dflash holds it. A lock file that cannot even be created
        (a full or read-only disk) leaves the session unlocked: its writes fail the same way and are
        reported turn by turn, and the chat keeps answering."""
        path = session_path.with_suffix(LOCK_SUFFIX)
        if path in cls._held:
            return cls._held[path]
        lock = cls(session_path)
        try:
            private_dir(path.parent)
            fd = files.open_lock(path, sessions_dir(), what="Session lock")  # no link followed, never replaced
        except OSError:
            return lock  # nothing can be written there: no session file will exist to guard
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = _pid_in(fd)
            os.close(fd)
            raise UserError(f"Session {session_id} is open in another dflash (pid {owner}); close it there first, "
                            "or start a new session.") from None
        try:  # the pid is for the message another dflash gives; the flock is the lock
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError:  # a full disk (ENOSPC), a quota: the lock holds without its pid text
            pass
        lock.fd = fd
        cls._held[path] = lock
        return lock

    @classmethod
    def held_here(cls, session_path: Path) -> bool:
        """Whether this process writes the session: it is the chat open in this dflash."""
        return session_path.with_suffix(LOCK_SUFFIX) in cls._held

    @classmethod
    def held_elsewhere(cls, session_path: Path) -> Optional[str]:
        """The pid holding a session's lock, if another process (or another window here) holds it."""
        path = session_path.with_suffix(LOCK_SUFFIX)
        if path in cls._held:
            return str(os.getpid())
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | files.NOFOLLOW)  # a FIFO never blocks this
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except OSError:
            return _pid_in(fd)
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        self._held.pop(self.path, None)
        try:
            if files.same_file(self.path, self.fd):  # only our own lock file, never a name put there since
                self.path.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = None


class SessionWriter:
    """Appends turns to one session file. The file is created (header first) with the first turn, so
    a chat that never sends anything leaves no empty session behind.

    Every write is checked. A record (a turn, a retraction) that cannot be written (disk full, an I/O
    error) stays pending and its append returns False with `error` saying why; the next record first cuts
    the file back to its last complete line, then writes the pending ones and itself, in order, so a
    partial line never merges with a record and nothing earlier is touched."""

    def __init__(self, header: dict, session_id: Optional[str] = None, path: Optional[Path] = None,
                 existing: bool = False):
        self.id = session_id or header.get("id") or new_session_id()
        self.header = {"type": "header", "format": FORMAT_VERSION, "id": self.id, "created": now_iso(), **header}
        self.header["id"] = self.id
        self.path = path or sessions_dir() / f"{self.id}{SUFFIX}"
        self._exists = existing
        self.pending: list[dict] = []
        self.error: Optional[str] = None
        self.lock = SessionLock.acquire(self.path, self.id)

    @classmethod
    def resume(cls, session: "Session") -> "SessionWriter":
        """A writer appending to `session`'s own file; a file that is not one (outside the sessions folder, a
        link, a hard link) is refused before anything is locked or written (`copy_in` makes it one)."""
        refuse_unless_own(session.path)
        writer = cls(session.header, session.id, session.path, existing=True)
        writer.header = session.header
        return writer

    @property
    def exists(self) -> bool:
        return self._exists

    def farewell(self) -> str:
        """The line a chat ends with: where the session is, or that nothing of it reached the disk."""
        if self._exists and self.path.exists():
            return f"session {self.id} · {self.path}"
        return (f"session {self.id} was not saved ({self.error or 'nothing was written'}): {self.path} could not be "
                "written, so its turns are only on this screen; check DFLASH_DATA_DIR and the disk.")

    def close(self) -> None:
        """Release the session for other dflash processes."""
        self.lock.release()

    def _append(self, records: Iterable[dict]) -> None:
        data = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records).encode()
        private_dir(self.path.parent)
        if not self._exists:  # a new file: made whole under a fresh name, then linked in (never over a name)
            try:
                files.write_file(self.path, data, mode=0o600, replace=False)
                return
            except FileExistsError:
                raise files.Refused(printable(f"Session file {self.path} exists already; dflash does not write "
                                              "over it.")) from None
        fd = files.open_own(self.path, os.O_RDWR | os.O_APPEND, sessions_dir(), what="Session file")
        try:
            repair_tail(fd)
            written = 0
            while written < len(data):  # os.write may write less than asked (a full disk, a signal)
                n = os.write(fd, data[written:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += n
            os.fsync(fd)
        finally:
            os.close(fd)

    def append_prompt(self, record: dict) -> bool:
        """Record a turn's prompt before it is generated (fsynced), so a process killed mid-answer keeps it:
        the turn record that follows settles it; without one, readers show it as an interrupted turn."""
        return self._write({"type": "prompt", **record})

    def append_unanswered(self, index: int) -> bool:
        """Settle the prompt record `index` whose turn is not kept (it failed before any token)."""
        return self._write({"type": "unanswered", "index": index})

    def append_turn(self, turn: dict) -> bool:
        """Write the turn (and any record a failed write left pending); False if it could not be saved."""
        return self._write({"type": "turn", **turn})

    def append_retraction(self, index: int) -> bool:
        """Record that the chat took back its turn `index` (its last); False if it could not be saved."""
        return self._write({"type": "retract", "index": index})

    def append_title(self, title: str) -> bool:
        """Name the session ("" clears the name); False if it could not be saved (retried with the next record)."""
        return self._write({"type": "title", "title": title})

    def _write(self, record: dict) -> bool:
        self.pending.append(record)
        if self._exists and not os.path.lexists(self.path):  # deleted while in use: start it again, header first
            self._exists = False
        records = self.pending if self._exists else [self.header, *self.pending]
        try:
            self._append(records)
        except OSError as exc:
            self.error = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or type(exc).__name__)
            return False
        except files.Refused as exc:
            self.error = str(exc)
            return False
        self._exists = True
        self.pending = []
        self.error = None
        return True


# -- reading ---------------------------------------------------------------------------------------


@dataclass
class Session:
    id: str
    path: Path
    header: dict
    turns: list[dict] = field(default_factory=list)  # the chat's turns: those retracted are left out
    warnings: list[str] = field(default_factory=list)
    name: str = ""  # the title given by a rename, "" when none

    @property
    def created(self) -> str:
        return self.header.get("created", "")

    @property
    def profile_name(self) -> str:
        profile = self.header.get("profile") or {}
        return profile.get("name", "") if isinstance(profile, dict) else str(profile)

    @property
    def title(self) -> str:
        """The name the user gave it, else the first line of its first prompt."""
        if self.name:
            return self.name
        for turn in self.turns:
            text = (turn.get("user") or "").strip().splitlines()
            if text:
                return text[0]
        return ""

    @cached_property
    def passages(self) -> tuple[search.Passage, ...]:
        """Its prompts and answers turn by turn, then its name: made once for a session read, however many
        searches read it (the picker searches at each key typed)."""
        texts = [(n, text) for n, t in enumerate(self.turns, 1) for text in (t.get("user"), t.get("answer")) if text]
        return search.passages([*texts, (0, self.name)])

    def history(self) -> list[dict]:
        """Every turn as the chat shows it, with its ids (a stopped turn is continued from them)."""
        return [{"user": t.get("user", ""), "answer": t.get("answer", ""), "status": t.get("status", "completed"),
                 "thinking": t.get("settings", {}).get("thinking"), "summary": t.get("summary"),
                 "prompt_ids": t.get("prompt_ids", []), "emitted_ids": t.get("emitted_ids", []),
                 "continues": t.get("continues")}
                for t in self.turns]

    def last_settings(self) -> dict:
        return dict(self.turns[-1].get("settings", {})) if self.turns else dict(self.header.get("settings", {}))


def _ids(value) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)


def _text(value) -> bool:
    return isinstance(value, str)


def _name(value) -> bool:
    """A name dflash wrote (an engine, a device, a path, a profile's name): no control character, so a
    listing or a message that shows it never carries an escape sequence."""
    return isinstance(value, str) and not has_control(value) and "\n" not in value and "\t" not in value


def _optional(check):
    return lambda value: value is None or check(value)


def _int_from(low: int, high: Optional[int] = None):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)




def _non_negative(value) -> bool:
    return _number(value) and value >= 0


def _flag(value) -> bool:
    return isinstance(value, bool)


def _object(value) -> bool:
    return isinstance(value, dict)


def _steps(value) -> bool:
    """A turn's steps: {"drafted": ids, "accepted": count} each (the TUI colours a resumed answer by them)."""
    return isinstance(value, list) and all(
        isinstance(step, dict) and _ids(step.get("drafted", [])) and _int_from(0)(step.get("accepted", 0))
        for step in value)


def _texts(value) -> bool:
    return isinstance(value, list) and all(isinstance(t, str) for t in value)


def _one_of(names: tuple):
    return lambda value: isinstance(value, str) and value in names


STATUSES = ("completed", "cancelled", "error")
LOCAL_ENGINES = ("cuda", "mlx")  # they record every id they emit (a remote server may send text only)
_REQUEST = {name: request_takes(name) for name in (*SAMPLING_FIELDS, "max_new_tokens", "seed", "block_size",
                                                    "reasoning_effort")}


# What readers of a session rely on, field by field (nested objects by their dotted names): a file that
# breaks one of these is reported with its file, line and field instead of failing somewhere later. A
# field a record lacks is left to its reader's default; one this dflash does not know is ignored.
SETTINGS_FIELDS = {
    **_REQUEST, "thinking": _optional(_flag), "system_prompt": _text,
    "engine": _optional(_one_of(ENGINES)), "device": _optional(_name), "dtype": _optional(_name),
    "draft": _optional(_name), "draft_arch": _optional(_name),  # which draft ran the turn (the palette switches)
    "constraint": _optional(_object),  # the turn's structured-output constraint (engines/guided.py Constraint.to_dict)
}
PROFILE_FIELDS = {
    "name": _name, "description": _optional(_text), "path": _optional(_name), "target": _optional(_name),
    "draft": _optional(_name), "engine": _optional(_one_of(ENGINES)), "dtype": _optional(_one_of(DTYPES)),
    "block_size": _optional(_int_from(1, 64)), "draft_window": _optional(_int_from(1)),
    "target_layer_ids": _optional(_ids), "max_new_tokens": _optional(_int_from(1)), "thinking": _optional(_flag),
    "needs_thinking": _optional(_flag),
    "system_prompt": _optional(_text), "draft_thinking": _optional(_flag), "url": _optional(_text),
    "model": _optional(_text), "bench_prompts": _optional(_text), "examples": _optional(_texts),
    "drafts": _optional(lambda v: isinstance(v, list) and all(_name(t) for t in v)),
    **{name: _REQUEST[name] for name in SAMPLING_FIELDS},
}
SUMMARY_FIELDS = {
    "prompt_tokens": _int_from(0), "generated_tokens": _int_from(0), "token_ids": _ids, "text": _text,
    "ttft_s": _non_negative, "decode_s": _non_negative, "decode_tokens_per_s": _non_negative,
    "acceptance_lengths": _optional(_ids), "mean_acceptance_length": _optional(_non_negative),
    "histogram": _optional(_ids), "draft_s": _optional(_non_negative), "verify_s": _optional(_non_negative),
    "peak_memory_bytes": _optional(_int_from(0)), "peak_memory_kind": _optional(_text),
    "block_size": _optional(_int_from(1)), "engine": _optional(_text), "device": _optional(_text),
    "dtype": _optional(_text), "finish_reason": _optional(_text),
    "graphs": _optional(_flag), "reused_prompt_tokens": _optional(_int_from(0)),
    "prefilled_prompt_tokens": _optional(_int_from(0)), "limit": _optional(_text), "contract": _int_from(0),
}
HEADER_FIELDS = {
    "format": _int_from(1),
    "id": _name, "created": _name, "profile": _optional(_object),
    "engine": _optional(_one_of(ENGINES)), "device": _optional(_name), "dtype": _optional(_name),
    "target": _optional(_name), "draft": _optional(_name), "target_path": _optional(_name),
    "draft_path": _optional(_name), "settings": _optional(_object), "target_revision": _optional(_name),
    "draft_revision": _optional(_name), "chat_template_hash": _optional(_name),
    "draft_arch": _optional(_name),  # 'dflash' (DFlash 1) or 'dflash2'; sessions before it have none
    "profile.": PROFILE_FIELDS, "settings.": SETTINGS_FIELDS,
}
TURN_FIELDS = {
    "user": _text, "answer": _text, "status": _one_of(STATUSES),
    "index": _int_from(0),
    "settings": _object, "summary": _optional(_object),
    "prompt_ids": _ids, "emitted_ids": _ids, "steps": _steps,
    "messages": lambda v: isinstance(v, list), "dropped_turns": _int_from(0),
    "continues": _int_from(0), "time": _optional(_text), "finish_reason": _optional(_text),
    "settings.": SETTINGS_FIELDS, "summary.": SUMMARY_FIELDS,
}
RETRACT_FIELDS = {"index": TURN_FIELDS["index"]}
TITLE_FIELDS = {"title": lambda v: _name(v) and len(v) <= TITLE_MAX}


def _checked(record: dict, fields: dict, path: Path, line: int, prefix: str = "") -> dict:
    for key, ok in fields.items():
        if key.endswith("."):  # the fields of a nested object, when it is one
            inner = record.get(key[:-1])
            if isinstance(inner, dict):
                _checked(inner, ok, path, line, prefix + key)
        elif key in record and not ok(record[key]):
            raise _damaged(path, line, prefix + key, record[key])
    return record


def _damaged(path: Path, line: int, name: str, value) -> UserError:
    return UserError(printable(f"Session file {path}, line {line}: {name} is {json.dumps(value)[:40]}, which dflash "
                               "did not write; the file was edited or damaged (move it out of the sessions folder)."))


def _turn(record: dict, header: Optional[dict], path: Path, line: int) -> dict:
    """A turn's fields, and what holds between them: a completed turn a local engine answered records the
    ids it emitted (at least its stop token) with its prompt ids; replay compares against them."""
    _checked(record, TURN_FIELDS, path, line)
    engine = (record.get("settings") or {}).get("engine") or (header or {}).get("engine")
    if record.get("status", "completed") == "completed" and engine in LOCAL_ENGINES and record.get("prompt_ids") \
            and not record.get("emitted_ids"):
        raise _damaged(path, line, "emitted_ids", record.get("emitted_ids"))
    return record


def _record(line: bytes) -> Optional[dict]:
    """A line's record, or None when it is not a JSON object (a torn or damaged line, or one nested deeper
    than any record dflash writes)."""
    try:
        record = parse_json(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_regular(path: Path) -> bytes:
    """A regular file's bytes; a FIFO or a device in its place is refused, never waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _torn(piece: bytes) -> bool:
    """Whether a last line is a record cut short: it does not parse as JSON. Whole JSON (even a value dflash
    would not read, or one nested too deep to parse here) is not torn and is never cut."""
    try:
        json.loads(piece)
    except RecursionError:
        return False
    except (UnicodeDecodeError, json.JSONDecodeError):
        return True
    except ValueError:  # an integer past Python's digit limit: whole JSON all the same
        return False
    return False


def _line_start(fd: int, size: int) -> int:
    """Where the file's last line begins (after its last newline; 0 when it has none)."""
    keep, chunk = size, 65536
    while keep > 0:
        start = max(0, keep - chunk)
        cut = os.pread(fd, keep - start, start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        keep = start
    return 0


def repair_tail(fd: int) -> None:
    """Make a session file (open O_APPEND) end at a line break before appending, dropping nothing but a
    record truly cut short. A run of NUL bytes separates records as a newline does (a crash can leave a
    newline, and what followed it, as zeros; a record never holds a raw NUL). The last piece is:
    - whole JSON (its newline missing, or turned to NULs): kept, the NULs after it cut, its newline added;
    - a record cut short (the process died while writing it): cut back to where it began, once; what is
      before it is then kept whole, as above."""
    dropped = False
    while True:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        start = _line_start(fd, size)
        body = os.pread(fd, size - start, start).rstrip(b"\0")
        if not body:  # only NULs after the last newline
            os.ftruncate(fd, start)
            return
        begins = body.rfind(b"\0") + 1
        if dropped or not _torn(body[begins:]):
            os.ftruncate(fd, start + len(body))
            os.write(fd, b"\n")  # O_APPEND: lands at the (new) end
            return
        os.ftruncate(fd, start + len(body[:begins].rstrip(b"\0")))
        dropped = True


def _pieces(raw: bytes) -> list[tuple[int, bytes, bool]]:
    """(line number, text, is the file's last piece) of every non-blank piece: lines split at newlines and
    at runs of NUL bytes."""
    found = []
    for number, line in enumerate(raw.split(b"\n"), 1):
        for piece in line.split(b"\0"):
            if piece.strip():
                found.append((number, piece))
    return [(number, piece, n == len(found) - 1) for n, (number, piece) in enumerate(found)]


def _interrupted(prompt: dict) -> dict:
    """The turn a prompt record stands for when no turn record settled it: the process stopped mid-answer
    (killed, a power cut). It shows as stopped, with the answer it had so far (a continuation's earlier
    part), and can be continued from its prompt ids."""
    turn = {"type": "turn", "status": "cancelled", "answer": "", "settings": {}, "prompt_ids": [], "steps": [],
            **{k: v for k, v in prompt.items() if k != "type"}}
    turn.update(emitted_ids=[], summary=None, finish_reason="interrupted", interrupted=True)
    return turn


def read_session(path: Path) -> Session:
    path = Path(path)
    try:
        raw = read_regular(path)
    except OSError as exc:
        raise UserError(printable(f"Session file {path} cannot be read ({exc.strerror}).")) from None
    torn_tail = not raw.endswith(b"\n")
    header: Optional[dict] = None
    turns: list[dict] = []
    name = ""
    warnings: list[str] = []
    pending: Optional[dict] = None  # a prompt record no turn record has settled yet

    def settle() -> None:
        nonlocal pending
        if pending is not None:
            turns.append(_interrupted(pending))
            pending = None

    for number, line, last in _pieces(raw):
        record = _record(line)
        if record is None:
            if last and torn_tail:
                warnings.append(f"{path.name}: the last line is incomplete (the process stopped while writing it); skipped.")
            else:
                warnings.append(f"{path.name}: line {number} is not valid JSON; skipped.")
            continue
        kind = record.get("type")
        if kind == "header" and header is None:
            header = _checked(record, HEADER_FIELDS, path, number)
        elif kind == "prompt":
            settle()
            pending = _checked({"user": None, **record}, TURN_FIELDS, path, number)
        elif kind == "turn":
            pending = None
            turns.append(_turn(record, header, path, number))
        elif kind == "unanswered":
            if pending is not None and pending.get("index") == record.get("index"):
                pending = None
        elif kind == "retract":
            settle()
            if _checked(record, RETRACT_FIELDS, path, number).get("index") == len(turns) - 1:
                turns.pop()
            else:  # dflash only ever takes back the last turn
                warnings.append(f"{path.name}: line {number} takes back a turn that is not the last one; ignored.")
        elif kind == "title":  # a title line without its title is as damaged as a wrong one
            name = _checked({"title": None, **record}, TITLE_FIELDS, path, number)["title"]
    settle()
    if header is None:
        raise UserError(printable(f"Session file {path} has no header line; it is not a dflash session."))
    if header.get("format", 1) > FORMAT_VERSION:
        warnings.append(f"{path.name} was written by a newer dflash (format {header['format']}); some fields may be ignored.")
    return Session(id=header.get("id") or path.stem, path=path, header=header, turns=turns, warnings=warnings,
                   name=name)


def session_paths() -> list[Path]:
    folder = sessions_dir()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"*{SUFFIX}") if p.is_file())  # regular files: a FIFO would block


def list_sessions(skipped: Optional[list[UserError]] = None) -> list[Session]:
    """Every readable session, newest first. A damaged file is left out (its error collected in
    `skipped` when given), so one bad file never hides the others."""
    out = []
    for path in session_paths():
        try:
            out.append(read_session(path))
        except UserError as exc:
            if skipped is not None:
                skipped.append(exc)
    out.sort(key=lambda s: (s.created, s.id), reverse=True)
    return out


def listing(found: list[Session], open_id: Optional[str] = None) -> list[str]:
    """The table `sessions list` prints, as the REPL's /sessions does too: a header row, then a row per session
    (the one open here marked ●), escaped for the terminal."""
    rows = [f"{'id':<22} {'created':<17} {'profile':<14} {'turns':>5}  title"]
    for s in found:
        ident = f"{s.id} ●" if s.id == open_id else s.id
        rows.append(printable(f"{ident:<22} {s.created[:16].replace('T', ' '):<17} {(s.profile_name or '?')[:14]:<14} "
                              f"{len(s.turns):>5}  {s.title[:50]}"))
    return rows


def by_last_use(found: list[Session]) -> list[Session]:
    """Sessions by their last turn written (the file's modification time), the last used first."""
    def used(session: Session) -> float:
        try:
            return session.path.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=lambda s: (used(s), s.created), reverse=True)



def resolve(session_id: str) -> Path:
    """The file of a session id, of a unique prefix or suffix of one (at least MIN_PREFIX characters), or
    of a path to a session file; an unknown or ambiguous id is one sentence (an ambiguous one lists its
    candidates)."""
    given = Path(session_id).expanduser()
    try:
        if session_id.endswith(SUFFIX) and given.is_file():
            return given
    except OSError:  # a name the file system cannot hold
        pass
    paths = session_paths()
    exact = [p for p in paths if p.stem == session_id]
    if exact:
        return exact[0]
    if session_id and len(session_id) < MIN_PREFIX:
        raise UserError(f"Session id {session_id!r} is too short; give at least {MIN_PREFIX} characters of its start "
                        "or its end (`dflash sessions list`).")
    matches = [p for p in paths if p.stem.startswith(session_id) or p.stem.endswith(session_id)] if session_id else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        names = ", ".join(printable(p.stem) for p in matches[:8]) + (f" and {len(matches) - 8} more"
                                                                        if len(matches) > 8 else "")
        raise UserError(printable(f"Session id {session_id!r} matches {len(matches)} sessions ({names}); give more "
                                  "of the id."))
    raise UserError(printable(f"No session {session_id!r} in {sessions_dir()}; `dflash sessions list` shows the ids."))


def own_problem(path: Path) -> Optional[str]:
    """Why `path` is not a session file dflash may write (None when it is): it must be a regular file with
    one link, directly in the sessions folder (the folder itself may be reached through links)."""
    path = Path(path).expanduser()
    try:
        st = os.lstat(path)
    except OSError as exc:
        return exc.strerror or "it cannot be read"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_nlink != 1:
        return f"it has {st.st_nlink} hard links"
    if os.path.realpath(path.parent) != os.path.realpath(sessions_dir()):
        return f"it is not in the sessions folder {sessions_dir()}"
    return None


def refuse_unless_own(path: Path) -> None:
    """One sentence unless `path` is a session file dflash may write (own_problem)."""
    problem = own_problem(path)
    if problem:
        raise files.Refused(printable(f"Session file {path} is not one of dflash's own ({problem}); dflash never "
                                      "changes it (`dflash chat --resume` continues a copy of it)."))


def copy_in(session: Session) -> Session:
    """A copy of a session that is not dflash's own file (outside the sessions folder, a link, a hard link)
    as a new file in the sessions folder, under the session's id when that is free, else a new one. The
    original is only read."""
    folder = private_dir(sessions_dir())
    wanted = session.id
    if not (wanted and all(c.isalnum() or c in "-_." for c in wanted) and not wanted.startswith(".")
            and len(wanted) <= 100):
        wanted = new_session_id()
    header = {**session.header, "id": wanted}
    for _ in range(20):
        path = folder / f"{header['id']}{SUFFIX}"
        records = [header, *({**t, "type": "turn"} for t in session.turns)]
        if session.name:
            records.append({"type": "title", "title": session.name})
        data = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records).encode()
        try:
            files.write_file(path, data, mode=0o600, replace=False)
        except FileExistsError:
            header["id"] = new_session_id()
            continue
        except OSError as exc:
            raise UserError(printable(f"Session {session.id} cannot be copied into {folder} ({exc.strerror}); "
                                      "free space there or make it writable.")) from None
        return read_session(path)
    raise UserError(printable(f"Session {session.id} cannot be copied into {folder}: no free name."))


def open_to_resume(session: Session) -> tuple[Session, Optional[str]]:
    """The session to continue, its lock taken before anything else, then read again under it; and a note
    when it is a copy (a file that is not dflash's own is copied in, never written). A session open in
    another dflash is one sentence."""
    note = None
    if own_problem(session.path):
        original = session.path
        session = copy_in(session)
        note = f"{original} is not one of dflash's own session files; continuing a copy: session {session.id}."
    lock = SessionLock.acquire(session.path, session.id)
    try:
        return read_session(session.path), note
    except UserError:
        lock.release()
        raise


def load_session(session_id: str) -> Session:
    return read_session(resolve(session_id))


MIN_PREFIX = 4  # shorter prefixes pick a session by accident (`delete 2` matched the only one)


def companion_files(session_path: Path) -> list[Path]:
    """Files that belong to a session: its replay comparisons, which hold the conversation's text too.
    Names are compared literally: a session name holding `*` or `[` is no pattern for other files."""
    session_path = Path(session_path)
    prefix = f"{session_path.with_suffix('').name}.replay-"
    if not session_path.parent.is_dir():
        return []
    return sorted(p for p in session_path.parent.iterdir()
                  if p.name.startswith(prefix) and p.name.endswith(".json") and not p.is_dir())


def resolve_own(session_id: str) -> Session:
    """The session `session_id` names, only if its file lies in the sessions folder and its header
    parses: what `delete` may remove. A path elsewhere, a short prefix, or a foreign file is refused."""
    folder = sessions_dir().resolve()
    given = Path(session_id).expanduser()
    if session_id.endswith(SUFFIX) or os.sep in session_id:
        if given.resolve().parent != folder:
            raise UserError(f"{session_id!r} is not in the sessions folder {folder}; dflash only deletes its own sessions.")
        path = given
    else:
        if len(session_id) < MIN_PREFIX and session_id not in {p.stem for p in session_paths()}:
            raise UserError(f"Session id {session_id!r} is too short to delete by; give at least {MIN_PREFIX} characters "
                            "of the id (`dflash sessions list`).")
        path = resolve(session_id)
    return read_session(path)  # a file whose header does not parse is not a session: refused here


def refuse_if_open(session: Session, doing: str = "deleting") -> None:
    """One sentence if a dflash (this one included) has the session open: it is not ours to remove or to
    resume. Deleting the chat open here would leave its turns on screen and the next one in a file of its own."""
    if SessionLock.held_here(session.path):
        raise UserError(f"Session {session.id} is the chat open here; start a new session or resume another "
                        f"before {doing} it.")
    owner = SessionLock.held_elsewhere(session.path)
    if owner is not None:
        raise UserError(f"Session {session.id} is open in a dflash (pid {owner}); close it there before {doing} it.")


def title_from(text: str) -> str:
    """What the user typed as a session's name, made one printable line; one sentence when too long."""
    title = " ".join(printable(text).split())
    if len(title) > TITLE_MAX:
        raise UserError(f"A session title holds at most {TITLE_MAX} characters; this one has {len(title)}.")
    return title


def rename_session(session: Session, text: str) -> str:
    """Name a session that no dflash has open ("" clears the name); returns the title recorded. The title
    line is appended under the session's lock, like a turn; a session open anywhere (here too: the chat
    renames through `rename_open`) is refused in one sentence."""
    title = title_from(text)
    refuse_unless_own(session.path)  # a file elsewhere, or a link, is only ever read
    refuse_if_open(session, "renaming")
    writer = SessionWriter.resume(session)
    try:
        if not writer.append_title(title):
            raise UserError(printable(f"Session {session.id} cannot be renamed ({writer.error})."))
    finally:
        writer.close()
    return title


def _open_session(writer: Optional[SessionWriter]) -> SessionWriter:
    """The open chat's writer; a chat with nothing saved yet has no session to name."""
    if writer is None:
        raise UserError("There is no session to rename yet: it is saved with the first answer.")
    return writer


def open_title(writer: Optional[SessionWriter]) -> str:
    """The title of the chat open here, to edit."""
    return read_session(_open_session(writer).path).title


def rename_open(writer: Optional[SessionWriter], text: str) -> str:
    """Name the chat open here through its own writer, so the title line stays in order with its turns;
    returns the title."""
    title, chat = title_from(text), _open_session(writer)
    if not chat.append_title(title):
        raise UserError(f"The title is not saved yet ({chat.error}); it is retried with the next turn.")
    return title


def renamed(title: str) -> str:
    """What a rename says once done."""
    return f"Session renamed {title!r}." if title else "Session title cleared: it shows its first prompt again."


def deletion_text(session: Session) -> str:
    """What deleting `session` removes, as a confirmation names it."""
    extra = len(companion_files(session.path))
    what = f"session {session.id} ({counted(len(session.turns), 'turn')}, \"{session.title[:40]}\")"
    return what + (f" and {extra} replay file{'s' if extra != 1 else ''}" if extra else "")


def delete_session(session: Session) -> list[Path]:
    """Remove a session file and its companions; returns what was removed (symlinks are not followed).
    A session open in a dflash (its lock held) is refused, and a file that cannot be removed (a read-only
    folder) is one sentence; the replay files go first and the session last, so a failure keeps the session."""
    refuse_if_open(session)
    removed = []
    for path in [*companion_files(session.path), session.path]:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise UserError(printable(f"{path} cannot be deleted ({exc.strerror}); the session {session.id} is "
                                      "kept.")) from None
        removed.append(path)
    return removed


# -- export ----------------------------------------------------------------------------------------

EXPORT_FORMATS = ("md", "json")


def exports_dir() -> Path:
    """Where an export goes unless the user names a file: the data folder's `exports`."""
    return data_dir() / "exports"


def default_export(session_id: str, fmt: str) -> Path:
    """The file an export of `session_id` goes to unless the user names one."""
    return exports_dir() / f"{session_id}.{fmt}"


def _private_exports() -> None:
    """The exports folder made, mode 0700; one an earlier dflash made with the umask's mode (0755) is
    tightened, as it holds conversations."""
    folder = exports_dir()
    try:
        private_dir(folder)
        st = os.lstat(folder)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(folder, 0o700)
    except OSError as exc:
        raise UserError(printable(f"Cannot make the exports folder {folder} ({exc.strerror}); name a file in a "
                                  "folder you can write.")) from None


def export_text(session: Session, fmt: str) -> str:
    """What an export file holds: the session as Markdown, or as JSON (text kept as it is, not escaped)."""
    text = to_markdown(session) if fmt == "md" else json.dumps(to_json(session), indent=2, ensure_ascii=False)
    return text + "\n"


def export_session(session: Session, fmt: str, output: Optional[Path] = None) -> Path:
    """Write `session` as `fmt` to `output` (default: `default_export`) through `write_export`; the path
    written. A refusal (a folder that is missing, a session file, a FIFO nothing reads) is a UserError."""
    path = default_export(session.id, fmt) if output is None else Path(output).expanduser()
    if path.parent == exports_dir():
        _private_exports()
    write_export(path, export_text(session, fmt))
    return path


def write_export(output: Path, text: str) -> None:
    """Write an export for the user (mode 0600: it holds the conversation), never over a session file
    (one in, or linked from, the sessions folder). A regular file is written fresh and renamed into place
    (engines/files.py), so a file the name pointed at is never written; /dev/stdout or a FIFO a reader holds
    open is written as it is, and a FIFO that nothing reads is refused at once instead of waited on."""
    files.write_output(Path(output), text.encode("utf-8"), option="Export", stream_ok=True,
                       protected=[sessions_dir()], mode=0o600)


def to_json(session: Session) -> dict:
    return {"id": session.id, "title": session.title, "header": session.header, "turns": session.turns,
            "warnings": session.warnings}


def header_draft(header: dict) -> str:
    """The session's first draft as `sessions show` names it: its hub id or path with its kind ('.../draft2
    (DFlash 2)'), 'none' for a target alone, the name alone for a session recorded before the kind was ('?' for
    a header that names no draft at all)."""
    if "draft" not in header and "draft_path" not in header:
        return "?"
    draft = header.get("draft") or header.get("draft_path")
    if not draft:
        return "none (the target alone)"
    kind = draft_kind(header.get("draft_arch"))
    return f"{draft} ({kind})" if kind else draft


def to_markdown(session: Session) -> str:
    header = session.header
    profile = session.profile_name or "?"
    lines = [f"# dflash session {session.id}", ""]
    if session.name:
        lines.append(f"- title: {session.name}")
    lines.append(f"- created: {session.created}")
    lines.append(f"- profile: {profile}")
    lines.append(f"- engine: {header.get('engine', '?')} on {header.get('device', '?')} · {header.get('dtype', '?')}")
    lines.append(f"- target: {header.get('target', '?')}")
    lines.append(f"- draft: {header_draft(header)}")
    lines.append("")
    for number, turn in enumerate(session.turns, 1):
        settings = turn.get("settings", {})
        summary = turn.get("summary") or {}
        lines.append(f"## Turn {number}")
        lines.append("")
        lines.append("**You**")
        lines.append("")
        lines.append(turn.get("user", ""))
        lines.append("")
        mark = {"cancelled": " (cancelled)", "error": " (failed)"}.get(turn.get("status") or "", "")
        mark += f" (continues turn {turn['continues'] + 1})" if "continues" in turn else ""
        lines.append(f"**dflash**{mark}")
        lines.append("")
        lines.append(turn.get("answer", ""))
        lines.append("")
        # the block size the turn ran (its summary's; null: the server did not say), else the one it asked for
        block = summary["block_size"] if "block_size" in summary else settings.get("block_size", "?")
        facts = [f"block {known(block)}", f"thinking {'on' if settings.get('thinking') else 'off'}"]
        if settings.get("draft_arch") or settings.get("draft"):  # recorded since the palette switches drafts
            facts.insert(1, f"draft {draft_text(settings.get('draft'), settings.get('draft_arch'))}")
        if summary:
            facts.append(f"{summary.get('generated_tokens', 0)} tokens")
            facts.append(f"{summary.get('decode_tokens_per_s', 0):.1f} tok/s")
            facts.append(f"tau {fixed(summary.get('mean_acceptance_length'))}")
        lines.append(f"_{' · '.join(facts)}_")
        lines.append("")
    return "\n".join(lines)
