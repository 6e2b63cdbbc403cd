# SPDX-License-Identifier: MIT
"""NVFP4 GEMM for Blackwell (sm_100a, sm_103a) and Rubin (sm_107a) from one source, TK style.

D (M, N) bf16 = alpha * (A (M, K) NVFP4 x B (N, K) NVFP4)^T, alpha = gA * gB, scales 128x4 blocked.
Pipeline contract (per CTA of a pair; warps 0-3 epilogue, 4 MMA, 5 producer):
  producer: per K stage acquire `a_ring` -> TMA A (multicast along N); acquire `bs_ring` ->
            TMA B, SFA, SFB; both complete on the LEADER CTA's full barriers (expect_bytes).
  mma (leader CTA only): wait both rings -> tcgen05.cp scales to TMEM -> per K block and per
            M half: mma2_ABt (Rubin: B collector FILL then LASTUSE) -> release A with
            `tcgen05.commit ... sync_restrict::shared::read::mma::a` (Rubin) and B/scales with a
            plain commit, multicast to the pair -> per tile commit `acc_ring` full.
  epilogue: wait acc full -> tcgen05.ld 32 columns -> * alpha -> bf16 -> smem -> TMA store;
            release the accumulator once read (its TMA stores overlap the next tile's MMAs).
Persistent static scheduler with supergroup order; PDL. K = 64 per MMA on sm_100a/sm_103a,
128 on sm_107a; 512 TMEM columns there, 576 (exclusive alloc) on Rubin with Mb = 512.
Peer: CUTLASS examples/python/CuTeDSL/cute/blackwell/kernel/blockscaled_gemm/
dense_blockscaled_gemm_persistent.py (one arch, 3,382 lines with its host harness).
"""


from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from tk_cute.arch import target
from tk_cute.ops import cluster
from tk_cute.ops import tcgen05 as tc
from tk_cute.layouts import scales_sm100 as scales
from tk_cute.layouts import tmem as tmem_map
from tk_cute.types import tt as tmem


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
    early_release_a: bool = True  # Rubin only

    def __post_init__(self):
        t = target(self.arch)
        if not t.fp4_tensor_cores or t.tmem_columns == 0:
            raise ConfigError(f"{self.arch} has no tcgen05 block-scaled MMA")
        if self.Mb not in (256, 512) or self.Nb not in (128, 256):
            raise ConfigError(f"tile {self.Mb}x{self.Nb}: Mb in (256, 512), Nb in (128, 256)")
        if self.Kb % 64 or self.Kb % self.mma_k:
            raise ConfigError(f"Kb={self.Kb} must hold whole MMAs (K={self.mma_k}) and atoms")
        if self.sf not in tc.SCALE_TYPES or (self.sf == "ue5m3" and not self.rubin):
            raise ConfigError(f"scale type {self.sf} not supported on {self.arch}")
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
        return self.arch.startswith("sm_107")

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


def select_config(arch: str, m: int, n: int, k: int) -> Config:
    """Per-shape heuristic (documented in docs/rubin.md).

    Rubin with enough pair tiles to fill the GPU: Mb = 512 (two 256x256 accumulators sharing B,
    576 exclusive columns), pairs multicasting A along N; otherwise Mb = 256 with a
    double-buffered 256x128 accumulator. Blackwell: Mb = 256, Nb = 256 single accumulator when
    the grid is full, Nb = 128 double-buffered otherwise. Stages: as many as shared memory holds
    (at most 8); K must be a multiple of Kb = 256.
    """
    t = target(arch)
    pairs = (t.sm_count or 148) // 2
    big = -(-m // 512) * -(-n // 256) >= pairs
    if arch.startswith("sm_107") and big:
        base = dict(Mb=512, Nb=256, ACC_PIPE_DEPTH=1, CLUSTER_N=2 if n >= 512 else 1)
    elif big:
        base = dict(Mb=256, Nb=256, ACC_PIPE_DEPTH=1, CLUSTER_N=2 if n >= 512 else 1)
    else:
        base = dict(Mb=256, Nb=128, ACC_PIPE_DEPTH=2)
    for depth in range(8, 1, -1):
        try:
            return Config(arch=arch, LOAD_PIPE_DEPTH=depth, **base)
        except SmemBudgetError:
            continue
    raise SmemBudgetError(f"no stage count fits {arch}")


class GemmNvfp4Sm100:
    """The kernel for one `Config`; `__call__` is the `@cute.jit` host launch."""

    EPI_WARPS, MMA_WARP, LOAD_WARP = (0, 1, 2, 3), 4, 5
    THREADS = 192

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.sf_dtype = tc.SCALE_TYPES[cfg.sf]
        self.traced = {}  # what tracing computed from the kernel's layouts (tests read it)

    # --- globals: tile types, smem and TMEM blocks ---------------------------------------
    def _globals(self):
        cfg = self.cfg
        self.mma_tiler = (cfg.Mb, cfg.Nb, cfg.Kb)
        self.sfb_tiler = (128, -(-cfg.Nb // 128) * 128, cfg.Kb)
        self.cta_tile = (cfg.Mb // 2, cfg.Nb, cfg.Kb)
        op = tc.block_scaled_op(cfg.arch, cfg.Nb, self.sf_dtype)
        self.mma = tc.tiled_mma(op)
        self.mma_fill = self.mma_last = self.mma
        if cfg.b_reuse:
            self.mma_fill = tc.tiled_mma(tc.block_scaled_op(cfg.arch, cfg.Nb, self.sf_dtype,
                                                            b_collector=tc.FILL))
            self.mma_last = tc.tiled_mma(tc.block_scaled_op(cfg.arch, cfg.Nb, self.sf_dtype,
                                                            b_collector=tc.LASTUSE))
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
            cutlass.BFloat16, LayoutEnum.ROW_MAJOR, self.epi_tile, cfg.EPI_PIPE_DEPTH)

    def _shared_storage(self):
        S = self.cfg.LOAD_PIPE_DEPTH
        A = self.cfg.ACC_PIPE_DEPTH

        def buf(dtype, n):
            return cute.struct.Align[cute.struct.MemRange[dtype, n], 1024]

        @cute.struct
        class SharedStorage:
            a_ring: cute.struct.MemRange[cutlass.Int64, 2 * S]
            bs_ring: cute.struct.MemRange[cutlass.Int64, 2 * S]
            acc_ring: cute.struct.MemRange[cutlass.Int64, 2 * A]
            tmem_dealloc: cutlass.Int64
            tmem_addr: cutlass.Int32
            sD: buf(cutlass.BFloat16, cute.cosize(self.sD.outer))
            sA: buf(cutlass.Float4E2M1FN, cute.cosize(self.sA.outer))
            sB: buf(cutlass.Float4E2M1FN, cute.cosize(self.sB.outer))
            sSFA: buf(self.sf_dtype, cute.cosize(self.sSFA))
            sSFB: buf(self.sf_dtype, cute.cosize(self.sSFB))

        return SharedStorage

    # --- host launch ---------------------------------------------------------------------
    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, sfa_ptr: cute.Pointer,
                 sfb_ptr: cute.Pointer, d_ptr: cute.Pointer, alpha: cutlass.Float32,
                 m: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32,
                 max_active_clusters: cutlass.Constexpr, stream: cuda.CUstream):
        cfg = self.cfg
        self._globals()
        ka = cute.assume(k, 256)
        mA = cute.make_tensor(a_ptr, cute.make_layout((m, ka, 1), stride=(ka, 1, m * ka)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((n, ka, 1), stride=(ka, 1, n * ka)))
        nd = cute.assume(n, 16)
        mD = cute.make_tensor(d_ptr, cute.make_layout((m, nd, 1), stride=(nd, 1, m * nd)))
        mSFA = cute.make_tensor(sfa_ptr, scales.global_layout(mA.shape))
        mSFB = cute.make_tensor(sfb_ptr, scales.global_layout(mB.shape))
        cs, thr = (cfg.CLUSTER_M, cfg.CLUSTER_N), self.mma.thr_id
        vmnk, vmnk_sfb = self.cluster_vmnk.shape, self.cluster_sfb_vmnk.shape
        s0 = lambda lay: cute.slice_(lay, (None, None, None, 0))
        tma_a, tA = cute.nvgpu.make_tiled_tma_atom_A(
            sm100_utils.cluster_shape_to_tma_atom_A(cs, thr), mA, s0(self.sA), self.mma_tiler,
            self.mma, vmnk)
        tma_b, tB = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_B(cs, thr), mB, s0(self.sB), self.mma_tiler,
            self.mma, vmnk)
        tma_sfa, tSFA = cute.nvgpu.make_tiled_tma_atom_A(
            sm100_utils.cluster_shape_to_tma_atom_A(cs, thr), mSFA, s0(self.sSFA),
            self.mma_tiler, self.sf_mma, vmnk, internal_type=cutlass.Int16)
        tma_sfb, tSFB = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_SFB(cs, thr), mSFB, s0(self.sSFB),
            self.sfb_tiler, self.mma_sfb, vmnk_sfb, internal_type=cutlass.Int16)
        tma_d, tD = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mD, cute.slice_(self.sD, (None, None, 0)),
            self.epi_tile)
        size = lambda dt, lay: cute.size_in_bytes(dt, s0(lay))
        self.a_bytes = size(cutlass.Float4E2M1FN, self.sA) * 2
        self.bs_bytes = (size(cutlass.Float4E2M1FN, self.sB) + size(self.sf_dtype, self.sSFA)
                         + size(self.sf_dtype, self.sSFB)) * 2
        tiles = cute.zipped_divide(mD, tiler=self.cta_tile[:2])[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(tiles, (*cs, 1), cfg.SUPERGROUP_SIZE, True)
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, max_active_clusters)
        self.storage = self._shared_storage()
        self.traced.update(smem_bytes=self.storage.size_in_bytes(), a_stage_bytes=self.a_bytes,
                           bs_stage_bytes=self.bs_bytes)
        self.kernel(tma_a, tA, tma_b, tB, tma_sfa, tSFA, tma_sfb, tSFB, tma_d, tD, alpha,
                    sched).launch(grid=grid, block=[self.THREADS, 1, 1], cluster=(*cs, 1),
                                  stream=stream, min_blocks_per_mp=1, use_pdl=True)

    # --- the kernel: setup, then one method per warp role ------------------------------
    @cute.kernel
    def kernel(self, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb, mSFB, tma_d, mD, alpha,
               sched):
        cfg = self.cfg
        self._globals()  # layouts and atoms are static: rebuild them inside the kernel region
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == self.LOAD_WARP:
            for atom in (tma_a, tma_b, tma_sfa, tma_sfb, tma_d):
                cpasync.prefetch_descriptor(atom)
        st = SmemAllocator().allocate(self.storage)
        masks = cluster.multicast_masks(self.cluster_vmnk, self.cluster_sfb_vmnk)
        n_a = cute.size(self.cluster_vmnk.shape[2])
        n_b = cute.size(self.cluster_vmnk.shape[1])
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        ring = lambda mem, nbytes, producers, mode: pipeline.PipelineTmaUmma.create(
            barrier_storage=mem.data_ptr(), num_stages=cfg.LOAD_PIPE_DEPTH,
            producer_group=one, consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, producers),
            tx_count=nbytes, cta_layout_vmnk=self.cluster_vmnk, mcast_mode_mn=mode,
            defer_sync=True)
        a_ring = ring(st.a_ring, self.a_bytes, n_a, (1, 0))
        bs_ring = ring(st.bs_ring, self.bs_bytes, n_a + n_b - 1, (1, 1))
        acc_ring = pipeline.PipelineUmmaAsync.create(
            barrier_storage=st.acc_ring.data_ptr(), num_stages=cfg.ACC_PIPE_DEPTH,
            producer_group=one, consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, 32 * len(self.EPI_WARPS) * 2),
            cta_layout_vmnk=self.cluster_vmnk, defer_sync=True)
        alloc = tmem.tensor_allocator(
            st.tmem_addr.ptr, tmem.alloc_columns(cfg.tmem_columns_used, cfg.arch), cfg.arch,
            True, pipeline.NamedBarrier(barrier_id=2, num_threads=32 * 5), self.EPI_WARPS[0],
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
            self.producer_load(sched, a_ring, bs_ring, masks, (sA, sB, sSFA, sSFB),
                               (tCgA, tCgB, tCgSFA, tCgSFB), (tma_a, tma_b, tma_sfa, tma_sfb))
        if warp == self.MMA_WARP:
            self.mma_issue(sched, alloc, a_ring, bs_ring, acc_ring, sA, sB, sSFA, sSFB,
                           tCtAcc_fake, cute.size(tCgA, mode=[4]))
        if warp < self.MMA_WARP:
            self.consumer_finish(sched, alloc, acc_ring, tCtAcc_fake, tCgD, sD, tma_d, alpha)

    @cute.jit
    def producer_load(self, sched_params, a_ring, bs_ring, masks, smem, gmem, atoms):
        """Producer warp: waits `*_ring` empty, expect_bytes on the leader, TMA loads (multicast)."""
        mask_a, mask_b, mask_sfb, coord, coord_sfb = masks
        sA, sB, sSFA, sSFB = smem
        tCgA, tCgB, tCgSFA, tCgSFB = gmem
        tma_a, tma_b, tma_sfa, tma_sfb = atoms
        by_n = lambda vmnk, mode: cute.make_layout(cute.slice_(vmnk, mode).shape)
        a_cta = by_n(self.cluster_vmnk, (0, 0, None, 0))
        b_cta = by_n(self.cluster_vmnk, (0, None, 0, 0))
        sfb_cta = by_n(self.cluster_sfb_vmnk, (0, None, 0, 0))
        part = lambda atom, c, lay, s, g: cpasync.tma_partition(
            atom, c, lay, cute.group_modes(s, 0, 3), cute.group_modes(g, 0, 3))
        tAsA, tAgA = part(tma_a, coord[2], a_cta, sA, tCgA)
        tBsB, tBgB = part(tma_b, coord[1], b_cta, sB, tCgB)
        tAsSFA, tAgSFA = part(tma_sfa, coord[2], a_cta, sSFA, tCgSFA)
        tBsSFB, tBgSFB = part(tma_sfb, coord_sfb[1], sfb_cta, sSFB, tCgSFB)
        tAsSFA, tAgSFA = cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB)
        k_tiles = cute.size(tAgA, mode=[2])
        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
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
                bar = bs_ring.producer_get_barrier(bs_state)
                cute.copy(tma_b, tBgB[(None, ni, kt, li)], tBsB[(None, bs_state.index)],
                          tma_bar_ptr=bar, mcast_mask=mask_b)
                cute.copy(tma_sfa, tAgSFA[(None, mi, kt, li)], tAsSFA[(None, bs_state.index)],
                          tma_bar_ptr=bar, mcast_mask=mask_a)
                cute.copy(tma_sfb, tBgSFB[(None, ni, kt, li)], tBsSFB[(None, bs_state.index)],
                          tma_bar_ptr=bar, mcast_mask=mask_sfb)
                bs_state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        a_ring.producer_tail(a_state)
        bs_ring.producer_tail(bs_state)

    @cute.jit
    def mma_issue(self, sched_params, alloc, a_ring, bs_ring, acc_ring, sA, sB, sSFA, sSFB,
                  tCtAcc_fake, k_tiles):
        """MMA warp (leader CTA issues): waits both rings and acc empty; commits rings and acc full."""
        cfg = self.cfg
        cols = cfg.tmem
        alloc.wait_for_alloc()
        base = alloc.retrieve_ptr(cutlass.Float32)
        tCtAcc = cute.make_tensor(base, tCtAcc_fake.layout)
        tSFA, tSFB = scales.tmem_layouts(self.mma_tiler, self.sf_mma, self.sSFA, self.sSFB)
        tCtSFA = tmem.tile(base, cols["SFA"], tSFA, self.sf_dtype)
        tCtSFB = tmem.tile(base, cols["SFB"], tSFB, self.sf_dtype)
        cp_sfa, src_sfa, dst_sfa = tc.scale_copy(sSFA, tCtSFA, True, self.sf_dtype)
        cp_sfb, src_sfb, dst_sfb = tc.scale_copy(sSFB, tCtSFB, True, self.sf_dtype)
        tCrA, tCrB = self.mma.make_fragment_A(sA), self.mma.make_fragment_B(sB)
        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
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
                    self.release_a(a_ring, a_state)
                    bs_ring.consumer_release(bs_state)
                    a_state.advance()
                    bs_state.advance()
                acc_ring.producer_commit(acc_state)
            acc_state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        acc_ring.producer_tail(acc_state)

    @cute.jit
    def release_a(self, a_ring, state):
        """Free A's stage: on Rubin when the MMAs finished reading A (early), else on completion."""
        if cutlass.const_expr(self.cfg.rubin and self.cfg.early_release_a):
            with cluster.elect_leader():
                tc.tensor_commit(a_ring.sync_object_empty.get_barrier(state.index),
                                 a_ring.consumer_mask, pair=True, a_only=True)
        else:
            a_ring.consumer_release(state)

    @cute.jit
    def consumer_finish(self, sched_params, alloc, acc_ring, tCtAcc_fake, tCgD, sD, tma_d,
                        alpha):
        """Epilogue warps: wait acc full; tcgen05.ld -> bf16 -> smem -> TMA store; release acc."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        alloc.allocate(tmem.alloc_columns(cfg.tmem_columns_used, cfg.arch))
        alloc.wait_for_alloc()
        base = alloc.retrieve_ptr(cutlass.Float32)
        tCtAcc = cute.make_tensor(base, tCtAcc_fake.layout)
        epi = lambda t: cute.flat_divide(t, self.epi_tile)
        # (128, EPI_N, 1, Nb/EPI_N, m half, acc stage) accumulator subtiles
        tAcc = epi(tCtAcc[((None, None), 0, 0, 0)])
        t2r = tcgen05.make_tmem_copy(tc.tmem_load_atom(cfg.EPI_N), tAcc[(None, None, 0, 0)])
        thr_t2r = t2r.get_slice(tidx)
        tTR_t = thr_t2r.partition_S(epi(tCtAcc[((None, None), None, 0, None)]))
        tTR_g0 = thr_t2r.partition_D(epi(tCgD[((None, None), 0, 0, 0, 0, 0)]))
        rAcc = cute.make_rmem_tensor(tTR_g0[(None, None, None, 0, 0)].shape, cutlass.Float32)
        rD = cute.make_rmem_tensor(rAcc.shape, cutlass.BFloat16)
        r2s = cute.make_tiled_copy_D(sm100_utils.get_smem_store_op(
            LayoutEnum.ROW_MAJOR, cutlass.BFloat16, cutlass.Float32, t2r), t2r)
        tRS_sD = r2s.get_slice(tidx).partition_D(sD)
        tRS_rD = r2s.retile(rD)
        gD_epi = epi(tCgD[((None, None), None, 0, None, None, None)])
        bSG_sD, bSG_gD = cpasync.tma_partition(tma_d, 0, cute.make_layout(1),
                                               cute.group_modes(sD, 0, 2),
                                               cute.group_modes(gD_epi, 0, 2))
        store_ring = pipeline.PipelineTmaStore.create(
            num_stages=cfg.EPI_PIPE_DEPTH,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128))
        epi_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128)
        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                 cfg.ACC_PIPE_DEPTH)
        steps = cfg.Nb // cfg.EPI_N
        buf = cutlass.Int32(0)
        while work.is_valid_tile:
            mi, ni, li = work.tile_idx[0] // 2, work.tile_idx[1], work.tile_idx[2]
            acc_ring.consumer_wait(acc_state)
            for mh in cutlass.range_constexpr(cfg.m_mmas):
                for j in cutlass.range(steps, unroll=1):
                    cute.copy(t2r, tTR_t[(None, None, None, 0, j, mh, acc_state.index)], rAcc)
                    if cutlass.const_expr(mh == cfg.m_mmas - 1):
                        if j == steps - 1:  # accumulator read: the next tile's MMAs may start
                            tc.fence_before_thread_sync()
                            acc_ring.consumer_release(acc_state)
                    tRS_rD.store((r2s.retile(rAcc).load() * alpha).to(cutlass.BFloat16))
                    cute.copy(r2s, tRS_rD, tRS_sD[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epi_bar.arrive_and_wait()
                    if cute.arch.warp_idx() == self.EPI_WARPS[0]:
                        cute.copy(tma_d, bSG_sD[(None, buf)],
                                  bSG_gD[(None, 0, j, mh, mi, ni, li)])
                        store_ring.producer_commit()
                        store_ring.producer_acquire()
                    epi_bar.arrive_and_wait()
                    buf = (buf + 1) % cfg.EPI_PIPE_DEPTH
            acc_state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        cluster.pdl_launch_dependents()
        alloc.relinquish_alloc_permit()
        epi_bar.arrive_and_wait()
        alloc.free(base)
        store_ring.producer_tail()


# --- fake-tensor compile (no GPU needed) -------------------------------------------------
def compile(cfg: Config, m: int = 8192, n: int = 8192, k: int = 8192,
            max_active_clusters: int | None = None):
    """Build the kernel for `cfg.arch` from fake pointers; returns (`tk_cute.compile.Build`, kernel)."""
    from cutlass.cute.runtime import make_ptr

    from tk_cute.compile import build

    t = target(cfg.arch)
    kern = GemmNvfp4Sm100(cfg)
    sf = tc.SCALE_TYPES[cfg.sf]
    ptr = lambda dt, align: make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=align)
    clusters = max_active_clusters or (t.sm_count or 148) // (cfg.CLUSTER_M * cfg.CLUSTER_N)
    b = build(kern, ptr(cutlass.Float4E2M1FN, 32), ptr(cutlass.Float4E2M1FN, 32), ptr(sf, 16),
              ptr(sf, 16), ptr(cutlass.BFloat16, 16), cutlass.Float32(1.0), cutlass.Int32(m),
              cutlass.Int32(n), cutlass.Int32(k), clusters, cuda.CUstream(0), arch=cfg.arch)
    return b, kern
