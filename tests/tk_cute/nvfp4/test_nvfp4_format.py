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
    # torch.float4_e2m1fn_x2 stores element 2i in the low nibble; its bytes are ours.
    codes = torch.randint(0, 16, (4, 32), dtype=torch.uint8)
    as_fp4 = pack_fp4(codes).view(torch.float4_e2m1fn_x2)
    assert as_fp4.shape == (4, 16)
    assert torch.equal(as_fp4.view(torch.uint8), pack_fp4(codes))
