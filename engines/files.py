"""How dflash writes a file: the one place every writer goes through (docs/files.md).

- A file dflash writes is created fresh: a new, unpredictable name in the destination folder, opened
  with O_CREAT | O_EXCL | O_NOFOLLOW (never an existing name, never through a link), written, fsynced,
  then renamed into place (`write_file`). A link or another file that had the destination's name is
  replaced as a name; what it pointed at is never opened, so it stays byte for byte as it was.
- A file dflash rewrites or appends to as its own (a session, the REPL history, train-draft's response
  cache) is opened without following links and must be a regular file with a single link inside the
  folder it belongs to (`open_own`); anything else is refused in one sentence (UserError: exit 2).
- A lock file is never replaced (two processes would lock different files): `open_lock` opens it
  without following links, and it must be a regular file with one link inside its folder.
- An output the user names (`check_output`, before any work): a folder that exists and can be written;
  never a file dflash keeps (`protected`); a FIFO or a device only for a writer that may stream
  (`stream_ok`: exports to /dev/stdout or to a FIFO a reader holds open), refused for every other.

Framework-free, like errors.py: the engines' own writers (train-draft) use it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Optional, Union

from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import printable

Content = Union[bytes, Callable[[BinaryIO], None]]
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class Refused(UserError):
    """A write dflash will not make (a link, a file outside its folders, a device): one sentence, exit 2."""


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "disk full"
    return exc.strerror or type(exc).__name__


def inside(path: Path, folder: Path) -> bool:
    """Whether `path`'s folder is `folder` or lies under it, links in the folders resolved (the last
    component is not resolved: a link there is the caller's to refuse)."""
    parent = os.path.realpath(Path(path).expanduser().parent)
    root = os.path.realpath(Path(folder).expanduser())
    return parent == root or parent.startswith(root.rstrip(os.sep) + os.sep)


def _sync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name[:180]}.{secrets.token_hex(8)}.tmp")


def _fill(fd: int, content: Content, mode: Optional[int]) -> None:
    if mode is not None:
        os.fchmod(fd, mode)  # whatever the umask
    if callable(content):
        with os.fdopen(fd, "wb", closefd=False) as fh:
            content(fh)
            fh.flush()
    else:
        view = memoryview(content)
        while view:  # os.write may write less than asked (a full disk, a signal)
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[n:]
    os.fsync(fd)


def write_file(path: Union[str, Path], content: Content, *, mode: Optional[int] = 0o600, replace: bool = True,
               what: str = "") -> Path:
    """Write `content` (bytes, or a function given the open binary file) to `path`, created fresh: a new
    unpredictable name beside it, opened O_CREAT|O_EXCL|O_NOFOLLOW, synced, then renamed into place. With
    `replace` False an existing name (a file, a link, a dangling link) is refused instead of replaced.
    `mode` None gives the umask's permissions. OSError goes to the caller (each says it in its own words);
    an existing name with `replace` False is FileExistsError."""
    path = Path(path).expanduser()
    tmp = _temporary(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o666 if mode is None else mode)
    try:
        try:
            _fill(fd, content, mode)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path, follow_symlinks=False)  # fails on any existing name, a dangling link included
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_folder(path.parent)
    return path


def _refuse_unless_own(fd: int, path: Path, within: Path, what: str) -> None:
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_nlink != 1:
        problem = f"has {st.st_nlink} hard links (another name shares its contents)"
    elif not inside(path, within):
        problem = f"lies outside {within}"
    if problem:
        os.close(fd)
        raise Refused(printable(f"{what} {path} {problem}; dflash writes only its own files, so it leaves that one "
                                "as it is (move it away, or copy it into the folder)."))


def open_own(path: Union[str, Path], flags: int, within: Union[str, Path], *, what: str = "File") -> int:
    """An existing file dflash rewrites or appends to as its own, opened without following a link: a
    regular file with a single link inside `within`, else Refused. `flags` must not hold O_CREAT (a new
    file is made with write_file). OSError (missing, unreadable) goes to the caller."""
    path = Path(path).expanduser()
    try:
        fd = os.open(path, flags | NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(printable(f"{what} {path} is a symbolic link; dflash never writes through a link, so it "
                                    "leaves it as it is (remove it, or put the file itself there).")) from None
        raise
    _refuse_unless_own(fd, path, Path(within), what)
    os.set_blocking(fd, True)
    return fd


def open_lock(path: Union[str, Path], within: Union[str, Path], *, what: str = "Lock file") -> int:
    """A lock file, opened (created when missing, mode 0600) without following a link and never replaced:
    a regular file with one link inside `within`, else Refused. Never blocks, even on a FIFO."""
    path = Path(path).expanduser()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            what_it_is = "a symbolic link" if exc.errno == errno.ELOOP else "not a regular file"
            raise Refused(printable(f"{what} {path} is {what_it_is}; dflash never locks through it, so it leaves it "
                                    "as it is (remove it and try again).")) from None
        raise
    _refuse_unless_own(fd, path, Path(within), what)
    return fd


def same_file(path: Path, fd: int) -> bool:
    """Whether the name `path` (not followed) still is the file open as `fd`."""
    try:
        named, held = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _kept_by_dflash(path: Path, protected: Iterable[Path]) -> Optional[Path]:
    """The protected folder `path` is in (or whose file it links to, by name or by hard link), if any."""
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(path)
    except OSError:
        st = None
    for folder in protected:
        if not folder.is_dir():
            continue
        root = Path(os.path.realpath(folder))
        if real.parent == root or root in real.parents or inside(path, folder):
            return folder
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            with contextlib.suppress(OSError):
                if any(os.path.samefile(p, path) for p in root.iterdir() if p.is_file()):
                    return folder
    return None


def standard_stream(path: Path) -> bool:
    """Whether `path` names one of the process's own descriptors (/dev/stdout, /dev/fd/1, /proc/self/fd/1):
    written as it is, since renaming a file over such a name would replace the name, not write the stream."""
    text = os.path.normpath(str(path))
    return text in ("/dev/stdout", "/dev/stderr") or text.startswith(("/dev/fd/", "/proc/self/fd/"))


KINDS = {"sessions": "a session file", "profiles": "a profile"}


def kind_of(folder: Path) -> str:
    """What a protected folder holds, for a refusal."""
    return KINDS.get(Path(folder).name, "a file dflash keeps")


def check_output(path: Union[str, Path], *, option: str, stream_ok: bool = False,
                 protected: Iterable[Path] = ()) -> bool:
    """Refuse, before any work, an output that write_output could not take or must not: a folder that is
    missing or not writable, a folder in its place, a file in (or a link to a file of) one of the
    `protected` folders, and a FIFO or a device unless `stream_ok` (then a FIFO needs a reader now).
    Returns whether the output is a stream (a pipe or a device), written as it is."""
    path = Path(path).expanduser()
    if standard_stream(path):  # the user's own stdout or stderr, whatever it is (a terminal, a pipe, a file)
        if not stream_ok:
            raise Refused(printable(f"{option} {path} is a standard stream; this output is written as a file, so "
                                    "name a regular file."))
        return True
    kept = _kept_by_dflash(path, protected)
    if kept is not None:
        raise Refused(printable(f"{option} {path} is {kind_of(kept)} (in, or linked from, the {Path(kept).name} "
                                f"folder {kept}); write the output somewhere else."))
    try:
        st: Optional[os.stat_result] = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise Refused(printable(f"{option} {path} is a folder; name a file in it."))
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not stream_ok:
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or \
                stat.S_ISBLK(st.st_mode) else "not a regular file"
            raise Refused(printable(f"{option} {path} is {kind}; this output is written as a file, so name a "
                                    "regular file."))
        if stat.S_ISFIFO(st.st_mode):
            try:  # a FIFO that nothing reads would block the writer forever (ENXIO here instead)
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as exc:
                why = "a pipe that nothing reads" if exc.errno == errno.ENXIO else _reason(exc)
                raise Refused(printable(f"Cannot write {option} {path} ({why}); start its reader first, or "
                                        "name a file.")) from None
        return True
    folder = path.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        why = "does not exist" if not folder.is_dir() else "is not writable"
        raise Refused(printable(f"Cannot write {option} {path}: the folder {folder} {why}; choose a folder that "
                                "exists and that you can write."))
    return False


def write_output(path: Union[str, Path], data: bytes, *, option: str, stream_ok: bool = False,
                 protected: Iterable[Path] = (), mode: Optional[int] = 0o600) -> None:
    """An output the user named: checked as check_output does, then a regular file is written fresh
    (write_file) and a stream allowed by `stream_ok` (/dev/stdout, a FIFO with a reader) is written as it
    is. Every failure is one sentence."""
    path = Path(path).expanduser()
    stream = check_output(path, option=option, stream_ok=stream_ok, protected=protected)
    try:
        if stream:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            try:
                held = os.fstat(fd).st_mode
                if not (stat.S_ISFIFO(held) or stat.S_ISCHR(held) or standard_stream(path)):
                    raise OSError(errno.EINVAL, "not a pipe or a terminal")  # swapped since the check
                os.set_blocking(fd, True)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        else:
            write_file(path, data, mode=mode)
    except OSError as exc:
        why = "a pipe that nothing reads" if exc.errno == errno.ENXIO else _reason(exc)
        raise Refused(printable(f"Cannot write {option} {path} ({why}); choose a folder that exists and that you "
                                "can write.")) from None
