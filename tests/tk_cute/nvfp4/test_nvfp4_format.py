"""E2M1 / E4M3 encoders and decoders, exhaustively, and FP4 nibble packing.

The independent oracles here are written from the format definitions (sign, exponent, mantissa
fields; nearest value with ties to the even code), never from tk_cute's own bit tricks.
"""

import math

import numpy as np
import pytest
import torch

from tk_cute.nvfp4 import (
    E2M1_VALUES,
    e2m1_decode,
    e2m1_encode_rne,
    e4m3_decode,
    e4m3_encode_rne,
    pack_fp4,
    unpack_fp4,
)
from tk_cute.nvfp4.format import round_float64

E2M1_MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e4m3_from_fields(b: int) -> float:
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return math.nan
    return s * (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


E4M3_POS = [e4m3_from_fields(b) for b in range(0x7F)]  # finite non-negative, ascending by code


def nearest_even_code(v: float, grid: list) -> int:
    """Index of the grid value nearest to v >= 0, ties to the even index, saturating."""
    if v >= grid[-1]:
        return len(grid) - 1
    i = int(np.searchsorted(grid, v, side="right")) - 1
    lo, hi = v - grid[i], grid[i + 1] - v
    if lo != hi:
        return i if lo < hi else i + 1
    return i if i % 2 == 0 else i + 1


def f32(values):
    return torch.tensor(values, dtype=torch.float32)


def nextafter(x: torch.Tensor, direction: float) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, direction))


# ---------------------------------------------------------------------------------- E2M1


def test_e2m1_decode_all_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    got = e2m1_decode(codes)
    want = f32([s * m for s in (1.0, -1.0) for m in E2M1_MAGS])
    assert torch.equal(got, want)
    assert torch.equal(torch.signbit(got), codes >= 8)  # code 8 is -0.0
    assert list(E2M1_VALUES) == want.tolist()


def test_e2m1_encode_representable_values_and_signed_zero():
    vals = f32(E2M1_VALUES)  # includes -0.0 at code 8
    assert torch.equal(e2m1_encode_rne(vals), torch.arange(16, dtype=torch.uint8))


@pytest.mark.parametrize(
    "x, code",
    [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)],
)
def test_e2m1_midpoint_ties_to_even(x, code):
    # Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4 (codes of those values).
    assert int(e2m1_encode_rne(f32([x]))) == code
    assert int(e2m1_encode_rne(f32([-x]))) == code | 8


def test_e2m1_just_above_and_below_every_midpoint():
    mags = f32(E2M1_MAGS)
    mids = (mags[:-1] + mags[1:]) / 2  # exact in fp32
    lower = torch.arange(7, dtype=torch.uint8)
    for sign, sbit in ((1.0, 0), (-1.0, 8)):
        assert torch.equal(e2m1_encode_rne(sign * nextafter(mids, -1.0)), lower | sbit)
        assert torch.equal(e2m1_encode_rne(sign * nextafter(mids, 10.0)), (lower + 1) | sbit)
        # "below" for a negative midpoint means towards zero
        above_neg = nextafter(sign * mids, 0.0)
        assert torch.equal(e2m1_encode_rne(above_neg), lower | sbit)


def test_e2m1_saturation():
    x = f32([6.0, 6.5, 7.0, 100.0, 3.0e38, math.inf])
    assert torch.equal(e2m1_encode_rne(x), torch.full((6,), 7, dtype=torch.uint8))
    assert torch.equal(e2m1_encode_rne(-x), torch.full((6,), 15, dtype=torch.uint8))


def test_e2m1_negative_values_rounding_to_zero_are_minus_zero():
    x = f32([-0.0, -1e-45, -1e-30, -0.1, -0.25])  # all round to zero
    assert torch.equal(e2m1_encode_rne(x), torch.full((5,), 8, dtype=torch.uint8))
    assert torch.equal(e2m1_encode_rne(-x), torch.zeros(5, dtype=torch.uint8))


def test_e2m1_dense_grid_against_nearest_even(seed):
    # Every multiple of 2^-10 in [-8, 8] (hits every midpoint exactly) plus random float32.
    grid = torch.arange(-8 * 1024, 8 * 1024 + 1, dtype=torch.float32) / 1024
    rnd = (torch.rand(20000) * 16 - 8).to(torch.float32)
    x = torch.cat([grid, rnd])
    want = [
        nearest_even_code(abs(v), E2M1_MAGS) | (8 if math.copysign(1, v) < 0 else 0)
        for v in x.tolist()
    ]
    assert e2m1_encode_rne(x).tolist() == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_e2m1_encode_low_precision_inputs_match_fp32(dtype, seed):
    x = (torch.randn(4096) * 3).to(dtype)
    assert torch.equal(e2m1_encode_rne(x), e2m1_encode_rne(x.float()))


# ---------------------------------------------------------------------------------- E4M3


def test_e4m3_decode_all_bytes_matches_torch_and_fields():
    b = torch.arange(256, dtype=torch.uint8)
    got = e4m3_decode(b)
    torch_vals = b.view(torch.float8_e4m3fn).float()
    nan = torch.isnan(torch_vals)
    assert nan.nonzero().flatten().tolist() == [0x7F, 0xFF]
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan], torch_vals[~nan])
    assert torch.equal(torch.signbit(got[~nan]), (b[~nan] >= 0x80))  # 0x80 decodes to -0.0
    fields = f32([e4m3_from_fields(i) for i in range(256)])
    assert torch.equal(got[~nan], fields[~nan])


def test_e4m3_encode_decode_round_trip_all_finite_bytes():
    b = torch.arange(256, dtype=torch.uint8)
    finite = ~torch.isnan(e4m3_decode(b))
    assert torch.equal(e4m3_encode_rne(e4m3_decode(b[finite])), b[finite])


def test_e4m3_midpoints_ties_to_even_and_neighbours():
    vals = f32(E4M3_POS)  # bytes 0..0x7E
    mids = (vals[:-1] + vals[1:]) / 2  # exact in fp32 (at most 5 significant bits)
    lower = torch.arange(0x7E, dtype=torch.uint8)
    even = torch.where(lower % 2 == 0, lower, lower + 1)
    assert torch.equal(e4m3_encode_rne(mids), even)
    assert torch.equal(e4m3_encode_rne(nextafter(mids, -1.0)), lower)
    assert torch.equal(e4m3_encode_rne(nextafter(mids, 1000.0)), lower + 1)
    assert torch.equal(e4m3_encode_rne(-mids), even | 0x80)
    # Explicit subnormal cases: 2^-10 is the tie between 0 and 2^-9 -> 0; 3*2^-10 -> 2*2^-9.
    x = f32([2.0**-10, 3 * 2.0**-10, 7.5 * 2.0**-9, 1e-45, 1e-40])
    assert e4m3_encode_rne(x).tolist() == [0, 2, 8, 0, 0]


def test_e4m3_saturates_to_448():
    x = f32([448.0, 449.0, 464.0, 465.0, 480.0, 1.0e6, 3.0e38, math.inf])
    assert e4m3_encode_rne(x).tolist() == [0x7E] * 8
    assert e4m3_encode_rne(-x).tolist() == [0xFE] * 8
    assert e4m3_encode_rne(f32([math.nan])).tolist() == [0x7F]
    assert e4m3_encode_rne(f32([-0.0, 0.0])).tolist() == [0x80, 0x00]


def test_e4m3_matches_torch_cast_on_random_values(seed):
    # torch's float -> float8_e4m3fn cast is RNE; it agrees with satfinite for |x| <= 448.
    n = 200_000
    log_mag = torch.rand(n, dtype=torch.float64) * (math.log2(448) + 12) - 12  # 2^-12 .. 448
    mag = torch.exp2(log_mag).to(torch.float32).clamp(max=448.0)
    sign = torch.where(torch.rand(n) < 0.5, -1.0, 1.0)
    x = torch.cat([mag * sign, torch.rand(n) * 448])
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(e4m3_encode_rne(x), want)


def test_e4m3_brute_force_nearest_on_random_values(seed):
    x = torch.exp2(torch.rand(20000) * 20 - 12).to(torch.float32)  # 2^-12 .. 2^8, some > 448
    want = [nearest_even_code(v, E4M3_POS) for v in x.tolist()]
    assert e4m3_encode_rne(x).tolist() == want


# ---------------------------------------------------------------------------------- packing


def test_pack_unpack_round_trip_and_nibble_order(seed):
    codes = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.shape == (3, 5, 32) and packed.dtype == torch.uint8
    assert torch.equal(packed, codes[..., 0::2] + 16 * codes[..., 1::2])  # even -> low nibble
    assert torch.equal(unpack_fp4(packed), codes)
    assert pack_fp4(torch.tensor([1, 2], dtype=torch.uint8)).tolist() == [0x21]
    with pytest.raises(ValueError, match="even last dimension"):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))


def test_packed_bytes_are_torch_float4_x2_layout(seed):
    # The layout, stated independently of pack_fp4 (nvfp4.md; PTX cvt.rn.satfinite.e2m1x2.f32
    # d, a, b puts b in the low nibble): a row of K codes is the little-endian integer
    # sum_k code_k * 16^k, so byte i holds element 2i in bits 0-3 and element 2i+1 in bits 4-7.
    # The codes come from values through the field definition (sign << 3 | exponent << 1 |
    # mantissa, exponent bias 1, one subnormal 0.5), not through the library's tables.
    def field_code(v: float) -> int:
        mag = abs(v)
        e = 0 if mag < 1 else int(math.log2(mag)) + 1  # biased exponent, 0 for 0 and 0.5
        man = int(mag * 2) if e == 0 else int(mag / 2.0 ** (e - 1) * 2) - 2
        return (8 if math.copysign(1.0, v) < 0 else 0) | e << 1 | man

    assert [field_code(v) for v in E2M1_VALUES] == list(range(16))
    vals = f32(E2M1_VALUES)[torch.randint(0, 16, (4, 32))]
    packed = pack_fp4(e2m1_encode_rne(vals))
    for row, got in zip(vals.tolist(), packed.tolist()):
        as_int = sum(field_code(v) << (4 * k) for k, v in enumerate(row))
        assert bytes(got) == as_int.to_bytes(16, "little")
    assert pack_fp4(e2m1_encode_rne(f32([0.5, -6.0]))).tolist() == [0xF1]  # 1 low, 15 high
    # torch.float4_e2m1fn_x2 is a shell dtype: one element per BYTE (a pair of FP4 values), so
    # our (M, K/2) bytes view as an (M, K/2) tensor with no copy. torch 2.13 cannot convert it
    # to any other dtype, so the dtype itself says nothing about nibble order (see the next
    # test for what torch does state).
    as_fp4 = packed.view(torch.float4_e2m1fn_x2)
    assert as_fp4.shape == (4, 16) and as_fp4.element_size() == 1
    assert as_fp4.data_ptr() == packed.data_ptr()


def test_torch_onnx_float4_x2_unpacking_agrees(seed):
    # torch's own statement of the float4_e2m1fn_x2 nibble order: the ONNX exporter's unpacker
    # (element 2i from the low nibble). Private API: skip where this torch lacks it.
    try:
        from torch.onnx._internal.exporter._type_casting import unpack_float4x2_as_uint8
    except ImportError:
        pytest.skip("this torch has no ONNX float4x2 unpacker")
    codes = torch.randint(0, 16, (3, 4, 64), dtype=torch.uint8)
    got = unpack_float4x2_as_uint8(pack_fp4(codes).view(torch.float4_e2m1fn_x2))
    assert np.array_equal(got, codes.numpy())


# ---------------------------------------------------------------------------------- rounding

# (significand bits p, smallest normal exponent, largest exponent) of the output formats
FORMATS = {
    torch.float32: (24, -126, 127),
    torch.bfloat16: (8, -126, 127),
    torch.float16: (11, -14, 15),
}
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def correctly_rounded(x: float, dtype: torch.dtype) -> float:
    """x rounded once to `dtype` (nearest, ties to even, +-inf past the largest finite value),
    in exact integer arithmetic on x = n * 2^e."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    p, emin, emax = FORMATS[dtype]
    num, den = abs(x).as_integer_ratio()  # den is a power of two
    e = 1 - den.bit_length()
    q = max(num.bit_length() - 1 + e, emin) - (p - 1)  # the quantum 2^q at x's magnitude
    if q > e:
        shift = q - e
        m, rem, half = num >> shift, num & ((1 << shift) - 1), 1 << (shift - 1)
        m += rem > half or (rem == half and m & 1)
    else:
        m = num << (e - q)
    top = emax - p + 1  # the largest finite value is (2^p - 1) * 2^top
    if q >= top and m << (q - top) > (1 << p) - 1:
        return math.copysign(math.inf, x)
    return math.copysign(math.ldexp(m, q), x)


def assert_rounds_once(x: torch.Tensor, dtype: torch.dtype):
    got = round_float64(x, dtype)
    assert got.dtype == dtype and got.shape == x.shape
    want = torch.tensor([correctly_rounded(v, dtype) for v in x.tolist()], dtype=dtype)
    nan = torch.isnan(x)
    assert torch.equal(torch.isnan(got), nan)
    bad = (got.view(INT_VIEW[dtype]) != want.view(INT_VIEW[dtype])) & ~nan  # signs of 0 too
    first = [(x[i].item(), got[i].item(), want[i].item()) for i in bad.nonzero()[:5, 0]]
    assert not bad.any(), first
    return want


def midpoints(dtype: torch.dtype, lo_exp: int, hi_exp: int, n: int) -> torch.Tensor:
    """n random midpoints between consecutive `dtype` values (positive, float64, exact)."""
    p, _, _ = FORMATS[dtype]
    mags = torch.exp2(torch.randint(lo_exp, hi_exp, (n,)).double())
    k = torch.randint(0, 2 ** (p - 1), (n,)).double()
    return (1 + (2 * k + 1) * 2.0**-p) * mags  # halfway above the p-bit value 1 + k 2^(1-p)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_round_float64_random(dtype, seed):
    # Random significands over the whole range where the format rounds, underflows or overflows.
    lo, hi = {torch.float16: (-30, 18)}.get(dtype, (-155, 130))
    n = 20000
    x = torch.ldexp(torch.rand(n, dtype=torch.float64) + 0.5, torch.randint(lo, hi, (n,)))
    x = torch.where(torch.rand(n) < 0.5, -x, x)
    assert_rounds_once(x, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_float64_adversarial(dtype, seed):
    # Exact midpoints m of `dtype` (ties, to even) and m (1 + f) for offsets f that a float32
    # step rounds back onto m (|f| up to 2^-25 relative, below float32's half ulp): there
    # torch's float64 -> float32 -> dtype cast rounds twice and goes to the even neighbour.
    p, emin, emax = FORMATS[dtype]
    mids = torch.cat([midpoints(dtype, emin, emax, 2000), midpoints(dtype, -2, 2, 500)])
    offs = torch.tensor([0.0] + [s * 2.0**-k for s in (1, -1) for k in (25, 26, 30, 40, 52)],
                        dtype=torch.float64)
    near = (mids[:, None] * (1 + offs)).flatten()
    # subnormal results: k/2 quanta of the smallest subnormal, +- tiny offsets
    sub_q = 2.0 ** (emin - p + 1)
    k = torch.arange(0, 2 ** (p + 1), dtype=torch.float64)
    subs = torch.cat([k * sub_q / 2 * (1 + f) for f in (0.0, 2.0**-30, -(2.0**-30))])
    # overflow: the largest finite value, the midpoint above it (a tie: to inf), and around it
    big = (2 - 2.0 ** (1 - p)) * 2.0**emax
    thr = (2 - 2.0**-p) * 2.0**emax
    edges = [big, thr, thr * (1 - 2.0**-40), thr * (1 + 2.0**-40), thr * (1 - 2.0**-26),
             2.0**128 * (1 - 2.0**-25), 2.0**128 * (1 - 2.0**-26), 2.0**128, 1e39, 1e300,
             1e-50, 2.0**-150, 2.0**-149, 5e-324, 0.0, -0.0, math.inf, -math.inf, math.nan]
    x = torch.cat([near, subs, torch.tensor(edges, dtype=torch.float64)])
    x = torch.cat([x, -x])
    want = assert_rounds_once(x, dtype)
    # the test can fail: torch's own cast is off on many of these inputs
    finite = torch.isfinite(x)
    assert (x.to(dtype).view(INT_VIEW[dtype]) != want.view(INT_VIEW[dtype]))[finite].sum() > 100


def test_round_float64_example_and_dtypes():
    x = torch.tensor([1.01171875 - 2.0**-24], dtype=torch.float64)  # 1.5 * float32 0x3F2CAAAA
    assert round_float64(x, torch.bfloat16).item() == 1.0078125
    assert x.to(torch.bfloat16).item() == 1.015625  # the double rounding this replaces
    assert round_float64(x, torch.float64) is x
    assert round_float64(x, torch.float8_e4m3fn).dtype == torch.float8_e4m3fn
    with pytest.raises(TypeError, match="expects a float64 tensor, got torch.float32"):
        round_float64(x.float(), torch.bfloat16)
    with pytest.raises(TypeError, match="dtype must be .* got torch.int32"):
        round_float64(x, torch.int32)


def test_nvfp4tensor_equality_and_to_a_dtype(seed):
    """== compares shape, format and bytes (a copy is equal, other values are not); .to takes
    devices only and names .dequantize for a dtype."""
    import copy

    from tk_cute.nvfp4 import quantize

    q = quantize(torch.randn(64, 48))
    same = q
    assert q == copy.deepcopy(q) and q == same and (q != copy.deepcopy(q)) is False
    assert q != quantize(torch.randn(64, 48)) and q != quantize(torch.randn(32, 48))
    assert (q == 1) is False
    with pytest.raises(TypeError, match=r"moves the tensor between devices only.*dequantize"):
        q.to(torch.bfloat16)
