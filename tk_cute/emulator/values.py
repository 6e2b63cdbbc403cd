# SPDX-License-Identifier: MIT
"""PTX types as numpy dtypes, and the conversions whose rounding the ISA fixes.

Registers hold raw bits (`.b32` -> uint32, `.b64` -> uint64, `.pred` -> bool); an instruction
reads them as its own type (`view`). bf16 has no numpy type: its values are uint16 bits,
converted here with round-to-nearest-even. The FP8 / FP4 encoders pick the nearest value of
the format's code table, ties to the even code, and saturate to the
largest finite value (`.satfinite`): the ISA's `cvt.rn.satfinite.{e4m3x2,e2m1x2}.f32`.
"""

from __future__ import annotations

import numpy as np
import torch

from tk_cute.nvfp4 import format as F

DTYPES = {
    "s8": np.int8, "s16": np.int16, "s32": np.int32, "s64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "b8": np.uint8, "b16": np.uint16, "b32": np.uint32, "b64": np.uint64,
    "f16": np.float16, "f32": np.float32, "f64": np.float64, "pred": np.bool_,
    "bf16": np.uint16, "f16x2": np.uint32, "bf16x2": np.uint32, "f32x2": np.uint64,
    "e4m3x2": np.uint16, "e5m2x2": np.uint16, "e2m1x2": np.uint8, "b128": np.uint64,
    "tf32": np.uint32,
}
TYPES = frozenset(DTYPES)


def dtype(t: str):
    return DTYPES[t]


def signed(t: str) -> bool:
    return t[0] == "s"


def is_float(t: str) -> bool:
    return t in ("f16", "f32", "f64", "bf16")


def bits(t: str) -> int:
    return {"b128": 128}.get(t, np.dtype(DTYPES[t]).itemsize * 8)


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN)."""
    u = np.asarray(x, np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, np.float32))
    return np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


# Code tables and round-to-nearest-even encoders of the NVFP4 formats: tk_cute.nvfp4.format is
# their one home (bit-exact, saturating: the ISA's `.satfinite`).
E4M3 = np.array(F.E4M3_VALUES, np.float64)  # 256 bytes, NaN at 0x7F / 0xFF
E2M1 = np.array(F.E2M1_VALUES, np.float64)  # 16 codes, bit 3 the sign
UE5M3 = np.array(F.UE5M3_VALUES, np.float64)  # 256 bytes, NaN at 0xFF


def _torch(fn, x):
    return fn(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy().astype(np.uint32)


def e4m3_encode(x):
    return _torch(F.e4m3_encode_rne, x)


def e4m3_decode(codes):
    return E4M3[np.asarray(codes, np.int64) & 0xFF]


def e2m1_encode(x):
    return _torch(F.e2m1_encode_rne, x)


def e2m1_decode(codes):
    return E2M1[np.asarray(codes, np.int64) & 0xF]


def e5m2_decode(codes):
    return (np.asarray(codes).astype(np.uint16) << np.uint16(8)).view(np.float16).astype(
        np.float64)
