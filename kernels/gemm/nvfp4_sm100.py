# SPDX-License-Identifier: MIT
"""NVFP4 GEMM for Blackwell (sm_100a, sm_103a) and Rubin (sm_107a) from one source, TK style.

D (M, N, L) bf16|fp16|fp32|NVFP4 = gA gB A (M, K, L) B (N, K, L)^T, NVFP4 operands (rows of
codes `nvfp4_codes.row_pitch(K)` bytes apart), scales 128x4 blocked; gA, gB are read from device
memory (no host sync). Pipeline contract, per CTA of a pair
(warps 0-3 epilogue, 4 MMA, 5 producer, 6 CLC scheduler; rings are `stage_ring`s):
  producer: per K stage `a_ring` finished -> `tma.load_async` A (multicast along N); `bs_ring`
            finished -> B, SFA, SFB; all `arrived` on the LEADER CTA's barrier.
  mma (leader): `acc_ring` finished; per stage both rings arrived -> `load_scales_async` ->
            `mma2_ABt` per K block, M half (Rubin: B collector FILL, LASTUSE) -> finish the
            stages (Rubin: A once read) -> per tile `acc_ring` arrive.
  epilogue: `acc_ring` arrived -> `load_async` EPI_N columns, `tensor_load_wait` -> finish it
            after the last (its stores overlap the next tile's MMAs) -> * gA gB -> smem ->
            `tma.store_async`;
            NVFP4 D (`out="nvfp4"`): per 16 columns of its row a thread's block amax (reducing
            TMEM load on sm_103a / sm_107a), the recipe's scale and codes, direct stores.
  tiles: static persistent supergroup order, or CLC (`schedule`); PDL. Small M (the dispatch's
  cost model decides): `swap_ab` computes D^T (the weights as the MMA's A, D stored through a
  column-major tile) and `SPLIT_K` runs equal runs of K as separate work units writing fp32
  partial D's (batch l * splits + s) that the caller sums. Any M, N, and K % 16
  (the last K stage partly out of bounds: TMA fills codes and scales with zeros); dense D rows
  `d_pitch(N)` apart; N % 16 for NVFP4 D (`tk_cute.nvfp4.dispatch_sm100` checks and picks);
  UE5M3 scales (sf) on sm_107a only; MMA K = 64 (sm_100a,
  sm_103a) or 128 (sm_107a). Peer: CUTLASS CuTeDSL blackwell/kernel/blockscaled_gemm/
dense_blockscaled_gemm_persistent.py (one arch, 3,382 lines with its host harness).
"""


import functools
from dataclasses import dataclass
from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from tk_cute.arch import target
from tk_cute.layouts import nvfp4_codes, nvfp4_scales
from tk_cute.layouts import scales_sm100 as scales
from tk_cute.layouts import tmem as tmem_map
from tk_cute.ops import cluster, epilogue, memory, schedule, tma, warp, warpgroup
from tk_cute.ops import nvfp4 as fp4
from tk_cute.ops import tcgen05 as tc
from tk_cute.types import Shared, coord, gl, st, st_mma, stage_ring, sv
from tk_cute.types import tt as tmem
from tk_cute.types.gl import col_major, row_major
from tk_cute.types.semaphore import NamedBarrier
from tk_cute.types.struct import DeviceStruct


OUT_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16,
             "float32": cutlass.Float32,
             "nvfp4": cutlass.Uint8}  # nvfp4: D's packed E2M1 codes (scales: a second pointer)


def d_pitch(n, out: str):
    """Elements from one row of a dense D to the next: N rounded up to 16 bytes (the TMA
    store's stride granularity); the dispatch gives D rows that far apart. Plain integer
    arithmetic (device values in the kernel, ints on the host)."""
    per = 16 * 8 // OUT_TYPES[out].width
    return (n + per - 1) // per * per


class ConfigError(ValueError):
    """A configuration this kernel cannot run."""


class SmemBudgetError(ConfigError):
    """The stages need more shared memory than one block of the target may use."""


class TmemBudgetError(ConfigError):
    """Accumulators plus scale columns exceed the target's tensor memory."""


@dataclass(frozen=True)
class Config:
    """Tile, pipeline and cluster choice; `__post_init__` checks it against the target."""

    arch: str = "sm_107a"
    Mb: int = 512  # output rows per CTA pair: 256 = one MMA, 512 = two MMAs sharing B
    Nb: int = 256
    Kb: int = 256  # FP4 elements of K per stage
    LOAD_PIPE_DEPTH: int = 5
    ACC_PIPE_DEPTH: int = 1
    EPI_PIPE_DEPTH: int = 2
    EPI_N: int = 32  # accumulator columns per epilogue step
    CLUSTER_M: int = 2  # CTAs along M (a multiple of the pair)
    CLUSTER_N: int = 1  # pairs along N share A through TMA multicast
    SUPERGROUP_SIZE: int = 8
    sf: str = "ue4m3"
    out: str = "bfloat16"  # D's type (OUT_TYPES; "nvfp4": codes + blocked UE4M3 scales)
    scheduler: str = schedule.STATIC  # or schedule.CLC: cluster launch control (work stealing)
    swap_ab: bool = False  # the call's B (weights) is the MMA's A: D^T computed, D stored
    # transposed (small M: the weights fill the 256-row MMA; dense D only)
    SPLIT_K: int = 1  # > 1: K in runs (`k_splits`), partial D's in fp32, summed by the caller

    def __post_init__(self):
        t = target(self.arch)
        if not t.fp4_tensor_cores or t.tmem_columns == 0:
            raise ConfigError(f"{self.arch} has no tcgen05 block-scaled MMA")
        if self.Mb not in (256, 512) or self.Nb not in (128, 256):
            raise ConfigError(f"tile {self.Mb}x{self.Nb}: Mb in (256, 512), Nb in (128, 256)")
        if self.Kb % 64 or self.Kb % self.mma_k:
            raise ConfigError(f"Kb={self.Kb} must hold whole MMAs (K={self.mma_k}) and atoms")
        if self.sf not in tc.SCALE_TYPES:
            raise ConfigError(f"scale type {self.sf!r} not in {list(tc.SCALE_TYPES)}")
        if self.sf == "ue5m3" and not t.ue5m3_scales:
            raise ConfigError(f"UE5M3 block scales (sf='ue5m3') need Rubin's block-scaled MMA "
                              f"(sm_107a, arch.Target.ue5m3_scales); {self.arch} takes ue4m3")
        if self.out not in OUT_TYPES or self.scheduler not in schedule.KINDS:
            raise ConfigError(f"out={self.out!r} not in {list(OUT_TYPES)} or scheduler="
                              f"{self.scheduler!r} not in {schedule.KINDS}")
        if self.SPLIT_K < 1 or (self.SPLIT_K > 1 and self.nvfp4_out):
            raise ConfigError(f"SPLIT_K={self.SPLIT_K}: at least 1, and 1 for NVFP4 D (its "
                              f"blocks are quantized from the whole sum)")
        if self.nvfp4_out and self.swap_ab:
            raise ConfigError("NVFP4 D quantizes along D's rows, which a swapped (D^T) "
                              "accumulator holds across threads: swap_ab needs a dense out")
        if self.EPI_N % 16 or self.Nb % self.EPI_N:
            raise ConfigError(f"EPI_N={self.EPI_N}: a multiple of 16 dividing Nb={self.Nb}")
        if self.nvfp4_out and self.EPI_N % epilogue.NVFP4_BLOCK:
            raise ConfigError(f"NVFP4 D quantizes 16-column blocks: EPI_N={self.EPI_N} must be a "
                              f"multiple of {epilogue.NVFP4_BLOCK}")
        if self.CLUSTER_M % 2 or self.CLUSTER_M * self.CLUSTER_N > 16:
            raise ConfigError(f"cluster {self.CLUSTER_M}x{self.CLUSTER_N}: M even, size <= 16")
        if self.tmem_columns_used > t.tmem_columns:
            raise TmemBudgetError(
                f"{self.tmem_columns_used} TMEM columns > {t.tmem_columns} on {self.arch}")
        if self.smem_bytes > t.smem_bytes:
            raise SmemBudgetError(f"{self.smem_bytes} B shared memory > {t.smem_bytes} "
                                  f"on {self.arch}; lower LOAD_PIPE_DEPTH")

    # --- derived -----------------------------------------------------------------------
    @property
    def d_type(self) -> str:
        """What the kernel writes: `out`, or fp32 partial sums when K is split."""
        return "float32" if self.SPLIT_K > 1 else self.out

    @property
    def nvfp4_out(self) -> bool:
        """D quantized to NVFP4 in the epilogue (codes and scales stored from registers)."""
        return self.out == "nvfp4"

    @property
    def mma_k(self) -> int:
        return target(self.arch).nvfp4_mma_k

    @property
    def m_mmas(self) -> int:
        return self.Mb // 256

    @property
    def k_blocks(self) -> int:
        return self.Kb // self.mma_k

    @property
    def early_a_release(self) -> bool:
        """The A stage freed once its MMAs have read it (`Target.early_a_release`)."""
        return target(self.arch).early_a_release

    @property
    def b_reuse(self) -> bool:
        """Two M halves share B through the Rubin B collector (FILL -> LASTUSE)."""
        return target(self.arch).b_collector and self.m_mmas == 2

    @property
    def tmem(self) -> dict[str, tmem.tt]:
        return tmem_map.nvfp4_columns(self.Mb // 2, self.Nb, self.Kb, self.m_mmas,
                                      self.ACC_PIPE_DEPTH)

    @property
    def tmem_columns_used(self) -> int:
        return max(r.end for r in self.tmem.values())

    @property
    def stage_bytes(self) -> dict[str, int]:
        """Shared bytes one stage holds in each CTA, per operand."""
        m, k = self.Mb // 2, self.Kb
        return {"A": m * k // 2, "B": self.Nb // 2 * k // 2, "SFA": m * k // 16,
                "SFB": -(-self.Nb // 128) * 128 * k // 16}

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: 1 KiB of barriers, then each 1 KiB-aligned buffer (an NVFP4
        D has no staging buffers: its codes and scales go from registers to global memory)."""
        per = self.stage_bytes
        bufs = [v * self.LOAD_PIPE_DEPTH for v in per.values()]
        if not self.nvfp4_out:
            bufs.append(128 * self.EPI_N * OUT_TYPES[self.d_type].width // 8
                        * self.EPI_PIPE_DEPTH)
        return 1024 + sum(-(-b // 1024) * 1024 for b in bufs)


class Globals(DeviceStruct):
    """The kernel's global layouts (TK `globals`): `gl`s of A, B, SFA, SFB (TMA loads), D (TMA
    store), and pointers to the two fp32 global scales."""

    _fields = ("A", "B", "SFA", "SFB", "D", "ga", "gb")

    def __init__(self, A: gl, B: gl, SFA: gl, SFB: gl, D: gl, ga, gb):
        self.A, self.B, self.SFA, self.SFB, self.D, self.ga, self.gb = A, B, SFA, SFB, D, ga, gb


class GlobalsNvfp4(Globals):
    """`Globals` of an NVFP4 D: D is a pointer to its codes; `d_sf` to its blocked scales,
    `d_gs` to its fp32 decode scale, `flag` to the Int32 saturation flag; D's shape m, n."""

    _fields = Globals._fields + ("d_sf", "d_gs", "flag", "m", "n")

    def __init__(self, A, B, SFA, SFB, D, ga, gb, d_sf, d_gs, flag, m, n):
        super().__init__(A, B, SFA, SFB, D, ga, gb)
        self.d_sf, self.d_gs, self.flag, self.m, self.n = d_sf, d_gs, flag, m, n


class GemmNvfp4Sm100:
    """The kernel for one `Config`; `__call__` is the `@cute.jit` host launch."""

    EPI_WARPS, MMA_WARP, LOAD_WARP, SCHED_WARP = (0, 1, 2, 3), 4, 5, 6
    WALKERS = 6  # warps per CTA that walk the tiles (all but the CLC scheduler warp)

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.sf_dtype = tc.SCALE_TYPES[cfg.sf]
        self.out_dtype = OUT_TYPES[cfg.d_type]
        self.threads = 32 * (self.WALKERS + (cfg.scheduler == schedule.CLC))
        self.traced = {}  # what tracing computed from the kernel's layouts (tests read it)

    # --- globals: the MMA and the tile types (MMA objects exist only while tracing) ------------
    def _globals(self):
        cfg, fp4 = self.cfg, cutlass.Float4E2M1FN
        self.tiler = (cfg.Mb, cfg.Nb, cfg.Kb)
        self.mma = tc.block_scaled_mma(cfg.arch, cfg.Nb, self.sf_dtype, cfg.b_reuse)
        # before any MMA: issuing one changes the tiled MMA's (accumulate) state
        self.acc_layout = self.mma.accumulator(self.tiler[:2], cfg.ACC_PIPE_DEPTH)
        # one stage of one CTA; scales keep the K = 64 atom structure on every target
        self.inputs = {"A": st_mma.A(fp4, self.mma.op, self.tiler),
                      "B": st_mma.B(fp4, self.mma.op, self.tiler),
                      "SFA": st_mma.SFA(self.sf_dtype, self.tiler),
                      "SFB": st_mma.SFB(self.sf_dtype, self.tiler)}
        self.d_tile = None if cfg.nvfp4_out else st(self.out_dtype, 128, cfg.EPI_N,
                                                    col_major=cfg.swap_ab)

    def _shared(self, vmnk):
        """Shared memory (1 KiB of barriers first, then each 1 KiB-aligned buffer), the rings
        over it (`a_ring`: A; `bs_ring`: B, SFA, SFB; `acc_ring`: accumulators), the CLC
        response and the TMEM allocator."""
        cfg, S, smem = self.cfg, self.cfg.LOAD_PIPE_DEPTH, Shared()
        cs = (cfg.CLUSTER_M, cfg.CLUSTER_N)
        stage = {k: t.layout_bytes() * 2 for k, t in self.inputs.items()}  # lands on the leader
        a_bytes, bs_bytes = stage["A"], stage["B"] + stage["SFA"] + stage["SFB"]
        rings = (stage_ring.tma_to_mma(smem.barriers(2 * S), S, a_bytes,
                                       cluster.multicast_ctas(cs, "A"), vmnk, (1, 0)),
                 stage_ring.tma_to_mma(smem.barriers(2 * S), S, bs_bytes,
                                       cluster.multicast_ctas(cs, "A", "B"), vmnk, (1, 1)),
                 stage_ring.mma_to_threads(smem.barriers(2 * cfg.ACC_PIPE_DEPTH),
                                           cfg.ACC_PIPE_DEPTH, 32 * len(self.EPI_WARPS), vmnk))
        clc = (smem.barriers(2), smem.alloc(sv(cutlass.Int32, 4)).iterator) if (
            cfg.scheduler == schedule.CLC) else (None, None)
        dealloc, holding = smem.barriers(1), smem.alloc(sv(cutlass.Int32, 1)).iterator
        d = None if cfg.nvfp4_out else smem.alloc(self.d_tile, cfg.EPI_PIPE_DEPTH)
        bufs = SimpleNamespace(D=d, **{k: smem.alloc(t, S) for k, t in self.inputs.items()})
        alloc = tmem.tensor_allocator(
            holding, tmem.alloc_columns(cfg.tmem_columns_used, cfg.arch), cfg.arch, True,
            (NamedBarrier.TMEM_ALLOC, 32 * 5), self.EPI_WARPS[0], dealloc)
        self.traced.update(smem_bytes=-(-smem.bytes // 1024) * 1024, a_stage_bytes=a_bytes,
                           bs_stage_bytes=bs_bytes)
        return bufs, rings, clc, alloc

    # --- host launch ---------------------------------------------------------------------
    @cute.jit
    def __call__(self, max_active_clusters: cutlass.Constexpr, a_ptr: cute.Pointer,
                 b_ptr: cute.Pointer, sfa_ptr: cute.Pointer, sfb_ptr: cute.Pointer,
                 d_ptr: cute.Pointer, ga_ptr: cute.Pointer, gb_ptr: cute.Pointer,
                 d_sf_ptr: cute.Pointer, d_gs_ptr: cute.Pointer, flag_ptr: cute.Pointer,
                 m: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32, l: cutlass.Int32,
                 splits: cutlass.Int32, stream: cuda.CUstream):
        """D (m, n, l) = gA gB A (m, k, l) B (n, k, l)^T; gA, gB: pointers to fp32 scalars.
        NVFP4 D: d_ptr its codes, d_sf_ptr its blocked scales, d_gs_ptr its fp32 decode scale,
        flag_ptr an Int32 that saturated block scales OR with 1 (dense D ignores the three).
        `splits` > 1 (split K, dense D): K's stages in `splits` equal runs (`schedule.k_split`,
        none empty: the caller's choice), run s of batch l writes its partial D, already times
        gA gB, as batch l * splits + s. `swap_ab`: D is stored transposed, (n, m, l) row-major,
        rows `d_pitch(m)` apart."""
        cfg, cs = self.cfg, (self.cfg.CLUSTER_M, self.cfg.CLUSTER_N)
        self._globals()
        ka = cute.assume(k, 16)
        pitch = cute.assume(nvfp4_codes.row_pitch(k) * 2, 32)  # FP4 elements: 16-byte rows
        mA, mB = row_major(a_ptr, m, ka, l, pitch), row_major(b_ptr, n, ka, l, pitch)
        mem = {"A": mA, "B": mB, "SFA": scales.global_tensor(sfa_ptr, mA.shape),
               "SFB": scales.global_tensor(sfb_ptr, mB.shape)}
        loads = [tma.pair_gl(mem[k], t, cs) for k, t in self.inputs.items()]
        if cutlass.const_expr(cfg.nvfp4_out):
            g = GlobalsNvfp4(*loads, d_ptr, ga_ptr, gb_ptr, d_sf_ptr, d_gs_ptr, flag_ptr, m, n)
        else:
            per = 128 // self.out_dtype.width
            if cutlass.const_expr(cfg.swap_ab):
                mD = col_major(d_ptr, m, n, l * splits, cute.assume(d_pitch(m, cfg.d_type),
                                                                    per))
            else:
                mD = row_major(d_ptr, m, n, l * splits, cute.assume(d_pitch(n, cfg.d_type),
                                                                    per))
            g = Globals(*loads, gl.store(mD, self.d_tile), ga_ptr, gb_ptr)
        tiles = (cute.ceil_div(m, cfg.Mb // 2), cute.ceil_div(n, cfg.Nb), l * splits)
        sched = schedule.params(cfg.scheduler, tiles, (*cs, 1), cfg.SUPERGROUP_SIZE)
        self.kernel(g, sched, splits).launch(
            grid=schedule.grid(cfg.scheduler, sched, max_active_clusters),
            block=[self.threads, 1, 1], cluster=(*cs, 1), stream=stream, min_blocks_per_mp=1,
            use_pdl=True)

    # --- the kernel: setup, then one method per warp role ------------------------------
    @cute.kernel
    def kernel(self, g: Globals, sched: schedule.Params, splits: cutlass.Int32):
        cfg, cs = self.cfg, (self.cfg.CLUSTER_M, self.cfg.CLUSTER_N)
        self._globals()  # layouts and MMAs are static: rebuild them inside the kernel region
        vmnk = g.A.cluster_layout()
        w = warp.warpid()
        if w == self.LOAD_WARP:
            for d in (g.A, g.B, g.SFA, g.SFB) + (() if cfg.nvfp4_out else (g.D,)):
                d.prefetch()
        smem, (a_ring, bs_ring, acc_ring), clc, alloc = self._shared(vmnk)
        walk = schedule.walk(cfg.scheduler, sched, *clc, vmnk, self.WALKERS)
        cluster.cluster_arrive(cs)
        cluster.cluster_wait(cs)
        cluster.pdl_wait()
        if w == self.LOAD_WARP:
            self.producer_load(g, smem, a_ring, bs_ring, walk, splits)
        if w == self.MMA_WARP:
            self.mma_issue(g, smem, a_ring, bs_ring, acc_ring, alloc, walk, splits)
        if w < self.MMA_WARP:
            if cutlass.const_expr(cfg.nvfp4_out):
                self.consumer_finish_nvfp4(g, acc_ring, alloc, walk)
            else:
                self.consumer_finish(g, smem, acc_ring, alloc, walk)
        if cutlass.const_expr(cfg.scheduler == schedule.CLC):
            if w == self.SCHED_WARP and cluster.cta_rank() == 0:
                schedule.clc_steal(schedule.Tiles.create(*walk))

    @cute.jit
    def producer_load(self, g, smem, a_ring, bs_ring, walk, splits):
        """Producer warp: wait `a_ring` / `bs_ring` finished; TMA A (multicast along N), then B,
        SFA, SFB onto the stage's `arrived` barrier (the leader's, expecting both CTAs' bytes)."""
        src = {k: tma.source(getattr(g, k)) for k in self.inputs}  # this CTA's partitions
        k_tiles = g.A.num_tiles(1)
        a, bs = a_ring.producer(), bs_ring.producer()
        tiles = schedule.Tiles.create(*walk)
        work = tiles.first()
        while work.is_valid_tile:
            m, n = work.tile_idx[0] // 2, work.tile_idx[1]
            l, k0, k1 = schedule.k_split(work.tile_idx[2], splits, k_tiles)
            for kt in cutlass.range(k0, k1, unroll=1):
                a_ring.wait_finished(a)
                tma.load_async(smem.A[None, None, None, a.index], src["A"], coord(m, kt, l),
                               a_ring.arrived(a))
                a.advance()
                bs_ring.wait_finished(bs)
                s, sem = bs.index, bs_ring.arrived(bs)
                tma.load_async(smem.B[None, None, None, s], src["B"], coord(n, kt, l), sem)
                tma.load_async(smem.SFA[None, None, None, s], src["SFA"], coord(m, kt, l), sem)
                tma.load_async(smem.SFB[None, None, None, s], src["SFB"], coord(n, kt, l), sem)
                bs.advance()
            work = tiles.next()
        a_ring.drain(a)
        bs_ring.drain(bs)

    @cute.jit
    def mma_issue(self, g, smem, a_ring, bs_ring, acc_ring, alloc, walk, splits):
        """MMA warp (the leader CTA issues): wait `acc_ring` finished, per stage `a_ring` and
        `bs_ring` arrived; tcgen05.cp the scales, mma2_ABt per K block and M half; finish both
        stages (Rubin: A once read), arrive `acc_ring` per tile."""
        cfg, t = self.cfg, self.inputs
        tm = alloc.wait()
        acc = tm.tt(cfg.tmem["acc"], self.acc_layout)
        sfa = tm.tt(cfg.tmem["SFA"], t["SFA"].tmem_layout(), self.sf_dtype)
        sfb = tm.tt(cfg.tmem["SFB"], t["SFB"].tmem_layout(), self.sf_dtype)
        sfa_in, sfb_in = tc.scale_copy(smem.SFA, sfa), tc.scale_copy(smem.SFB, sfb)
        A, B = self.mma.operands(smem.A, smem.B)
        c = cfg.mma_k // 64  # scale atoms one MMA reads
        k_tiles = g.A.num_tiles(1)
        atoms = [self.mma.atom(mh) for mh in range(cfg.m_mmas)]
        a, bs, out = a_ring.consumer(), bs_ring.consumer(), acc_ring.producer()
        tiles = schedule.Tiles.create(*walk)
        work = tiles.first()
        while work.is_valid_tile:
            if cluster.is_leader_cta():
                _, k0, k1 = schedule.k_split(work.tile_idx[2], splits, k_tiles)
                acc_ring.wait_finished(out)
                for kt in cutlass.range(k0, k1, unroll=1):
                    a_ring.wait_arrived(a)
                    bs_ring.wait_arrived(bs)
                    tc.load_scales_async(sfa_in, bs.index)
                    tc.load_scales_async(sfb_in, bs.index)
                    for kb in cutlass.range_constexpr(cfg.k_blocks):
                        for mh in cutlass.range_constexpr(cfg.m_mmas):
                            tc.mma2_ABt(atoms[mh], acc[None, mh, 0, out.index],
                                        A[None, mh, kb, a.index], B[None, 0, kb, bs.index],
                                        sfa[None, mh, kb * c], sfb[None, 0, kb * c],
                                        accumulate=(kt - k0 + kb) != 0)
                    tc.release_stage(a_ring, a, a_only=cfg.early_a_release)
                    bs_ring.finish(bs)
                    a.advance()
                    bs.advance()
                acc_ring.arrive(out)
            out.advance()
            work = tiles.next()
        acc_ring.drain(out)

    @cute.jit
    def consumer_finish(self, g, smem, acc_ring, alloc, walk):
        """Epilogue warps: wait `acc_ring` arrived; tcgen05.ld, `tensor_load_wait` -> * gA gB ->
        out dtype -> smem -> TMA store; finish the accumulator once read (its stores overlap the
        next tile's MMAs)."""
        cfg = self.cfg
        alloc.allocate()
        tm = alloc.wait()
        acc = tm.tt(cfg.tmem["acc"], self.acc_layout)
        d = epilogue.tmem_store(acc, smem.D, self.d_tile, cute.arch.thread_idx()[0])
        epi = warpgroup.sync(NamedBarrier.EPILOGUE, 1)
        alpha = epilogue.global_scale(g.ga, g.gb)
        full = acc_ring.consumer()
        steps = cfg.Nb // cfg.EPI_N
        buf = cutlass.Int32(0)
        tiles = schedule.Tiles.create(*walk)
        work = tiles.first()
        while work.is_valid_tile:
            n, l = work.tile_idx[1] * steps, work.tile_idx[2]
            acc_ring.wait_arrived(full)
            for mh in cutlass.range_constexpr(cfg.m_mmas):
                for j in cutlass.range(steps, unroll=1):
                    epilogue.load_async(d, full.index, mh, j)
                    tc.tensor_load_wait()  # the loads done and fenced: columns may go back
                    if cutlass.const_expr(mh == cfg.m_mmas - 1):
                        if j == steps - 1:  # accumulator read: the next tile's MMAs may start
                            acc_ring.finish(full)
                    at = coord(d_row_tile(work.tile_idx[0], mh, cfg.m_mmas), n + j, l)
                    epilogue.store_block(d, alpha, buf, g.D, at, epi, self.EPI_WARPS[0],
                                         cfg.EPI_PIPE_DEPTH)
                    buf = (buf + 1) % cfg.EPI_PIPE_DEPTH
            full.advance()
            work = tiles.next()
        cluster.pdl_launch_dependents()
        alloc.deallocate(tm, epi)
        tma.store_async_read_wait(0)


    @cute.jit
    def consumer_finish_nvfp4(self, g, acc_ring, alloc, walk):
        """Epilogue warps, NVFP4 D: wait `acc_ring` arrived; per EPI_N columns `load_amax_async`
        (thread t: row t of the 128), finish the accumulator after the last; per 16 columns
        the recipe with D's decode scale, codes and scale bytes stored at `nvfp4_out_store`
        (`epilogue.store_nvfp4`); a saturated scale ORs `flag`."""
        cfg = self.cfg
        alloc.allocate()
        tm = alloc.wait()
        acc = tm.tt(cfg.tmem["acc"], self.acc_layout)
        tidx = cute.arch.thread_idx()[0]
        e = epilogue.tmem_quantize(acc, (128, cfg.EPI_N), tidx, target(cfg.arch).tmem_load_reduce)
        epi = warpgroup.sync(NamedBarrier.EPILOGUE, 1)
        alpha = epilogue.global_scale(g.ga, g.gb)
        s_dec = memory.ld_f32(g.d_gs.toint())
        s_enc_g = fp4.div_rn(cutlass.Float32(1.0), s_dec)
        full = acc_ring.consumer()
        steps = cfg.Nb // cfg.EPI_N
        saturated = cutlass.Uint32(0)
        tiles = schedule.Tiles.create(*walk)
        work = tiles.first()
        while work.is_valid_tile:
            n0, l = work.tile_idx[1] * cfg.Nb, cutlass.Int64(work.tile_idx[2])
            acc_ring.wait_arrived(full)
            for mh in cutlass.range_constexpr(cfg.m_mmas):
                row = cutlass.Int64(d_row_tile(work.tile_idx[0], mh, cfg.m_mmas) * 128 + tidx)
                where = functools.partial(nvfp4_out_store, l, row, m=g.m, n=g.n)
                for j in cutlass.range(steps, unroll=1):
                    epilogue.load_amax_async(e, full.index, mh, j)
                    tc.tensor_load_wait()  # the loads done and fenced: columns may go back
                    if cutlass.const_expr(mh == cfg.m_mmas - 1):
                        if j == steps - 1:  # accumulator read: the next tile's MMAs may start
                            acc_ring.finish(full)
                    saturated = saturated | epilogue.store_nvfp4(
                        e, n0 + j * cfg.EPI_N, where, g.D.toint(), g.d_sf.toint(), alpha, s_dec,
                        s_enc_g, cfg.arch)
            full.advance()
            work = tiles.next()
        warp.flag_if_any(g.flag, saturated)
        cluster.pdl_launch_dependents()
        alloc.deallocate(tm, epi)


def d_row_tile(cta_tile_m, mh, m_mmas: int):
    """The 128-row tile of D that M half `mh` of CTA tile `cta_tile_m` (2 per pair: the pair's
    tile, then the CTA) writes: a 2-CTA MMA gives CTA v rows v*128.. of each 256 it computes."""
    return cta_tile_m // 2 * 2 * m_mmas + 2 * mh + cta_tile_m % 2


def nvfp4_out_store(l, row, col, m, n):
    """Where the epilogue stores the NVFP4 block of D (m, n) at batch l, row `row`, columns
    col .. col + 15 (col % 16 == 0): (codes byte, codes in D, scale byte, scale in the blocked
    tensor). Codes are row-major, rows `nvfp4_codes.row_pitch(n)` bytes apart (n / 2, padded
    to 16 bytes), 8 bytes a block; the scale byte is
    `nvfp4_scales` blocked (rows past m up to the 128-row band and scale columns past n / 16 up
    to the 4-column atom are padding: written, as zeros, since TMA zero-filled their operands).
    Plain integer arithmetic: the kernel evaluates it on device integers, the tests on ints."""
    rm, rk = (m + 127) // 128, (n + 63) // 64
    sf = l * (rm * rk * nvfp4_scales.ATOM_BYTES) + nvfp4_scales.band_offset(row, col // 16, rk)
    return ((l * m + row) * nvfp4_codes.row_pitch(n) + col // 2, (row < m) & (col < n), sf,
            (row < rm * 128) & (col < rk * 64))


# --- launch arguments and fake-pointer compile (no GPU needed) ----------------------------
# `launch_args` positions: the cluster budget (a Constexpr), the pointers, the sizes, the stream
CLUSTERS, POINTERS, SIZES = 0, slice(1, 11), slice(11, 16)
SWAPPED = {"a": "b", "b": "a", "sfa": "sfb", "sfb": "sfa", "ga": "gb", "gb": "ga"}


def k_splits(cfg: Config, k: int) -> int:
    """The split count a call of K = `k` runs: `cfg.SPLIT_K`, fewer where K has fewer stages
    (`schedule.k_split_count`: no run empty)."""
    return schedule.k_split_count(cfg.SPLIT_K, -(-k // cfg.Kb))


def signature(cfg: Config):
    """`GemmNvfp4Sm100.__call__`'s runtime arguments (after the Constexpr cluster budget), as a
    `launcher.Signature`: the ten pointers (element type, alignment), then m, n, k, l, splits."""
    from tk_cute.launcher import Signature, i32, ptr

    sf = tc.SCALE_TYPES[cfg.sf]
    return Signature(ptr("a", cutlass.Float4E2M1FN, 32), ptr("b", cutlass.Float4E2M1FN, 32),
                     ptr("sfa", sf), ptr("sfb", sf), ptr("d", OUT_TYPES[cfg.d_type]),
                     ptr("ga", cutlass.Float32, 4), ptr("gb", cutlass.Float32, 4),
                     ptr("d_sf", cutlass.Uint8), ptr("d_gs", cutlass.Float32, 4),
                     ptr("flag", cutlass.Int32, 4), i32("m"), i32("n"), i32("k"), i32("l"),
                     i32("splits"))


def launch_values(cfg: Config, addr: dict, m: int, n: int, k: int, l: int = 1) -> dict:
    """The `signature` values of a call from device addresses (keys a, b, sfa, sfb, d, ga, gb,
    and for an NVFP4 D d_sf, d_gs, flag: where missing, d's address, unused) and the call's
    sizes (D is m x n); `cfg.swap_ab`: a and b trade places, as do m and n. Split K
    (`cfg.SPLIT_K` > 1): d holds l * `k_splits(cfg, k)` fp32 partial D's (m x n, rows
    `d_pitch(n, "float32")` apart; `schedule.k_split`). The torch entry
    (`tk_cute.nvfp4.dispatch_sm100`) and `compile` share it."""
    addr = {"d_sf": addr["d"], "d_gs": addr["d"], "flag": addr["d"], **addr}
    if cfg.swap_ab:
        addr, m, n = {SWAPPED.get(key, key): v for key, v in addr.items()}, n, m
    return {**addr, "m": m, "n": n, "k": k, "l": l, "splits": k_splits(cfg, k)}


def default_clusters(cfg: Config) -> int:
    """The persistent grid's cluster budget on the whole of `cfg.arch`'s SMs."""
    return (target(cfg.arch).sm_count or 148) // (cfg.CLUSTER_M * cfg.CLUSTER_N)


def launch_args(cfg: Config, addr: dict, m: int, n: int, k: int, l: int = 1,
                max_active_clusters: int | None = None, stream=None) -> tuple:
    """`GemmNvfp4Sm100.__call__` arguments as DSL objects (`launch_values`' values; what
    `compile` and the emulator's host capture take): the cluster budget (default
    `default_clusters`), the pointers and sizes, the stream (default the null stream)."""
    values = {**launch_values(cfg, addr, m, n, k, l), "stream": int(stream or 0)}
    return (max_active_clusters or default_clusters(cfg), *signature(cfg).dsl_values(values))


def compile(cfg: Config, m: int = 8192, n: int = 8192, k: int = 8192,
            max_active_clusters: int | None = None):
    """Build the kernel for `cfg.arch` from fake pointers: (`tk_cute.compile.Build`, kernel)."""
    from tk_cute.compile import build

    kern = GemmNvfp4Sm100(cfg)
    addr = dict.fromkeys(("a", "b", "sfa", "sfb", "d", "ga", "gb"), 0)
    return build(kern, *launch_args(cfg, addr, m, n, k, 1, max_active_clusters),
                 arch=cfg.arch), kern
