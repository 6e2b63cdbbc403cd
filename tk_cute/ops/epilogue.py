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

`TmemQuantize`: the same accumulator blocks for an NVFP4 D (`tmem_quantize`): one tcgen05.ld
atom per 16 columns (one NVFP4 block of a D row: thread t of the 4 epilogue warps holds TMEM
lane t, i.e. row t of the 128, and columns c = register index), and where the target has it
(`arch.Target.tmem_load_reduce`: sm_103a, sm_107a) the reducing form `tcgen05.ld.red ... max.abs`
that returns each block's max |acc| with its values (`load_amax_async`, `block_amax`); elsewhere
a register max. The recipe per block is `ops.nvfp4.quantize_block16`.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import tcgen05
from cutlass.tensor_utils import LayoutEnum

from tk_cute.ops import memory
from tk_cute.ops import nvfp4 as fp4
from tk_cute.ops import tma
from tk_cute.ops.tcgen05 import tmem_load_atom, tmem_load_red_atom
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
        LayoutEnum.COL_MAJOR if d_tile.col_major else LayoutEnum.ROW_MAJOR, out_dtype,
        cutlass.Float32, t2r), t2r)
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


NVFP4_BLOCK = 16  # D columns per NVFP4 scale


class TmemQuantize(NamedTuple):
    """Partitions of one CTA's NVFP4-output epilogue (see `tmem_quantize`)."""

    t2r: object  # tcgen05.ld (.red ... max.abs where reducing) tiled copy, 16 columns an atom
    tmem: object  # (.., 1, Nb/EPI_N, m half, acc stage) accumulator blocks, this thread
    acc: object  # fp32 registers of one EPI_N block: register c is column c of this thread's row
    amax: object  # max |acc| per 16 columns from the reducing load, or None (register max)
    coords: object  # (row, column) in the 128 x EPI_N block of each register (identity tensor)


def tmem_quantize(tCtAcc, epi_tile, tidx, reduce: bool) -> TmemQuantize:
    """Partition accumulators `tCtAcc` (MMA, m half, 1, acc stage) into `epi_tile` (128 x EPI_N,
    EPI_N a multiple of 16) blocks read 16 columns per tcgen05.ld atom; `reduce`: the atom is
    the reducing `tcgen05.ld.red.32x32b.x16.max.abs` (`arch.Target.tmem_load_reduce`)."""
    blocks = epi_tile[1] // NVFP4_BLOCK
    atom = tmem_load_red_atom(NVFP4_BLOCK) if reduce else tmem_load_atom(NVFP4_BLOCK)
    epi = lambda t: cute.flat_divide(t, epi_tile)
    t2r = tcgen05.make_tmem_copy(atom, epi(tCtAcc[((None, None), 0, 0, 0)])[(None, None, 0, 0)])
    thr = t2r.get_slice(tidx)
    tmem = thr.partition_S(epi(tCtAcc[((None, None), None, 0, None)]))
    coords = thr.partition_D(cute.make_identity_tensor(epi_tile))
    acc = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
    amax = cute.make_rmem_tensor(cute.make_layout((1, 1, blocks)), cutlass.Float32) if (
        reduce) else None
    return TmemQuantize(t2r, tmem, acc, amax, coords)


def load_amax_async(e: TmemQuantize, stage, mh, j):
    """`tcgen05.ld` block j of M half `mh` of accumulator `stage` into `e.acc` (and, reducing,
    each 16 columns' max |acc| into `e.amax`)."""
    src = e.tmem[(None, None, None, 0, j, mh, stage)]
    if e.amax is None:
        cute.copy(e.t2r, src, e.acc)
    else:
        cute.copy(e.t2r, src, [e.acc, e.amax])


def block_values(e: TmemQuantize, b: int) -> list:
    """The 16 accumulators of NVFP4 block b (columns 16b .. 16b + 15) of the loaded block."""
    return [e.acc[NVFP4_BLOCK * b + i] for i in range(NVFP4_BLOCK)]


def block_amax(e: TmemQuantize, b: int):
    """max |acc| of block b: the reducing load's value, else a register max."""
    if e.amax is None:
        return fp4.abs_max(block_values(e, b))
    return e.amax[b]


def store_nvfp4(e: TmemQuantize, col0, where, codes, scales, alpha, s_dec_g, s_enc_g,
                arch: str):
    """Quantize the loaded block (`load_amax_async`) as NVFP4 D, 16 columns at a time
    (`fp4.quantize_block16` with D's decode scale `s_dec_g`), and store each 16 columns' 8 code
    bytes and scale byte from this thread: `where(col)` gives (codes offset, store it?, scale
    offset, store it?) for the block at column `col` of this thread's row (col0 + 16 b), added
    to the base addresses `codes` / `scales`. Returns a Uint32, nonzero if a scale saturated."""
    saturated = cutlass.Uint32(0)
    for b in range(cute.size(e.acc) // NVFP4_BLOCK):
        q0, q1, sf, sat = fp4.quantize_block16(block_values(e, b), block_amax(e, b), alpha,
                                               s_dec_g, s_enc_g, arch)
        at, ok, sf_at, sf_ok = where(col0 + b * NVFP4_BLOCK)
        memory.st_v2_u32_pred(codes + at, q0, q1, cutlass.Uint32(ok))
        memory.st_u8_pred(scales + sf_at, sf, cutlass.Uint32(sf_ok))
        saturated = saturated | sat
    return saturated
