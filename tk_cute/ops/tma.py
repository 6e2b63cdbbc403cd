"""TMA: TK's `tma::` namespace.

Issue from a whole, converged warp (the producer warp of `lcf`), not from an `if tid == 0`
branch: `cute.copy` of a TMA load elects its issuing lane itself with a full-warp `elect.sync`,
which, reached by one thread, waits forever for the warp's other lanes (a deadlock). The
single-thread part is the semaphore's: `with warp.elect_leader(): sem.expect_bytes(n)`, then
the warp calls `load_async`.

`load_async(dst, src, coord, sem)` copies tile `coord` of the `gl` `src` into the shared tile
`dst` and signals the mbarrier `sem` (a pointer) when the bytes land; with a cluster, the
`multicast` argument (`Multicast`) names the CTAs that share the tile: each issues its slice and
all of them receive the whole tile. `store_async` writes a shared tile to global memory;
`store_commit_group` / `store_async_read_wait(n)` bound the stores in flight before a shared
buffer is reused (TK's `store_async_read_wait<N>`).
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from tk_cute.types.gl import coord, gl


class Multicast(NamedTuple):
    """Which CTAs of a cluster share a tile: this CTA's rank among them, their layout, and the
    bit mask of their cluster ranks."""

    rank: object
    layout: object
    mask: object


def _partition(g: gl, smem_tile, multicast: Multicast | None):
    rank, layout = (0, cute.make_layout(1)) if multicast is None else multicast[:2]
    return cpasync.tma_partition(
        g.atom, rank, layout, cute.group_modes(smem_tile, 0, 2),
        cute.group_modes(g.tiles(), 0, 2),
    )


def load_async(dst, src: gl, at: coord, sem, multicast: Multicast | None = None):
    """Load tile `at` of `src` into the shared tile `dst`, completing on mbarrier `sem`."""
    s, g = _partition(src, dst, multicast)
    mask = None if multicast is None or src.multicast == 1 else multicast.mask
    cute.copy(src.atom, g[(None, at.r, at.c, at.b)], s, tma_bar_ptr=sem, mcast_mask=mask)


def store_async(dst: gl, src, at: coord):
    """Store the shared tile `src` to tile `at` of `dst` (fence the writes to `src` first)."""
    s, g = _partition(dst, src, None)
    cute.copy(dst.atom, s, g[(None, at.r, at.c, at.b)])


def store_commit_group():
    cute.arch.cp_async_bulk_commit_group()


def store_async_read_wait(n: int = 0):
    """Wait until at most `n` committed store groups still read shared memory."""
    cute.arch.cp_async_bulk_wait_group(n, read=True)


def store_async_wait(n: int = 0):
    """Wait until at most `n` committed store groups are still writing global memory."""
    cute.arch.cp_async_bulk_wait_group(n, read=False)
