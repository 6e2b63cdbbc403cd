# SPDX-License-Identifier: MIT
"""Tensor-memory tiles (`tt`) and the TMEM allocator, ThunderKittens' `tensor_allocator`.

TMEM is 128 lanes x 512 columns of 32-bit cells per SM (576 on Rubin, only through an exclusive
allocation: one live allocation per SM). A `tt` is a region of columns inside one allocation:
the accumulators, then the scale-factor columns. `tensor_allocator` allocates once per CTA, the
CTA pair coordinating (`cta_group::2` alloc, and a dealloc handshake so neither CTA frees
columns its peer's MMAs may still write). The exclusive mode follows the target, not the count
alone: the DSL emits `tcgen05.alloc.exclusive` when > 512 columns are asked on "sm_107".

The allocator hands the regions out typed: `alloc.wait()` (once the allocator warp's
`tcgen05.alloc` wrote the base) returns this role's `tensor_memory`, and `tensor_memory.tt(
region, layout, dtype)` the region as a CuTe tensor in TMEM (fp32 accumulators, 8-bit scales).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.memory import TmemAllocator

from tk_cute.arch import target
from tk_cute.layouts.tmem import Region
from tk_cute.types.struct import DeviceStruct


# A `tt` is a column region of the allocation (layouts.tmem.Region: name, offset, columns).
tt = Region


def alloc_columns(used: int, arch: str) -> int:
    """Columns to ask for: a power of two >= 32 up to 512; above 512 (Rubin) a multiple of 32.

    Raises ValueError when `used` exceeds the target's tensor memory.
    """
    cap = target(arch).tmem_columns
    if used > cap:
        raise ValueError(f"{used} TMEM columns asked, {arch} has {cap}")
    if used > 512:
        return -(-used // 32) * 32  # Rubin exclusive allocation: a multiple of 32 up to 576
    n = 32
    while n < used:
        n *= 2
    return n


def is_exclusive(columns: int, arch: str) -> bool:
    """Whether `columns` needs Rubin's exclusive allocation (`tcgen05.alloc.exclusive`)."""
    t = target(arch)
    return columns > 512 and columns <= t.exclusive_tmem_columns


def dsl_arch(arch: str) -> str:
    """The arch key the DSL's TMEM helpers expect ("sm_107" for sm_107a): it decides exclusivity."""
    return target(arch).dsl_arch


class tensor_allocator(DeviceStruct):
    """TK `tensor_allocator<1|2>`: allocate / relinquish / deallocate `columns` TMEM columns.

    Args:
        holding_buf: shared Int32 where `tcgen05.alloc` writes the base address.
        columns: what `alloc_columns` returned.
        arch: compile target (sm_107a with > 512 columns: exclusive allocation).
        pair: CTA pair (`cta_group::2` alloc and the dealloc handshake through `dealloc_sem`).
        sync_barrier: named barrier over the warps that read the address: a
            `cutlass.pipeline.NamedBarrier`, or (id, threads).
        allocator_warp: the warp that allocates and frees.
    The DSL allocator's own methods (`wait_for_alloc`, `retrieve_ptr`, `free`, ...) stay
    reachable.
    """

    _fields = ("inner",)

    def __init__(self, holding_buf, columns: int, arch: str, pair: bool, sync_barrier,
                 allocator_warp: int, dealloc_sem=None):
        if isinstance(sync_barrier, tuple):
            sync_barrier = pipeline.NamedBarrier(barrier_id=int(sync_barrier[0]),
                                                 num_threads=sync_barrier[1])
        self.columns = columns
        self.inner = TmemAllocator(
            holding_buf,
            barrier_for_retrieve=sync_barrier,
            allocator_warp_id=allocator_warp,
            is_two_cta=pair,
            two_cta_tmem_dealloc_mbar_ptr=dealloc_sem,
            arch=dsl_arch(arch),
        )

    def __getattr__(self, name):
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def allocate(self, columns: int | None = None):
        """`tcgen05.alloc` (the allocator warp; the pair allocates together)."""
        self.inner.allocate(self.columns if columns is None else columns)

    def wait(self) -> "tensor_memory":
        """Wait until the allocation's base is written (named barrier), then hand it out."""
        self.inner.wait_for_alloc()
        return tensor_memory(self.inner.retrieve_ptr(cutlass.Float32))

    def deallocate(self, tm: "tensor_memory", sync=None):
        """Give the columns back: relinquish the allocation permit, `sync()` (every reader of
        the columns is done), free them (on a pair after the peer's handshake)."""
        self.inner.relinquish_alloc_permit()
        if sync is not None:
            sync()
        self.inner.free(tm.base)


class tensor_memory:
    """One role's view of an allocation: `tt` hands out its column regions as typed tensors."""

    def __init__(self, base):
        self.base = base

    def tt(self, region: tt, layout, dtype=cutlass.Float32):
        """Region `region` (`layouts.tmem.Region`) viewed with `layout` as `dtype`."""
        return tile(self.base, region, layout, dtype)


def tile(base_ptr, region: tt, layout, dtype=cutlass.Float32):
    """A `tt` region as a CuTe tensor in TMEM: base address + column offset, viewed as `dtype`."""
    return cute.make_tensor(cute.recast_ptr(base_ptr + region.offset, dtype=dtype), layout)
