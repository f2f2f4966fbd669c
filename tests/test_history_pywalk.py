"""The two Python frame walks of a stack capture (csrc/python/hist_pywalk.h)
agree: the direct _PyInterpreterFrame walk, which capture uses on CPython
3.11, 3.12 and 3.13 (GIL builds), and the public C API walk, its fallback
on every other version.

Each test takes both walks from one place (testext.hist_walks, the test-only
extension compiling the same header) and compares them frame by frame, and
the public walk against the interpreter's own view (sys._getframe).
"""

from __future__ import annotations

import asyncio
import sys
import sysconfig

import pytest

import testext

DIRECT = ((3, 11) <= sys.version_info[:2] <= (3, 13)
          and not sysconfig.get_config_var("Py_GIL_DISABLED"))


def interpreter_view(depth: int = 1) -> list:
    """(code, byte offset) of the caller's frames, innermost first, from depth."""
    out = []
    f = sys._getframe(depth)
    while f is not None:
        out.append((f.f_code, f.f_lasti))
        f = f.f_back
    return out


def walks(cap: int = 128):
    api, direct, used = testext.hist_walks(cap)
    return api, direct, used


def check(api, direct, used, here):
    assert used is DIRECT
    assert direct == api
    # api[0] is walks(); api[1] is `here`'s innermost frame, at another
    # call; every frame outside it is at the same place.
    assert api[0][0] is walks.__code__
    assert [c for c, _ in api[1:]] == [c for c, _ in here]
    assert api[2:] == here[1:]


def test_plain_calls_at_depth():
    def at_depth(n):
        if n:
            return at_depth(n - 1)
        return walks(), interpreter_view(1)
    (api, direct, used), here = at_depth(40)
    assert len(api) >= 41
    check(api, direct, used, here)


def test_deep_stack_grows_the_buffer():
    def at_depth(n):
        return at_depth(n - 1) if n else (walks(cap=4), walks())
    (a_small, d_small, _), (a_big, d_big, _) = at_depth(300)
    assert len(a_small) > 300
    assert d_small == a_small
    assert [c for c, _ in d_small] == [c for c, _ in d_big]


def test_generator_and_coroutine_frames():
    def gen():
        yield walks(), interpreter_view(1)

    async def inner():
        await asyncio.sleep(0)
        return walks(), interpreter_view(1)

    async def outer():
        return await inner()

    (api, direct, used), here = next(gen())
    check(api, direct, used, here)
    (api, direct, used), here = asyncio.run(outer())
    assert {c.co_name for c, _ in api} >= {"inner", "outer"}
    check(api, direct, used, here)


def test_class_body_comprehension_lambda_and_c_reentry():
    got = []

    class Body:
        got.append(([walks() for _ in range(1)][0], None))
    got.append((sorted([2, 1], key=lambda x: got.append((walks(), None)) or x) and got[-1][0],
                None))
    got.append((list(map(lambda _: walks(), [0]))[0], None))
    for (api, direct, used), _ in got:
        assert used is DIRECT
        assert direct == api
        assert api and api[-1][0] is interpreter_view(0)[-1][0]  # the outermost frame


def test_exec_and_a_frame_that_raised():
    ns = {"walks": walks}
    exec(compile("def f():\n    return walks()\nr = f()\n", "<gen>", "exec"), ns)
    api, direct, used = ns["r"]
    assert direct == api and api[1][0].co_filename == "<gen>"

    def raising():
        raise ValueError

    try:
        raising()
    except ValueError:
        api, direct, _ = walks()
    assert direct == api


@pytest.mark.skipif(not DIRECT, reason="the direct walk exists on CPython 3.11 to 3.13 only")
def test_capture_uses_the_direct_walk():
    _, _, used = walks()
    assert used is True


# ------------------------------------------ the last stack (Note [Last stack])

def _frames_of(tb_id):
    from gpumem import _C
    return [(f["name"], f["line"]) for f in _C._hist_traceback(tb_id)]


def test_repeated_and_alternating_stacks_keep_their_own_ids():
    import threading

    from gpumem import _C
    from gpumem.recording import history
    history.record_memory_history()
    try:
        def site_a():
            return _C._hist_capture(1)

        def site_b():
            return _C._hist_capture(1)

        other = []

        def in_another_thread():
            t = threading.Thread(target=lambda: other.append(site_a()))
            t.start()
            t.join()

        ids = []
        for i in range(4):
            ids.append((site_a(), site_b()))
            if i == 2:
                in_another_thread()
        # the same stack again (even right after another, or after another
        # thread captured) is the same id
        assert len(set(ids)) == 1
        a, b = ids[0]
        assert a != b
        assert _frames_of(a)[0][0] == "site_a" and _frames_of(b)[0][0] == "site_b"
        # one instruction apart: another id
        c = _C._hist_capture(1); d = _C._hist_capture(1)  # noqa: E702
        assert c != d
        # the other thread's stack does not borrow this thread's
        assert other[0] != a and _frames_of(other[0])[0][0] == "site_a"
        assert "test_repeated_and_alternating_stacks_keep_their_own_ids" not in [
            n for n, _ in _frames_of(other[0])]
    finally:
        history.record_memory_history(None)


@pytest.mark.parametrize("stacks", ["python", "all"])
def test_stacks_captured_without_the_gil_are_the_stacks_of_the_moment(stacks):
    """The GIL-released path (torch's, around allocations and frees) reuses
    a last stack only when every frame matches: six sites in turn (more
    than a thread keeps), each capture naming its own site and line; with
    stacks='all' the C frames must match too."""
    from gpumem import _C
    from gpumem.recording import history
    history.record_memory_history(stacks=stacks)
    try:
        def make_site(k):
            ns = {"cap": testext.hist_capture_without_gil}
            exec(compile(f"def site_{k}():\n    return cap(1)\n", f"<site {k}>", "exec"), ns)
            return ns[f"site_{k}"]

        sites = [make_site(k) for k in range(6)]
        # (the interpreter specializes its calls within the first rounds,
        # which changes their C frames: stacks='all' compares later rounds)
        rounds = [[site() for site in sites] for _ in range(12)][-3:]
        assert rounds[0] == rounds[1] == rounds[2]
        assert len(set(rounds[0])) == 6
        for k, tb in enumerate(rounds[0]):
            frames = [f for f in _C._hist_traceback(tb) if f["line"]]  # Python's
            assert (frames[0]["name"], frames[0]["filename"]) == (f"site_{k}", f"<site {k}>")
        # deeper by one frame: another stack, found without a stale match
        assert (lambda: sites[0]())() not in rounds[0]
        # with the GIL and without it: one id for one stack
        both = [(sites[1](), _C._hist_capture(1)) for _ in range(2)]
        assert both[0] == both[1]
        if stacks == "all":  # each with its own C frames
            ca, cb = ([f["name"] for f in _C._hist_traceback(t) if f["line"] == 0]
                      for t in both[0])
            assert ca and cb and ca != cb
    finally:
        history.record_memory_history(None)


def test_entry_frames_of_calls_from_c():
    """Python called back from C (an __init__ through type(), a property, a
    with block's __exit__, a generator driven by yield from and send): on
    3.12 and 3.13 each such call starts with an entry frame the walks skip."""
    got = []

    class Obj:
        def __init__(self):
            got.append(walks())

        @property
        def prop(self):
            got.append(walks())
            return 1

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            got.append(walks())

    with Obj() as o:
        assert o.prop == 1

    def inner():
        x = yield
        got.append(walks())
        yield x

    def outer():
        yield from inner()

    g = outer()
    next(g)
    g.send(5)
    assert len(got) == 4
    for api, direct, used in got:
        assert used is DIRECT
        assert direct == api
        assert api[1][0].co_name in {"__init__", "prop", "__exit__", "inner"}
        assert api[-1][0] is interpreter_view(0)[-1][0]  # the outermost frame
