"""Memory by category while gpumem records: what each allocation is for.

``record_memory_history(..., categories=True)`` (or ``gpumem.record(...,
categories=True)``, ``gpumem simulate --categories``) installs global torch
hooks that note, in the event ring's numbering (``_C._hist_seq``), what torch
shows at run time:

- parameter: the parameters of every module a forward runs (global forward
  pre-hook) and of every optimizer that steps;
- gradient: ``p.grad`` after autograd accumulates it (a post-accumulate-grad
  hook on each parameter seen) and when an optimizer steps;
- optimizer_state: every tensor in ``optimizer.state`` after a step (global
  optimizer step post-hook);
- input: the tensors passed to the outermost module's forward;
- activation: tensors autograd saves for backward (default saved-tensors
  hooks, pushed on the thread that turned categories on);
- and the phase: forward (outermost module forward starts), backward (autograd
  unpacks a saved tensor or accumulates a gradient), optimizer (step).

Nothing is added to the allocation path: the hooks cost Python time per
module call, saved tensor, gradient and step, and the allocation an event
belongs to is found only when a snapshot is taken (gpumem._categorize,
Note [Categories follow the allocation]).  Opt-in because these are global
hooks inside torch: saved-tensors hooks change what autograd stores (the
same tensors, through a hook), and torch.compile refuses to trace under them.

The snapshot gains one top-level key, ``gpumem_categories`` (table())."""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any, Callable, Optional

from gpumem import _C
from gpumem._categorize import (CATEGORIES, PHASES, TABLE_KEY, block_categories,
                                resolve_device)

__all__ = ["enable", "disable", "enabled", "table", "TABLE_KEY", "CATEGORIES", "PHASES",
           "CategoriesError"]

_COMPACT_AT = 200_000
_MAX_DEVICES = 64   # GM_HIST_MAX_DEVICES: devices the history numbers events on

log = logging.getLogger("gpumem")


def _never_raises(fn: Callable) -> Callable:
    """A hook runs inside the user's training step: a failure of ours is
    logged once and the step goes on (a pack hook still returns its tensor)."""
    @functools.wraps(fn)
    def hook(self: "_Tagger", *args: Any) -> Any:
        try:
            return fn(self, *args)
        except Exception as e:  # noqa: BLE001 - see the docstring
            if not self.failed:
                self.failed = True
                log.warning("gpumem categories: the %s hook failed (%s: %s); categories of "
                            "this run may be incomplete", fn.__name__, type(e).__name__, e)
            return args[0] if fn.__name__ in ("pack", "unpack") else None
    return hook


class CategoriesError(RuntimeError):
    """Categories asked for where they cannot be recorded (no torch)."""


class _IdMap:
    """Values keyed by a tensor's identity, dropped when the tensor dies
    (a WeakKeyDictionary compares keys with ==, which tensors make elementwise)."""

    def __init__(self) -> None:
        self.data: dict[int, tuple] = {}

    def get(self, t: Any) -> Any:
        v = self.data.get(id(t))
        return v[1] if v is not None and v[0]() is t else None

    def set(self, t: Any, value: Any) -> None:
        key = id(t)
        data = self.data
        self.data[key] = (weakref.ref(t, lambda _r, key=key: data.pop(key, None)), value)

    def values(self) -> list:
        return [v[1] for v in list(self.data.values())]


class _Tagger:
    """The hooks and what they noted (protected by: its lock; the hooks run on
    the main thread and on autograd's threads)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.lock = threading.Lock()
        self.tags: dict[int, list] = {}     # device -> [(seq, addr, role)]
        self.phases: dict[int, list] = {}   # device -> [(seq, phase)]
        self.phase = "other"
        self.depth = 0
        self.seen = _IdMap()         # tensor -> storage address it was tagged with
        self.grad_hooked = _IdMap()  # parameter -> its post-accumulate-grad hook
        self.handles: list = []
        self.saved_hooks_thread: Optional[int] = None
        self.devices = min(_MAX_DEVICES, max(1, torch.cuda.device_count()))
        self.failed = False

    # -------------------------------------------------------------- notes
    def set_phase(self, phase: str) -> None:
        if phase == self.phase:
            return
        with self.lock:
            self.phase = phase
            for d in range(self.devices):
                self.phases.setdefault(d, []).append((_C._hist_seq(d), phase))

    def tag(self, t: Any, role: str) -> None:
        if not (isinstance(t, self.torch.Tensor) and t.is_cuda):
            return
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # sparse, meta, functional wrappers
            return
        if not ptr:
            return
        d = t.device.index or 0
        if d >= _MAX_DEVICES:
            return
        with self.lock:
            lst = self.tags.setdefault(d, [])
            lst.append((_C._hist_seq(d), ptr, role))
            if len(lst) > _COMPACT_AT:
                self.tags[d] = _compact(lst, d)

    def tag_once(self, t: Any, role: str) -> None:
        """Tag t unless this very tensor was tagged with the same storage
        (parameters and optimizer state keep their storage step after step)."""
        try:
            ptr = t.untyped_storage().data_ptr()
            if self.seen.get(t) == ptr:
                return
            self.seen.set(t, ptr)
        except (RuntimeError, NotImplementedError, TypeError):
            pass
        self.tag(t, role)

    # -------------------------------------------------------------- hooks
    @_never_raises
    def forward_pre(self, module: Any, args: Any) -> None:
        if self.depth == 0:
            self.set_phase("forward")
            for a in _flat(args):
                self.tag(a, "input")
        self.depth += 1
        for p in module._parameters.values():
            if p is None:
                continue
            self.tag_once(p, "parameter")
            if p.requires_grad and self.grad_hooked.get(p) is None:
                self.grad_hooked.set(p, p.register_post_accumulate_grad_hook(self.grad_ready))

    @_never_raises
    def forward_post(self, module: Any, args: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)

    @_never_raises
    def grad_ready(self, p: Any) -> None:
        self.set_phase("backward")
        if p.grad is not None:
            self.tag_once(p.grad, "gradient")

    @_never_raises
    def pack(self, t: Any) -> Any:
        self.tag(t, "activation")
        return t

    @_never_raises
    def unpack(self, t: Any) -> Any:
        if self.phase != "backward":
            self.set_phase("backward")
        return t

    @_never_raises
    def step_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.set_phase("optimizer")
        for group in opt.param_groups:
            for p in group["params"]:
                self.tag_once(p, "parameter")
                if p.grad is not None:
                    self.tag_once(p.grad, "gradient")

    @_never_raises
    def step_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, self.torch.Tensor):
                    self.tag_once(v, "optimizer_state")
        self.set_phase("other")

    # ------------------------------------------------------------ install
    def install(self) -> None:
        torch = self.torch
        mod = torch.nn.modules.module
        self.handles.append(mod.register_module_forward_pre_hook(self.forward_pre))
        self.handles.append(mod.register_module_forward_hook(self.forward_post, always_call=True))
        from torch.optim import optimizer as opt
        self.handles.append(opt.register_optimizer_step_pre_hook(self.step_pre))
        self.handles.append(opt.register_optimizer_step_post_hook(self.step_post))
        torch._C._autograd._push_saved_tensors_default_hooks(self.pack, self.unpack)
        self.saved_hooks_thread = threading.get_ident()

    def uninstall(self) -> None:
        for h in self.handles:
            h.remove()
        for h in self.grad_hooked.values():
            h.remove()
        self.handles.clear()
        self.grad_hooked = _IdMap()
        if self.saved_hooks_thread == threading.get_ident():
            self.torch._C._autograd._pop_saved_tensors_default_hooks()
        # else: the hooks stay on that thread; they only tag, and tag nothing
        # once _TAGGER is gone (pack checks nothing else)
        self.saved_hooks_thread = None

    def clear(self) -> None:
        with self.lock:
            self.tags.clear()
            self.phases.clear()
            self.seen = _IdMap()


def _flat(x: Any, depth: int = 0) -> list:
    if isinstance(x, (list, tuple)) and depth < 2:
        return [y for v in x for y in _flat(v, depth + 1)]
    if isinstance(x, dict) and depth < 2:
        return [y for v in x.values() for y in _flat(v, depth + 1)]
    return [x]


def _compact(tags: list, device: int) -> list:
    """Drop the tags no snapshot can use: those older than the ring's window,
    except the newest per address (a block allocated before the window)."""
    cfg = _C._hist_config()
    oldest = _C._hist_seq(device) - int(cfg["max_entries"])
    keep = [t for t in tags if t[0] >= oldest]
    newest: dict[tuple, tuple] = {}
    for t in tags:
        if t[0] < oldest:
            newest[(t[1], t[2])] = t
    return sorted(newest.values()) + keep


_TAGGER: Optional[_Tagger] = None


def enabled() -> bool:
    """Whether categories are being recorded."""
    return _TAGGER is not None


def enable(clear: bool = False) -> None:
    """Install the hooks (no-op when installed; ``clear`` drops what was noted)."""
    global _TAGGER
    if _TAGGER is None:
        try:
            import torch
        except ImportError as e:
            raise CategoriesError(f"categories need torch ({e})") from None
        t = _Tagger(torch)
        t.install()
        _TAGGER = t
    elif clear:
        _TAGGER.clear()


def disable() -> None:
    """Remove the hooks and forget what they noted."""
    global _TAGGER
    t, _TAGGER = _TAGGER, None
    if t is not None:
        t.uninstall()


def table(segments: list, device_traces: list, first_seqs: list) -> dict:
    """The snapshot's ``gpumem_categories`` entry.

    {'version': 1, 'categories': CATEGORIES, 'phases': PHASES,
     'device_traces': per device a list parallel to device_traces[d]: the
        category index of each alloc/free_requested/free_completed (the
        allocation's), None for other actions,
     'trace_phases': per device, the phase index each event happened in,
     'segments': per segment a list parallel to its blocks: the category
        index of each active block, None for inactive ones}
    """
    t = _TAGGER
    with (t.lock if t else threading.Lock()):
        tags = {d: list(v) for d, v in (t.tags.items() if t else ())}
        phases = {d: list(v) for d, v in (t.phases.items() if t else ())}
    cats, phs, pres = [], [], []
    for d, events in enumerate(device_traces):
        first = first_seqs[d] if d < len(first_seqs) else 0
        c, p, pre = resolve_device(events, first, tags.get(d, ()), phases.get(d, ()))
        cats.append(c)
        phs.append(p)
        pres.append(pre)
    return {"version": 1, "categories": list(CATEGORIES), "phases": list(PHASES),
            "device_traces": cats, "trace_phases": phs,
            "segments": block_categories(segments, device_traces, cats, pres)}
