# SPDX-License-Identifier: MIT
"""NVFP4 register ops (thread scope): E2M1/UE4M3 encode and FP4 decode, bit-exact.

Encode follows ``tk_cute.nvfp4.quantize`` (RNE, satfinite, sign bit kept so negative values that
round to zero give -0). Two implementations with the same bits:

* ``arch="sm_90a"``: no FP4 conversion exists (libNVVM/ptxas reject ``cvt .e2m1x2``), so E2M1 is
  rounded with a "magic add": for a = |y| with float32 exponent e clamped to [0, 2], adding
  c = 2^(e+22) rounds a to a multiple of its E2M1 quantum 2^(e-1) (one IEEE add, ties to even),
  and ``bits(a + c) - bits(c) + 2e`` is the magnitude code. UE4M3 uses ``cvt.rn.satfinite.e4m3x2``
  (sm_89+); `ue4m3_encode_sw` is the same magic-add scheme (quantum 2^(e-3), e in [-6, 8]).
* sm_100a / sm_103a / sm_107a: the native ``cvt.rn.satfinite.e2m1x2.f32``.

Decode (for emulated FP4 GEMMs): a Uint32 of 8 E2M1 codes (element i in nibble i) -> four
f16x2 / bf16x2 words in natural order (word j = elements 2j, 2j+1). The nibble's 3 magnitude bits
are dropped into the exponent/mantissa boundary of the 16-bit format, which makes code 1 (0.5) a
subnormal; one exact multiply by 2^14 (fp16) / 2^126 (bf16) restores the value. Scaling by a
UE4M3 byte is one more exact multiply (e2m1 * ue4m3 has <= 6 significant bits, range 2^-10..2688).
UE5M3 scales (Rubin's format: bias 15, 2^-17 .. 114688, `tk_cute.nvfp4.format`) decode to bf16
only (fp16 cannot hold 6 * 114688): `ue5m3_to_bf16x2` and the prescaled forms below;
`scale_to_bf16x2` / `scalex2_to_bf16x2_prescaled` pick a format's op (`DECODE_FORMATS`) and
`decode_shift` says what the prescaled decode leaves out (2^-8 UE4M3, 2^-16 UE5M3).
Every inline-PTX op below is a handful of instructions; arithmetic that must not be contracted
into an FMA (the recipe forbids it) is written as explicit ``.rn`` PTX.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Uint32, cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from tk_cute.arch import target
from tk_cute.ops.ptx import asm

# The recipe's floors (``tk_cute.nvfp4.quantize``): amax floor 2688 * 2^-116 (s_dec_g >= 2^-116,
# which makes the bytes scale-invariant), and 2^-126 under a block's decode scale (1/d finite).
F32_AMAX_FLOOR = 0x0B280000  # 21 * 2^-109 = 2688 * 2^-116
F32_MIN_NORMAL = 0x00800000  # 2^-126


def has_native_fp4(arch: str) -> bool:
    """True where ``cvt ... e2m1x2`` exists (`arch.Target.native_fp4_cvt`: Blackwell, Rubin)."""
    return target(arch).native_fp4_cvt


def _u32(v):
    return Uint32(v)


def _f32(v):
    return Float32(v)


# ---------------------------------------------------------------- float32 arithmetic, exact forms


@dsl_user_op
def bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    """The float32 bit pattern of x."""
    return Uint32(llvm.bitcast(T.i32(), _f32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def from_bits(u: Uint32, *, loc=None, ip=None) -> Float32:
    """The float32 whose bit pattern is u."""
    return Float32(llvm.bitcast(T.f32(), _u32(u).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """IEEE correctly rounded a / b (``div.rn.f32``; never the approximate division)."""
    return Float32(asm(T.f32(), [_f32(a), _f32(b)], "div.rn.f32 $0, $1, $2;", "=f,f,f", loc, ip))


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """a * b rounded once (``mul.rn`` is never contracted into an FMA)."""
    return Float32(asm(T.f32(), [_f32(a), _f32(b)], "mul.rn.f32 $0, $1, $2;", "=f,f,f", loc, ip))


@dsl_user_op
def max_f32(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(asm(T.f32(), [_f32(a), _f32(b)], "max.f32 $0, $1, $2;", "=f,f,f", loc, ip))


@dsl_user_op
def max_nan_f32(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """max(a, b) that propagates NaN (``max.NaN.f32``, sm_80+), like torch.maximum."""
    return Float32(asm(T.f32(), [_f32(a), _f32(b)], "max.NaN.f32 $0, $1, $2;", "=f,f,f", loc, ip))


@dsl_user_op
def zero_unless(u: Uint32, x: Float32, *, loc=None, ip=None) -> Float32:
    """x where u != 0, else +0.0 (``selp.f32``: a select, so x's bits pass unchanged)."""
    text = "{ .reg .pred z; setp.eq.u32 z, $1, 0; selp.f32 $0, 0f00000000, $2, z; }"
    return Float32(asm(T.f32(), [_u32(u), _f32(x)], text, "=f,r,f", loc, ip))


@dsl_user_op
def max_u16x2(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    """Lane-wise unsigned max of two 16-bit halves (sm_90+); on |bits| it is a NaN-keeping amax."""
    return Uint32(asm(T.i32(), [_u32(a), _u32(b)], "max.u16x2 $0, $1, $2;", "=r,r,r", loc, ip))


# ---------------------------------------------------------------- UE4M3 scales


@dsl_user_op
def ue4m3_encode_hw(t: Float32, *, loc=None, ip=None) -> Uint32:
    """UE4M3 byte of |t| (RNE, satfinite: > 448 and Inf give 0x7E, NaN 0x7F) via
    ``cvt...e4m3x2`` (sm_89+). A scale is unsigned: the sign bit is dropped, so -0.0 gives 0x00
    (the cvt alone gives 0x80)."""
    text = (
        "{ .reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, $1, $1; cvt.u32.u16 $0, h; "
        "and.b32 $0, $0, 127; }"
    )
    return Uint32(asm(T.i32(), [_f32(t)], text, "=r,f", loc, ip))


@dsl_user_op
def ue4m3_encode_sw(t: Float32, *, loc=None, ip=None) -> Uint32:
    """UE4M3 byte of |t| (RNE, satfinite, NaN -> 0x7F) with integer/float ops only; the same
    bytes as `ue4m3_encode_hw` for every float32 (-0.0 -> 0x00: a scale has no sign).

    a = min(|t|, 448); c = 2^(max(e, -6) + 20) has ulp = the E4M3 quantum at a's exponent, so
    a + c rounds a (RNE); byte = bits(a + c) - bits(c) + 8 * (e + 6) = ... + (bits(c) >> 20) - 1128.
    """
    text = (
        "{ .reg .f32 a, c, f; .reg .b32 cb, fb, g; .reg .pred isn;\n"
        "testp.notanumber.f32 isn, $1;\n"
        "abs.f32 a, $1; min.f32 a, a, 0f43E00000;\n"  # 448
        "max.f32 c, a, 0f3C800000;\n"  # 2^-6
        "mov.b32 cb, c; and.b32 cb, cb, 0x7F800000; add.s32 cb, cb, 0x0A000000;\n"  # *2^20
        "mov.b32 c, cb; add.rn.f32 f, a, c; mov.b32 fb, f;\n"
        "shr.u32 g, cb, 20; sub.s32 fb, fb, cb; add.s32 fb, fb, g; sub.s32 $0, fb, 1128;\n"
        "selp.b32 $0, 127, $0, isn; }"
    )
    return Uint32(asm(T.i32(), [_f32(t)], text, "=r,f", loc, ip))


@dsl_user_op
def ue4m3_decode(b: Uint32, *, loc=None, ip=None) -> Float32:
    """float32 value of a UE4M3 byte 0..0x7E: bits(b << 20) * 2^120 (exact, subnormals too)."""
    text = "{ .reg .b32 s; shl.b32 s, $1, 20; mov.b32 $0, s; mul.rn.f32 $0, $0, 0f7B800000; }"
    return Float32(asm(T.f32(), [_u32(b)], text, "=f,r", loc, ip))


# ---------------------------------------------------------------- E2M1 encode


@dsl_user_op
def e2m1_code_biased_sw(y: Float32, *, loc=None, ip=None) -> Uint32:
    """E2M1 magnitude code of y, plus 298 (RNE, saturate to 6) with integer/float ops (sm_90a).

    a = min(|y|, 6); c = 2^(clamp(e, 0, 2) + 22) (from max(a, 1) * 2^22, exponent bits only);
    a + c rounds a to its E2M1 quantum 2^(e-1) (ties to even), and
    code = bits(a + c) - bits(c) + 2e = bits(a + c) - bits(c) + (bits(c) >> 22) - 298.
    The -298 is left to the packer (`E2M1_BIAS_X8`), so each element costs 8 instructions.
    """
    text = (
        "{ .reg .f32 a, m, f; .reg .b32 cb, fb;\n"
        "abs.f32 a, $1; min.f32 a, a, 0f40C00000;\n"  # min(|y|, 6)
        "max.f32 m, a, 0f3F800000; mul.rn.f32 m, m, 0f4A800000;\n"  # max(a, 1) * 2^22
        "mov.b32 cb, m; and.b32 cb, cb, 0x7F800000; mov.b32 m, cb;\n"  # c = 2^(e + 22)
        "add.rn.f32 f, a, m; mov.b32 fb, f; sub.s32 fb, fb, cb;\n"
        "shr.u32 cb, cb, 22; add.s32 $0, fb, cb; }"
    )
    return Uint32(asm(T.i32(), [_f32(y)], text, "=r,f", loc, ip))


E2M1_BIAS_X8 = (-298 * 0x11111111) & 0xFFFFFFFF  # removes the 298 of 8 packed biased codes


@dsl_user_op
def e2m1_sign_sw(y: Float32, *, loc=None, ip=None) -> Uint32:
    """8 if y's sign bit is set, else 0."""
    text = "{ .reg .b32 s; mov.b32 s, $1; shr.u32 s, s, 28; and.b32 $0, s, 8; }"
    return Uint32(asm(T.i32(), [_f32(y)], text, "=r,f", loc, ip))


@dsl_user_op
def sign_nibbles_16bit(w0: Uint32, w1: Uint32, w2: Uint32, w3: Uint32, *, loc=None, ip=None):
    """Sign masks of 8 packed 16-bit values (element 2j low / 2j+1 high half of w_j): a Uint32
    whose nibble i is 0xF when element i is negative, else 0 (4 prmt + 1 lop3 for 8 values).

    prmt's sign-replicate mode (selector bit 3) turns each high byte into 0x00 / 0xFF."""
    text = (
        "{ .reg .b32 a, b, lo, hi;\n"
        "prmt.b32 a, $1, $2, 0xFDB9;\n"  # [s0, s1, s2, s3], each 0x00 or 0xFF
        "prmt.b32 b, $3, $4, 0xFDB9;\n"  # [s4, s5, s6, s7]
        "prmt.b32 lo, a, b, 0x6420;\n"  # [s0, s2, s4, s6]: low nibbles (even elements)
        "prmt.b32 hi, a, b, 0x7531;\n"  # [s1, s3, s5, s7]: high nibbles (odd elements)
        "mov.b32 a, 0x0F0F0F0F;\n"
        "lop3.b32 $0, lo, hi, a, 0xE4; }"  # (lo & a) | (hi & ~a)
    )
    return Uint32(asm(T.i32(), [_u32(w0), _u32(w1), _u32(w2), _u32(w3)], text, "=r,r,r,r,r",
                       loc, ip))


@dsl_user_op
def e2m1x2_encode_hw(y0: Float32, y1: Float32, *, loc=None, ip=None) -> Uint32:
    """Byte (y1 code << 4) | y0 code via ``cvt.rn.satfinite.e2m1x2.f32`` (sm_100a+)."""
    text = (
        "{ .reg .b8 b; .reg .b16 h; cvt.rn.satfinite.e2m1x2.f32 b, $2, $1; "
        "mov.b16 h, {b, b}; cvt.u32.u16 $0, h; and.b32 $0, $0, 255; }"
    )
    return Uint32(asm(T.i32(), [_f32(y0), _f32(y1)], text, "=r,f,f", loc, ip))


def e2m1x8_encode(y, arch: str, signs=None) -> Uint32:
    """Pack E2M1 codes of 8 (or 4) float32 values (element i in nibble i) into a Uint32
    (4 values fill the low 16 bits).

    `signs` (sm_90a path, optional): nibble i has bit 3 set iff y[i] is negative (e.g. from
    `sign_nibbles_16bit` on the inputs, whose signs equal the products' for a positive scale).
    """
    n = len(y)
    if n not in (4, 8):
        raise ValueError(f"e2m1x8_encode packs 4 or 8 values, got {n}")
    mask = (1 << (4 * n)) - 1
    if has_native_fp4(arch):
        b = [e2m1x2_encode_hw(y[2 * j], y[2 * j + 1]) for j in range(n // 2)]
        acc = b[0]
        for j in range(1, n // 2):
            acc = acc | (b[j] << (8 * j))
        return acc
    acc = Uint32(E2M1_BIAS_X8 & mask)
    for i in range(n):
        acc = acc + e2m1_code_biased_sw(y[i]) * (1 << (4 * i))
    if signs is None:
        for i in range(n):
            acc = acc | (e2m1_sign_sw(y[i]) << (4 * i))
        return acc
    return acc | (signs & (0x88888888 & mask))


def e2m1x8_quantize(x, s_enc: Float32, arch: str, signs=None) -> Uint32:
    """Codes of x[i] * s_enc (each product rounded once, no FMA) for 8 (or 4) float32 values."""
    return e2m1x8_encode([mul_rn(v, s_enc) for v in x], arch, signs)


def e2m1_encode(y: Float32, arch: str) -> Uint32:
    """The E2M1 code (0..15, sign in bit 3) of one float32 value, as `e2m1x8_encode` packs it."""
    if has_native_fp4(arch):
        return e2m1x2_encode_hw(y, Float32(0.0)) & 0xF
    return ((e2m1_code_biased_sw(y) + Uint32((-298) & 0xFFFFFFFF)) & 0x7) | e2m1_sign_sw(y)


E4M3_SATURATION = 448.0  # t above this encodes as 448 (byte 0x7E): the global scale was too small


def block_scale(blk_amax: Float32, s_dec_g: Float32, s_enc_g: Float32):
    """Steps 4-5 of the NVFP4 recipe (`tk_cute.nvfp4.quantize`) for one 16-element block:
    (sf, s_enc, saturated): the UE4M3 scale byte, the encode scale of the block's elements and
    a Uint32 1 where t exceeded 448 (the byte saturated). Every kernel that quantizes calls
    this one op, so their bytes agree."""
    t = mul_rn(div_rn(blk_amax, Float32(6.0)), s_enc_g)
    sf = ue4m3_encode_hw(t)
    d = max_f32(mul_rn(ue4m3_decode(sf), s_dec_g), from_bits(Uint32(F32_MIN_NORMAL)))
    s_enc = zero_unless(sf, div_rn(Float32(1.0), d))  # sf == 0: codes +-0
    return sf, s_enc, Uint32(t > Float32(E4M3_SATURATION))


def quantize_block16(acc, amax_acc: Float32, alpha: Float32, s_dec_g: Float32,
                     s_enc_g: Float32, arch: str):
    """The recipe (`tk_cute.nvfp4.quantize`) on one 16-element block of D = fl(acc * alpha):
    (codes of elements 0-7, codes of 8-15, UE4M3 byte, saturated) (`block_scale`'s last two).

    `acc`: the 16 float32 accumulators; `amax_acc`: max |acc| over them (a reducing TMEM load
    or a register max); `alpha` > 0. The block amax of D is fl(amax_acc * alpha): rounding to
    nearest is monotone and odd, so max |fl(acc_i * alpha)| = fl(max |acc_i| * alpha) (no
    per-element |D| max needed). Each D element is fl(acc_i * alpha) (one `mul_rn`, never fused
    with the encode scale's multiply), so the bytes are those of quantizing the fp32 D."""
    sf, s_enc, saturated = block_scale(mul_rn(amax_acc, alpha), s_dec_g, s_enc_g)
    d = [mul_rn(v, alpha) for v in acc]
    return (e2m1x8_quantize(d[:8], s_enc, arch), e2m1x8_quantize(d[8:], s_enc, arch), sf,
            saturated)


def _f16_to_f32(w, half: int):
    part = ("lo", "hi")[half]
    text = f"{{ .reg .b16 lo, hi; mov.b32 {{lo, hi}}, $1; cvt.f32.f16 $0, {part}; }}"
    return Float32(asm(T.f32(), [Uint32(w)], text, "=f,r"))


def words_to_f32(words, dtype: str) -> list:
    """Input words ("bf16" / "f16": 16-bit pairs, "f32": float32 bits) -> float32 values,
    exact."""
    if dtype == "f32":
        return [from_bits(w) for w in words]
    out = []
    for w in words:
        if dtype == "bf16":
            out += [from_bits(w << 16), from_bits(w & 0xFFFF0000)]
        else:
            out += [_f16_to_f32(w, 0), _f16_to_f32(w, 1)]
    return out


def abs_max_bits(words, dtype: str) -> Uint32:
    """float32 bit pattern of max |x| over the words (`words_to_f32`'s forms; an integer max:
    NaN/Inf compare above every finite value)."""
    if dtype == "f32":
        m = words[0] & 0x7FFFFFFF
        for w in words[1:]:
            m = Uint32(cutlass.max(m, w & 0x7FFFFFFF))
        return Uint32(m)
    m = words[0] & 0x7FFF7FFF
    for w in words[1:]:
        m = max_u16x2(m, w & 0x7FFF7FFF)
    m = Uint32(cutlass.max(m & 0xFFFF, m >> 16))
    if dtype == "bf16":
        return Uint32(m << 16)
    return bits(_f16_to_f32(m, 0))


def global_decode_scale(amax_bits: Uint32) -> Float32:
    """Step 2 of the recipe (`tk_cute.nvfp4.quantize`) from the tensor's amax bits,
    NaN-propagating: max(amax, AMAX_FLOOR) / 2688 (the encode scale is 1 / that)."""
    floor = from_bits(Uint32(F32_AMAX_FLOOR))
    return div_rn(max_nan_f32(from_bits(amax_bits), floor), Float32(2688.0))


def quantize_lane(words, dtype: str, s_dec_g: Float32, s_enc_g: Float32, arch: str):
    """The recipe on one lane's 16 bytes of input (8 16-bit or 4 fp32 elements) whose 16-element
    block spans 2 (16-bit) or 4 (fp32) consecutive lanes (all active): (codes, the block's UE4M3
    byte, its amax bits). Every kernel that quantizes its input calls this one op (the
    quantizer, the small-M kernel's in-kernel activations), so their bytes agree."""
    m = abs_max_bits(words, dtype)
    for off in (1, 2)[: (2 if dtype == "f32" else 1)]:  # lanes per block: 2 (16-bit), 4 (fp32)
        m = Uint32(cutlass.max(m, Uint32(cute.arch.shuffle_sync_bfly(m, offset=off))))
    sf, s_enc, _ = block_scale(from_bits(m), s_dec_g, s_enc_g)
    signs = None
    if dtype != "f32" and not has_native_fp4(arch):
        signs = sign_nibbles_16bit(*words)
    return e2m1x8_quantize(words_to_f32(words, dtype), s_enc, arch, signs), sf, m


def abs_max(values) -> Float32:
    """max |v| of float32 values: `max.f32` of the |bits| as a tree (log2 n dependent steps)."""
    m = [from_bits(bits(v) & 0x7FFFFFFF) for v in values]
    while len(m) > 1:
        m = [max_f32(m[i], m[i + 1]) for i in range(0, len(m) - 1, 2)] + m[len(m) & ~1:]
    return m[0]


# ---------------------------------------------------------------- E2M1 decode (emulated GEMMs)


@dsl_user_op
def mul_f16x2(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    return Uint32(asm(T.i32(), [_u32(a), _u32(b)], "mul.rn.f16x2 $0, $1, $2;", "=r,r,r", loc, ip))


@dsl_user_op
def mul_bf16x2(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    return Uint32(
        asm(T.i32(), [_u32(a), _u32(b)], "mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", loc, ip)
    )


@dsl_user_op
def prmt(a: Uint32, b: Uint32, sel: int, *, loc=None, ip=None) -> Uint32:
    """Byte permute (``prmt.b32``): output byte i <- byte (sel >> 4i) & 7 of the pair (a, b);
    selector bit 3 replicates that byte's top bit instead."""
    text = f"prmt.b32 $0, $1, $2, {sel};"
    return Uint32(asm(T.i32(), [_u32(a), _u32(b)], text, "=r,r,r", loc, ip))


# prmt selectors of `_bf16_patterns`: byte 0 <- u.byte j (nibble 2j), byte 2 <- v.byte j
# (nibble 2j+1); bytes 1, 3 replicate the top bit of a byte below 0x10, i.e. give 0x00.
_PAIR_SEL = [j | (8 | j) << 4 | (4 + j) << 8 | (12 + j) << 12 for j in range(4)]


def _bf16_patterns(q: Uint32) -> list:
    """Four words, nibble 2j / 2j+1 magnitude bits at 8..6 (the bf16 exponent/mantissa
    boundary) and sign at 15 of each half, in 3 instructions a word: with t = [nibble 2j, 0,
    nibble 2j+1, 0] (prmt of the low and high nibbles), t * (2^6 + 2^12) places both with no
    carries and one lop3 keeps those bits."""
    u = q & 0x0F0F0F0F
    v = (q >> 4) & 0x0F0F0F0F
    return [(prmt(u, v, sel) * 0x1040) & 0x81C081C0 for sel in _PAIR_SEL]


def _f16_patterns(q: Uint32) -> list:
    """Four words, nibble 2j / 2j+1 magnitude bits at 11..9 (fp16) and sign at 15 of each half.
    (The multiply of `_bf16_patterns` does not fit: shifts 9 and 12 of a nibble overlap.)"""
    q4 = q >> 4
    out = []
    for j in range(4):
        t = prmt(q, q4, j | ((4 + j) << 8))  # half 0 <- q.byte j, half 1 <- q4.byte j
        out.append(((t & 0x00070007) << 9) | ((t & 0x00080008) << 12))
    return out


def e2m1x8_to_f16x8(q: Uint32) -> list:
    """8 E2M1 codes -> 4 f16x2 words (word j = elements 2j low, 2j+1 high), exact values."""
    two14 = 0x74007400  # 2^14 in both halves
    return [mul_f16x2(w, Uint32(two14)) for w in _f16_patterns(q)]


def e2m1x8_to_bf16x8(q: Uint32) -> list:
    """8 E2M1 codes -> 4 bf16x2 words (word j = elements 2j low, 2j+1 high), exact values."""
    two126 = 0x7E807E80  # 2^126 in both halves
    return [mul_bf16x2(w, Uint32(two126)) for w in _bf16_patterns(q)]


def ue4m3_to_f16x2(b: Uint32) -> Uint32:
    """A UE4M3 byte as its exact fp16 value in both halves (bits << 7, then * 2^8)."""
    h = (b & 0x7F) << 7
    return mul_f16x2(h | (h << 16), Uint32(0x5C005C00))


def ue4m3_to_bf16x2(b: Uint32) -> Uint32:
    """A UE4M3 byte as its exact bf16 value in both halves (bits << 4, then * 2^120)."""
    h = (b & 0x7F) << 4
    return mul_bf16x2(h | (h << 16), Uint32(0x7B807B80))


# A placed E2M1 code is its value times 2^-126 (bf16); instead of re-normalising every pair with
# a multiply by 2^126, fold that into the block scale: 2^126 would overflow bf16 for scales above
# 2, so the scale carries 2^118 and the decoded values are e2m1 * ue4m3 * 2^-8, still exact
# (<= 6 significant bits, >= 2^-18). A GEMM on such operands multiplies its result by 2^8 per
# decoded operand. One bf16x2 multiply per two elements instead of two.
BF16_DECODE_SHIFT = 8


# UE5M3 -> bf16 (exact). bf16 has 8 exponent bits, UE5M3 5: a byte b = [e4..e0 m2 m1 m0] shifted
# left by 4 puts e into the low 5 bits of bf16's exponent field (bits 11..7) and m into the top 3
# mantissa bits (6..4), sign 0. For e >= 1 that bf16 is (1 + m/8) 2^(e - 127) = sf 2^(15 - 127);
# for e = 0 it is bf16's subnormal (m/8) 2^-126 = (m 2^-17) 2^-112: either way sf * 2^-112
# exactly, subnormal scales included, and one multiply by 2^112 (exact: a power of two, result
# normal, at most 4 significant bits) gives sf. Byte 0xFF (UE5M3's NaN) would decode to 122880:
# NVFP4Tensor rejects it, kernels never see it.
UE5M3_BF16_UNBIAS = 0x77807780  # 2^112 in both bf16 halves
# The prescaled decode (`e2m1x8_scaled_shifted`) multiplies placed E2M1 codes (value * 2^-126)
# by the scale times 2^(126 - shift). UE4M3 carries 2^118 (shift 8: 448 * 2^118 < 2^127); UE5M3's
# 114688 * 2^118 would overflow bf16, so it carries 2^110 (shift 16: 114688 * 2^110 < 2^127, and
# the smallest product 0.5 * 2^-17 * 2^-16 = 2^-34 stays normal): decoded values are
# e2m1 * sf * 2^-16, exact, and a GEMM multiplies by 2^16 per decoded operand.
UE5M3_BF16_PRESCALE = 0x76807680  # 2^110
DECODE_SHIFT = {"ue4m3": BF16_DECODE_SHIFT, "ue5m3": 16}
DECODE_FORMATS = tuple(DECODE_SHIFT)  # the scale formats the decode ops take


def decode_shift(fmt: str) -> int:
    """log2 of what the prescaled decode of `fmt` scales leaves out (8: UE4M3, 16: UE5M3)."""
    if fmt not in DECODE_SHIFT:
        raise ValueError(f"unknown block-scale format {fmt!r}: one of {DECODE_FORMATS}")
    return DECODE_SHIFT[fmt]


def ue5m3_to_bf16x2(b: Uint32) -> Uint32:
    """A UE5M3 byte as its exact bf16 value in both halves (bits << 4, then * 2^112)."""
    h = (b & 0xFF) << 4
    return mul_bf16x2(h | (h << 16), Uint32(UE5M3_BF16_UNBIAS))


def ue5m3_to_bf16x2_prescaled(b: Uint32) -> Uint32:
    """A UE5M3 byte times 2^110 in both bf16 halves (exact), for `e2m1x8_scaled_shifted` with
    `decode_shift("ue5m3")` = 16."""
    return mul_bf16x2(ue5m3_to_bf16x2(b), Uint32(UE5M3_BF16_PRESCALE))


def ue5m3x2_to_bf16x2_prescaled(h: Uint32) -> tuple:
    """Two UE5M3 bytes (h = lo | hi << 8) -> (F_lo, F_hi), each sf * 2^110 in both bf16 halves
    (exact, subnormal scales too), as `ue4m3x2_to_bf16x2_prescaled` does for UE4M3."""
    p = prmt(h, Uint32(0), 0x4140) << 4  # [lo << 4, hi << 4] as bf16 halves (<= 0x0FF0 each)
    f = mul_bf16x2(mul_bf16x2(p, Uint32(UE5M3_BF16_UNBIAS)), Uint32(UE5M3_BF16_PRESCALE))
    return broadcast_half(f, 0), broadcast_half(f, 1)


def scale_to_bf16x2(b: Uint32, fmt: str = "ue4m3") -> Uint32:
    """A scale byte of format `fmt` as its exact bf16 value in both halves."""
    decode_shift(fmt)  # validates the name
    return ue5m3_to_bf16x2(b) if fmt == "ue5m3" else ue4m3_to_bf16x2(b)


def scale_to_bf16x2_prescaled(b: Uint32, fmt: str = "ue4m3") -> Uint32:
    """A scale byte of format `fmt` prescaled by 2^(126 - decode_shift) in both halves, for
    `e2m1x8_scaled_shifted` / `_strided`."""
    decode_shift(fmt)
    return ue5m3_to_bf16x2_prescaled(b) if fmt == "ue5m3" else ue4m3_to_bf16x2_prescaled(b)


def scalex2_to_bf16x2_prescaled(h: Uint32, fmt: str = "ue4m3") -> tuple:
    """Two scale bytes of format `fmt` -> (F_lo, F_hi) prescaled by 2^(126 - decode_shift)."""
    decode_shift(fmt)
    return ue5m3x2_to_bf16x2_prescaled(h) if fmt == "ue5m3" else ue4m3x2_to_bf16x2_prescaled(h)


def ue4m3_to_bf16x2_prescaled(b: Uint32) -> Uint32:
    """A UE4M3 byte times 2^118 in both bf16 halves (exact), for `e2m1x8_scaled_shifted`."""
    return mul_bf16x2(ue4m3_to_bf16x2(b), Uint32(0x7A807A80))  # 2^118


def ue4m3x2_to_bf16x2_prescaled(h: Uint32) -> tuple:
    """Two UE4M3 bytes (h = lo | hi << 8) -> (F_lo, F_hi), each sf * 2^118 in both bf16 halves
    (exact; subnormal scales too: bits << 4 is sf * 2^-120 as bf16). Cheaper per scale than
    two `ue4m3_to_bf16x2_prescaled`: one shift and two multiplies serve both, and the halves'
    broadcast folds into the bf16x2 multiplies that use them (`broadcast_half`)."""
    p = prmt(h, Uint32(0), 0x4140) << 4  # [lo << 4, hi << 4] as bf16 halves
    f = mul_bf16x2(mul_bf16x2(p, Uint32(0x7B807B80)), Uint32(0x7A807A80))  # 2^120, 2^118
    return broadcast_half(f, 0), broadcast_half(f, 1)


@dsl_user_op
def broadcast_half(w: Uint32, half: int, *, loc=None, ip=None) -> Uint32:
    """Half `half` (0: low, 1: high) of w in both halves. Written as 16-bit register moves, not a
    byte permute, so ptxas folds it into a consuming ``HMUL2``'s operand select (``.H0_H0``)."""
    pick = "lo, lo" if half == 0 else "hi, hi"
    text = f"{{ .reg .b16 lo, hi; mov.b32 {{lo, hi}}, $1; mov.b32 $0, {{{pick}}}; }}"
    return Uint32(asm(T.i32(), [_u32(w)], text, "=r,r", loc, ip))


def e2m1x8_scaled_shifted(q: Uint32, sf_prescaled: Uint32) -> list:
    """8 codes -> 4 bf16x2 words of e2m1 * ue4m3 * 2^-8 (exact); scale from
    `ue4m3_to_bf16x2_prescaled` or `ue4m3x2_to_bf16x2_prescaled`."""
    return [mul_bf16x2(w, sf_prescaled) for w in _bf16_patterns(q)]


# The strided pairing: word i of a decoded group holds elements (i, i + 4) instead of (2i, 2i+1).
# Nibbles i and i + 4 sit 16 bits apart, one per half of the word, so one mask isolates a pair
# with no byte permute: 13 instructions per 8 codes instead of 15. A GEMM using it must pair its
# other operand the same way (`bf16x8_strided` for bf16, this decode for NVFP4).


def _bf16_patterns_strided(q: Uint32) -> list:
    """Four words, word i = (nibble i, nibble i + 4) as `_bf16_patterns` places them: nibbles
    0/4 at bits 0..3 of the halves times (2^6 + 2^12), nibbles 1/5 at bits 4..7 times
    (2^2 + 2^8); nibbles 2, 3, 6, 7 the same after one shift by 8 (no carries: <= 0xF3C0)."""
    r = q >> 8
    return [((x & mask) * mul) & 0x81C081C0 for x in (q, r)
            for mask, mul in ((0x000F000F, 0x1040), (0x00F000F0, 0x0104))]


def e2m1x8_scaled_shifted_strided(q: Uint32, sf_prescaled: Uint32) -> list:
    """`e2m1x8_scaled_shifted` in the strided pairing: word i = elements (i, i + 4)."""
    return [mul_bf16x2(w, sf_prescaled) for w in _bf16_patterns_strided(q)]


# (source words, prmt selector) of strided word i: elements i, i + 4 are the halves i % 2 of
# natural words i // 2 and i // 2 + 2.
STRIDED_PAIRS = ((0, 2, 0x5410), (0, 2, 0x7632), (1, 3, 0x5410), (1, 3, 0x7632))


def bf16x8_strided(words: list) -> list:
    """8 bf16 in natural pairs (word j = elements 2j, 2j + 1) -> the strided pairing (word i =
    elements i, i + 4): 4 byte permutes."""
    return [prmt(words[a], words[b], sel) for a, b, sel in STRIDED_PAIRS]


def e2m1x8_scaled(q: Uint32, sf_x2: Uint32, dtype: str) -> list:
    """e2m1 * ue4m3 for 8 codes, exact: `sf_x2` from `ue4m3_to_f16x2`/`ue4m3_to_bf16x2`."""
    if dtype == "f16":
        return [mul_f16x2(w, sf_x2) for w in e2m1x8_to_f16x8(q)]
    return [mul_bf16x2(w, sf_x2) for w in e2m1x8_to_bf16x8(q)]
