"""gemm / gemm_reference: D = a @ b^T on NVFP4 operands, and the operand checks."""

from fractions import Fraction

import pytest
import torch

from tk_cute.nvfp4 import (
    NVFP4Tensor,
    dequantize,
    gemm,
    gemm_reference,
    quantize,
    to_blocked,
    w4a16_reference,
)
from tk_cute.nvfp4.reference import _exact_int_matmul_nt


def operands(shape_a, shape_b, spread=2.0):
    return quantize(torch.randn(shape_a) * spread), quantize(torch.randn(shape_b) * spread)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape_a, shape_b", [((130, 64), (72, 64)), ((2, 33, 96), (2, 20, 96)), ((1, 16), (1, 16))]
)
def test_gemm_reference_vs_float64_matmul(shape_a, shape_b, out_dtype, seed):
    a, b = operands(shape_a, shape_b)
    d = gemm_reference(a, b, out_dtype=out_dtype)
    assert d.dtype == out_dtype and d.shape == (*shape_a[:-1], shape_b[-2])
    A, B = dequantize(a, torch.float64), dequantize(b, torch.float64)  # exact decodes
    d64 = A @ B.transpose(-1, -2)
    # Tolerance: d is the exact sum rounded (float64, then out_dtype): half an ulp of out_dtype
    # (2^-24 fp32, 2^-9 bf16, 2^-11 fp16, relative) plus the float64 matmul's own summation
    # error, at most K * 2^-53 * sum_k |A||B| (bounded by 2^-40 * that sum here).
    rel = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10}[out_dtype]
    mag = A.abs() @ B.abs().transpose(-1, -2)
    assert ((d.double() - d64).abs() <= rel * d64.abs() + 2.0**-40 * mag).all()
    assert torch.equal(gemm(a, b, out_dtype=out_dtype), d)


def test_gemm_default_out_dtype_is_bf16(seed):
    a, b = operands((32, 32), (16, 32))
    assert gemm(a, b).dtype == torch.bfloat16
    assert torch.equal(gemm(a, b), gemm_reference(a, b))


def test_gemm_reference_is_exactly_rounded(seed):
    # Exact oracle: Python integers/fractions. float32 output of the exact sum times gA * gB,
    # correctly rounded to float64 then to float32 (what the docstring promises).
    a, b = operands((5, 64), (4, 64), spread=100.0)
    A = dequantize(a, torch.float64) / a.global_scale.double()  # e2m1 * sf, exact
    B = dequantize(b, torch.float64) / b.global_scale.double()
    ga, gb = Fraction(a.global_scale.item()), Fraction(b.global_scale.item())
    d = gemm_reference(a, b, out_dtype=torch.float32)
    for m in range(5):
        for n in range(4):
            exact = sum(Fraction(x) * Fraction(y) for x, y in zip(A[m].tolist(), B[n].tolist()))
            want = torch.tensor(float(exact * ga * gb), dtype=torch.float64).float()
            assert d[m, n].item() == want.item()


def single_element(code: int, g: float) -> NVFP4Tensor:
    """A (1, 16) operand: E2M1 `code` at k = 0, zeros elsewhere, block scale 1.0 (0x38)."""
    data = torch.zeros(1, 8, dtype=torch.uint8)
    data[0, 0] = code  # element 0: the low nibble
    scales = to_blocked(torch.tensor([[0x38]], dtype=torch.uint8))
    return NVFP4Tensor(data, scales, torch.tensor(g, dtype=torch.float32), (1, 16))


# D = 1.5 * g (A: code 3 = 1.5 times g, B: code 2 = 1.0 times 1), exact in float64, just off a
# midpoint of the output format by less than float32's half ulp (2^-24 at 1.0), so a float32
# step lands on the midpoint and ties to even, the wrong neighbour:
#   bf16: g = 0x3F2CAAAA, D = 1.01171875 - 2^-24, nearest 1.0078125 (float32 route: 1.015625);
#   fp16: g = 11212118 * 2^-24, D = 1 + 5 * 2^-11 + 2^-24, nearest 1 + 3 * 2^-10 (float32
#   route: the tie 1 + 5 * 2^-11, to even 1 + 2 * 2^-10).
NEAR_MIDPOINT = [
    (torch.bfloat16, torch.tensor(0x3F2CAAAA, dtype=torch.int32).view(torch.float32).item(),
     1.01171875 - 2.0**-24, 1.0078125),
    (torch.float16, 11212118 * 2.0**-24, 1 + 5 * 2.0**-11 + 2.0**-24, 1 + 3 * 2.0**-10),
]


@pytest.mark.parametrize("out_dtype, g, exact, nearest", NEAR_MIDPOINT, ids=["bf16", "fp16"])
def test_references_round_once_to_bf16_and_fp16(out_dtype, g, exact, nearest):
    # Regression (double rounding through float32 in the float64 -> out_dtype cast).
    assert 1.5 * g == exact
    assert torch.tensor([exact], dtype=torch.float64).to(out_dtype).item() != nearest
    a, b = single_element(3, g), single_element(2, 1.0)
    assert gemm_reference(a, b, out_dtype=torch.float32).item() == float(torch.tensor(exact))
    assert gemm_reference(a, b, out_dtype=out_dtype).item() == nearest
    x = torch.zeros(1, 16, dtype=torch.bfloat16)
    x[0, 0] = 1.5
    assert w4a16_reference(x, single_element(2, g), out_dtype=out_dtype).item() == nearest
    assert dequantize(a, out_dtype)[0, 0].item() == nearest


def test_exact_int_matmul_with_large_k(seed):
    # Operands near the 2^22 limit and K = 4096: naive float64 sums would exceed 2^53.
    lim = 12 * 229376  # 2 * 6 * 512 * 448
    a = torch.randint(-lim, lim + 1, (3, 4096), dtype=torch.int64)
    b = torch.randint(-lim, lim + 1, (2, 4096), dtype=torch.int64)
    a[0] = lim
    b[0] = lim
    got = _exact_int_matmul_nt(a, b)
    rows, cols = a.tolist(), b.tolist()
    want = torch.tensor([[sum(x * y for x, y in zip(r, s)) for s in cols] for r in rows])
    assert torch.equal(got, want)
    assert got[0, 0].item() == 4096 * lim * lim > 2**53


def test_gemm_reference_is_exact_past_the_int64_sum(seed, monkeypatch):
    """K = 1.22 M of values near one magnitude: the operand integers' dot product passes 2^63
    (it wrapped to a negative D before K >= 2^19 took the wide sum); D is the float64 product
    of the exact decodes, within fp32 rounding and that sum's own error."""
    from tk_cute.nvfp4 import reference

    K = 1_220_000
    a, b = quantize(1 + 0.1 * torch.rand(1, K)), quantize(1 + 0.1 * torch.rand(2, K))
    d = gemm(a, b, out_dtype=torch.float32).double()
    d64 = dequantize(a, torch.float64) @ dequantize(b, torch.float64).t()
    assert d64.min() > 1e6
    assert ((d - d64).abs() <= (2.0**-24 + K * 2.0**-52) * d64).all(), (d, d64)
    monkeypatch.setattr(reference, "MAX_K", 64)
    with pytest.raises(ValueError, match="K < 2\\^31 .*got K=64"):
        gemm_reference(*operands((2, 64), (3, 64)))


def test_gemm_zero_operand_gives_zero(seed):
    a = quantize(torch.zeros(8, 32))
    b = quantize(torch.randn(4, 32))
    assert (gemm(a, b, out_dtype=torch.float32) == 0).all()


# --------------------------------------------------------------------------- bad operands


def test_gemm_rejects_bad_operands(seed):
    a, b = operands((8, 32), (4, 32))
    with pytest.raises(ValueError, match=r"K mismatch: a has K=32, b has K=48"):
        gemm(a, quantize(torch.randn(4, 48)))
    with pytest.raises(ValueError, match=r"must both be 2-D .* or both 3-D"):
        gemm(a, quantize(torch.randn(2, 4, 32)))
    with pytest.raises(ValueError, match=r"batch mismatch: a has L=2, b has L=3"):
        gemm(quantize(torch.randn(2, 8, 32)), quantize(torch.randn(3, 4, 32)))
    with pytest.raises(TypeError, match=r"out_dtype must be .*got torch.float64"):
        gemm(a, b, out_dtype=torch.float64)
    with pytest.raises(TypeError, match=r"out_dtype must be .*got torch.int8"):
        gemm_reference(a, b, out_dtype=torch.int8)
    with pytest.raises(TypeError, match=r"operand b must be an NVFP4Tensor .*got Tensor"):
        gemm(a, torch.randn(4, 32))
    with pytest.raises(TypeError, match=r"out_dtype must be .*\(a torch.dtype; or 'nvfp4'\), "
                                        r"got 'float32'"):
        gemm(a, b, "float32")
    x = torch.randn(8, 32).bfloat16()
    with pytest.raises(TypeError, match=r"W4A16 activations must be a dense \(strided\) "
                                        r"tensor, got layout torch.sparse_coo"):
        gemm(x.to_sparse(), b)  # (the kernels read it by address: it has none)
    with pytest.raises(TypeError, match=r"gemm: out must be a dense \(strided\) tensor, got "
                                        r"layout torch.sparse_coo"):
        gemm(a, b, out=torch.zeros(8, 4, dtype=torch.bfloat16).to_sparse())
    b_meta = NVFP4Tensor(b.data.to("meta"), b.scales.to("meta"), b.global_scale.to("meta"), b.shape)
    with pytest.raises(ValueError, match=r"one device: a is on cpu, b on meta"):
        gemm(a, b_meta)


@pytest.mark.gpu
def test_gemm_reference_on_cuda_matches_cpu(seed):
    a, b = operands((2, 130, 96), (2, 40, 96))
    for out_dtype in (torch.float32, torch.bfloat16):
        cpu = gemm_reference(a, b, out_dtype=out_dtype)
        gpu = gemm_reference(a.to("cuda"), b.to("cuda"), out_dtype=out_dtype)
        assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)
