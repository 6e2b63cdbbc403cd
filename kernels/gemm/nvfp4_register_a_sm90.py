# SPDX-License-Identifier: MIT
"""NVFP4 GEMM for Hopper with register-A wgmma (W4A16, and W4A4 below): D (M, N) = A (M, K) @
deq(B)^T, M <= 128.

Each consumer warpgroup decodes 64 weight rows straight into the registers of a wgmma A operand
(the RS form) and multiplies them by the activations, which the tensor cores read from shared
memory as the B operand (N = the activation rows, padded to a multiple of 16): D^T = W X^T. The
decode is the small-M kernel's (`ops.nvfp4`, exact: w = e2m1 * sf * 2^-8, strided pairing), but
the activations no longer pass through registers (the small-M kernel's limit from M = 16 on:
twice the weight bytes per warp, loaded from L2) and the MMAs run asynchronously beside the next
decode.

Schedule (stream-K, `ops.schedule.stream_k_share`): the work is (N / ROWS row blocks) x (K / 256
stages) units, row block major; each of `ctas` CTAs (at most one per SM: the host's
`tuning.sm90.register_a_ctas`, which prefers shares that line up with the row blocks) streams
an equal contiguous share, so no wave is left part-empty whatever N and K, and the pipeline
runs on across row blocks. ROWS is 256 where the planner takes it
(`tuning.sm90.register_a_config`: N_ACT <= 64 on wide layers, four consumer warpgroups, 640
threads; or N_ACT = 128, two warpgroups of two MMA tiles, 384 threads): each activation tile
then serves twice the weight rows (half the L2 reads per weight byte); else 128 (two
warpgroups).
Activations: the decode's K order is not memory order (below), so they are permuted either
  once per call ("call", N_ACT >= 32): `_permute_kernel` writes a permuted copy of N_ACT rows
    (those past M zeros, so every activation box lies in bounds), and this kernel, launched
    behind it with PDL, asks for its first unit's weights before waiting; or
  per stage ("stage", N_ACT <= 16, where the extra kernel boundary cost more than it saved;
    planned up to N_ACT = 48 too where the call asks for PDL, docs/facts.md#rs-stage-pdl):
    the producer warpgroup's warps 1-3 permute each landed tile in place.
  NVFP4 activations (W4A4, `Config.a_format` "nvfp4", always "call"): the per-call pass
    decodes them too (`_decode_permute_kernel`) and writes D's scale gA * gB * 2^8; the GEMM
    and the reduction are the W4A16 ones.
Pipeline (a STAGES-deep ring of one unit per stage; mbarriers loaded / full / empty):
  TMA warp (warp 0): once the consumers freed a stage, TMA-loads the unit's weight bytes (ROWS
    rows x 128 B, 128-byte swizzle), their scale atoms (2 KB per 128-row band) and the
    activations (N_ACT rows x 256 K bf16, swizzled as wgmma reads them; rows past M are the
    copy's zero rows, or with "stage" the TMA's out-of-bounds zeros), all completing on
    `loaded`;
  permuting warps ("stage" only, warps 1-3): put the landed activations in the K order of the
    decode, in place (`register_a.act_column`, `_load_natural` / `_store_permuted`: 4 LDS.128, 16 prmt, 4
    STS.128 per 64 bytes), fence them for the async proxy and arrive on `full`;
  consumer warpgroups (64 TILES rows each): once a stage is ready (`full`; `loaded` with
    "call"), per 128-K half of it and MMA tile read their 16 weight bytes of accumulator rows
    g, g + 8 (weight rows `spread_row(g)`, + 8: with it every 16-byte shared access of the
    kernel is conflict-free) and two scale bytes, decode them into one of two A register sets
    (one where two do not fit: `Config.a_sets`), issue 8 wgmma (m64 n N_ACT k16; the first of
    a row block overwrites the accumulator) and commit; waiting for all but the last group (all
    of them with one set) frees the next set and, after the stage's first batch, the previous
    stage (`empty`); where the share leaves a row block, each thread writes its fp32 partial
    sums as its fragment holds them (16-byte vectors, `partial_vector`) to the workspace region
    of this CTA and block;
  `_reduce_kernel` sums each row block's partials in CTA order (deterministic) times 2^8 * gB
    into D, REDUCE_AHEAD partials' loads in flight; it is launched with PDL, so its launch
    overlaps this kernel, and waits for it.
  `Config.DIRECT` (a grid whose shares are whole row blocks, `whole_blocks`: every block has
    one partial): the consumers scale and store D themselves, as the reduction would (0 + the
    one partial, times the scale: bit for bit), and no reduction is launched.
  `Config.CLUSTER` (the grid CLUSTER CTAs per row block, `cluster_ctas`; planned by
    `tuning.sm90.register_a_cluster`): the CTAs of a block form a cluster, each streaming a
    contiguous CLUSTER-th of its stages (`share`); each then puts its partial in its own
    activation ring, and after a cluster barrier sums a CLUSTER-th of the block over the
    ranks' partials in rank order through distributed shared memory into D (`_cluster_sum`,
    bit for bit the reduction over those shares): no workspace, no reduction launch.
The K order: a thread's 16 weight bytes hold 32 consecutive codes (K 32t .. 32t + 31 of a
128-K block, t = lane % 4), but a wgmma A operand wants K 2t, 2t + 1, 2t + 8, 2t + 9 of every
k16 step from thread t. Any permutation of K applied to both operands leaves the sum unchanged,
so the activations (read by every weight row) are permuted instead of the weights.
One CTA per SM (the ring takes the shared memory). The register split comes from the launch
allocation (`warpgroup.consumer_registers`: setmaxnreg.inc only takes what the producer
warpgroup's .dec gave back). Constraints (checked): M <= 128, N % 8 == 0 (N % ROWS != 0 with
`Config.N_TAIL`: the last row block is partial), K % 16 == 0 (K %
256 != 0 with `Config.K_TAIL`: each row block's last stage is partial, its codes, scale atoms
and activations past K zero-filled by the TMA or the permute pass). Rows of codes are
`nvfp4_codes.row_pitch(K)` bytes apart (16-byte padded where K % 32 != 0, as NVFP4Tensor
stores them): the TMA's global strides must be multiples of 16 bytes.
Scale format (`Config.sf`): UE4M3, or UE5M3 (w = e2m1 * sf * 2^-16, the reduction undoing 2^16:
`ops.nvfp4.decode_shift`; GPU-tested).

Limits and where the time goes: docs/nvfp4_hopper.md (register-A kernel); measured constants:
docs/facts.md#rs-wide-rows; what was tried: docs/history.md#register-a-kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from tk_cute.arch import target
from tk_cute.layouts import nvfp4_codes, nvfp4_scales, register_a
from tk_cute.layouts.register_a import act_offset, spread_row, weight_offset
from tk_cute.ops import cluster, memory, schedule, tma, warp, warpgroup
from tk_cute.ops import nvfp4 as fp4
from tk_cute.launcher import Signature, i32, ptr
from tk_cute.types.gl import coord, gl, row_major
from tk_cute.types.rt import rt
from tk_cute.types.semaphore import ring, semaphore
from tk_cute.types.st import Shared, smem_bytes, st
from tk_cute.types.struct import config_repr

STAGE_K = 256  # K per ring stage: 128 bytes of every weight row (a whole L2 line)
SUB_K = register_a.SUB_K  # K per MMA batch (8 wgmma k16 steps), the permutation's period
BAND = nvfp4_scales.ATOM_ROWS  # weight rows per scale band (128)
WG = warpgroup.WARPGROUP_THREADS
PRODUCER_REGISTERS = 48
MAX_CONSUMER_REGISTERS = 232
MAX_M = 128
K_ALIGN = nvfp4_scales.SF_VEC  # K % 16: whole scale blocks (padded rows of codes: any such K)
SMEM_BUDGET = target("sm_90a").smem_bytes
OUT_TYPES = ("bfloat16", "float16", "float32")
# From this N_ACT on the activations are permuted once per call (`Config.permute`): on the H200
# (docs/facts.md#rs-wide-rows) even at 32, 7-13% faster at 48-96 and 1.6x at 128; 5% slower
# at 16.
CALL_PERMUTE_MIN_N_ACT = 32
A_FORMATS = ("bf16", "nvfp4")  # activations as they come: bfloat16 (W4A16) or NVFP4 (W4A4)
N_ALIGN = 8  # D's rows (N elements) 16 bytes apart in bf16 (`Config.N_TAIL` below ROWS)


@dataclass(frozen=True)
class Config:
    """N_ACT: activation rows per MMA (wgmma N, >= M: 8 or a multiple of 16); ROWS: weight rows
    per CTA and stage (128 or 256); TILES: 64-row MMA tiles (accumulators) per consumer
    warpgroup (1 or 2; ROWS / (64 TILES) consumer warpgroups); STAGES: ring depth (0: as many
    as fit); A_SETS: A operand register sets a consumer alternates (2: a batch's decode
    overlaps the previous batch's MMAs; 1: each batch waits for its MMAs; 0: 2 where they fit
    the consumer registers); PERMUTE: see `permute`; PDL: calls chain with programmatic
    dependent launch (the reduction lets the next kernel launch at once; the GEMM launches
    during the kernel before it and waits for it before its first weight load, or with
    EARLY_WEIGHTS, `gemm_rs(pdl=True)`, after asking for its first unit's weights)."""

    N_ACT: int = 16
    ROWS: int = 128
    TILES: int = 1
    STAGES: int = 0
    A_SETS: int = 0
    PERMUTE: str = "auto"
    PDL: bool = False
    EARLY_WEIGHTS: bool = False  # with PDL: the first unit's weights asked for before the wait
    # Every row block in one CTA's share (the host's grid: `whole_blocks`): the GEMM stores D,
    # no partials, no reduction launch
    DIRECT: bool = False
    # CTAs per row block, one cluster (2, 4 or 8; 1: the stream-K grid): each streams a
    # contiguous CLUSTER-th of the block's stages (`share`) and the cluster sums its fp32
    # partials through distributed shared memory, each CTA a CLUSTER-th of the block into D in
    # rank order (`_cluster_sum`): no workspace, no reduction launch
    CLUSTER: int = 1
    out_dtype: str = "bfloat16"
    sf: str = field(default="ue4m3", metadata={"quiet": True})  # the weights' scale format
    # K % STAGE_K != 0: the last stage of each row block is partial (`k_stages`)
    K_TAIL: bool = field(default=False, metadata={"quiet": True})
    # N % ROWS != 0: the last row block is partial (its codes past N arrive as zeros: the
    # partials hold zeros there, which the reduction leaves out of D; `stream_units`)
    N_TAIL: bool = field(default=False, metadata={"quiet": True})
    # "nvfp4" (W4A4): x is the activations' codes, decoded in the permute "call" pass (their
    # scales in the format `sf` too); "bf16" (W4A16)
    a_format: str = field(default="bf16", metadata={"quiet": True})
    __repr__ = config_repr  # (the kernel symbol follows the repr: sf shows once not UE4M3)

    def __post_init__(self):
        # (wgmma takes any multiple of 8, but slicing an st of 8 x odd rows aborts the DSL 4.8.1)
        if (self.N_ACT != 8 and self.N_ACT % 16) or not 8 <= self.N_ACT <= MAX_M:
            raise ValueError(f"N_ACT must be 8 or a multiple of 16 up to {MAX_M}, "
                             f"got {self.N_ACT}")
        if self.ROWS not in (BAND, 2 * BAND):
            raise ValueError(f"ROWS must be {BAND} or {2 * BAND}, got {self.ROWS}")
        if self.TILES not in (1, 2):
            raise ValueError(f"TILES must be 1 or 2, got {self.TILES}")
        if self.A_SETS not in (0, 1, 2):
            raise ValueError(f"A_SETS must be 0 (auto), 1 or 2, got {self.A_SETS}")
        if self.PERMUTE not in ("auto", "stage", "call"):
            raise ValueError(f"PERMUTE must be 'auto', 'stage' or 'call', got {self.PERMUTE!r}")
        if self.out_dtype not in OUT_TYPES:
            raise ValueError(f"out_dtype must be one of {OUT_TYPES}, got {self.out_dtype!r}")
        if self.sf not in fp4.DECODE_FORMATS:
            raise ValueError(f"sf must be one of {fp4.DECODE_FORMATS}, got {self.sf!r}")
        if self.a_format not in A_FORMATS:
            raise ValueError(f"a_format must be one of {A_FORMATS}, got {self.a_format!r}")
        if self.a_format == "nvfp4" and self.PERMUTE == "stage":
            raise ValueError("NVFP4 activations are decoded in the permute 'call' pass: "
                             "PERMUTE='stage' takes bf16 activations only")
        if self.CLUSTER not in cluster.PORTABLE_SIZES:
            raise ValueError(f"CLUSTER must be one of {cluster.PORTABLE_SIZES}, "
                             f"got {self.CLUSTER}")
        if self.CLUSTER > 1 and self.DIRECT:
            raise ValueError("CLUSTER > 1 sums a block's partials in the cluster; DIRECT gives "
                             "each block one CTA: one or the other")
        if self.stages < 2:
            raise ValueError(f"a ring of >= 2 stages of {self.stage_bytes} B must fit "
                             f"{SMEM_BUDGET} B of shared memory (N_ACT={self.N_ACT}, "
                             f"STAGES={self.STAGES})")

    @property
    def consumers(self) -> int:  # consumer warpgroups
        return self.ROWS // (64 * self.TILES)

    @property
    def bands(self) -> int:  # scale bands per stage
        return self.ROWS // BAND

    @property
    def threads(self) -> int:
        return (1 + self.consumers) * WG

    @property
    def a_sets(self) -> int:
        """With 104 consumer registers (640 threads) two sets fit beside an N_ACT = 16
        accumulator only: ptxas serializes the wgmma (a full wait after each) from N_ACT = 32
        on. With two tiles it serializes them with two sets at any N_ACT (C7513: "non wgmma
        instructions defining input registers"); one set was as fast on the H200."""
        if self.A_SETS:
            return self.A_SETS
        return 2 if self.TILES == 1 and (self.ROWS == BAND or self.N_ACT <= 16) else 1

    @property
    def permute(self) -> str:
        """Where the activations are put in the decode's K order: "stage" (3 permuting warps,
        each landed tile in place) or "call" (`_permute_kernel`, once per call, before the
        GEMM). The per-call pass costs a kernel boundary but no longer scales with the units a
        CTA streams: it pays from N_ACT = CALL_PERMUTE_MIN_N_ACT on."""
        if self.PERMUTE != "auto":
            return self.PERMUTE
        if self.a_format == "nvfp4":  # the decode pass writes them permuted anyway
            return "call"
        return "call" if self.N_ACT >= CALL_PERMUTE_MIN_N_ACT else "stage"

    @property
    def waits_before_weights(self) -> bool:
        """Whether the TMA warp waits for the kernel before this one before any weight load:
        PDL without EARLY_WEIGHTS, where that kernel is the previous call's (permute "stage";
        a per-call pass waits for its own predecessor before the GEMM may launch)."""
        return self.PDL and not self.EARLY_WEIGHTS and self.permute == "stage"

    @property
    def consumer_registers(self) -> int:
        """What the producer warpgroup's drop to PRODUCER_REGISTERS leaves the consumers
        (`warpgroup.consumer_registers`: 224 at 384 threads, 104 at 640)."""
        return warpgroup.consumer_registers(self.threads, PRODUCER_REGISTERS, self.consumers,
                                            MAX_CONSUMER_REGISTERS)

    # Bytes move as Int8: raw pointer arguments carry no signedness (the decode reads bits).
    @property
    def weight_tile(self) -> st:  # 128-byte rows, 128-byte swizzle
        return st(cutlass.Int8, self.ROWS, STAGE_K // 2)

    @property
    def scale_tile(self) -> st:  # one band's STAGE_K / 64 scale atoms, as rows of 256 bytes
        return st(cutlass.Int8, 2 * (STAGE_K // nvfp4_scales.ATOM_K), 256, swizzle=False)

    @property
    def act_tile(self) -> st:
        return st(cutlass.BFloat16, self.N_ACT, STAGE_K)

    @property
    def stage_bytes(self) -> int:
        return self.weight_tile.bytes + self.bands * self.scale_tile.bytes + self.act_tile.bytes

    @property
    def stages(self) -> int:
        if self.STAGES:
            return self.STAGES
        fits = [d for d in range(2, 9) if self.smem(d) <= SMEM_BUDGET]
        return max(fits) if fits else 0

    def smem(self, stages: int) -> int:
        barrier_sets = 3 if self.permute == "stage" else 2  # loaded, empty (, full)
        return smem_bytes((self.weight_tile, stages), (self.scale_tile, self.bands * stages),
                          (self.act_tile, stages), barriers=barrier_sets * stages)


def supports(M: int, N: int, K: int) -> bool:
    """Whether some Config of this kernel takes this shape (`tk_cute.tuning.sm90` picks
    it): N % N_ALIGN, K % K_ALIGN, `Config.K_TAIL` where K % STAGE_K != 0 and `Config.N_TAIL`
    where N % ROWS != 0."""
    return 1 <= M <= MAX_M and N >= N_ALIGN and N % N_ALIGN == 0 and K % K_ALIGN == 0


def k_stages(cfg, K):
    """Stages of STAGE_K per row block (the last one partial with `K_TAIL`: the TMA fills the
    weight codes, scale atoms and activations past K with zeros, and 0 * 0 adds nothing)."""
    if cfg.K_TAIL:
        return (K + STAGE_K - 1) // STAGE_K
    return K // STAGE_K


def k_blocks(k_tail: bool, K):
    """128-K blocks of the activation permutation: the permuted copy's row is this many times
    SUB_K wide (`permuted_width`); with a K tail the last block's columns past K are zeros."""
    return (K + SUB_K - 1) // SUB_K if k_tail else K // SUB_K


def permuted_width(K, k_tail: bool = True):
    """Elements per row of the permuted activations: with a K tail, K rounded up to the
    permutation's period (its columns past K zeros), else K itself (a whole number of periods;
    the host allocates the copy with the default)."""
    return k_blocks(True, K) * SUB_K if k_tail else K


def stream_units(cfg: Config, N, K):
    """The stream-K schedule's units: (N / ROWS row blocks, the last one partial with
    `N_TAIL`) x (`k_stages` stages), row block major (plain integer arithmetic: the host and
    the kernel use it alike)."""
    return row_blocks(cfg, N) * k_stages(cfg, K)


def row_blocks(cfg: Config, N):
    """Row blocks of ROWS weight rows (with `N_TAIL` the last one partial)."""
    return blocks(N, cfg.ROWS, cfg.N_TAIL)


def share(cfg: Config, cta, ctas, N, K):
    """CTA `cta`'s units [start, end): an equal contiguous share of the stream-K schedule
    (`schedule.stream_k_share`), or with `Config.CLUSTER` its rank's contiguous CLUSTER-th of
    its cluster's row block's stages (plain integer arithmetic: the host and the kernel use it
    alike)."""
    if cfg.CLUSTER == 1:
        return schedule.stream_k_share(cta, ctas, stream_units(cfg, N, K))
    stages = k_stages(cfg, K)
    rb, rank = cta // cfg.CLUSTER, cta % cfg.CLUSTER
    return (rb * stages + rank * stages // cfg.CLUSTER,
            rb * stages + (rank + 1) * stages // cfg.CLUSTER)


def cluster_ctas(cfg: Config, N: int) -> int:
    """The grid of `Config.CLUSTER` > 1: CLUSTER CTAs per row block."""
    return row_blocks(cfg, N) * cfg.CLUSTER


def check_grid(cfg: Config, N: int, K: int, ctas: int) -> None:
    """Raise ValueError where `ctas` CTAs cannot run cfg: `Config.DIRECT` needs shares of whole
    row blocks (`whole_blocks`), `Config.CLUSTER` exactly its grid (`cluster_ctas`)."""
    if cfg.DIRECT and not whole_blocks(cfg, N, K, ctas):
        raise ValueError(f"a register-A Config with DIRECT needs shares of whole row blocks "
                         f"(`whole_blocks`); {ctas} CTAs over N={N}, K={K} split them")
    if cfg.CLUSTER > 1 and ctas != cluster_ctas(cfg, N):
        raise ValueError(f"a register-A Config with CLUSTER = {cfg.CLUSTER} runs "
                         f"{cluster_ctas(cfg, N)} CTAs on N={N} (CLUSTER per row block), got "
                         f"ctas={ctas}")


def whole_blocks(cfg: Config, N: int, K: int, ctas: int) -> bool:
    """Whether `ctas` equal shares of the units are whole row blocks (every block then has one
    partial: `Config.DIRECT` may store D from the GEMM)."""
    units = stream_units(cfg, N, K)
    return units % ctas == 0 and (units // ctas) % k_stages(cfg, K) == 0


def blocks(N, rows, n_tail: bool):
    """Blocks of `rows` weight rows: ceil(N / rows) with a partial last one (`n_tail`), else
    N / rows (plain integer arithmetic: the host and the kernels use it alike)."""
    return (N + rows - 1) // rows if n_tail else N // rows


# ---------------------------------------------------------------- kernel


@cute.kernel
def _permute_kernel(k_tail: cutlass.Constexpr, x: cute.Pointer, xp: cute.Pointer, M: Int32,
                    K: Int32, rows: Int32):
    """Permute "call": the activations in the K order of the decode (`register_a.act_column`), once per
    call into `xp` (rows `k_blocks` x 128 wide), which the GEMM's TMA then reads: 4 threads own
    the 16 chunks of a (row, 128-K block), as the permuting warps do per stage
    (`_load_natural`, `_store_permuted`). With a K tail, chunks past K are zeros; rows M ..
    `rows` of the copy are zeros (`_zero_rows`)."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    cluster.pdl_wait()  # x may be the previous kernel's output
    cluster.pdl_launch_dependents()  # the GEMM may start streaming weights
    m, blk, p = permute_task(bid * PERMUTE_THREADS + tid, k_blocks(k_tail, K))
    if m < M:
        if cutlass.const_expr(k_tail):  # chunk c's load takes c itself (its validity)
            row = Int64(m) * Int64(K) * 2
            load = functools.partial(_ld_global_tail, x.toint() + row, blk, K)
            chunks = _load_natural(load, lambda c: c, p)
            out = (Int64(m) * Int64(k_blocks(k_tail, K)) + blk) * SUB_K * 2
        else:
            row = (Int64(m) * Int64(K) + blk * SUB_K) * 2
            chunks = _load_natural(_ld_global, lambda c: x.toint() + row + 16 * c, p)
            out = row
        _store_permuted(memory.st_v4_u32, lambda c: xp.toint() + out + 16 * c, p, chunks)
    _zero_rows(k_tail, xp, m, blk, p, M, K, rows)


@cute.jit
def _zero_rows(k_tail: cutlass.Constexpr, xp: cute.Pointer, m, blk, p, M, K, rows):
    """Task (m, blk, p) of a permute pass past the activations (M <= m < rows): its chunks of
    the copy as zeros. The tiled kernel's activation tiles then lie inside the copy: TMA boxes
    mostly past a tensor's last row were measured slow (257x8192^2 with 256-row tiles: the
    second row of tiles, one row in bounds, made the call 1.5x a 384-row one)."""
    if m >= M:
        if m < rows:
            width = Int64(k_blocks(k_tail, K)) * SUB_K
            out = (Int64(m) * width + blk * SUB_K) * 2
            _store_permuted(memory.st_v4_u32, lambda c: xp.toint() + out + 16 * c, p,
                            [[Uint32(0)] * 4] * 4)


def _ld_global_tail(row, blk, K, c):
    """Natural chunk c of 128-K block blk of the activation row at `row`; zeros past K (the
    address clamped into the row)."""
    col = blk * SUB_K + 8 * c
    valid = Uint32(col < K)
    words = _ld_global(row + Int64(cutlass.min(col, K - 8)) * 2)
    return [w * valid for w in words]


def _decode_chunk(sf_format: str, k_tail: bool, xq, xsf, m, blk, K, c):
    """Natural chunk c (elements 8c .. 8c + 7 of row m's 128-K block blk: one word of codes,
    one scale byte) of NVFP4 activations, decoded into the strided pairing; with a K tail,
    zeros past K (codes 0, read at a clamped address)."""
    row_words = nvfp4_codes.row_pitch(K) // 4  # words from one row of codes to the next
    if k_tail:
        chunk = blk * (SUB_K // 8) + c
        valid, chunk = Uint32(chunk < K // 8), cutlass.min(chunk, K // 8 - 1)
        word = memory.ld_u32(xq.toint() + (Int64(m) * Int64(row_words) + chunk) * 4) * valid
    else:
        word = memory.ld_u32(xq.toint() + (Int64(m) * Int64(row_words) + blk * (SUB_K // 8)
                                           + c) * 4)
    rk = (K + nvfp4_scales.ATOM_K - 1) // nvfp4_scales.ATOM_K  # scale atoms per 128-row band
    kb = chunk // 2 if k_tail else blk * (SUB_K // nvfp4_scales.SF_VEC) + c // 2
    byte = memory.ld_u8(xsf.toint() + Int64(nvfp4_scales.band_offset(m, kb, rk)))
    return fp4.e2m1x8_scaled_shifted_strided(word, fp4.scale_to_bf16x2_prescaled(byte,
                                                                                 sf_format))


def permute_task(task, blocks):
    """(row, 128-K block, p) of `_permute_kernel` thread `task` (blocks: K / 128): the 4 threads
    of a (row, block) are adjacent, so each load of a quad reads 64 contiguous bytes."""
    return task // (4 * blocks), (task // 4) % blocks, task % 4


@cute.kernel
def _decode_permute_kernel(sf_format: cutlass.Constexpr, k_tail: cutlass.Constexpr,
                           xq: cute.Pointer, xsf: cute.Pointer, gsa: cute.Pointer,
                           gsb: cute.Pointer, xp: cute.Pointer, M: Int32, K: Int32,
                           rows: Int32):
    """Permute "call" for NVFP4 activations (W4A4): `_permute_kernel`'s pass, but each natural
    chunk of 8 elements is decoded from its 4 bytes of codes and its scale byte straight into
    the strided pairing (`ops.nvfp4.e2m1x8_scaled_shifted_strided`: e2m1 * sf * 2^-shift, exact
    in bf16), the pairing `_load_natural` gives bf16 activations. Block 0's thread 0 writes D's
    scale fl(gA * gB) * 2^shift (the product rounded once, as torch's is; the power of two
    exact) after the activations (`decoded_scale`), which the GEMM takes as its `gsb`: the sums
    carry 2^-shift exactly (no product comes near fp32's subnormals), so D = fl(sum * 2^shift_w
    * that) is bit for bit the W4A16 GEMM of the exactly decoded activations with gsb =
    fl(gA * gB). Rows M .. `rows` of the copy are zeros (`_zero_rows`), D's scale after them."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    cluster.pdl_wait()  # the activations may be the previous kernel's output (the quantizer)
    cluster.pdl_launch_dependents()
    shift = Float32(2.0 ** fp4.decode_shift(sf_format))
    if bid == 0 and tid == 0:
        scale = fp4.mul_rn(fp4.mul_rn(memory.ld_f32(gsa.toint()), memory.ld_f32(gsb.toint())),
                           shift)
        memory.st_cvt(decoded_scale(xp, rows, permuted_width(K, k_tail)).toint(), scale,
                      "float32")
    m, blk, p = permute_task(bid * PERMUTE_THREADS + tid, k_blocks(k_tail, K))
    if m < M:
        decode = functools.partial(_decode_chunk, sf_format, k_tail, xq, xsf, m, blk, K)
        chunks = [decode(4 * u + p) for u in range(4)]  # natural chunks 4u + p, as bf16 ones
        if cutlass.const_expr(k_tail):
            row = (Int64(m) * Int64(k_blocks(k_tail, K)) + blk) * SUB_K * 2
        else:
            row = (Int64(m) * Int64(K) + blk * SUB_K) * 2
        _store_permuted(memory.st_v4_u32, lambda c: xp.toint() + row + 16 * c, p, chunks)
    _zero_rows(k_tail, xp, m, blk, p, M, K, rows)


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, gw: gl, gsf: gl, gx: gl, ws: cute.Pointer,
            out: cute.Pointer, gsb: cute.Pointer, M: Int32, N: Int32, K: Int32):
    tid, _, _ = cute.arch.thread_idx()
    cta, _, _ = cute.arch.block_idx()
    ctas, _, _ = cute.arch.grid_dim()
    depth = cfg.stages
    smem = Shared()
    per_stage = cfg.permute == "stage"
    loaded, empty = smem.barriers(depth), smem.barriers(depth)
    # The consumers' signal: the permuting warps' `full` (permute "stage"), else `loaded`
    full = smem.barriers(depth) if per_stage else loaded
    wq = smem.alloc(cfg.weight_tile, depth)
    sf = smem.alloc(cfg.scale_tile, cfg.bands * depth)  # stage s: bands s * bands + b
    xs = smem.alloc(cfg.act_tile, depth)
    if tid == 0:
        for s in cutlass.range_constexpr(depth):
            semaphore(loaded + s).init(1)  # the TMA warp's expect-tx arrival
            semaphore(empty + s).init(cfg.consumers * 4)  # one per consumer warp
            if cutlass.const_expr(per_stage):
                semaphore(full + s).init(WG - 32)  # every permuting thread
    cute.arch.mbarrier_init_fence()
    cute.arch.barrier()
    cluster.pdl_launch_dependents()  # the reduction (DIRECT, CLUSTER: the next kernel) may launch
    start, end = share(cfg, cta, ctas, N, K)
    if warpgroup.groupid() == 0:
        warpgroup.decrease_registers(PRODUCER_REGISTERS)
        if tid < 32:
            _load(cfg, gw, gsf, gx, wq, sf, xs, loaded, empty, start, end - start, K)
        elif cutlass.const_expr(per_stage):
            _permute(cfg, xs, loaded, full, end - start, tid - 32)
        if cutlass.const_expr(cfg.CLUSTER > 1):  # (every thread meets the cluster's barriers)
            cute.arch.barrier()
            cluster.cluster_sync()
            cluster.cluster_sync()
    else:
        warpgroup.increase_registers(cfg.consumer_registers)
        _consume(cfg, wq, sf, xs, full, empty, start, end - start, tid - WG, (ws, out, gsb), M,
                 N, K, cta)


@cute.jit
def _load(cfg: cutlass.Constexpr, gw, gsf, gx, wq, sf, xs, loaded, empty, start, steps, K):
    """TMA warp: per stage unit, once the consumers freed its slot, the weight bytes, their
    scale atoms and the activations (rows past M arrive as zeros). The first unit's weights are
    asked for before waiting for the kernel before this one (PDL: `_permute_kernel`, or with
    Config.PDL and EARLY_WEIGHTS the previous call's reduction; a no-op without PDL), after it
    with PDL alone (`waits_before_weights`). Asking for more units'
    weights before the wait was slower on the H200 (docs/facts.md#pdl)."""
    phases = ring(cfg.stages)
    for i in cutlass.range(steps, unroll=1):
        s = phases.stage(i)
        phases.wait_finished(empty, i)
        if cutlass.const_expr(cfg.waits_before_weights):
            if i == 0:
                cluster.pdl_wait()
        stage = _load_weights(cfg, gw, gsf, wq, sf, loaded, start, i, K)
        if cutlass.const_expr(not cfg.waits_before_weights):
            if i == 0:
                cluster.pdl_wait()
        tma.load_async(xs[None, None, s], gx, coord(0, stage), loaded + s)


@cute.jit
def _load_weights(cfg: cutlass.Constexpr, gw, gsf, wq, sf, loaded, start, i, K):
    """Unit start + i's weight bytes and scale atoms into stage i % depth, whose `loaded` then
    expects the whole stage (the activations too); returns the unit's K stage."""
    s = i % cfg.stages
    stages = k_stages(cfg, K)  # per row block (and scale tiles per 128-row band)
    rb, stage = (start + i) // stages, (start + i) % stages
    with warp.elect_leader():
        semaphore(loaded + s).expect_bytes(cfg.stage_bytes)
    tma.load_async(wq[None, None, s], gw, coord(rb, stage), loaded + s)
    for b in cutlass.range_constexpr(cfg.bands):
        tma.load_async(sf[None, None, s * cfg.bands + b], gsf,
                       scale_coord(cfg.K_TAIL, rb * cfg.bands + b, stage, stages), loaded + s)
    return stage


def scale_coord(k_tail: bool, band, stage, stages):
    """Coordinate of a band's scale tile for `stage` (`stages` per band) in `weight_tensors`'
    scale tensor (either register-A kernel)."""
    return coord(stage, 0, band) if k_tail else coord(band * stages + stage, 0, 0)


@cute.jit
def _permute(cfg: cutlass.Constexpr, xs, loaded, full, steps, thread):
    """Permute "stage", permuting warps (96 threads): put each landed activation tile in the K
    order of the decode (`register_a.act_column`), in place: 4 threads own the 16 chunks of a (row, 128-K
    block); thread p reads natural chunks 4u + p (u = 0..3), re-pairs each
    (`ops.nvfp4.bf16x8_strided`) and writes permuted chunks 4e + p = word e of its chunks u =
    0..3. The two groups of a quarter-warp take rows `spread_row` apart. Then the consumers may
    read."""
    phases = ring(cfg.stages)
    blocks = STAGE_K // SUB_K
    tasks = cfg.N_ACT * blocks * 4  # a multiple of 64: warps stay converged
    lane, wid = thread % 32, thread // 32
    p = lane % 4
    for i in cutlass.range(steps, unroll=1):
        s = phases.stage(i)
        phases.wait_arrived(loaded, i)
        base = xs[None, None, s].iterator.toint()
        for first_task in cutlass.range(32 * wid, tasks, 96, unroll=1):
            m, blk = quad_task((first_task + lane) // 4, blocks)
            chunk = functools.partial(_act_chunk, base, cfg.N_ACT, m, blk)  # chunk c's address
            chunks = _load_natural(_ld_shared, chunk, p)
            cute.arch.sync_warp()  # the group's loads before any of its stores
            _store_permuted(memory.st_shared_v4_u32, chunk, p, chunks)
        cute.arch.fence_proxy("async.shared", space="cta")  # our stores -> the wgmma reads
        semaphore(full + s).arrive()


def quad_task(quad, blocks: int):
    """(activation row, 128-K block) that quad (4 permuting lanes) `quad` re-orders: the 8 quads
    of a warp take 8 rows of one block, the two of each quarter-warp `spread_row` apart."""
    return spread_row(8 * (quad // (8 * blocks)) + quad % 8), (quad // 8) % blocks


def _act_chunk(base, n_act, m, blk, c):
    """Shared address of 16-byte chunk c of (row m, 128-K block blk) of a stage's tile."""
    return base + act_offset(n_act, m, blk * SUB_K + 8 * c)


def _ld_shared(addr):
    return memory.ld_shared_v4(addr, Uint32)


def _ld_global(addr):
    return memory.ld_v4(addr, True)


def _load_natural(load, chunk, p):
    """Natural chunks 4u + p (u = 0..3) of one (row, 128-K block) (`chunk(c)`: the address of
    chunk c), each re-paired for the strided decode (word i = elements i, i + 4)."""
    return [fp4.bf16x8_strided(load(chunk(4 * u + p))) for u in range(4)]


def _store_permuted(store, chunk, p, chunks):
    """Permuted chunks 4e + p (e = 0..3): word u of chunk 4e + p is word e of natural chunk
    4u + p."""
    for e in range(4):
        store(chunk(4 * e + p), [chunks[u][e] for u in range(4)])


@cute.jit
def _consume(cfg: cutlass.Constexpr, wq, sf, xs, full, empty, start, steps, thread, dest, M, N,
             K, cta):
    """Consumer warpgroup thread: decode, wgmma, release; where its share leaves a row block,
    write that block's accumulators (TILES x 64 weight rows x N_ACT activation rows) and start
    the next one from zero; with `Config.CLUSTER` (one row block) sum them in the cluster
    (`_cluster_sum`)."""
    phases = ring(cfg.stages)
    stages = k_stages(cfg, K)
    wg_thread = thread % WG
    lane = wg_thread % 32
    g, t = lane // 4, lane % 4
    rows = tile_row(cfg, 0, 0, thread)  # this warpgroup's rows of the ROWS-row block
    # Accumulator rows g, g + 8 of the warp's 16 in tile j hold weight rows r_lo + 64 j, + 8
    r_lo = rows + (wg_thread // 32) * 16 + spread_row(g)
    mma = warpgroup.tiled_mma(cutlass.BFloat16, cfg.N_ACT)
    acc = [rt.accumulator(mma, wg_thread, 64, cfg.N_ACT) for _ in range(cfg.TILES)]
    regs = [rt.operand_A(mma, wg_thread, 64, SUB_K) for _ in range(cfg.a_sets)]
    end = start + steps
    for rb in cutlass.range(start // stages, (end - 1) // stages + 1, unroll=1):
        first, last = cutlass.max(start, rb * stages), cutlass.min(end, rb * stages + stages)
        for u in cutlass.range(first, last, unroll=1):  # this share's units of row block rb
            i = u - start
            s = phases.stage(i)
            phases.wait_arrived(full, i)
            w_base = wq[None, None, s].iterator.toint()
            for batch in cutlass.range_constexpr(STAGE_K // SUB_K * cfg.TILES):
                blk, j = divmod(batch, cfg.TILES)  # 128-K block, MMA tile
                a = regs[batch % cfg.a_sets]
                band = s * cfg.bands + (rows + 64 * j) // BAND
                decode(a, functools.partial(_weight_chunk, w_base, 4 * blk + t),
                       sf[None, None, band].iterator.toint(), r_lo + 64 * j, t, blk, cfg.sf)
                warpgroup.mma_fence()
                x = cute.local_tile(xs[None, None, s], (cfg.N_ACT, SUB_K), (0, blk))
                if cutlass.const_expr(blk == 0):  # the row block's first unit starts from 0
                    warpgroup.mma_ABt(acc[j], a, x, accumulate=u > first)
                else:
                    warpgroup.mma_ABt(acc[j], a, x)
                warpgroup.mma_commit_group()
                # All but the last batch done (two sets; all of them with one): the next batch's
                # register set is free and, after the first batch, so is the previous stage.
                warpgroup.mma_async_wait(cfg.a_sets - 1)
                if batch == 0 and i > 0:
                    with warp.elect_leader():
                        phases.at(empty, i - 1).arrive()
        warpgroup.mma_async_wait(0)
        if cutlass.const_expr(cfg.CLUSTER > 1):  # (one row block per CTA)
            _cluster_sum(cfg, acc, xs[None, None, 0].iterator.toint(), dest, M, N, rb, thread)
        else:
            for j in cutlass.range_constexpr(cfg.TILES):
                _store(cfg, acc[j], dest, M, N, cta, rb, j, thread)


def _weight_chunk(w_base, chunk, r):
    """Shared address of 16-byte chunk `chunk` of row r of a stage's weight tile."""
    return w_base + weight_offset(r, chunk)


def decode(a: rt, chunk_addr, sf_base, r_lo, t, blk, sf_format: str = "ue4m3"):
    """Decode this thread's weights of 128-K block `blk` (rows r_lo, r_lo + 8; K 32t .. 32t +
    31) into the A operand registers `a` of a 64 x 128 register-A wgmma batch: pair i of word j
    (codes 32t + 8j + i, + 4) goes to k16 step 2i + j // 2 (`register_a.act_column`). `chunk_addr(r)`:
    the shared address of row r's 16 bytes of these codes; `sf_base`: the band's scale atoms
    (rows r_lo, r_lo + 8 within one 128-row band); `sf_format` the scales' format (values
    e2m1 * sf * 2^-decode_shift). Shared by every register-A kernel."""
    words, scales = [], []
    for r in (r_lo, r_lo + 8):
        words.append(memory.ld_shared_v4(chunk_addr(r), Uint32))
        atom = (SUB_K * blk + 32 * t) // nvfp4_scales.ATOM_K
        kb = (32 * t // nvfp4_scales.SF_VEC) % nvfp4_scales.ATOM_SF_COLS
        scales.append(fp4.scalex2_to_bf16x2_prescaled(memory.ld_shared_u16(
            sf_base + atom * nvfp4_scales.ATOM_BYTES + nvfp4_scales.atom_offset(r, kb)),
            sf_format))
    frag = cute.recast_tensor(a.frag, Uint32)  # per k16 step: (g, 2t) (g+8, 2t) (g, +8) (g+8, +8)
    for j in range(4):
        lo = fp4.e2m1x8_scaled_shifted_strided(words[0][j], scales[0][j // 2])
        hi = fp4.e2m1x8_scaled_shifted_strided(words[1][j], scales[1][j // 2])
        for i in range(4):
            frag[4 * (2 * i + j // 2) + 2 * (j % 2)] = lo[i]
            frag[4 * (2 * i + j // 2) + 2 * (j % 2) + 1] = hi[i]


@cute.jit
def _store(cfg: cutlass.Constexpr, acc, dest, M, N, cta, rb, j, thread):
    """Write acc (MMA tile j of consumer thread `thread`'s warpgroup in row block rb), this
    CTA's fp32 partial sum of the block, to its workspace region of dest = (ws, out, gsb) as
    it lies in the fragment (`partial_vector`: 16-byte vectors, each warp's stores 512
    contiguous bytes); `_reduce_kernel` sums a block's partials in CTA order (deterministic)
    into D. With `Config.DIRECT` (the block's one partial) D itself (row r:
    weight row n0 + spread_row(r); activation rows m < M), as the reduction writes it."""
    ws, out, gsb = dest
    if cutlass.const_expr(cfg.DIRECT):
        cluster.pdl_wait()  # (returns at once: W4A4's decode pass wrote the scale long before)
        scale = output_scale(gsb, cfg.sf)
        n0 = tile_row(cfg, rb, j, thread)
        coords = acc.coords()
        for i in cutlass.range_constexpr(cute.size(acc.frag)):
            r, m = coords[i]
            if m < M:
                n = Int64(n0 + spread_row(r))
                if cutlass.const_expr(cfg.N_TAIL):
                    if n < Int64(N):  # (a partial last row block: no row past N)
                        _store_d(cfg, out, N, m, n, acc.frag[i], scale)
                else:
                    _store_d(cfg, out, N, m, n, acc.frag[i], scale)
    else:
        for c in cutlass.range_constexpr(cute.size(acc.frag) // 4):
            v = partial_vector(cfg, cta + rb, j, c, thread)
            memory.st_v4_f32(ws.toint() + Int64(v) * 16, [acc.frag[4 * c + e] for e in range(4)])


@cute.jit
def _cluster_sum(cfg: cutlass.Constexpr, acc, base, dest, M, N, rb, thread):
    """`Config.CLUSTER`: once every consumer warpgroup's MMAs are done (the ring is free), put
    this CTA's partial of row block rb in shared memory at `base` (the activation ring) as the
    workspace holds it (`partial_vector`, region 0); after the cluster barrier that publishes
    every rank's, sum vectors [rank, rank + 1) x (vectors / CLUSTER) of the CLUSTER partials in
    rank order from 0 (distributed shared memory) and store D as `_reduce_kernel` does; a last
    cluster barrier keeps each partial until its peers have read it."""
    _, out, gsb = dest
    cute.arch.barrier()  # (with the producer warpgroup)
    for j in cutlass.range_constexpr(cfg.TILES):
        for c in cutlass.range_constexpr(cute.size(acc[j].frag) // 4):
            memory.st_shared_v4_f32(base + partial_vector(cfg, 0, j, c, thread) * 16,
                                    [acc[j].frag[4 * c + e] for e in range(4)])
    cluster.cluster_sync()
    cluster.pdl_wait()  # (returns at once: W4A4's decode pass wrote the scale long before)
    scale = output_scale(gsb, cfg.sf)
    threads = cfg.consumers * WG
    per_rank = partial_vectors(cfg) // cfg.CLUSTER
    first = cluster.cta_rank() * per_rank
    for i in cutlass.range(thread, per_rank, threads, unroll=1):
        v = first + i
        total = cluster.sum_ranks_v4_f32(base + v * 16, cfg.CLUSTER)
        src, jc = v % threads, v // threads  # (`partial_vector` inverted)
        j, c = jc // (cfg.N_ACT // 8), jc % (cfg.N_ACT // 8)
        n0 = tile_row(cfg, rb, j, src)
        for e in cutlass.range_constexpr(4):
            r, m = register_a.acc_coord(src % WG, 4 * c + e)
            n = Int64(n0 + spread_row(r))
            if m < M and n < Int64(N):
                _store_d(cfg, out, N, m, n, total[e], scale)
    cluster.cluster_sync()


def _store_d(cfg, out, N, m, n, v, scale):
    """Element (m, n) of D: (0 + its one partial sum v) times the scale, as `_reduce_kernel`
    writes it."""
    memory.st_cvt(out.toint() + (Int64(m) * Int64(N) + n) * out_bytes(cfg),
                  (Float32(0.0) + v) * scale, cfg.out_dtype)


def tile_row(cfg, rb, j, thread):
    """The first weight row of MMA tile j of consumer thread `thread`'s warpgroup (64 TILES
    rows each) in row block rb (its accumulator row r: weight row + `spread_row(r)`)."""
    return rb * cfg.ROWS + (thread // WG) * 64 * cfg.TILES + 64 * j


def partial_vectors(cfg) -> int:
    """16-byte vectors of fp32 partial sums per workspace region (ROWS x N_ACT sums)."""
    return cfg.ROWS * cfg.N_ACT // 4


def partial_vector(cfg, region, j, c, thread):
    """Index of the 16-byte vector of accumulator elements 4c .. 4c + 3 of MMA tile j of
    consumer thread `thread` (0-based over the consumer warpgroups; elements `acc_coord`) in
    workspace region `region`: vector c of tile j of every consumer thread, then the next.
    CTA `cta`'s partial of row block rb is region cta + rb (its stream-K slot,
    `schedule.stream_k_slots`): a block's partials lie in consecutive regions (plain integer
    arithmetic: the host and the kernels use it alike)."""
    return ((region * cfg.TILES + j) * (cfg.N_ACT // 8) + c) * (cfg.consumers * WG) + thread


def partial_bytes(cfg, N: int, ctas: int) -> int:
    """Bytes of the fp32 partials (`partial_vector`): a region of ROWS x N_ACT sums per
    (CTA, row block) slot (`schedule.stream_k_slots`; none with `Config.DIRECT` or
    `Config.CLUSTER`)."""
    if cfg.DIRECT or cfg.CLUSTER > 1:
        return 0
    return 16 * schedule.stream_k_slots(ctas, row_blocks(cfg, N)) * partial_vectors(cfg)


def out_bytes(cfg) -> int:
    """Bytes of one element of D."""
    return 4 if cfg.out_dtype == "float32" else 2


def output_scale(gsb, sf_format: str = "ue4m3"):
    """2^shift (undoing the decode's exact 2^-shift, `fp4.decode_shift`) times the weights'
    global scale gB."""
    return memory.ld_f32(gsb.toint()) * Float32(2.0 ** fp4.decode_shift(sf_format))


# 64 (a thread per 16 of a region's sums: the grid is whole CTAs): a quarter of the CTAs, 256
# threads each, ran 0-13% slower at 16-64 rows on N <= 7168 (H100, docs/facts.md#rs-partials)
REDUCE_THREADS = 64
REDUCE_AHEAD = 4  # partials a reduction thread loads at once (4 vectors of each)
PERMUTE_THREADS = 256


@cute.kernel
def _reduce_kernel(cfg: cutlass.Constexpr, ws: cute.Pointer, gsb: cute.Pointer,
                   out: cute.Pointer, M: Int32, N: Int32, K: Int32, ctas: Int32):
    """D = 2^8 * gB * (sum of the row block's fp32 partials, in CTA order). A thread takes 4
    vectors of each of its row block's regions (`partial_vector`): those of lanes 4(g + 2i) +
    t (i < 4, g < 2) of one consumer warp, whose elements (`acc_coord`) are 4 consecutive
    weight rows (`spread_row`) of activation rows m, m + 1 and of weight rows 8 further; it
    writes them as 4 vectors of 4 elements of D."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    if cutlass.const_expr(cfg.PDL):
        cluster.pdl_launch_dependents()  # the next call's GEMM may start streaming weights
    cluster.pdl_wait()  # launched early (PDL): the partials are complete once this returns
    q = bid * REDUCE_THREADS + tid  # (the grid: exactly the row blocks' vectors / 4)
    per_block = partial_vectors(cfg) // 4
    rb, u = q // per_block, q % per_block
    threads = cfg.consumers * WG
    jc, u = u // (threads // 4), u % (threads // 4)  # (tile, vector c), then warp, g, t
    j, c = jc // (cfg.N_ACT // 8), jc % (cfg.N_ACT // 8)
    thread = (u // 8) * 32 + 4 * ((u % 8) // 4) + u % 4  # lane 4g + t, g < 2; vector i:
    w0 = jc * threads + thread  # that of thread + 8i (lane 4 (g + 2i) + t), at w0 + 8i
    stages = k_stages(cfg, K)
    units = stream_units(cfg, N, K)
    first = schedule.stream_k_owner(rb * stages, ctas, units)
    regions = schedule.stream_k_owner(rb * stages + stages - 1, ctas, units) - first + 1
    total = cute.make_rmem_tensor((16,), Float32)  # vector i, element e: 4 i + e
    for e in cutlass.range_constexpr(16):
        total[e] = Float32(0.0)
    # REDUCE_AHEAD regions' loads in flight at once; a region past the last reads as -0.0
    # (x + -0.0 == x for every x, -0.0 included), so the sum stays the in-order one
    for p0 in cutlass.range(0, regions, REDUCE_AHEAD, unroll=1):
        parts = []
        for p in cutlass.range_constexpr(REDUCE_AHEAD):
            valid = Uint32(p0 + p < regions)
            base = Int64(first + rb + p0 + p) * partial_vectors(cfg) + Int64(w0)
            for i in cutlass.range_constexpr(4):
                parts.append((memory.ld_v4_pred(ws.toint() + (base + 8 * i) * 16, valid),
                              valid, i))
        for part, valid, i in parts:
            for e in cutlass.range_constexpr(4):
                total[4 * i + e] = total[4 * i + e] + fp4.from_bits(
                    part[e] | ((Uint32(1) - valid) << 31))
    scale = output_scale(gsb, cfg.sf)
    n0 = tile_row(cfg, rb, j, thread)
    for e in cutlass.range_constexpr(4):
        # accumulator row r of vector i's element e is r + 2i: weight row spread_row(r) + i
        r, m = register_a.acc_coord(thread % WG, 4 * c + e)
        n = n0 + spread_row(r)
        if m < M and n < N:  # (N % 8 == 0: n .. n + 3 alike)
            addr = out.toint() + (Int64(m) * Int64(N) + Int64(n)) * out_bytes(cfg)
            memory.st_cvt_v4(addr, [total[4 * i + e] * scale for i in range(4)],
                             cfg.out_dtype)


def weight_tensors(w: cute.Pointer, wsf: cute.Pointer, N, K, k_tail: bool = False,
                   n_tail: bool = False):
    """The weights as the global tensors the TMA loads: packed codes (N, K / 2), rows
    `nvfp4_codes.row_pitch(K)` bytes apart (the box past K / 2, and with `n_tail` past row N,
    arrives as zeros), and blocked scales (each 512-byte atom as 2 rows of 256 bytes) of the
    ceil(N / BAND) bands (the blocked layout pads the last one): all bands' atoms as one column
    of rows, or with a K tail one batch of rows per band (its atoms past K then arrive as
    zeros; `scale_coord`)."""
    codes = row_major(w, N, K // 2, pitch=nvfp4_codes.row_pitch(K))
    bands = blocks(N, BAND, n_tail)
    if k_tail:
        rk = (K + nvfp4_scales.ATOM_K - 1) // nvfp4_scales.ATOM_K
        return codes, row_major(wsf, rk * 2, 256, bands)
    return codes, row_major(wsf, bands * (K // nvfp4_scales.ATOM_K) * 2, 256)


def launch_permute(x: cute.Pointer, xp: cute.Pointer, M, K, stream, use_pdl: bool,
                   k_tail: bool = False, rows=None) -> None:
    """Launch `_permute_kernel`: xp = x with every row in the decode's K order, then zero rows
    up to `rows` (default M)."""
    rows = M if rows is None else rows
    _permute_kernel(k_tail, x, xp, M, K, rows).launch(
        grid=[_permute_ctas(k_tail, rows, K), 1, 1], block=[PERMUTE_THREADS, 1, 1],
        stream=stream, use_pdl=use_pdl)


def launch_decode_permute(sf_format: str, xq: cute.Pointer, xsf: cute.Pointer,
                          gsa: cute.Pointer, gsb: cute.Pointer, xp: cute.Pointer, M, K,
                          stream, k_tail: bool = False, rows=None) -> None:
    """Launch `_decode_permute_kernel` (PDL): xp = the NVFP4 activations (codes xq, blocked
    scales xsf) decoded in the decode's K order, zero rows up to `rows` (default M), and D's
    scale after them (`decoded_scale(xp, rows, ...)`)."""
    rows = M if rows is None else rows
    _decode_permute_kernel(sf_format, k_tail, xq, xsf, gsa, gsb, xp, M, K, rows).launch(
        grid=[_permute_ctas(k_tail, rows, K), 1, 1], block=[PERMUTE_THREADS, 1, 1],
        stream=stream, use_pdl=True)


def _permute_ctas(k_tail: bool, M, K):
    return (M * k_blocks(k_tail, K) * 4 + PERMUTE_THREADS - 1) // PERMUTE_THREADS


def _gemm_and_reduce(cfg, w, wsf, xt_ptr, gsb, out, ws, M, N, K, ctas, stream, pdl: bool):
    """The GEMM over activations at `xt_ptr` (permuted: N_ACT rows, those past M zeros,
    `k_blocks` x 128 wide; or natural, M rows, with permute "stage") and the reduction into D
    times `gsb`'s scale."""
    wt, sft = weight_tensors(w, wsf, N, K, cfg.K_TAIL, cfg.N_TAIL)
    if cutlass.const_expr(cfg.permute == "call"):
        xt = row_major(xt_ptr, cfg.N_ACT, permuted_width(K, cfg.K_TAIL))
    else:
        xt = row_major(xt_ptr, M, K)
    _kernel(cfg, gl.load(wt, cfg.weight_tile), gl.load(sft, cfg.scale_tile),
            gl.load(xt, cfg.act_tile), ws, out, gsb, M, N, K).launch(
        grid=[ctas, 1, 1], block=[cfg.threads, 1, 1], stream=stream, use_pdl=pdl,
        cluster=[cfg.CLUSTER, 1, 1] if cfg.CLUSTER > 1 else None,
        min_blocks_per_mp=1)  # (without it ptxas drops setmaxnreg: `ops.warpgroup`)
    if cutlass.const_expr(not cfg.DIRECT and cfg.CLUSTER == 1):
        assert partial_vectors(cfg) // 4 % REDUCE_THREADS == 0  # (whole CTAs per row block)
        _reduce_kernel(cfg, ws, gsb, out, M, N, K, ctas).launch(
            grid=[row_blocks(cfg, N) * (partial_vectors(cfg) // 4 // REDUCE_THREADS), 1, 1],
            block=[REDUCE_THREADS, 1, 1], stream=stream, use_pdl=True,
            min_blocks_per_mp=1)  # (the registers for 4 REDUCE_AHEAD loads in flight)


@cute.jit
def _launch(cfg: cutlass.Constexpr, w: cute.Pointer, wsf: cute.Pointer, x: cute.Pointer,
            xp: cute.Pointer, gsb: cute.Pointer, out: cute.Pointer, ws: cute.Pointer, M: Int32,
            N: Int32, K: Int32, ctas: Int32, stream):
    per_call = cfg.permute == "call"  # (x: the permuted copy xp, which the TMA then reads)
    if cutlass.const_expr(per_call):  # (N_ACT rows: the act tiles' TMA boxes in bounds)
        launch_permute(x, xp, M, K, stream, use_pdl=True, k_tail=cfg.K_TAIL, rows=cfg.N_ACT)
    _gemm_and_reduce(cfg, w, wsf, xp if per_call else x, gsb, out, ws, M, N, K, ctas, stream,
                     per_call or cfg.PDL)


@cute.jit
def _launch_w4a4(cfg: cutlass.Constexpr, w: cute.Pointer, wsf: cute.Pointer, x: cute.Pointer,
                 xsf: cute.Pointer, gsa: cute.Pointer, xp: cute.Pointer, gsb: cute.Pointer,
                 out: cute.Pointer, ws: cute.Pointer, M: Int32, N: Int32, K: Int32, ctas: Int32,
                 stream):
    """W4A4: the activations' decode pass, then the same GEMM; D's scale is the one the pass
    wrote after the decoded activations (xp: N_ACT x `permuted_width(K)` bf16, the rows past M
    zeros, + 16 bytes)."""
    launch_decode_permute(cfg.sf, x, xsf, gsa, gsb, xp, M, K, stream, cfg.K_TAIL, cfg.N_ACT)
    _gemm_and_reduce(cfg, w, wsf, xp,
                     decoded_scale(xp, cfg.N_ACT, permuted_width(K, cfg.K_TAIL)), out, ws, M, N,
                     K, ctas, stream, True)


def decoded_scale(xp: cute.Pointer, M, width) -> cute.Pointer:
    """Where `_decode_permute_kernel` leaves D's scale: the fp32 after the M x `width` decoded
    activations (typed and aligned as W4A16's gsb argument)."""
    return cute.make_ptr(cutlass.Float32, xp.toint() + Int64(M) * Int64(width) * 2,
                         cute.AddressSpace.gmem, assumed_align=4)


# ---------------------------------------------------------------- host


def signature(cfg: Config) -> Signature:
    """The launch's runtime arguments: weights (codes, blocked scales), activations and their
    permuted copy (permute "call"; W4A4: the activations' codes, blocked scales and decode
    scale gA, and a decode buffer of N_ACT x `permuted_width(K)` bf16 + 16 bytes), the weights'
    global decode scale, D (16-byte aligned: the reduction stores 8- or 16-byte vectors), the
    fp32 partials (`partial_bytes`), the shape and the CTA count (the stream-K grid's, or with
    `Config.CLUSTER` `cluster_ctas`)."""
    out_t = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16,
             "float32": cutlass.Float32}[cfg.out_dtype]
    w = (ptr("w", cutlass.Uint8), ptr("wsf", cutlass.Uint8))
    tail = (ptr("gsb", cutlass.Float32, 4), ptr("out", out_t, 4), ptr("ws", cutlass.Float32),
            i32("M"), i32("N"), i32("K"), i32("ctas"))
    if cfg.a_format == "nvfp4":
        return Signature(*w, ptr("x", cutlass.Uint8, 4), ptr("xsf", cutlass.Uint8, 1),
                         ptr("gsa", cutlass.Float32, 4), ptr("xp", cutlass.BFloat16), *tail)
    return Signature(*w, ptr("x", cutlass.BFloat16), ptr("xp", cutlass.BFloat16), *tail)


def compile_launcher(cfg: Config, options: str = ""):
    """The launch for cfg compiled into a raw-pointer `Launcher` (`options`: e.g.
    "--gpu-arch sm_90a" to build without a GPU)."""
    return signature(cfg).compile(launch_fn(cfg), cfg, options=options)


def launch_fn(cfg: Config):
    """The `@cute.jit` launch `signature(cfg)` describes."""
    return _launch_w4a4 if cfg.a_format == "nvfp4" else _launch


def check_shape(cfg: Config, M: int, N: int, K: int) -> None:
    """Raise ValueError naming the first constraint of the kernel that M, N, K or cfg break."""
    if not 1 <= M <= min(MAX_M, cfg.N_ACT):
        raise ValueError(f"the register-A kernel needs 1 <= M <= N_ACT = {cfg.N_ACT} (at most "
                         f"{MAX_M}), got M={M}")
    if N < N_ALIGN or N % N_ALIGN:
        raise ValueError(f"the register-A kernel needs N % {N_ALIGN} == 0 (16-byte rows of D), "
                         f"got N={N}")
    if N % cfg.ROWS and not cfg.N_TAIL:
        raise ValueError(f"N={N} is not a multiple of ROWS = {cfg.ROWS}: the Config needs "
                         f"N_TAIL=True")
    if K % K_ALIGN:
        raise ValueError(f"the register-A kernel needs K to be a multiple of {K_ALIGN} "
                         f"(the scale block), got K={K}")
    if K % STAGE_K and not cfg.K_TAIL:
        raise ValueError(f"K={K} is not a multiple of {STAGE_K}: the Config needs K_TAIL=True")
    if k_stages(cfg, K) < cfg.CLUSTER:
        raise ValueError(f"CLUSTER = {cfg.CLUSTER} CTAs per row block need as many 256-K "
                         f"stages, K={K} has {k_stages(cfg, K)}")


