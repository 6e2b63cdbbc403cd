# SPDX-License-Identifier: MIT
"""Speed-of-light read: every byte of up to two device buffers read once, as fast as the GPU
reads memory, and folded into a checkable result. It is the yardstick of the memory-bound
kernels: `python -m tk_cute.bench nvfp4` times it on the same NVFP4 weight bytes (codes and
scales) the decode GEMMs stream, so the fastest read of these bytes measured here stands beside
their times in one run.

The access is the one that read fastest on the H200 among those measured (16-byte loads, 1D
bulk copies (TMA), 2D TMA boxes of weight-row pieces, per CTA contiguous shares or grid-stride;
the numbers are in docs/facts.md#read-floor): grid-stride 16-byte loads (``ld.global.nc``, no L1
allocation), LOADS of them in flight per thread, CTAS_PER_SM x THREADS threads per SM (a full
SM), so at any moment the whole grid reads one contiguous window of the buffer. The loaded
words are XOR-folded (one instruction per word, so the loads are not dead code and the ALU
never limits) and each warp writes its fold: the XOR of all of them is the XOR of every 32-bit
word read, which a test checks against the host. Torch entry: `tk_cute.bench.stream_read`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from tk_cute.ops import memory, warp
from tk_cute.launcher import Signature, i32, i64, ptr

THREADS = 512
CTAS_PER_SM = 4  # 2048 threads: a full Hopper SM (32 registers per thread)
LOADS = 4  # 16-byte loads in flight per thread (64 KB per SM)
WARPS = THREADS // 32
PIECE = 16  # bytes per load


@cute.jit
def _fold_buffer(fold: Uint32, base: Int64, pieces: Int64, first: Int64, stride: Int64):
    """`fold` ^ every word of this thread's pieces first, first + stride, ... of a buffer of
    `pieces` 16-byte pieces: whole groups of LOADS grid strides (all loads in flight at once),
    then the rest (fewer than LOADS strides) as predicated loads."""
    group = stride * LOADS
    groups = pieces // group
    for g in cutlass.range(groups, unroll=1):
        words = [memory.ld_v4(base + (first + g * group + u * stride) * PIECE, stream=True)
                 for u in range(LOADS)]
        for w in words:
            fold = fold ^ w[0] ^ w[1] ^ w[2] ^ w[3]
    for u in range(LOADS):
        p = groups * group + first + u * stride
        w = memory.ld_v4_pred(base + p * PIECE, Uint32(p < pieces))
        fold = fold ^ w[0] ^ w[1] ^ w[2] ^ w[3]
    return fold


@cute.kernel
def _kernel(a: cute.Pointer, a_pieces: Int64, b: cute.Pointer, b_pieces: Int64,
            out: cute.Pointer):
    tid, cta = cute.arch.thread_idx()[0], cute.arch.block_idx()[0]
    stride = Int64(cute.arch.grid_dim()[0] * THREADS)
    first = Int64(cta * THREADS + tid)
    fold = _fold_buffer(Uint32(0), a.toint(), a_pieces, first, stride)
    fold = _fold_buffer(fold, b.toint(), b_pieces, first, stride)
    for mask in (16, 8, 4, 2, 1):
        fold = fold ^ warp.shuffle_xor(fold, mask)
    if warp.laneid() == 0:
        memory.st_u32(out.toint() + (cta * WARPS + tid // 32) * 4, fold)


@cute.jit
def _launch(a: cute.Pointer, a_pieces: Int64, b: cute.Pointer, b_pieces: Int64,
            out: cute.Pointer, ctas: Int32, stream):
    _kernel(a, a_pieces, b, b_pieces, out).launch(
        grid=[ctas, 1, 1], block=[THREADS, 1, 1], stream=stream)


SIGNATURE = Signature(ptr("a", cutlass.Uint8, PIECE), i64("a_pieces"),
                      ptr("b", cutlass.Uint8, PIECE), i64("b_pieces"),
                      ptr("out", cutlass.Uint32, 4), i32("ctas"))


def compile_launcher(options: str = ""):
    """`_launch` compiled into a raw-pointer `Launcher` (`options`: e.g. "--gpu-arch sm_90a" to
    build without a GPU)."""
    return SIGNATURE.compile(_launch, options=options)
