"""Semaphores (TK `semaphore`), stage rings and the named-barrier table.

`semaphore(ptr)` wraps one mbarrier in shared memory. `ring(depth)` is TK's rule for a ring of
`depth` stages, each with its own barriers: use n of the ring (counting every pass, from 0)
lands in stage n % depth; a barrier that the filling side completes ("arrived": TK's
inputs_arrived) is waited on with phase (n // depth) & 1; a barrier the draining side completes
("finished": inputs_finished) with the opposite phase, so the first pass over the ring finds
every stage free. `tk_cute.templates.lcf` owns its input ring through
`cutlass.pipeline.PipelineTmaAsync` (the same barriers with the phase kept in a pipeline
state); kernels with rings of their own use `ring`.

`stage_ring` is that ring with its barrier protocol attached: the full/empty pair of each stage
and who arrives on them, kept by a `cutlass.pipeline` object (`tma_to_threads`: TMA -> consumer
threads, the Hopper templates' PipelineTmaAsync; `tma_to_mma`: TMA -> tcgen05 MMAs of a CTA
pair; `mma_to_threads`: tcgen05 accumulator -> epilogue threads). Each role walks it with its
own cursor (`producer()` / `consumer()`: `.index` is the stage, `.advance()` moves on, the phase
rule is `ring`'s) and TK's words: the filling side `wait_finished`, loads onto `arrived` (or
`arrive`s), the draining side `wait_arrived`, then `finish`es the stage; `drain` at the end.

`NamedBarrier` holds every named-barrier id (`bar.sync id, threads`) the kernels use: one table,
so two roles of one kernel never meet on the same id by accident (id 0 is __syncthreads).
"""

from __future__ import annotations

import enum

import cutlass.cute as cute
import cutlass.pipeline as pipeline

from tk_cute.types.struct import DeviceStruct


class semaphore(DeviceStruct):
    """One mbarrier: `init(count)`, `arrive()`, `expect_bytes(n)`, `wait(phase)`. A
    `DeviceStruct`, so kernels may pass it around and use it inside runtime `if`s and loops."""

    _fields = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def init(self, count: int):
        """Initialise with the number of arrivals that completes a phase (one thread)."""
        cute.arch.mbarrier_init(self.ptr, count)

    def arrive(self):
        cute.arch.mbarrier_arrive(self.ptr)

    def expect_bytes(self, n):
        """Arrive and announce `n` bytes of TMA traffic that must land before the phase ends.
        One arrival: call it from one lane (`with tk_cute.ops.warp.elect_leader():`) of the warp
        that then issues the loads (`tk_cute.ops.tma`: loads come from a whole warp)."""
        cute.arch.mbarrier_arrive_and_expect_tx(self.ptr, n)

    def wait(self, phase):
        """Block until phase `phase` (0 or 1) of this barrier has completed."""
        cute.arch.mbarrier_wait(self.ptr, phase)


def init_fence():
    """Make mbarrier initialisation visible to the async proxy (TMA) and the cluster."""
    cute.arch.mbarrier_init_fence()



class ring(DeviceStruct):
    """The phase arithmetic of a `depth`-stage ring (module docstring). Barrier sets are the
    base pointers of `depth` consecutive mbarriers (`Shared.barriers(depth)`). A DeviceStruct
    with no device fields (depth is trace-time data), so it may live across runtime loops."""

    def __init__(self, depth: int):
        self.depth = depth

    def stage(self, n):
        """The stage use n of the ring lands in."""
        return n % self.depth

    def phase(self, n):
        """The phase of use n's "arrived" barrier (the "finished" one waits on its flip)."""
        return (n // self.depth) & 1

    def at(self, barriers, n) -> semaphore:
        """Stage n % depth's barrier of the set `barriers`."""
        return semaphore(barriers + self.stage(n))

    def wait_arrived(self, barriers, n):
        """Wait until use n's stage is filled (its `barriers` barrier completed pass n // depth)."""
        self.at(barriers, n).wait(self.phase(n))

    def wait_finished(self, barriers, n):
        """Wait until use n's stage is free again (drained after use n - depth; immediate on the
        first pass)."""
        self.at(barriers, n).wait(self.phase(n) ^ 1)


class stage_ring(DeviceStruct):
    """A `depth`-stage ring of full/empty barrier pairs behind a `cutlass.pipeline` object (see
    the module docstring); a DeviceStruct, so role loops may carry it."""

    _fields = ("pipe",)

    def __init__(self, pipe, depth: int):
        self.pipe, self.depth = pipe, depth

    @classmethod
    def tma_to_threads(cls, barriers, depth: int, stage_bytes: int, consumers: int,
                       cluster_vmnk) -> "stage_ring":
        """TMA fills a stage (`stage_bytes` expected on its full barrier); `consumers` arrivals
        free it (`lcf`: one per consumer warp and per CTA that multicasts into the stage)."""
        return cls(pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers, num_stages=depth, producer_group=_one(),
            consumer_group=_threads(consumers), tx_count=stage_bytes,
            cta_layout_vmnk=cluster_vmnk, defer_sync=True), depth)

    @classmethod
    def tma_to_mma(cls, barriers, depth: int, stage_bytes: int, consumers: int, cluster_vmnk,
                   mcast_mn) -> "stage_ring":
        """TMA -> the MMAs of a CTA pair (TK's inputs_arrived / inputs_finished): the full
        barriers expect `stage_bytes` on the LEADER CTA (both CTAs' loads land there); a
        `tensor_commit` multicast frees the stage in the `consumers` CTAs that loaded into it
        (`mcast_mn`: whether the stage's data is multicast along M, along N)."""
        return cls(pipeline.PipelineTmaUmma.create(
            barrier_storage=barriers, num_stages=depth, producer_group=_one(),
            consumer_group=_threads(consumers), tx_count=stage_bytes,
            cta_layout_vmnk=cluster_vmnk, mcast_mode_mn=mcast_mn, defer_sync=True), depth)

    @classmethod
    def mma_to_threads(cls, barriers, depth: int, threads: int, cluster_vmnk) -> "stage_ring":
        """Accumulator ring: the MMA thread commits a finished tile (`arrive`), the `threads`
        epilogue threads of BOTH CTAs of the pair `finish` it once read."""
        return cls(pipeline.PipelineUmmaAsync.create(
            barrier_storage=barriers, num_stages=depth, producer_group=_one(),
            consumer_group=_threads(2 * threads), cta_layout_vmnk=cluster_vmnk,
            defer_sync=True), depth)

    # --- cursors (pipeline states: index, phase; advance()) -----------------------------------
    def producer(self):
        """The filling side's cursor: its first pass finds every stage free."""
        return pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.depth)

    def consumer(self):
        return pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.depth)

    # --- the filling side ------------------------------------------------------------------
    def wait_finished(self, at):
        """Wait until stage `at` is free; TMA rings also `expect_bytes` on its full barrier."""
        self.pipe.producer_acquire(at)

    def arrived(self, at):
        """Stage `at`'s full barrier (where its TMA loads complete)."""
        return self.pipe.producer_get_barrier(at)

    def arrive(self, at):
        """Mark stage `at` filled (MMA producers: `tensor_commit`; TMA fills arrive by bytes)."""
        self.pipe.producer_commit(at)

    def drain(self, at):
        """After the last fill: wait until the consumers have freed every stage."""
        self.pipe.producer_tail(at)

    # --- the draining side -----------------------------------------------------------------
    def wait_arrived(self, at):
        self.pipe.consumer_wait(at)

    def finish(self, at):
        """Free stage `at` (MMA consumers: `tensor_commit` multicast to the CTAs that filled it)."""
        self.pipe.consumer_release(at)

    def finished(self, at):
        """Stage `at`'s empty barrier, and the CTAs it is multicast to (mask)."""
        return self.pipe.sync_object_empty.get_barrier(at.index), self.pipe.consumer_mask


def _one():
    return pipeline.CooperativeGroup(pipeline.Agent.Thread)


def _threads(n: int):
    return pipeline.CooperativeGroup(pipeline.Agent.Thread, n)


class NamedBarrier(enum.IntEnum):
    """Named-barrier ids of every kernel (0 is __syncthreads)."""

    EPILOGUE = 1  # the consumer (epilogue) warps around each shared output buffer's TMA store
    TMEM_ALLOC = 3  # Blackwell/Rubin: the TMEM allocator warp with the epilogue warps
    PARTIALS = 4  # lcf stream-K: the consumer warpgroups around a tile's partial sums
