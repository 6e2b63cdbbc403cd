"""The exact NVFP4 GEMM references, ``D = a @ b^T`` for K-major A (M, K) and B (N, K).

``D[m, n] = cast_out(gA * gB * sum_k e2m1(qA[m,k]) sfA[m,k/16] e2m1(qB[n,k]) sfB[n,k/16])``.

`gemm_reference` computes the sum EXACTLY: every e2m1 value is a multiple of 2^-1 and every UE4M3
scale a multiple of 2^-9, so ``a_int = 2*e2m1 * 2^9*sf`` is an integer below 2^22 and the sum is
``2^-20 * sum_k a_int * b_int``, an integer dot product. It is split into 11-bit halves so each
float64 matmul only adds integers below 2^53 (exact for K < 2^30) and recombined in int64 (exact
for K < 2^19). The exact integer sum is then converted to float64 (exact while it is below 2^53
in magnitude, e.g. always for K <= 1024), multiplied by ``2^-20 * gA * gB`` (that scale is exact
in float64; the product rounds once, relative error <= 2^-53) and rounded ONCE to the output
dtype by `format.round_float64` (torch's float64 -> bfloat16/float16 cast rounds twice, through
float32). So D is the correctly rounded exact result unless that lies within 2^-53 (relative;
2^-52 for integer sums past 2^53) of a rounding boundary of the output dtype (a midpoint, or the
overflow threshold), where it may be the other neighbour. An exact midpoint (a tie) is itself a
float64, so for integer sums below 2^53 it is reached exactly and ties to even. A kernel
accumulating in float32 is then judged against the true value.

These run wherever the operands live and are only ever called explicitly: `tk_cute.nvfp4.gemm`
never falls back to them on a CUDA device.
"""

from __future__ import annotations

import torch

from . import validate
from .format import e2m1_decode, e4m3_decode, round_float64, unpack_fp4
from .tensor import SF_VEC, NVFP4Tensor

_SPLIT = 11  # bits per half of an operand integer (|a_int| < 2^22)


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
        TypeError, ValueError: see `validate.gemm_operands`.
    """
    if not isinstance(a, NVFP4Tensor):
        raise TypeError(f"gemm_reference operand a must be an NVFP4Tensor, got "
                        f"{type(a).__name__} (W4A16: w4a16_reference)")
    validate.gemm_operands(a, b, out_dtype)
    acc = _exact_int_matmul_nt(_operand_integers(a), _operand_integers(b))
    scale = a.global_scale.double() * b.global_scale.double() * 2.0**-20  # exact in float64
    return round_float64(acc.double() * scale, out_dtype)


def w4a16_reference(a: torch.Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``D = a @ deq(b)^T`` in float64 (bf16 activations and decoded weights are exact there,
    and so is each product; the K-term sum rounds in float64), then rounded once to out_dtype
    (`format.round_float64`). Shapes as `tk_cute.nvfp4.gemm`'s W4A16 forms."""
    if isinstance(a, NVFP4Tensor):
        raise TypeError("w4a16_reference takes bfloat16 activations (W4A4: gemm_reference)")
    validate.gemm_operands(a, b, out_dtype)
    return round_float64(a.double() @ b.dequantize(torch.float64).transpose(-1, -2), out_dtype)
