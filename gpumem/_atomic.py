"""Atomic file writes that replace only regular files (snapshots, viewer pages).

    path = write_atomic("memory.pickle", lambda f: pickle.dump(snap, f))

Note [Atomic writes]
Rationale: a snapshot or page is written while the program that makes it
  may die (an OOM, a kill), and readers (memory_viz, gpumem view, a
  watching script) must see the previous complete file or the new complete
  one, never half of one.  Renaming a temporary file over the target does
  that, but rename replaces whatever is there: as root, ``dump_snapshot
  ("/dev/full")`` turned the device node into a regular file, and a FIFO or
  a symlink was silently swapped for a file.
Approach: the target is resolved first.
  - nothing there: the file is created;
  - a regular file: it is replaced atomically (its permission bits kept);
  - a symlink (or a chain of them): it is followed and its final target is
    written as above, atomically; the link itself stays a link.  A dangling
    link creates its target; a link loop is refused;
  - anything else (a directory, a FIFO, a socket, a character or block
    device such as /dev/null or /dev/full): refused with
    NotARegularFileError (an OSError, IsADirectoryError for a directory)
    naming what is there; nothing is written.
  The data goes to ``.<name>.gpumem-<random>.tmp`` in the target's
  directory, held under an exclusive flock from creation to rename, is
  fsync'ed, and renamed over the target.  A writer killed meanwhile leaves
  its temporary unlocked; every later write into that directory removes
  the unlocked gpumem temporaries it owns (same user), so killed dumps do
  not pile up.  A writer checks, once it holds its lock, that its
  temporary is still the file at its name (a cleaner may have taken the
  lock between creation and locking and removed it) and starts again if not.
Limitations: the target is checked before writing and again right before
  the rename; something put there in between (a FIFO made in that instant)
  is still replaced.  Temporaries of other users and of gpumem versions
  before this naming are left alone.  Where flock does not work (some
  network filesystems), stale temporaries are not detected.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from typing import BinaryIO, Callable

__all__ = ["NotARegularFileError", "write_atomic", "kind_of", "TEMP_MARK"]

#: In the name of every temporary file: ".<name>.gpumem-<random>.tmp".
TEMP_MARK = ".gpumem-"
_TEMP_SUFFIX = ".tmp"


class NotARegularFileError(OSError):
    """The path names something gpumem does not replace (not a regular file)."""


def kind_of(mode: int) -> str:
    """What a file of st_mode ``mode`` is, as words: "a FIFO", "a directory", ..."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink loop"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def _check_target(path: str) -> os.stat_result | None:
    """lstat of the resolved target: None if nothing is there, else a regular file's."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        return st
    kind = kind_of(st.st_mode)
    cls = IsADirectoryError if stat.S_ISDIR(st.st_mode) else NotARegularFileError
    raise cls(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EEXIST,
              f"{kind} is there, not a regular file; gpumem replaces only regular files", path)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for a moment)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def remove_stale_temporaries(directory: str) -> int:
    """Remove this user's gpumem temporaries in ``directory`` that no writer
    holds (their writer was killed).  Returns how many were removed."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        if not (name.startswith(".") and TEMP_MARK in name and name.endswith(_TEMP_SUFFIX)):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer holds it
            try:
                if os.stat(entry.path, follow_symlinks=False).st_ino == st.st_ino:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed


def _locked_temporary(directory: str, name: str) -> tuple[int, str]:
    """A new temporary for ``name`` in ``directory``, created and locked."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}{TEMP_MARK}", suffix=_TEMP_SUFFIX,
                                   dir=directory)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(tmp, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd, tmp
        except FileNotFoundError:
            pass
        os.close(fd)  # a cleaner removed it before we held the lock: again


def write_atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], None], *,
                 make_dirs: bool = False) -> str:
    """Write a file at ``path`` with write(f) and rename it into place (Note [Atomic writes]).

    Returns the path written: ``path``, or the final target of a symlink.
    make_dirs: create the target's directory (and parents) if missing.
    Raises NotARegularFileError (IsADirectoryError for a directory) without
    writing anything when ``path`` is not a regular file, and any OSError
    of the writing itself; the temporary is removed on every failure.
    """
    target = os.path.realpath(os.fspath(path))
    existing = _check_target(target)
    directory, name = os.path.split(target)
    if make_dirs:
        os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(directory)
    fd, tmp = _locked_temporary(directory, name)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            mode = stat.S_IMODE(existing.st_mode) if existing else 0o666 & ~_umask()
            os.chmod(tmp, mode)
            _check_target(target)  # once more, right before the rename
            os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    return target


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
