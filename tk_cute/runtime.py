"""Running compiled kernels on torch tensors: CuTe views of torch tensors, the current stream,
a per-process cache of compiled kernels (compile once per configuration and target), and the
raw-pointer call path: a kernel's runtime arguments are declared once as a `Signature` (name,
kind, element type and alignment of each), which builds the placeholders it is compiled
against, checks the fast packing against the DSL's own, and launches by name (`Launcher`).

Contracts:
- Thread safety: the DSL's compile state is process-global, so every compile goes through
  `tk_cute.compile.COMPILE_LOCK`; `KernelCache.get` builds a key once however many threads ask
  (single flight under that lock) and never holds it on the hit path.
- Compile time is kept apart from run time: `KernelCache.compile_seconds` records what each
  configuration cost to build, so benchmarks can report it separately.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
import time
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

from tk_cute.compile import COMPILE_LOCK

# torch dtypes DLPack cannot carry travel as bytes and get their CuTe element type back.
_BYTE_VIEWS = {
    torch.float8_e4m3fn: cutlass.Float8E4M3FN,
    torch.float8_e5m2: cutlass.Float8E5M2,
}


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name as Configs and plans spell it (torch.bfloat16 -> "bfloat16")."""
    return str(dtype).removeprefix("torch.")


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


OUT_ALIGN = 16  # bytes: kernels write outputs with 16-byte vector stores or TMA


def check_out(out, shape: tuple, dtype, device, who: str) -> None:
    """Raise unless `out` is a contiguous, 16-byte aligned tensor of `shape` and `dtype` on
    `device` (TypeError for a non-tensor or a sparse or nested one, else ValueError listing
    every violation)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{who}: out must be a torch.Tensor, got {type(out).__name__}")
    if out.is_nested or out.layout != torch.strided:  # (it has no address to check)
        raise TypeError(f"{who}: out must be a dense (strided) tensor, got layout {out.layout}"
                        f"{' (nested)' if out.is_nested else ''}")
    problems = []
    if tuple(out.shape) != tuple(shape):
        problems.append(f"shape {tuple(out.shape)} (needs {tuple(shape)})")
    if out.dtype != dtype:
        problems.append(f"dtype {out.dtype} (needs {dtype})")
    if out.device != torch.device(device):
        problems.append(f"device {out.device} (needs {device})")
    if not out.is_contiguous():
        problems.append(f"stride {out.stride()} (needs contiguous)")
    if out.data_ptr() % OUT_ALIGN:
        problems.append(f"address % {OUT_ALIGN} = {out.data_ptr() % OUT_ALIGN} (needs "
                        f"{OUT_ALIGN}-byte alignment)")
    if problems:
        raise ValueError(f"{who}: out has " + ", ".join(problems))


def output(out, shape: tuple, dtype, device, who: str) -> torch.Tensor:
    """The output tensor of a kernel call: a new one, or the caller's `out` once `check_out`
    accepts it."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_out(out, shape, dtype, device, who)
    return out


# Workspaces up to this size are kept per (device, stream, name) and reused (`workspace`);
# larger ones are allocated per call, where the GPU time dwarfs an allocation's host time. At
# most WORKSPACE_CACHE_ENTRIES are kept (the oldest dropped: code that makes a stream per call
# must not grow the cache).
WORKSPACE_CACHE_BYTES = 8 << 20
WORKSPACE_CACHE_ENTRIES = 64
_WORKSPACES: dict = {}
_WORKSPACES_LOCK = threading.Lock()


def workspace(name: str, nbytes: int, device: torch.device, stream: int) -> torch.Tensor:
    """A scratch buffer of at least `nbytes` bytes (16-byte aligned, uninitialized) for kernels
    launched on `stream` (a raw handle, `raw_stream`): what a kernel writes and the next one
    on the stream reads within one call (partial sums, permuted activations).

    An allocation costs ~5 us of host time, as much as a small GEMM's whole launch, so buffers
    up to `WORKSPACE_CACHE_BYTES` are kept per (device, stream, name) and handed out again.
    That is safe because every use of a buffer is ordered on its stream: a call's kernels
    finish with it before the next call's kernels on that stream touch it (a programmatic
    dependent launch still waits for the kernel before it ends before writing memory). While
    the stream is capturing a CUDA graph, and on CPU tensors (the launch tests), each call
    allocates, as torch's caching allocator would: a graph keeps its own memory. A dropped or
    replaced buffer goes back to torch's allocator, which hands it out again only in the order
    of its stream."""
    if device.type != "cuda" or nbytes > WORKSPACE_CACHE_BYTES or _capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    return _kept((device_index(device), stream, name), nbytes, lambda: torch.empty(
        max(nbytes, 1 << 16), dtype=torch.uint8, device=device))


def zeroed_flags(name: str, count: int, device: torch.device, stream: int) -> torch.Tensor:
    """`count` int32 flags, zero when handed out, that a kernel on `stream` sets and clears
    again before it ends (stream-K's handover flags): kept per (device, stream, name) like
    `workspace` (fresh zeros while capturing a graph, whose replays then clear them as they
    go)."""
    if device.type != "cuda" or _capturing():
        return torch.zeros(count, dtype=torch.int32, device=device)
    return _kept((device_index(device), stream, "flags:" + name), count, lambda: torch.zeros(
        max(count, 1024), dtype=torch.int32, device=device))


def stream_k_buffers(name: str, tiles: int, k_steps: int, slot_bytes: int, sms: int,
                     device: torch.device, stream: int, teams: bool = False
                     ) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(ctas, partials, flags) of an in-kernel stream-K launch (`StreamK`) over `tiles`
    tiles of `k_steps` units on a GPU of `sms` SMs: `schedule.stream_k_grid`'s CTAs (with
    `teams`, `stream_k_team_grid`'s), a partial slot of `slot_bytes` per CTA (`workspace`) and
    a zero flag per CTA (`zeroed_flags`; teams: one per CTA and consumer warp, TEAM_MAX), both
    kept per (device, stream, name). The caller holds them until the launch is queued."""
    from tk_cute.ops import schedule

    if teams:
        ctas, flags = schedule.stream_k_team_grid(tiles, k_steps, sms), schedule.TEAM_MAX
    else:
        ctas, flags = schedule.stream_k_grid(tiles, k_steps, sms), 1
    return (ctas, workspace(name, ctas * slot_bytes, device, stream),
            zeroed_flags(name, ctas * flags, device, stream))


def _kept(key, numel: int, make) -> torch.Tensor:
    """The kept buffer of `key` (device index, stream, name) if it holds `numel` elements, else
    a new one from `make()` in its place (a larger buffer replaces a smaller one: stream-ordered;
    the oldest of WORKSPACE_CACHE_ENTRIES dropped). (The default stream is 0 on every device.)"""
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < numel:
        with _WORKSPACES_LOCK:
            buf = _WORKSPACES.get(key)
            if buf is None or buf.numel() < numel:
                _WORKSPACES.pop(key, None)  # (re-inserted last: the newest)
                while len(_WORKSPACES) >= WORKSPACE_CACHE_ENTRIES:
                    del _WORKSPACES[next(iter(_WORKSPACES))]
                buf = _WORKSPACES[key] = make()
    return buf


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def stream():
    """The current torch CUDA stream as a CUDA driver stream handle."""
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


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
    in one buffer, refilled by one `struct.pack_into`, and, once the DSL has built its executor
    on the first call, calls that executor's compiled host function on a packed-argument array
    made once (`_direct`); objects without one (test doubles) keep `run_compiled_program`."""

    def __init__(self, compiled, signature: Signature):
        self.compiled, self.signature = compiled, signature
        self._tls = threading.local()
        self._names = signature.names + ("stream",)
        # One 8-byte cell per slot (i32 in the low half: little-endian, as the slots' ctypes).
        self._struct = struct.Struct("<" + "".join(
            "i4x" if cls is ctypes.c_int32 else "q" if cls is ctypes.c_int64 else "Q"
            for cls in signature._slots))

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
        """This thread's argument buffer and the slot addresses handed to the DSL."""
        t = self._tls
        if not hasattr(t, "buf"):
            t.buf = ctypes.create_string_buffer(8 * len(self._names))
            base = ctypes.addressof(t.buf)
            t.addrs = [ctypes.c_void_p(base + 8 * i) for i in range(len(self._names))]
            t.run = None
        return t

    def __call__(self, **values):
        if values.keys() != self.signature.keys:
            self.signature.pack(values)  # raises, naming the arguments
        t = self._slots()
        self._struct.pack_into(t.buf, 0, *[values[n] for n in self._names])
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


def device_index(device: torch.device) -> int:
    """The index of a CUDA device ("cuda" without one: the current device)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    """The SMs of a CUDA device (read once per device: the plans and grids ask per call)."""
    return _sm_count(device_index(device))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def resident_clusters(device: torch.device, size: int) -> int:
    """How many clusters of `size` CTAs (1 CTA per SM) the GPU runs at once: a cluster's CTAs
    share one GPC, so GPCs whose SM count is not a multiple of `size` leave SMs idle (H200,
    132 SMs: 66 clusters of 2, 30 of 4). A persistent grid of more clusters than this runs the
    rest after the first finish (64x16384x4096 in 1 x 4 clusters: 32 clusters, 41.8 us against
    30 clusters' 34.9 at 64x15360; docs/facts.md#resident-clusters). Read once per
    device and size (`cuOccupancyMaxActiveClusters` on an empty kernel that takes a whole SM's
    shared memory)."""
    return _resident_clusters(device_index(device), size)


# An empty kernel for the occupancy query: the driver JIT-compiles PTX (no compiler needed).
_EMPTY_PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry tk_cute_empty() { ret; }
"""


@functools.cache
def _resident_clusters(index: int, size: int) -> int:
    from cuda.bindings import driver

    def check(result):
        err, *value = result if isinstance(result, tuple) else (result,)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"resident_clusters({size}) on cuda:{index}: {err}")
        return value[0] if value else None

    with torch.cuda.device(index):
        torch.cuda.init()
        torch.zeros(1, device=f"cuda:{index}")  # the primary context, current on this thread
        smem = torch.cuda.get_device_properties(index).shared_memory_per_block_optin
        fn = check(driver.cuModuleGetFunction(check(driver.cuModuleLoadData(_EMPTY_PTX)),
                                              b"tk_cute_empty"))
        attr = driver.CUfunction_attribute
        check(driver.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        smem))
        check(driver.cuFuncSetAttribute(
            fn, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = size * _sm_count(index), 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
        config.sharedMemBytes = smem
        cluster = driver.CUlaunchAttribute()
        cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        cluster.value.clusterDim.x, cluster.value.clusterDim.y = size, 1
        cluster.value.clusterDim.z = 1
        config.attrs, config.numAttrs = [cluster], 1
        return check(driver.cuOccupancyMaxActiveClusters(fn, config))


# torch's own C accessor of the current stream, the one inductor's generated code calls
# (building a `torch.cuda.Stream` costs ~3 us per call); CPU-only builds lack it.
_CURRENT_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def raw_stream(device_index: int) -> int:
    """The current torch stream of a device as a plain handle."""
    if _CURRENT_RAW_STREAM is None:  # pragma: no cover - CPU builds, older torch
        return torch.cuda.current_stream(device_index).cuda_stream
    return _CURRENT_RAW_STREAM(device_index)
