# SPDX-License-Identifier: MIT
"""GEMM epilogue pieces: the device-side global scale, and tensor memory -> global stores.

`global_scale(ga, gb)`: alpha = gA * gB read by the kernel from the two fp32 0-dim tensors
(`NVFP4Tensor.global_scale`), so the host never syncs on them (no `.item()`); the product is
the fp32 product torch would form. Any GEMM with per-tensor scales uses it (Hopper and
Blackwell/Rubin), and `tests/tk_cute/ops/test_epilogue.py` checks it on the H200.

`TmemStore`: the Blackwell/Rubin epilogue of one 128-row accumulator per CTA, TK's
`consumer::finish`: `load_async` EPI_N columns (`tcgen05.ld`, `tt` -> registers), then
`store_block`: scale, convert, `stmatrix` into one of EPI_PIPE_DEPTH shared buffers (an `st` of
128 x EPI_N), TMA store (`tma.store_async` to the `gl`) while the next block is written.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import tcgen05
from cutlass.tensor_utils import LayoutEnum

from tk_cute.ops import tma
from tk_cute.ops.tcgen05 import tmem_load_atom
from tk_cute.types.gl import coord, gl
from tk_cute.types.st import st


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
    buffers: object  # the shared `st` buffers (rows, cols, buffer), as `tma.store_async` takes them


def load_async(e: TmemStore, stage, mh, j):
    """`tcgen05.ld` block j of M half `mh` of accumulator `stage` into `e.acc` (TK
    `warpgroup::load_async(rt, tt)`)."""
    cute.copy(e.t2r, e.tmem[(None, None, None, 0, j, mh, stage)], e.acc)


def tmem_store(tCtAcc, sD, d_tile: st, tidx) -> TmemStore:
    """Partition accumulators `tCtAcc` (MMA, m half, 1, acc stage) and the staged shared
    buffers `sD` of tile type `d_tile` (128 x EPI_N of the output type) for column blocks of
    128 rows."""
    epi_tile, out_dtype = d_tile.shape, d_tile.dtype
    epi = lambda t: cute.flat_divide(t, epi_tile)
    t2r = tcgen05.make_tmem_copy(tmem_load_atom(epi_tile[1]),
                                 epi(tCtAcc[((None, None), 0, 0, 0)])[(None, None, 0, 0)])
    thr = t2r.get_slice(tidx)
    tmem = thr.partition_S(epi(tCtAcc[((None, None), None, 0, None)]))
    block = thr.partition_D(cute.make_identity_tensor(epi_tile))
    acc = cute.make_rmem_tensor(block.shape, cutlass.Float32)
    out = cute.make_rmem_tensor(acc.shape, out_dtype)
    r2s = cute.make_tiled_copy_D(sm100_utils.get_smem_store_op(
        LayoutEnum.ROW_MAJOR, out_dtype, cutlass.Float32, t2r), t2r)
    return TmemStore(t2r, tmem, acc, out, r2s, r2s.get_slice(tidx).partition_D(sD), sD)


@cute.jit
def store_block(e: TmemStore, alpha, buf, dst: gl, at: coord, bar, store_warp: int,
                depth: cutlass.Constexpr):
    """Registers `e.acc` * alpha -> out dtype -> shared buffer `buf` (of `depth`) -> TMA store
    to tile `at` of `dst` (warp `store_warp`), then wait until the buffer written `depth` - 1
    blocks ago has been read; `bar()` syncs the epilogue warps around it."""
    out = e.r2s.retile(e.out)
    out.store((e.r2s.retile(e.acc).load() * alpha).to(e.out.element_type))
    cute.copy(e.r2s, out, e.smem[(None, None, None, buf)])
    cute.arch.fence_proxy("async.shared", space="cta")
    bar()
    if cute.arch.warp_idx() == store_warp:
        tma.store_async(dst, e.buffers[(None, None, buf)], at)
        tma.store_commit_group()
        tma.store_async_read_wait(depth - 1)
    bar()
