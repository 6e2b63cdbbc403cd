# SPDX-License-Identifier: MIT
"""Launching compiled kernels by raw pointers, without torch: a kernel's runtime arguments are
declared once as a `Signature` (name, kind, element type and alignment of each), which builds
the placeholders it is compiled against, checks the fast packing against the DSL's own and
launches by name (`Launcher`); `KernelCache` compiles each configuration once per process
(`compile.COMPILE_LOCK`). `kernels/` import this module, never torch; `tk_cute.runtime` adds the
torch side (views of tensors, streams, workspaces, device facts).
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from tk_cute.compile import COMPILE_LOCK

OUT_ALIGN = 16  # bytes: kernels write outputs with 16-byte vector stores or TMA
BOUND_KEPT = 256  # bound launchers kept per kernel (`Launcher.bind`)


class KernelCache:
    """Compiled kernels by key; `get(key, build)` compiles on first use (build() -> callable).

    Thread-safe: a miss takes `COMPILE_LOCK` (the DSL cannot compile two programs at once) and
    looks again, so each key is built once; hits take no lock."""

    def __init__(self):
        self._kernels: dict = {}
        self.compile_seconds: dict = {}

    def get(self, key, build):
        fn = self._kernels.get(key)
        if fn is not None:
            return fn
        with COMPILE_LOCK:
            fn = self._kernels.get(key)
            if fn is None:
                start = time.perf_counter()
                fn = build()
                self.compile_seconds[key] = time.perf_counter() - start
                self._kernels[key] = fn
        return fn

    def __len__(self) -> int:
        return len(self._kernels)


def compile_locked(fn, *args, **kwargs):
    """`cute.compile(fn, *args, **kwargs)` under `COMPILE_LOCK`."""
    with COMPILE_LOCK:
        return cute.compile(fn, *args, **kwargs)


# ---------------------------------------------------------------- raw-pointer launches
# A kernel compiled against placeholder pointers takes plain addresses at run time, one ctypes
# slot per argument (the stream last).
_SLOTS = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64}


@dataclass(frozen=True)
class Arg:
    """One runtime argument: `kind` "ptr" (a global-memory address of `dtype` elements, assumed
    `align`-byte aligned), "i32" or "i64"."""

    name: str
    kind: str
    dtype: object = None
    align: int = 16


def ptr(name: str, dtype, align: int = 16) -> Arg:
    return Arg(name, "ptr", dtype, align)


def i32(name: str) -> Arg:
    return Arg(name, "i32")


def i64(name: str) -> Arg:
    return Arg(name, "i64")


def placeholder_ptr(dtype, align: int = 16):
    """A global-memory pointer of `dtype` (assumed `align`-byte aligned) to compile against."""
    return cute.runtime.make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=align)


class Signature:
    """The runtime argument list of a raw-pointer kernel launch, declared once, the stream
    implied last. It builds the placeholders to compile against (`compile_args`), compiles
    (`compile`) and names the slots a `Launcher` packs."""

    def __init__(self, *args: Arg):
        names = [a.name for a in args]
        if len(set(names)) != len(names) or "stream" in names:
            raise ValueError(f"Signature argument names must be unique (stream is implied): "
                             f"{names}")
        self.args = args
        self.names = tuple(names)
        self.keys = frozenset(names) | {"stream"}
        self._slots = tuple(_SLOTS[a.kind] for a in args) + (ctypes.c_void_p,)

    def placeholders(self) -> list:
        """Fake pointers and integers of the declared kinds (no GPU needed)."""
        out = []
        for a in self.args:
            if a.kind == "ptr":
                out.append(placeholder_ptr(a.dtype, a.align))
            else:
                out.append((cutlass.Int32 if a.kind == "i32" else cutlass.Int64)(1))
        return out

    def compile_args(self, *constexpr) -> tuple:
        """What `cute.compile(launch_fn, ...)` takes: the leading compile-time arguments (e.g.
        the Config), the placeholders and a null stream."""
        from cuda.bindings import driver

        return (*constexpr, *self.placeholders(), driver.CUstream(0))

    def compile(self, fn, *constexpr, options: str = "") -> "Launcher":
        """`fn` compiled against the placeholders into a `Launcher` whose packing has been
        checked against the DSL's own (`options`: e.g. "--gpu-arch sm_90a" without a GPU)."""
        launcher = Launcher(compile_locked(fn, *self.compile_args(*constexpr), options=options),
                            self)
        launcher.check_against_dsl()
        return launcher

    def pack(self, values: dict):
        if len(values) != len(self._slots) or any(n not in values for n in self.names):
            raise TypeError(f"launch arguments are {self.names + ('stream',)}, got "
                            f"{tuple(values)}")
        slots = [cls(values[n]) for n, cls in zip(self.names, self._slots)]
        slots.append(ctypes.c_void_p(values["stream"]))
        return slots, [ctypes.addressof(s) for s in slots]

    def sample_values(self) -> dict:
        """Distinct, suitably aligned sample values of every argument (for the packing check)."""
        values = {a.name: 4096 * (i + 1) if a.kind == "ptr" else 7 + i
                  for i, a in enumerate(self.args)}
        values["stream"] = 128
        return values

    def dsl_values(self, values: dict) -> list:
        """The same runtime values as DSL objects, as `cute.compile`'s result takes them."""
        from cuda.bindings import driver

        out = []
        for a in self.args:
            v = values[a.name]
            if a.kind == "ptr":
                out.append(cute.runtime.make_ptr(a.dtype, v, cute.AddressSpace.gmem,
                                                 assumed_align=a.align))
            else:
                out.append((cutlass.Int32 if a.kind == "i32" else cutlass.Int64)(v))
        out.append(driver.CUstream(values["stream"]))
        return out


class Launcher:
    """A compiled function called with its argument slots packed directly, by name: the DSL's
    `generate_execution_args` costs ~6 us per call plus ~1 us per runtime object, DLPack views
    ~10-20 us per tensor, and its `run_compiled_program` (a lock, a per-argument conversion
    loop) ~4 us more than the compiled host function it calls. So each thread keeps its slots
    in one array of 8-byte cells (written in place, i32 in the low half: little-endian, as the
    slots' ctypes) and, once the DSL has built its executor on the first call, calls that
    executor's compiled host function on a packed-argument array made once (`_direct`);
    objects without one (test doubles) keep `run_compiled_program`.

    `bind(**fixed)` gives the same kernel with some arguments fixed: written once per thread,
    so a prepared call (`tk_cute.nvfp4.gemm.Call`) passes only what changes per call (the
    activations, D, the stream)."""

    def __init__(self, compiled, signature: Signature, fixed: dict | None = None):
        self.compiled, self.signature = compiled, signature
        self.fixed = dict(fixed or {})
        self._tls = threading.local()
        names = signature.names + ("stream",)
        masks = [(1 << 32) - 1 if cls is ctypes.c_int32 else (1 << 64) - 1
                 for cls in signature._slots]
        self._cells = tuple(zip(range(len(names)), names, masks))
        self._free = tuple(c for c in self._cells if c[1] not in self.fixed)
        self._free_keys = frozenset(n for _, n, _ in self._free)
        unknown = self.fixed.keys() - set(names)
        if unknown:
            raise TypeError(f"launch arguments are {names}, bound {sorted(unknown)}")
        self._ranges = [(-(1 << 31), (1 << 31) - 1) if cls is ctypes.c_int32 else
                        (-(1 << 63), (1 << 63) - 1) if cls is ctypes.c_int64 else (0, (1 << 64) - 1)
                        for cls in signature._slots]
        self._bound: dict = {}  # `bind`'s launchers by fixed values
        self._lock = threading.Lock()

    def bind(self, **fixed) -> Launcher:
        """This kernel with `fixed` arguments written once; a call passes the others. Kept per
        fixed values (the last BOUND_KEPT): binding the same values again, as a path's
        per-call entry does, gives the launcher whose slots and executor are already made."""
        taken = fixed.keys() - self._free_keys
        if taken:
            raise TypeError(f"{sorted(taken)} are not free arguments of this launch "
                            f"(free: {sorted(self._free_keys)})")
        key = tuple(sorted(fixed.items()))
        bound = self._bound.get(key)
        if bound is None:
            for (lo, hi), n in zip(self._ranges, self.signature.names):
                if n in fixed and not lo <= fixed[n] <= hi:
                    raise ValueError(f"launch argument {n}={fixed[n]} is outside its slot's "
                                     f"range [{lo}, {hi}]")
            bound = Launcher(self.compiled, self.signature, {**self.fixed, **fixed})
            with self._lock:
                while len(self._bound) >= BOUND_KEPT:
                    self._bound.pop(next(iter(self._bound)))
                self._bound[key] = bound
        return bound

    def check_against_dsl(self, values: dict | None = None) -> None:
        """Raise unless our slots hold what the DSL's own packing holds (once per kernel)."""
        values = values or self.signature.sample_values()
        dsl_args = tuple(self.signature.dsl_values(values))  # alive while exe points into it
        exe, _ = self.compiled.execution_args.generate_execution_args(dsl_args, {})
        slots, ours = self.signature.pack(values)
        if len(exe) != len(ours):
            raise RuntimeError(f"DSL packs {len(exe)} arguments, the signature {len(ours)}")
        for cls, a, b in zip(self.signature._slots, exe, ours):
            size = ctypes.sizeof(cls)
            addr = a.value if isinstance(a, ctypes.c_void_p) else a
            if ctypes.string_at(addr, size) != ctypes.string_at(b, size):
                raise RuntimeError("DSL argument packing differs from the signature's")
        del dsl_args

    def _slots(self):
        """This thread's argument cells (the fixed ones written) and their addresses."""
        t = self._tls
        if not hasattr(t, "cells"):
            t.cells = (ctypes.c_uint64 * len(self._cells))()
            base = ctypes.addressof(t.cells)
            t.addrs = [ctypes.c_void_p(base + 8 * i) for i in range(len(self._cells))]
            for i, n, mask in self._cells:
                if n in self.fixed:
                    t.cells[i] = self.fixed[n] & mask
            t.run = None
        return t

    def __call__(self, **values):
        if values.keys() != self._free_keys:
            raise TypeError(f"launch arguments are {sorted(self._free_keys)}"
                            f"{' (others bound)' if self.fixed else ''}, got {sorted(values)}")
        t = self._slots()
        cells = t.cells
        for i, n, mask in self._free:
            cells[i] = values[n] & mask
        if t.run is None:
            self.compiled.run_compiled_program(t.addrs)  # the DSL makes its executor here
            t.run = self._direct(t.addrs)
        else:
            t.run()

    def _direct(self, addrs):
        """A call of the DSL executor's compiled host function on `addrs`, packed once as the
        executor packs them (its `_get_invoke_packed_args`: our slot addresses, then its
        result slot and kernel handles), checking its CUDA result as `run_compiled_program`
        does; that method itself where the compiled object has no such executor."""
        ex = getattr(self.compiled, "_default_executor", None)
        if ex is None or not all(hasattr(ex, a) for a in (
                "capi_func", "_get_invoke_packed_args", "_has_cuda_result", "cuda_result")):
            return functools.partial(self.compiled.run_compiled_program, addrs)
        src = ex._get_invoke_packed_args(addrs)
        packed = (ctypes.c_void_p * len(src))(*src)
        capi, result = ex.capi_func, ex.cuda_result if ex._has_cuda_result else None

        def run():
            capi(packed)
            if result is not None and result.value:
                from cutlass.base_dsl.runtime import cuda as cuda_helpers

                raise cuda_helpers.create_cuda_runtime_error(result.value,
                                                             cuda_helpers.cudart.cudaError_t)

        return run  # (its closure keeps `packed`, the array the host function reads, alive)
