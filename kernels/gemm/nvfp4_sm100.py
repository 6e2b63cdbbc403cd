# SPDX-License-Identifier: MIT
"""NVFP4 GEMM for Blackwell (sm_100a, sm_103a) and Rubin (sm_107a) from one source, TK style.

D (M, N, L) bf16|fp16 = gA gB A (M, K, L) B (N, K, L)^T, NVFP4 operands, scales 128x4 blocked;
gA, gB are read from device memory (no host sync). Pipeline contract, per CTA of a pair
(warps 0-3 epilogue, 4 MMA, 5 producer, 6 CLC scheduler):
  producer: per K stage acquire `a_ring` -> TMA A (multicast along N); acquire `bs_ring` ->
            TMA B, SFA, SFB; both complete on the LEADER CTA's full barriers (expect_bytes).
  mma (leader CTA): wait both rings -> tcgen05.cp scales to TMEM -> per K block, M half:
            mma2_ABt (Rubin: B collector FILL then LASTUSE) -> commit A (Rubin: early, once read
            `sync_restrict::shared::read::mma::a`), B/scales, multicast to the pair -> per tile
            commit `acc_ring` full.
  epilogue: wait acc full -> tcgen05.ld EPI_N columns -> release acc after the last (its TMA
            stores overlap the next tile's MMAs) -> * gA gB -> smem -> TMA store.
  tiles: static persistent supergroup order, or CLC (scheduler warp try_cancel -> `clc_ring`
            response -> every role's next tile); PDL. Constraints: K % Kb, N % 8 (checked by
            `tk_cute.nvfp4.dispatch_sm100`, which also picks the Config). MMA K = 64 (sm_100a/103a)
            or 128 (sm_107a). Peer: CUTLASS CuTeDSL blackwell/kernel/blockscaled_gemm/
dense_blockscaled_gemm_persistent.py (one arch, 3,382 lines with its host harness).
"""


from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from tk_cute.arch import target
from tk_cute.ops import cluster, epilogue, schedule
from tk_cute.ops import tcgen05 as tc
from tk_cute.layouts import scales_sm100 as scales
from tk_cute.layouts import tmem as tmem_map
from tk_cute.types import tt as tmem
from tk_cute.types.semaphore import NamedBarrier


OUT_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


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
    out: str = "bfloat16"  # D's type (OUT_TYPES)
    scheduler: str = schedule.STATIC  # or schedule.CLC: cluster launch control (work stealing)
    early_release_a: bool = True  # Rubin only

    def __post_init__(self):
        t = target(self.arch)
        if not t.fp4_tensor_cores or t.tmem_columns == 0:
            raise ConfigError(f"{self.arch} has no tcgen05 block-scaled MMA")
        if self.Mb not in (256, 512) or self.Nb not in (128, 256):
            raise ConfigError(f"tile {self.Mb}x{self.Nb}: Mb in (256, 512), Nb in (128, 256)")
        if self.Kb % 64 or self.Kb % self.mma_k:
            raise ConfigError(f"Kb={self.Kb} must hold whole MMAs (K={self.mma_k}) and atoms")
        if self.sf not in tc.SCALE_TYPES or (self.sf == "ue5m3" and not t.ue5m3_scales):
            raise ConfigError(f"scale type {self.sf} not supported on {self.arch}")
        if self.out not in OUT_TYPES or self.scheduler not in schedule.KINDS:
            raise ConfigError(f"out={self.out!r} not in {list(OUT_TYPES)} or scheduler="
                              f"{self.scheduler!r} not in {schedule.KINDS}")
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
    def rubin(self) -> bool:
        """Rubin's ISA (B collector, early A release, UE5M3, K = 128 MMAs, 576 columns)."""
        return target(self.arch).b_collector

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
    def b_reuse(self) -> bool:
        """Two M halves share B through the Rubin B collector (FILL -> LASTUSE)."""
        return self.rubin and self.m_mmas == 2

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
        """Dynamic shared memory: 1 KiB of barriers, then each 1 KiB-aligned buffer."""
        per = self.stage_bytes
        bufs = [v * self.LOAD_PIPE_DEPTH for v in per.values()]
        bufs.append(128 * self.EPI_N * 2 * self.EPI_PIPE_DEPTH)
        return 1024 + sum(-(-b // 1024) * 1024 for b in bufs)


class GemmNvfp4Sm100:
    """The kernel for one `Config`; `__call__` is the `@cute.jit` host launch."""

    EPI_WARPS, MMA_WARP, LOAD_WARP, SCHED_WARP = (0, 1, 2, 3), 4, 5, 6
    WALKERS = 6  # warps per CTA that walk the tiles (all but the CLC scheduler warp)

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.sf_dtype = tc.SCALE_TYPES[cfg.sf]
        self.out_dtype = OUT_TYPES[cfg.out]
        self.threads = 32 * (self.WALKERS + (cfg.scheduler == schedule.CLC))
        self.traced = {}  # what tracing computed from the kernel's layouts (tests read it)

    # --- globals: tile types, smem and TMEM blocks ---------------------------------------
    def _globals(self):
        cfg = self.cfg
        self.mma_tiler = (cfg.Mb, cfg.Nb, cfg.Kb)
        self.sfb_tiler = (128, -(-cfg.Nb // 128) * 128, cfg.Kb)
        self.cta_tile = (cfg.Mb // 2, cfg.Nb, cfg.Kb)
        op = lambda b=tc.DISCARD: tc.tiled_mma(tc.block_scaled_op(cfg.arch, cfg.Nb,
                                                                  self.sf_dtype, b_collector=b))
        self.mma = self.mma_fill = self.mma_last = op()
        if cfg.b_reuse:
            self.mma_fill, self.mma_last = op(tc.FILL), op(tc.LASTUSE)
        # Scale layouts keep the K = 64 atom structure on every target (layouts/scales_sm100)
        self.sf_mma, self.mma_sfb = scales.layout_mmas(cfg.Nb)
        cl = cute.make_layout((cfg.CLUSTER_M, cfg.CLUSTER_N, 1))
        self.cluster_vmnk = cute.tiled_divide(cl, (self.mma.thr_id.shape,))
        self.cluster_sfb_vmnk = cute.tiled_divide(cl, (self.mma_sfb.thr_id.shape,))
        S, fp4 = cfg.LOAD_PIPE_DEPTH, cutlass.Float4E2M1FN
        self.sA = sm100_utils.make_smem_layout_a(self.mma, self.mma_tiler, fp4, S)
        self.sB = sm100_utils.make_smem_layout_b(self.mma, self.mma_tiler, fp4, S)
        self.sSFA, self.sSFB = scales.smem_layouts(self.mma_tiler, S, self.sf_mma)
        self.epi_tile = (128, cfg.EPI_N)
        self.sD = sm100_utils.make_smem_layout_epi(
            self.out_dtype, LayoutEnum.ROW_MAJOR, self.epi_tile, cfg.EPI_PIPE_DEPTH)

    def _shared_storage(self):
        S, A = self.cfg.LOAD_PIPE_DEPTH, self.cfg.ACC_PIPE_DEPTH
        buf = lambda dtype, n: cute.struct.Align[cute.struct.MemRange[dtype, n], 1024]
        bars = lambda n: cute.struct.MemRange[cutlass.Int64, n]

        @cute.struct
        class SharedStorage:
            a_ring: bars(2 * S)
            bs_ring: bars(2 * S)
            acc_ring: bars(2 * A)
            clc_ring: bars(2)
            clc_response: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, 4], 16]
            tmem_dealloc: cutlass.Int64
            tmem_addr: cutlass.Int32
            sD: buf(self.out_dtype, cute.cosize(self.sD.outer))
            sA: buf(cutlass.Float4E2M1FN, cute.cosize(self.sA.outer))
            sB: buf(cutlass.Float4E2M1FN, cute.cosize(self.sB.outer))
            sSFA: buf(self.sf_dtype, cute.cosize(self.sSFA))
            sSFB: buf(self.sf_dtype, cute.cosize(self.sSFB))

        return SharedStorage

    # --- host launch ---------------------------------------------------------------------
    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, sfa_ptr: cute.Pointer,
                 sfb_ptr: cute.Pointer, d_ptr: cute.Pointer, ga_ptr: cute.Pointer,
                 gb_ptr: cute.Pointer, m: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32,
                 l: cutlass.Int32, max_active_clusters: cutlass.Constexpr,
                 stream: cuda.CUstream):
        """D (m, n, l) = gA gB A (m, k, l) B (n, k, l)^T; gA, gB: pointers to fp32 scalars."""
        cfg = self.cfg
        self._globals()
        ka, nd = cute.assume(k, cfg.Kb), cute.assume(n, 8)
        rows = lambda ptr, r, c: cute.make_tensor(ptr, cute.make_layout((r, c, l),
                                                                        stride=(c, 1, r * c)))
        mA, mB, mD = rows(a_ptr, m, ka), rows(b_ptr, n, ka), rows(d_ptr, m, nd)
        mSFA = cute.make_tensor(sfa_ptr, scales.global_layout(mA.shape))
        mSFB = cute.make_tensor(sfb_ptr, scales.global_layout(mB.shape))
        cs, thr, vmnk = (cfg.CLUSTER_M, cfg.CLUSTER_N), self.mma.thr_id, self.cluster_vmnk.shape
        tma_a, tA = tc.tma_load("A", mA, self.sA, self.mma_tiler, self.mma, vmnk, cs, thr)
        tma_b, tB = tc.tma_load("B", mB, self.sB, self.mma_tiler, self.mma, vmnk, cs, thr)
        tma_sfa, tSFA = tc.tma_load("A", mSFA, self.sSFA, self.mma_tiler, self.sf_mma, vmnk, cs,
                                    thr, cutlass.Int16)
        tma_sfb, tSFB = tc.tma_load("SFB", mSFB, self.sSFB, self.sfb_tiler, self.mma_sfb,
                                    self.cluster_sfb_vmnk.shape, cs, thr, cutlass.Int16)
        tma_d, tD = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mD, cute.slice_(self.sD, (None, None, 0)),
            self.epi_tile)
        size = lambda dt, lay: cute.size_in_bytes(dt, cute.slice_(lay, (None, None, None, 0)))
        self.a_bytes = size(cutlass.Float4E2M1FN, self.sA) * 2
        self.bs_bytes = (size(cutlass.Float4E2M1FN, self.sB) + size(self.sf_dtype, self.sSFA)
                         + size(self.sf_dtype, self.sSFB)) * 2
        tiles = cute.zipped_divide(mD, tiler=self.cta_tile[:2])[(0, (None, None, None))].shape
        sched = schedule.params(cfg.scheduler, tiles, (*cs, 1), cfg.SUPERGROUP_SIZE)
        self.storage = self._shared_storage()
        self.traced.update(smem_bytes=self.storage.size_in_bytes(), a_stage_bytes=self.a_bytes,
                           bs_stage_bytes=self.bs_bytes)
        self.kernel(tma_a, tA, tma_b, tB, tma_sfa, tSFA, tma_sfb, tSFB, tma_d, tD, ga_ptr,
                    gb_ptr, sched).launch(
            grid=schedule.grid(cfg.scheduler, sched, max_active_clusters),
            block=[self.threads, 1, 1], cluster=(*cs, 1), stream=stream, min_blocks_per_mp=1,
            use_pdl=True)

    # --- the kernel: setup, then one method per warp role ------------------------------
    @cute.kernel
    def kernel(self, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb, mSFB, tma_d, mD, ga, gb,
               sched):
        cfg = self.cfg
        self._globals()  # layouts and atoms are static: rebuild them inside the kernel region
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == self.LOAD_WARP:
            for atom in (tma_a, tma_b, tma_sfa, tma_sfb, tma_d):
                cpasync.prefetch_descriptor(atom)
        st = SmemAllocator().allocate(self.storage)
        masks = cluster.multicast_masks(self.cluster_vmnk, self.cluster_sfb_vmnk)
        vmnk = self.cluster_vmnk
        a_ring = tc.load_ring(st.a_ring.data_ptr(), cfg.LOAD_PIPE_DEPTH, self.a_bytes,
                              tc.multicast_ctas(vmnk, "A"), vmnk, (1, 0))
        bs_ring = tc.load_ring(st.bs_ring.data_ptr(), cfg.LOAD_PIPE_DEPTH, self.bs_bytes,
                               tc.multicast_ctas(vmnk, "A", "B"), vmnk, (1, 1))
        acc_ring = tc.acc_ring(st.acc_ring.data_ptr(), cfg.ACC_PIPE_DEPTH,
                               32 * len(self.EPI_WARPS), vmnk)
        walk = schedule.walk(cfg.scheduler, sched, st.clc_ring.data_ptr(),
                             st.clc_response.data_ptr(), vmnk, self.WALKERS)
        alloc = tmem.tensor_allocator(
            st.tmem_addr.ptr, tmem.alloc_columns(cfg.tmem_columns_used, cfg.arch), cfg.arch,
            True, pipeline.NamedBarrier(barrier_id=NamedBarrier.TMEM_ALLOC, num_threads=32 * 5), self.EPI_WARPS[0],
            st.tmem_dealloc.ptr)
        cluster.cluster_arrive((cfg.CLUSTER_M, cfg.CLUSTER_N))
        sA = st.sA.get_tensor(self.sA.outer, swizzle=self.sA.inner)
        sB = st.sB.get_tensor(self.sB.outer, swizzle=self.sB.inner)
        sSFA, sSFB = st.sSFA.get_tensor(self.sSFA), st.sSFB.get_tensor(self.sSFB)
        sD = st.sD.get_tensor(self.sD.outer, swizzle=self.sD.inner)
        v = cluster.cta_rank_in_pair()
        thr_mma = self.mma.get_slice(v)
        gtile = lambda t, tiler, keep: cute.local_tile(t, cute.slice_(tiler, keep),
                                                       (None, None, None))
        tCgA = thr_mma.partition_A(gtile(mA, self.mma_tiler, (None, 0, None)))
        tCgB = thr_mma.partition_B(gtile(mB, self.mma_tiler, (0, None, None)))
        tCgSFA = self.sf_mma.get_slice(v).partition_A(gtile(mSFA, self.mma_tiler,
                                                            (None, 0, None)))
        tCgSFB = self.mma_sfb.get_slice(v).partition_B(gtile(mSFB, self.sfb_tiler,
                                                             (0, None, None)))
        tCgD = thr_mma.partition_C(gtile(mD, self.mma_tiler, (None, None, 0)))
        acc_shape = self.mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = self.mma.make_fragment_C(cute.append(acc_shape, cfg.ACC_PIPE_DEPTH))
        cluster.cluster_wait((cfg.CLUSTER_M, cfg.CLUSTER_N))
        cluster.pdl_wait()
        if warp == self.LOAD_WARP:
            self.producer_load(walk, a_ring, bs_ring, masks, (sA, sB, sSFA, sSFB),
                               (tCgA, tCgB, tCgSFA, tCgSFB), (tma_a, tma_b, tma_sfa, tma_sfb))
        if warp == self.MMA_WARP:
            self.mma_issue(walk, alloc, a_ring, bs_ring, acc_ring, sA, sB, sSFA, sSFB,
                           tCtAcc_fake, cute.size(tCgA, mode=[4]))
        if warp < self.MMA_WARP:
            self.consumer_finish(walk, alloc, acc_ring, tCtAcc_fake, tCgD, sD, tma_d, ga, gb)
        if cutlass.const_expr(cfg.scheduler == schedule.CLC):
            if warp == self.SCHED_WARP and cute.arch.block_idx_in_cluster() == 0:
                schedule.clc_steal(schedule.Tiles.create(*walk))

    @cute.jit
    def producer_load(self, walk, a_ring, bs_ring, masks, smem, gmem, atoms):
        """Producer warp: wait `*_ring` empty, expect_bytes on the leader, TMA loads (multicast)."""
        mask_a, mask_b, mask_sfb, coord, coord_sfb = masks
        sA, sB, sSFA, sSFB = smem
        tCgA, tCgB, tCgSFA, tCgSFB = gmem
        tma_a, tma_b, tma_sfa, tma_sfb = atoms
        vmnk, along_n, along_m = self.cluster_vmnk, (0, 0, None, 0), (0, None, 0, 0)
        tAsA, tAgA = cluster.tma_partition(tma_a, coord[2], vmnk, along_n, sA, tCgA)
        tBsB, tBgB = cluster.tma_partition(tma_b, coord[1], vmnk, along_m, sB, tCgB)
        tAsSFA, tAgSFA = cluster.tma_partition(tma_sfa, coord[2], vmnk, along_n, sSFA, tCgSFA,
                                               compact=True)
        tBsSFB, tBgSFB = cluster.tma_partition(tma_sfb, coord_sfb[1], self.cluster_sfb_vmnk,
                                               along_m, sSFB, tCgSFB, compact=True)
        k_tiles = cute.size(tAgA, mode=[2])
        tiles = schedule.Tiles.create(*walk)
        work = tiles.first()
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.cfg.LOAD_PIPE_DEPTH)
        bs_state = a_state.clone()
        while work.is_valid_tile:
            mi, ni, li = work.tile_idx[0] // 2, work.tile_idx[1], work.tile_idx[2]
            for kt in cutlass.range(k_tiles, unroll=1):
                a_ring.producer_acquire(a_state)
                cute.copy(tma_a, tAgA[(None, mi, kt, li)], tAsA[(None, a_state.index)],
                          tma_bar_ptr=a_ring.producer_get_barrier(a_state), mcast_mask=mask_a)
                a_state.advance()
                bs_ring.producer_acquire(bs_state)
                bar, s = bs_ring.producer_get_barrier(bs_state), bs_state.index
                cute.copy(tma_b, tBgB[(None, ni, kt, li)], tBsB[(None, s)], tma_bar_ptr=bar,
                          mcast_mask=mask_b)
                cute.copy(tma_sfa, tAgSFA[(None, mi, kt, li)], tAsSFA[(None, s)],
                          tma_bar_ptr=bar, mcast_mask=mask_a)
                cute.copy(tma_sfb, tBgSFB[(None, ni, kt, li)], tBsSFB[(None, s)],
                          tma_bar_ptr=bar, mcast_mask=mask_sfb)
                bs_state.advance()
            work = tiles.next()
        a_ring.producer_tail(a_state)
        bs_ring.producer_tail(bs_state)

    @cute.jit
    def mma_issue(self, walk, alloc, a_ring, bs_ring, acc_ring, sA, sB, sSFA, sSFB,
                  tCtAcc_fake, k_tiles):
        """MMA warp (leader CTA issues): wait both rings and acc empty; commit rings, acc full."""
        cfg = self.cfg
        cols = cfg.tmem
        alloc.wait_for_alloc()
        base = alloc.retrieve_ptr(cutlass.Float32)
        tCtAcc = cute.make_tensor(base, tCtAcc_fake.layout)
        tSFA, tSFB = scales.tmem_layouts(self.mma_tiler, self.sf_mma, self.sSFA, self.sSFB)
        tCtSFA, cp_sfa, src_sfa, dst_sfa = tc.scale_tile(sSFA, base, cols["SFA"], tSFA,
                                                         self.sf_dtype)
        tCtSFB, cp_sfb, src_sfb, dst_sfb = tc.scale_tile(sSFB, base, cols["SFB"], tSFB,
                                                         self.sf_dtype)
        tCrA, tCrB = self.mma.make_fragment_A(sA), self.mma.make_fragment_B(sB)
        tiles = schedule.Tiles.create(*walk)
        work = tiles.first()
        cons = pipeline.PipelineUserType.Consumer
        a_state = pipeline.make_pipeline_state(cons, cfg.LOAD_PIPE_DEPTH)
        bs_state = pipeline.make_pipeline_state(cons, cfg.LOAD_PIPE_DEPTH)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                 cfg.ACC_PIPE_DEPTH)
        leader = cluster.is_leader_cta()
        while work.is_valid_tile:
            if leader:
                acc_ring.producer_acquire(acc_state)
                acc = tCtAcc[(None, None, None, acc_state.index)]
                for kt in cutlass.range(k_tiles, unroll=1):
                    a_ring.consumer_wait(a_state)
                    bs_ring.consumer_wait(bs_state)
                    s = bs_state.index
                    cute.copy(cp_sfa, src_sfa[(None, None, None, None, s)], dst_sfa)
                    cute.copy(cp_sfb, src_sfb[(None, None, None, None, s)], dst_sfb)
                    c = cfg.mma_k // 64  # scale atoms one MMA reads
                    for kb in cutlass.range_constexpr(cfg.k_blocks):
                        for mh in cutlass.range_constexpr(cfg.m_mmas):
                            atom = self.mma
                            if cutlass.const_expr(cfg.b_reuse):
                                atom = self.mma_fill if mh == 0 else self.mma_last
                            tc.mma2_ABt(atom, acc[(None, mh, 0)],
                                        tCrA[(None, mh, kb, a_state.index)],
                                        tCrB[(None, 0, kb, s)],
                                        tCtSFA[(None, mh, kb * c)], tCtSFB[(None, 0, kb * c)],
                                        accumulate=(kt + kb) != 0)
                    tc.release_stage(a_ring, a_state, a_only=cfg.rubin and cfg.early_release_a)
                    bs_ring.consumer_release(bs_state)
                    a_state.advance()
                    bs_state.advance()
                acc_ring.producer_commit(acc_state)
            acc_state.advance()
            work = tiles.next()
        acc_ring.producer_tail(acc_state)

    @cute.jit
    def consumer_finish(self, walk, alloc, acc_ring, tCtAcc_fake, tCgD, sD, tma_d, ga, gb):
        """Epilogue warps: wait acc full; tcgen05.ld -> * gA gB -> out dtype -> smem -> TMA store;
        release acc once read (its stores overlap the next tile's MMAs)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        alloc.allocate(tmem.alloc_columns(cfg.tmem_columns_used, cfg.arch))
        alloc.wait_for_alloc()
        base = alloc.retrieve_ptr(cutlass.Float32)
        e = epilogue.tmem_store(cute.make_tensor(base, tCtAcc_fake.layout), tCgD, sD, tma_d,
                                self.epi_tile, self.out_dtype, tidx)
        store_ring = pipeline.PipelineTmaStore.create(
            num_stages=cfg.EPI_PIPE_DEPTH,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128))
        epi_bar = pipeline.NamedBarrier(barrier_id=NamedBarrier.EPILOGUE, num_threads=128)
        alpha = epilogue.global_scale(ga, gb)
        tiles = schedule.Tiles.create(*walk)
        work = tiles.first()
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                 cfg.ACC_PIPE_DEPTH)
        steps = cfg.Nb // cfg.EPI_N
        buf = cutlass.Int32(0)
        while work.is_valid_tile:
            mi, ni, li = work.tile_idx[0] // 2, work.tile_idx[1], work.tile_idx[2]
            acc_ring.consumer_wait(acc_state)
            for mh in cutlass.range_constexpr(cfg.m_mmas):
                for j in cutlass.range(steps, unroll=1):
                    cute.copy(e.t2r, e.tmem[(None, None, None, 0, j, mh, acc_state.index)], e.acc)
                    if cutlass.const_expr(mh == cfg.m_mmas - 1):
                        if j == steps - 1:  # accumulator read: the next tile's MMAs may start
                            tc.fence_before_thread_sync()
                            acc_ring.consumer_release(acc_state)
                    epilogue.store_block(e, alpha, buf, tma_d, (None, 0, j, mh, mi, ni, li),
                                         epi_bar, store_ring, self.EPI_WARPS[0])
                    buf = (buf + 1) % cfg.EPI_PIPE_DEPTH
            acc_state.advance()
            work = tiles.next()
        cluster.pdl_launch_dependents()
        alloc.relinquish_alloc_permit()
        epi_bar.arrive_and_wait()
        alloc.free(base)
        store_ring.producer_tail()


# --- launch arguments and fake-pointer compile (no GPU needed) ----------------------------
def launch_args(cfg: Config, addr: dict, m: int, n: int, k: int, l: int = 1,
                max_active_clusters: int | None = None, stream=None) -> tuple:
    """`GemmNvfp4Sm100.__call__` arguments from device addresses (keys a, b, sfa, sfb, d, ga,
    gb) and sizes; the torch entry (`tk_cute.nvfp4.dispatch_sm100`) and `compile` share it."""
    from cutlass.cute.runtime import make_ptr

    sf = tc.SCALE_TYPES[cfg.sf]
    types = {"a": (cutlass.Float4E2M1FN, 32), "b": (cutlass.Float4E2M1FN, 32), "sfa": (sf, 16),
             "sfb": (sf, 16), "d": (OUT_TYPES[cfg.out], 16), "ga": (cutlass.Float32, 4),
             "gb": (cutlass.Float32, 4)}
    ptrs = [make_ptr(dt, addr[key], cute.AddressSpace.gmem, assumed_align=align)
            for key, (dt, align) in types.items()]
    clusters = max_active_clusters or (
        (target(cfg.arch).sm_count or 148) // (cfg.CLUSTER_M * cfg.CLUSTER_N))
    sizes = [cutlass.Int32(x) for x in (m, n, k, l)]
    return (*ptrs, *sizes, clusters, stream if stream is not None else cuda.CUstream(0))


def compile(cfg: Config, m: int = 8192, n: int = 8192, k: int = 8192,
            max_active_clusters: int | None = None):
    """Build the kernel for `cfg.arch` from fake pointers: (`tk_cute.compile.Build`, kernel)."""
    from tk_cute.compile import build

    kern = GemmNvfp4Sm100(cfg)
    addr = dict.fromkeys(("a", "b", "sfa", "sfb", "d", "ga", "gb"), 0)
    return build(kern, *launch_args(cfg, addr, m, n, k, 1, max_active_clusters),
                 arch=cfg.arch), kern
