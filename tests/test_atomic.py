"""Atomic writes of snapshots and viewer pages (gpumem/_atomic.py, Note
[Atomic writes]): only regular files are replaced, a symlink's target is
written through the link, special files are refused and left alone, and
temporaries of killed writers are removed by later writes.

Issue 16.3 and 16.4.  Device nodes are made in the test's own directory
(mknod, as root), never /dev's: a regression must not destroy /dev/null.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from gpumem import _C
from gpumem.recording import history
from gpumem._atomic import TEMP_MARK, NotARegularFileError, UnsafeSymlinkError, write_atomic
from gpumem.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent


def write(path, data=b"new"):
    return write_atomic(path, lambda f: f.write(data))


def temporaries(directory):
    return sorted(p.name for p in Path(directory).iterdir() if TEMP_MARK in p.name)


def special_files(tmp_path):
    """name -> path of each kind of special file this machine lets us make."""
    out = {}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out["fifo"] = fifo
    d = tmp_path / "dir"
    d.mkdir()
    out["directory"] = d
    sock = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    out["socket"] = sock
    for name, kind in (("chardev", stat.S_IFCHR), ("blockdev", stat.S_IFBLK)):
        try:  # a copy of /dev/null's (1, 3) or of a loop device's (7, 0) node
            os.mknod(tmp_path / name, kind | 0o600, os.makedev(1, 3) if kind == stat.S_IFCHR
                     else os.makedev(7, 0))
            out[name] = tmp_path / name
        except (PermissionError, OSError):
            pass
    loop = tmp_path / "loop"
    os.symlink("loop", loop)
    out["symlink-loop"] = loop
    return out


def test_a_regular_file_is_replaced_and_keeps_its_mode(tmp_path):
    p = tmp_path / "snap.pickle"
    p.write_bytes(b"old")
    p.chmod(0o640)
    assert write(p) == str(p)
    assert p.read_bytes() == b"new" and stat.S_IMODE(p.stat().st_mode) == 0o640
    q = tmp_path / "fresh.pickle"
    write(q)
    assert q.read_bytes() == b"new" and temporaries(tmp_path) == []


def test_special_files_are_refused_and_left_alone(tmp_path):
    for kind, path in special_files(tmp_path).items():
        before = os.lstat(path)
        with pytest.raises(OSError) as e:
            write(path)
        assert isinstance(e.value, IsADirectoryError if kind == "directory"
                          else NotARegularFileError), kind
        assert "not a regular file" in e.value.strerror, (kind, e.value.strerror)
        after = os.lstat(path)
        assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode), kind
        assert after.st_ino == before.st_ino, kind
    assert temporaries(tmp_path) == []


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    target = tmp_path / "runs" / "run3.pickle"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "latest.pickle"
    os.symlink(os.path.join("runs", "run3.pickle"), link)
    chain = tmp_path / "chain.pickle"
    os.symlink("latest.pickle", chain)
    assert write(chain, b"through two links") == str(target)
    assert link.is_symlink() and chain.is_symlink()
    assert target.read_bytes() == b"through two links"
    dangling = tmp_path / "dangling.pickle"
    os.symlink("made-by-the-write.pickle", dangling)
    write(dangling, b"x")
    assert dangling.is_symlink() and (tmp_path / "made-by-the-write.pickle").read_bytes() == b"x"
    to_fifo = tmp_path / "to-fifo"
    os.mkfifo(tmp_path / "f")
    os.symlink("f", to_fifo)
    with pytest.raises(NotARegularFileError):
        write(to_fifo)
    assert stat.S_ISFIFO(os.stat(to_fifo).st_mode)
    assert temporaries(tmp_path) == temporaries(target.parent) == []


def test_dump_snapshot_and_torchs_name_for_it_refuse_special_files(tmp_path):
    """gpumem.dump_snapshot and history._dump_snapshot (which install() puts
    in place of torch.cuda.memory._dump_snapshot): a FIFO is refused at once
    (no hang), a symlink is written through."""
    a = _C.Allocator(capacity=64 << 20)
    a.malloc(4096)
    files = special_files(tmp_path)
    for dump in (history.dump_snapshot, history._dump_snapshot):
        for kind, path in files.items():
            result = {}
            t = threading.Thread(target=lambda: result.setdefault(
                "err", _raises(dump, str(path))), daemon=True)
            t.start()
            t.join(30)
            assert not t.is_alive(), f"{dump.__name__}({kind}) hangs"
            assert isinstance(result["err"], OSError), (kind, result)
        link = tmp_path / "link.pickle"
        if not link.exists():
            os.symlink("real.pickle", link)
        dump(str(link))
        assert link.is_symlink()
        with open(tmp_path / "real.pickle", "rb") as f:
            assert "segments" in pickle.load(f)
    assert temporaries(tmp_path) == []


def _raises(fn, *args):
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        return e
    return None


def test_view_output_that_is_not_a_regular_file_is_one_line(tmp_path, capsys):
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4))
    for kind, path in special_files(tmp_path).items():
        before = os.lstat(path)
        assert cli_main(["view", str(snap), "-o", str(path)]) == 2, kind
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and f"cannot write {path}" in err[0], (kind, err)
        assert "not a regular file" in err[0] and "-o" in err[0], err
        assert os.lstat(path).st_ino == before.st_ino, kind
    link = tmp_path / "page.html"
    os.symlink("real.html", link)
    assert cli_main(["view", str(snap), "-o", str(link)]) == 0
    assert link.is_symlink() and (tmp_path / "real.html").read_text().startswith("<!")


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from gpumem import _atomic
    from gpumem._atomic import write_atomic
    if sys.argv[3] == "named":         # the fallback where O_TMPFILE is missing
        _atomic._unnamed_temporary = lambda directory: None
    def write(f):
        f.write(b"x" * int(sys.argv[4]))
        f.flush()
        print("writing", flush=True)
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stdin.readline()           # hold the temporary until told to go on
    write_atomic(sys.argv[1], write)
""")


def _writer(path, mode, temporary="named", size=1 << 20):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path), mode, temporary,
                             str(size)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "writing\n"
    return proc


def test_a_killed_writer_leaves_nothing_behind(tmp_path):
    """Issue 34.4: a dump killed mid-write left its temporary (up to 12.9 MB)
    until a later dump to the same folder.  The data now goes to an unnamed
    O_TMPFILE file: nothing is visible while it is written, and nothing is
    left when the writer is killed, without any later gpumem process."""
    target = tmp_path / "memory.pickle"
    target.write_bytes(b"old")
    size = 16 << 20
    live = _writer(target, "hold", "unnamed", size)  # blocked in the middle of its dump
    try:
        assert sorted(os.listdir(tmp_path)) == ["memory.pickle"]
        assert target.read_bytes() == b"old"
        killed = _writer(tmp_path / "oom_1.pickle", "kill", "unnamed", size)
        assert killed.wait(timeout=60) == -signal.SIGKILL
        assert sorted(os.listdir(tmp_path)) == ["memory.pickle"]
    finally:
        live.stdin.write("go\n")
        live.stdin.flush()
        assert live.wait(timeout=60) == 0
    assert sorted(os.listdir(tmp_path)) == ["memory.pickle"]
    assert target.stat().st_size == size


def test_the_unnamed_temporary_is_linked_not_copied(tmp_path, monkeypatch):
    """The O_TMPFILE file is given its name through /proc/self/fd (linkat
    following the link); the copy is only for where that fails."""
    from gpumem import _atomic

    def no_copy(*args):
        raise AssertionError("copied into a named temporary")
    monkeypatch.setattr(_atomic, "_copy_to_named", no_copy)
    target = tmp_path / "memory.pickle"
    assert write(target, b"x" * 5000) == str(target)
    assert target.read_bytes() == b"x" * 5000 and os.listdir(tmp_path) == ["memory.pickle"]


def test_where_linking_through_proc_fails_the_data_is_copied(tmp_path, monkeypatch):
    from gpumem import _atomic
    monkeypatch.setattr(_atomic, "_name_unnamed", lambda fd, directory, name: None)
    target = tmp_path / "memory.pickle"
    target.write_bytes(b"old")
    target.chmod(0o640)
    data = os.urandom(3 << 20)
    assert write(target, data) == str(target)
    assert target.read_bytes() == data and os.listdir(tmp_path) == ["memory.pickle"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_temporaries_of_killed_writers_are_removed_by_the_next_write(tmp_path):
    """Issue 16.4: each killed dump left its hidden temporary behind (the
    named temporaries of the fallback where O_TMPFILE is missing)."""
    target = tmp_path / "memory.pickle"
    for name in ("memory.pickle", "memory.pickle", "oom_1.pickle"):  # killed writers
        proc = _writer(tmp_path / name, "kill")
        assert proc.wait(timeout=60) == -signal.SIGKILL
        left = temporaries(tmp_path)  # each removed the one killed before it
        assert len(left) == 1 and left[0].startswith(f".{name}{TEMP_MARK}"), left
    assert not target.exists()
    live = _writer(tmp_path / "live.pickle", "hold")    # a writer still at work
    try:
        live_tmp = temporaries(tmp_path)
        assert len(live_tmp) == 1, live_tmp  # the killed oom_1's went
        proc = _writer(tmp_path / "oom_2.pickle", "kill")
        proc.wait(timeout=60)
        live_tmp = [n for n in temporaries(tmp_path) if n.startswith(".live")]
        assert len(temporaries(tmp_path)) == 2
        write(target, b"done")
        assert target.read_bytes() == b"done"
        left = temporaries(tmp_path)
        assert len(left) == 1 and left[0].startswith(".live.pickle") and left[0] in live_tmp
    finally:
        live.stdin.write("go\n")
        live.stdin.flush()
        assert live.wait(timeout=60) == 0
    assert temporaries(tmp_path) == [] and (tmp_path / "live.pickle").stat().st_size == 1 << 20


def test_dump_snapshot_removes_temporaries_of_killed_dumps(tmp_path):
    target = tmp_path / "memory.pickle"
    proc = _writer(target, "kill")  # the named fallback
    proc.wait(timeout=60)
    assert len(temporaries(tmp_path)) == 1
    history.dump_snapshot(str(target))
    assert temporaries(tmp_path) == []


NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's link needs root")


def _planted(tmp_path, folder_owner=0, link_owner=NOBODY, mode=0o1777):
    """A root-only file and, in a folder of ``mode`` owned by ``folder_owner``,
    a link to it owned by ``link_owner`` (made by root, then chowned)."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    os.chown(shared, folder_owner, folder_owner)
    link = shared / "memory.pickle"
    os.symlink(secret, link)
    os.lchown(link, link_owner, link_owner)
    return secret, link


@needs_root
def test_a_link_planted_by_another_user_in_a_sticky_folder_is_not_followed(tmp_path, capsys):
    """Issue 34.3: in a sticky, world-writable folder, a link planted by
    'nobody' to a root-owned 0600 file made a root dump replace that file.
    The kernel's fs.protected_symlinks rule now decides: refused in one
    line, the file and the link left as they are."""
    secret, link = _planted(tmp_path)
    before = secret.stat()
    for dump in (lambda: write(link), lambda: history.dump_snapshot(str(link)),
                 lambda: write(tmp_path / "shared" / ".." / "shared" / "memory.pickle")):
        with pytest.raises(UnsafeSymlinkError) as ei:
            dump()
        assert isinstance(ei.value, PermissionError)
        msg = str(ei.value)
        assert "uid 65534" in msg and "fs.protected_symlinks" in msg and "\n" not in msg, msg
        assert secret.read_bytes() == b"root only" and secret.stat().st_ino == before.st_ino
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert link.is_symlink() and os.readlink(link) == str(secret)
        assert os.listdir(tmp_path / "shared") == ["memory.pickle"]
    snap = tmp_path / "s.pickle"
    history.dump_snapshot(str(snap))
    assert cli_main(["view", str(snap), "-o", str(link)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fs.protected_symlinks" in err and "Traceback" not in err
    assert secret.read_bytes() == b"root only"


@needs_root
@pytest.mark.parametrize("folder_owner,link_owner,mode", [
    (0, 0, 0o1777),             # the writer's own link in a sticky folder
    (NOBODY, NOBODY, 0o1777),   # the folder owner's link
    (NOBODY, NOBODY, 0o0777),   # not sticky: the kernel follows every link
    (0, NOBODY, 0o1755),        # sticky but not world-writable
])
def test_links_the_kernel_follows_are_followed(tmp_path, folder_owner, link_owner, mode):
    secret, link = _planted(tmp_path, folder_owner, link_owner, mode)
    assert write(link, b"new") == str(secret)
    assert secret.read_bytes() == b"new" and link.is_symlink()


def test_private_folder_for_oom_snapshots(tmp_path):
    """Issue 34.3: GPUMEM_OOM_SNAPSHOT in a sticky, world-writable folder
    writes into a 0700 folder of the user's own; a name taken by anything
    else is refused (tests/test_oom_dump.py runs it under torch)."""
    from gpumem.recording.oom import private_folder
    plain = tmp_path / "plain"
    plain.mkdir()
    assert private_folder(str(plain)) == str(plain)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    own = shared / f"gpumem-oom-{os.geteuid()}"
    assert private_folder(str(shared)) == str(own) == private_folder(str(shared))
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and own.stat().st_uid == os.geteuid()
    own.chmod(0o777)  # writable by others: refused
    with pytest.raises(PermissionError, match="not a folder of yours"):
        private_folder(str(shared))
    own.rmdir()
    os.symlink(plain, own)  # a link in its place: refused, not followed
    with pytest.raises(PermissionError, match="not a folder of yours"):
        private_folder(str(shared))
    assert own.is_symlink() and os.listdir(plain) == []
    if os.geteuid() == 0:
        own.unlink()
        own.mkdir(0o700)
        os.chown(own, NOBODY, NOBODY)  # another user's folder
        with pytest.raises(PermissionError, match="not a folder of yours"):
            private_folder(str(shared))
