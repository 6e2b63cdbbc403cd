# SPDX-License-Identifier: MIT
"""Thread-scope tcgen05 ops in ThunderKittens form (Blackwell sm_100a/sm_103a, Rubin sm_107a).

TK issues tensor-core work from one thread: `mm2_ABt` (no accumulate) / `mma2_ABt` (accumulate)
for a CTA pair, `mm_ABt` / `mma_ABt` for one CTA, block-scaled when scale tiles are passed, then
`tensor_commit` to a semaphore (multicast to the pair). Here the same names wrap CuTe DSL's
tcgen05 atoms; the op picked for a target follows `tk_cute.arch`: K = 64 FP4 elements per
block-scaled MMA on sm_100a/sm_103a (`MmaMXF4NVF4Op`), K = 128 on sm_107a (`SM107MmaMXF4NVF4Op`,
with A/B collector control). Scale tiles move shared -> tensor memory with `tcgen05.cp`
(`scale_copy`), accumulators come back to registers with `tcgen05.ld` (`tmem_load_atom`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass._mlir.dialects import nvvm
from cutlass.cute.nvgpu import tcgen05
from cutlass.cute.nvgpu.tcgen05 import CollectorOp, CtaGroup, Field
from cutlass.cutlass_dsl import Int16, dsl_user_op

from tk_cute.arch import target
from tk_cute.ops import warp

# Collector qualifiers for B (Rubin): FILL keeps B in the collector, LASTUSE reads it once more
# and frees it; DISCARD is the plain MMA.
FILL, LASTUSE, DISCARD = CollectorOp.FILL, CollectorOp.LASTUSE, CollectorOp.DISCARD

SCALE_TYPES = {
    "ue4m3": cutlass.Float8E4M3FN,  # NVFP4 (all targets)
    "ue5m3": cutlass.FloatNV8E5M3FNU,  # sm_107a only
    "ue8m0": cutlass.Float8E8M0FNU,  # MX scales
}


def block_scaled_op(arch: str, n: int, sf_dtype, sf_vec: int = 16, pair: bool = True,
                    b_collector: CollectorOp = DISCARD):
    """The NVFP4 block-scaled MMA atom for `arch`: M = 256 on a pair (128 alone), N = `n`.

    Args:
        arch: compile target; sm_107a gets the K = 128 SM107 op, others the K = 64 op.
        n: instruction N (multiple of 16 on a pair).
        sf_dtype: scale type (`SCALE_TYPES`); UE5M3 exists only on sm_107a.
        sf_vec: elements per scale (16: NVFP4).
        pair: cta_group::2 (True) or ::1.
        b_collector: B collector qualifier (sm_107a only).
    """
    group = CtaGroup.TWO if pair else CtaGroup.ONE
    m = 256 if pair else 128
    src = tcgen05.OperandSource.SMEM
    if target(arch).b_collector:  # the Rubin op: K = 128, collectors
        return tcgen05.SM107MmaMXF4NVF4Op(sf_dtype, sf_vec, (m, n, 128), group, src,
                                         DISCARD, b_collector)
    if b_collector != DISCARD:
        raise ValueError(f"operand collectors need sm_107a, not {arch}")
    return tcgen05.MmaMXF4NVF4Op(sf_dtype, (m, n, 64), group, src)


def tiled_mma(op):
    """One MMA atom as a tiled MMA (TK issues one instruction per call)."""
    return cute.make_tiled_mma(cute.make_mma_atom(op))


def _mma(mma_atom, d, a, b, sfa, sfb, accumulate):
    mma_atom.set(Field.ACCUMULATE, accumulate)
    if sfa is None:
        cute.gemm(mma_atom, d, a, b, d)
    else:
        cute.gemm(mma_atom, d, [a, sfa], [b, sfb], d)


def mm2_ABt(mma_atom, d, a, b, sfa=None, sfb=None):
    """D = A B^T on a CTA pair (issued by the leader CTA's MMA thread); block-scaled with scales."""
    _mma(mma_atom, d, a, b, sfa, sfb, False)


def mma2_ABt(mma_atom, d, a, b, sfa=None, sfb=None, accumulate=True):
    """D += A B^T on a CTA pair; `accumulate` may be a runtime predicate (first K block: False)."""
    _mma(mma_atom, d, a, b, sfa, sfb, accumulate)


# One CTA: the same instruction with cta_group::1 atoms.
mm_ABt, mma_ABt = mm2_ABt, mma2_ABt


@dsl_user_op
def tensor_commit(sem_ptr, mask=None, pair: bool = True, a_only: bool = False, *, loc=None,
                  ip=None):
    """Arrive on `sem_ptr` when this thread's prior tcgen05 ops finish (call from one lane).

    Args:
        sem_ptr: mbarrier in shared memory.
        mask: cluster multicast mask (16 bit) of the CTAs whose barrier at that offset arrives.
        pair: cta_group::2.
        a_only: Rubin early release: `sync_restrict::shared::read::mma::a`, arrive once the MMAs
            have finished READING A from shared memory (A's stage can be refilled while they run).
    """
    group = nvvm.CTAGroupKind.CTA_2 if pair else nvvm.CTAGroupKind.CTA_1
    m = None if mask is None else Int16(mask).ir_value(loc=loc, ip=ip)
    nvvm.tcgen05_commit(sem_ptr.llvm_ptr, multicast_mask=m, smem_a_read=a_only or None,
                        group=group, loc=loc, ip=ip)


def scale_copy(sf_smem, sf_tmem, pair: bool, sf_dtype):
    """Shared -> tensor memory copy of scale atoms (`tcgen05.cp.*.32x128b.warpx4`).

    One 512-byte atom (32 rows x 16 bytes) becomes 4 TMEM columns, replicated over the 4 lane
    quarters. Returns (tiled_copy, source partition staged by stage, destination partition).
    """
    group = CtaGroup.TWO if pair else CtaGroup.ONE
    atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(group), sf_dtype)
    s_compact, t_compact = cute.filter_zeros(sf_smem), cute.filter_zeros(sf_tmem)
    copy = tcgen05.make_s2t_copy(atom, t_compact)
    thr = copy.get_slice(0)
    src = tcgen05.get_s2t_smem_desc_tensor(copy, thr.partition_S(s_compact))
    return copy, src, thr.partition_D(t_compact)


def scale_tile(sf_smem, tmem_base, region, tmem_layout, sf_dtype, pair: bool = True):
    """A scale `tt` (TMEM column `region` viewed with `tmem_layout`) and its `scale_copy` from
    the staged shared scales: (tile, tiled_copy, source by stage, destination)."""
    from tk_cute.types.tt import tile as tt_tile

    tile = tt_tile(tmem_base, region, tmem_layout, sf_dtype)
    return (tile, *scale_copy(sf_smem, tile, pair, sf_dtype))


def tmem_load_atom(columns: int):
    """`tcgen05.ld.32x32b.x{columns}`: each thread of a warp reads its lane, `columns` fp32."""
    rep = getattr(tcgen05.Repetition, f"x{columns}")
    return cute.make_copy_atom(tcgen05.Ld32x32bOp(rep, tcgen05.Pack.NONE), cutlass.Float32)


@cute.jit
def release_stage(ring, state, a_only: cutlass.Constexpr = False):
    """Free a `load_ring` stage once the MMAs issued so far are done with it (`tensor_commit`
    multicast to the CTAs that loaded it); `a_only` (Rubin): once they have READ A."""
    if cutlass.const_expr(a_only):
        with warp.elect_leader():
            tensor_commit(ring.sync_object_empty.get_barrier(state.index), ring.consumer_mask,
                          pair=True, a_only=True)
    else:
        ring.consumer_release(state)


@dsl_user_op
def fence_before_thread_sync(*, loc=None, ip=None):
    """`tcgen05.fence::before_thread_sync`: order prior tcgen05 ops before a barrier arrive."""
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC, loc=loc, ip=ip)


@dsl_user_op
def fence_after_thread_sync(*, loc=None, ip=None):
    """`tcgen05.fence::after_thread_sync`: order later tcgen05 ops after a barrier wait."""
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.AFTER_THREAD_SYNC, loc=loc, ip=ip)


# --- TMA -> MMA plumbing of a CTA pair -------------------------------------------------------
_TMA_OPS = {
    "A": (sm100_utils.cluster_shape_to_tma_atom_A, cute.nvgpu.make_tiled_tma_atom_A),
    "B": (sm100_utils.cluster_shape_to_tma_atom_B, cute.nvgpu.make_tiled_tma_atom_B),
    "SFB": (sm100_utils.cluster_shape_to_tma_atom_SFB, cute.nvgpu.make_tiled_tma_atom_B),
}


def tma_load(operand: str, tensor, smem, tiler, mma, cluster_vmnk, cluster_mn, pair_thr,
             internal_type=None):
    """Host: TMA load atom and tensor of an MMA `operand` ("A" rows, "B" columns, "SFB"),
    multicast over the CTAs that share it; `smem` is the staged layout (stage 0 is used)."""
    op, make = _TMA_OPS[operand]
    kw = {} if internal_type is None else {"internal_type": internal_type}
    return make(op(cluster_mn, pair_thr), tensor, cute.slice_(smem, (None, None, None, 0)),
                tiler, mma, cluster_vmnk, **kw)


def multicast_ctas(cluster_vmnk, *operands: str) -> int:
    """CTAs whose TMA multicasts land in one stage holding `operands`: A comes from the CTAs
    along N (mode 2), B from those along M (mode 1); together they share this CTA."""
    along = {"A": 2, "B": 1}
    n = [cute.size(cluster_vmnk.shape[along[o]]) for o in operands]
    return sum(n) - (len(n) - 1)


def load_ring(barriers, stages: int, stage_bytes: int, consumers: int, cluster_vmnk, mcast_mn):
    """TK's inputs_arrived / inputs_finished ring from TMA to the pair's MMA: full barriers
    expect `stage_bytes` on the leader CTA; `tensor_commit` frees a stage in the `consumers`
    CTAs that multicast into it (`mcast_mn`: which of M, N the stage's data is multicast along)."""
    one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
    return pipeline.PipelineTmaUmma.create(
        barrier_storage=barriers, num_stages=stages, producer_group=one,
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumers),
        tx_count=stage_bytes, cta_layout_vmnk=cluster_vmnk, mcast_mode_mn=mcast_mn,
        defer_sync=True)


def acc_ring(barriers, stages: int, epilogue_threads: int, cluster_vmnk):
    """Accumulator ring: the MMA warp commits a finished tile, the epilogue threads of both
    CTAs of the pair release it once read."""
    return pipeline.PipelineUmmaAsync.create(
        barrier_storage=barriers, num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 * epilogue_threads),
        cta_layout_vmnk=cluster_vmnk, defer_sync=True)
