# SPDX-License-Identifier: MIT
"""NVFP4 GEMM on Hopper by exact emulation (large M): D = gA * gB * (A @ B^T), bf16 out.

Hopper has no FP4 tensor cores, but every e2m1 * ue4m3 product is exact in bf16, so expanding
the operands to bf16 in shared memory and running bf16 wgmma with fp32 accumulation computes the
same sums as FP4 tensor cores. Pipeline (the Hopper GEMM's `lcf` pipeline with one more step):
the producer TMA-loads packed FP4 tiles (Uint8, (Mb, 32) and (Nb, 32) per 64 K) and their scale
atoms (512 B per 128 rows) into the ring (W4A16: A arrives as bf16 directly); the two consumer
warpgroups decode stage k into one of DEQUANT_BUFFERS bf16 tile pairs (`group.decode_nvfp4`,
~2 integer/bf16x2 ops per element), fence, meet on a named barrier, and issue the wgmmas, which
run on the tensor cores while the ALUs decode stage k + 1. Three bf16 buffers let one barrier per
stage suffice: the buffer decoded at k + 1 was last read by the MMAs of k - 2, complete in both
warpgroups before the barrier of k. The epilogue multiplies by gA * gB (read on the device).
Constraints: K % 64 == 0, M % 128 == 0, N % 256 == 0 (checked by `check_shapes`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch

from tk_cute.kernels.gemm import gemm_sm90
from tk_cute.runtime import KernelCache, as_cute, batched, stream
from tk_cute.ops import group, register, tma, warpgroup
from tk_cute.types import coord, gl, rt, st
from tk_cute.types.struct import DeviceStruct

FORMATS = ("nvfp4", "bf16")  # the A operand: W4A4 or W4A16 (B is always NVFP4)


@dataclass(frozen=True)
class Config:
    """W4A4 (a_format="nvfp4") or W4A16 (a_format="bf16"); tiles as the Hopper GEMM, Kb = 64."""

    a_format: str = "nvfp4"
    out_dtype: str = "bfloat16"
    Nb: int = 256
    LOAD_PIPE_DEPTH: int = 0  # 0: as many as fit beside the bf16 buffers
    DEQUANT_BUFFERS: int = 3
    EPI_PIPE_DEPTH: int = 4
    SUPERGROUP_SIZE: int = 8
    arch: str = "sm_90a"

    def __post_init__(self):
        if self.a_format not in FORMATS:
            raise ValueError(f"a_format must be one of {FORMATS}, got {self.a_format!r}")
        if self.DEQUANT_BUFFERS < 3:
            raise ValueError("DEQUANT_BUFFERS must be >= 3: one barrier per stage protects a "
                             f"buffer only two stages back (got {self.DEQUANT_BUFFERS})")


class GemmNvfp4Sm90(gemm_sm90.GemmSm90):
    """See the module docstring. Reuses the Hopper GEMM's tiles, MMA and epilogue."""

    def __init__(self, config: Config = Config()):
        self.nvfp4 = config
        self.w4a4 = config.a_format == "nvfp4"
        super().__init__(gemm_sm90.Config(
            dtype="bfloat16", out_dtype=config.out_dtype, Nb=config.Nb, Kb=group.K_PER_ATOM,
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
        if self.w4a4:
            return {"a": self.fp4_tile(self.Mb), "sfa": self.scale_tile(self.Mb), **b}
        return {"a": self.a_tile, **b}

    def scratch_tiles(self):
        n = self.nvfp4.DEQUANT_BUFFERS
        return {"a16": (self.a_tile, n), "b16": (self.b_tile, n)} if self.w4a4 else {
            "b16": (self.b_tile, n)}

    def prefetch(self, g):
        for d in (g.A, g.SFA, g.B, g.SFB, g.C) if self.w4a4 else (g.A, g.B, g.SFB, g.C):
            d.prefetch()

    # --- producer ---------------------------------------------------------------------------
    @cute.jit
    def load(self, g, inputs, at, k, barrier, mcast):
        atoms_k = self.k_steps(g)  # scale atoms per 128-row band along K
        tma.load_async(inputs["a"], g.A, coord(at.r, k, at.b), barrier)
        tma.load_async(inputs["b"], g.B, coord(at.c, k, at.b), barrier)
        if cutlass.const_expr(self.w4a4):
            tma.load_async(inputs["sfa"], g.SFA, coord(at.r * atoms_k + k, 0), barrier)
        bands = self.Nb // 128
        for band in cutlass.range_constexpr(bands):
            dst = cute.local_tile(inputs["sfb"], (2, 256), (band, 0))
            tma.load_async(dst, g.SFB, coord((at.c * bands + band) * atoms_k + k, 0), barrier)

    # --- consumers --------------------------------------------------------------------------
    def setup(self, g, thread, smem):
        state = Consumer(super().setup(g, thread, smem), smem, thread, g.alpha[0])
        return state

    @cute.jit
    def compute(self, g, s, inputs, k):
        buf = k % self.nvfp4.DEQUANT_BUFFERS
        threads = self.NUM_CONSUMERS * warpgroup.WARPGROUP_THREADS
        b16 = s.smem["b16"][None, None, buf]
        group.decode_nvfp4(b16, inputs["b"], inputs["sfb"], s.thread, threads)
        a16 = inputs["a"]
        if cutlass.const_expr(self.w4a4):
            a16 = s.smem["a16"][None, None, buf]
            group.decode_nvfp4(a16, inputs["a"], inputs["sfa"], s.thread, threads)
        cute.arch.fence_proxy("async.shared", space="cta")  # generic writes -> wgmma reads
        warpgroup.sync(2, self.NUM_CONSUMERS)()
        warpgroup.mma_ABt(s.acc, a16, b16)

    def finish(self, g, s, at, smem, thread):
        register.mul(s.acc, s.acc, s.alpha)
        super().finish(g, s.acc, at, smem, thread)

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


class Consumer:
    """A consumer thread's state: accumulator, its shared buffers, index, global scale."""

    def __init__(self, acc: rt, smem, thread, alpha):
        self.acc, self.smem, self.thread, self.alpha = acc, smem, thread, alpha


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


# --- torch entry -------------------------------------------------------------------------------
_CACHE = KernelCache()


@functools.cache
def _kernel(config: Config, device):
    return GemmNvfp4Sm90(config), torch.cuda.get_device_properties(device).multi_processor_count


def supports(M: int, N: int, K: int, config: Config = Config()) -> bool:
    """Whether `gemm` takes this shape (else `tk_cute.nvfp4.gemm` uses another path)."""
    return M % 128 == 0 and N % config.Nb == 0 and K % group.K_PER_ATOM == 0


def gemm(a, b, out_dtype=torch.bfloat16, out=None):
    """D (M, N) = a @ b^T on Hopper: a an NVFP4Tensor (W4A4) or a bf16 (M, K) tensor (W4A16),
    b an NVFP4Tensor (N, K); the operands validated by `tk_cute.nvfp4.gemm`. `out`: an optional
    contiguous (M, N) tensor of out_dtype to write into."""
    w4a4 = not isinstance(a, torch.Tensor)
    config = Config(a_format="nvfp4" if w4a4 else "bf16",
                    out_dtype=str(out_dtype).removeprefix("torch."))
    kernel, sms = _kernel(config, b.data.device)
    (M, K), N = a.shape[-2:], b.shape[-2]
    check_shapes(M, N, K, kernel)
    c = torch.empty(M, N, dtype=out_dtype, device=b.data.device) if out is None else out
    if c.shape != (M, N) or c.dtype != out_dtype or not c.is_contiguous():
        raise ValueError(f"out must be a contiguous ({M}, {N}) {out_dtype} tensor, got "
                         f"{tuple(c.shape)} {c.dtype}")
    alpha = (a.global_scale * b.global_scale if w4a4 else b.global_scale).reshape(1)
    a_view = a.data if w4a4 else a
    sfa = (a if w4a4 else b).scales.view(-1, 256)  # W4A16 reads no A scales
    args = [as_cute(batched(t), leading_dim=1)
            for t in (a_view, sfa, b.data, b.scales.view(-1, 256), c)]
    args.append(as_cute(alpha, leading_dim=0, align=4))
    fn = _CACHE.get((config, sms), lambda: cute.compile(kernel, *args, sms, stream()))
    fn(*args, stream())
    return c
