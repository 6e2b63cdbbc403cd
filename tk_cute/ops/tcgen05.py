# SPDX-License-Identifier: MIT
"""Thread-scope tcgen05 ops in ThunderKittens form (Blackwell sm_100a/sm_103a, Rubin sm_107a).

TK issues tensor-core work from one thread: `mm2_ABt` (no accumulate) / `mma2_ABt` (accumulate)
for a CTA pair, `mm_ABt` / `mma_ABt` for one CTA, block-scaled when scale tiles are passed, then
`tensor_commit` to a semaphore (multicast to the pair). Here the same names wrap CuTe DSL's
tcgen05 atoms; the op picked for a target follows `tk_cute.arch`: K = 64 FP4 elements per
block-scaled MMA on sm_100a/sm_103a (`MmaMXF4NVF4Op`), K = 128 on sm_107a (`SM107MmaMXF4NVF4Op`,
with A/B collector control). `block_scaled_mma` bundles the atoms a GEMM issues (Rubin: B
collector FILL on the first M half, LASTUSE on the second), the UMMA descriptors of its shared
operand tiles and its accumulator layout. Scale tiles move shared -> tensor memory with
`tcgen05.cp` (`scale_copy`, then `load_scales_async` per stage: TK's `load_mxnv_scale_async2`),
accumulators come back to registers with `tcgen05.ld` (`tmem_load_atom`), complete after
`tensor_load_wait` (wait::ld and the fence before a thread sync: then the columns may be
released). A stage of a
`stage_ring.tma_to_mma` is freed by `release_stage` (a `tensor_commit`; Rubin: as soon as A is
read).
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
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


class block_scaled_mma:
    """The pair's block-scaled MMA of a GEMM tile: `tiled` (the plain atom, which partitions),
    `atom(mh)` the one to issue for M half `mh` (Rubin B reuse: FILL, then LASTUSE)."""

    def __init__(self, arch: str, n: int, sf_dtype, b_reuse: bool = False):
        self.op = block_scaled_op(arch, n, sf_dtype)
        self.tiled = tiled_mma(self.op)
        self.b_reuse = b_reuse
        if b_reuse:
            self.fill = tiled_mma(block_scaled_op(arch, n, sf_dtype, b_collector=FILL))
            self.last = tiled_mma(block_scaled_op(arch, n, sf_dtype, b_collector=LASTUSE))

    def atom(self, mh: int):
        if not self.b_reuse:
            return self.tiled
        return self.fill if mh == 0 else self.last

    def accumulator(self, tile_mn, stages: int):
        """TMEM layout of the fp32 accumulators: (MMA, M halves, 1, stage). Take it before any
        MMA is issued: `mma2_ABt` sets the atom's accumulate field, a new value inside the
        role's loops that another role cannot use."""
        shape = self.tiled.partition_shape_C(tile_mn)
        return self.tiled.make_fragment_C(cute.append(shape, stages)).layout

    def operands(self, sA, sB):
        """UMMA descriptors of the staged shared tiles: (MMA, M half | 1, K block, stage)."""
        return self.tiled.make_fragment_A(sA), self.tiled.make_fragment_B(sB)


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


class ScaleCopy(NamedTuple):
    """A `tcgen05.cp` of one stage of staged shared scales into a scale `tt` (`scale_copy`)."""

    copy: object  # the tiled copy
    src: object  # shared descriptors, by stage (last mode)
    dst: object  # the tensor-memory destination


def scale_copy(sf_smem, sf_tmem, pair: bool = True) -> ScaleCopy:
    """Shared -> tensor memory copy of scale atoms (`tcgen05.cp.*.32x128b.warpx4`).

    One 512-byte atom (32 rows x 16 bytes) becomes 4 TMEM columns, replicated over the 4 lane
    quarters. `sf_smem` is staged (stage last), `sf_tmem` the scale `tt` one stage lands in.
    """
    group = CtaGroup.TWO if pair else CtaGroup.ONE
    atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(group), sf_tmem.element_type)
    s_compact, t_compact = cute.filter_zeros(sf_smem), cute.filter_zeros(sf_tmem)
    copy = tcgen05.make_s2t_copy(atom, t_compact)
    thr = copy.get_slice(0)
    src = tcgen05.get_s2t_smem_desc_tensor(copy, thr.partition_S(s_compact))
    return ScaleCopy(copy, src, thr.partition_D(t_compact))


def load_scales_async(cp: ScaleCopy, stage):
    """TK `load_mxnv_scale_async2`: issue stage `stage`'s scale copy (the MMA thread, before
    the MMAs that read it: the tensor pipe runs them in order)."""
    cute.copy(cp.copy, cp.src[(None, None, None, None, stage)], cp.dst)


def tmem_load_atom(columns: int):
    """`tcgen05.ld.32x32b.x{columns}`: each thread of a warp reads its lane, `columns` fp32."""
    rep = getattr(tcgen05.Repetition, f"x{columns}")
    return cute.make_copy_atom(tcgen05.Ld32x32bOp(rep, tcgen05.Pack.NONE), cutlass.Float32)


def tmem_load_red_atom(columns: int):
    """`tcgen05.ld.red.32x32b.x{columns}.max.abs.f32`: as `tmem_load_atom`, and each thread also
    gets the max |value| of its `columns` values (a copy into [values, maxima]; only where
    `arch.Target.tmem_load_reduce`: libNVVM rejects it for sm_100a)."""
    rep = getattr(tcgen05.Repetition, f"x{columns}")
    op = tcgen05.LdRed32x32bOp(rep, tcgen05.Pack.NONE, tcgen05.TmemLoadRedOp.MAXABS)
    return cute.make_copy_atom(op, cutlass.Float32)


@cute.jit
def release_stage(ring, at, a_only: cutlass.Constexpr = False):
    """Free stage `at` of a `stage_ring.tma_to_mma` once the MMAs issued so far are done with it
    (`tensor_commit` multicast to the CTAs that loaded it); `a_only` (Rubin): once they have
    READ A."""
    if cutlass.const_expr(a_only):
        with warp.elect_leader():
            sem, mask = ring.finished(at)
            tensor_commit(sem, mask, pair=True, a_only=True)
    else:
        ring.finish(at)


@dsl_user_op
def tensor_load_wait(*, loc=None, ip=None):
    """TK `tensor_load_wait`: `tcgen05.wait::ld` (every `tcgen05.ld` this thread issued is
    complete, its registers written), then `tcgen05.fence::before_thread_sync` (ordered before
    this thread's next arrive or barrier): the columns read may be handed to another thread by
    any later arrive. The ISA's TMEM hand-off is ld -> wait::ld -> fence -> arrive (PTX ISA
    9.7.16.6.4.4); `tk_cute.emulator.lint` checks it on every path."""
    nvvm.tcgen05_wait(nvvm.Tcgen05WaitKind.LOAD, loc=loc, ip=ip)
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC, loc=loc, ip=ip)


@dsl_user_op
def fence_before_thread_sync(*, loc=None, ip=None):
    """`tcgen05.fence::before_thread_sync`: order prior tcgen05 ops before a barrier arrive."""
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC, loc=loc, ip=ip)


@dsl_user_op
def fence_after_thread_sync(*, loc=None, ip=None):
    """`tcgen05.fence::after_thread_sync`: order later tcgen05 ops after a barrier wait."""
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.AFTER_THREAD_SYNC, loc=loc, ip=ip)
