"""What every level of the ladder shares on the host: fake operands for compiling without a GPU,
the torch launch, the element-wise check and the TFLOP/s timing.

A level is a `@cute.jit` host function `gemm(a, b, c, stream)` over (rows, cols, 1) CuTe tensors
(C = A @ B^T: a (M, K, 1), b (N, K, 1), c (M, N, 1), each with its second mode contiguous) and
the tile (Mb, Nb, Kb) it needs M, N and K to be multiples of.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from tk_cute.arch import target
from tk_cute.compile import build

ARCH = "sm_90a"
SMS = target(ARCH).sm_count  # the persistent grid of level 7 (132: H100 SXM / H200)


def fake_operands(tile: tuple[int, int, int], dtype=cutlass.BFloat16):
    """Fake (a, b, c) whose dynamic extents are multiples of the tile (no GPU, no memory)."""
    Mb, Nb, Kb = tile

    def fake(rows_div, cols_div):
        r, c = cute.sym_int64(divisibility=rows_div), cute.sym_int64(divisibility=cols_div)
        return make_fake_tensor(dtype, (r, c, 1), (c, 1, r * c), assumed_align=16)

    return fake(Mb, Kb), fake(Nb, Kb), fake(Mb, Nb)


def compile_level(host, tile, *constexpr, arch: str = ARCH):
    """`tk_cute.compile.build` of a level for `arch` from fake operands: a `Build` (PTX, SASS,
    registers, spills), without a GPU. `constexpr`: the host's compile-time arguments between
    c and the stream (level 07's persistent CTA count)."""
    from cuda.bindings import driver as cuda

    return build(host, *fake_operands(tile), *constexpr, cuda.CUstream(0), arch=arch)


def check_shape(M: int, N: int, K: int, tile) -> None:
    """Raise ValueError unless M, N, K are multiples of the level's (Mb, Nb, Kb)."""
    bad = [f"{name}={v} % {t}" for name, v, t in zip("MNK", (M, N, K), tile) if v % t]
    if bad:
        raise ValueError(f"this level handles whole tiles only: M, N, K must be multiples of "
                         f"{tile[0]}x{tile[1]}x{tile[2]}; got {', '.join(bad)} != 0")


_COMPILED = {}


def run(host, tile, a: torch.Tensor, b: torch.Tensor, *constexpr,
        out: torch.Tensor | None = None) -> torch.Tensor:
    """C = a @ b^T on the GPU with a level's kernel (compiled on first use; the compile-time
    arguments are not passed again). C is `out` (a contiguous (M, N) bf16 tensor) or a fresh one
    filled with NaN, so an element the kernel fails to write fails the check."""
    from tk_cute.runtime import as_cute, batched, stream

    (M, K), N = a.shape, b.shape[0]
    check_shape(M, N, K, tile)
    c = out
    if c is None:
        c = torch.full((M, N), float("nan"), device=a.device, dtype=torch.bfloat16)
    elif c.shape != (M, N) or c.dtype != torch.bfloat16 or not c.is_contiguous():
        raise ValueError(f"out must be a contiguous ({M}, {N}) bf16 tensor, got "
                         f"{tuple(c.shape)} {c.dtype}")
    args = [as_cute(batched(t), leading_dim=1) for t in (a, b, c)]
    key = (host, constexpr)
    if key not in _COMPILED:
        _COMPILED[key] = cute.compile(host, *args, *constexpr, stream())
    _COMPILED[key](*args, stream())
    return c


def check(host, tile, *constexpr, mnk=(512, 768, 1024), seed: int = 0) -> None:
    """Run a level on random bf16 operands and bound every element (`assert_gemm_close`)."""
    from tk_cute.testing import assert_gemm_close

    torch.manual_seed(seed)
    M, N, K = mnk
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    assert_gemm_close(run(host, tile, a, b, *constexpr), a, b, f"ladder {host.__module__}")


def bench(host, tile, *constexpr, name: str = "level", mnk=(4096, 4096, 4096), rounds: int = 10):
    """Median time of the level at `mnk` on cold-L2 input sets; prints one result line and
    returns TFLOP/s (`tk_cute.bench.harness`, the one timing method)."""
    from tk_cute.bench import harness

    M, N, K = mnk

    def make():
        return (torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                torch.randn(N, K, device="cuda", dtype=torch.bfloat16))

    sets = harness.input_sets(make, (M + N) * K * 2)
    # One output for every call, allocated here: the NaN fill `run` does for a fresh C would be
    # timed with the kernel.
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    r = harness.bench({name: lambda s: run(host, tile, *s, *constexpr, out=c)}, sets,
                      rounds=rounds)[name]
    print(harness.row(name, f"{M}x{N}x{K}", r.ms, 2 * M * N * K, extra=f"spread {r.spread:.2f}"))
    return 2 * M * N * K / r.ms / 1e9


def run_cells(compile_test, gpu_test, bench) -> None:
    """A level run as a script or a notebook (pytest runs its tests itself): the compile test,
    then on a GPU the element-wise check and the timing; without one it says they were
    skipped."""
    compile_test()
    if torch.cuda.is_available():
        gpu_test()
        bench()
    else:
        print("GPU cells skipped: no CUDA device (the check and bench() need one)")
