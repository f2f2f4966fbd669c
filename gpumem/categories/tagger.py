"""Memory by category while gpumem records: what each allocation is for.

``record_memory_history(..., categories=True)`` (or ``gpumem.record(...,
categories=True)``, ``gpumem simulate --categories``) notes, in the event
ring's numbering (``_C._hist_seq``), what torch shows at run time, with a
few Python calls per training step rather than per module call or saved
tensor (Note [Categories at a few calls per step]):

- phases: forward starts at the first module call after recording starts,
  after a backward and after an optimizer step (a global forward pre-hook
  that removes itself when it fires); backward starts when
  ``torch.autograd.backward`` or ``torch.autograd.grad`` is entered (gpumem
  wraps both while categories are on); the optimizer phase is
  ``Optimizer.step`` (global step pre/post hooks);
- parameter: the parameters and buffers of that first-called module and the
  parameters of every optimizer that steps, tagged the first time each is
  seen and again when a snapshot is taken;
- input: the tensors passed to that first-called module;
- gradient: every ``p.grad`` of the optimizer's parameters when it steps (of
  the first-called modules' parameters after a backward, while no optimizer
  has stepped), and those live when a snapshot is taken;
- optimizer_state: the tensors in ``optimizer.state`` after an optimizer's
  first step (again when its state grows, and at a snapshot);
- the rest from the phase, when the snapshot is taken (gpumem.categories.classify):
  an activation is allocated in forward and still alive when the next
  backward starts, a temporary is freed before.

Nothing is added to the allocation path, and the allocation a tag belongs to
is found only when a snapshot is taken (Note [Categories follow the
allocation]).  Opt-in because these are global hooks inside torch and a
wrapper around its two backward entry points.

The snapshot gains one top-level key, ``gpumem_categories`` (table()).

Note [Categories at a few calls per step]
Rationale: torch calls a global module hook on every module call (and sends
  every call through Module._call_impl's slow path while one is registered),
  a saved-tensors hook on every saved tensor and a post-accumulate-grad hook
  per parameter; on a small Transformer their dispatch alone cost about as
  much as recording's own per-allocation cost.
Approach: mark the phases (one call at each boundary), tag the few tensors
  torch names (parameters, gradients, state) in bulk at those boundaries and
  at the snapshot, and decide activation against temporary from when the
  allocation is freed (gpumem.categories.classify), not from autograd's hooks.
Limitations: a tensor kept alive from forward into backward that autograd
  did not save is an activation; a loop with no backward and no optimizer
  marks forward only once (its first module call); optimizer state that a
  step replaces by a new tensor without growing the state is found from the
  phase (allocated in the step, alive after it); a module called before the
  model in a step (outside it) is taken for the model."""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any, Callable, Iterable, Optional

from gpumem import _C
from gpumem.categories.classify import (CATEGORIES, PHASES, TABLE_KEY, block_categories,
                                        resolve_device)

__all__ = ["enable", "disable", "enabled", "table", "TABLE_KEY", "CATEGORIES", "PHASES",
           "CategoriesError"]

_COMPACT_AT = 200_000
_MAX_DEVICES = 64   # GM_HIST_MAX_DEVICES: devices the history numbers events on

log = logging.getLogger("gpumem")


def _never_raises(fn: Callable) -> Callable:
    """A hook runs inside the user's training step: a failure of ours is
    logged once and the step goes on."""
    @functools.wraps(fn)
    def hook(self: "_Tagger", *args: Any) -> Any:
        try:
            return fn(self, *args)
        except Exception as e:  # noqa: BLE001 - see the docstring
            if not self.failed:
                self.failed = True
                log.warning("gpumem categories: the %s hook failed (%s: %s); categories of "
                            "this run may be incomplete", fn.__name__, type(e).__name__, e)
            return None
    return hook


class CategoriesError(RuntimeError):
    """Categories asked for where they cannot be recorded (no torch)."""


class _Tagger:
    """The hooks and what they noted (protected by: its lock; the hooks run on
    the main thread and on autograd's threads)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.lock = threading.Lock()
        self.tags: dict[int, list] = {}     # device -> [(seq, addr, role)]
        self.phases: dict[int, list] = {}   # device -> [(seq, phase)]
        self.phase = "other"
        self.depth = 0                      # backward calls in progress
        self.modules: "weakref.WeakSet" = weakref.WeakSet()     # first-called modules
        self.optimizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # -> len(state)
        self.arm_handle: Any = None
        self.handles: list = []
        self.wrapped: list = []             # (owner, name, original, our wrapper)
        self.devices = min(_MAX_DEVICES, max(1, torch.cuda.device_count()))
        self.active = False
        self.failed = False

    # -------------------------------------------------------------- notes
    def set_phase(self, phase: str) -> None:
        if phase == self.phase:
            return
        with self.lock:
            self.phase = phase
            for d in range(self.devices):
                self.phases.setdefault(d, []).append((_C._hist_seq(d), phase))

    def tag_all(self, tensors: Iterable, role: str) -> None:
        """Tag every CUDA tensor of ``tensors`` (None and others skipped) at
        the current event number of its device (one number per device and
        call: nothing is allocated in between)."""
        ts = tensors if isinstance(tensors, list) else list(tensors)
        try:
            found = [(t.get_device(), t.untyped_storage().data_ptr())
                     for t in ts if t is not None and t.is_cuda]
        except (RuntimeError, NotImplementedError):  # sparse, meta, wrappers: one by one
            found = [f for f in map(_address, ts) if f is not None]
        if not found:
            return
        with self.lock:
            for d in {d for d, _ in found}:
                if d >= _MAX_DEVICES:
                    continue
                seq = _C._hist_seq(d)
                lst = self.tags.setdefault(d, [])
                lst.extend([(seq, ptr, role) for dd, ptr in found if dd == d and ptr])
                if len(lst) > _COMPACT_AT:
                    self.tags[d] = _compact(lst, d)

    def tag_module(self, m: Any) -> None:
        self.tag_all(m.parameters(), "parameter")
        self.tag_all(m.buffers(), "parameter")

    def tag_state(self, opt: Any) -> None:
        T = self.torch.Tensor
        self.tag_all((v for s in opt.state.values() for v in s.values() if isinstance(v, T)),
                     "optimizer_state")

    def tag_live(self) -> None:
        """At a snapshot: every parameter, buffer, gradient and optimizer
        state tensor torch still holds (names the allocations live now)."""
        for m in list(self.modules):
            self.tag_module(m)
            self.tag_all((p.grad for p in m.parameters()), "gradient")
        for opt in list(self.optimizers.keys()):
            params = [p for g in opt.param_groups for p in g["params"]]
            self.tag_all(params, "parameter")
            self.tag_all((p.grad for p in params), "gradient")
            self.tag_state(opt)

    # -------------------------------------------------------------- hooks
    def arm(self) -> None:
        """Mark forward at the next module call."""
        if self.arm_handle is None and self.active:
            mod = self.torch.nn.modules.module
            self.arm_handle = mod.register_module_forward_pre_hook(self.forward_start)

    @_never_raises
    def forward_start(self, module: Any, args: Any) -> None:
        h, self.arm_handle = self.arm_handle, None
        if h is not None:
            h.remove()
        self.set_phase("forward")
        self.tag_all(_flat(args), "input")
        if module not in self.modules:
            self.modules.add(module)
            self.tag_module(module)

    @_never_raises
    def backward_start(self) -> None:
        self.depth += 1
        self.set_phase("backward")

    @_never_raises
    def backward_end(self) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth:
            return
        self.arm()
        if not self.optimizers:   # no optimizer to tag them at its step
            self.tag_all((p.grad for m in list(self.modules) for p in m.parameters()),
                         "gradient")

    @_never_raises
    def step_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.set_phase("optimizer")
        params = [p for g in opt.param_groups for p in g["params"]]
        if opt not in self.optimizers:
            self.optimizers[opt] = -1
            self.tag_all(params, "parameter")
        self.tag_all([p.grad for p in params], "gradient")

    @_never_raises
    def step_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        n = len(opt.state)
        if self.optimizers.get(opt) != n:
            self.optimizers[opt] = n
            self.tag_state(opt)
        self.set_phase("other")
        self.arm()

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        tagger = self

        @functools.wraps(original)
        def entry(*args: Any, **kwargs: Any) -> Any:
            if not tagger.active:
                return original(*args, **kwargs)
            tagger.backward_start()
            try:
                return original(*args, **kwargs)
            finally:
                tagger.backward_end()

        setattr(owner, name, entry)
        self.wrapped.append((owner, name, original, entry))

    # ------------------------------------------------------------ install
    def install(self) -> None:
        torch = self.torch
        from torch.optim import optimizer as opt
        self.active = True
        self.handles.append(opt.register_optimizer_step_pre_hook(self.step_pre))
        self.handles.append(opt.register_optimizer_step_post_hook(self.step_post))
        self._wrap(torch.autograd, "backward")
        self._wrap(torch.autograd, "grad")
        self.arm()

    def uninstall(self) -> None:
        self.active = False
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if self.arm_handle is not None:
            self.arm_handle.remove()
            self.arm_handle = None
        for owner, name, original, entry in reversed(self.wrapped):
            if getattr(owner, name, None) is entry:
                setattr(owner, name, original)
            # else wrapped again by someone else: ours stays in the chain and,
            # inactive, only calls through
        self.wrapped.clear()

    def clear(self) -> None:
        with self.lock:
            self.tags.clear()
            self.phases.clear()
        self.modules = weakref.WeakSet()
        self.optimizers = weakref.WeakKeyDictionary()
        self.phase = "other"
        self.arm()


def _address(t: Any) -> Optional[tuple]:
    """(device, storage address) of a CUDA tensor, None for anything else."""
    if t is None or not getattr(t, "is_cuda", False):
        return None
    try:
        return t.get_device(), t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


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
    if t is not None:
        try:
            t.tag_live()
        except Exception as e:  # noqa: BLE001 - a snapshot is never lost to a tag
            log.warning("gpumem categories: tagging at the snapshot failed (%s: %s)",
                        type(e).__name__, e)
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
