"""Fuzz: quantize -> dequantize -> reference GEMM against an independent model (hypothesis).

The model shares no code with tk_cute: the recipe of ``tk_cute.nvfp4.quantize``'s docstring in
numpy float32 arrays (IEEE single precision, one rounding per elementwise operation, subnormals
kept), nearest-value searches over E4M3/E2M1 value lists built from their field definitions,
the blocked scale layout from its offset formula (shared/reference/nvfp4.md), and exact integer
arithmetic with a hand-written round-to-nearest-even for every output dtype. Inputs need padding
(M not a multiple of 128, K/16 mostly not a multiple of 4) and cover float32/bfloat16/float16,
huge dynamic range, exact E2M1 ties, zero blocks, amax far below the recipe's floor, and given
global scales (tiny ones, and ones whose decodes overflow). Examples are derandomized and no
database is written, so CI sees the same cases every run.
"""

from typing import NamedTuple

import numpy as np
import torch
from _oracles import E2M1_MAGS, E4M3_POS, nearest_even  # tests/_oracles.py (on sys.path)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tk_cute.nvfp4 import dequantize, gemm_reference, quantize

F = np.float32
AMAX_FLOOR = F(2688 * 2.0**-116)


# (significand bits, smallest normal exponent, largest exponent)
FORMATS = {
    torch.float32: (24, -126, 127),
    torch.bfloat16: (8, -126, 127),
    torch.float16: (11, -14, 15),
}


# --------------------------------------------------------------------------- the model


def model_quantize(x: np.ndarray, gs):
    """x: float32 (L, M, K). Returns (codes (L, M, K), scale bytes (L, M, K/16), s_dec_g)."""
    L, M, K = x.shape
    s_dec = F(np.maximum(np.abs(x).max(), AMAX_FLOOR) / F(2688)) if gs is None else F(gs)
    s_enc_g = F(F(1) / s_dec)
    blocks = x.reshape(L, M, K // 16, 16)
    with np.errstate(over="ignore"):  # a given scale can overflow t and x * s_enc to inf
        t = (np.abs(blocks).max(axis=-1) / F(6)) * s_enc_g
        sf = nearest_even(t, E4M3_POS)
        d = np.maximum(E4M3_POS[sf].astype(F) * s_dec, F(2.0**-126))
        s_enc = np.where(sf == 0, F(0), F(1) / d)
        y = blocks * s_enc[..., None]
    assert t.dtype == y.dtype == np.float32
    codes = nearest_even(np.abs(y), E2M1_MAGS) | np.where(np.signbit(y), 8, 0)
    return codes.reshape(L, M, K), sf, s_dec


def model_blocked(sf: np.ndarray) -> np.ndarray:
    """Flat bytes of the blocked layout (nvfp4.md's offset formula), padding zero."""
    L, M, KB = sf.shape
    RM, RK = -(-M // 128), -(-KB // 4)
    l, m, kb = np.meshgrid(np.arange(L), np.arange(M), np.arange(KB), indexing="ij")
    off = (
        l * RM * RK * 512
        + (m // 128) * RK * 512
        + (kb // 4) * 512
        + (m % 32) * 16
        + ((m // 32) % 4) * 4
        + kb % 4
    )
    out = np.zeros(L * RM * RK * 512, np.uint8)
    out[off.ravel()] = sf.ravel()
    return out


def model_decode(codes, sf, s_dec) -> np.ndarray:
    """Exact float64 decode: e2m1 (<= 2 bits) * ue4m3 (<= 4 bits) * s_dec (24 bits)."""
    mag = E2M1_MAGS[codes & 7] * np.repeat(E4M3_POS[sf], 16, axis=-1) * float(s_dec)
    return np.where(codes & 8, -mag, mag)  # code 8 is -0.0


def round_array(v: np.ndarray, dtype) -> np.ndarray:
    """Exact finite float64 values (normal or zero) rounded once to `dtype`, as float64:
    integer RNE on the significand, +-inf past the largest finite value."""
    p, emin, emax = FORMATS[dtype]
    a = np.abs(v)
    bits = a.view(np.int64)
    e = (bits >> 52) - 1023
    sig = (bits & ((1 << 52) - 1)) | (1 << 52)  # a = sig * 2^(e - 52)
    q = np.maximum(e, emin) - (p - 1)  # the quantum 2^q at a's magnitude
    shift = np.clip(q - (e - 52), 1, 60)  # >= 53 - p bits drop; past 54 the result is 0
    m = sig >> shift
    rem, half = sig - (m << shift), np.int64(1) << (shift - 1)
    m = m + ((rem > half) | ((rem == half) & (m % 2 == 1)))
    r = np.ldexp(m.astype(np.float64), q)
    r = np.where(r > (2 - 2.0 ** (1 - p)) * 2.0**emax, np.inf, r)
    return np.copysign(np.where(a == 0, 0.0, r), v)


def round_dyadic(num: int, e: int, dtype) -> float:
    """num * 2^e rounded once to `dtype` (RNE, +-inf past the range), as a float."""
    if num == 0:
        return 0.0
    p, emin, emax = FORMATS[dtype]
    n = abs(num)
    q = max(n.bit_length() - 1 + e, emin) - (p - 1)
    if q > e:
        shift = q - e
        m, rem, half = n >> shift, n & ((1 << shift) - 1), 1 << (shift - 1)
        m += rem > half or (rem == half and m & 1)
    else:
        m = n << (e - q)
    top = emax - p + 1  # largest finite: (2^p - 1) * 2^top
    r = float("inf") if q >= top and m << (q - top) > (1 << p) - 1 else float(m) * 2.0**q
    return -r if num < 0 else r


def operand_integers(codes, sf) -> np.ndarray:
    """2 * e2m1 * 512 * ue4m3: each decoded value over its global scale, times 2^10, exact."""
    mag = (E2M1_MAGS[codes & 7] * 2).astype(np.int64)
    scale = np.repeat((E4M3_POS[sf] * 512).astype(np.int64), 16, axis=-1)
    return np.where(codes & 8, -mag, mag) * scale


# --------------------------------------------------------------------------- inputs

TIE_MAGS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 3.0, 6.5, 7.0])


class Operand(NamedTuple):
    log2_amax: int  # amax is at most 2688 * 2^(log2_amax - 11) ~ 1.31 * 2^log2_amax
    spread: int  # block magnitudes log-uniform over this many binades below amax
    zero_frac: float  # share of all-zero blocks (random signs of zero)
    tie_frac: float  # share of blocks of exact E2M1 midpoints at a power-of-two scale
    seed: int


class Case(NamedTuple):
    dtype: torch.dtype
    L: int | None
    M: int
    N: int
    KB: int  # K / 16
    gs: float | None  # a given global scale for A
    a: Operand
    b: Operand


def make_input(op: Operand, shape, dtype) -> torch.Tensor:
    """Blocks of random normals over a wide range; tie blocks hold +-6 * 2^(s+E) (so that their
    scale is exactly 2^s when the global scale is 2^E) and midpoints times the same power."""
    rng = np.random.default_rng(op.seed)
    L, M, K = shape
    KB = K // 16
    E = op.log2_amax - 11
    top = 2688.0 * 2.0**E  # the amax (with ties): s_dec_g = 2^E exactly when E >= -116
    mags = top * np.exp2(-rng.uniform(0, op.spread, (L, M, KB, 1)))
    x = np.clip(rng.standard_normal((L, M, KB, 16)) * 0.4, -1, 1) * mags
    s = rng.integers(-9, 9, (L, M, KB, 1))
    sign = rng.choice([-1.0, 1.0], (L, M, KB, 16))
    ties = rng.choice(TIE_MAGS, (L, M, KB, 16))
    ties[..., 0] = 6.0  # pins t = 2^s
    tie = rng.random((L, M, KB, 1)) < op.tie_frac
    x = np.where(tie, sign * ties * np.exp2(s + E), x)
    zero = rng.random((L, M, KB, 1)) < op.zero_frac
    x = np.where(zero, np.copysign(0.0, sign), x).reshape(L, M, K)
    if op.tie_frac:  # the global scale must be 2^E for the ties to be exact
        x[0, 0, 0] = top * sign[0, 0, 0, 0]
    # otherwise amax (so the global scale) has random low bits: decodes then have up to 30
    # significant bits, and some land next to bf16/fp16 midpoints (the double-rounding cases)
    return torch.from_numpy(x).to(dtype)


@st.composite
def operands(draw, dtype):
    if dtype == torch.float16:
        log2_amax, spread = draw(st.integers(-14, 15)), draw(st.integers(0, 30))
    else:  # tiny (below the floor ~2^-105, to where the whole tensor decodes to 0) to huge
        log2_amax = draw(
            st.one_of(st.integers(-145, 127), st.sampled_from([0, -40, -104, -106, -124, -130]))
        )
        spread = draw(st.integers(0, 60))
    return Operand(
        log2_amax,
        spread,
        draw(st.sampled_from([0.0, 0.1, 0.5])),
        draw(st.sampled_from([0.0, 0.3, 1.0])),
        draw(st.integers(0, 2**32 - 1)),
    )


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    gs = draw(
        st.one_of(
            st.none(),
            st.none(),
            st.integers(-126, 126).map(lambda e: 2.0**e),
            st.floats(2.0**-126, 2.0**127, width=32),  # float32 values, also past F32_MAX / 2688
        )
    )
    return Case(
        dtype,
        draw(st.sampled_from([None, 2])),
        draw(st.one_of(st.sampled_from([1, 31, 127, 129, 130]), st.integers(1, 140))),
        draw(st.integers(1, 20)),
        draw(st.integers(1, 9)),
        gs,
        draw(operands(dtype)),
        draw(operands(dtype)),
    )


# --------------------------------------------------------------------------- checks


def check_quantized(x: torch.Tensor, gs, q):
    """Bytes and global scale of q against the model; returns the model's (codes, sf, s_dec)."""
    xf = x.float().reshape(-1, *x.shape[-2:]).numpy()
    codes, sf, s_dec = model_quantize(xf, gs)
    want_data = (codes[..., 0::2] | codes[..., 1::2] << 4).astype(np.uint8)  # 2i: low nibble
    assert np.array_equal(q.data.reshape(want_data.shape).numpy(), want_data)
    assert np.array_equal(q.scales.reshape(-1).numpy(), model_blocked(sf))
    assert q.global_scale.numpy().view(np.int32) == np.asarray(s_dec).view(np.int32)
    return codes, sf, s_dec


def check_dequantized(q, codes, sf, s_dec):
    exact = model_decode(codes, sf, s_dec)
    got = dequantize(q, torch.float64).reshape(exact.shape).numpy()
    assert np.array_equal(got.view(np.int64), exact.view(np.int64))  # exact, -0 included
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        want = torch.from_numpy(round_array(exact, dtype)).to(dtype)  # exact: on dtype's grid
        got = dequantize(q, dtype).reshape(want.shape)
        bits = torch.int32 if dtype == torch.float32 else torch.int16  # compares signs of 0 too
        assert torch.equal(got.view(bits), want.view(bits))


def check_gemm(qa, qb, ma, mb):
    # gemm_reference = RN_out(RN64(S * s)), S the exact integer sum (|S| < 2^53 here: K <= 144),
    # s = gA * gB * 2^-20 exact in float64, so it is the exact value v rounded once to out
    # unless a rounding boundary of out lies within 2^-53 |v| of v: there either neighbour.
    S = np.matmul(operand_integers(*ma[:2]), np.swapaxes(operand_integers(*mb[:2]), -1, -2))
    assert np.abs(S).max() < 2**53
    (na, da), (nb, db) = (float(m[2]).as_integer_ratio() for m in (ma, mb))
    e = -20 - (da.bit_length() - 1) - (db.bit_length() - 1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = gemm_reference(qa, qb, out_dtype=dtype).float().reshape(S.shape).numpy()
        for idx in np.ndindex(S.shape):
            num = int(S[idx]) * na * nb
            want = round_dyadic(num, e, dtype)
            if got[idx] != want:
                near = {round_dyadic(num * (2**53 + k), e - 53, dtype) for k in (-1, 1)}
                assert len(near) == 2 and float(got[idx]) in near, (idx, dtype, got[idx], want)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases())
@example(
    Case(
        torch.float32,
        None,
        130,
        3,
        5,
        None,
        Operand(-130, 20, 0.1, 0.3, 1),
        Operand(-104, 40, 0.0, 0.0, 2),
    )
)  # below the floor, and at it
@example(
    Case(
        torch.float16,
        2,
        129,
        7,
        3,
        None,
        Operand(4, 24, 0.5, 1.0, 3),
        Operand(-14, 10, 0.1, 0.3, 4),
    )
)  # fp16 ties and subnormals
@example(
    Case(
        torch.bfloat16,
        None,
        33,
        5,
        6,
        2.0**120,
        Operand(127, 60, 0.1, 0.3, 5),
        Operand(126, 0, 0.0, 0.0, 6),
    )
)  # decodes past float32's range
@example(
    Case(
        torch.float32,
        None,
        64,
        4,
        2,
        2.0**-126,
        Operand(-124, 30, 0.0, 0.3, 7),
        Operand(0, 60, 0.5, 0.0, 8),
    )
)  # tiny given scale: the d floor binds
def test_quantize_dequantize_gemm_match_the_model(case: Case):
    lead = () if case.L is None else (case.L,)
    K = 16 * case.KB
    xa = make_input(case.a, (case.L or 1, case.M, K), case.dtype).reshape(*lead, case.M, K)
    xb = make_input(case.b, (case.L or 1, case.N, K), case.dtype).reshape(*lead, case.N, K)
    qa, qb = quantize(xa, global_scale=case.gs), quantize(xb)
    ma, mb = check_quantized(xa, case.gs, qa), check_quantized(xb, None, qb)
    check_dequantized(qa, *ma)
    check_dequantized(qb, *mb)
    check_gemm(qa, qb, ma, mb)
