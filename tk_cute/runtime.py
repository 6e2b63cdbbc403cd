"""Running compiled kernels on torch tensors: CuTe views of torch tensors, the current stream,
a per-process cache of compiled kernels (compile once per configuration and target), and
`Launcher`, the fast call path for kernels whose runtime arguments are raw pointers and integers.

Compile time is kept apart from run time: `KernelCache.compile_seconds` records what each
configuration cost to build, so benchmarks can report it separately.
"""

from __future__ import annotations

import ctypes
import time

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

# torch dtypes DLPack cannot carry travel as bytes and get their CuTe element type back.
_BYTE_VIEWS = {
    torch.float8_e4m3fn: cutlass.Float8E4M3FN,
    torch.float8_e5m2: cutlass.Float8E5M2,
}


def as_cute(t: torch.Tensor, leading_dim: int | None = None, align: int = 16):
    """A CuTe tensor viewing `t` with a dynamic layout (one compile serves every shape).
    `leading_dim` is the stride-1 mode (default: the last)."""
    view = t.view(torch.uint8) if t.dtype in _BYTE_VIEWS else t
    ct = from_dlpack(view, assumed_align=align)
    ct = ct.mark_layout_dynamic(leading_dim=t.dim() - 1 if leading_dim is None else leading_dim)
    if t.dtype in _BYTE_VIEWS:
        ct.element_type = _BYTE_VIEWS[t.dtype]
    return ct


def batched(t: torch.Tensor) -> torch.Tensor:
    """(rows, cols) -> (rows, cols, 1) with the batch stride of a whole matrix, the (R, C, L)
    form CuTe's TMA helpers take; (L, rows, cols) -> (rows, cols, L)."""
    if t.dim() == 2:
        r, c = t.shape
        return t.as_strided((r, c, 1), (t.stride(0), 1, r * t.stride(0)))
    return t.permute(1, 2, 0)


def aligned(t: torch.Tensor, align: int = 16) -> torch.Tensor:
    """`t` contiguous and starting on an `align`-byte boundary (copied only if it is not), for
    kernels compiled against pointers assumed that aligned."""
    t = t.contiguous()
    return t if t.data_ptr() % align == 0 else t.clone()


def output(out, shape: tuple, dtype, device, who: str) -> torch.Tensor:
    """The output tensor of a raw-pointer kernel call: a new one, or the caller's `out` if it is
    contiguous and of this shape, dtype and device (ValueError naming `who` otherwise)."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if (tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device
            or not out.is_contiguous()):
        raise ValueError(f"{who}: out must be a contiguous {tuple(shape)} {dtype} tensor on "
                         f"{device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    return out


def stream():
    """The current torch CUDA stream as a CUDA driver stream handle."""
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


class KernelCache:
    """Compiled kernels by key; `get(key, build)` compiles on first use (build() -> callable)."""

    def __init__(self):
        self._kernels: dict = {}
        self.compile_seconds: dict = {}

    def get(self, key, build):
        fn = self._kernels.get(key)
        if fn is None:
            start = time.perf_counter()
            fn = self._kernels[key] = build()
            self.compile_seconds[key] = time.perf_counter() - start
        return fn


# ---------------------------------------------------------------- raw-pointer launches
# A kernel compiled against `placeholder_ptr` arguments takes plain addresses at run time. Its
# argument kinds: "p" (a pointer, or the stream last), "i32", "i64": one ctypes slot each.
ARG_SLOTS = {"p": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64}


def placeholder_ptr(dtype, align: int = 16):
    """A global-memory pointer of `dtype` (assumed `align`-byte aligned) to compile against."""
    return cute.runtime.make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=align)


def device_index(device: torch.device) -> int:
    """The index of a CUDA device ("cuda" without one: the current device)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def raw_stream(device_index: int) -> int:
    """The current torch stream of a device as a plain handle."""
    return torch.cuda.current_stream(device_index).cuda_stream


class Launcher:
    """A compiled function called with its argument slots packed directly: the DSL's
    `generate_execution_args` costs ~6 us per call plus ~1 us per runtime object, DLPack views
    ~10-20 us per tensor. `kinds` lists ARG_SLOTS keys in argument order (stream last)."""

    def __init__(self, compiled, kinds):
        self.compiled, self.kinds = compiled, kinds

    def pack(self, values):
        slots = [ARG_SLOTS[k](v) for k, v in zip(self.kinds, values)]
        return slots, [ctypes.addressof(s) for s in slots]

    def check_against_dsl(self, dsl_args, values) -> None:
        """Raise unless our slots hold what the DSL's own packing holds (run once per kernel)."""
        exe, _ = self.compiled.execution_args.generate_execution_args(tuple(dsl_args), {})
        slots, ours = self.pack(values)
        if len(exe) != len(ours):
            raise RuntimeError(f"DSL packs {len(exe)} arguments, expected {len(ours)}")
        for kind, a, b in zip(self.kinds, exe, ours):
            size = ctypes.sizeof(ARG_SLOTS[kind])
            addr = a.value if isinstance(a, ctypes.c_void_p) else a
            if ctypes.string_at(addr, size) != ctypes.string_at(b, size):
                raise RuntimeError("DSL argument packing differs from the fast path")

    def __call__(self, *values):
        slots, addrs = self.pack(values)
        self.compiled.run_compiled_program(addrs)
        del slots  # kept alive through the call above


def dsl_values(kinds, values, dtypes):
    """The same runtime values as DSL objects (for `Launcher.check_against_dsl`); `dtypes`:
    (element type, alignment) of each pointer but the stream."""
    from cuda.bindings import driver

    out, di = [], iter(dtypes)
    for i, (k, v) in enumerate(zip(kinds, values)):
        if k == "p" and i == len(kinds) - 1:
            out.append(driver.CUstream(v))
        elif k == "p":
            dt, align = next(di)
            out.append(cute.runtime.make_ptr(dt, v, cute.AddressSpace.gmem, assumed_align=align))
        else:
            out.append((cutlass.Int32 if k == "i32" else cutlass.Int64)(v))
    return out
