# SPDX-License-Identifier: MIT
"""NVFP4 GEMM on Hopper by exact emulation (large M): D = gA * gB * (A @ B^T), bf16 out.

Hopper has no FP4 tensor cores, but every e2m1 * ue4m3 product is exact in bf16, so expanding
the operands to bf16 in shared memory and running bf16 wgmma with fp32 accumulation computes the
same sums as FP4 tensor cores. Pipeline (`templates/ltcf.py`): the loader TMA-loads packed FP4
tiles (Uint8, (Mb, 32) and (Nb, 32) per 64 K) and their scale atoms (512 B per 128 rows) into
the raw ring (W4A16: A arrives as bf16, straight into the compute ring); the transform
warpgroup decodes each stage into a bf16 (Mb, 64) / (Nb, 64) pair of the compute ring
(`group.decode_nvfp4`); the two consumer warpgroups run the Hopper GEMM's SS wgmma on it and its
epilogue, times gA * gB (read on the device). Decoding in its own warpgroup lets it overlap the
MMAs: inside the consumers (which hold 128 accumulator registers each) it serialised with them.
Constraints: K % 64 == 0, M % 128 == 0, N % 256 == 0 (checked by `check_shapes`).
The dispatch no longer picks it (`tk_cute.nvfp4.heuristics`: every shape it takes, the
register-A kernels take too, and were faster where both ran); `gemm(..., path="fused")` runs it
for comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from tk_cute.kernels.gemm import gemm_sm90
from tk_cute.layouts import nvfp4_scales
from tk_cute.ops import group, tma, warpgroup
from tk_cute.templates.ltcf import LTCF
from tk_cute.types import coord, gl, st
from tk_cute.types.struct import DeviceStruct

FORMATS = ("nvfp4", "bf16")  # the A operand: W4A4 or W4A16 (B is always NVFP4)


@dataclass(frozen=True)
class Config:
    """W4A4 (a_format="nvfp4") or W4A16 (a_format="bf16"); tiles as the Hopper GEMM, Kb = 64."""

    a_format: str = "nvfp4"
    out_dtype: str = "bfloat16"
    Nb: int = 256
    LOAD_PIPE_DEPTH: int = 0  # raw (FP4) stages; 0: as many as fit beside the bf16 stages
    COMPUTE_PIPE_DEPTH: int = 3  # decoded bf16 stages
    TRANSFORM_SHARE: float = 0.5  # of each stage's decode, done by the producer's 3 spare warps
    EPI_PIPE_DEPTH: int = 4
    SUPERGROUP_SIZE: int = 8
    arch: str = "sm_90a"

    def __post_init__(self):
        if self.a_format not in FORMATS:
            raise ValueError(f"a_format must be one of {FORMATS}, got {self.a_format!r}")
        if self.COMPUTE_PIPE_DEPTH < 2:
            raise ValueError("COMPUTE_PIPE_DEPTH must be >= 2: the consumers keep one stage's "
                             f"MMAs in flight while the next is decoded (got "
                             f"{self.COMPUTE_PIPE_DEPTH})")


class GemmNvfp4Sm90(LTCF, gemm_sm90.GemmScaledSm90):
    """See the module docstring. Reuses the Hopper GEMM's tiles, MMA and epilogue."""

    def __init__(self, config: Config = Config()):
        self.nvfp4 = config
        self.w4a4 = config.a_format == "nvfp4"
        self.COMPUTE_PIPE_DEPTH = config.COMPUTE_PIPE_DEPTH
        self.TRANSFORM_SHARE = config.TRANSFORM_SHARE
        super().__init__(gemm_sm90.Config(
            dtype="bfloat16", out_dtype=config.out_dtype, Nb=config.Nb, Kb=nvfp4_scales.ATOM_K,
            LOAD_PIPE_DEPTH=config.LOAD_PIPE_DEPTH, EPI_PIPE_DEPTH=config.EPI_PIPE_DEPTH,
            SUPERGROUP_SIZE=config.SUPERGROUP_SIZE, arch=config.arch))

    # --- globals ----------------------------------------------------------------------------
    def fp4_tile(self, rows):
        return st(cutlass.Uint8, rows, self.Kb // 2, swizzle=False)

    def scale_tile(self, rows):
        """Scale atoms of `rows` rows, as TMA boxes of (2, 256) bytes per 512-byte atom."""
        return st(cutlass.Uint8, 2 * (rows // 128), 256, swizzle=False)

    def inputs(self):
        b = {"b": self.fp4_tile(self.Nb), "sfb": self.scale_tile(self.Nb)}
        return {"a": self.fp4_tile(self.Mb), "sfa": self.scale_tile(self.Mb), **b} if (
            self.w4a4) else b

    def compute_tiles(self):
        return {"a16": self.a_tile, "b16": self.b_tile}

    def direct_inputs(self):
        return {} if self.w4a4 else {"a16": self.a_tile}

    def prefetch(self, g):
        for d in (g.A, g.SFA, g.B, g.SFB, g.C) if self.w4a4 else (g.A, g.B, g.SFB, g.C):
            d.prefetch()

    # --- loader -----------------------------------------------------------------------------
    @cute.jit
    def load(self, g, raw, slot, at, k, barrier, full):
        atoms_k = self.k_steps(g)  # scale atoms per 128-row band along K
        if cutlass.const_expr(self.w4a4):
            tma.load_async(raw["a"], g.A, coord(at.r, k, at.b), barrier)
            tma.load_async(raw["sfa"], g.SFA, coord(at.r * atoms_k + k, 0), barrier)
        else:
            tma.load_async(slot["a16"], g.A, coord(at.r, k, at.b), full)
        tma.load_async(raw["b"], g.B, coord(at.c, k, at.b), barrier)
        bands = self.Nb // 128
        for band in cutlass.range_constexpr(bands):
            dst = cute.local_tile(raw["sfb"], (2, 256), (band, 0))
            tma.load_async(dst, g.SFB, coord((at.c * bands + band) * atoms_k + k, 0), barrier)

    # --- transform --------------------------------------------------------------------------
    @cute.jit
    def transform(self, g, raw, slot, thread, threads: cutlass.Constexpr, share):
        group.decode_nvfp4(slot["b16"], raw["b"], raw["sfb"], thread, threads, share)
        if cutlass.const_expr(self.w4a4):
            group.decode_nvfp4(slot["a16"], raw["a"], raw["sfa"], thread, threads, share)

    # --- consumers (setup and finish: GemmScaledSm90's, times gA * gB) ---------------------
    def compute(self, g, s, slot, k):
        warpgroup.mma_ABt(s.acc, slot["a16"], slot["b16"])

    # --- host -------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a, sfa, b, sfb, c, alpha, max_ctas: cutlass.Constexpr, stream):
        """a (M, K/2, L) bytes or (M, K, L) bf16; b (N, K/2, L) bytes; sfa/sfb the blocked
        scales viewed as (atoms * 2, 256, 1) bytes; c (M, N, L); alpha a 1-element fp32 tensor
        holding gA * gB (W4A16: gB)."""
        a_tile = self.fp4_tile(self.Mb) if self.w4a4 else self.a_tile
        g = Globals(gl.load(a, a_tile), gl.load(sfa, self.scale_tile(128)),
                    gl.load(b, self.fp4_tile(self.Nb)), gl.load(sfb, self.scale_tile(128)),
                    gl.store(c, self.c_tile), alpha)
        self.launch(g, cute.ceil_div(c.shape[0], self.Mb), cute.ceil_div(c.shape[1], self.Nb),
                    c.shape[2], max_ctas, stream)


class Globals(DeviceStruct):
    _fields = ("A", "SFA", "B", "SFB", "C", "alpha")

    def __init__(self, A, SFA, B, SFB, C, alpha):
        self.A, self.SFA, self.B, self.SFB, self.C, self.alpha = A, SFA, B, SFB, C, alpha


def check_shapes(M: int, N: int, K: int, kernel: GemmNvfp4Sm90):
    """Raise ValueError naming the first of M, N, K that is not a multiple of its tile."""
    for name, size, tile in (("M", M, kernel.Mb), ("N", N, kernel.Nb), ("K", K, kernel.Kb)):
        if size % tile:
            raise ValueError(f"{name}={size} must be a multiple of {tile} for the Hopper NVFP4 "
                             "GEMM")


def supports(M: int, N: int, K: int, config: Config = Config()) -> bool:
    """Whether this kernel takes the shape (a forced path: `tk_cute.nvfp4.heuristics`)."""
    return M % 128 == 0 and N % config.Nb == 0 and K % nvfp4_scales.ATOM_K == 0
