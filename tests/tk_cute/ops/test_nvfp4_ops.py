"""tk_cute.ops.nvfp4 register ops on the GPU against the host format library, bit for bit.

Decode: every E2M1 code x every UE4M3 scale byte (0..0x7E) -> fp16 and bf16 products, and the
bf16 products pre-shifted by 2^-8 (the GEMM decode: also modelled bit for bit on the host).
Encode: E2M1 (software magic-add path, and the native cvt where the GPU has it) and UE4M3
(software and cvt) on ties, saturation points, subnormals, -0 and random values.
A CPU test compiles the probe kernels for every target.
"""

import pytest
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from tk_cute.ops import nvfp4 as fp4

THREADS = 128


@cute.kernel
def _decode_kernel(q: cute.Tensor, sf: cute.Tensor, out16: cute.Tensor, outbf: cute.Tensor,
                   outsh: cute.Tensor, n: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:
        qw, b = Uint32(q[i]), Uint32(sf[i])
        h = fp4.e2m1x8_scaled(qw, fp4.ue4m3_to_f16x2(b), "f16")
        g = fp4.e2m1x8_scaled(qw, fp4.ue4m3_to_bf16x2(b), "bf16")
        # the pair form: scale byte b in the low byte, 0x7E - b in the high one
        f_lo, f_hi = fp4.ue4m3x2_to_bf16x2_prescaled(b | ((Uint32(0x7E) - b) << 8))
        s_lo = fp4.e2m1x8_scaled_shifted(qw, f_lo)
        s_hi = fp4.e2m1x8_scaled_shifted(qw, f_hi)
        s_one = fp4.e2m1x8_scaled_shifted(qw, fp4.ue4m3_to_bf16x2_prescaled(b))
        # the strided pairing, put back in natural order (word j = elements 2j, 2j + 1)
        st = fp4.e2m1x8_scaled_shifted_strided(qw, f_lo)
        s_str = [fp4.prmt(st[j % 2 * 2], st[j % 2 * 2 + 1], 0x5410 + 0x2222 * (j // 2))
                 for j in range(4)]
        for j in cutlass.range_constexpr(4):
            out16[i * 4 + j] = Int32(h[j])
            outbf[i * 4 + j] = Int32(g[j])
            outsh[i * 16 + j] = Int32(s_lo[j])
            outsh[i * 16 + 4 + j] = Int32(s_hi[j])
            outsh[i * 16 + 8 + j] = Int32(s_one[j])
            outsh[i * 16 + 12 + j] = Int32(s_str[j])


@cute.kernel
def _encode_kernel(arch: cutlass.Constexpr, y: cute.Tensor, packed: cute.Tensor,
                   e4: cute.Tensor, n8: Int32):
    """Thread i: 8 values y[8i..8i+8] -> packed[i] (E2M1 x8); e4[8i+j] = (sw byte) | (hw << 8)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n8:
        v = [Float32(y[8 * i + j]) for j in range(8)]
        packed[i] = Int32(fp4.e2m1x8_encode(v, arch))
        for j in cutlass.range_constexpr(8):  # UE4M3 encodes |t|: negatives and -0 too
            e4[8 * i + j] = Int32(fp4.ue4m3_encode_sw(v[j]) | (fp4.ue4m3_encode_hw(v[j]) << 8))


@cute.jit
def _decode(q, sf, out16, outbf, outsh, n: Int32, stream):
    _decode_kernel(q, sf, out16, outbf, outsh, n).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


@cute.jit
def _encode(arch: cutlass.Constexpr, y, packed, e4, n8: Int32, stream):
    _encode_kernel(arch, y, packed, e4, n8).launch(
        grid=[(n8 + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


def _fake(dtype):
    return cute.runtime.make_fake_tensor(dtype, (cute.sym_int64(divisibility=8),), (1,),
                                         assumed_align=16)


@pytest.mark.parametrize("arch", ("sm_90a", "sm_100a", "sm_103a", "sm_107a"))
def test_probe_kernels_compile(arch):
    from cuda.bindings import driver

    from tk_cute.compile import build

    s = driver.CUstream(0)
    d = build(_decode, *(_fake(cutlass.Int32) for _ in range(5)), Int32(8), s, arch=arch)
    # fp16 spread (4) + bf16 nibble pairs (4, shared by the three natural-order bf16 decodes)
    # + the pair scale form (1; its broadcasts are 16-bit moves) + the probe's reordering of the
    # strided decode (4; the strided decode itself has none)
    assert d.ptx_count(r"prmt\.b32") == 13 and d.kernel.local_bytes == 0
    e = build(_encode, arch, _fake(cutlass.Float32), _fake(cutlass.Int32), _fake(cutlass.Int32),
              Int32(1), s, arch=arch)
    assert (e.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2") == 4) == fp4.has_native_fp4(arch)
    assert e.kernel.local_bytes == 0


# --- host model of the bf16 decode (mirrors _bf16_patterns / ue4m3x2_to_bf16x2_prescaled) ----


def _prmt(a: int, b: int, sel: int) -> int:
    pool = (a | b << 32).to_bytes(8, "little")
    out = 0
    for i in range(4):
        s = (sel >> 4 * i) & 0xF
        byte = pool[s & 7]
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << 8 * i
    return out


def _bf16(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int16).view(torch.bfloat16).float().item()


def _bits(v: float) -> int:
    return torch.tensor([v], dtype=torch.float32).bfloat16().view(torch.int16).item() & 0xFFFF


def _mul_bf16x2(a: int, b: int) -> int:
    lo = _bits(_bf16(_s16(a)) * _bf16(_s16(b)))
    hi = _bits(_bf16(_s16(a >> 16)) * _bf16(_s16(b >> 16)))
    return lo | hi << 16


def _s16(x: int) -> int:
    x &= 0xFFFF
    return x - (1 << 16) if x & 0x8000 else x


def _decode8_model(q: int, f: int) -> list:
    """e2m1x8_scaled_shifted(q, f) on the host."""
    u, v = q & 0x0F0F0F0F, (q >> 4) & 0x0F0F0F0F
    return [_mul_bf16x2(((_prmt(u, v, s) * 0x1040) & 0xFFFFFFFF) & 0x81C081C0, f)
            for s in fp4._PAIR_SEL]


def _decode8_strided_model(q: int, f: int) -> list:
    """e2m1x8_scaled_shifted_strided(q, f) on the host (word i = elements i, i + 4)."""
    return [_mul_bf16x2((((x & m) * c) & 0xFFFFFFFF) & 0x81C081C0, f) for x in (q, q >> 8)
            for m, c in ((0x000F000F, 0x1040), (0x00F000F0, 0x0104))]


def _scale_pair_model(h: int) -> tuple:
    """ue4m3x2_to_bf16x2_prescaled(h) on the host."""
    p = (_prmt(h, 0, 0x4140) << 4) & 0xFFFFFFFF
    f = _mul_bf16x2(_mul_bf16x2(p, 0x7B807B80), 0x7A807A80)  # 2^120, then 2^118
    return _prmt(f, f, 0x1010), _prmt(f, f, 0x3232)


def test_bf16_decode_model_is_exact_for_every_code_and_scale():
    """e2m1(code) * ue4m3(sf) * 2^-8 (BF16_DECODE_SHIFT) exactly, for all 16 codes (both
    halves, every nibble slot) and all 127 finite scale bytes including subnormals."""
    from tk_cute.nvfp4 import E2M1_VALUES, e4m3_decode

    codes = list(range(16))
    for sf in range(0x7F):
        f_lo, f_hi = _scale_pair_model(sf | (0x7E - sf if sf < 0x7E else 0) << 8)
        for f, byte in ((f_lo, sf), (f_hi, 0x7E - sf if sf < 0x7E else 0)):
            want_sf = float(e4m3_decode(torch.tensor([byte], dtype=torch.uint8)))
            for shift in range(2):  # codes c, c+1 .. packed in all eight nibbles
                q = 0
                vals = [codes[(i + 8 * shift) % 16] for i in range(8)]
                for i, c in enumerate(vals):
                    q |= c << 4 * i
                words = _decode8_model(q, f)
                got = [_bf16(_s16(w >> 16 * h)) for w in words for h in range(2)]
                want = [float(E2M1_VALUES[c]) * want_sf * 2.0**-fp4.BF16_DECODE_SHIFT
                        for c in vals]
                assert got == want, (sf, vals, got, want)
                strided = _decode8_strided_model(q, f)  # word i: elements i, i + 4
                got = [_bf16(_s16(strided[i % 4] >> 16 * (i // 4))) for i in range(8)]
                assert got == want, (sf, vals, got, want)


def test_strided_pairing_of_bf16_matches_the_decode():
    """bf16x8_strided's selectors (host prmt model) pair elements (i, i + 4) like the decode."""
    import random

    rng = random.Random(0)
    vals = [rng.getrandbits(16) for _ in range(8)]
    natural = [vals[2 * j] | vals[2 * j + 1] << 16 for j in range(4)]
    assert [_prmt(natural[a], natural[b], sel) for a, b, sel in fp4.STRIDED_PAIRS] == \
        [vals[i] | vals[i + 4] << 16 for i in range(4)]


def _run(fn, *args):
    from tk_cute.runtime import as_cute, stream

    conv = [as_cute(a, align=4) if isinstance(a, torch.Tensor) else a for a in args]
    compiled = cute.compile(fn, *conv, stream())
    compiled(*[c for c in conv if not isinstance(c, str)], stream())
    torch.cuda.synchronize()


def _every_code_every_scale(n_scales: int):
    """(perm, bb, q): every E2M1 code x every scale byte 0..n_scales - 1, 8 codes per word (this
    code in every nibble position once across 8 rotations): perm (N, 8) the nibble values, bb
    (N,) the scale bytes, q (N,) the words as int32."""
    codes = torch.arange(16, dtype=torch.int64)
    scale_bytes = torch.arange(n_scales, dtype=torch.int64)
    cc, bb = torch.meshgrid(codes, scale_bytes, indexing="ij")
    cc, bb = cc.reshape(-1), bb.reshape(-1)
    perm = torch.stack([(cc + r) % 16 for r in range(8)], dim=1)  # (N, 8) nibble values
    q = ((perm << (4 * torch.arange(8))).sum(1) & 0xFFFFFFFF).to(torch.int64)
    q = torch.where(q >= 2**31, q - 2**32, q).to(torch.int32)
    return perm, bb, q


def _poisoned(n: int) -> torch.Tensor:
    """n int32 words of 0xFF bytes, for a kernel to overwrite: as fp16 / bf16 halves 0xFFFF is
    NaN (never a decode of the finite products), as a UE4M3 byte 0xFF is past 0x7E (packed E2M1
    bytes: 0xFF is the pair (-6, -6), caught wherever the expected byte differs)."""
    return torch.full((n,), -1, dtype=torch.int32, device="cuda")


@pytest.mark.gpu
def test_decode_every_code_every_scale():
    from tk_cute.nvfp4 import E2M1_VALUES, e4m3_decode

    perm, bb, q = _every_code_every_scale(0x7F)  # scale bytes 0..0x7E (0x7F is NaN)
    n = q.numel()
    out16, outbf, outsh = _poisoned(n * 4), _poisoned(n * 4), _poisoned(n * 16)
    _run(_decode, q.cuda(), bb.to(torch.int32).cuda(), out16, outbf, outsh, Int32(n))
    vals = torch.tensor(E2M1_VALUES, dtype=torch.float64)[perm]
    sf = e4m3_decode(bb.to(torch.uint8)).to(torch.float64)[:, None]
    exact = (vals * sf).reshape(-1)
    sf_hi = e4m3_decode((0x7E - bb).to(torch.uint8)).to(torch.float64)[:, None]
    shift = 2.0**-fp4.BF16_DECODE_SHIFT
    shifted = torch.cat([vals * sf * shift, vals * sf_hi * shift, vals * sf * shift,
                         vals * sf * shift], dim=1)
    for got, want, dt in ((out16, exact, torch.float16), (outbf, exact, torch.bfloat16),
                          (outsh, shifted.reshape(-1), torch.bfloat16)):
        want = want.to(dt).view(torch.int16)
        have = got.cpu().view(torch.int16)
        bad = (want != have).nonzero()
        assert bad.numel() == 0, f"{dt}: {bad.numel()} mismatches, first at {bad[:4].tolist()}"


def _encode_inputs():
    from tk_cute.nvfp4 import E4M3_VALUES

    e2 = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0]
    base = e2 + [v * 2.0**k for v in e2 for k in (-8, -3, 3, 6)]
    e4 = [v for v in E4M3_VALUES[:0x7F]]
    mids = [(a + b) / 2 for a, b in zip(e4, e4[1:])]  # E4M3 ties
    pts = base + e4 + mids + [464.0, 480.0, 1e30, float("inf"), 2.0**-10, 2.0**-149, 1e-45]
    t = torch.tensor(pts, dtype=torch.float32)
    nudged = torch.cat([t, torch.nextafter(t, torch.tensor(float("inf"))),
                        torch.nextafter(t, torch.tensor(0.0))])
    allv = torch.cat([nudged, -nudged, torch.randn(4096) * 4, torch.randn(4096) * 1e-3])
    allv[allv.isnan()] = 0.0
    pad = (-allv.numel()) % 8
    return torch.cat([allv, torch.zeros(pad)])


@pytest.mark.gpu
def test_encode_matches_host_rne():
    from tk_cute.arch import device_target
    from tk_cute.nvfp4 import e2m1_encode_rne, e4m3_encode_rne, pack_fp4

    arch = device_target(torch.device("cuda")).name
    y = _encode_inputs()
    n8 = y.numel() // 8
    for path in {arch, "sm_90a"}:  # native cvt where the GPU has it, and the software path
        packed, e4 = _poisoned(n8), _poisoned(y.numel())
        _run(_encode, path, y.cuda(), packed, e4, Int32(n8))
        want = pack_fp4(e2m1_encode_rne(y)).view(-1, 4)  # (n8, 4) bytes
        have = packed.cpu().view(torch.uint8).view(-1, 4)
        bad = (want != have).any(1).nonzero().view(-1)
        assert bad.numel() == 0, f"{path} E2M1: inputs {y.view(-1, 8)[bad[:3]].tolist()}"
        # UE4M3 is unsigned: the byte of |y|, so -0.0 (and any negative) never sets bit 7.
        # (Regression: the old reference e4m3_encode_rne(y.clamp(min=0.0)) kept -0.0's sign,
        # 0x80, which the cvt matched and the software encode did not.)
        want4 = e4m3_encode_rne(y.abs()).to(torch.int32)
        assert int(want4.max()) <= 0x7E
        e4 = e4.cpu()
        for name, have4 in (("sw", e4 & 0xFF), ("hw", (e4 >> 8) & 0xFF)):
            bad = (want4 != have4).nonzero().view(-1)
            assert bad.numel() == 0, f"UE4M3 {name}: {y[bad[:5]].tolist()}"


# --- UE5M3 scales (Rubin's format) decoded to bf16 for the Hopper kernels --------------------
# On a GPU: `python -m pytest -m gpu tests/tk_cute/ops/test_nvfp4_ops.py -k ue5m3` (run on the
# H200, 2026-12-01); the host model below mirrors the ops' integer and bf16 operations bit for
# bit, and the compile test pins their PTX constants.


@cute.kernel
def _decode5_kernel(q: cute.Tensor, sf: cute.Tensor, outbf: cute.Tensor, outsh: cute.Tensor,
                    n: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:
        qw, b = Uint32(q[i]), Uint32(sf[i])
        g = fp4.e2m1x8_scaled(qw, fp4.scale_to_bf16x2(b, "ue5m3"), "bf16")
        f_lo, f_hi = fp4.scalex2_to_bf16x2_prescaled(b | ((Uint32(0xFE) - b) << 8), "ue5m3")
        s_lo = fp4.e2m1x8_scaled_shifted(qw, f_lo)
        s_hi = fp4.e2m1x8_scaled_shifted_strided(qw, f_hi)
        s_one = fp4.e2m1x8_scaled_shifted(qw, fp4.ue5m3_to_bf16x2_prescaled(b))
        for j in cutlass.range_constexpr(4):
            outbf[i * 4 + j] = Int32(g[j])
            outsh[i * 12 + j] = Int32(s_lo[j])
            outsh[i * 12 + 4 + j] = Int32(s_hi[j])
            outsh[i * 12 + 8 + j] = Int32(s_one[j])


@cute.jit
def _decode5(q, sf, outbf, outsh, n: Int32, stream):
    _decode5_kernel(q, sf, outbf, outsh, n).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


def test_ue5m3_probe_compiles_with_its_constants():
    """The UE5M3 decode on sm_90a: 2^112 (0x7780 per half) restores sf from its bits << 4,
    2^110 (0x7680) prescales it; no 7-bit mask (all 8 bits are the format's)."""
    from cuda.bindings import driver

    from tk_cute.compile import build

    d = build(_decode5, *(_fake(cutlass.Int32) for _ in range(4)), Int32(8),
              driver.CUstream(0), arch="sm_90a")
    movs = [int(v) for v in __import__("re").findall(r"mov\.b32\s+%r\d+, (\d+);", d.ptx)]
    assert fp4.UE5M3_BF16_UNBIAS in movs and fp4.UE5M3_BF16_PRESCALE in movs
    assert 0x7B807B80 not in movs and 0x7A807A80 not in movs  # (UE4M3's 2^120, 2^118)
    assert d.ptx_count(r"and\.b32\s+%r\d+, %r\d+, 133171184;") == 0  # UE4M3's 0x07F007F0
    assert d.kernel.local_bytes == 0


def _ue5m3_pair_model(h: int) -> tuple:
    """ue5m3x2_to_bf16x2_prescaled(h) on the host."""
    p = (_prmt(h, 0, 0x4140) << 4) & 0xFFFFFFFF
    f = _mul_bf16x2(_mul_bf16x2(p, fp4.UE5M3_BF16_UNBIAS), fp4.UE5M3_BF16_PRESCALE)
    return _prmt(f, f, 0x1010), _prmt(f, f, 0x3232)


def test_ue5m3_to_bf16_is_exact_for_every_byte():
    """bits << 4 is sf * 2^-112 as bf16 for all 255 finite bytes (subnormals 1..7 land on bf16
    subnormals), and one multiply by 2^112 gives sf exactly; the prescaled pair form gives
    sf * 2^110 in each half, the single form the same."""
    from tk_cute.nvfp4.format import UE5M3_VALUES

    for b in range(0xFF):
        sf = UE5M3_VALUES[b]
        h = (b & 0xFF) << 4
        assert _bf16(_s16(h)) == sf * 2.0**-112, b  # the placement alone
        w = _mul_bf16x2(h | h << 16, fp4.UE5M3_BF16_UNBIAS)
        assert _bf16(_s16(w)) == _bf16(_s16(w >> 16)) == sf, b  # ue5m3_to_bf16x2
        single = _mul_bf16x2(w, fp4.UE5M3_BF16_PRESCALE)  # ue5m3_to_bf16x2_prescaled
        assert _bf16(_s16(single)) == sf * 2.0**110
        other = 0xFE - b
        f_lo, f_hi = _ue5m3_pair_model(b | other << 8)
        assert [_bf16(_s16(f >> 16 * k)) for f in (f_lo, f_hi) for k in range(2)] == [
            sf * 2.0**110] * 2 + [UE5M3_VALUES[other] * 2.0**110] * 2, b


def test_ue5m3_decode_model_is_exact_for_every_code_and_scale():
    """e2m1(code) * ue5m3(sf) * 2^-16 (decode_shift("ue5m3")) exactly, natural and strided
    pairings, all 16 codes in every nibble slot, all 255 finite bytes: the products have <= 6
    significant bits in 2^-34 .. 10.5, inside bf16's normal range."""
    from tk_cute.nvfp4 import E2M1_VALUES
    from tk_cute.nvfp4.format import UE5M3_VALUES

    shift = 2.0 ** -fp4.decode_shift("ue5m3")
    assert fp4.decode_shift("ue5m3") == 16 and fp4.decode_shift("ue4m3") == 8
    for b in range(0xFF):
        f, _ = _ue5m3_pair_model(b)
        for rot in range(2):
            vals = [(i + 8 * rot) % 16 for i in range(8)]
            q = sum(c << 4 * i for i, c in enumerate(vals))
            want = [E2M1_VALUES[c] * UE5M3_VALUES[b] * shift for c in vals]
            got = [_bf16(_s16(w >> 16 * k)) for w in _decode8_model(q, f) for k in range(2)]
            assert got == want, (b, vals)
            strided = _decode8_strided_model(q, f)
            assert [_bf16(_s16(strided[i % 4] >> 16 * (i // 4))) for i in range(8)] == want


def test_ue5m3_nan_byte_is_rejected_before_any_kernel():
    """0xFF would decode as 1.875 * 2^16 (the ops do not special-case it): the tensor refuses it."""
    from tk_cute.layouts.nvfp4_scales import blocked_shape
    from tk_cute.nvfp4 import NVFP4Tensor

    assert _bf16(_s16(_mul_bf16x2(0xFF0 | 0xFF0 << 16, fp4.UE5M3_BF16_UNBIAS))) == 122880.0
    sc = torch.zeros(blocked_shape(128, 64), dtype=torch.uint8)
    sc[0, 0, 5] = 0xFF
    with pytest.raises(ValueError, match=r"UE5M3 bytes 0x00..0xFE.*0xFF"):
        NVFP4Tensor(torch.zeros(128, 32, dtype=torch.uint8), sc, torch.tensor(1.0), (128, 64),
                    "ue5m3")


@pytest.mark.gpu
def test_ue5m3_decode_every_code_every_scale():
    """On the GPU: the UE5M3 decode ops against the exact products."""
    from tk_cute.nvfp4 import E2M1_VALUES
    from tk_cute.nvfp4.format import ue5m3_decode

    perm, bb, q = _every_code_every_scale(0xFF)  # scale bytes 0..0xFE (0xFF is NaN)
    n = q.numel()
    outbf, outsh = _poisoned(n * 4), _poisoned(n * 12)
    _run(_decode5, q.cuda(), bb.to(torch.int32).cuda(), outbf, outsh, Int32(n))
    vals = torch.tensor(E2M1_VALUES, dtype=torch.float64)[perm]
    sf = ue5m3_decode(bb.to(torch.uint8)).to(torch.float64)[:, None]
    sf_hi = ue5m3_decode((0xFE - bb).to(torch.uint8)).to(torch.float64)[:, None]
    shift = 2.0 ** -fp4.decode_shift("ue5m3")
    strided_hi = (vals * sf_hi * shift)[:, [0, 4, 1, 5, 2, 6, 3, 7]]  # word i = (i, i + 4)
    shifted = torch.cat([vals * sf * shift, strided_hi, vals * sf * shift], dim=1)
    for got, want in ((outbf, (vals * sf).reshape(-1)), (outsh, shifted.reshape(-1))):
        want = want.to(torch.bfloat16).view(torch.int16)
        bad = (want != got.cpu().view(torch.int16)).nonzero()
        assert bad.numel() == 0, f"{bad.numel()} mismatches, first at {bad[:4].tolist()}"
