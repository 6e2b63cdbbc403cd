"""The exact NVFP4 GEMM references, ``D = a @ b^T`` for K-major A (M, K) and B (N, K).

``D[m, n] = cast_out(gA * gB * sum_k e2m1(qA[m,k]) sfA[m,k/16] e2m1(qB[n,k]) sfB[n,k/16])``.

`gemm_reference` computes the sum EXACTLY: every e2m1 value is a multiple of 2^-1 and every UE4M3
scale a multiple of 2^-9, so ``a_int = 2*e2m1 * 2^9*sf`` is an integer below 2^22 and the sum is
``2^-20 * sum_k a_int * b_int``, an integer dot product. It is split into 11-bit halves so each
float64 matmul only adds integers below 2^53 (exact for K < 2^30) and recombined in int64 (exact
for K < 2^19: ``|sum| < K * 2^44``; from K = 2^19 on, `WIDE_K`, the sum takes the UE5M3 path's
Python-integer recombination below, which is exact for K < 2^31, `MAX_K`; larger K raises). The
exact integer sum is then converted to float64 (exact while it is below 2^53 in magnitude, e.g.
always for K <= 1024), multiplied by ``2^-20 * gA * gB`` (that scale is exact
in float64; the product rounds once, relative error <= 2^-53) and rounded ONCE to the output
dtype by `format.round_float64` (torch's float64 -> bfloat16/float16 cast rounds twice, through
float32). So D is the correctly rounded exact result unless that lies within 2^-53 (relative;
2^-52 for integer sums past 2^53) of a rounding boundary of the output dtype (a midpoint, or the
overflow threshold), where it may be the other neighbour. An exact midpoint (a tie) is itself a
float64, so for integer sums below 2^53 it is reached exactly and ties to even. A kernel
accumulating in float32 is then judged against the true value.

UE5M3 scales (``scale_format == "ue5m3"``, either operand): every UE5M3 value is a multiple of
2^-17 up to 114688, so the operand integers ``2*e2m1 * 2^17*sf`` reach 12 * 1.75 * 2^33 < 2^38
(a UE4M3 operand beside one is taken in the same unit, its integers shifted by 8). Their
products no longer fit int64 sums, so each operand is split into four 11-bit limbs (signed top
limb, |limb| < 2^11: every float64 matmul of two limbs adds integers below 2^22, exact for
K < 2^31), the seven digit sums of equal limb weight are exact in int64 (at most four terms
below 2^53), and the exact integer ``sum_s digit_s * 2^(11 s)`` (below 2^122) is formed with
Python integers, multiplied exactly by the integer significands of gA and gB, and converted to
float64 once (Python's int -> float is correctly rounded); the power-of-two exponent is then
applied exactly. So D is again the correctly rounded exact result unless that lies within
2^-53 (relative) of a rounding boundary of the output dtype. (Slower: one Python-integer pass
over D; meant for test sizes.)

These run wherever the operands live and are only ever called explicitly: `tk_cute.nvfp4.gemm`
never falls back to them on a CUDA device.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import validate
from .format import e2m1_decode, round_float64, scale_format, unpack_fp4
from .tensor import SF_VEC, NVFP4Tensor, describe

_SPLIT = 11  # bits per half of an operand integer (|a_int| < 2^22)
WIDE_K = 2**19  # from this K on, the int64 recombination could overflow: the wide path sums
MAX_K = 2**31  # the wide path's float64 limb matmuls are exact below this K
_WIDE_LIMBS = 4  # 11-bit limbs of a UE5M3 operand integer (|a_int| < 2^38 <= 2^44)
_WIDE_QUANTUM = -17  # the unit of the wide path's scales (UE5M3's quantum)


def _operand_integers(q: NVFP4Tensor, quantum_exp: int | None = None) -> torch.Tensor:
    """int64 (..., R, K): 2*e2m1 * sf / 2^quantum_exp, the operand as exact integers; default
    unit the format's quantum (UE4M3: 2^-9, |value| < 2^22; UE5M3: 2^-17, < 2^38)."""
    fmt = scale_format(q.scale_format)
    quantum_exp = fmt.quantum_exp if quantum_exp is None else quantum_exp
    codes2 = (e2m1_decode(unpack_fp4(q.data)) * 2).to(torch.int64)  # -12 .. 12
    sf_int = (fmt.decode(q.scales_logical()).double() * 2.0**-quantum_exp).to(torch.int64)
    return codes2 * sf_int.repeat_interleave(SF_VEC, dim=-1)


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


def _limbs(x: torch.Tensor, n: int) -> list[torch.Tensor]:
    """x = sum_i limb_i 2^(11 i): limbs 0..n-2 in [0, 2^11), the top one signed (float64)."""
    mask = (1 << _SPLIT) - 1
    return [((x >> (_SPLIT * i)) & mask if i < n - 1 else x >> (_SPLIT * i)).double()
            for i in range(n)]


def _exact_wide_matmul_nt(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Exact ``a @ b^T`` (int64 operands below 2^44 in magnitude) as a numpy array of Python
    integers (the module docstring: limbs, int64 digit sums, one Python-integer pass)."""
    n = _WIDE_LIMBS
    A, B = _limbs(a, n), _limbs(b, n)
    mm = lambda x, y: torch.matmul(x, y.transpose(-1, -2)).to(torch.int64)  # noqa: E731
    total = None
    for s in range(2 * n - 1):
        digit = sum(mm(A[i], B[s - i]) for i in range(max(0, s - n + 1), min(s, n - 1) + 1))
        term = digit.cpu().numpy().astype(object) * (1 << (_SPLIT * s))
        total = term if total is None else total + term
    return total


def _wide_reference(a: NVFP4Tensor, b: NVFP4Tensor, out_dtype) -> torch.Tensor:
    acc = _exact_wide_matmul_nt(_operand_integers(a, _WIDE_QUANTUM),
                                _operand_integers(b, _WIDE_QUANTUM))
    # gA gB 2^-36 = ma mb 2^e exactly (float32 significands as integers): one rounding to float64
    (ma, ea), (mb, eb) = (math.frexp(float(g)) for g in (a.global_scale, b.global_scale))
    ia, ib = int(ma * 2**53), int(mb * 2**53)
    exact = (acc * (ia * ib)).astype(np.float64)  # int -> float: correctly rounded
    d = torch.from_numpy(exact).to(a.device) * 2.0 ** (ea + eb - 106 + 2 * _WIDE_QUANTUM - 2)
    return round_float64(d, out_dtype)


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
        TypeError, ValueError: see `validate.gemm_operands`; ValueError for K >= 2^31 (`MAX_K`).
    """
    if not isinstance(a, NVFP4Tensor):
        raise TypeError(f"gemm_reference operand a must be an NVFP4Tensor, got "
                        f"{describe(a)} (W4A16: w4a16_reference)")
    validate.gemm_operands(a, b, out_dtype)
    if a.K >= MAX_K:
        raise ValueError(f"the exact reference takes K < 2^31 (its float64 partial sums stay "
                         f"exact below that), got K={a.K}")
    if "ue5m3" in (a.scale_format, b.scale_format) or a.K >= WIDE_K:
        return _wide_reference(a, b, out_dtype)
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
