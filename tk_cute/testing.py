"""Checks for GEMM results that bound every element, derived from the arithmetic.

`assert_gemm_close(d, a, b)` judges ``D = a @ b^T`` computed the way every tk_cute GEMM computes
it: products that are exact in fp32 (bf16 / fp16 / fp8 operands, NVFP4 e2m1 * ue4m3 values and
bf16 activations: at most 8 x 8 significant bits), summed in fp32 in some order, multiplied by
fp32 scales (global scales, the decode's 2^8), rounded once to D's dtype. With ``d`` the exact
float64 product (computed here from exactly decoded operands) and ``mag = |a| @ |b|^T``:

    |fp32 value - d| <= g * mag,     g = (K + EXTRA_ROUNDINGS) * 2^-24
    |D - fp32 value| <= u * |fp32 value| + tiny

where any order of K fp32 additions errs by at most (K - 1) * 2^-24 * sum |terms| (to first
order; the split-K / stream-K partial sums are more additions of the same terms, and the scale
multiplies add one rounding each: EXTRA_ROUNDINGS covers them), u is the unit roundoff of D's
dtype (2^-8 bf16, 2^-11 fp16, 2^-24 fp32) and tiny half its smallest subnormal. So every
element must satisfy ``|D - d| <= u * |d| + (1 + u) * g * mag + tiny``. A single wrong element
(a missed K block, a stale or unwritten value, NaN) fails it; a norm-only check would not.

FP8 operands on Hopper are the exception to "summed in fp32": the tensor cores add an fp8
wgmma's products into the accumulator keeping about 14 bits (DeepSeek-V3 technical report,
arXiv 2412.19437, section 3.3.2; measured here too: errors up to ~2^-13.6 * mag at K = 64 on
the H200, docs/facts.md#fp8-accumulation). For fp8 inputs the sum's bound is therefore taken
per wgmma K step (32 elements) at 2^-13: ``g = (K / 32 + EXTRA_ROUNDINGS) * 2^-13``.
"""

from __future__ import annotations

import torch

EXTRA_ROUNDINGS = 16  # scale multiplies and partial-sum reductions beyond the K additions
FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_STEP_K, FP8_ACC_ROUNDOFF = 32, 2.0**-13  # Hopper fp8 wgmma: ~14-bit accumulation per step
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
HALF_SUBNORMAL = {torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25, torch.float32: 2.0**-150}


def exact(x) -> torch.Tensor:
    """An operand as float64, exactly: NVFP4Tensors decoded, other tensors widened."""
    from tk_cute.nvfp4 import NVFP4Tensor

    if isinstance(x, NVFP4Tensor):
        return x.dequantize(torch.float64)
    return x.double()


def _fp8(a, b) -> bool:
    return any(getattr(t, "dtype", None) in FP8_TYPES for t in (a, b))


def _bound(A, B, fp8: bool, out_dtype: torch.dtype, B_abs=None):
    """(d, bound) of the module docstring for float64 operands A (..., M, K), B (..., N, K)
    (`B_abs`: |B|, where the caller keeps it over several slices of A)."""
    K = A.shape[-1]
    d = A @ B.transpose(-1, -2)
    mag = A.abs() @ (B.abs() if B_abs is None else B_abs).transpose(-1, -2)
    if fp8:
        g = (-(-K // FP8_STEP_K) + EXTRA_ROUNDINGS) * FP8_ACC_ROUNDOFF
    else:
        g = (K + EXTRA_ROUNDINGS) * 2.0**-24
    u = UNIT_ROUNDOFF[out_dtype]
    return d, u * d.abs() + (1 + u) * g * mag + HALF_SUBNORMAL[out_dtype]


def gemm_bound(a, b, out_dtype: torch.dtype, device=None):
    """(d, bound): the exact float64 ``a @ b^T`` and the per-element error bound of the module
    docstring, on `device` (default: b's)."""
    A, B = exact(a), exact(b)
    if device is not None:
        A, B = A.to(device), B.to(device)
    return _bound(A, B, _fp8(a, b), out_dtype)


CHECK_BYTES = 1 << 30  # the float64 working set of one slice of D's rows (`assert_gemm_close`)


def assert_gemm_close(out: torch.Tensor, a, b, what: str = "gemm") -> None:
    """Raise AssertionError unless every element of `out` (D = a @ b^T) is within the bound of
    the module docstring. A 2-D D is judged in slices of rows whose float64 working set (exact
    value, magnitude, bound, error) is about CHECK_BYTES beside the float64 operands and |b|, so
    a large layer's check fits beside its operands; the message counts the elements outside the
    bound in the first slice that has one and names the worst of them."""
    A, B = exact(a).to(out.device), exact(b).to(out.device)
    fp8 = _fp8(a, b)
    sliced = A.dim() == B.dim() == 2
    if sliced and tuple(out.shape) != (A.shape[0], B.shape[0]):
        raise AssertionError(f"{what}: shape {tuple(out.shape)}, expected "
                             f"{(A.shape[0], B.shape[0])}")
    step = max(1, CHECK_BYTES // (32 * max(1, B.shape[0]))) if sliced else None
    B_abs = B.abs()
    for i in range(0, A.shape[0], step) if sliced else [None]:
        part = slice(i, i + step) if sliced else slice(None)
        d, bound = _bound(A[part], B, fp8, out.dtype, B_abs)
        got = out[part]
        if d.shape != got.shape:
            raise AssertionError(f"{what}: shape {tuple(out.shape)}, expected "
                                 f"{tuple(d.shape)}")
        err = (got.double() - d).abs()
        bad = ~(err <= bound)  # NaN fails too
        if bool(bad.any()):
            excess = torch.where(bad, (err - bound) / bound, torch.zeros_like(err))
            excess = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), excess)
            j = int(excess.flatten().argmax())
            at = tuple(int(v) for v in torch.unravel_index(torch.tensor(j), d.shape))
            rows = f" (rows {i}..{i + got.shape[0] - 1} of {out.shape[0]})" if sliced else ""
            where = (at[0] + i, *at[1:]) if sliced else at
            raise AssertionError(
                f"{what}: {int(bad.sum())} of {got.numel()} elements outside the bound{rows}; "
                f"worst at {where}: got {got[at].item()!r}, exact {d[at].item()!r}, bound "
                f"{bound[at].item():.3g}")


def random_weights(N: int, K: int, device="cuda", scale: float = 0.02):
    """Fresh NVFP4 weights (N, K): `quantize` of normal values times `scale` (a layer's
    magnitude), on `device`."""
    from tk_cute.nvfp4 import quantize

    return quantize(torch.randn(N, K, device=device) * scale)
