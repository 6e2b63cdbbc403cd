"""quantize / dequantize against an independent, slow, per-block reference of the recipe.

`slow_quantize` follows shared/reference/nvfp4.md step by step with numpy float32 scalars (IEEE
single-precision arithmetic, one rounding per operation) and finds the nearest E4M3 / E2M1 value
by searching the value tables (ties to the even code), sharing no code with tk_cute.
"""

import math
import re

import numpy as np
import pytest
import torch
from _oracles import E4M3_POS  # tests/_oracles.py (tests/conftest.py puts it on sys.path)
from _oracles import slow_quantize as oracle_quantize

from tk_cute.nvfp4 import (
    NVFP4Tensor,
    dequantize,
    e2m1_decode,
    e4m3_decode,
    e4m3_encode_rne,
    gemm_reference,
    quantize,
    quantize_reference,
    to_blocked,
    unpack_fp4,
)

F = np.float32
AMAX_FLOOR = 2688 * 2.0**-116  # the recipe's amax floor: s_dec_g >= 2^-116
F32_MAX = float(np.finfo(np.float32).max)




def slow_quantize(x: torch.Tensor, global_scale=None, amax_floor=AMAX_FLOOR):
    """Returns (codes (L, M, K) uint8, logical scales (L, M, K/16) uint8, s_dec_global float32):
    `tests/_oracles.slow_quantize` over the UE4M3 grid.

    `amax_floor` only exists to show why the recipe's floor is not lower (a test below)."""
    xf = x.float().reshape(-1, *x.shape[-2:]).numpy()
    return oracle_quantize(xf, E4M3_POS, 2688, amax_floor, global_scale)


def assert_matches_slow(x, global_scale=None):
    q = quantize(x, global_scale=global_scale)
    codes, scales, s_dec = slow_quantize(x, global_scale)
    shape = x.shape
    assert q.shape == shape and q.device == x.device
    assert q.data.dtype == torch.uint8 and q.data.shape == (*shape[:-1], shape[-1] // 2)
    assert torch.equal(unpack_fp4(q.data).reshape(codes.shape), torch.from_numpy(codes))
    assert torch.equal(q.scales_logical().reshape(scales.shape), torch.from_numpy(scales))
    assert q.global_scale.dtype == torch.float32 and q.global_scale.dim() == 0
    assert q.global_scale.item() == float(s_dec)  # bit-exact float32
    ref = quantize_reference(x, global_scale=global_scale)
    for part in ("data", "scales", "global_scale"):
        assert torch.equal(getattr(ref, part), getattr(q, part))
    return q


def random_input(shape, dtype, spread=1.0):
    return (torch.randn(shape) * spread).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 16), (130, 48), (2, 129, 80), (3, 33, 96)])
def test_quantize_matches_slow_reference(shape, dtype, seed):
    # (130, 48): M % 128 != 0 and K/16 = 3 not a multiple of 4; (2, 129, 80): L > 1, K/16 = 5.
    x = random_input(shape, dtype, spread=3.0)
    q = assert_matches_slow(x)
    assert q.scales.shape[-1] == 512
    if x.numel() >= 1024:  # random data produces negative-rounded-to-zero (-0) codes
        assert (unpack_fp4(q.data) == 8).any()


def test_quantize_huge_dynamic_range_gives_subnormal_and_zero_scales(seed):
    # Block magnitudes log-uniform over 2^-40 .. 2^10: blocks far below amax get subnormal
    # (byte < 8) or zero E4M3 scales.
    L, M, K = 2, 70, 128
    x = torch.randn(L, M, K // 16, 16) * torch.exp2(torch.rand(L, M, K // 16, 1) * 50 - 40)
    x = x.reshape(L, M, K)
    q = assert_matches_slow(x)
    sf = q.scales_logical()
    assert ((sf > 0) & (sf < 8)).any() and (sf == 0).any() and (sf >= 8).any()
    # a zero scale means s_enc = 0: the codes of such (nonzero) blocks are the signs alone
    codes = unpack_fp4(q.data).reshape(L, M, K // 16, 16)
    assert ((codes[sf == 0] & 7) == 0).all() and (codes[sf == 0] == 8).any()


def test_quantize_zero_blocks_and_minus_zero(seed):
    x = torch.randn(64, 64) * 5
    x[3, 16:32] = 0.0  # an all-zero block
    x[7, :16] = -0.0  # an all-(-0) block: codes 8, as an IEEE conversion gives
    x[9, 5] = -0.0
    q = assert_matches_slow(x)
    codes = unpack_fp4(q.data)
    sf = q.scales_logical()
    assert sf[3, 1] == 0 and sf[7, 0] == 0
    assert (codes[3, 16:32] == 0).all() and (codes[7, :16] == 8).all() and codes[9, 5] == 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_all_zero_tensor(dtype):
    q = assert_matches_slow(torch.zeros(3, 130, 32, dtype=dtype))
    assert (q.data == 0).all() and (q.scales == 0).all()
    assert q.global_scale.item() == 2.0**-116  # AMAX_FLOOR / 2688
    assert (q.dequantize() == 0).all()


@pytest.mark.parametrize("gs", [0.01, 1.0, 2.0**-20, 7.3e-6, 2.0**-126, 3.1e-37])
def test_quantize_given_global_scale(gs, seed):
    # gs = 2^-20 makes (blk_amax / 6) / gs exceed 448 for most blocks (saturation to 0x7E);
    # 7.3e-6 is not a power of two, so every step rounds. Below 2^-117 (2^-126, 3.1e-37 ~
    # 2^-121) a subnormal block scale times gs is below 2^-126: the d floor binds there.
    x = torch.randn(2, 96, 64) * 4
    if gs < 2.0**-117:
        x = x * (gs / 256)  # t ~ 0.006: subnormal E4M3 scales, so sf * gs < 2^-126
    q = assert_matches_slow(x, global_scale=gs)
    assert q.global_scale.item() == float(F(gs))
    sf = e4m3_decode(q.scales_logical())
    assert ((sf > 0) & (sf * q.global_scale < 2.0**-126)).any() == (gs < 2.0**-117)
    if gs == 2.0**-20:
        assert (q.scales_logical() == 0x7E).float().mean() > 0.9
    q2 = quantize(x, global_scale=torch.tensor([gs], dtype=torch.float64))
    assert torch.equal(q2.data, q.data) and torch.equal(q2.scales, q.scales)


def test_quantize_overflowing_block_scale_saturates(seed):
    # (blk_amax / 6) * (1 / global_scale) overflows float32 to +inf: the scale saturates to 448.
    x = torch.randn(4, 32) * 1e30
    q = assert_matches_slow(x, global_scale=2.0**-120)
    assert (q.scales_logical() == 0x7E).all()


def test_quantize_flags_a_global_scale_that_clips(seed):
    """`saturated` is 1 exactly where a given global scale cannot reach x's largest magnitude
    (every decoded value is at most 2688 * gs): 1e-9 for values around 1 clips every block."""
    x = torch.randn(8, 64) * 3
    fits = float(x.abs().max()) / 2688
    for gs in (1e-9, fits / 2, fits * 1.01, 1.0, None):
        q = quantize(x, global_scale=gs)
        assert q.saturated.dtype == torch.int32 and q.saturated.shape == ()
        clipped = gs is not None and bool((x.abs() > 2688 * gs).any())
        assert int(q.saturated) == clipped, gs
        if clipped:
            assert (q.dequantize(torch.float64).abs().max() <= 2688 * F(gs) * (1 + 2**-20))
    q = quantize(x.bfloat16(), global_scale=1e-9)
    assert int(q.saturated) == 1 and (q.scales_logical() == 0x7E).all()


def test_quantize_documents_that_tiny_tensors_decode_to_zeros(seed):
    x = torch.randn(16, 64) * 1e-40  # float32 subnormals: amax below 6 * 2^-126
    q = quantize(x)
    assert (q.scales == 0).all() and (q.dequantize() == 0).all() and int(q.saturated) == 0
    doc = " ".join(quantize.__doc__.split())
    assert "6 * 2^-126`` (~7.05e-38" in doc and "decodes to zeros" in doc


# Block maxima a (found by search) where fl(a / 6) and fl(a * fl(1/6)) round to different E4M3
# scales: a kernel computing blk_amax * (1/6) gets these scales wrong.
DIVISION_SENSITIVE_AMAX = [0.1113281175494194, 0.8906249403953552, 7.124999523162842,
                           456.0 - 2**-15]


def division_sensitive_input():
    a = torch.tensor(DIVISION_SENSITIVE_AMAX)
    x = torch.rand(len(a), 32) * 2 - 1
    x[:, 16:] = x[:, 16:] * a[:, None] * 0.99
    x[:, 16 + 5] = -a
    return a, x


def test_quantize_divides_by_6_rather_than_multiplying_by_its_reciprocal(seed):
    # With global_scale = 1, t = fl(a / 6) exactly as rounded.
    a, x = division_sensitive_input()
    q = assert_matches_slow(x, global_scale=1.0)
    by_division = e4m3_encode_rne(torch.div(a, torch.tensor(6.0)))
    by_reciprocal = e4m3_encode_rne(a * torch.tensor(1 / 6, dtype=torch.float32))
    assert torch.equal(q.scales_logical()[:, 1], by_division)
    assert (by_division != by_reciprocal).all()


def test_quantize_non_contiguous_input(seed):
    x = torch.randn(64, 48)
    assert_matches_slow(x.t())


def test_dequantize_error_bound(seed):
    # Derivation. With S = float(sf) * g (the block's decode scale) and y = x * s_enc,
    # s_enc = fl(1 / fl(S)) = (1 + d)/S with |d| <= 2^-23, the E2M1 rounding error is at most
    # half the grid gap h(|y|): 0.25 below 2, 0.5 in [2, 4), 1 in [4, 6]. Saturation: for a
    # normal sf (byte >= 8) RNE makes sf >= t / (1 + 2^-4), so |y| <= 6 * (1 + 2^-4) + tiny,
    # which stays within h = 1 of 6. Hence |x - deq| <= S * (h(|x|/S) + 2^-20 * |x|/S), where
    # the 2^-20 term covers d and the float32 roundings of t (a few ulps).
    # For a subnormal sf (k * 2^-9, k = 1..7) t is within 2^-10 of sf, so |y| <= 6 (k + 1/2)/k
    # and the saturation error is at most 3 * 2^-9 * g; for sf = 0 (t <= 2^-10) deq is 0 and
    # |x| <= 6 * 2^-10 * g = 3 * 2^-9 * g. Both up to the same 2^-20 relative slack.
    L, M, K = 2, 64, 256
    x = torch.randn(L, M, K // 16, 16) * torch.exp2(torch.rand(L, M, K // 16, 1) * 40 - 30)
    x = x.reshape(L, M, K)
    q = quantize(x)
    deq = dequantize(q, dtype=torch.float64)  # exact decode
    g = q.global_scale.double()
    S = (e4m3_decode(q.scales_logical()).double() * g).repeat_interleave(16, -1)
    err = (x.double() - deq).abs()
    u = x.double().abs() / S.clamp(min=2.0**-1000)  # S = 0 only where sf = 0 (tight unused)
    h = torch.where(u < 2, 0.25, torch.where(u < 4, 0.5, 1.0))
    normal = (q.scales_logical() >= 8).repeat_interleave(16, -1)
    tight = torch.where(S > 0, S * (h + 2.0**-20 * u), 0.0)
    assert (err[normal] <= tight[normal]).all()
    floor = 3 * 2.0**-9 * g * (1 + 2.0**-20)
    assert (err[~normal] <= torch.maximum(tight[~normal], floor)).all()
    assert (~normal).any() and normal.any()
    # float32 dequantize is the correctly rounded float64 result
    assert torch.equal(q.dequantize(), deq.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("explicit_gs", [False, True])
def test_round_trip_of_on_grid_values_is_exact(dtype, explicit_gs, seed):
    # x = e2m1 * sf * g with g a power of two, every block holding a +-6 and one block of scale
    # 448: then amax = 2688 g, s_dec = g exactly, each block's t = sf exactly, and x * s_enc
    # = v (1 + d) with |d| <= 2^-24 rounds back to v. Products have <= 6 significant bits, so
    # they are exact in bf16 too.
    L, M, K = 2, 40, 96
    g = 2.0 ** int(torch.randint(-4, 4, ()))
    codes = torch.randint(0, 16, (L, M, K // 16, 16), dtype=torch.uint8)
    codes[..., 0] = torch.where(torch.rand(L, M, K // 16) < 0.5, 7, 15)  # +-6 in every block
    sf = torch.randint(1, 0x7F, (L, M, K // 16), dtype=torch.uint8)  # normal and subnormal
    sf[0, 0, 0] = 0x7E  # 448
    vals = e2m1_decode(codes) * e4m3_decode(sf).unsqueeze(-1) * g
    x = vals.reshape(L, M, K).to(dtype)
    assert torch.equal(x.float(), vals.reshape(L, M, K))
    q = quantize(x, global_scale=g if explicit_gs else None)
    assert q.global_scale.item() == g
    assert torch.equal(q.scales_logical(), sf)
    # -0 codes encode back to +0 only where the value is zero: compare decoded values
    assert torch.equal(q.dequantize(), x.float())
    assert torch.equal(q.dequantize(dtype), x)


def test_nvfp4tensor_container(seed):
    x = torch.randn(2, 130, 48)
    q = quantize(x)
    assert q.M == 130 and q.K == 48 and q.L == 2 and q.ndim == 3
    assert q.scales.shape == (2, 2, 1, 512)
    assert q.to("cpu") is q
    assert "NVFP4Tensor(shape=(2, 130, 48)" in repr(q)
    with pytest.raises(ValueError, match="data must be uint8 of shape"):
        NVFP4Tensor(q.data[..., :-1], q.scales, q.global_scale, q.shape)
    with pytest.raises(ValueError, match="scales must be uint8 of shape"):
        NVFP4Tensor(q.data, q.scales[0], q.global_scale, q.shape)
    with pytest.raises(ValueError, match="global_scale must be a float32 0-dim"):
        NVFP4Tensor(q.data, q.scales, q.global_scale.double(), q.shape)
    with pytest.raises(ValueError, match="share one device"):
        NVFP4Tensor(q.data, q.scales.to("meta"), q.global_scale, q.shape)
    with pytest.raises(TypeError, match="expects an NVFP4Tensor"):
        dequantize(x)


def test_dequantize_bf16_rounds_once():
    # Regression (double rounding): g = float32 0x3F2CAAAA, block [6g, 1.5g, 0, ...] gives
    # sf = 1.0 and codes 6, 1.5, so element 1 decodes to 1.5 g = 1.01171875 - 2^-24 exactly,
    # just below the bf16 midpoint 1.01171875 of 1.0078125 and 1.015625. torch's float64 ->
    # bf16 cast rounds to float32 first (onto the midpoint, ties to even) and gave 1.015625.
    g = torch.tensor(0x3F2CAAAA, dtype=torch.int32).view(torch.float32)
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 6 * g, 1.5 * g
    q = quantize(x, global_scale=g)
    assert q.scales_logical().item() == 0x38  # 1.0
    exact = dequantize(q, torch.float64)
    assert exact[0, 1].item() == 1.01171875 - 2.0**-24
    assert dequantize(q, torch.bfloat16)[0, 1].item() == 1.0078125
    assert exact.to(torch.bfloat16)[0, 1].item() == 1.015625  # what the old cast gave


# --------------------------------------------------------------------------- scale invariance


def wide_range_input(shape, dtype, lo=2.0**-20):
    """Blocks log-uniform over 2^-22 .. 2^0 of amax (zero, subnormal and normal E4M3 scales),
    zero and -0 blocks, elements below `lo` zeroed so that scaling by 2^-105 stays exact, and
    amax exactly 1.3125 (= AMAX_FLOOR * 2^105)."""
    L, M, K = shape
    x = torch.randn(L, M, K // 16, 16) * torch.exp2(-torch.rand(L, M, K // 16, 1) * 22)
    x = torch.where(x.abs() < lo, 0.0, x.clamp(-1, 1)).reshape(L, M, K)
    x[0, 0, :16] = 0.0
    x[-1, 1, 16:32] = -0.0
    x[0, 2, 5] = -1.3125
    return x.to(dtype)


def same_bytes(a, b):
    return torch.equal(a.data, b.data) and torch.equal(a.scales, b.scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("amax", [1.0, 1e-12, 1e-14, 1e-30, AMAX_FLOOR])
def test_quantize_is_scale_invariant_down_to_the_floor(amax, dtype, seed):
    # Regression: the old floors (1e-12 on amax and on each block's decode scale) made tensors
    # with amax below ~6e-12 quantize to garbage (relative error 0.64 at amax 1e-12, 1.0 at
    # 1e-14, against ~0.1 at amax 1). The contract (quantize's docstring) proves the bytes of
    # x * 2^j equal those of x whenever both amaxes are in [AMAX_FLOOR, F32_MAX].
    x0 = wide_range_input((2, 70, 96), dtype)
    j = round(math.log2(amax / 1.3125))
    x = x0 * 2.0**j
    assert torch.equal(x * 2.0**-j, x0)  # the scaling is exact in the input dtype
    assert AMAX_FLOOR <= x.abs().max().item() <= 2 * amax
    q0, q = quantize(x0), quantize(x)
    assert same_bytes(q, q0)
    assert q.global_scale.item() == q0.global_scale.item() * 2.0**j
    deq0, deq = dequantize(q0, torch.float64), dequantize(q, torch.float64)
    assert torch.equal(deq, deq0 * 2.0**j)
    rel = lambda d, v: ((d - v.double()).norm() / v.double().norm()).item()
    assert rel(deq, x) == rel(deq0, x0) < 0.2
    sf = q.scales_logical()
    assert (sf == 0).any() and ((sf > 0) & (sf < 8)).any()  # every scale regime is exercised
    if amax == AMAX_FLOOR:
        assert x.abs().max().item() == AMAX_FLOOR  # the smallest amax the claim covers


def test_quantize_below_the_floor_degrades_but_stays_valid(seed):
    # Below AMAX_FLOOR s_dec_g stays 2^-116: bytes are no longer scale-invariant and the block
    # scales use less of the E4M3 range, but the encoding still follows the recipe. At
    # amax <= 6 * 2^-126 every t = fl(blk_amax / 6) * 2^116 is <= 2^-10: all scales are 0.
    x0 = wide_range_input((1, 40, 64), torch.float32, lo=0.0)
    q0 = quantize(x0)
    x = x0 * 2.0**-106  # amax = AMAX_FLOOR / 2
    q = assert_matches_slow(x)
    assert q.global_scale.item() == 2.0**-116 and not same_bytes(q, q0)
    assert (q.scales_logical().max() < q0.scales_logical().max()).item()
    y = torch.randn(8, 32) * 2.0**-128
    y[3, 7] = 6 * 2.0**-126  # amax exactly 6 * 2^-126: t = 2^-10 at most, a tie to 0
    q = assert_matches_slow(y)
    assert (q.scales == 0).all() and (q.dequantize() == 0).all()
    assert torch.equal(unpack_fp4(q.data), torch.signbit(y).to(torch.uint8) * 8)  # signs only
    y[3, 7] = 6 * 2.0**-126 * (1 + 2.0**-20)  # t just above 2^-10: the smallest scale
    assert assert_matches_slow(y).scales_logical()[3, 0] == 1


def test_amax_floor_is_2_pow_minus_116_not_117():
    # A block whose blk_amax / 6 is a float32 subnormal loses precision in that division. With
    # s_dec_g >= 2^-116 such blocks get t <= fl(2^-126 * 2^116) = 2^-10 (scale 0) in every copy.
    # A floor of 2688 * 2^-117 (the smallest that keeps each block's d normal) gives
    # s_enc_g = 2^117 at amax = 2688 * 2^-117, and the block with blk_amax / 6 = 2^-127 +
    # 2^-148 / 6 gets t = 2^-10 (a tie, scale 0) there but t = 2^-10 + 2^-33 (scale 1) in the
    # copy scaled by 2^30, where the division does not lose the 2^-148.
    for floor, invariant in ((AMAX_FLOOR, True), (2688 * 2.0**-117, False)):
        x = torch.zeros(1, 48)
        x[0, 0] = floor  # amax at the floor: the smallest amax either recipe would claim
        x[0, 16] = 6 * 2.0**-127 + 2.0**-148  # blk_amax / 6 subnormal, just above 2^-127
        x[0, 32] = 6 * 2.0**-126 - 2.0**-147  # blk_amax / 6 subnormal, just below 2^-126
        y = x * 2.0**30
        assert torch.equal(y * 2.0**-30, x)
        (_, sf_x, _), (_, sf_y, _) = (slow_quantize(v, amax_floor=floor) for v in (x, y))
        assert np.array_equal(sf_x, sf_y) == invariant
        if invariant:
            assert same_bytes(quantize(x), quantize(y))
            assert (sf_x[0, 0, 1:] == 0).all()


def test_quantize_detaches_inputs_that_require_grad(seed):
    # Regression: the global scale was computed from x's graph, so the result kept x's graph
    # (and a copy of |x|) alive and its decodes and GEMMs required grad.
    x = torch.randn(64, 48, requires_grad=True)
    gs = torch.tensor(0.01, requires_grad=True)
    for q in (quantize(x), quantize_reference(x), quantize(x * 2), quantize(x, global_scale=gs)):
        for part in (q.data, q.scales, q.global_scale):
            assert part.grad_fn is None and not part.requires_grad
        assert not dequantize(q).requires_grad and not q.dequantize(torch.bfloat16).requires_grad
        assert not gemm_reference(q, q).requires_grad
    assert x.grad is None


# --------------------------------------------------------------------------- finite decodes

G_MAX = F32_MAX / 2688  # = 798915 * 2^97, a float32: 2688 * G_MAX = F32_MAX exactly


def full_scale_tensor(gs: float) -> NVFP4Tensor:
    """Codes +-6 with scale 448 everywhere: the largest decoded magnitude, 2688 * gs."""
    data = torch.full((2, 8), 0xF7, dtype=torch.uint8)  # codes 7 (+6) low, 15 (-6) high
    scales = to_blocked(torch.full((2, 1), 0x7E, dtype=torch.uint8))
    return NVFP4Tensor(data, scales, torch.tensor(gs, dtype=torch.float32), (2, 16))


def test_decode_is_finite_up_to_g_max_and_overflows_past_it():
    assert float(torch.tensor(G_MAX)) == G_MAX and G_MAX / 2.0**97 == 798915
    deq = dequantize(full_scale_tensor(G_MAX))
    assert torch.isfinite(deq).all() and deq.abs().max().item() == F32_MAX
    above = torch.nextafter(torch.tensor(G_MAX), torch.tensor(math.inf)).item()
    # 2688 * above = F32_MAX + 2688 * 2^93 > F32_MAX + 2^103 (half an ulp): rounds to inf
    assert torch.isinf(dequantize(full_scale_tensor(above))).all()
    # computed global scales never pass G_MAX: fl(amax / 2688) <= fl(F32_MAX / 2688) = G_MAX
    x = torch.randn(4, 32)
    x[1, 3] = F32_MAX
    q = quantize(x)
    assert q.global_scale.item() == G_MAX and torch.isfinite(q.dequantize()).all()
    # a given scale past G_MAX decodes finite input to inf: t = fl(F32_MAX / 6) / 2^120 ~ 42.7
    # rounds up to scale 44, F32_MAX / (44 * 2^120) ~ 5.82 to code 6, 6 * 44 * 2^120 > 2^128
    q = quantize(torch.full((1, 16), F32_MAX), global_scale=2.0**120)
    assert q.scales_logical().item() == 0x63 and torch.isinf(q.dequantize()).all()


# --------------------------------------------------------------------------- constructor values


def test_nvfp4tensor_rejects_bad_global_scale(seed):
    q = quantize(torch.randn(4, 32))
    for bad in (-1.0, 0.0, -0.0, math.nan, math.inf, -math.inf, 1e-40, 2.0**-127):
        gs = torch.tensor(bad, dtype=torch.float32)  # 1e-40: the float32 subnormal 9.99995e-41
        with pytest.raises(ValueError, match=r"global_scale .*positive, finite and at least "
                                             r"2\*\*-126 .*got " + re.escape(repr(gs.item()))):
            NVFP4Tensor(q.data, q.scales, gs, q.shape)
    NVFP4Tensor(q.data, q.scales, torch.tensor(2.0**-126), q.shape)  # the smallest accepted
    NVFP4Tensor(q.data, q.scales, torch.tensor(F32_MAX), q.shape)


@pytest.mark.parametrize("byte", [0x7F, 0xFF, 0x80, 0xB8])
def test_nvfp4tensor_rejects_nan_and_signed_scale_bytes(byte, seed):
    # Regression: 0x7F/0xFF (NaN) and sign-bit bytes were accepted; dequantize then gave NaN
    # (or negated blocks) while gemm_reference gave finite garbage for the same row.
    q = quantize(torch.randn(2, 130, 80))  # K/16 = 5: padding columns 5..7 in the last atom
    sf = q.scales_logical().clone()
    sf[1, 129, 3] = byte
    sf[1, 129, 4] = 0xFF  # later in row-major order: the first bad byte is reported
    with pytest.raises(ValueError, match=rf"UE4M3 bytes 0x00\.\.0x7E .*got 0x{byte:02X} at "
                                         rf"batch 1, row 129, scale column 3 \(K elements "
                                         rf"48\.\.63\)"):
        NVFP4Tensor(q.data, to_blocked(sf), q.global_scale, q.shape)
    padded = q.scales.clone()
    padded[0, 0, 1, 2] = byte  # row 0, scale column 6 (second atom, column 2): padding
    with pytest.raises(ValueError, match=rf"got 0x{byte:02X} at padding byte 514 of"):
        NVFP4Tensor(q.data, padded, q.global_scale, q.shape)
    # kernels and views build from parts that are valid by construction, without the checks
    t = NVFP4Tensor.trusted(q.data, padded, q.global_scale, q.shape)
    assert torch.equal(t.to("cpu").scales, padded)


# --------------------------------------------------------------------------- bad input


BAD_INPUTS = [
    (torch.randn(4, 40), ValueError, r"multiple of 16, got K=40"),
    (torch.randn(4, 32).double(), TypeError, r"float32, bfloat16 or float16.*float64"),
    (torch.randint(0, 5, (4, 32)), TypeError, r"float32, bfloat16 or float16.*int64"),
    (torch.randn(32), ValueError, r"2-D \(M, K\) or 3-D \(L, M, K\), got 1-D"),
    (torch.randn(2, 2, 4, 32), ValueError, r"2-D \(M, K\) or 3-D \(L, M, K\), got 4-D"),
    (torch.randn(0, 32), ValueError, r"must not be empty"),
    ([[1.0] * 16], TypeError, r"expects a torch.Tensor, got list"),
    (torch.randn(4, 32, device="meta"), ValueError, r"input is a meta tensor: it has a "
                                                    r"shape but no values"),
    (torch.randn(4, 32).to_sparse(), TypeError, r"dense \(strided\) tensor, got layout "
                                                r"torch.sparse_coo \(.*\.to_dense\(\)"),
    (torch.randn(4, 32).to_sparse_csr(), TypeError, r"got layout torch.sparse_csr"),
    (torch.nested.nested_tensor([torch.randn(4, 32), torch.randn(2, 32)]), TypeError,
     r"dense \(strided\) tensor, got a nested tensor"),
]


@pytest.mark.parametrize("x, exc, match", BAD_INPUTS)
def test_quantize_rejects_bad_input(x, exc, match):
    with pytest.raises(exc, match=match):
        quantize(x)
    with pytest.raises(exc, match=match):
        quantize_reference(x)


@pytest.mark.gpu
@pytest.mark.parametrize("x, exc, match", [p for p in BAD_INPUTS
                                           if isinstance(p[0], torch.Tensor)
                                           and p[0].device.type == "cpu"])
def test_quantize_rejects_bad_cuda_input_at_every_call(x, exc, match, seed):
    """CUDA inputs are checked at the first call of their dtype, shape, device and layout
    (`launch.quantize`): a refused input leaves no plan behind, so a second call is refused
    alike, and a sparse tensor of a shape whose dense twin was quantized is refused too."""
    x = x.to("cuda")
    if x.layout != torch.strided:
        quantize(torch.randn(x.shape, device="cuda"), check_finite=False)  # the dense twin
    for _ in range(2):
        with pytest.raises(exc, match=match):
            quantize(x)
        with pytest.raises(exc, match=match):
            quantize(x, global_scale=0.5)


def test_quantize_hands_cuda_input_checks_to_the_plan(monkeypatch, seed):
    """On a CUDA tensor `quantize` passes x's checks to `launch.quantize` (run once per kind of
    input, at its plan's first call) and checks a given global scale itself, naming a bad x
    first where both are bad (as on the CPU). The launch is recorded (no GPU)."""
    import importlib

    qmod = importlib.import_module("tk_cute.nvfp4.quantize")
    launch = importlib.import_module("tk_cute.nvfp4.launch")

    class OnCuda(torch.Tensor):  # a CPU tensor that takes quantize's CUDA branch
        is_cuda = property(lambda self: True)

    seen = []
    monkeypatch.setattr(launch, "quantize", lambda x, gs, check_finite, check_input:
                        seen.append((gs, check_input)) or "q")
    x = torch.randn(4, 32).as_subclass(OnCuda)
    assert qmod.quantize_parts(x, None, False) == ("q", None)
    _, gs = qmod.quantize_parts(x, 0.5, False)
    assert float(gs) == 0.5 and seen[1][0] is gs
    check = seen[0][1]
    assert check is seen[1][1] is qmod._check_cuda_input
    with pytest.raises(ValueError, match=r"multiple of 16, got K=40"):
        check(torch.randn(4, 40))
    bad = torch.randn(4, 40).as_subclass(OnCuda)
    with pytest.raises(ValueError, match=r"multiple of 16, got K=40"):
        qmod.quantize_parts(bad, -1.0, False)  # x's error, not the scale's
    with pytest.raises(ValueError, match=r"positive, finite.*got -1.0"):
        qmod.quantize_parts(x, -1.0, False)
    assert len(seen) == 2


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_quantize_rejects_non_finite_input(bad, seed):
    x = torch.randn(8, 32).to(torch.bfloat16)
    x[3, 7] = bad
    with pytest.raises(ValueError, match=r"must be finite: x contains 1 NaN/Inf"):
        quantize(x)


@pytest.mark.parametrize(
    "gs, exc, match",
    [
        (0.0, ValueError, r"positive, finite.*got 0.0"),
        (-1.0, ValueError, r"positive, finite.*got -1.0"),
        (math.nan, ValueError, r"positive, finite.*got nan"),
        (math.inf, ValueError, r"positive, finite.*got inf"),
        (1e-40, ValueError, r"at least 2\*\*-126"),  # float32 subnormal: 1/gs overflows
        (1e300, ValueError, r"got inf"),  # overflows float32
        (torch.tensor([1.0, 2.0]), TypeError, r"one-element floating tensor"),
        (torch.tensor(3), TypeError, r"one-element floating tensor"),
        ("1.0", TypeError, r"global_scale must be None, a real number or a tensor, got str"),
        (True, TypeError, r"got bool"),
        (torch.tensor(1.0, device="meta"), ValueError, r"global_scale is a meta tensor"),
        (torch.tensor([1.0]).to_sparse(), TypeError, r"global_scale must be a dense"),
    ],
)
def test_quantize_rejects_bad_global_scale(gs, exc, match, seed):
    with pytest.raises(exc, match=match):
        quantize(torch.randn(4, 32), global_scale=gs)


def test_meta_models_and_sparse_parts_are_named(seed):
    """A model built on the meta device and NVFP4 parts in a sparse layout: errors that say
    so (they were `Tensor.item() cannot be called on meta tensors` and a failed copy)."""
    from tk_cute.nvfp4 import Linear, quantize_

    with pytest.raises(ValueError, match="quantize input is a meta tensor"):
        Linear.from_linear(torch.nn.Linear(64, 32, device="meta"))
    with pytest.raises(ValueError, match="quantize input is a meta tensor"):
        quantize_(torch.nn.Sequential(torch.nn.Linear(64, 32, device="meta")))
    q = quantize(torch.randn(32, 64))
    for part in ("data", "scales", "global_scale"):
        parts = {"data": q.data, "scales": q.scales, "global_scale": q.global_scale}
        parts[part] = parts[part].to_sparse()
        with pytest.raises(TypeError, match=f"NVFP4Tensor.{part} must be a dense"):
            NVFP4Tensor(**parts, shape=q.shape)


@pytest.mark.parametrize("dtype", ["float32", None, float])
def test_dequantize_names_a_dtype_that_is_not_a_torch_dtype(dtype, seed):
    q = quantize(torch.randn(8, 32))
    with pytest.raises(TypeError, match=r"floating torch\.dtype \(e\.g\. torch\.float32\), "
                                        rf"got {re.escape(repr(dtype))}"):
        dequantize(q, dtype)
    with pytest.raises(TypeError, match="floating torch.dtype"):
        q.dequantize(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_reference_on_cuda_is_bit_exact_with_cpu(dtype, seed):
    # Guards the device-independence of the recipe (e.g. CUDA division by a CPU scalar is a
    # reciprocal multiply): same bytes on both devices.
    x = torch.randn(2, 300, 272, dtype=torch.float32)
    block_mag = torch.exp2(torch.rand(2, 300, 17, 1) * 30 - 20)  # wide range of block scales
    x = (x.reshape(2, 300, 17, 16) * block_mag).reshape(2, 300, 272).to(dtype)
    _, x_div = division_sensitive_input()
    for x, gs in ((x, None), (x, 7.3e-6), (x_div, 1.0)):  # x_div: float32 on purpose
        cpu = quantize_reference(x, global_scale=gs)
        gpu = quantize_reference(x.cuda(), global_scale=gs)
        assert gpu.device.type == "cuda"
        for part in ("data", "scales", "global_scale"):
            assert torch.equal(getattr(gpu, part).cpu(), getattr(cpu, part))
        assert torch.equal(gpu.dequantize().cpu(), cpu.dequantize())
        assert torch.equal(gpu.to("cpu").data, cpu.data)
