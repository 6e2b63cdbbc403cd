"""Semaphores (TK `semaphore`), stage rings and the named-barrier table.

`semaphore(ptr)` wraps one mbarrier in shared memory. `ring(depth)` is TK's rule for a ring of
`depth` stages, each with its own barriers: use n of the ring (counting every pass, from 0)
lands in stage n % depth; a barrier that the filling side completes ("arrived": TK's
inputs_arrived) is waited on with phase (n // depth) & 1; a barrier the draining side completes
("finished": inputs_finished) with the opposite phase, so the first pass over the ring finds
every stage free. `tk_cute.templates.lcf` owns its input ring through
`cutlass.pipeline.PipelineTmaAsync` (the same barriers with the phase kept in a pipeline
state); kernels with rings of their own use `ring`.

`NamedBarrier` holds every named-barrier id (`bar.sync id, threads`) the kernels use: one table,
so two roles of one kernel never meet on the same id by accident (id 0 is __syncthreads).
"""

from __future__ import annotations

import enum

import cutlass.cute as cute

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


class NamedBarrier(enum.IntEnum):
    """Named-barrier ids of every kernel (0 is __syncthreads)."""

    EPILOGUE = 1  # the consumer (epilogue) warps around each shared output buffer's TMA store
    CONSUMERS = 2  # ltcf: the consumer warpgroups before a stage's MMAs (after their transform)
    TMEM_ALLOC = 3  # Blackwell/Rubin: the TMEM allocator warp with the epilogue warps
