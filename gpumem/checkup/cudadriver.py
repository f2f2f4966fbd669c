"""The CUDA driver as gpumem's checks see it: libcuda.so.1 through ctypes.

gpumem's allocator reaches the driver through its C backend
(csrc/device/cuda_backend.c).  ``gpumem doctor`` and tests/gpu also read the
driver's own answers (versions, devices, VMM support, cuMemGetInfo) through
this module, a second path that shares no code with the backend, so a
figure the backend produced can be checked against one it did not.

The library is the one the backend loads: $GPUMEM_LIBCUDA, else
``libcuda.so.1``.  Loading it twice gives the same library, so both paths
see one driver state.  ``Driver.simulated`` is True for gpumem's fake driver
(simgpu/driver, which exports ``fakecuda_*`` control functions that no
NVIDIA driver has); ``sim_launcher()`` says whether gpumem.sim started this
process.  ``probe()`` answers "is there a GPU here, and which" without
raising; ``python -m gpumem.checkup.cudadriver`` prints it as JSON, so that a
caller can ask in a fresh process, where nothing loaded earlier can fool it.

Must not: import torch or gpumem's extension, or change the calling
thread's current context (every call that needs one pushes the device's
primary context and pops it).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from contextlib import contextmanager
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any, Iterator, Optional

__all__ = ["Driver", "DriverError", "NoDriver", "library_path", "sim_launcher", "probe",
           "version_text", "NO_GPU_RESULTS", "CUDA_ERROR_NOT_READY"]

CUDA_ERROR_NOT_READY = 600
#: cuInit results that mean "no GPU here" rather than "a broken driver":
#: CUDA_ERROR_NO_DEVICE, and CUDA_ERROR_STUB_LIBRARY (the toolkit's link-time
#: stub libcuda.so found instead of a driver).
NO_GPU_RESULTS = {100: "no CUDA-capable device", 34: "the CUDA toolkit's stub libcuda.so, "
                  "not a driver"}
_ATTR_CC_MAJOR, _ATTR_CC_MINOR, _ATTR_VMM = 75, 76, 102
_STREAM_NON_BLOCKING = 1

_PTR = c_void_p
# name -> argument types (every function returns a CUresult, an int).
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [c_uint],
    "cuDriverGetVersion": [POINTER(c_int)],
    "cuDeviceGetCount": [POINTER(c_int)],
    "cuDeviceGet": [POINTER(c_int), c_int],
    "cuDeviceGetName": [c_char_p, c_int, c_int],
    "cuDeviceTotalMem_v2": [POINTER(c_size_t), c_int],
    "cuDeviceGetAttribute": [POINTER(c_int), c_int, c_int],
    "cuDevicePrimaryCtxRetain": [POINTER(_PTR), c_int],
    "cuDevicePrimaryCtxRelease_v2": [c_int],
    "cuCtxGetCurrent": [POINTER(_PTR)],
    "cuCtxSetCurrent": [_PTR],
    "cuCtxPushCurrent_v2": [_PTR],
    "cuCtxPopCurrent_v2": [POINTER(_PTR)],
    "cuMemGetInfo_v2": [POINTER(c_size_t), POINTER(c_size_t)],
    "cuMemGetAllocationGranularity": [POINTER(c_size_t), c_void_p, c_int],
    "cuMemcpyHtoD_v2": [c_uint64, c_void_p, c_size_t],
    "cuMemcpyDtoH_v2": [c_void_p, c_uint64, c_size_t],
    "cuStreamCreate": [POINTER(_PTR), c_uint],
    "cuStreamDestroy_v2": [_PTR],
    "cuStreamQuery": [_PTR],
    "cuStreamSynchronize": [_PTR],
    "cuLaunchHostFunc": [_PTR, c_void_p, c_void_p],
    "cuEventCreate": [POINTER(_PTR), c_uint],
    "cuEventRecord": [_PTR, _PTR],
    "cuEventDestroy_v2": [_PTR],
    "cuGetErrorName": [c_int, POINTER(c_char_p)],
}


class _Location(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp (CUDA 10.2 to 13)
    _fields_ = [("type", c_int), ("requestedHandleTypes", c_int), ("location", _Location),
                ("win32HandleMetaData", c_void_p), ("allocFlags", _AllocFlags)]


class NoDriver(RuntimeError):
    """The driver library cannot be loaded (no NVIDIA driver on this machine)."""


class DriverError(RuntimeError):
    """A driver call failed; .call, .code and .name say which and how."""

    def __init__(self, call: str, code: int, name: str):
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code, self.name = call, code, name


def library_path() -> str:
    """The driver library gpumem loads: $GPUMEM_LIBCUDA, else libcuda.so.1."""
    return os.environ.get("GPUMEM_LIBCUDA") or "libcuda.so.1"


def sim_launcher() -> Optional[str]:
    """The simulator's library directory if gpumem.sim set this process up, else None."""
    d = os.environ.get("GPUMEM_SIM_LIB_DIR")
    if d and os.path.join(d, "libcuda.so.1") in os.environ.get("LD_PRELOAD", "").split(":"):
        return d
    return None


def version_text(v: int) -> str:
    """cuDriverGetVersion's 13000 -> '13.0'."""
    return f"{v // 1000}.{v % 1000 // 10}"


class Driver:
    """libcuda.so.1 (or $GPUMEM_LIBCUDA) loaded with ctypes; raises NoDriver."""

    def __init__(self, path: Optional[str] = None):
        self.path = path or library_path()
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise NoDriver(f"cannot load the CUDA driver library {self.path} ({e})") from None
        self.simulated = hasattr(self.lib, "fakecuda_query")
        self._fns: dict[str, Any] = {}
        self._contexts: dict[int, c_void_p] = {}
        self._held: Optional[tuple[str, c_void_p]] = None   # hold_stream's, on the simulator

    def has(self, name: str) -> bool:
        return hasattr(self.lib, name)

    def _fn(self, name: str) -> Any:
        fn = self._fns.get(name)
        if fn is None:
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = _SIGNATURES[name], c_int
            self._fns[name] = fn
        return fn

    def error_name(self, code: int) -> str:
        s = c_char_p()
        if self.has("cuGetErrorName") and self._fn("cuGetErrorName")(code, byref(s)) == 0 \
                and s.value:
            return s.value.decode()
        return "CUDA_ERROR"

    def call(self, name: str, *args: Any) -> int:
        """Call name(*args); raise DriverError unless it returns CUDA_SUCCESS."""
        if not self.has(name):
            raise DriverError(name, -1, "not exported by " + self.path)
        r = self._fn(name)(*args)
        if r != 0:
            raise DriverError(name, r, self.error_name(r))
        return r

    def query(self, name: str, *args: Any) -> int:
        """Call name(*args) and return its CUresult (for calls where NOT_READY is an answer)."""
        return self._fn(name)(*args)

    # ------------------------------------------------------------ devices

    def init(self) -> None:
        self.call("cuInit", 0)

    def version(self) -> int:
        v = c_int()
        self.call("cuDriverGetVersion", byref(v))
        return v.value

    def device_count(self) -> int:
        n = c_int()
        self.call("cuDeviceGetCount", byref(n))
        return n.value

    def _attribute(self, attr: int, dev: int) -> int:
        v = c_int()
        self.call("cuDeviceGetAttribute", byref(v), attr, dev)
        return v.value

    def _handle(self, index: int) -> int:
        """The CUdevice of an ordinal."""
        dev = c_int()
        self.call("cuDeviceGet", byref(dev), index)
        return dev.value

    def device(self, index: int) -> dict[str, Any]:
        """name, total_memory, compute_capability, vmm and vmm_granularity of one GPU."""
        dev = self._handle(index)
        name = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", name, 256, dev)
        total = c_size_t()
        self.call("cuDeviceTotalMem_v2", byref(total), dev)
        vmm = bool(self._attribute(_ATTR_VMM, dev))
        return {"index": index, "name": name.value.decode(errors="replace"),
                "total_memory": total.value,
                "compute_capability": f"{self._attribute(_ATTR_CC_MAJOR, dev)}."
                                      f"{self._attribute(_ATTR_CC_MINOR, dev)}",
                "vmm": vmm, "vmm_granularity": self.granularity(index) if vmm else None}

    def granularity(self, index: int) -> int:
        prop = _AllocationProp()
        prop.type = 1            # CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = 1   # CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = index
        g = c_size_t()
        with self.context(index):
            self.call("cuMemGetAllocationGranularity", byref(g), byref(prop), 0)
        return g.value

    # ------------------------------------------------------------ contexts

    def primary(self, index: int) -> int:
        """The device's primary context (a handle), retained on first use and kept
        until close(): a primary context whose last reference goes is destroyed,
        with its streams and events."""
        ctx = self._contexts.get(index)
        if ctx is None:
            ctx = c_void_p()
            self.call("cuDevicePrimaryCtxRetain", byref(ctx), self._handle(index))
            self._contexts[index] = ctx
        return ctx.value or 0

    def current_context(self) -> int:
        """The calling thread's current context (0 for none)."""
        ctx = c_void_p()
        self.call("cuCtxGetCurrent", byref(ctx))
        return ctx.value or 0

    def set_current(self, ctx: int) -> None:
        self.call("cuCtxSetCurrent", ctx)

    @contextmanager
    def context(self, index: int) -> Iterator[None]:
        """The device's primary context, current for the block, then popped."""
        self.call("cuCtxPushCurrent_v2", self.primary(index))
        try:
            yield
        finally:
            self.call("cuCtxPopCurrent_v2", byref(c_void_p()))

    def close(self) -> None:
        """Release the primary contexts this object retained."""
        for index in list(self._contexts):
            del self._contexts[index]
            self.call("cuDevicePrimaryCtxRelease_v2", self._handle(index))

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of the device: cuMemGetInfo in its primary context."""
        free, total = c_size_t(), c_size_t()
        with self.context(index):
            self.call("cuMemGetInfo_v2", byref(free), byref(total))
        return free.value, total.value

    def used(self, index: int) -> int:
        free, total = self.mem_get_info(index)
        return total - free

    def copy_in(self, index: int, ptr: int, data: bytes) -> None:
        with self.context(index):
            self.call("cuMemcpyHtoD_v2", ptr, data, len(data))

    def copy_out(self, index: int, ptr: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        with self.context(index):
            self.call("cuMemcpyDtoH_v2", buf, ptr, n)
        return buf.raw

    # ------------------------------------------------------------ streams

    def stream_create(self, index: int) -> int:
        """A non-blocking stream in the device's primary context."""
        s = c_void_p()
        with self.context(index):
            self.call("cuStreamCreate", byref(s), _STREAM_NON_BLOCKING)
        return s.value or 0

    def stream_destroy(self, index: int, stream: int) -> None:
        with self.context(index):
            self.call("cuStreamDestroy_v2", stream)

    def stream_busy(self, index: int, stream: int) -> bool:
        """True while work queued on the stream has not completed (cuStreamQuery)."""
        with self.context(index):
            r = self.query("cuStreamQuery", stream)
        if r not in (0, CUDA_ERROR_NOT_READY):
            raise DriverError("cuStreamQuery", r, self.error_name(r))
        return r == CUDA_ERROR_NOT_READY

    def stream_synchronize(self, index: int, stream: int) -> None:
        with self.context(index):
            self.call("cuStreamSynchronize", stream)

    def hold_stream(self, index: int, stream: int, seconds: float) -> str:
        """Keep `stream` busy for a while, without a kernel; says how.

        A GPU: a host function (libc's usleep) queued on the stream, which
        stays busy until it returns.  The simulated driver runs nothing: its
        event mode becomes "never" and an event is recorded on the stream,
        so the stream, and every event recorded on it after, stays busy until
        the stream is synchronized.  release_hold() undoes it.
        """
        with self.context(index):
            if self.simulated:
                self._held = (self.sim_config().get("events", "timeline"), c_void_p())
                self.lib.fakecuda_set_event_mode(b"never")
                self.call("cuEventCreate", byref(self._held[1]), 2)  # DISABLE_TIMING
                self.call("cuEventRecord", self._held[1], stream)
                return "simulated events held until the stream is synchronized"
            usleep = ctypes.cast(ctypes.CDLL(None).usleep, c_void_p)
            self.call("cuLaunchHostFunc", stream, usleep, int(seconds * 1e6))
        return f"a {seconds:g} s host function queued on the stream"

    def release_hold(self, index: int) -> None:
        held, self._held = self._held, None
        if held:
            self.lib.fakecuda_set_event_mode(held[0].encode())
            if held[1].value:
                with self.context(index):
                    self.call("cuEventDestroy_v2", held[1])

    def sim_config(self) -> dict[str, Any]:
        """The simulated driver's configuration (its JSON report's "config")."""
        fn = self.lib.fakecuda_report_json
        fn.argtypes, fn.restype = [c_char_p, c_size_t], c_int
        n = fn(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        fn(buf, n + 1)
        return json.loads(buf.value.decode()).get("config", {})


def probe() -> dict[str, Any]:
    """What driver and GPUs this process can reach; never raises.

    Keys: present (a GPU, real or simulated, can be used), reason (one
    sentence when not), path, simulated, launcher (gpumem.sim's directory or
    None), version (cuDriverGetVersion, or None), error (a broken driver's
    failure, or None), gpus (Driver.device of each, with free_memory).
    """
    out: dict[str, Any] = {"present": False, "reason": "", "path": library_path(),
                           "simulated": False, "launcher": sim_launcher(), "version": None,
                           "error": None, "gpus": []}
    try:
        drv = Driver()
    except NoDriver as e:
        out["reason"] = f"no NVIDIA driver: {e}"
        return out
    out["simulated"] = drv.simulated
    try:
        out["version"] = drv.version()
        drv.init()
        out["gpus"] = [drv.device(i) for i in range(drv.device_count())]
        for g in out["gpus"]:
            g["free_memory"] = drv.mem_get_info(g["index"])[0]
        drv.close()
    except DriverError as e:
        if e.call == "cuInit" and e.code in NO_GPU_RESULTS:
            out["reason"] = f"no GPU: cuInit says {e.name} ({NO_GPU_RESULTS[e.code]})"
        else:
            out["error"] = str(e)
            out["reason"] = f"the CUDA driver {drv.path} does not work: {e}"
        return out
    if not out["gpus"]:
        out["reason"] = "no GPU: the CUDA driver reports 0 devices"
        return out
    out["present"] = True
    return out


if __name__ == "__main__":  # python -m gpumem.checkup.cudadriver: probe() as one JSON line
    print(json.dumps(probe()))
    sys.exit(0)
