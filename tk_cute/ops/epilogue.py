# SPDX-License-Identifier: MIT
"""GEMM epilogue pieces: the device-side global scale, and tensor memory -> global stores.

`global_scale(ga, gb)`: alpha = gA * gB read by the kernel from the two fp32 0-dim tensors
(`NVFP4Tensor.global_scale`), so the host never syncs on them (no `.item()`); the product is
the fp32 product torch would form. Any GEMM with per-tensor scales uses it (Hopper and
Blackwell/Rubin), and `tests/tk_cute/ops/test_epilogue.py` checks it on the H200.

`TmemStore`: the Blackwell/Rubin epilogue of one 128-row accumulator per CTA, TK's
`consumer::finish`: `tcgen05.ld` EPI_N columns (`tt` -> `rt`), scale, convert, `stmatrix` into
one of EPI_PIPE_DEPTH shared buffers (`st`), TMA store (`gl`) while the next block is written.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.tensor_utils import LayoutEnum

from tk_cute.ops.tcgen05 import tmem_load_atom


def global_scale(ga, gb=None):
    """alpha = gA * gB (fp32) from pointers to fp32 scalars in global memory; gA alone when
    `gb` is None (W4A16: only the weights carry a global scale)."""
    one = cute.make_layout(1)
    alpha = cute.make_tensor(ga, one)[0]
    if gb is not None:
        alpha = alpha * cute.make_tensor(gb, one)[0]
    return alpha


class TmemStore(NamedTuple):
    """Partitions of one CTA's epilogue (see `tmem_store`)."""

    t2r: object  # tcgen05.ld tiled copy
    tmem: object  # (.., 1, Nb/EPI_N, m half, acc stage) accumulator blocks, this thread
    acc: object  # fp32 registers of one block
    out: object  # out_dtype registers of one block
    r2s: object  # stmatrix tiled copy
    smem: object  # (.., buffer) shared blocks, this thread
    smem_tma: object  # (.., buffer) shared blocks, TMA view
    gmem_tma: object  # (.., 1, block, m half, M tile, N tile, L) global blocks, TMA view


def tmem_store(tCtAcc, tCgD, sD, tma_d, epi_tile, out_dtype, tidx) -> TmemStore:
    """Partition accumulators `tCtAcc` (MMA, m half, 1, acc stage), output `tCgD` and shared
    buffers `sD` for EPI_N = epi_tile[1] column blocks of 128 rows."""
    epi = lambda t: cute.flat_divide(t, epi_tile)
    t2r = tcgen05.make_tmem_copy(tmem_load_atom(epi_tile[1]),
                                 epi(tCtAcc[((None, None), 0, 0, 0)])[(None, None, 0, 0)])
    thr = t2r.get_slice(tidx)
    tmem = thr.partition_S(epi(tCtAcc[((None, None), None, 0, None)]))
    g0 = thr.partition_D(epi(tCgD[((None, None), 0, 0, 0, 0, 0)]))
    acc = cute.make_rmem_tensor(g0[(None, None, None, 0, 0)].shape, cutlass.Float32)
    out = cute.make_rmem_tensor(acc.shape, out_dtype)
    r2s = cute.make_tiled_copy_D(sm100_utils.get_smem_store_op(
        LayoutEnum.ROW_MAJOR, out_dtype, cutlass.Float32, t2r), t2r)
    gD = epi(tCgD[((None, None), None, 0, None, None, None)])
    s_tma, g_tma = cpasync.tma_partition(tma_d, 0, cute.make_layout(1),
                                         cute.group_modes(sD, 0, 2), cute.group_modes(gD, 0, 2))
    return TmemStore(t2r, tmem, acc, out, r2s, r2s.get_slice(tidx).partition_D(sD), s_tma,
                     g_tma)


@cute.jit
def store_block(e: TmemStore, alpha, buf, tma_d, gcoord, bar, store_ring, store_warp):
    """Registers `e.acc` * alpha -> out dtype -> shared buffer `buf` -> TMA store at `gcoord`;
    waits until the buffer written EPI_PIPE_DEPTH - 1 blocks ago has been read."""
    out = e.r2s.retile(e.out)
    out.store((e.r2s.retile(e.acc).load() * alpha).to(e.out.element_type))
    cute.copy(e.r2s, out, e.smem[(None, None, None, buf)])
    cute.arch.fence_proxy("async.shared", space="cta")
    bar.arrive_and_wait()
    if cute.arch.warp_idx() == store_warp:
        cute.copy(tma_d, e.smem_tma[(None, buf)], e.gmem_tma[gcoord])
        store_ring.producer_commit()
        store_ring.producer_acquire()
    bar.arrive_and_wait()
