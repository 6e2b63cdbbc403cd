"""`tk_cute.gemm(a, b)` (implemented here): C = A @ B^T on the GPU for bf16/fp16/fp8 tensors.

Validates, picks the kernel for the device (Hopper: `kernels/gemm/gemm_sm90.py`), compiles it
once per configuration (cached; `compile_seconds()` reports what compiling cost) and runs it on
the current stream. `scaled` is the same launch with a device-side fp32 scale applied to the
accumulator (`GemmScaledSm90`), which the NVFP4 "dequantize" path runs on exact bf16 operands.

Shapes: any M, N, K whose rows meet TMA's 16-byte alignment (K * element size and N * output element
size multiples of 16 bytes, tensors 16-byte aligned): the kernel's edge tiles are partial
(zero-filled loads, clipped stores), never padded on the host. The tile (128 rows, 192 where a third
fewer bands fill a round, or 64 for few rows, M <= 256: `few_rows_plan`; 64 to 256 columns, the
planned widths `TILE_COST`: multiples of 32 and 112 / 144 / 176 / 208) and the cluster shape come
from the output's shape and the SM count (`tile_plan`: a model of the persistent grid's rounds, with
costs fitted on the H200). Up to 400 rows whose last 128-row band would lie mostly past M, the
kernel computes C^T = B @ A^T instead (`swap_plan`: M in tile widths, B's rows in bands; C stored
transposed, so `out` is the same row-major tensor). Clusters multicast the tile their CTAs share (2
x 1: B, 1 x 2 and 1 x 4: A), which cuts the L2 reads per MMA; the persistent grid holds as many
clusters as the GPU runs at once (`runtime.resident_clusters`: 30 of 4 CTAs on the H200's 132 SMs,
not 33). Where the plan's few tiles would stream a long K on few SMs, each tile's K is cut into
ranges whose fp32 partial planes (a `runtime.workspace` per stream) a second kernel sums into C
(split-K, `split_plan`). Where one CTA's work is short, the GEMM launches as a programmatic
dependent of the kernel before it on the stream (`Config.PDL`: it reads nothing before that
kernel has ended; its launch and prologue overlap that kernel's tail) and lets the next one
launch as its CTAs start. The plans are `tk_cute.tuning.dense_sm90`'s.
Operand rows that do not start on a 128-byte L2 line (K * element size % 128 != 0, or an offset
view) make every TMA row piece of a stage touch two lines; from two rows of tiles on, such calls
always run in 2 x 1 clusters (`line_aligned`, `tuning.dense_sm90.default_config`), which halves B's
reads (docs/facts.md#l2-line-rows: 3000x7000x5000 0.67x -> 0.92-0.95x cuBLAS).
"""

from __future__ import annotations

import functools

import torch

from tk_cute import arch
from tk_cute.runtime import (dtype_name, device_index, output, raw_stream, resident_clusters,
                             sm_count, workspace)
from tk_cute.launcher import KernelCache
from tk_cute.tuning import dense_sm90 as dense_tuning

_CACHE = KernelCache()
_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TMA_ALIGN = 16  # bytes: TMA global addresses and row strides
L2_LINE = 128  # bytes: operand rows starting on a line read a stage's row pieces line by line


def _check(a: torch.Tensor, b: torch.Tensor, out_dtype):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype must be one of {_DTYPES}, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D (rows, K), got shape {tuple(t.shape)}")
        if not t.is_cuda:
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        if (t.stride(1) != 1 or (t.stride(0) * t.element_size()) % TMA_ALIGN
                or t.data_ptr() % TMA_ALIGN):
            raise ValueError(f"{name} must be K-major (stride (>=K, 1)) with {TMA_ALIGN}-byte "
                             f"aligned rows and start (TMA); got shape {tuple(t.shape)}, stride "
                             f"{t.stride()}, {t.dtype}, address % 16 = {t.data_ptr() % 16}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"K mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"a and b are on different devices: {a.device}, {b.device}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    N = b.shape[0]
    if (N * out_dtype.itemsize) % TMA_ALIGN:
        raise ValueError(f"N={N} gives {N * out_dtype.itemsize}-byte rows of {out_dtype} C; "
                         f"TMA stores need a multiple of {TMA_ALIGN} bytes (N % "
                         f"{TMA_ALIGN // out_dtype.itemsize} == 0)")


def line_aligned(*operands: torch.Tensor) -> bool:
    """Whether every operand's rows start on an L2 line (`L2_LINE`): its address and row
    stride in bytes multiples of 128."""
    return all(t.data_ptr() % L2_LINE == 0 and (t.stride(0) * t.element_size()) % L2_LINE == 0
               for t in operands)


def gemm(a: torch.Tensor, b: torch.Tensor, out_dtype=torch.bfloat16, config=None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """C (M, N) = A (M, K) @ B (N, K)^T with fp32 accumulation.

    Args:
        a: (M, K) bf16/fp16/fp8 CUDA tensor, K contiguous, rows 16-byte aligned.
        b: (N, K), same dtype and device.
        out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32.
        config: a `tk_cute.kernels.gemm.gemm_sm90.Config` to override the default tiles.
        out: optional (M, N) contiguous tensor of `out_dtype` on the device to write C into.

    Returns:
        C, (M, N) of `out_dtype` (`out` when given).

    Raises:
        TypeError: operand types or dtypes, out_dtype, a config of another input dtype.
        ValueError: shapes, strides, alignment, devices, `out`, a non-Hopper GPU, a config
            with more split-K ranges (`SPLIT_K`) than K has K steps.
    """
    _check(a, b, out_dtype)
    config = config or config_for(a, b, out_dtype)
    if config.dtype != dtype_name(a.dtype) or config.out_dtype != dtype_name(out_dtype):
        raise TypeError(f"config is for {config.dtype} -> {config.out_dtype}; the call is "
                        f"{dtype_name(a.dtype)} -> {dtype_name(out_dtype)}")
    c = output(out, (a.shape[0], b.shape[0]), out_dtype, a.device, "tk_cute.gemm")
    return _run(config, a, b, c)


def scaled(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, out: torch.Tensor):
    """out = alpha * (a @ b^T) for bf16 a (M, K), b (N, K) and a 1-element fp32 device tensor
    alpha (read on the device: no host sync). For callers that validated already."""
    return _run(config_for(a, b, out.dtype), a, b, out, alpha.reshape(1))


def config_for(a: torch.Tensor, b: torch.Tensor, out_dtype=torch.bfloat16):
    """The config `gemm(a, b, out_dtype)` runs: `tuning.dense_sm90.default_config` for these
    operands (their shape, device, row alignment and the clusters the GPU holds; a non-Hopper
    GPU raises before its clusters are queried)."""
    return dense_tuning.default_config(a.dtype, out_dtype, a.shape[0], b.shape[0],
                                       _check_device(a.device), lines=line_aligned(a, b),
                                       quads=resident_clusters(a.device, 4), K=a.shape[1])


def _run(config, a, b, c, alpha=None):
    from tk_cute.kernels.gemm import gemm_sm90

    index = device_index(a.device)
    sms = _check_device(a.device)
    st = raw_stream(index)
    size = config.CLUSTER_M * config.CLUSTER_N  # the persistent grid: the clusters that fit
    grid = sms if size == 1 else size * resident_clusters(a.device, size)
    launch = _CACHE.get((config, alpha is not None, grid),
                        lambda: gemm_sm90.compile_launcher(config, grid, alpha is not None))
    extra = {} if alpha is None else {"alpha": alpha.data_ptr()}
    (M, K), N = a.shape, b.shape[0]
    if config.SPLIT_K > 1:  # the fp32 partial planes the second kernel sums into c
        config.check_k(K)
        extra["ws"] = workspace("dense_split_k", config.workspace_bytes(M, N), a.device,
                                st).data_ptr()
    if config.TRANSPOSE_C:  # C^T = B @ A^T: the kernel's A is b, its C^T the row-major c
        a, b, M, N = b, a, N, M
    launch(a=a.data_ptr(), b=b.data_ptr(), c=c.data_ptr(), M=M, N=N, K=K, lda=a.stride(0),
           ldb=b.stride(0), ldc=c.stride(0), stream=st, **extra)
    return c


@functools.cache
def _check_device(device) -> int:
    """The SM count of a Hopper device (raises on other GPUs; cached: host time matters for
    small problems)."""
    target = arch.device_target(device)
    if not target.wgmma:
        raise ValueError(f"tk_cute.gemm has a Hopper (wgmma) kernel only; this GPU is "
                         f"{target.name}")
    return sm_count(device)


def compile_seconds() -> dict:
    """Seconds each cached GEMM configuration took to compile."""
    return dict(_CACHE.compile_seconds)
