"""`tk_cute.gemm(a, b)` (implemented here): C = A @ B^T on the GPU for bf16/fp16/fp8 tensors.

Validates, picks the kernel for the device (Hopper: `kernels/gemm/gemm_sm90.py`), compiles it
once per configuration (cached; `compile_seconds()` reports what compiling cost) and runs it on
the current stream.
"""

from __future__ import annotations

import functools

import torch

from tk_cute import arch
from tk_cute.runtime import KernelCache, as_cute, batched, stream

_CACHE = KernelCache()
_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


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
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            raise ValueError(f"{name} must be K-major (stride (>=K, 1)) with 16-byte aligned rows;"
                             f" got stride {t.stride()}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"K mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"a and b are on different devices: {a.device}, {b.device}")
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"out_dtype must be bfloat16 or float16, got {out_dtype}")


def gemm(a: torch.Tensor, b: torch.Tensor, out_dtype=torch.bfloat16, config=None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """C (M, N) = A (M, K) @ B (N, K)^T with fp32 accumulation.

    Args:
        a: (M, K) bf16/fp16/fp8 CUDA tensor, K contiguous.
        b: (N, K), same dtype and device.
        out_dtype: torch.bfloat16 or torch.float16.
        config: a `tk_cute.kernels.gemm.gemm_sm90.Config` to override the default tiles.
        out: optional (M, N) contiguous tensor of `out_dtype` to write C into.

    Returns:
        C, a new (M, N) tensor of `out_dtype`.
    """
    from tk_cute.kernels.gemm.gemm_sm90 import Config

    _check(a, b, out_dtype)
    dtype = str(a.dtype).removeprefix("torch.")
    config = config or Config(dtype=dtype, out_dtype=str(out_dtype).removeprefix("torch."))
    if config.dtype != dtype:
        raise TypeError(f"config.dtype {config.dtype} does not match the inputs' {dtype}")
    kernel, sms = _kernel(config, a.device)
    (M, K), N = a.shape, b.shape[0]
    for name, size, tile in (("M", M, kernel.Mb), ("N", N, kernel.Nb), ("K", K, kernel.Kb)):
        if size % tile:
            raise ValueError(f"{name}={size} must be a multiple of the tile's {tile} "
                             f"(config {config})")
    for name, tiles, cluster in (("M", M // kernel.Mb, config.CLUSTER_M),
                                 ("N", N // kernel.Nb, config.CLUSTER_N)):
        if tiles % cluster:
            raise ValueError(f"{name} has {tiles} tiles, not a multiple of the cluster's "
                             f"{cluster} (config {config})")
    c = torch.empty(M, N, dtype=out_dtype, device=a.device) if out is None else out
    if c.shape != (M, N) or c.dtype != out_dtype or not c.is_contiguous() or c.device != a.device:
        raise ValueError(f"out must be a contiguous ({M}, {N}) {out_dtype} tensor on {a.device}; "
                         f"got {tuple(c.shape)} {c.dtype} on {c.device}")
    args = [as_cute(batched(t), leading_dim=1) for t in (a, b, c)]
    fn = _CACHE.get((config, sms), lambda: _compile(kernel, args, sms))
    fn(*args, stream())
    return c


@functools.cache
def _kernel(config, device):
    """The kernel object and SM count for a config on a device (cached: host time matters for
    small problems)."""
    from tk_cute.kernels.gemm.gemm_sm90 import GemmSm90

    target = arch.device_target(device)
    if target.family != "hopper":
        raise ValueError(f"tk_cute.gemm has a Hopper kernel only; this GPU is {target.name}")
    return GemmSm90(config), torch.cuda.get_device_properties(device).multi_processor_count


def _compile(kernel, args, sms):
    import cutlass.cute as cute

    return cute.compile(kernel, *args, sms, stream())


def compile_seconds() -> dict:
    """Seconds each cached GEMM configuration took to compile."""
    return dict(_CACHE.compile_seconds)
