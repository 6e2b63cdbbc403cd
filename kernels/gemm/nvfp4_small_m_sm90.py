# SPDX-License-Identifier: MIT
"""Small-M NVFP4 GEMM for Hopper (decode): D (M, N) = A (M, K) @ deq(B)^T, M <= 64, streaming B.

B is NVFP4 weights (N, K); A is bf16 activations (W4A16) or NVFP4 (W4A4). There is no FP4 tensor
core on sm_90a, so each warp computes D^T = W X^T with ``mma.sync m16n8k16`` bf16 (Marlin-style):
the MMA's 16 rows are weight rows, its 8 columns activation rows. A thread (group g = lane/4,
t = lane%4) loads 16 bytes (32 codes) of weight rows g and g+8 per 128-K step with one LDG.128
each and decodes them straight into A fragments with `ops.nvfp4` (3 integer instructions per
pair of codes, no lookup table; the UE4M3 scale folded in with one exact ``mul.bf16x2``:
w = e2m1 * sf * 2^-8). The 16 K-slots of an MMA hold, per thread, 4 of the 8 K elements of one
32-bit word of codes: 32t + 8j + {0..3} or {4..7} (see `k_offset`), or, in the strided pairing
(`Config.strided`: codes i and i + 4 share a word, no byte permute, 2 instructions fewer per 8
codes), {0, 1, 4, 5} or {2, 3, 6, 7}; the activation fragment follows the same permutation
(strided: 4 prmt per 8 bf16 values, shared by the MT tiles; none for NVFP4 activations, decoded
the same way). Products are exact; fp32 accumulation.
Grid N / rows (times CLUSTER, below): a CTA owns `rows` weight rows and has WN x S warps: WN
row groups (MT MMA tiles each) times S K-slices (split-K inside the CTA; the K / k_chunk chunks
split as evenly as the block's slices allow, `k_slice`: a slice has floor or ceil of chunks /
slices). With AHEAD (default at M <= 8) the next trip's
weights are in flight while a trip decodes. W4A4 at M = 1 (XSMEM) first decodes its activation
row into shared memory from its codes and scales, once per CTA instead of in every warp's trips
(one barrier), so trips read ready B fragments with LDS; where a trip reads whole 128-byte
lines of each weight row (2 steps, M <= 8) each weight load also asks L2 for its line
(L2_FETCH). With PDL (the
default configuration's) the kernel launches during the one before it, lets the next one
launch at once and waits for the one before it ahead of its first global read; with EARLY_WEIGHTS
(`gemm_small_m(pdl=True)`) it reads its first weights before that kernel has ended
(activations after). Whatever that kernel wrote is read with coherent loads (`memory.ld_v4`'s
coherent: ptxas moves read-only loads above the wait). At the end each warp puts
its fp32 partial in shared memory and, after one CTA barrier, the CTA sums the S slices in
order (deterministic), applies 2^8 (2^16 for W4A4) * global scales and writes D: no global
workspace, no atomics, no fences. With CLUSTER the grid has CLUSTER CTAs per row block, one
cluster, holding its S x CLUSTER slices in rank order: each CTA sums its S slices in its
shared memory, and after a cluster barrier each sums a CLUSTER-th of the block over the ranks'
sums (`ld.shared::cluster`) in rank order (deterministic); a last cluster barrier keeps each
rank's sums until its peers have read them.
Constraints (checked): M <= 64, K % 64 == 0, N % 32 == 0. K need not be whole trips: the first
K-slice adds the whole 128-K steps past them (`Config.REST`) in one short trip before its trips,
and after them K's last half step (K % 128 == 64: `Config.K_TAIL`) in one more masked step.
Scale format (`Config.sf`): UE4M3 (w = e2m1 * sf * 2^-8), or UE5M3 for both operands (w = e2m1 *
sf * 2^-16, `ops.nvfp4.decode_shift`; GPU-tested).

Limits and where the time goes: docs/nvfp4_hopper.md (small-M kernel); measured constants:
docs/facts.md#small-m-config; what was tried: docs/history.md#small-m-kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from tk_cute.layouts import nvfp4_scales
from tk_cute.ops import cluster, memory, warp
from tk_cute.ops import nvfp4 as fp4
from tk_cute.launcher import Signature, i32, ptr
from tk_cute.types.st import Shared, sv
from tk_cute.types.struct import config_repr

STEP_K = 128  # K elements per warp step: 4 lanes x 32 codes (one LDG.128 per weight row)
TAIL_K = 64  # K's granularity: a last half step (`Config.K_TAIL`; whole scale atoms)
MAX_M = 64
MAX_THREADS = 1024
MAX_PART_BYTES = 64 * 1024  # the CTA's S fp32 partials in shared memory
MAX_XSMEM = 64 * 1024  # staged activations (two CTAs per SM still fit)
QS_GA = MAX_THREADS // 32  # QUANTIZE_A's shared words: one amax per warp, then gA
QS_WORDS = QS_GA + 4
OUT_TYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Config:
    """MT: 16-row MMA tiles per warp; NT: 8-column MMA tiles (M <= 8*NT); WN: warps along N
    (row groups); S: warps along K (K-slices, summed in shared memory at the end); a CTA has
    WN x S warps. UNROLL: 128-K steps per trip (their loads are issued together); AHEAD: the
    next trip's weights load while this one decodes; w4a4: A is NVFP4; REST: 128-K steps past
    the whole trips; K_TAIL: K % 128 == 64."""

    MT: int = 2
    NT: int = 2
    WN: int = 1
    UNROLL: int = 2
    w4a4: bool = False
    out_dtype: str = "bfloat16"
    MIN_CTAS: int = 0  # CTAs per SM ptxas must fit (caps registers); 0: no cap
    S: int = 1
    AHEAD: bool = False
    # Programmatic dependent launch: this kernel may launch during the one before it and lets
    # the next launch at once; nothing is read before the one before has ended, unless
    # EARLY_WEIGHTS (and AHEAD): the first trip's weights are (the caller promised that kernel
    # does not write them).
    PDL: bool = False
    EARLY_WEIGHTS: bool = False
    # > 0 (W4A4): shared memory bytes staging the CTA's activations decoded to bf16 (M = 1).
    # bf16 activations are read from global memory: staged (a cp.async copy and a barrier before
    # the first trip) they ran 0.2-3.2 us slower on six layers at M = 1 (H100 A/B,
    # docs/facts.md#small-m-round; 1x1536x7168 11.6 / 8.4 us).
    XSMEM: int = 0
    # K // 128 steps are not whole trips (K // 128 % UNROLL = REST): the first K-slice runs the
    # REST steps before its trips in one short trip (no second copy of UNROLL's registers), so an
    # odd step count keeps UNROLL = 2 (1x8192x29568: 6-10% faster than UNROLL = 1 on the H200,
    # docs/facts.md#small-m-rest)
    REST: int = 0
    # K ends in half a step (K % 128 == 64): the first K-slice adds those 64 elements in one
    # more step after its trips, its lanes t >= 2 (past K) reading t - 2's bytes and zeroing
    # them.
    K_TAIL: bool = False
    L2_FETCH: int = 0  # 128 / 256: each weight load asks L2 for the whole 128 / 256-byte block
    # W4A4 on bf16 activations: the staged rows (XSMEM) are quantized to NVFP4 in the kernel,
    # bit for bit `tk_cute.nvfp4.quantize(x, check_finite=False)` (the computed global scale:
    # `_quantize_staged`), then decoded as staged W4A4 activations; D's scale uses that gA.
    # One launch where the activations' quantize would be a launch (and a host call) of its own.
    QUANTIZE_A: bool = False
    # CTAs per row block, one cluster (1, 2, 4 or 8): the block's K splits into S x CLUSTER
    # slices, rank r's warps holding slices r S .. r S + S - 1 (`k_slice`); each rank sums its
    # S slices in its shared memory (`_sum_slices`), and after a cluster barrier each sums a
    # CLUSTER-th of the block's outputs over the ranks' sums in rank order (distributed shared
    # memory: `_reduce`) and writes D. For narrow layers, whose N / rows CTAs leave most SMs
    # idle.
    CLUSTER: int = 1
    sf: str = field(default="ue4m3", metadata={"quiet": True})  # scale format of both operands
    __repr__ = config_repr  # (the kernel symbol follows the repr: sf shows once not UE4M3)

    def __post_init__(self):
        if self.MT not in (1, 2, 4) or self.NT not in (1, 2, 4, 8):
            raise ValueError(f"MT must be 1, 2 or 4 and NT 1, 2, 4 or 8, got {self.MT}, {self.NT}")
        if self.WN not in (1, 2, 4, 8, 16) or self.UNROLL not in (1, 2, 4):
            raise ValueError(f"WN must be 1..16 (power of 2) and UNROLL 1, 2 or 4, "
                             f"got {self.WN}, {self.UNROLL}")
        if not 0 <= self.REST < self.UNROLL:
            raise ValueError(f"REST (128-K steps past the whole trips) must be 0 .. UNROLL - 1 "
                             f"= {self.UNROLL - 1}, got REST={self.REST}")
        if not self.fits(self.S):
            raise ValueError(f"S={self.S} K-slices do not fit one CTA: needs S >= 1, WN x S = "
                             f"{self.WN * self.S} <= {MAX_THREADS // 32} warps and S x rows x "
                             f"m_pad = {self.S} x {self.rows} x {self.m_pad} fp32 partials "
                             f"<= {MAX_PART_BYTES} B of shared memory")
        if self.XSMEM and (self.XSMEM % 16 or self.XSMEM > MAX_XSMEM or not self.w4a4):
            raise ValueError(f"XSMEM (staged activations, W4A4 only) must be a multiple of 16 "
                             f"up to {MAX_XSMEM} B, got XSMEM={self.XSMEM}, w4a4={self.w4a4}")
        if self.L2_FETCH not in (0, 128, 256):
            raise ValueError(f"L2_FETCH (L2 prefetch size of the weight loads) must be 0, 128 "
                             f"or 256, got {self.L2_FETCH}")
        if self.out_dtype not in OUT_TYPES:
            raise ValueError(f"out_dtype must be one of {OUT_TYPES}, got {self.out_dtype!r}")
        if self.sf not in fp4.DECODE_FORMATS:
            raise ValueError(f"sf must be one of {fp4.DECODE_FORMATS}, got {self.sf!r}")
        if self.CLUSTER not in cluster.PORTABLE_SIZES:
            raise ValueError(f"CLUSTER must be one of {cluster.PORTABLE_SIZES}, "
                             f"got {self.CLUSTER}")
        if self.QUANTIZE_A and not (self.w4a4 and self.XSMEM and self.sf == "ue4m3"):
            raise ValueError(f"QUANTIZE_A (bf16 activations quantized in the kernel) needs "
                             f"w4a4, staged activations (XSMEM > 0) and UE4M3 scales (what "
                             f"the quantizer writes), got w4a4={self.w4a4}, XSMEM={self.XSMEM}, "
                             f"sf={self.sf!r}")

    @property
    def waits_first(self) -> bool:  # PDL, and nothing read before the kernel before has ended
        return self.PDL and not self.EARLY_WEIGHTS

    @property
    def rows(self) -> int:  # weight rows per CTA
        return 16 * self.MT * self.WN

    @property
    def threads(self) -> int:
        return 32 * self.WN * self.S

    @property
    def slices(self) -> int:  # K-slices of a row block: S per CTA, CLUSTER CTAs
        return self.S * self.CLUSTER

    @property
    def k_chunk(self) -> int:  # K elements per main-loop trip
        return STEP_K * self.UNROLL

    @property
    def m_pad(self) -> int:  # activation rows per partial (MMA columns)
        return 8 * self.NT

    @property
    def decodes_activations(self) -> bool:
        """Whether every trip decodes NVFP4 activations (W4A4 read from global memory; staged,
        XSMEM, they are decoded once into bf16)."""
        return self.w4a4 and not self.XSMEM

    @property
    def strided(self) -> bool:
        """Whether the decode pairs codes (i, i + 4) (`ops.nvfp4.e2m1x8_scaled_shifted_strided`):
        2 instructions fewer per 8 weight codes, 4 prmt more per 8 bf16 activations (once per
        CTA when they are staged, XSMEM), so it pays where a warp's weight words outnumber its
        activation words (MT > NT), and always for NVFP4 activations (decoded the same way, with
        the same saving)."""
        return self.w4a4 or self.MT > self.NT

    @property
    def part_bytes(self) -> int:  # the CTA's S fp32 partials in shared memory
        return self.partials_bytes(self.S)

    def partials_bytes(self, S: int) -> int:
        """Shared memory for the fp32 partials of S K-slices."""
        return 4 * S * self.rows * self.m_pad

    def fits(self, S: int) -> bool:
        """Whether S K-slices fit one CTA of this tiling (warps, shared-memory partials)."""
        return (S >= 1 and 32 * self.WN * S <= MAX_THREADS
                and self.partials_bytes(S) <= MAX_PART_BYTES)


def k_offset(t, u):
    """K offset, within a trip, of the 32 elements thread t (lane % 4) holds in step u: 128u +
    32t, so one LDG.128 covers 64 contiguous bytes of each of 8 weight rows. The activation
    fragments follow the same permutation, so it never changes the sum."""
    return 128 * u + 32 * t


def scale_step(dk):
    """Bytes from the blocked-layout scale of K element k to that of k + dk, for the multiples
    of 64 (whole atoms) that `k_offset` and the trips step by; tested against `band_offset`."""
    return (dk // nvfp4_scales.ATOM_K) * nvfp4_scales.ATOM_BYTES


def xsmem_row_bytes(K):
    """Bytes between staged activation rows: K bf16 plus 16 (rows start on different banks)."""
    return 2 * K + 16


def xsmem_bytes(M: int, K: int) -> int:
    """Shared memory for M staged rows of K bf16 activations (a multiple of 16)."""
    return M * xsmem_row_bytes(K)


def supports(M: int, N: int, K: int) -> bool:
    """Whether some Config of this kernel takes this shape (`tk_cute.tuning.sm90` picks
    it)."""
    return 1 <= M <= MAX_M and K % TAIL_K == 0 and K >= STEP_K and N % 32 == 0


# ---------------------------------------------------------------- index maps
# Plain functions of ints (evaluated on DSL values in the kernel and on Python ints by the host
# model in the tests). mma.sync m16n8k16 fragments, lane = 4 g + t: A row g (regs 0, 2) / g + 8
# (regs 1, 3); B column g; C register i at row g + 8 (i // 2), column 2 t + i % 2. MMA rows are
# weight rows (n), columns activation rows (m).


def weight_row(cfg, wn, lane, mt, h):
    """Weight row (within the CTA's block of cfg.rows) whose codes lane of row group wn loads as
    A-fragment rows g + 8h of MMA tile mt."""
    return wn * (16 * cfg.MT) + 16 * mt + 8 * h + lane // 4


def act_row(nt, lane):
    """Activation row (before clamping to M - 1) whose K elements lane loads as B column g of
    n8 tile nt."""
    return 8 * nt + lane // 4


def acc_coord(cfg, wn, lane, mt, nt, i):
    """(weight row within the CTA, activation row) of acc[(mt * NT + nt) * 4 + i]."""
    return weight_row(cfg, wn, lane, mt, i // 2), 8 * nt + 2 * (lane % 4) + i % 2


def warp_role(cfg, wid):
    """(row group wn, K-slice s) of warp wid: the WN warps of a slice are adjacent (they read
    the same activations, close in time)."""
    return wid % cfg.WN, wid // cfg.WN


def slot_index(cfg, s, n, m):
    """fp32 element index of K-slice s's partial for (weight row n, activation row m) in the
    CTA's shared buffer, [S][rows][m_pad] (m contiguous: one st.v2 / ld.v4 covers adjacent m)."""
    return (s * cfg.rows + n) * cfg.m_pad + m


def k_slice(cfg, s, K):
    """(first K chunk, chunks) of K-slice s of its row block (rank r's warp slice j is s = r S +
    j): the K / k_chunk chunks split as evenly as `cfg.slices` allow (each gets floor or ceil of
    chunks / slices; slices <= chunks, `check_shape`)."""
    chunks = K // cfg.k_chunk
    first = s * chunks // cfg.slices
    return first, (s + 1) * chunks // cfg.slices - first


def reduce_trips(cfg, ranks=None) -> int:
    """Loop trips of a sum over the block: rows x m_pad sums, 4 per thread per trip, on `ranks`
    CTAs (default CLUSTER: the final sum; 1: `_sum_slices`)."""
    return -(-cfg.rows * cfg.m_pad // (4 * cfg.threads * (ranks or cfg.CLUSTER)))


def reduce_coord(cfg, it, tidx, rank=0, ranks=None):
    """(weight row, first of 4 activation rows) that thread tidx of the block's CTA `rank` of
    `ranks` (default CLUSTER) sums in trip it (past the block, m0 >= m_pad); consecutive sums
    go to consecutive ranks, so the ranks share the first columns alike."""
    i = (it * cfg.threads + tidx) * (ranks or cfg.CLUSTER) + rank
    return i % cfg.rows, 4 * (i // cfg.rows)


# ---------------------------------------------------------------- kernel


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, w: cute.Pointer, wsf: cute.Pointer, x: cute.Pointer,
            xsf: cute.Pointer, gsb: cute.Pointer, gsa: cute.Pointer, out: cute.Pointer, M: Int32,
            N: Int32, K: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    rb, rank = bid // cfg.CLUSTER, bid % cfg.CLUSTER  # (row block, rank in its cluster)
    wn, s = warp_role(cfg, tidx // 32)
    lane = tidx % 32
    ks = rank * cfg.S + s  # the warp's K-slice of the row block
    first, trips = k_slice(cfg, ks, K)
    k_begin = Int64(first) * cfg.k_chunk  # this warp's K slice
    n_blk = rb * cfg.rows  # first weight row of this CTA
    w_rows, sf_rows = _weight_rows(cfg, w, wsf, wn, lane, n_blk, K, k_begin)
    if cutlass.const_expr(cfg.XSMEM > 0):
        # The CTA's activations (M rows, all of K) go to shared memory once, without registers;
        # every trip then reads its fragments with short-latency LDS instead of L2 loads.
        # (Staged after the first weight loads are issued, and after the PDL wait.)
        xs = Shared().alloc(sv(Uint32, cfg.XSMEM // 4)).iterator.toint()
        x_rows, xsf_rows = _staged_activation_rows(cfg, xs, lane, M, K, k_begin)
    else:
        xs = None
        x_rows, xsf_rows = _activation_rows(cfg, x, xsf, lane, M, K, k_begin)
    # QUANTIZE_A: the warps' amax words and the computed gA (`_quantize_staged`)
    qs = Shared().alloc(sv(Int32, QS_WORDS)) if cutlass.const_expr(cfg.QUANTIZE_A) else None

    acc = cute.make_rmem_tensor((cfg.MT * cfg.NT * 4,), Float32)
    for i in cutlass.range_constexpr(cfg.MT * cfg.NT * 4):
        acc[i] = Float32(0.0)
    if cutlass.const_expr(cfg.PDL):
        # Let the next kernel launch now: its CTAs start as ours exit. With EARLY_WEIGHTS and
        # AHEAD our first weights are loaded before the kernel before us has ended (the caller
        # promised it does not write them), activations only after; otherwise nothing is read
        # before the wait (an L2 prefetch of the first trip before it made M = 16 slower on
        # the H200).
        cluster.pdl_launch_dependents()
        if cutlass.const_expr(cfg.waits_first):
            cluster.pdl_wait()
    if cutlass.const_expr(cfg.AHEAD):
        # The weights of trip i + 1 are in flight while trip i decodes: HBM latency hides
        # behind decode instead of alternating with it (registers: one trip's words more).
        regs = _weight_registers(cfg)
        _keep_weights(cfg, regs, _load_weights(cfg, w_rows, sf_rows, Int64(0)))
    _await_activations(cfg, x, xsf, xs, qs, M, K, tidx)
    if cutlass.const_expr(cfg.REST > 0):  # noqa: SIM102 - compile-time, then a runtime test
        if ks == 0:  # (warp-uniform) the steps after K's whole chunks, on the first slice: it
            # has the floor of the chunks / slices (`k_slice`), so uneven splits stay balanced.
            # Before the trips: after them their addresses stayed live through the loop, which
            # spilled at 128 registers (1x8192x29568: 17 STL and 12 LDL per trip).
            rest = Int64(K // cfg.k_chunk)
            wq, sc = _load_weights(cfg, w_rows, sf_rows, rest, cfg.REST)
            _mma_trip(cfg, acc, wq, sc,
                      _load_activations(cfg, x_rows, xsf_rows, rest, cfg.REST), cfg.REST)
    if cutlass.const_expr(cfg.AHEAD):
        for trip in cutlass.range(trips - 1, unroll=1):
            cur = _kept_weights(cfg, regs)
            _keep_weights(cfg, regs, _load_weights(cfg, w_rows, sf_rows, Int64(trip + 1)))
            _mma_trip(cfg, acc, *cur, _load_activations(cfg, x_rows, xsf_rows, Int64(trip)))
        _mma_trip(cfg, acc, *_kept_weights(cfg, regs),
                  _load_activations(cfg, x_rows, xsf_rows, Int64(trips - 1)))
    else:
        for trip in cutlass.range(trips, unroll=1):
            wq, sc = _load_weights(cfg, w_rows, sf_rows, Int64(trip))
            xw = _load_activations(cfg, x_rows, xsf_rows, Int64(trip))
            _mma_trip(cfg, acc, wq, sc, xw)
    if cutlass.const_expr(cfg.K_TAIL):
        if ks == 0:  # (warp-uniform) the half step after K's whole steps, on the first slice
            _tail_step(cfg, acc, w_rows, sf_rows, x_rows, xsf_rows, Int64(K // cfg.k_chunk),
                       lane)
    part = Shared().alloc(sv(Float32, cfg.S * cfg.rows * cfg.m_pad)).iterator.toint()
    _store_partial(cfg, acc, part, M, wn, s, lane)
    cute.arch.barrier()
    if cutlass.const_expr(cfg.CLUSTER > 1):
        _sum_slices(cfg, part, M, tidx)
        cluster.cluster_sync()  # every rank's sum is in its shared memory
    _reduce(cfg, part, gsb, gsa, qs, out, M, N, n_blk, tidx, rank)
    if cutlass.const_expr(cfg.CLUSTER > 1):
        cluster.cluster_sync()  # (each rank's sums stay until its peers have read them)


def _weight_rows(cfg, w, wsf, wn, lane, n_blk, K, k_begin):
    """Per MMA row (weight rows g, g+8 of each tile) the address of the thread's first
    16 weight bytes and of its first scale pair."""
    t = lane % 4
    w_rows, sf_rows = [], []
    for mt in range(cfg.MT):
        for h in range(2):
            n = Int64(n_blk + weight_row(cfg, wn, lane, mt, h))
            k = k_begin + k_offset(t, 0)
            w_rows.append(w.toint() + n * Int64(K // 2) + k // 2)
            sf_rows.append(wsf.toint() + nvfp4_scales.band_offset(n, k // 16, Int64(K // 64)))
    return w_rows, sf_rows


def _load_weights(cfg, w_rows, sf_rows, trip, steps=None, back=0):
    """One trip's weights: [u][row] -> 4 words (32 codes), [u][row] -> 2 scale bytes (low half
    of a word). One LDG.128 (streaming: no L1 allocation; L2_FETCH: L2 prefetch size) and one
    LDG.16 per row and step. `steps` (default UNROLL) from the trip's first; `back`: K
    elements before (`_tail_step`)."""
    wq, sc = [], []
    for u in range(steps or cfg.UNROLL):
        k = trip * cfg.k_chunk + k_offset(0, u) - back
        wq.append([memory.ld_v4(a + k // 2, True, cfg.L2_FETCH, cfg.waits_first)
                   for a in w_rows])
        sc.append([memory.ld_u16(a + scale_step(k), cfg.waits_first) for a in sf_rows])
    return wq, sc


def _weight_registers(cfg):
    """Register tensors that hold one trip of weight words and scale pairs across a loop
    iteration (`_load_weights`' nesting, flattened)."""
    rows = 2 * cfg.MT
    return (cute.make_rmem_tensor((cfg.UNROLL * rows * 4,), Uint32),
            cute.make_rmem_tensor((cfg.UNROLL * rows,), Uint32))


def _keep_weights(cfg, regs, loaded):
    """Store `_load_weights`' (words, scales) into the registers `regs`."""
    words, scales = regs
    wq, sc = loaded
    for u in range(cfg.UNROLL):
        for r in range(2 * cfg.MT):
            scales[u * 2 * cfg.MT + r] = sc[u][r]
            for j in range(4):
                words[(u * 2 * cfg.MT + r) * 4 + j] = wq[u][r][j]


def _kept_weights(cfg, regs):
    """The (words, scales) of `regs`, nested as `_load_weights` returns them."""
    words, scales = regs
    rows = 2 * cfg.MT
    wq = [[[words[(u * rows + r) * 4 + j] for j in range(4)] for r in range(rows)]
          for u in range(cfg.UNROLL)]
    return wq, [[scales[u * rows + r] for r in range(rows)] for u in range(cfg.UNROLL)]


def _activation_rows(cfg, x, xsf, lane, M, K, k_begin):
    """Per n8 tile: the address of the thread's activation row (8 nt + g; rows past M repeat row
    M - 1, their products are dropped) at its first K element, and (W4A4) of its scales."""
    t = lane % 4
    x_rows, xsf_rows = [], []
    for nt in range(cfg.NT):
        m = Int64(cutlass.min(act_row(nt, lane), M - 1))
        k = k_begin + k_offset(t, 0)
        if cfg.w4a4:
            x_rows.append(x.toint() + m * Int64(K // 2) + k // 2)
            xsf_rows.append(xsf.toint()
                            + nvfp4_scales.band_offset(m, k // 16, Int64(K // 64)))
        else:
            x_rows.append(x.toint() + (m * Int64(K) + k) * 2)
    return x_rows, xsf_rows


def _await_activations(cfg, x, xsf, xs, qs, M, K, tidx):
    """Where the activations may first be read: after the previous kernel (PDL), and staged in
    shared memory (XSMEM)."""
    if cfg.PDL and cfg.EARLY_WEIGHTS:
        cluster.pdl_wait()
    if cfg.XSMEM:
        _stage_activations(cfg, x, xsf, xs, qs, M, K, tidx)


@cute.jit
def _stage_activations(cfg: cutlass.Constexpr, x, xsf, xs, qs, M, K, tidx):
    """The M x K activations as bf16 in shared memory (row m at xs + m * xsmem_row_bytes), in
    the pairing the trips read, once per CTA instead of in every trip; then a CTA barrier
    (threads read each other's rows). NVFP4 (W4A4): each chunk of 8 decoded from its codes word
    and scale byte straight into the strided pairing (`_decode`, as the trips would), e2m1 * sf
    * 2^-shift. QUANTIZE_A: the bf16 rows copied with 16-byte cp.async, then quantized and
    decoded in place (`_quantize_staged`)."""
    per_row = K // 8  # 16-byte chunks of bf16
    if cutlass.const_expr(not cfg.QUANTIZE_A):
        for c in cutlass.range(tidx, M * per_row, cfg.threads, unroll=1):
            m, col = c // per_row, c % per_row
            word = memory.ld_u32(x.toint() + Int64(m) * Int64(K // 2) + Int64(col) * 4)
            byte = memory.ld_u8(xsf.toint() + nvfp4_scales.band_offset(Int64(m), col // 2,
                                                                       Int64(K // 64)))
            memory.st_shared_v4_u32(xs + m * xsmem_row_bytes(K) + col * 16,
                                    _decode(cfg, word, fp4.scale_to_bf16x2_prescaled(byte,
                                                                                     cfg.sf)))
    else:
        for c in cutlass.range(tidx, M * per_row, cfg.threads, unroll=1):
            m, col = c // per_row, c % per_row
            memory.cp_async_16(xs + m * xsmem_row_bytes(K) + col * 16,
                               x.toint() + (Int64(m) * Int64(K) + Int64(col) * 8) * 2)
        memory.cp_async_wait_all()
        _quantize_staged(cfg, xs, qs, M, K, tidx)
    cute.arch.barrier()


@cute.jit
def _quantize_staged(cfg: cutlass.Constexpr, xs, qs, M, K, tidx):
    """QUANTIZE_A: the staged bf16 rows (each chunk c copied by thread c % threads, so its own
    reads need no barrier) become NVFP4 bit for bit as `tk_cute.nvfp4.quantize` makes them,
    then the decoded values the trips read. 1. The amax: each thread's chunks, the warp's max,
    a CTA barrier, every thread takes all warps' (in `qs`); the global scales
    (`ops.nvfp4.global_decode_scale`; thread 0 keeps gA in `qs` for the epilogue). 2. Per chunk,
    in place: `ops.nvfp4.quantize_lane` (a 16-element block is chunks 2j, 2j + 1: lanes 2j,
    2j + 1 of one warp, as rows hold an even number of chunks and the loop runs whole warps),
    then `_decode` as staged W4A4 activations. Lanes past the chunks read the zeroed pad of
    row 0 (no thread writes it) and store nothing."""
    per_row = K // 8
    total = M * per_row
    warp_i, lane = tidx // 32, tidx % 32
    pad = xs + K * 2  # row 0's 16 pad bytes (`xsmem_row_bytes`), read by idle lanes
    if tidx == 0:
        memory.st_shared_v4_u32(pad, [Uint32(0)] * 4)
    m = Uint32(0)
    for c in cutlass.range(tidx, total, cfg.threads, unroll=1):
        words = memory.ld_shared_v4(xs + (c // per_row) * xsmem_row_bytes(K) + (c % per_row) * 16,
                                    Uint32)
        m = Uint32(cutlass.max(m, fp4.abs_max_bits(words, "bf16")))
    m = cute.arch.warp_redux_sync(m, "umax")
    if lane == 0:
        qs[warp_i] = Int32(m)
    cute.arch.barrier()
    am = Uint32(0)
    for j in cutlass.range_constexpr(cfg.threads // 32):
        am = Uint32(cutlass.max(am, Uint32(qs[j])))
    s_dec_g = fp4.global_decode_scale(am)
    s_enc_g = fp4.div_rn(Float32(1.0), s_dec_g)
    if tidx == 0:
        qs[QS_GA] = Int32(fp4.bits(s_dec_g))
    for i in cutlass.range((total + cfg.threads - 1) // cfg.threads, unroll=1):
        c = i * cfg.threads + tidx
        addr = xs + (c // per_row) * xsmem_row_bytes(K) + (c % per_row) * 16
        src = pad + Int32(c < total) * (addr - pad)
        q, sf, _ = fp4.quantize_lane(memory.ld_shared_v4(src, Uint32), "bf16", s_dec_g, s_enc_g,
                                     "sm_90a")
        words = _decode(cfg, q, fp4.scale_to_bf16x2_prescaled(sf, cfg.sf))
        if c < total:
            memory.st_shared_v4_u32(addr, words)


def _staged_activation_rows(cfg, xs, lane, M, K, k_begin):
    """`_activation_rows` for activations staged in shared memory (32-bit addresses)."""
    t = lane % 4
    rows = [xs + cutlass.min(act_row(nt, lane), M - 1) * xsmem_row_bytes(K)
            + Int32(k_begin + k_offset(t, 0)) * 2 for nt in range(cfg.NT)]
    return rows, []


def _load_activations(cfg, x_rows, xsf_rows, trip, steps=None, back=0):
    """Issue one trip's activation loads: per step u and n8 tile, 4 LDG.128 of bf16 (K
    k_offset .. +31), or (W4A4) one LDG.128 of codes and one LDG.16 of scales. Flat list of
    words (see `_activation_fragments`). `steps`, `back`: as `_load_weights`."""
    words = []
    for u in range(steps or cfg.UNROLL):
        k = trip * cfg.k_chunk + k_offset(0, u) - back
        for nt in range(cfg.NT):
            if cfg.XSMEM:
                for j in range(4):
                    words += memory.ld_shared_v4(x_rows[nt] + Int32(k) * 2 + 16 * j, Uint32)
            elif cfg.w4a4:
                words += memory.ld_v4(x_rows[nt] + k // 2, False, coherent=cfg.PDL)
                words.append(memory.ld_u16(xsf_rows[nt] + scale_step(k), cfg.PDL))
            else:
                for j in range(4):
                    words += memory.ld_v4(x_rows[nt] + k * 2 + 16 * j, False,
                                          coherent=cfg.PDL)
    return words


def _activation_fragments(cfg, words, u):
    """B fragments of step u from `_load_activations`' words: [nt][word j] -> 4 bf16x2 words
    (K k_offset + 8j .. +7), decoded from NVFP4 for W4A4."""
    per = 5 if cfg.decodes_activations else 16  # words per step and n8 tile (`_load_activations`)
    out = []
    for nt in range(cfg.NT):
        w = words[(u * cfg.NT + nt) * per:][:per]
        if cfg.decodes_activations:
            f = fp4.scalex2_to_bf16x2_prescaled(w[4], cfg.sf)
            out.append([_decode(cfg, w[j], f[j // 2]) for j in range(4)])
        elif cfg.strided and not cfg.XSMEM:  # (staged W4A4 rows are decoded paired)
            out.append([fp4.bf16x8_strided(w[4 * j: 4 * j + 4]) for j in range(4)])
        else:
            out.append([w[4 * j: 4 * j + 4] for j in range(4)])
    return out


def _decode(cfg, q, sf_prescaled):
    """8 codes -> the 4 bf16x2 words of A (or W4A4 B) fragments, in the pairing cfg uses."""
    if cfg.strided:
        return fp4.e2m1x8_scaled_shifted_strided(q, sf_prescaled)
    return fp4.e2m1x8_scaled_shifted(q, sf_prescaled)


def _tail_step(cfg, acc, w_rows, sf_rows, x_rows, xsf_rows, trip, lane):
    """K's last 64 elements (K_TAIL) as one step at `trip` (from the warp's first K element:
    slice 0's, so K // k_chunk) plus the REST steps: lanes t < 2 hold them; lanes
    t >= 2, whose 32 elements would lie past K (past the rows, the scale atoms, the staged
    activations), read lane t - 2's (64 elements back: in bounds) and zero every word, so
    their codes, scales and activations are +0 and their products 0."""
    past = Uint32(lane % 4 >= 2)
    keep = Uint32(0) - (Uint32(1) - past)  # all ones for lanes t < 2, else 0
    back = Int64(past) * 64 - STEP_K * cfg.REST
    wq, sc = _load_weights(cfg, w_rows, sf_rows, trip, 1, back)
    xw = _load_activations(cfg, x_rows, xsf_rows, trip, 1, back)
    wq = [[[v & keep for v in words] for words in row] for row in wq]
    sc = [[v & keep for v in row] for row in sc]
    _mma_trip(cfg, acc, wq, sc, [v & keep for v in xw], 1)


def _mma_trip(cfg, acc, wq, sc, xw, steps=None):
    """Decode one trip's weights into A fragments and run its 8 * MT * NT * `steps` (default
    UNROLL) MMAs with the activation words `xw`."""
    MT, NT = cfg.MT, cfg.NT
    for u in range(steps or cfg.UNROLL):
        xb = _activation_fragments(cfg, xw, u)
        wf = [fp4.scalex2_to_bf16x2_prescaled(h, cfg.sf) for h in sc[u]]
        for j in range(4):  # 32-bit word j of each row: MMAs 2j, 2j+1
            for mt in range(MT):
                lo = _decode(cfg, wq[u][2 * mt][j], wf[2 * mt][j // 2])
                hi = _decode(cfg, wq[u][2 * mt + 1][j], wf[2 * mt + 1][j // 2])
                for nt in range(NT):
                    for e in range(2):
                        a = [lo[2 * e], hi[2 * e], lo[2 * e + 1], hi[2 * e + 1]]
                        base = (mt * NT + nt) * 4
                        d = warp.mma_m16n8k16_bf16(a, xb[nt][j][2 * e: 2 * e + 2],
                                     [acc[base + i] for i in range(4)])
                        for i in range(4):
                            acc[base + i] = d[i]


@cute.jit
def _store_partial(cfg: cutlass.Constexpr, acc, part, M, wn, s, lane):
    """This warp's fp32 partial (its rows x activation rows < M) into slice s of `part`."""
    for mt in cutlass.range_constexpr(cfg.MT):
        for nt in cutlass.range_constexpr(cfg.NT):
            base = (mt * cfg.NT + nt) * 4
            for h in cutlass.range_constexpr(2):  # registers 2h, 2h+1: activation rows m, m+1
                row, m = acc_coord(cfg, wn, lane, mt, nt, 2 * h)
                if m < M:  # columns m >= M are padding: never read back
                    memory.st_shared_v2_f32(part + slot_index(cfg, s, row, m) * 4,
                                            acc[base + 2 * h], acc[base + 2 * h + 1])


@cute.jit
def _sum_slices(cfg: cutlass.Constexpr, part, M, tidx):
    """CLUSTER: this CTA's S slices' partials summed in order into slice 0's slots (each sum
    read and written by one thread)."""
    for it in cutlass.range_constexpr(reduce_trips(cfg, 1)):
        row, m0 = reduce_coord(cfg, it, tidx, 0, 1)
        if m0 < M:
            memory.st_shared_v4_f32(part + slot_index(cfg, 0, row, m0) * 4,
                                    _slices_sum(cfg, part, row, m0))


@cute.jit
def _reduce(cfg: cutlass.Constexpr, part, gsb, gsa, qs, out, M, N, n_blk, tidx, rank):
    """Split-K inside the CTA: sum the S slices' partials in order (deterministic; with
    CLUSTER, this rank's share of the block's outputs over the ranks' sums, `_sum_slices`, in
    rank order through distributed shared memory), scale by 2^shift (twice W4A4) * global
    scales (QUANTIZE_A: gA as computed, from `qs`) and write D."""
    undo = Float32(2.0 ** fp4.decode_shift(cfg.sf))  # the decode's exact 2^-shift per operand
    scale = memory.ld_f32(gsb.toint()) * undo
    if cutlass.const_expr(cfg.QUANTIZE_A):
        scale = scale * (fp4.from_bits(Uint32(qs[QS_GA])) * undo)
    elif cutlass.const_expr(cfg.w4a4):
        scale = scale * (memory.ld_f32(gsa.toint()) * undo)
    out_base = out.toint()
    esize = 4 if cfg.out_dtype == "float32" else 2
    for it in cutlass.range_constexpr(reduce_trips(cfg)):
        row, m0 = reduce_coord(cfg, it, tidx, rank)
        nr = Int64(n_blk + row)
        if m0 < M:  # columns at or past M are padding (or past the block): skip
            if cutlass.const_expr(cfg.CLUSTER == 1):
                total = _slices_sum(cfg, part, row, m0)
            else:  # each rank's sum of its slices is in its slice 0's slots (`_sum_slices`)
                total = cluster.sum_ranks_v4_f32(part + slot_index(cfg, 0, row, m0) * 4,
                                                 cfg.CLUSTER)
            for e in cutlass.range_constexpr(4):
                m = m0 + e
                if m < M:
                    memory.st_cvt(out_base + (Int64(m) * Int64(N) + nr) * esize,
                                  total[e] * scale, cfg.out_dtype)


def _slices_sum(cfg, part, row, m0):
    """(row, m0)'s 4 fp32 partials of this CTA's S slices, added in slice order."""
    parts = [memory.ld_shared_v4(part + slot_index(cfg, k, row, m0) * 4) for k in range(cfg.S)]
    total = parts[0]
    for more in parts[1:]:
        total = [total[e] + more[e] for e in range(4)]
    return total


@cute.jit
def _launch(cfg: cutlass.Constexpr, w: cute.Pointer, wsf: cute.Pointer, x: cute.Pointer,
            xsf: cute.Pointer, gsb: cute.Pointer, gsa: cute.Pointer, out: cute.Pointer, M: Int32,
            N: Int32, K: Int32, stream):
    _kernel(cfg, w, wsf, x, xsf, gsb, gsa, out, M, N, K).launch(
        grid=[N // cfg.rows * cfg.CLUSTER, 1, 1], block=[cfg.threads, 1, 1], stream=stream,
        cluster=[cfg.CLUSTER, 1, 1] if cfg.CLUSTER > 1 else None,
        min_blocks_per_mp=cfg.MIN_CTAS, use_pdl=cfg.PDL,
        preferred_smem_carveout=0)  # the least shared memory: the rest is L1


def signature(cfg: Config) -> Signature:
    """`_launch`'s runtime arguments: the weights' codes and blocked scales, the activations
    (bf16, or NVFP4 codes and scales), the global decode scales (W4A16 reads gsb only), D and
    the shape."""
    out_t = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16,
             "float32": cutlass.Float32}[cfg.out_dtype]
    x_t = cutlass.Uint8 if cfg.w4a4 and not cfg.QUANTIZE_A else cutlass.BFloat16
    return Signature(ptr("w", cutlass.Uint8), ptr("wsf", cutlass.Uint8, 2), ptr("x", x_t),
                     ptr("xsf", cutlass.Uint8, 2), ptr("gsb", cutlass.Float32, 4),
                     ptr("gsa", cutlass.Float32, 4), ptr("out", out_t, 4),
                     i32("M"), i32("N"), i32("K"))


def compile_launcher(cfg: Config, options: str = ""):
    """`_launch` for cfg compiled into a raw-pointer `Launcher` (`options`: e.g.
    "--gpu-arch sm_90a" to build without a GPU)."""
    return signature(cfg).compile(_launch, cfg, options=options)


def check_shape(cfg: Config, M: int, N: int, K: int) -> None:
    """Raise ValueError naming the constraint of `cfg` that (M, N, K) breaks."""
    chunks = K // cfg.k_chunk
    if cfg.XSMEM and xsmem_bytes(M, K) > cfg.XSMEM:
        raise ValueError(f"config {cfg} stages {cfg.XSMEM} B of activations; M={M}, K={K} "
                         f"needs {xsmem_bytes(M, K)} B (XSMEM=0 reads them from global memory)")
    tail = STEP_K * cfg.REST + (TAIL_K if cfg.K_TAIL else 0)
    if (not 1 <= M <= cfg.m_pad or N % cfg.rows or K % cfg.k_chunk != tail
            or chunks < cfg.slices):
        raise ValueError(f"config {cfg} does not fit M={M}, N={N}, K={K} (needs 1 <= M <= "
                         f"m_pad = {cfg.m_pad}, N % rows = {cfg.rows} == 0, K % k_chunk = "
                         f"{cfg.k_chunk} == {tail} (REST={cfg.REST}, K_TAIL={cfg.K_TAIL}) and "
                         f"S x CLUSTER = {cfg.slices} <= K // k_chunk = {chunks})")
