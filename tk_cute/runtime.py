"""Running compiled kernels on torch tensors: CuTe views of torch tensors, the current stream,
output and workspace buffers, device facts (SM count, resident clusters). The torch-free launch
path (`Signature`, `Launcher`, `KernelCache`) is `tk_cute.launcher`.
"""

from __future__ import annotations

import functools
import threading

import cutlass
import torch
from cutlass.cute.runtime import from_dlpack

from tk_cute.launcher import OUT_ALIGN

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
    dependent launch still waits for the kernel before it ends before writing memory). Where
    `per_call_buffers` (a CUDA graph capture, the custom ops), and on CPU tensors (the launch
    tests), each call allocates, as torch's caching allocator would: a graph keeps its own
    memory. A dropped or replaced buffer goes back to torch's allocator, which hands it out
    again only in the order of its stream."""
    buf = kept_workspace(name, nbytes, device, stream)
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if buf is None else buf


def kept_workspace(name: str, nbytes: int, device: torch.device,
                   stream: int) -> torch.Tensor | None:
    """The kept buffer `workspace` hands out, or None where it allocates per call (CPU
    tensors, more than WORKSPACE_CACHE_BYTES, `per_call_buffers`): for a caller that keeps
    views of the buffer while it stays the same object."""
    if device.type != "cuda" or nbytes > WORKSPACE_CACHE_BYTES or per_call_buffers(stream):
        return None
    return _kept((device_index(device), stream, name), nbytes, lambda: torch.empty(
        max(nbytes, 1 << 16), dtype=torch.uint8, device=device))


def zeroed_flags(name: str, count: int, device: torch.device, stream: int) -> torch.Tensor:
    """`count` int32 flags, zero when handed out, that a kernel on `stream` sets and clears
    again before it ends (stream-K's handover flags): kept per (device, stream, name) like
    `workspace` (fresh zeros while capturing a graph, whose replays then clear them as they
    go; per call too inside `fresh_buffers`)."""
    if device.type != "cuda" or per_call_buffers(stream):
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


_FRESH = threading.local()


def fresh_buffers(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` as the custom ops (`tk_cute.nvfp4.ops`) run it: kept buffers
    (`workspace`, `zeroed_flags`, quantize's shared zero flag) of launches on any stream but
    the default one are allocated per call instead (`per_call_buffers`). A compiled graph may
    call the ops while torch routes all of the thread's allocations to a CUDA-graph pool
    (``torch.compile(mode="reduce-overhead")``'s graph trees warm up and record that way, on a
    stream of their own, not capturing it): a buffer kept past the call would be a pool
    allocation that no graph output tracks, which the trees reject."""
    depth = getattr(_FRESH, "depth", 0)
    _FRESH.depth = depth + 1
    try:
        return fn(*args, **kwargs)
    finally:
        _FRESH.depth = depth


def per_call_buffers(stream) -> bool:
    """Whether the buffers of a launch on `stream` (a raw handle, `raw_stream`; or a
    torch.device: its current stream, looked up only inside `fresh_buffers`) must be
    allocated per call here: the current stream is capturing a CUDA graph (a graph keeps its
    own memory), or inside `fresh_buffers` on a stream other than the default one (0). torch's
    CUDA graph trees warm up and record on a stream they create (``torch.cuda.Stream()``),
    never the default one, so a compiled graph in default mode, which runs on the caller's
    stream, keeps its buffers on the default stream as eager calls do: an allocation costs ~5
    us of host (compiled default, H100: 212 -> 198 us per MLP forward at M = 16,
    docs/facts.md#compiled-buffers); on any other stream it pays them."""
    if getattr(_FRESH, "depth", 0) > 0:
        if isinstance(stream, torch.device):
            stream = raw_stream(device_index(stream))
        if stream != 0:
            return True
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def stream():
    """The current torch CUDA stream as a CUDA driver stream handle."""
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


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
