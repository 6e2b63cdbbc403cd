"""Element-wise bounds for row-parallel results, derived from the arithmetic (as
`tk_cute.testing` does for one GEMM).

A row-parallel ``D = a @ W^T`` over p ranks (K cut in p slices of k = K / p) computes on rank i
the partial ``s_i = a_i @ W_i^T`` with the GEMM's own error, rounds it to the reduce dtype
(``P_i``), sums the p partials in the reduce dtype in the collective's order (``T``), and rounds
T to D's dtype. With ``d = sum_i s_i`` the exact product, ``mag = |a| @ |W|^T`` (elementwise
``>= sum_i |s_i|``), u_r and u_o the unit roundoffs of the reduce and output dtypes
(`tk_cute.testing.UNIT_ROUNDOFF`):

    |P_i - s_i| <= e1 * mag_i,          e1 = g + u_r * (1 + g)
    |T - sum P_i| <= gamma(p - 1) * sum |P_i| <= gamma(p - 1) * (1 + e1) * mag
    E = (e1 + gamma(p - 1) * (1 + e1)) * mag + p * tiny_r             (|T - d| <= E)
    |D - d| <= u_o * |d| + (1 + u_o) * E + tiny_o      (u_o = 0 when D's dtype is the reduce's)

where ``gamma(n) = n * u_r / (1 - n * u_r)`` bounds any order of n additions (Higham, Accuracy
and Stability of Numerical Algorithms, 2nd ed., lemma 3.1 / eq. 4.4), tiny is half the
smallest subnormal, and g is one partial GEMM's relative error: ``k * 2^-53`` on the CPU
references (W4A16's float64 sum of k exact products; W4A4's exact sum times a float64 scale)
and ``(k + EXTRA_ROUNDINGS) * 2^-24`` for a kernel (`tk_cute.testing`). In words: an fp32
reduction adds about ``p * 2^-24 * mag`` to one GEMM's error (p = 8: 2^-21, far below a bf16
output's rounding of 2^-8 * |d|); a bf16 reduction about ``p * 2^-8 * mag`` (p = 8: 2^-5 of
mag, larger than the output's own rounding).

The order of the sum is the collective's (NCCL ring or tree, gloo's ring): not fixed by this
library, the same bits on every rank. For p = 2 it is one addition, commutative, so the fp32
result is exactly ``fl(P_0 + P_1)`` whatever the order: bitwise reproducible, and equal to
computing both partials on one process and adding them.

Against the single-process result R (``round(d)`` on the CPU reference): D and R can only
differ where d lies within E of the rounding boundary between them (`explain_mismatches`).
"""

from __future__ import annotations

import torch

from tk_cute.testing import EXTRA_ROUNDINGS, HALF_SUBNORMAL, UNIT_ROUNDOFF, exact


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def reduction_error(a, b, world_size: int, reduce_dtype: torch.dtype = torch.float32, *,
                    kernel: bool = False, device=None):
    """(d, mag, E): the exact product of the FULL operands a (M, K) / (..., K) and b (N, K), the
    magnitude ``|a| @ |b|^T`` and the bound E on ``|T - d|`` of the module docstring (T: the
    reduced sum in `reduce_dtype`, before the cast to D's dtype).

    Args:
        a, b: the unsharded operands (a bfloat16 tensor or an NVFP4Tensor; b an NVFP4Tensor),
            as `tk_cute.testing.exact` takes them.
        world_size: p, the number of K slices.
        reduce_dtype: torch.float32 or torch.bfloat16.
        kernel: the partials come from GPU kernels (fp32 accumulation) instead of the CPU
            references.
        device: where to compute (default: b's).
    """
    A, B = exact(a), exact(b)
    if device is not None:
        A, B = A.to(device), B.to(device)
    k = A.shape[-1] // world_size
    d = A @ B.transpose(-1, -2)
    mag = A.abs() @ B.abs().transpose(-1, -2)
    g = (k + EXTRA_ROUNDINGS) * 2.0**-24 if kernel else k * 2.0**-53
    u_r = UNIT_ROUNDOFF[reduce_dtype]
    e1 = g + u_r * (1 + g)
    E = (e1 + _gamma(world_size - 1, u_r) * (1 + e1)) * mag + world_size * HALF_SUBNORMAL[
        reduce_dtype]
    return d, mag, E


def row_parallel_bound(a, b, world_size: int, reduce_dtype: torch.dtype = torch.float32,
                       out_dtype: torch.dtype = torch.bfloat16, *, kernel: bool = False,
                       device=None):
    """(d, bound): the exact product and the per-element bound on ``|D - d|`` for a row-parallel
    D of `out_dtype` (module docstring; arguments as `reduction_error`)."""
    d, _, E = reduction_error(a, b, world_size, reduce_dtype, kernel=kernel, device=device)
    u_o = 0.0 if out_dtype == reduce_dtype else UNIT_ROUNDOFF[out_dtype]
    tiny = 0.0 if out_dtype == reduce_dtype else HALF_SUBNORMAL[out_dtype]
    return d, u_o * d.abs() + (1 + u_o) * E + tiny


def assert_row_parallel_close(out: torch.Tensor, a, b, world_size: int,
                              reduce_dtype: torch.dtype = torch.float32, what: str = "row parallel",
                              *, kernel: bool | None = None) -> None:
    """Raise AssertionError unless every element of a row-parallel `out` is within
    `row_parallel_bound` of the exact product of the full operands (`kernel` default: out is
    on a GPU); the message names the worst element."""
    kernel = out.is_cuda if kernel is None else kernel
    d, bound = row_parallel_bound(a, b, world_size, reduce_dtype, out.dtype, kernel=kernel,
                                  device=out.device)
    d, bound = d.reshape(out.shape), bound.reshape(out.shape)
    err = (out.double() - d).abs()
    bad = ~(err <= bound)  # NaN fails too
    if bool(bad.any()):
        i = int(torch.where(bad, err / bound, torch.zeros_like(err)).flatten().argmax())
        at = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), d.shape))
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {out.numel()} elements outside the bound; worst at "
            f"{at}: got {out[at].item()!r}, exact {d[at].item()!r}, bound {bound[at].item():.3g}")


def explain_mismatches(out: torch.Tensor, ref: torch.Tensor, a, b, world_size: int,
                       reduce_dtype: torch.dtype = torch.float32) -> int:
    """Count the elements where a row-parallel `out` differs from the single-process `ref` (the
    CPU reference: ``round(d)``), asserting that each one is explained: the two are adjacent
    values of their dtype and the exact d lies within E (+ the reference's own float64 error)
    of the midpoint between them, the rounding boundary the reduction's error crossed.

    Returns:
        The number of differing elements.

    Raises:
        AssertionError: a difference the reduction's error cannot explain.
    """
    if out.shape != ref.shape or out.dtype != ref.dtype:
        raise AssertionError(f"shapes / dtypes differ: {out.shape} {out.dtype}, {ref.shape} "
                             f"{ref.dtype}")
    d, mag, E = reduction_error(a, b, world_size, reduce_dtype, device=out.device)
    d, mag, E = (t.reshape(out.shape) for t in (d, mag, E))
    diff = out != ref
    n = int(diff.sum())
    if not n:
        return 0
    o, r = out[diff].double(), ref[diff].double()
    # Adjacent: nothing of the dtype lies strictly between them.
    step = torch.nextafter(ref[diff], out[diff]).double()
    if not torch.equal(step, o):
        raise AssertionError(f"{n} elements differ, some by more than one step of {out.dtype}")
    slack = E[diff] + out.shape[-1] * 2.0**-53 * mag[diff]
    far = ((d[diff] - (o + r) / 2).abs() > slack)
    if bool(far.any()):
        raise AssertionError(f"{int(far.sum())} of {n} differing elements are not near a "
                             f"rounding boundary: the reduction's error does not explain them")
    return n
