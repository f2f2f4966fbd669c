"""A capture reuses a recent stack's id only when the thread stands on that
very stack (Note [Predicted chain] in csrc/python/hist_pychain.h): the
check compares every frame's code, instruction and link to its end, so a
frame at the same address and instruction under another caller (frames are
reused memory) is a new stack.

Each test captures from places whose stacks differ only far from the
innermost frame, or not at all, and holds every id against the interpreter's
own view of the stack at that moment (sys._getframe): one id per stack,
another id for another stack. Both capture paths are driven: with the GIL
held (_C._hist_capture) and released first (testext.hist_capture_without_gil,
torch's case around an allocation).
"""

from __future__ import annotations

import os
import sys
import sysconfig

import pytest

import gpumem
from gpumem import _C
from gpumem.recording import history

import testext

OWN = os.path.dirname(os.path.abspath(gpumem.__file__)) + os.sep
DIRECT = ((3, 11) <= sys.version_info[:2] <= (3, 13)
          and not sysconfig.get_config_var("Py_GIL_DISABLED"))
LEVEL_ALL = (3,)
CAPTURES = {"gil": _C._hist_capture, "no_gil": testext.hist_capture_without_gil}


@pytest.fixture(autouse=True)
def _recording():
    history.record_memory_history("all", context="all", stacks="python")
    yield
    history.record_memory_history(None)


@pytest.fixture(params=sorted(CAPTURES))
def cap(request):
    return CAPTURES[request.param]


def take(cap):
    """(id, the stack outside the capturing frame as the interpreter sees it:
    (code, instruction offset, line) of each frame, gpumem's own left out).
    The capture's own call is one the interpreter never specializes
    (CALL_FUNCTION_EX), so this frame's offset in it never changes."""
    tb = cap(*LEVEL_ALL)
    outer, f = [], sys._getframe(1)
    while f is not None:
        if not f.f_code.co_filename.startswith(OWN):
            outer.append((f.f_code, f.f_lasti, f.f_lineno))
        f = f.f_back
    return tb, outer


def check(results):
    """Every id's frames are its moment's stack; one id per stack (a stack
    is its frames' code objects and instruction offsets: ids tell apart what
    the interpreter tells apart, also within a line: a call runs at another
    offset once specialized), another per other stack. Returns the distinct
    stacks as (name, line) of their frames."""
    by_stack = {}
    for tb, outer in results:
        frames = [(f["name"], f["filename"], f["line"]) for f in _C._hist_traceback(tb)]
        assert frames[0][0] == "take"
        assert frames[1:] == [(c.co_name, c.co_filename, line) for c, _, line in outer]
        by_stack.setdefault(tuple((c, lasti) for c, lasti, _ in outer), set()).add(tb)
    assert all(len(ids) == 1 for ids in by_stack.values()), by_stack
    assert len({min(ids) for ids in by_stack.values()}) == len(by_stack)
    return {tuple((c.co_name, line) for c, _, line in outer) for _, outer in results}


def test_the_same_frame_under_another_caller_is_another_stack(cap):
    # via_a and via_b have frames of one size, so inner's frame is at the
    # same address and instruction under both: only the caller differs
    def inner():
        return take(cap)

    def via_a():
        return inner()

    def via_b():
        return inner()

    stacks = check([(via_a, via_b)[i % 2]() for i in range(20)])
    assert {s[1][0] for s in stacks} == {"via_a", "via_b"}


def test_a_difference_at_the_outermost_frame_is_seen(cap):
    def down(n):
        return down(n - 1) if n else take(cap)

    got = []
    for _ in range(6):
        got.append(down(40))
        got.append(down(40))  # another line of this frame, 40 frames out
    assert len(check(got)) == 2  # the two calling lines, 40 frames out


@pytest.mark.parametrize("depth", [70, 200])
def test_stacks_deeper_than_a_kept_chain(cap, depth):
    def down(n):
        return down(n - 1) if n else take(cap)

    got = [down(depth) for _ in range(4)] + [down(depth - 1) for _ in range(4)]
    assert len(check(got)) == 2


def test_a_generator_resumed_from_another_caller(cap):
    def gen():
        while True:
            yield take(cap)

    g = gen()

    def from_a():
        return next(g)

    def from_b():
        return next(g)

    assert len(check([(from_a, from_b)[i % 3 == 0]() for i in range(12)])) == 2
    # a new generator each time: the same stack at other frame addresses
    fresh = [next(gen()) for _ in range(6)]
    assert len(check(fresh)) == 1


def test_gpumems_own_frames_in_the_chain(cap):
    ns = {"take": take, "cap": cap}
    exec(compile("def through_own(fn):\n    return fn()\n", OWN + "_chain_test_own.py", "exec"),
         ns)
    through_own = ns["through_own"]

    def site():
        return take(cap)

    got = [through_own(site) for _ in range(4)]
    got += [site() for _ in range(4)]
    # gpumem's frame is left out: two stacks, which differ in the calling line only
    stacks = check(got)
    assert len(stacks) == 2 and len({s[:1] + s[3:] for s in stacks}) == 1


# ------------------------------------------- the check itself (testext)

needs_direct = pytest.mark.skipif(not DIRECT, reason="the direct walk exists on 3.11 to 3.13")


def chain(record):
    return testext.hist_chain(0, record)


@needs_direct
def test_the_chain_check_sees_a_caller_or_an_outer_call_change():
    def inner(record):
        return chain(record)

    def via_a(record):
        return inner(record)

    def via_b(record):
        return inner(record)

    # one call instruction here for all of them: only the caller differs
    got = [f(record) for f, record in ((via_a, True), (via_a, False), (via_b, False),
                                       (via_a, False))]
    assert got == [True, True, False, True]
    assert via_a(True)
    assert not via_a(False)  # this frame is at another instruction
    assert [inner(r) for r in (True, False)] == [True, True]


@needs_direct
def test_the_chain_check_on_generators_and_deep_stacks():
    def gen():
        record = yield
        while True:
            record = yield chain(record)

    g = gen()
    next(g)

    def resume(record):
        return g.send(record)

    def resume_elsewhere(record):
        return g.send(record)

    # (from 3.12 on, send() enters the interpreter through a frame on the C
    # stack, whose address moves while the calls here get specialized: the
    # last of a few rounds is compared)
    rounds = [[f(r) for f, r in ((resume, True), (resume, False), (resume_elsewhere, False),
                                 (resume, False))] for _ in range(4)]
    assert rounds[-1] == [True, True, False, True]

    def down(n, record):
        return down(n - 1, record) if n else chain(record)

    base = len(testext.hist_walks()[1])
    assert [down(100 - base, r) for r in (True, False)] == [True, True]
    assert [down(140 - base, r) for r in (True, False)] == [False, False]  # not recorded
