"""The cached C unwinder of stacks='all' (csrc/history/cunwind.c, Note
[Cached unwind]) walks the same return addresses as glibc's backtrace(),
which it replaced and falls back to.

testext.cunwind_walks takes both walks in one C function, so after the
first address (each walk's return into that function) the lists must be
equal, from wherever it is called: Python at depth, another thread, C
re-entering Python (sorted's key), and torch's autograd engine running a
Python backward (libtorch's C++ frames, no GPU needed).
"""

from __future__ import annotations

import platform
import threading

import pytest

import testext

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="the cached unwinder is x86-64 only")


def at_depth(n, fn):
    return fn() if n <= 0 else at_depth(n - 1, fn)


def same(walks):
    cached, bt = walks
    assert cached is not None, "the cached walk fell back to backtrace()"
    assert len(cached) == len(bt) > 3
    assert cached[1:] == bt[1:]


def test_python_at_depth_and_twice():
    same(at_depth(40, testext.cunwind_walks))
    same(at_depth(40, testext.cunwind_walks))  # now from the rule cache


def test_max_cuts_the_walk_where_backtrace_does():
    cached, bt = at_depth(5, lambda: testext.cunwind_walks(4))
    assert len(cached) == len(bt) == 4 and cached[1:] == bt[1:]


def test_another_thread_and_c_reentry():
    got = []
    t = threading.Thread(target=lambda: got.append(at_depth(7, testext.cunwind_walks)))
    t.start()
    t.join()
    sorted([3, 1, 2], key=lambda x: got.append(testext.cunwind_walks()) or x)
    got.append(list(map(lambda _: testext.cunwind_walks(), [0]))[0])
    assert len(got) == 5
    for w in got:
        same(w)


@pytest.mark.slow
def test_through_torchs_autograd_engine():
    torch = pytest.importorskip("torch")
    got = []

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            got.append(testext.cunwind_walks())
            return x * 2

        @staticmethod
        def backward(ctx, g):
            got.append(testext.cunwind_walks())
            return g * 2

    x = torch.ones(3, requires_grad=True)
    F.apply(x).sum().backward()
    assert len(got) == 2
    for w in got:
        same(w)
    # the backward's stack goes through libtorch's engine: many more frames
    assert len(got[1][1]) > len(got[0][1])


def test_cached_walk_is_cheaper():
    frames, cached_ns, bt_ns = at_depth(20, lambda: testext.cunwind_time(2000))
    assert frames > 3
    assert cached_ns * 3 < bt_ns, (cached_ns, bt_ns)
