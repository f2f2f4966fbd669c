"""Atomic file writes that replace only regular files (snapshots, viewer pages).

    path = write_atomic("memory.pickle", lambda f: pickle.dump(snap, f))

Note [Atomic writes]
Rationale: a snapshot or page is written while the program that makes it
  may die (an OOM, a kill), and readers (memory_viz, gpumem view, a
  watching script) must see the previous complete file or the new complete
  one, never half of one.  Renaming a temporary file over the target does
  that, but rename replaces whatever is there: as root, ``dump_snapshot
  ("/dev/full")`` turned the device node into a regular file, and a FIFO or
  a symlink was silently swapped for a file.  A symlink resolved by hand
  also bypasses the kernel's fs.protected_symlinks: in a sticky,
  world-writable folder (/tmp) a link planted by another user made a root
  dump replace the root-only file it pointed to.
Approach: the target is resolved first, one symlink at a time (resolve):
  - a symlink in a sticky, world-writable folder is followed only when its
    owner is the folder's owner or the writer (the euid), the rule of the
    kernel's fs.protected_symlinks; otherwise UnsafeSymlinkError (a
    PermissionError) names it and nothing is written;
  - nothing there: the file is created;
  - a regular file: it is replaced atomically (its permission bits kept);
  - a symlink (or a chain of them) that may be followed: its final target
    is written as above, atomically; the link itself stays a link.  A
    dangling link creates its target; a link loop is refused;
  - anything else (a directory, a FIFO, a socket, a character or block
    device such as /dev/null or /dev/full): refused with
    NotARegularFileError (an OSError, IsADirectoryError for a directory)
    naming what is there; nothing is written.
  The data goes to an unnamed O_TMPFILE file in the target's directory, so
  a writer killed while writing leaves nothing (the kernel frees it).  When
  it is complete and fsync'ed, it is locked (flock), linked under an
  unpredictable name ``.<name>.gpumem-<random>.tmp`` (through
  /proc/self/fd, exclusively: never over an existing name) and renamed
  over the target.  Where O_TMPFILE or /proc is missing, the temporary is
  made by name from the start (mkstemp: exclusive, random) and locked.  A
  writer killed between the link and the rename (or while writing, in the
  fallback) leaves its temporary unlocked; every later write into that
  directory removes the unlocked gpumem temporaries it owns (same user).
  A writer checks, once it holds its lock, that its temporary is still the
  file at its name (a cleaner may have taken the lock between creation and
  locking and removed it) and starts again if not.
Limitations: the target is checked before writing and again right before
  the rename; something put there in between (a FIFO made in that instant)
  is still replaced.  Temporaries of other users and of gpumem versions
  before this naming are left alone.  Where flock does not work (some
  network filesystems), stale temporaries are not detected.  Links are
  checked by path: a folder swapped for a link between the check and the
  write is not caught (the kernel's own check would be, for an open).
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
import tempfile
from typing import BinaryIO, Callable

__all__ = ["NotARegularFileError", "UnsafeSymlinkError", "write_atomic", "resolve", "kind_of",
           "TEMP_MARK"]

#: In the name of every temporary file: ".<name>.gpumem-<random>.tmp".
TEMP_MARK = ".gpumem-"
_TEMP_SUFFIX = ".tmp"


class NotARegularFileError(OSError):
    """The path names something gpumem does not replace (not a regular file)."""


class UnsafeSymlinkError(PermissionError):
    """A symlink in a sticky, world-writable folder whose owner is neither
    the folder's owner nor the writer (the kernel's fs.protected_symlinks)."""


_MAX_LINKS = 40  # the kernel's limit on symlinks followed in one lookup (ELOOP)


def _may_follow(link: str, link_st: os.stat_result) -> None:
    """Raise UnsafeSymlinkError unless the kernel's fs.protected_symlinks
    would follow ``link``: outside a sticky world-writable folder always;
    inside one only when the link's owner is the folder's owner or the euid."""
    folder = os.path.dirname(link) or "."
    try:
        dst = os.stat(folder)
    except OSError:
        return
    sticky_shared = dst.st_mode & stat.S_ISVTX and dst.st_mode & stat.S_IWOTH
    if not sticky_shared or link_st.st_uid in (dst.st_uid, os.geteuid()):
        return
    raise UnsafeSymlinkError(
        errno.EACCES,
        f"a symlink owned by uid {link_st.st_uid} in the shared sticky folder {folder}, which "
        f"gpumem follows only when its owner is the folder's owner or you (the kernel's "
        f"fs.protected_symlinks rule); write to the file's own path instead", link)


def resolve(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute with every symlink in it followed (like
    os.path.realpath), each one checked by the kernel's fs.protected_symlinks
    rule first (_may_follow).  A dangling link resolves to its target's path;
    a loop raises NotARegularFileError (ELOOP)."""
    pending = os.path.abspath(os.fspath(path)).split(os.sep)[1:]
    done = os.sep
    followed = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        candidate = os.path.join(done, part)
        try:
            st = os.lstat(candidate)
        except OSError:  # missing (or unreadable): the rest is taken as written
            done = candidate
            continue
        if not stat.S_ISLNK(st.st_mode):
            done = candidate
            continue
        followed += 1
        if followed > _MAX_LINKS:
            raise NotARegularFileError(errno.ELOOP, "a symlink loop is there, not a regular "
                                       "file; gpumem replaces only regular files", os.fspath(path))
        _may_follow(candidate, st)
        target = os.readlink(candidate)
        if os.path.isabs(target):
            done = os.sep
        pending[:0] = target.split(os.sep)
    return done


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
    """A new temporary for ``name`` in ``directory``, created by name and locked."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}{TEMP_MARK}", suffix=_TEMP_SUFFIX,
                                   dir=directory)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _still_ours(fd, tmp):
            return fd, tmp
        os.close(fd)  # a cleaner removed it before we held the lock: again


def _still_ours(fd: int, tmp: str) -> bool:
    try:
        return os.stat(tmp, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _unnamed_temporary(directory: str) -> int | None:
    """An O_TMPFILE file in ``directory`` (nothing to leave behind on a
    kill), or None where the kernel or filesystem does not make one."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(directory, flag | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None  # kernel or filesystem without O_TMPFILE: the named fallback
        raise


def _name_unnamed(fd: int, directory: str, name: str) -> str | None:
    """Lock the O_TMPFILE file ``fd`` and link it under a new, unpredictable
    temporary name in ``directory`` (never over an existing name); its path,
    or None where linking through /proc does not work."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        while True:
            tmp_name = f".{name}{TEMP_MARK}{secrets.token_hex(8)}{_TEMP_SUFFIX}"
            try:  # a dir fd makes it linkat(..., AT_SYMLINK_FOLLOW): plain link() links
                os.link(f"/proc/self/fd/{fd}", tmp_name,  # the /proc link itself (EXDEV)
                        dst_dir_fd=dir_fd, follow_symlinks=True)
            except FileExistsError:
                continue
            except OSError:
                return None
            tmp = os.path.join(directory, tmp_name)
            if _still_ours(fd, tmp):
                return tmp
            # a cleaner took the name before our lock was visible: again
    finally:
        os.close(dir_fd)


def write_atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], None], *,
                 make_dirs: bool = False) -> str:
    """Write a file at ``path`` with write(f) and rename it into place (Note [Atomic writes]).

    Returns the path written: ``path``, or the final target of a symlink.
    make_dirs: create the target's directory (and parents) if missing.
    Raises UnsafeSymlinkError (a PermissionError) for a symlink planted by
    another user in a sticky shared folder, NotARegularFileError
    (IsADirectoryError for a directory) without writing anything when
    ``path`` is not a regular file, and any OSError of the writing itself;
    the temporary is removed on every failure.
    """
    target = resolve(path)
    existing = _check_target(target)
    directory, name = os.path.split(target)
    if make_dirs:
        os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(directory)
    fd = _unnamed_temporary(directory)
    tmp = None
    held = -1  # the locked fallback copy's fd, closed once it is renamed
    if fd is None:
        fd, tmp = _locked_temporary(directory, name)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), stat.S_IMODE(existing.st_mode) if existing
                      else 0o666 & ~_umask())
            if tmp is None:
                tmp = _name_unnamed(f.fileno(), directory, name)
                if tmp is None:  # no linking through /proc: copy into a named one
                    held, tmp = _copy_to_named(f.fileno(), directory, name)
            _check_target(target)  # once more, right before the rename
            os.replace(tmp, target)
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise
    finally:
        if held >= 0:
            os.close(held)
    _fsync_dir(directory)
    return target


def _copy_to_named(src: int, directory: str, name: str) -> tuple[int, str]:
    """A named, locked temporary with the content and mode of the unnamed
    one ``src`` (where /proc/self/fd cannot be linked); (its fd, its path)."""
    fd, tmp = _locked_temporary(directory, name)
    try:
        offset = 0
        while chunk := os.pread(src, 1 << 20, offset):
            os.write(fd, chunk)  # a regular file: written whole
            offset += len(chunk)
        os.fsync(fd)
        os.fchmod(fd, stat.S_IMODE(os.fstat(src).st_mode))
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


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
