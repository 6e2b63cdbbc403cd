"""Bit-exact E2M1 (FP4), E4M3 (FP8) and UE5M3 encoders and decoders, and FP4 nibble packing.

These are the scalar formats of NVFP4 (see ``shared/reference/nvfp4.md``). Every function here is
exact: decoders are table lookups, encoders round with integer arithmetic on the float32 bit
pattern, so the host reference reproduces the bits of the hardware conversions
``cvt.rn.satfinite.e2m1x2.f32`` and ``cvt.rn.satfinite.e4m3x2.f32``:

* Rounding is round-to-nearest, ties to the EVEN mantissa (the significand as an integer
  ``2^m + mantissa`` is even), as IEEE-754 RNE.
* Saturation (``satfinite``): a magnitude beyond the largest finite value (6 for E2M1, 448 for
  E4M3) becomes that value; +-Inf also saturates. NaN gives 0x7F/0xFF for E4M3 (its NaN); E2M1
  has no NaN and this module maps NaN to +-6 (quantization rejects NaN before it gets here).
* Signs are carried by the sign BIT, as IEEE conversions do: -0.0 and any negative value that
  rounds to zero encode as negative zero (E2M1 code 8, E4M3 byte 0x80).
* Subnormals of the target are handled exactly: E2M1's one subnormal is 0.5 (quantum 2^-1);
  E4M3's are k * 2^-9, k = 1..7 (the smallest normal is 2^-6). float32 subnormal inputs are
  honoured (no flush to zero).

Algorithm (``_round_minifloat``): for |x| with float32 exponent e, clamp e to
[emin, emax + 1]; the target's quantum at that exponent is 2^(e - m). Scaling |x| by 2^-(e - m)
is exact (power of two, no under/overflow in range), ``torch.round`` rounds half to even, and
scaling back is exact; then clamp to the maximum. Codes follow from the rounded value's bits.

UE5M3 (``FloatNV8E5M3FNU``: Rubin's wider block-scale format, sm_107a's block-scaled MMA takes
it; CUDA 13.4 math API ``__nv_fp8_ue5m3``: "no sign, 5 exponent, 1 implicit and 3 explicit
mantissa bits. The encoding doesn't support Infinity. NaNs are limited to 0xFF"): exponent bias
15, so byte b is ``b * 2^-17`` for b < 8 (subnormals; 0x00 is zero) and
``(1 + (b & 7) / 8) * 2^((b >> 3) - 15)`` above: range 2^-17 .. 114688 (0xFE = 1.75 * 2^16),
0xFF NaN, every value a multiple of 2^-17. The bias and range were checked against the DSL's
own semantics of the type (MLIR ``fnv8E5M3FNU`` constants: 0x01 = 2^-17, 0x08 = 2^-14, 0x78 = 1,
0xFE = 114688, 0xFF NaN; 1.0625 -> 1.0 and 3 * 2^-18 -> 2^-16, ties to even). This library
encodes it like E4M3: round to nearest even, saturating (114688 and beyond, +Inf: 0xFE), NaN ->
0xFF, the sign ignored (a scale is never negative). (The DSL's own fp32 -> UE5M3 vector
conversion rounds toward +inf, "as for UE8M0 scale factors"; the recipe here keeps RNE, as
``cvt.rn.satfinite.ue5m3x2.f32`` on sm_107a and the CUDA math API's conversions do.)
`SCALE_FORMATS` names the two block-scale formats and what the recipe needs of each.

`round_float64` rounds float64 results (exact decodes, reference GEMMs) to an output dtype once:
torch's float64 -> bfloat16/float16 casts go through float32 and round twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

#: Magnitudes and signed values of the 16 E2M1 codes (code 8 is -0.0).
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_NAN = 0x7F  # with or without the sign bit 0x80
E4M3_MAX_BYTE = 0x7E  # the largest finite unsigned (UE4M3) byte: 448
UE5M3_MAX = 114688.0  # 1.75 * 2^16
UE5M3_MAX_BYTE = 0xFE
UE5M3_NAN = 0xFF  # its only NaN
F32_MIN_NORMAL = 2.0**-126
F32_MAX = float(torch.finfo(torch.float32).max)  # (2 - 2^-23) * 2^127

# (mantissa bits, minimum normal exponent, maximum exponent, maximum finite value, sign bit)
_E2M1 = (1, 0, 2, E2M1_MAX, 0x8)
_E4M3 = (3, -6, 8, E4M3_MAX, 0x80)
_UE5M3 = (3, -14, 16, UE5M3_MAX, 0)  # no sign bit


def _e4m3_table() -> list[float]:
    vals = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            vals.append(float("nan"))
        elif exp == 0:
            vals.append(sign * man * 2.0**-9)
        else:
            vals.append(sign * (1 + man / 8) * 2.0 ** (exp - 7))
    return vals


#: float values of all 256 E4M3 (``float8_e4m3fn``) bytes; NaN at 0x7F and 0xFF.
E4M3_VALUES: tuple[float, ...] = tuple(_e4m3_table())


def _ue5m3_table() -> list[float]:
    vals = [b * 2.0**-17 for b in range(8)]
    vals += [(1 + (b & 7) / 8) * 2.0 ** ((b >> 3) - 15) for b in range(8, 255)]
    return vals + [float("nan")]


#: float values of all 256 UE5M3 bytes; NaN at 0xFF only.
UE5M3_VALUES: tuple[float, ...] = tuple(_ue5m3_table())

_TABLES: dict[tuple, torch.Tensor] = {}


def _table(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    key = (id(values), device)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = torch.tensor(values, dtype=torch.float32, device=device)
    return t


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """Exact float32 2^e for an int32 tensor e in [-126, 127], built from the exponent bits."""
    return ((e + 127) << 23).view(torch.float32)


def _round_minifloat(mag: torch.Tensor, fmt: tuple) -> torch.Tensor:
    """RNE-round non-negative float32 magnitudes (may be +Inf, not NaN) onto a minifloat grid,
    saturating at the format's maximum. Returns float32 values exactly on the grid."""
    m, emin, emax, vmax, _ = fmt
    e = (mag.view(torch.int32) >> 23) - 127  # float32 zero/subnormal -> -127
    e = e.clamp(emin, emax + 1)  # below emin: the target's subnormal quantum; above: saturates
    q = e - m  # quantum 2^q
    n = torch.round(mag * _pow2(-q))  # exact scaling, then round half to even
    return torch.clamp(n * _pow2(q), max=vmax)


def _codes_of_grid_values(v: torch.Tensor, fmt: tuple) -> torch.Tensor:
    """Magnitude codes (int32) of non-negative float32 values that lie on the format's grid."""
    m, emin, _, _, _ = fmt
    bits = v.view(torch.int32)
    e = ((bits >> 23) - 127).clamp(min=emin)  # the clamp only tidies the unused branch
    mant = (bits >> (23 - m)) & ((1 << m) - 1)
    normal = ((e - emin + 1) << m) | mant
    subnormal = (v * float(2.0 ** (m - emin))).to(torch.int32)  # exact: small integers
    return torch.where(v >= float(2.0**emin), normal, subnormal)


def _encode(x: torch.Tensor, fmt: tuple) -> torch.Tensor:
    x = x.to(torch.float32)
    nan = torch.isnan(x)
    mag = torch.where(nan, torch.full_like(x, float("inf")), x.abs())
    code = _codes_of_grid_values(_round_minifloat(mag, fmt), fmt)
    code = torch.where(torch.signbit(x), code | fmt[4], code)
    return code, nan


def e2m1_encode_rne(x: torch.Tensor) -> torch.Tensor:
    """Encode values as E2M1 codes (round to nearest even, saturate to +-6).

    Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. Negative inputs that round
    to zero (and -0.0) give code 8 (-0). Inputs are first converted to float32 (exact for
    bf16/fp16). NaN maps to +-6 (unspecified by the format; quantization never produces it).

    Args:
        x: a floating tensor of any shape.

    Returns:
        torch.uint8 codes in [0, 15] of the same shape (bit 3 = sign).
    """
    code, _ = _encode(x, _E2M1)
    return code.to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (integer tensor, values 0..15) to float32 (code 8 gives -0.0).

    Args:
        codes: integer tensor of 4-bit codes (higher bits must be zero).

    Returns:
        float32 tensor of the same shape.
    """
    return _table(E2M1_VALUES, codes.device)[codes.long()]


def e4m3_encode_rne(x: torch.Tensor) -> torch.Tensor:
    """Encode values as E4M3 (float8_e4m3fn) bytes: round to nearest even, saturating.

    Finite magnitudes above 448 (and +-Inf) saturate to 448 (byte 0x7E/0xFE): this is the
    ``satfinite`` behaviour, unlike torch's ``.to(torch.float8_e4m3fn)``, which gives NaN for
    values past 464. Subnormals are exact: magnitudes below 2^-6 round to multiples of 2^-9;
    magnitudes up to 2^-10 (the midpoint between 0 and 2^-9, a tie to even) round to zero.
    Negative values keep the sign bit (0x80), including -0.0. NaN gives 0x7F (0xFF if its sign
    bit is set).

    Args:
        x: a floating tensor of any shape (converted to float32 first).

    Returns:
        torch.uint8 bytes of the same shape.
    """
    code, nan = _encode(x, _E4M3)
    code = torch.where(nan, code | E4M3_NAN, code)  # NaN was saturated to 0x7E; 0x7E|0x7F = NaN
    return code.to(torch.uint8)


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    """Decode E4M3 bytes (uint8 tensor) to float32; 0x7F and 0xFF give NaN.

    Args:
        b: integer tensor of bytes 0..255.

    Returns:
        float32 tensor of the same shape.
    """
    return _table(E4M3_VALUES, b.device)[b.long()]


def ue5m3_encode_rne(x: torch.Tensor) -> torch.Tensor:
    """Encode magnitudes as UE5M3 bytes: round to nearest even, saturating at 114688 (0xFE;
    +-Inf too). Below 2^-14 the quantum is 2^-17; magnitudes up to 2^-18 (a tie) give 0x00.
    The sign is ignored (the format has none; the recipe's scales are never negative). NaN
    gives 0xFF.

    Args:
        x: a floating tensor of any shape (converted to float32 first).

    Returns:
        torch.uint8 bytes of the same shape.
    """
    code, nan = _encode(x, _UE5M3)
    code = torch.where(nan, torch.full_like(code, UE5M3_NAN), code)
    return code.to(torch.uint8)


def ue5m3_decode(b: torch.Tensor) -> torch.Tensor:
    """Decode UE5M3 bytes (integer tensor 0..255) to float32; 0xFF gives NaN."""
    return _table(UE5M3_VALUES, b.device)[b.long()]


@dataclass(frozen=True)
class ScaleFormat:
    """A block-scale format and what the recipe (`tk_cute.nvfp4.quantize`) and the exact
    references need of it.

    Attributes:
        name: "ue4m3" (NVFP4's, every FP4 tensor core) or "ue5m3" (Rubin's wider one).
        max: the largest finite value (its byte `max_byte`; bytes above it are invalid:
            UE4M3 0x7F is NaN and 0x80 up carry a sign bit, UE5M3 0xFF is NaN).
        quantum_exp: every value is a multiple of 2^quantum_exp (the smallest subnormal).
        floor_exp: the computed global decode scale is at least 2^floor_exp (the recipe's amax
            floor; the quantize module docstring derives both values).
        encode, decode: the torch encoder (RNE, satfinite) and decoder (table).
    """

    name: str
    max: float
    max_byte: int
    quantum_exp: int
    floor_exp: int
    encode: Callable[[torch.Tensor], torch.Tensor]
    decode: Callable[[torch.Tensor], torch.Tensor]

    @property
    def global_denom(self) -> float:
        """6 * max: the computed global decode scale is amax / global_denom, so the largest
        block scale lands at the top of the format (UE4M3 2688, UE5M3 688128)."""
        return 6.0 * self.max

    @property
    def amax_floor(self) -> float:
        """global_denom * 2^floor_exp (exact in float32)."""
        return self.global_denom * 2.0**self.floor_exp


SCALE_FORMATS: dict[str, ScaleFormat] = {
    "ue4m3": ScaleFormat("ue4m3", E4M3_MAX, E4M3_MAX_BYTE, -9, -116, e4m3_encode_rne,
                         e4m3_decode),
    "ue5m3": ScaleFormat("ue5m3", UE5M3_MAX, UE5M3_MAX_BYTE, -17, -108, ue5m3_encode_rne,
                         ue5m3_decode),
}


def scale_format(name: str) -> ScaleFormat:
    """The `ScaleFormat` called `name`; ValueError naming the supported ones otherwise."""
    try:
        return SCALE_FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown block-scale format {name!r}: use one of "
                         f"{', '.join(SCALE_FORMATS)}") from None


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes (..., K) into bytes (..., K // 2): element 2i in the LOW nibble.

    This is the byte layout of ``torch.float4_e2m1fn_x2`` and of the tensor cores' FP4 operands.

    Args:
        codes: integer tensor of 4-bit codes with an even last dimension.

    Returns:
        torch.uint8 tensor (..., K // 2).
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_fp4(data: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_fp4`: bytes (..., K // 2) to codes (..., K), torch.uint8.

    Args:
        data: torch.uint8 tensor of packed FP4 pairs.

    Returns:
        torch.uint8 tensor of codes 0..15, last dimension doubled.
    """
    d = data.to(torch.uint8)
    return torch.stack((d & 0xF, d >> 4), dim=-1).reshape(*d.shape[:-1], 2 * d.shape[-1])


_NARROW_FLOATS = (torch.bfloat16, torch.float16) + tuple(
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n)
)


def _float32_round_to_odd(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd: truncate toward zero, then set the significand's last
    bit if anything was dropped. NaN stays NaN; magnitudes the float32 cast overflows to inf
    stay inf (every narrower format overflows there too); subnormal results are kept."""
    r = x.to(torch.float32)  # RNE; r == x exactly iff x is a float32
    back = r.to(torch.float64)
    inexact = (back != x) & torch.isfinite(r)
    away = inexact & (back.abs() > x.abs())  # RNE rounded up in magnitude: step back one ulp
    bits = r.view(torch.int32)  # sign-magnitude: bits - 1 is the next magnitude toward zero
    bits = (bits - away.to(torch.int32)) | inexact.to(torch.int32)
    return bits.view(torch.float32)


def round_float64(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values to `dtype` exactly once (round to nearest, ties to even).

    torch's float64 -> bfloat16/float16 cast converts to float32 first and rounds twice, which
    is one ulp off whenever the float32 value lands on a midpoint of the narrower format (e.g.
    1.01171875 - 2^-24 -> 1.01171875, a bfloat16 midpoint, -> 1.015625, where 1.0078125 is
    nearest). Here the
    float64 -> float32 step rounds to odd instead: a value that is not a float32 becomes an odd
    float32 strictly between the same two float32 neighbours, so it lies strictly on the same
    side of every midpoint of a format with at most 22 significand bits, and the ordinary RNE
    cast from float32 then rounds as if from x itself. This needs float32's quantum to be at
    least 4x finer than the target's everywhere in the target's range, which holds for
    bfloat16 (subnormal quantum 2^-133 vs 2^-149), float16 and torch's 8-bit floats. Signs,
    signed zeros, subnormal results and overflow to +-inf come out as a single rounding gives.

    Args:
        x: a torch.float64 tensor (any device).
        dtype: the result dtype: float64 (x itself), float32 (one RNE cast), bfloat16, float16
            or a float8 dtype (torch's cast from float32 applied to the round-to-odd float32).

    Returns:
        A tensor of `dtype` and x's shape and device.

    Raises:
        TypeError: x is not float64, or dtype is not a supported floating dtype.
    """
    if x.dtype != torch.float64:
        raise TypeError(f"round_float64 expects a float64 tensor, got {x.dtype}")
    if dtype == torch.float64:
        return x
    if dtype == torch.float32:
        return x.to(torch.float32)  # float64 -> float32 is a single RNE cast
    if dtype not in _NARROW_FLOATS:
        raise TypeError(f"round_float64: dtype must be float64, float32, bfloat16, float16 or "
                        f"a float8 dtype, got {dtype}")
    return _float32_round_to_odd(x).to(dtype)
