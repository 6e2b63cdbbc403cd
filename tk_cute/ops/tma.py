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

Blackwell / Rubin CTA pairs (`cta_group::2`): `pair_gl` builds, on the host, the `gl` of an
`st_mma` tile (a tcgen05 operand or scale tile): each CTA of the pair loads its own rows and
both loads complete on the LEADER CTA's barrier; A-side tiles are multicast to the pairs along
the cluster's N, B-side ones to those along M. In the kernel `source(g)` (once per role, outside
its loops: the pair partition reads the CTA rank with a convergent shuffle that the compiler
cannot hoist) gives this CTA's partition of the tiles and its `Multicast`, and `load_async`
takes that in place of the `gl`.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync

from tk_cute.types.gl import coord, gl
from tk_cute.types.st import st_mma


class Multicast(NamedTuple):
    """Which CTAs of a cluster share a tile: this CTA's rank among them, their layout, and the
    bit mask of their cluster ranks."""

    rank: object
    layout: object
    mask: object


def pair_gl(tensor: cute.Tensor, tile: st_mma, cluster_mn: tuple[int, int]) -> gl:
    """Host side: the TMA load descriptor of `tile` for a CTA pair in a `cluster_mn` cluster.

    Each CTA of the pair loads its `tile.rows` (2-CTA TMA: completion on the leader's barrier);
    A-side tiles are multicast along the cluster's N, B-side ones along M (the CTAs that share
    them), which `multicast` reproduces on the device.
    """
    if tensor.element_type != tile.dtype:
        raise TypeError(f"gl of {tensor.element_type} cannot move tiles of {tile.dtype.__name__}")
    pair, tma_mma = tile.mma.thr_id, tile.tma_mma
    if tile.operand == "A":
        choose, make = sm100_utils.cluster_shape_to_tma_atom_A, cute.nvgpu.make_tiled_tma_atom_A
    else:  # B, or SFB: one CTA's partition of all N, multicast to the pair
        choose = (sm100_utils.cluster_shape_to_tma_atom_B if tile.tma_op is None else
                  sm100_utils.cluster_shape_to_tma_atom_SFB)
        make = cute.nvgpu.make_tiled_tma_atom_B
    op = choose(cluster_mn, pair)
    kw = {} if tile.tma_type is None else {"internal_type": tile.tma_type}
    vmnk = cute.tiled_divide(cute.make_layout((*cluster_mn, 1)), (tma_mma.thr_id.shape,))
    atom, tma_tensor = make(op, tensor, cute.slice_(tile.layout(1), (None, None, None, 0)),
                            tile.tma_tiler or tile.tiler, tma_mma, vmnk.shape, **kw)
    along = cute.size(vmnk.shape[2 if tile.operand == "A" else 1])
    mcast = along if isinstance(op, cpasync.CopyBulkTensorTileG2SMulticastOp) else 1
    return gl(atom, tma_tensor, tile, mcast, tuple(cluster_mn))


def multicast(g: gl) -> Multicast:
    """This CTA's `Multicast` for the loads of a `pair_gl` (device side): A-side tiles are
    shared by the CTAs along the cluster's N (mode 2 of its (V, M, N, K) layout), B-side tiles
    by those along M (mode 1)."""
    vmnk = g.cluster_layout()
    at = vmnk.get_flat_coord(cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster()))
    mode = 2 if g.tile.operand == "A" else 1
    along = (0, 0, None, 0) if mode == 2 else (0, None, 0, 0)
    return Multicast(at[mode], cute.make_layout(cute.slice_(vmnk, along).shape),
                     cpasync.create_tma_multicast_mask(vmnk, at, mcast_mode=mode))


class Source(NamedTuple):
    """A `pair_gl` as this CTA loads it (`source`): its tiles and its multicast."""

    g: gl
    tiles: object  # g.tiles(), this CTA's MMA partition
    multicast: Multicast


def source(g: gl) -> Source:
    """This CTA's view of a `pair_gl` for `load_async` (build it before the role's loops)."""
    return Source(g, g.tiles(), multicast(g))


def _partition(g: gl, smem_tile, multicast: Multicast | None, tiles=None):
    rank, layout = (0, cute.make_layout(1)) if multicast is None else multicast[:2]
    modes = 3 if isinstance(g.tile, st_mma) else 2  # ((MMA atom), MMA_M|N, MMA_K) or (rows, cols)
    s, t = cpasync.tma_partition(
        g.atom, rank, layout, cute.group_modes(smem_tile, 0, modes),
        cute.group_modes(g.tiles() if tiles is None else tiles, 0, modes),
    )
    if isinstance(g.tile, st_mma) and g.tile.scales:  # broadcast (stride-0) scale modes
        return cute.filter_zeros(s), cute.filter_zeros(t)
    return s, t


def load_async(dst, src: gl | Source, at: coord, sem, multicast: Multicast | None = None,
               origin=None):
    """Load tile `at` of `src` (a `gl`, or a pair's `Source` with its own multicast) into the
    shared tile `dst` (one stage), completing on mbarrier `sem` (for a CTA pair: the leader's,
    `stage_ring.arrived`). `origin`: the element (row, col) where tile (0, 0) starts
    (`gl.tiles_from`), for tiles off the tile grid."""
    tiles = None if origin is None else src.tiles_from(*origin)
    if isinstance(src, Source):
        src, tiles, multicast = src
    s, g = _partition(src, dst, multicast, tiles)
    mask = None if multicast is None or src.multicast == 1 else multicast.mask
    cute.copy(src.atom, g[(None, at.r, at.c, at.b)], s, tma_bar_ptr=sem, mcast_mask=mask)


def store_async(dst: gl, src, at: coord, origin=None):
    """Store the shared tile `src` to tile `at` of `dst` (fence the writes to `src` first);
    `origin` as in `load_async`, its coordinate along the contiguous dimension on 16 bytes
    of `dst` (a store box from 72 bytes into an fp16 row faulted on the H200: illegal
    instruction)."""
    s, g = _partition(dst, src, None, None if origin is None else dst.tiles_from(*origin))
    cute.copy(dst.atom, s, g[(None, at.r, at.c, at.b)])


def store_commit_group():
    cute.arch.cp_async_bulk_commit_group()


def store_async_read_wait(n: int = 0):
    """Wait until at most `n` committed store groups still read shared memory."""
    cute.arch.cp_async_bulk_wait_group(n, read=True)


def store_async_wait(n: int = 0):
    """Wait until at most `n` committed store groups are still writing global memory."""
    cute.arch.cp_async_bulk_wait_group(n, read=False)
