# SPDX-License-Identifier: MIT
"""NVFP4 quantizer: bf16/fp16/fp32 (L, M, K) -> packed E2M1, blocked UE4M3 scales, fp32 scale.

Three kernels: `amax` then `quantize`, or `quantize_one_launch` for small inputs; bit-exact with
``tk_cute.nvfp4.quantize_reference`` (its docstring is the contract):

* `amax` (skipped when a global scale is given): grid-stride 16-byte loads, |bits| max (integer
  max keeps NaN/Inf above every finite value), warp ``redux.sync``, a shared-memory CTA max, and
  ONE plain store per CTA into `partials` (no atomics, so no zeroed workspace and no memset).
* `quantize`: one CTA per 128-row x 512-byte tile, or `row_split` CTAs each taking a part of
  its rows (one row segment per warp load: lane i reads bytes 16i..16i+16, so every load and
  store of a warp is contiguous). A 16-element block spans
  2 lanes (4 for fp32); its amax is one butterfly shuffle. Each lane encodes its 8 (4) elements
  into one 4 (2)-byte store; the block's first lane stores the UE4M3 byte. Rows past M and
  blocks past K/16 load zeros, so padding scale bytes come out 0; atoms past the scale tensor
  are not written. Rows of codes are `nvfp4_codes.row_pitch(K)` bytes apart; their padding
  (K % 32 != 0) is stored as zero codes. Loads run one batch of rows ahead of the arithmetic
  (register double buffer).
  Every CTA reduces the amax partials itself (a warp reads them, L2-resident) and CTA 0 writes
  the decode scale, NaN-propagating, so a non-finite input gives a non-finite global scale (the
  host's finite check). With a given scale a warp vote ORs a non-finite flag (checked path only).
  Tiles run last to first: the tail of x that the amax pass left in L2 is read first.
* `quantize_one_launch` (computed scale, small inputs: a launch costs the host more than the
  kernel runs): one cluster of up to `MAX_CLUSTER` CTAs. Each CTA takes its share of x's 16-byte
  pieces for the amax and leaves its warps' maxima in shared memory; after a cluster barrier
  every warp reads all of them (``mapa`` + ``ld.shared::cluster``), so no workspace, no atomics
  and no second launch. Then one warp per 512-byte row segment of the rows < M (the same
  per-row code as `quantize`, segments spread over every warp of the cluster: a decode row of
  K = 8192 is 32 warps' work, not 32 CTAs'), and the padding rows of the last row tile get zero
  scale words. A CTA leaves only after the cluster's final wait (its peers read its maxima).
Peers: CUTLASS ``cute/ampere/kernel/elementwise`` (copy structure), TK ``nvfp4_b200/quantize``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from tk_cute.layouts import nvfp4_codes, nvfp4_scales
from tk_cute.layouts.nvfp4_scales import ATOM_BYTES, ATOM_K, ATOM_ROWS, ATOM_SF_COLS, SF_VEC
from tk_cute.ops import cluster, memory
from tk_cute.ops.warp import flag_if_any
from tk_cute.ops import nvfp4 as fp4
from tk_cute.launcher import Signature, i32, i64, ptr

SEG_BYTES = 512  # a warp's 16-byte-per-lane load: the tile's row segment
MAX_CLUSTER = 8  # CTAs of the one-launch quantizer's cluster (the portable cluster size)
DTYPES = {"bf16": 2, "f16": 2, "f32": 4}  # element bytes


@dataclass(frozen=True)
class Config:
    """dtype: "bf16" | "f16" | "f32"; given_scale: skip amax, read the decode scale;
    check_finite: with a given scale, OR a non-finite flag (the amax path needs none);
    warps: quantize CTA = 32 x warps threads (128 / (warps x row_split) rows each);
    row_split: quantize CTAs per 128-row tile and row segment, each taking 128 / row_split
    rows (more CTAs where the tiles are few: a small M);
    rows_in_flight: rows whose 16-byte loads a lane issues per batch (two batches live);
    reverse: quantize tiles last to first (L2 reuse after the amax pass);
    min_ctas_per_sm: quantize occupancy asked of ptxas (caps registers; 0: no cap);
    amax_threads / amax_ctas_per_sm / amax_unroll: the amax grid (one partial per CTA);
    arch: compile target (native FP4 cvt on sm_100a+);
    pdl: the quantize pass after the amax pass as a dependent launch (PDL): its first rows
    load while the amax pass runs, and it waits for the partials only to read them;
    one_launch: the computed-scale quantizer as ONE launch of one cluster (`_quantize_one_launch`:
    the amax through distributed shared memory, `rows_in_flight` row segments per warp in
    flight, `amax_unroll` pieces per thread and step; its CTAs are `warps` warps)."""

    dtype: str = "bf16"
    given_scale: bool = False
    check_finite: bool = False
    arch: str = "sm_90a"
    warps: int = 8
    row_split: int = 1
    rows_in_flight: int = 2
    reverse: bool = True
    min_ctas_per_sm: int = 4
    amax_threads: int = 1024
    amax_ctas_per_sm: int = 1
    amax_unroll: int = 4
    pdl: bool = True
    one_launch: bool = False

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"warps must be a power of two <= 32, got {self.warps}")
        if self.row_split not in (1, 2, 4, 8, 16) or self.warps * self.row_split > ATOM_ROWS:
            raise ValueError(f"row_split must be a power of two <= 16 with warps x row_split "
                             f"<= {ATOM_ROWS}, got {self.row_split} (warps {self.warps})")
        rows = self.rows_per_warp
        if self.rows_in_flight < 1 or rows % self.rows_in_flight:
            raise ValueError(f"rows_in_flight must divide {rows} (rows per warp), "
                             f"got {self.rows_in_flight}")
        if self.amax_threads % 32 or not 32 <= self.amax_threads <= 1024:
            raise ValueError(f"amax_threads must be a multiple of 32 in [32, 1024], "
                             f"got {self.amax_threads}")
        if not 1 <= self.amax_unroll <= 16 or self.amax_ctas_per_sm < 1:
            raise ValueError("amax_unroll must be in [1, 16] and amax_ctas_per_sm >= 1")
        if self.one_launch and self.given_scale:
            raise ValueError("one_launch computes the global scale: given_scale must be False")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def amax_part(self) -> Config:
        """The fields the amax pass reads: one compiled amax kernel whatever the quantize
        pass's CTAs."""
        return Config(dtype=self.dtype, arch=self.arch, amax_threads=self.amax_threads,
                      amax_ctas_per_sm=self.amax_ctas_per_sm, amax_unroll=self.amax_unroll,
                      pdl=self.pdl)

    @property
    def rows_per_warp(self) -> int:
        """Rows of a quantize CTA's 128-row tile share per warp."""
        return ATOM_ROWS // (self.warps * self.row_split)

    @property
    def esize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def cols(self) -> int:
        """Tile width in elements (one 512-byte row segment)."""
        return SEG_BYTES // self.esize

    @property
    def flag(self) -> bool:
        return self.given_scale and self.check_finite


def _lane(cfg, kt, lane, K):
    """A lane's place in row segment `kt` (16 bytes of its 512): its first column, whether that
    is inside K, its scale atom column and byte (kb % 4), whether it stores its block's scale
    byte (the block's first lane, atoms inside the scale tensor), and the atoms per row."""
    kb_tile = lane // cfg.esize  # lanes per 16-element block: esize
    col = kt * cfg.cols + lane * (16 // cfg.esize)
    n_atoms_k = (K // SF_VEC + ATOM_SF_COLS - 1) // ATOM_SF_COLS
    a_g = kt * (cfg.cols // ATOM_K) + kb_tile // ATOM_SF_COLS
    sf_ok = Uint32(lane % cfg.esize == 0) & Uint32(a_g < n_atoms_k)
    return col, Uint32(col < K), a_g, kb_tile % ATOM_SF_COLS, sf_ok, n_atoms_k


def _load_row(cfg, x_base, grow, row_ok, col, col_ok, K, sf_addr, sf_ok):
    """Lane's 16 bytes of row `grow` (of all L * M rows; zeros unless row_ok and inside K),
    whether to store its codes (row_ok, columns inside the row pitch: the padding past K gets
    zero codes) and where (rows `nvfp4_codes.row_pitch(K)` bytes apart), and its block's scale
    byte address and store predicate."""
    elem = grow * Int64(K) + Int64(col)
    pitch = nvfp4_codes.row_pitch(K)
    store = row_ok & Uint32(col < 2 * pitch)
    dst = grow * Int64(pitch) + Int64(col // 2)
    return (memory.ld_v4_pred(x_base + elem * cfg.esize, row_ok & col_ok), store, dst,
            sf_addr, sf_ok)


def _load_segment(cfg, u, units, ntk, ntm, lane, M, K, x_base, sf_base):
    """`_load_row` of row segment u = (row of all L * M, kt) (none past `units`), with its
    scale byte's address in the blocked scales at `sf_base`."""
    ok = Uint32(u < units)
    u = cutlass.min(u, units - 1)
    kt, grow = u % ntk, u // ntk
    row = grow % M
    col, col_ok, a_g, kb, sf_ok, n_atoms_k = _lane(cfg, kt, lane, K)
    tile = (grow // M) * ntm + row // ATOM_ROWS
    sf = (sf_base + (Int64(tile) * n_atoms_k + a_g) * ATOM_BYTES + kb
          + Int64(nvfp4_scales.atom_offset(row % ATOM_ROWS, 0)))
    return _load_row(cfg, x_base, Int64(grow), ok, col, col_ok, K, sf, sf_ok & ok)


def _quantize_row(cfg, item, s_dec_g, s_enc_g, d_base):
    """Block scale (shared by the block's lanes), E2M1 codes and stores of one loaded row;
    returns the block's amax bits (>= 0x7F800000: NaN/Inf)."""
    words, valid, dst, sf_addr, sf_ok = item
    q, sf, m = fp4.quantize_lane(words, cfg.dtype, s_dec_g, s_enc_g, cfg.arch)
    if cfg.dtype == "f32":
        memory.st_u16_pred(d_base + dst, q, valid)
    else:
        memory.st_u32_pred(d_base + dst, q, valid)
    memory.st_u8_pred(sf_addr, sf, sf_ok)
    return m


@cute.jit
def _lane_amax(cfg: cutlass.Constexpr, base: Int64, n_vec: Int64, first: Int64, stride: Int64,
               threads: cutlass.Constexpr) -> Uint32:
    """|x| maximum bits over the 16-byte pieces first, first + threads, ... (`amax_unroll` of
    them per step of `stride`) of x's `n_vec`."""
    iters = (n_vec - first + stride - 1) // stride
    m = Uint32(0)
    for it in cutlass.range(Int32(iters)):
        for u in cutlass.range_constexpr(cfg.amax_unroll):
            v = first + Int64(it) * stride + u * threads
            words = memory.ld_v4_pred(base + v * 16, Uint32(v < n_vec))
            m = Uint32(cutlass.max(m, fp4.abs_max_bits(words, cfg.dtype)))
    return m


def _warp_maxima(nw):
    """Shared memory for one maximum per warp (`nw` words)."""
    return cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(nw),
                                                         byte_alignment=16)


@cute.kernel
def _amax_kernel(cfg: cutlass.Constexpr, x: cute.Pointer, partials: cute.Pointer,
                 n_vec: Int64):
    if cutlass.const_expr(cfg.pdl):
        cluster.pdl_launch_dependents()  # the quantize pass may start loading its rows
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    per_cta = cfg.amax_threads * cfg.amax_unroll
    m = _lane_amax(cfg, x.toint(), n_vec, Int64(bidx) * per_cta + Int64(tidx),
                   Int64(gdim) * per_cta, cfg.amax_threads)
    nw = cfg.amax_threads // 32
    warp, lane = tidx // 32, tidx % 32
    buf = _warp_maxima(nw)
    m = cute.arch.warp_redux_sync(m, "umax")
    if lane == 0:
        buf[warp] = Int32(m)
    cute.arch.barrier()
    if warp == 0:
        v = cute.arch.warp_redux_sync(Uint32(buf[lane % nw]), "umax")  # max is idempotent
        if lane == 0:
            memory.st_u32(partials.toint() + Int64(bidx) * 4, v)


@cute.kernel
def _quantize_kernel(cfg: cutlass.Constexpr, x: cute.Pointer, data: cute.Pointer,
                     scales: cute.Pointer, partials: cute.Pointer, gs_in: cute.Pointer,
                     gs_out: cute.Pointer, flag: cute.Pointer, M: Int32, K: Int32,
                     n_partials: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, bz = cute.arch.block_idx()
    ntk, nty, nl = cute.arch.grid_dim()
    kt, ty, l = bx, by, bz
    if cutlass.const_expr(cfg.reverse):
        kt, ty, l = ntk - 1 - bx, nty - 1 - by, nl - 1 - bz
    ntm, mt = nty // cfg.row_split, ty // cfg.row_split
    first = (ty % cfg.row_split) * (ATOM_ROWS // cfg.row_split)  # this CTA's first tile row
    warp, lane = tidx // 32, tidx % 32
    col, col_ok, a_g, kb, sf_ok, n_atoms_k = _lane(cfg, kt, lane, K)
    sf_base = scales.toint() + ((Int64(l) * ntm + mt) * n_atoms_k + a_g) * ATOM_BYTES + kb
    x_base, d_base = x.toint(), data.toint()

    def load(i):  # tile row first + warp + warps * i
        r_local = first + warp + cfg.warps * i
        row = mt * ATOM_ROWS + r_local
        return _load_row(cfg, x_base, Int64(l) * Int64(M) + Int64(row), Uint32(row < M), col,
                         col_ok, K, sf_base + Int64(nvfp4_scales.atom_offset(r_local, 0)), sf_ok)

    nb = cfg.rows_per_warp // cfg.rows_in_flight
    cur = [load(i) for i in range(cfg.rows_in_flight)]  # comprehensions stay Python (unrolled)

    # global scales (recipe steps 2-3), while the first batch is in flight
    if cutlass.const_expr(cfg.given_scale):
        s_dec_g = memory.ld_f32(gs_in.toint())
    else:
        if cutlass.const_expr(cfg.pdl):
            cluster.pdl_wait()  # (launched early: the amax partials are complete from here)
        p_base = partials.toint()
        am = Uint32(0)
        for j in cutlass.range((n_partials + 31) // 32):
            idx = j * 32 + lane
            am = Uint32(cutlass.max(am, memory.ld_u32_pred(p_base + Int64(idx) * 4,
                                                        Uint32(idx < n_partials))))
        s_dec_g = fp4.global_decode_scale(cute.arch.warp_redux_sync(am, "umax"))
    s_enc_g = fp4.div_rn(Float32(1.0), s_dec_g)
    if (bx + by + bz + tidx) == 0:
        memory.st_u32(gs_out.toint(), fp4.bits(s_dec_g))

    bad = Uint32(0)
    for b in cutlass.range_constexpr(nb):
        nxt = []
        if cutlass.const_expr(b + 1 < nb):
            nxt = [load((b + 1) * cfg.rows_in_flight + i) for i in range(cfg.rows_in_flight)]
        for i, item in enumerate(cur):
            # (the row is the warp's: a uniform branch) rows past M only zero their scale
            # bytes: the math of a padding row is the latency of a small call (H100, 1x8192
            # bf16 given a scale: 9.5 us with 15 of a warp's 16 rows computed on zeros)
            if mt * ATOM_ROWS + first + warp + cfg.warps * (b * cfg.rows_in_flight + i) < M:
                m = _quantize_row(cfg, item, s_dec_g, s_enc_g, d_base)
                if cutlass.const_expr(cfg.flag):
                    bad = bad | Uint32(m >= 0x7F800000)
            else:
                memory.st_u8_pred(item[3], Uint32(0), item[4])
        cur = nxt

    if cutlass.const_expr(cfg.flag):
        flag_if_any(flag, bad, lane)


@cute.kernel
def _quantize_one_launch_kernel(cfg: cutlass.Constexpr, x: cute.Pointer, data: cute.Pointer,
                                scales: cute.Pointer, gs_out: cute.Pointer, M: Int32, K: Int32,
                                L: Int32):
    """One cluster (the grid) of C CTAs: the amax of x shared through distributed shared
    memory, then one warp per 512-byte row segment (`rows_in_flight` segments per warp in
    flight) and the padding rows' scale bytes zeroed."""
    tidx, _, _ = cute.arch.thread_idx()
    rank, _, _ = cute.arch.block_idx()
    C, _, _ = cute.arch.grid_dim()
    warp, lane = tidx // 32, tidx % 32
    nw = cfg.warps
    x_base, d_base, sf_base = x.toint(), data.toint(), scales.toint()
    # 1. the amax: this CTA's share of x's 16-byte pieces, its warps' maxima in shared memory,
    #    and every warp reads all C x nw of them across the cluster
    n_vec = Int64(L) * Int64(M) * Int64(K) * cfg.esize // 16
    per_cta = cfg.threads * cfg.amax_unroll
    m = _lane_amax(cfg, x_base, n_vec, Int64(rank) * per_cta + Int64(tidx), Int64(C) * per_cta,
                   cfg.threads)
    buf = _warp_maxima(nw)
    m = cute.arch.warp_redux_sync(m, "umax")
    if lane == 0:
        buf[warp] = Int32(m)
    cluster.cluster_sync()  # (release / acquire: every CTA's maxima are written)
    am = Uint32(0)
    for j in cutlass.range((C * nw + 31) // 32):
        idx = j * 32 + lane
        if idx < C * nw:
            am = Uint32(cutlass.max(am, cluster.ld_shared_remote_u32(
                Int32(buf.iterator.toint()) + (idx % nw) * 4, idx // nw)))
    cute.arch.cluster_arrive()  # this CTA's remote reads are done (its peers may then exit)
    s_dec_g = fp4.global_decode_scale(cute.arch.warp_redux_sync(am, "umax"))
    s_enc_g = fp4.div_rn(Float32(1.0), s_dec_g)
    if (rank + tidx) == 0:
        memory.st_u32(gs_out.toint(), fp4.bits(s_dec_g))

    # 2. the row segments u = (row of L * M, kt), warp by warp across the cluster
    ntk = (K + cfg.cols - 1) // cfg.cols
    ntm = (M + ATOM_ROWS - 1) // ATOM_ROWS
    units = L * M * ntk
    warps = C * nw
    first = rank * nw + warp

    batch = warps * cfg.rows_in_flight
    for b in cutlass.range((units - first + batch - 1) // batch):
        items = [_load_segment(cfg, first + b * batch + i * warps, units, ntk, ntm, lane, M, K,
                               x_base, sf_base) for i in range(cfg.rows_in_flight)]
        for i in cutlass.range_constexpr(cfg.rows_in_flight):
            if first + b * batch + i * warps < units:  # (past the end: clamped, no math)
                _quantize_row(cfg, items[i], s_dec_g, s_enc_g, d_base)

    # 3. the last row tile's padding rows (M % 128 != 0): zero scale words, bytes no row
    #    segment stores (no ordering needed). An atom's 16 bytes at k * 16 hold rows k,
    #    k + 32, k + 64, k + 96: one 16-byte store where all four are padding (k >= r0), else
    #    a word per padding row (was: a word and two divisions per row, 16,256 at 1x8192)
    n_atoms_k = (K // SF_VEC + ATOM_SF_COLS - 1) // ATOM_SF_COLS
    r0 = M - (ntm - 1) * ATOM_ROWS
    n_chunks = Int32(r0 < ATOM_ROWS) * L * n_atoms_k * 32
    for j in cutlass.range(rank * cfg.threads + tidx, n_chunks, C * cfg.threads):
        atom, k = j // 32, j % 32
        tile = (atom // n_atoms_k) * ntm + ntm - 1
        chunk = sf_base + (Int64(tile) * n_atoms_k + atom % n_atoms_k) * ATOM_BYTES + k * 16
        if k >= r0:
            memory.st_v4_u32(chunk, [Uint32(0)] * 4)
        else:
            for g in cutlass.range_constexpr(1, 4):
                if k + 32 * g >= r0:
                    memory.st_u32(chunk + 4 * g, Uint32(0))
    cute.arch.cluster_wait()


@cute.jit
def _amax(cfg: cutlass.Constexpr, x: cute.Pointer, partials: cute.Pointer, n_vec: Int64,
          grid: Int32, stream):
    _amax_kernel(cfg, x, partials, n_vec).launch(grid=[grid, 1, 1],
                                                 block=[cfg.amax_threads, 1, 1], stream=stream)


@cute.jit
def _quantize(cfg: cutlass.Constexpr, x: cute.Pointer, data: cute.Pointer,
              scales: cute.Pointer, partials: cute.Pointer, gs_in: cute.Pointer,
              gs_out: cute.Pointer, flag: cute.Pointer, M: Int32, K: Int32, L: Int32,
              n_partials: Int32, stream):
    ntm = (M + ATOM_ROWS - 1) // ATOM_ROWS
    ntk = (K + cfg.cols - 1) // cfg.cols
    _quantize_kernel(cfg, x, data, scales, partials, gs_in, gs_out, flag, M, K,
                     n_partials).launch(grid=[ntk, ntm * cfg.row_split, L],
                                        block=[cfg.threads, 1, 1], stream=stream,
                                        use_pdl=cfg.pdl and not cfg.given_scale,
                                        min_blocks_per_mp=cfg.min_ctas_per_sm,
                                        preferred_smem_carveout=0)  # no smem: all L1


@cute.jit
def _quantize_one_launch(cfg: cutlass.Constexpr, x: cute.Pointer, data: cute.Pointer,
                         scales: cute.Pointer, gs_out: cute.Pointer, M: Int32, K: Int32,
                         L: Int32, ctas: Int32, stream):
    _quantize_one_launch_kernel(cfg, x, data, scales, gs_out, M, K, L).launch(
        grid=[ctas, 1, 1], block=[cfg.threads, 1, 1], cluster=[ctas, 1, 1], stream=stream)


# ---------------------------------------------------------------- host: signatures
# Torch entry: `tk_cute.nvfp4.launch.quantize` (plans per shape, launches through these).

_ELEM = {"bf16": cutlass.BFloat16, "f16": cutlass.Float16, "f32": cutlass.Float32}


def amax_signature(cfg: Config) -> Signature:
    """`_amax`'s runtime arguments: x, one uint32 |x| maximum per CTA, x's 16-byte pieces,
    the grid."""
    return Signature(ptr("x", _ELEM[cfg.dtype]), ptr("partials", cutlass.Int32, 4),
                     i64("n_vec"), i32("grid"))


def quantize_signature(cfg: Config) -> Signature:
    """`_quantize`'s runtime arguments: x, the outputs (codes, blocked scales), the amax
    partials, the given decode scale (gs_in) or where to write the computed one (gs_out), the
    non-finite flag (given scale, checked), the shape and the number of partials."""
    return Signature(ptr("x", _ELEM[cfg.dtype]), ptr("data", cutlass.Uint8),
                     ptr("scales", cutlass.Uint8), ptr("partials", cutlass.Int32, 4),
                     ptr("gs_in", cutlass.Float32, 4), ptr("gs_out", cutlass.Float32, 4),
                     ptr("flag", cutlass.Int32, 4), i32("M"), i32("K"), i32("L"),
                     i32("n_partials"))


def one_launch_signature(cfg: Config) -> Signature:
    """`_quantize_one_launch`'s runtime arguments: x, the outputs (codes, blocked scales, the
    decode scale), the shape and the cluster's CTAs (the grid: 1 to `MAX_CLUSTER`)."""
    return Signature(ptr("x", _ELEM[cfg.dtype]), ptr("data", cutlass.Uint8),
                     ptr("scales", cutlass.Uint8), ptr("gs_out", cutlass.Float32, 4),
                     i32("M"), i32("K"), i32("L"), i32("ctas"))


def compile_amax(cfg: Config, options: str = ""):
    return amax_signature(cfg).compile(_amax, cfg, options=options)


def compile_quantize(cfg: Config, options: str = ""):
    return quantize_signature(cfg).compile(_quantize, cfg, options=options)


def compile_one_launch(cfg: Config, options: str = ""):
    return one_launch_signature(cfg).compile(_quantize_one_launch, cfg, options=options)
