"""NVFP4 GEMM semantics, ``D = A @ B^T`` for K-major A (M, K) and B (N, K), and its reference.

``D[m, n] = cast_out(gA * gB * sum_k e2m1(qA[m,k]) sfA[m,k/16] e2m1(qB[n,k]) sfB[n,k/16])``.

`gemm_reference` computes the sum EXACTLY: every e2m1 value is a multiple of 2^-1 and every UE4M3
scale a multiple of 2^-9, so ``a_int = 2*e2m1 * 2^9*sf`` is an integer below 2^22 and the sum is
``2^-20 * sum_k a_int * b_int``, an integer dot product. It is split into 11-bit halves so each
float64 matmul only adds integers below 2^53 (exact for K < 2^30) and recombined in int64 (exact
for K < 2^19). The exact sum is then converted to float64, multiplied by ``2^-20 * gA * gB``
(exact in float64) and cast to the output dtype: at most two float64 roundings (relative error
< 2^-51) before the cast. A kernel accumulating in float32 is then judged against the true value.

`gemm` is the public entry point: it validates and dispatches by device and shape (see its
docstring); W4A16 (a bf16 activation matrix times NVFP4 weights) goes through it too.
"""

from __future__ import annotations

import functools

import torch

from .format import e2m1_decode, e4m3_decode, unpack_fp4
from .tensor import SF_VEC, NVFP4Tensor

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_SPLIT = 11  # bits per half of an operand integer (|a_int| < 2^22)


def _check_gemm_operands(a, b, out_dtype) -> None:
    """Validate `gemm` arguments; shared by the reference and kernel paths.

    Raises:
        TypeError: a or b is not an NVFP4Tensor, or out_dtype is not bfloat16/float16/float32.
        ValueError: ndim differs or is not 2/3, K differs, batch counts differ, or the operands
            live on different devices.
    """
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, NVFP4Tensor):
            raise TypeError(f"gemm operand {name} must be an NVFP4Tensor, got {type(t).__name__}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            "gemm out_dtype must be torch.bfloat16, torch.float16 or torch.float32, "
            f"got {out_dtype}"
        )
    if a.ndim != b.ndim or a.ndim not in (2, 3):
        raise ValueError(
            f"gemm operands must both be 2-D (M, K) x (N, K) or both 3-D (L, M, K) x (L, N, K), "
            f"got a {tuple(a.shape)} and b {tuple(b.shape)}"
        )
    if a.K != b.K:
        raise ValueError(f"gemm K mismatch: a has K={a.K}, b has K={b.K} (D = a @ b^T)")
    if a.ndim == 3 and a.L != b.L:
        raise ValueError(f"gemm batch mismatch: a has L={a.L}, b has L={b.L}")
    if a.device != b.device:
        raise ValueError(
            f"gemm operands must be on one device: a is on {a.device}, b on {b.device}"
        )


def _operand_integers(q: NVFP4Tensor) -> torch.Tensor:
    """int64 (..., R, K): 2*e2m1 * 2^9*ue4m3, the operand as exact integers (|value| < 2^22)."""
    codes2 = (e2m1_decode(unpack_fp4(q.data)) * 2).to(torch.int64)  # -12 .. 12
    sf512 = (e4m3_decode(q.scales_logical()) * 512).to(torch.int64)  # 0 .. 229376
    return codes2 * sf512.repeat_interleave(SF_VEC, dim=-1)


def _exact_int_matmul_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``a @ b^T`` for int64 operands below 2^22 in magnitude, via float64 matmuls."""
    mask = (1 << _SPLIT) - 1
    a1, a0 = (a >> _SPLIT).double(), (a & mask).double()  # a = a1 * 2^11 + a0, 0 <= a0 < 2^11
    b1, b0 = (b >> _SPLIT).double(), (b & mask).double()
    mm = lambda x, y: torch.matmul(x, y.transpose(-1, -2)).to(torch.int64)  # noqa: E731
    hi = mm(a1, b1)
    mid = mm(torch.cat((a1, a0), dim=-1), torch.cat((b0, b1), dim=-1))  # a1.b0 + a0.b1
    lo = mm(a0, b0)
    return (hi << (2 * _SPLIT)) + (mid << _SPLIT) + lo


def gemm_reference(
    a: NVFP4Tensor, b: NVFP4Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Reference ``D = a @ b^T`` with an exact accumulation (see the module docstring).

    Args:
        a: NVFP4Tensor (M, K) or (L, M, K).
        b: NVFP4Tensor (N, K) or (L, N, K).
        out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32.

    Returns:
        D, (M, N) or (L, M, N), of out_dtype on the operands' device.

    Raises:
        TypeError, ValueError: see `_check_gemm_operands`.
    """
    _check_gemm_operands(a, b, out_dtype)
    acc = _exact_int_matmul_nt(_operand_integers(a), _operand_integers(b))
    scale = a.global_scale.double() * b.global_scale.double() * 2.0**-20  # exact in float64
    return (acc.double() * scale).to(out_dtype)


def _check_w4a16_operands(a, b, out_dtype) -> None:
    """W4A16: a bf16 (M, K) activation tensor and NVFP4 weights b (N, K)."""
    if not isinstance(b, NVFP4Tensor):
        raise TypeError(f"gemm operand b must be an NVFP4Tensor, got {type(b).__name__}")
    if a.dtype != torch.bfloat16 or a.dim() != 2:
        raise TypeError(f"a W4A16 activation must be a 2-D bfloat16 tensor, got {a.dtype} "
                        f"{tuple(a.shape)}")
    if b.ndim != 2:
        raise ValueError(f"W4A16 weights must be 2-D (N, K), got {tuple(b.shape)}")
    if a.shape[1] != b.K:
        raise ValueError(f"gemm K mismatch: a has K={a.shape[1]}, b has K={b.K} (D = a @ b^T)")
    if a.device != b.device:
        raise ValueError(f"gemm operands must be on one device: a is on {a.device}, "
                         f"b on {b.device}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"gemm out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")


def w4a16_reference(a: torch.Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``D = a @ deq(b)^T`` in float64 (bf16 activations and decoded weights are exact there),
    then cast."""
    _check_w4a16_operands(a, b, out_dtype)
    return (a.double() @ b.dequantize(torch.float64).t()).to(out_dtype)


def _kernel_for(a, b, out_dtype, pdl: bool = False):
    """The GPU kernel entry for these operands, called as (a, b, out_dtype), or None (then the
    reference runs); `pdl` goes to the entries that take it."""
    if b.device.type != "cuda" or out_dtype == torch.float32:
        return None
    from tk_cute import arch

    target = arch.device_target(b.device)
    M, N, K = a.shape[-2], b.shape[-2], b.K
    if target.family == "hopper" and b.ndim == 2:
        from tk_cute.kernels.gemm import nvfp4_gemv_sm90, nvfp4_rs_sm90, nvfp4_sm90

        if (isinstance(a, torch.Tensor) and M >= nvfp4_rs_sm90.MIN_M
                and nvfp4_rs_sm90.supports(M, N, K)):
            return functools.partial(nvfp4_rs_sm90.gemm_rs, pdl=pdl)
        if M <= nvfp4_gemv_sm90.MAX_M and nvfp4_gemv_sm90.supports(M, N, K):
            return functools.partial(nvfp4_gemv_sm90.gemm_small_m, pdl=pdl)
        if nvfp4_sm90.supports(M, N, K):
            return nvfp4_sm90.gemm
    if target.family != "hopper" and isinstance(a, NVFP4Tensor):
        from . import dispatch_sm100

        if target.name in dispatch_sm100.TARGETS and dispatch_sm100.supports(M, N, K, out_dtype):
            return dispatch_sm100.gemm_sm100
    return None


def gemm(a, b: NVFP4Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
         pdl: bool = False) -> torch.Tensor:
    """``D = a @ b^T`` for NVFP4 operands (public entry point; kernels dispatch from here).

    Paths: on Hopper, W4A16 with 9 <= M <= 128, N % 128 == 0, K % 256 == 0 runs the register-A
    wgmma kernel (`kernels/gemm/nvfp4_rs_sm90.py`; on the H200 it beat the large-M kernel's
    fused path at M = 128 too: 110 against 150 us at 128x28672x8192); otherwise M <= 64 runs
    the weight-streaming kernel (`kernels/gemm/nvfp4_gemv_sm90.py`) and M % 128 == 0,
    N % 256 == 0, K % 64 == 0 the emulating GEMM (`kernels/gemm/nvfp4_sm90.py`);
    on sm_100a/sm_103a/sm_107a, W4A4 runs the block-scaled tcgen05 kernel
    (`kernels/gemm/nvfp4_sm100.py`, via `dispatch_sm100`). Everything else (CPU tensors, float32
    output, shapes no kernel takes) runs the exact reference on the operands' device: correct,
    not fast.

    Args:
        a: NVFP4Tensor (M, K) or (L, M, K), K-major; or a bfloat16 (M, K) tensor (W4A16).
        b: NVFP4Tensor (N, K) or (L, N, K), K-major.
        out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32.
        pdl: let back-to-back calls overlap (programmatic dependent launch) where the path
            supports it (the Hopper kernels for M <= 128: register-A and small-M); others
            ignore it. The call may then read the weights b while the kernel before it on the
            stream is still running (it reads a and writes D only after that kernel has ended),
            so pass it only for weights that the kernels just before do not write, e.g. static
            weights in a chain of decode GEMMs. On the H200 (docs/results.md, bench row
            `tk_cute w4a16 pdl`) it saved 1.4-1.7 us per call at M = 1 (1x8192^2: 12.7 -> 11.3
            us; at 1x8192x28672 it was 0.5 us slower, within the spread) and 0.4-1.0 us at
            M = 16.

    Returns:
        D, (M, N) or (L, M, N), of out_dtype.

    Raises:
        TypeError, ValueError: see `_check_gemm_operands` / `_check_w4a16_operands`.
    """
    w4a16 = isinstance(a, torch.Tensor)
    if w4a16:
        _check_w4a16_operands(a, b, out_dtype)
    else:
        _check_gemm_operands(a, b, out_dtype)
    kernel = _kernel_for(a, b, out_dtype, pdl)
    if kernel is not None:
        return kernel(a, b, out_dtype)
    return w4a16_reference(a, b, out_dtype) if w4a16 else gemm_reference(a, b, out_dtype)
