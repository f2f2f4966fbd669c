"""Hostile inputs for the commands that read snapshots, and a runner that
measures each command on each of them.  No tests here
(tests/test_hostile_inputs.py runs them).

make(directory) writes every input and returns Hostile records: the path,
what each command must do with it (exit status 2 with one error line
containing some words, or 0), and the bytes the memory bound is figured
from.  The inputs (Note [Hostile snapshots] in gpumem/snapshots/unpickle.py):
- shared-reference bombs: trace and segment lists that repeat the same
  objects (the issue's 202 KB file of 10**8 trace entries, and 100
  segments of 100,000 shared blocks), one list over the records floor, one
  under it (analysed, and in bounds), annotations, a frame list of a
  million frames, a repr bomb in every optional text field and in a
  persistent id;
- memo-index bombs: LONG_BINPUT / PUT to huge indexes, alone and inside a
  real snapshot;
- special files: a FIFO with no writer, /dev/zero, /dev/null, a socket, a
  directory, symlinks to a FIFO and in a loop, /proc/self/status, a
  (sparse) file over the byte limit;
- huge integers: 5000-digit and beyond-64-bit values in every integer field
  the loader checks (refused) and in optional ones (tolerated), and trace
  sizes replay cannot serve;
- the limits' options: --max-bytes and --max-records refusing a valid file
  and letting a genuine big one through.

run(jobs) is executed in a subprocess (``python hostile_inputs.py``, jobs on
stdin as JSON): gpumem is imported once, then each command runs in a forked
child with its output in files, under an address-space limit (a regression
fails the test instead of swapping the machine) and a wall-clock timeout;
each child reports its exit status, stderr, wall time and peak RSS
(resource.getrusage ru_maxrss).
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1 << 20
BIG = 10 ** 5000          # 5000 digits: str() of it raises ValueError
COMMANDS = ("summary", "summary-json", "diff-before", "diff-after", "view", "replay",
            "replay-json")
FIXED_MEMORY = 200 * MiB  # the bound is 4x the input's bytes plus this
TIME_LIMIT = 10.0         # seconds, per command
HARD_TIMEOUT = 120        # a child still running then is killed (a hang)
ADDRESS_SPACE = 4 << 30   # RLIMIT_AS of each child


@dataclass
class Hostile:
    name: str
    path: str
    expected: int                      # 0 or 2 (for every command, unless in `per_command`)
    words: str = ""                    # in the error line when expected is 2
    per_command: dict = field(default_factory=dict)  # command -> (expected, words)
    options: list = field(default_factory=list)      # extra arguments for every command
    size: int = -1                     # bytes for the memory bound (default: the file's)

    def outcome(self, command: str) -> tuple[int, str]:
        return self.per_command.get(command, (self.expected, self.words))


def _entry(action="alloc", addr=1 << 32, size=512, **kw):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}
    e.update(kw)
    return e


def _base() -> dict:
    """A small valid snapshot: one segment, a trace with an alloc, a free and an OOM."""
    frames = [{"filename": "/home/u/train.py", "line": 10, "name": "step"}]
    block = {"address": 1 << 32, "size": 4096, "requested_size": 4000,
             "state": "active_allocated", "frames": frames}
    rest = {"address": (1 << 32) + 4096, "size": 2 * MiB - 4096, "requested_size": 0,
            "state": "inactive", "frames": []}
    seg = {"device": 0, "address": 1 << 32, "total_size": 2 * MiB, "allocated_size": 4096,
           "stream": 0, "segment_type": "small", "frames": frames, "blocks": [block, rest]}
    trace = [_entry("segment_alloc", 1 << 32, 2 * MiB, time_us=1000),
             _entry("alloc", 1 << 32, 4000, frames=frames, time_us=1001),
             _entry("alloc", (1 << 32) + 4096, 8000, frames=frames, time_us=1002),
             _entry("free_completed", (1 << 32) + 4096, 8000, frames=frames, time_us=1003),
             {"action": "oom", "device_free": 1024, "size": 1 << 30, "stream": 0,
              "time_us": 1004, "frames": frames}]
    return {"segments": [seg], "device_traces": [trace],
            "external_annotations": [{"name": "x", "stage": "START", "device": 0,
                                      "time_us": 1001}]}


def _write(directory: Path, name: str, obj, protocol=4) -> str:
    path = directory / f"{name}.pickle"
    path.write_bytes(obj if isinstance(obj, bytes) else pickle.dumps(obj, protocol=protocol))
    return str(path)


def _set(snap, path, value):
    obj = snap
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _repr_bomb():
    """A list whose repr is 10**10 characters, in 30 pickle bytes."""
    value = ["x"] * 10
    for _ in range(9):
        value = [value] * 10
    return value


SEG, BLK = ("segments", 0), ("segments", 0, "blocks", 0)
ALLOC, OOM = ("device_traces", 0, 1), ("device_traces", 0, 4)
REQUIRED_INTS = [SEG + ("device",), SEG + ("address",), SEG + ("total_size",),
                 SEG + ("stream",), BLK + ("size",), BLK + ("requested_size",),
                 ALLOC + ("addr",), ALLOC + ("size",), ALLOC + ("stream",),
                 OOM + ("device_free",)]
OPTIONAL_INTS = [ALLOC + ("time_us",), ALLOC + ("frames", 0, "line"),
                 SEG + ("allocated_size",), ("external_annotations", 0, "time_us"),
                 ("external_annotations", 0, "device"), BLK + ("address",)]


def make(directory: Path) -> list[Hostile]:
    """Write every hostile input into ``directory``; return them."""
    d = Path(directory)
    out: list[Hostile] = []
    refused = "holds more than"

    # ---- shared-reference bombs
    e = _entry()
    out.append(Hostile("trace-bomb-10^8", _write(d, "trace-bomb", {
        "segments": [], "device_traces": [[e] * 100_000] * 1000}), 2, refused))
    blk = {"size": 512, "requested_size": 512, "state": "active_allocated", "frames": []}
    seg = {"device": 0, "address": 1 << 32, "total_size": 512 * 100_000, "stream": 0,
           "blocks": [blk] * 100_000}
    out.append(Hostile("segment-bomb-10^7", _write(d, "segment-bomb", {
        "segments": [seg] * 100, "device_traces": []}), 2, refused))
    out.append(Hostile("one-list-over-the-floor", _write(d, "one-list-over", {
        "segments": [], "device_traces": [[e, _entry("free_completed")] * 150_000]}),
        2, refused))
    out.append(Hostile("one-list-under-the-floor", _write(d, "one-list-under", {
        "segments": [], "device_traces": [[e, _entry("free_completed")] * 100_000]}), 0))
    ann = {"name": "x", "stage": "START", "device": 0, "time_us": 5}
    out.append(Hostile("annotation-bomb", _write(d, "annotations", dict(
        _base(), external_annotations=[ann] * 300_000)), 2, refused))
    frames = [{"filename": "/u/train.py", "line": 3, "name": "step"}] * 1_000_000
    out.append(Hostile("million-frame-stack", _write(d, "frames", {
        "segments": [], "device_traces": [[_entry(addr=4096 * (i + 1), frames=frames)
                                           for i in range(1000)]]}), 0))
    bomb = _repr_bomb()
    snap = _base()
    for path in (ALLOC + ("frames", 0, "filename"), ALLOC + ("frames", 0, "name"),
                 ALLOC + ("frames", 0, "line"), ALLOC + ("user_metadata",),
                 ALLOC + ("compile_context",), ALLOC + ("time_us",),
                 ("external_annotations", 0, "name"), ("external_annotations", 0, "stage"),
                 SEG + ("segment_type",), SEG + ("frames",), BLK + ("frames",)):
        _set(snap, path, bomb)
    snap["allocator_settings"] = bomb
    out.append(Hostile("repr-bomb-in-optional-fields", _write(d, "repr-bomb", snap), 0))

    class PersistentBomb(pickle.Pickler):
        def persistent_id(self, obj):
            return bomb if obj == "marker" else None
    import io
    buf = io.BytesIO()
    PersistentBomb(buf, protocol=2).dump({"segments": ["marker"]})
    out.append(Hostile("repr-bomb-as-persistent-id", _write(d, "pid-bomb", buf.getvalue()),
                       2, "persistent id <list>"))

    # ---- memo-index bombs
    memo = "stores to memo entry"
    out.append(Hostile("long-binput-2^29", _write(
        d, "memo1", b"\x80\x02Nr" + (1 << 29).to_bytes(4, "little") + b"."), 2, memo))
    out.append(Hostile("long-binput-2^32-1", _write(
        d, "memo2", b"\x80\x02Nr\xff\xff\xff\xff."), 2, memo))
    out.append(Hostile("put-10^12", _write(d, "memo3", b"\x80\x02Np1000000000000\n."), 2, memo))
    out.append(Hostile("put-5000-digits", _write(d, "memo4", b"\x80\x02Np" + b"9" * 5000
                                                  + b"\n."), 2, "is not a valid pickle"))
    real = pickle.dumps(_base(), protocol=2)
    out.append(Hostile("memo-bomb-in-a-snapshot", _write(
        d, "memo5", real[:2] + b"Nr" + (1 << 30).to_bytes(4, "little") + b"0" + real[2:]),
        2, memo))

    # ---- special files
    fifo = d / "fifo.pickle"
    os.mkfifo(fifo)
    out.append(Hostile("fifo-without-writer", str(fifo), 2, "is a FIFO, not a regular file",
                       size=0))
    for dev, words in (("/dev/zero", "is a character device"),
                       ("/dev/null", "is a character device"),
                       ("/dev/urandom", "is a character device")):
        if os.path.exists(dev):
            out.append(Hostile(dev, dev, 2, words, size=0))
    sock = d / "sock.pickle"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    out.append(Hostile("socket", str(sock), 2, "is a socket", size=0))
    (d / "dir.pickle").mkdir()
    # summary reads a folder of per-rank snapshots; an empty one holds none
    empty = (2, "holds no snapshots")
    out.append(Hostile("directory", str(d / "dir.pickle"), 2, "is a directory", size=0,
                       per_command={"summary": empty, "summary-json": empty}))
    os.symlink("fifo.pickle", d / "to-fifo.pickle")
    out.append(Hostile("symlink-to-fifo", str(d / "to-fifo.pickle"), 2, "is a FIFO", size=0))
    os.symlink("loop.pickle", d / "loop.pickle")
    out.append(Hostile("symlink-loop", str(d / "loop.pickle"), 2, "could not be read", size=0))
    if os.path.exists("/proc/self/status"):
        out.append(Hostile("proc-file", "/proc/self/status", 2, "not a pickle file", size=0))
    sparse = d / "sparse.pickle"
    with open(sparse, "wb") as f:
        f.truncate((2 << 30) + 1)
    out.append(Hostile("over-the-byte-limit", str(sparse), 2, "larger than 2147483648 bytes",
                       size=0))

    # ---- huge integers
    for path in REQUIRED_INTS:
        signed = path[-1] == "stream"
        key = ".".join(map(str, path))
        for label, value in (("5000-digits", BIG), ("minus-5000-digits", -BIG), ("2^64", 1 << 64)):
            snap = _base()
            _set(snap, path, value)
            words = "negative" if value < 0 and not signed else "does not fit in 64 bits"
            out.append(Hostile(f"int-{label}-{key}", _write(d, f"int-{label}-{key}", snap),
                               2, words))
    for path in OPTIONAL_INTS:
        snap = _base()
        _set(snap, path, BIG)
        out.append(Hostile("int-big-optional-" + ".".join(map(str, path)),
                           _write(d, f"opt-{'.'.join(map(str, path))}", snap), 0))
    for size, replay in ((1 << 63, 2), ((1 << 62) + 1, 2), (1 << 62, 0), ((1 << 64) - 1, 2)):
        snap = _base()
        _set(snap, ALLOC + ("size",), size)
        out.append(Hostile(f"trace-size-{size:#x}", _write(d, f"size-{size:#x}", snap), 0,
                           per_command={c: (replay, "more than any allocator serves")
                                        for c in ("replay", "replay-json")}))
    snap = _base()
    snap["device_traces"][0] += [_entry(addr=(1 << 40) + i * (1 << 30), size=1 << 62)
                                 for i in range(8)]
    snap["device_traces"][0].append(_entry(addr=(1 << 64) - 1, size=512, stream=-(1 << 63)))
    out.append(Hostile("peak-past-2^64-and-top-address", _write(d, "peak", snap), 0))

    # ---- the limits' options
    valid = _write(d, "valid", _base())
    out.append(Hostile("max-bytes-100", valid, 2, "larger than 100 bytes",
                       options=["--max-bytes", "100"]))
    out.append(Hostile("max-records-3", valid, 2, "holds more than 3 segments",
                       options=["--max-records", "3"]))
    over = next(h for h in out if h.name == "one-list-over-the-floor")
    out.append(Hostile("one-list-over-the-floor-allowed", over.path, 0,
                       options=["--max-records", "400000"]))
    return out


def argv_for(h: Hostile, command: str, good: str, html: str) -> list[str]:
    """The command line of ``command`` on input ``h``."""
    base = {"summary": ["summary", h.path], "summary-json": ["summary", h.path, "--json"],
            "diff-before": ["diff", h.path, good], "diff-after": ["diff", good, h.path, "--json"],
            "view": ["view", h.path, "-o", html], "replay": ["replay", h.path],
            "replay-json": ["replay", h.path, "--json"]}[command]
    return base + list(h.options)


# ------------------------------------------------------------------ runner

def _child(argv: list[str], out_dir: str) -> None:
    """In the forked child: run the command, then write the measurements."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    out = os.open(os.path.join(out_dir, "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(os.path.join(out_dir, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    from gpumem import cli
    start = time.monotonic()
    try:
        rc = cli.main(argv)
    except BaseException as e:  # noqa: BLE001 - reported, not raised
        print(f"RUNNER: {type(e).__name__}: {e}", file=sys.stderr)
        rc = 99
    elapsed = time.monotonic() - start
    sys.stdout.flush()
    sys.stderr.flush()
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"rc": rc, "seconds": elapsed,
                   "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, f)
    os._exit(0)


def run(jobs: list[dict]) -> list[dict]:
    """Each job {'argv', 'dir'} in a forked child; returns their results."""
    import gpumem.cli  # noqa: F401 - imported once, before the forks
    import gpumem.snapshots.replay  # noqa: F401
    import gpumem.snapshots.view  # noqa: F401
    results = []
    for job in jobs:
        os.makedirs(job["dir"], exist_ok=True)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(job["argv"], job["dir"])
        status = None
        while status is None and time.monotonic() - start < HARD_TIMEOUT:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            else:
                select.select([], [], [], 0.01)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            results.append({"rc": None, "timeout": True, "seconds": HARD_TIMEOUT})
            continue
        try:
            with open(os.path.join(job["dir"], "result.json")) as f:
                res = json.load(f)
        except (OSError, ValueError):
            res = {"rc": None, "crashed": os.waitstatus_to_exitcode(status)}
        for name in ("stdout", "stderr"):
            with open(os.path.join(job["dir"], name), errors="replace") as f:
                res[name] = f.read()[-4000:]
        results.append(res)
    return results


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
