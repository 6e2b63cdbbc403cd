# SPDX-License-Identifier: MIT
"""W4A16 NVFP4 GEMM for Hopper at large M: register-A wgmma over persistent output tiles.

D (M, N) = A (M, K) @ deq(B)^T with B NVFP4 weights, computed as D^T = W X^T: each tile is 128
weight rows (the wgmma M side, two consumer warpgroups of 64) by Nb activation rows (wgmma N,
a multiple of 16 from 64 to 256: `NBS`), and the weights never exist as bf16 outside registers.
Pipeline (`templates/lcf`):
  producer warp: per 128-K stage, TMA loads of the tile's 128 weight rows (64 packed bytes
    each, plain rows), the band's two scale atoms (1 KiB) and Nb activation rows (128 bf16,
    128-byte swizzle, already in the decode's K order), into a LOAD_PIPE_DEPTH ring;
  consumer warpgroups: wait for the stage; wait until the previous stage's MMAs are done (one A
    register set); decode their 64 weight rows' 16 bytes per row and thread straight into the
    A operand registers (`nvfp4_register_a_sm90.decode`: exact e2m1 * ue4m3 * 2^-8 in bf16); issue 8
    wgmma m64 n Nb k16 (A from registers, B the activation tile); the template commits and frees
    the stage once the next stage is issued; per tile, scale by 2^8 * gB (W4A4 on decoded
    activations: 2^8 * gA * gB) and store D^T's elements into D (rows past M skipped).
While one warpgroup decodes, the other's MMAs keep the tensor cores busy (narrow tiles: two
A register sets, so a warpgroup's decode also overlaps its own previous MMAs).
Schedule: whole tiles per persistent CTA, or stream-K (`Config.STREAM_K`, `templates/stream_k.py`):
equal runs of (tile x stage) units per CTA, a tile split between CTAs handed from each later
part (`store_partial`: fp32 accumulators to that CTA's slot of `partials`, then its flag) to
its head (`add_partial`, in CTA order), which finishes it; where the tiles are fewer than the
SMs, on a grid the host picks (`schedule.stream_k_grid`: 64 tiles split in two on 128 CTAs).
Activations: `nvfp4_register_a_sm90._permute_kernel` writes them once per call in the decode's K
order (`layouts.register_a.act_column`, period 128: a permutation of K applied to both operands
leaves every sum unchanged). W4A4: that pass decodes the NVFP4 activations exactly
(`Config.a_format` "nvfp4", `call_w4a4`); the GEMM is W4A16's.
Output: bf16 / fp16 / fp32, or NVFP4 (out_dtype "nvfp4", the fused epilogue `_finish_nvfp4`):
per 16 D columns of a D row (16 accumulator rows of one warp, one column) the block amax by
three lane shuffles, the block scale and codes by the recipe's one op (`ops.nvfp4.block_scale`,
the quantizer's), with D's given decode scale, so the bytes equal quantizing the fp32 output;
code pairs meet by one shuffle; scale bytes land at `nvfp4_scales.band_offset`; a saturated
block scale (the given scale too small) ORs a device flag.
Constraints (checked): N % 8 == 0 (N % 128 != 0 with `Config.N_TAIL`: the last weight band is
partial, its codes past N zero-filled and D's columns past N not stored), K % 16 == 0 (K % 128
!= 0 with `Config.K_TAIL`: the last stage is partial, zero-filled past K); any M >= 1 (the
permute pass writes zero rows up to whole tiles, `padded_rows`). Rows of codes (the weights',
an NVFP4 D's) are `nvfp4_codes.row_pitch` bytes apart, as NVFP4Tensor keeps them.
Weights' scale format (`Config.sf`): UE4M3, or UE5M3 (decode shift 16, `ops.nvfp4.decode_shift`;
GPU-tested). An NVFP4 D always has UE4M3 scales.
Peer: CUTLASS's Hopper mixed-input GEMM (`examples/55_hopper_mixed_dtype_gemm`), which
converts a narrow B in registers the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from tk_cute.arch import target
from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
from tk_cute.layouts import nvfp4_codes, nvfp4_scales
from tk_cute.ops import memory, register, tma, warp, warpgroup
from tk_cute.ops import nvfp4 as fp4
from tk_cute.launcher import Signature, i32, ptr
from tk_cute.templates import stream_k
from tk_cute.templates.lcf import LCF, WholeTiles
from tk_cute.templates.stream_k import StreamK
from tk_cute.types import coord, gl, rt, st
from tk_cute.types.gl import row_major
from tk_cute.types.struct import DeviceStruct, config_repr

STAGE_K = rs.SUB_K  # K per stage: one register-A batch (8 wgmma k16 steps)
ROWS = 128  # weight rows per tile: one scale band, two 64-row consumer warpgroups
# Activation rows per tile (wgmma N): a multiple of 16 from 64 to 256 (odd multiples of 8 do not
# build: the DSL aborts on their swizzled activation tile; below 64 rows the register-A
# kernel's split over K serves better)
NBS = tuple(range(64, 257, 16))
OUT_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16,
             "float32": cutlass.Float32, "nvfp4": cutlass.Uint8}  # nvfp4: D's packed codes
SMEM_BUDGET = target("sm_90a").smem_bytes


@dataclass(frozen=True)
class Config:
    """Nb: activation rows per tile (wgmma N: `NBS`); LOAD_PIPE_DEPTH: ring stages (0: as
    many as fit); SUPERGROUP_SIZE: tile rows per supergroup (L2 reuse of the activations);
    A_SETS: A operand register sets the consumers alternate between stages (2: a stage's decode
    overlaps the previous stage's MMAs of the same warpgroup; 1: each decode waits for them)."""

    Nb: int = 256
    LOAD_PIPE_DEPTH: int = 0
    SUPERGROUP_SIZE: int = 8
    A_SETS: int = 1
    out_dtype: str = "bfloat16"
    sf: str = field(default="ue4m3", metadata={"quiet": True})  # the weights' scale format
    # "nvfp4" (W4A4): x is the activations' codes, decoded in the permute pass
    # (`nvfp4_register_a_sm90._decode_permute_kernel`, scales in the format `sf` too);
    # "bf16" (W4A16)
    a_format: str = field(default="bf16", metadata={"quiet": True})
    # K % STAGE_K != 0: the last stage is partial (codes, scale atoms and activations past K
    # arrive as zeros)
    K_TAIL: bool = field(default=False, metadata={"quiet": True})
    # N % ROWS != 0: the last weight band is partial (its codes past N arrive as zeros, D's
    # columns past N are not stored); not with the NVFP4 epilogue (whole 128-column bands)
    N_TAIL: bool = field(default=False, metadata={"quiet": True})
    # The GEMM launched as a programmatic dependent of the permute pass before it (`LCF.PDL`):
    # its launch and prologue overlap the pass's tail
    PDL: bool = field(default=True, metadata={"quiet": True})
    # Stream-K (the kernel's `StreamK` schedule): equal shares of the (tile x stage) units on
    # the launch's `ctas` CTAs, a tile split between CTAs summed through fp32 partials
    # (`partial_bytes`)
    STREAM_K: bool = False
    # Stream-K partials as 16-byte vectors (`StreamK.partial_v4`; the dispatch sets it with TEAMS:
    # `tuning.sm90.TILED_TEAMS_MIN`)
    PARTIAL_V4: bool = field(default=False, metadata={"quiet": True})
    # Stream-K teams (`StreamK.teams`, grid `schedule.stream_k_team_grid`): every tile in
    # 2-8 equal shares that end together, each finishing some warps' rows with the others'
    # sums of them, so no head adds every part and writes the whole tile (the dispatch's from
    # three parts per tile: `tuning.sm90.TILED_TEAMS_MIN`)
    TEAMS: bool = field(default=False, metadata={"quiet": True})
    __repr__ = config_repr

    def __post_init__(self):
        if self.Nb not in NBS:
            raise ValueError(f"Nb must be a multiple of 16 from 64 to 256 (wgmma N), got "
                             f"{self.Nb}")
        if self.out_dtype not in OUT_TYPES:
            raise ValueError(f"out_dtype must be one of {list(OUT_TYPES)}, got "
                             f"{self.out_dtype!r}")
        if self.A_SETS not in (1, 2):
            raise ValueError(f"A_SETS must be 1 or 2, got {self.A_SETS}")
        if self.sf not in fp4.DECODE_FORMATS:
            raise ValueError(f"sf must be one of {fp4.DECODE_FORMATS}, got {self.sf!r}")
        if self.a_format not in rs.A_FORMATS:
            raise ValueError(f"a_format must be one of {rs.A_FORMATS}, got {self.a_format!r}")
        if self.N_TAIL and self.out_dtype == "nvfp4":
            raise ValueError(f"the NVFP4 epilogue writes whole {ROWS}-column bands: N_TAIL "
                             f"(N % {ROWS} != 0) takes bf16 / fp16 / fp32 output only")
        if self.TEAMS and not self.STREAM_K:
            raise ValueError("TEAMS splits stream-K tiles between CTAs: it needs STREAM_K=True")
        if self.LOAD_PIPE_DEPTH == 1 or self.LOAD_PIPE_DEPTH < 0:
            raise ValueError(f"LOAD_PIPE_DEPTH must be 0 (auto) or >= 2, got "
                             f"{self.LOAD_PIPE_DEPTH}")


def supports(M: int, N: int, K: int) -> bool:
    """Whether some Config takes the shape (`Config.K_TAIL` where K % STAGE_K != 0,
    `Config.N_TAIL` where N % ROWS != 0; `tk_cute.tuning.sm90` picks them)."""
    return M >= 1 and N >= rs.N_ALIGN and N % rs.N_ALIGN == 0 and K % rs.K_ALIGN == 0


def check_shape(M: int, N: int, K: int, cfg: Config | None = None) -> None:
    """Raise ValueError naming the constraint (M, N, K) or cfg breaks."""
    if M < 1:
        raise ValueError(f"the tiled register-A kernel needs M >= 1, got M={M}")
    if N < rs.N_ALIGN or N % rs.N_ALIGN:
        raise ValueError(f"the tiled register-A kernel needs N % {rs.N_ALIGN} == 0 (16-byte rows "
                         f"of D), got N={N}")
    if K % rs.K_ALIGN:
        raise ValueError(f"the tiled register-A kernel needs K % {rs.K_ALIGN} == 0 (the scale "
                         f"block), got K={K}")
    if cfg is not None and K % STAGE_K and not cfg.K_TAIL:
        raise ValueError(f"K={K} is not a multiple of {STAGE_K}: the Config needs K_TAIL=True")
    if cfg is not None and N % ROWS and not cfg.N_TAIL:
        raise ValueError(f"N={N} is not a multiple of {ROWS}: the Config needs N_TAIL=True")


class GemmNvfp4RegisterATiledSm90(LCF):
    """See the module docstring."""

    PRODUCER_REGISTERS = 40
    CONSUMER_REGISTERS = 232

    def __init__(self, config: Config = Config()):
        self.config = config
        self.Mb, self.Nb, self.SUPERGROUP_SIZE = ROWS, config.Nb, config.SUPERGROUP_SIZE
        self.PDL = config.PDL
        self.sched = (StreamK(partial_v4=config.PARTIAL_V4, teams=config.TEAMS)
                      if config.STREAM_K else WholeTiles())
        self.w_tile = st(cutlass.Int8, ROWS, STAGE_K // 2, swizzle=False)
        self.sf_tile = st(cutlass.Int8, 2 * (STAGE_K // nvfp4_scales.ATOM_K), 256, swizzle=False)
        self.x_tile = st(cutlass.BFloat16, config.Nb, STAGE_K)
        self.fit_ring(config.LOAD_PIPE_DEPTH, SMEM_BUDGET)

    # --- globals ----------------------------------------------------------------------------
    def inputs(self):
        return {"w": self.w_tile, "sf": self.sf_tile, "x": self.x_tile}

    def prefetch(self, g):
        for d in (g.W, g.SF, g.X):
            d.prefetch()

    def k_steps(self, g):
        return g.X.num_tiles(1)

    # --- producer ---------------------------------------------------------------------------
    def load(self, g, inputs, at, k, barrier, mcast):
        """TMA: stage k of weight band at.r (codes, its two scale atoms) and activation block
        at.c (multicast to the cluster's other weight band)."""
        tma.load_async(inputs["w"], g.W, coord(at.r, k, 0), barrier)
        half_atoms = g.K // (2 * nvfp4_scales.ATOM_K)  # 1 KiB scale tiles per band
        tma.load_async(inputs["sf"], g.SF,
                       rs.scale_coord(self.config.K_TAIL, at.r, k, half_atoms), barrier)
        tma.load_async(inputs["x"], g.X, coord(at.c, k, 0), barrier, mcast["b"])

    # --- consumers --------------------------------------------------------------------------
    def setup(self, g, thread, smem):
        wg_thread = thread % warpgroup.WARPGROUP_THREADS
        mma = warpgroup.tiled_mma(cutlass.BFloat16, self.Nb)
        acc = rt.accumulator(mma, wg_thread, 64, self.Nb)
        register.zero(acc)
        lane = wg_thread % 32
        rows = (thread // warpgroup.WARPGROUP_THREADS) * 64  # this warpgroup's weight rows
        warp_rows = rows + (wg_thread // 32) * 16  # this warp's 16 accumulator rows
        r_lo = warp_rows + lane // 4  # accumulator rows g, g + 8
        scale = rs.output_scale(g.gs, self.config.sf)
        a_sets = [rt.operand_A(mma, wg_thread, 64, STAGE_K) for _ in range(self.config.A_SETS)]
        return Consumer(acc, a_sets, rows, warp_rows, r_lo, lane, scale)

    @cute.jit
    def compute(self, g, s, inputs, k):
        if cutlass.const_expr(self.config.A_SETS == 1):
            warpgroup.mma_async_wait(0)  # the previous stage's MMAs have read the A registers
            self._decode_mma(s, s.a[0], inputs)
        else:  # the template waited for stage k - 2's MMAs: set k % 2 is free
            if k % 2 == 0:
                self._decode_mma(s, s.a[0], inputs)
            else:
                self._decode_mma(s, s.a[1], inputs)

    def _decode_mma(self, s, a, inputs):
        w_base = inputs["w"].iterator.toint()
        t = s.lane % 4
        rs.decode(a, lambda r: w_base + r * (STAGE_K // 2) + 16 * t,
                  inputs["sf"].iterator.toint(), s.r_lo, t, 0, self.config.sf)
        warpgroup.mma_fence()
        warpgroup.mma_ABt(s.acc, a, inputs["x"])

    @cute.jit
    def finish(self, g, s, at, smem, thread):
        """D[m, n] = scale * acc[n, m] for the tile's activation rows m < M."""
        if cutlass.const_expr(self.config.out_dtype == "nvfp4"):
            self._finish_nvfp4(g, s, at)
        else:
            self._finish_dense(g, s, at)
        register.zero(s.acc)

    @cute.jit
    def _finish_dense(self, g, s, at):
        n0 = at.r * ROWS + s.rows
        m0 = at.c * self.Nb
        coords = s.acc.coords()
        base = g.out.toint()
        for i in cutlass.range_constexpr(cute.size(s.acc.frag)):
            r, m = coords[i]
            if m0 + m < g.M:
                if cutlass.const_expr(self.config.N_TAIL):
                    if n0 + r < g.N:  # (a partial last band: no column past N)
                        self._store_dense(g, s, base, m0 + m, n0, r, i)
                else:
                    self._store_dense(g, s, base, m0 + m, n0, r, i)

    def _store_dense(self, g, s, base, m, n0, r, i):
        """D[m, n0 + r] = scale * accumulator element i."""
        esize = OUT_TYPES[self.config.out_dtype].width // 8
        addr = base + (cutlass.Int64(m) * cutlass.Int64(g.N) + n0 + r) * esize
        memory.st_cvt(addr, s.acc.frag[i] * s.scale, self.config.out_dtype)

    @cute.jit
    def _finish_nvfp4(self, g, s, at):
        """D as NVFP4 (module docstring). Fragment element v0 + 2 h + 4 j is accumulator row
        g + 8 h, column 2t + v0 + 8 j (wgmma's C layout): rows g and g + 8 of a column are
        elements i and i + 2."""
        s_dec = memory.ld_f32(g.out_gs.toint())
        s_enc_g = fp4.div_rn(Float32(1.0), s_dec)
        n_w = at.r * ROWS + s.warp_rows  # D column of the warp's first accumulator row
        m0 = at.c * self.Nb
        gq = s.lane // 4
        rk = g.N // nvfp4_scales.ATOM_K  # scale atoms per 128-row band of D's scales
        pitch = cutlass.Int64(nvfp4_codes.row_pitch(g.N))  # bytes per row of D's codes
        coords = s.acc.coords()
        saturated = cutlass.Uint32(0)
        for j in cutlass.range_constexpr(self.Nb // 8):
            for v0 in cutlass.range_constexpr(2):
                i = v0 + 4 * j
                m = m0 + coords[i][1]
                lo, hi = s.acc.frag[i] * s.scale, s.acc.frag[i + 2] * s.scale
                amax = fp4.abs_max((lo, hi))
                for lanes in (4, 8, 16):  # the 8 lanes of this column's 16 rows
                    amax = fp4.max_f32(amax, fp4.from_bits(warp.shuffle_xor(fp4.bits(amax),
                                                                           lanes)))
                sf, s_enc, sat = fp4.block_scale(amax, s_dec, s_enc_g)
                codes = [fp4.e2m1_encode(fp4.mul_rn(v, s_enc), "sm_90a") for v in (lo, hi)]
                pair = [cute.arch.shuffle_sync_down(c, offset=4) for c in codes]  # row g + 1
                if m < g.M:
                    saturated = saturated | sat
                    if gq % 2 == 0:
                        row = g.out.toint() + cutlass.Int64(m) * pitch
                        for h in cutlass.range_constexpr(2):
                            memory.st_u8_pred(row + nvfp4_out_byte(n_w, gq, h),
                                              codes[h] | (pair[h] << 4), cutlass.Uint32(1))
                    if gq == 0:
                        memory.st_u8_pred(g.out_sf.toint() + cutlass.Int64(
                            nvfp4_scales.band_offset(m, n_w // nvfp4_scales.SF_VEC, rk)), sf,
                            cutlass.Uint32(1))
        warp.flag_if_any(g.flag, saturated, s.lane)

    def finish_tail(self):
        pass  # plain stores: nothing outstanding

    def accumulator(self, s):
        return s.acc

    # --- host -------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, sms: cutlass.Constexpr, w: cute.Pointer, wsf: cute.Pointer,
                 x: cute.Pointer, xp: cute.Pointer, gs: cute.Pointer, out: cute.Pointer,
                 out_sf: cute.Pointer, out_gs: cute.Pointer, flag: cute.Pointer,
                 partials: cute.Pointer, flags: cute.Pointer, M: cutlass.Int32,
                 N: cutlass.Int32, K: cutlass.Int32, ctas: cutlass.Int32, stream):
        rs.launch_permute(x, xp, M, K, stream, use_pdl=False, k_tail=self.config.K_TAIL,
                          rows=self.rows(M))
        self._gemm(sms, w, wsf, xp, gs, out, out_sf, out_gs, flag, partials, flags, M, N, K,
                   ctas, stream)

    @cute.jit
    def call_w4a4(self, sms: cutlass.Constexpr, w: cute.Pointer, wsf: cute.Pointer,
                  x: cute.Pointer, xsf: cute.Pointer, gsa: cute.Pointer, xp: cute.Pointer,
                  gs: cute.Pointer, out: cute.Pointer, out_sf: cute.Pointer,
                  out_gs: cute.Pointer, flag: cute.Pointer, partials: cute.Pointer,
                  flags: cute.Pointer, M: cutlass.Int32, N: cutlass.Int32, K: cutlass.Int32,
                  ctas: cutlass.Int32, stream):
        """W4A4: the activations' decode pass (it writes D's scale gA * gB * 2^8 after them),
        then the W4A16 GEMM, which reads them once that pass has ended."""
        rs.launch_decode_permute(self.config.sf, x, xsf, gsa, gs, xp, M, K, stream,
                                 self.config.K_TAIL, self.rows(M))
        scale = rs.decoded_scale(xp, self.rows(M), rs.permuted_width(K, self.config.K_TAIL))
        self._gemm(sms, w, wsf, xp, scale, out, out_sf, out_gs, flag, partials, flags, M, N,
                   K, ctas, stream)

    def rows(self, M):
        """Rows of the permuted activations: M rounded up to whole tiles (`padded_rows`)."""
        return padded_rows(self.config, M)

    def _gemm(self, sms, w, wsf, xp, gs, out, out_sf, out_gs, flag, partials, flags, M, N, K,
              ctas, stream):
        wt, sft = rs.weight_tensors(w, wsf, N, K, self.config.K_TAIL, self.config.N_TAIL)
        # the copy's zero rows past M complete the last row of tiles (TMA boxes in bounds)
        xt = row_major(xp, self.rows(M), rs.permuted_width(K, self.config.K_TAIL))
        g = Globals(gl.load(wt, self.w_tile), gl.load(sft, self.sf_tile),
                    gl.load(xt, self.x_tile), gs, out, out_sf, out_gs, flag,
                    partials, flags, M, N, K)
        bands = rs.blocks(N, ROWS, self.config.N_TAIL)
        self.launch(g, bands, cute.ceil_div(M, self.Nb), 1, sms, stream, ctas)


def kernel_for(cfg: Config) -> GemmNvfp4RegisterATiledSm90:
    """The kernel `cfg` runs on (its schedule, whole tiles or `StreamK`, from `cfg.STREAM_K`)."""
    return GemmNvfp4RegisterATiledSm90(cfg)


def partial_bytes(cfg: Config) -> int:
    """Bytes of one stream-K partial slot: a tile's fp32 accumulators (ROWS x Nb)."""
    return stream_k.partial_bytes(ROWS, cfg.Nb)


def tiles(M: int, N: int, cfg: Config) -> int:
    """Output tiles of the grid: ceil(N / ROWS) weight bands x ceil(M / Nb) activation tiles."""
    return rs.blocks(N, ROWS, True) * -(-M // cfg.Nb)


def padded_rows(cfg: Config, M):
    """Rows of the permuted activation copy the tiled kernel reads: M rounded up to a multiple
    of Nb, the rows past M zeros (the permute passes' `rows`; plain integer arithmetic: the
    host allocates the copy with it)."""
    return (M + cfg.Nb - 1) // cfg.Nb * cfg.Nb


def nvfp4_out_byte(n_w, gq, h):
    """Byte of a D row that lane group gq (even) writes for accumulator row g + 8 h: the codes
    of D columns n_w + gq + 8 h (low nibble) and the next column (high, from lane + 4)."""
    return (n_w + gq + 8 * h) // 2


class Consumer:
    """A consumer thread's state: accumulator, A register sets, its warpgroup's and warp's
    first accumulator rows, its decode rows (r_lo, + 8), its lane and D's scale."""

    def __init__(self, acc, a, rows, warp_rows, r_lo, lane, scale):
        self.acc, self.a, self.rows, self.warp_rows = acc, a, rows, warp_rows
        self.r_lo, self.lane, self.scale = r_lo, lane, scale


class Globals(DeviceStruct):
    _fields = ("W", "SF", "X", "gs", "out", "out_sf", "out_gs", "flag", "partials", "flags",
               "M", "N", "K")

    def __init__(self, W, SF, X, gs, out, out_sf, out_gs, flag, partials, flags, M, N, K):
        self.W, self.SF, self.X, self.gs, self.out = W, SF, X, gs, out
        self.out_sf, self.out_gs, self.flag = out_sf, out_gs, flag
        self.partials, self.flags = partials, flags
        self.M, self.N, self.K = M, N, K


def signature(cfg: Config) -> Signature:
    """The launch's runtime arguments: weights (codes, blocked scales), activations (W4A4: their
    codes, blocked scales and decode scale gA) and their permuted copy (`padded_rows` x
    `permuted_width` bf16; W4A4: + 16 bytes), the accumulator's scale (gB, or gA * gB for
    bf16 activations decoded elsewhere), D (for NVFP4: its codes, blocked scales, given decode
    scale and the saturation flag; other outputs ignore those three), stream-K's workspace
    (`partial_bytes` per CTA of fp32 partial sums, one int32 flag per CTA, zero: the kernel
    leaves them zero; without `Config.STREAM_K` any address), the shape, and stream-K's grid
    (`ctas`, `schedule.stream_k_grid`; ignored without it)."""
    w = (ptr("w", cutlass.Uint8), ptr("wsf", cutlass.Uint8))
    if cfg.a_format == "nvfp4":
        x = (ptr("x", cutlass.Uint8, 4), ptr("xsf", cutlass.Uint8, 1),
             ptr("gsa", cutlass.Float32, 4))
    else:
        x = (ptr("x", cutlass.BFloat16),)
    return Signature(*w, *x, ptr("xp", cutlass.BFloat16), ptr("gs", cutlass.Float32, 4),
                     ptr("out", OUT_TYPES[cfg.out_dtype], 4), ptr("out_sf", cutlass.Uint8, 4),
                     ptr("out_gs", cutlass.Float32, 4), ptr("flag", cutlass.Int32, 4),
                     ptr("partials", cutlass.Float32), ptr("flags", cutlass.Int32, 4),
                     i32("M"), i32("N"), i32("K"), i32("ctas"))


def launch_fn(cfg: Config):
    """The `@cute.jit` launch `signature(cfg)` describes (constexpr argument: the SM count)."""
    kernel = kernel_for(cfg)
    return kernel.call_w4a4 if cfg.a_format == "nvfp4" else kernel


def compile_launcher(cfg: Config, sms: int, options: str = ""):
    """The kernel for cfg on a GPU of `sms` SMs as a raw-pointer `Launcher` (`options`: e.g.
    "--gpu-arch sm_90a" to build without a GPU)."""
    return signature(cfg).compile(launch_fn(cfg), sms, options=options)
