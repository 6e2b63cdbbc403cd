"""Warp scope (32 lanes; TK's `warp::`): lane identity, electing one lane, lane exchange, and
the register-operand MMA `mma_m16n8k16_bf16` (``mma.sync``, the MMA of TK's `warp::mma_AB`).

`elect_leader()` is a context in which exactly one lane of a converged warp runs (PTX
`elect.sync`): the way to issue single-thread work such as an mbarrier arrive or
`expect_bytes`. Keep the whole warp converged around it: `elect.sync` and the DSL's TMA copies
(which elect their own lane) deadlock when entered from a single-lane branch. `flag_if_any`
raises a device flag (saturation, NaN) once per warp.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from tk_cute.ops.ptx import asm, unpack


def laneid():
    """This thread's lane (0-31)."""
    return cute.arch.lane_idx()


def warpid():
    """This thread's warp in the block (warp-uniform)."""
    return cute.arch.make_warp_uniform(cute.arch.warp_idx())


def elect_leader():
    """`with elect_leader(): ...` runs the body on one lane of the (converged) warp."""
    return cute.arch.elect_one()


def sync():
    """Reconverge the warp (`__syncwarp`)."""
    cute.arch.sync_warp()


def shuffle_xor(value, lane_mask: int):
    """The value held by lane `laneid() ^ lane_mask` (butterfly exchange)."""
    return cute.arch.shuffle_sync_bfly(value, offset=lane_mask)


@cute.jit
def flag_if_any(flag: cute.Pointer, raised, lane=None):
    """``*flag |= 1`` (an Int32 device flag) if `raised` is nonzero on any lane of the
    (converged) warp: one vote, then one atomic from lane 0 instead of one per lane. `lane`:
    this thread's lane where the kernel has it in a register already (default `laneid()`)."""
    if cute.arch.vote_any_sync(raised != 0):
        if (cute.arch.lane_idx() if cutlass.const_expr(lane is None) else lane) == 0:
            cute.arch.atomic_or(flag, Int32(1))


@dsl_user_op
def mma_m16n8k16_bf16(a: list, b: list, c: list, *, loc=None, ip=None) -> list:
    """c += A (16x16) B (16x8) from registers, fp32 accumulate
    (``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``). Lane 4g + t holds: `a` 4 bf16x2
    words, A rows g, g+8, g, g+8 at K 2t..2t+1, 2t..2t+1, 2t+8..2t+9, 2t+8..2t+9; `b` 2 words,
    B column g at K 2t..2t+1, 2t+8..2t+9; `c` 4 fp32, C (g + 8 (i // 2), 2t + i % 2)."""
    ret = llvm.StructType.get_literal([T.f32()] * 4)
    text = ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, "
            "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
    args = [Uint32(v) for v in a] + [Uint32(v) for v in b] + [Float32(v) for v in c]
    res = asm(ret, args, text, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3", loc, ip)
    return unpack(res, T.f32(), 4, Float32, loc, ip)
