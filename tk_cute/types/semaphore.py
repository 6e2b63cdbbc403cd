"""Semaphores (TK `semaphore`): mbarriers with explicit phase bookkeeping.

`semaphore(ptr)` wraps one mbarrier in shared memory. TK's rule for rings applies: a consumer
waits on phase bit `p` of the barrier the producer arrives on, and flips `p` every time the ring
wraps. `tk_cute.templates.lcf` owns its rings through `cutlass.pipeline.PipelineTmaAsync`
(the same barriers with the phase kept in a pipeline state); use `semaphore` for your own.
"""

from __future__ import annotations

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

