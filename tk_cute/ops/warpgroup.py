"""Warpgroup scope (4 consecutive warps, 128 threads): TK's `warpgroup::` namespace on Hopper.

MMAs are wgmma (`cute.nvgpu.warpgroup`): `mma_ABt(acc, a, b)` accumulates a @ b^T into the
register tile `acc` from shared tiles a (rows, K) and b (cols, K); `mm_ABt` overwrites instead of
accumulating. `mma_AB` takes b as (K, cols) with cols contiguous (MN-major B; 16-bit types
only: wgmma reads 8-bit operands K-major, so fp8 exists only as ABt). A may come from registers
(`rt` operand tile: RS form) or shared memory (SS form). MMAs are asynchronous: `mma_fence()`
before the first one that touches registers written by ordinary code, `mma_commit_group()` after
a batch, `mma_async_wait(n)` until at most `n` batches are in flight.

Also: register reallocation (`increase_registers` / `decrease_registers`, setmaxnreg: needs
sm_90a and a block whose warpgroups each take one branch), `store` of a register tile into a
shared tile (stmatrix), and `sync` of a set of warpgroups on a named barrier.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup as wg

from tk_cute.types.rt import rt

WARPGROUP_THREADS = 128


def increase_registers(n: int):
    cute.arch.setmaxregister_increase(n)


def decrease_registers(n: int):
    cute.arch.setmaxregister_decrease(n)


def groupid():
    """Index of the calling thread's warpgroup in the block (warp-uniform)."""
    return cute.arch.make_warp_uniform(cute.arch.warp_idx() // 4)


def mma_fence():
    wg.fence()


def mma_commit_group():
    wg.commit_group()


def mma_async_wait(n: int = 0):
    wg.wait_group(n)


def _mma(acc: rt, a, b, accumulate):
    tiled = acc.tiled_mma
    thr = acc.thr_mma
    tCrB = tiled.make_fragment_B(thr.partition_B(b))
    tCrA = a.frag if isinstance(a, rt) else tiled.make_fragment_A(thr.partition_A(a))
    tiled.set(wg.Field.ACCUMULATE, accumulate)
    for k in range(cute.size(tCrB, mode=[2])):
        cute.gemm(tiled, acc.frag, tCrA[None, None, k], tCrB[None, None, k], acc.frag)
        tiled.set(wg.Field.ACCUMULATE, True)


def mma_ABt(acc: rt, a, b):
    """acc += a @ b^T (a: shared (M, K) tile or register operand tile; b: shared (N, K))."""
    _mma(acc, a, b, True)


def mm_ABt(acc: rt, a, b):
    """acc = a @ b^T."""
    _mma(acc, a, b, False)


def mma_AB(acc: rt, a, b):
    """acc += a @ b with b a shared (K, N) tile, N contiguous (16-bit types only)."""
    _mma(acc, a, b, True)


def mm_AB(acc: rt, a, b):
    """acc = a @ b."""
    _mma(acc, a, b, False)


def store(dst, src: rt, thread_idx, subtile: int = 0):
    """Store column block `subtile` of the register tile `src` into the shared tile `dst`
    (rows x dst-cols, converted to dst's type) with stmatrix, then fence so that TMA may read
    `dst` once the group has passed a barrier. With dst as wide as `src`, subtile 0 is all of it.

    The epilogue walks a wide accumulator in narrow blocks so that a few small shared buffers
    (not a whole output tile) stage the output: shared memory stays with the load ring."""
    tiled = _stmatrix_copy(dst.element_type, src)
    thr = tiled.get_slice(thread_idx)
    acc = tiled.retile(src.frag)
    block = cute.make_rmem_tensor(cute.shape(thr.partition_S(dst))[:3], src.frag.element_type)
    n = cute.size(block)
    for v in range(n):
        block[v] = acc[subtile * n + v]
    out = cute.make_rmem_tensor(block.shape, dst.element_type)
    out.store(block.load().to(dst.element_type))
    cute.copy(tiled, out, thr.partition_D(dst))
    cute.arch.fence_proxy("async.shared", space="cta")


def _stmatrix_copy(dtype, src: rt):
    """The register->shared tiled copy for `src`'s MMA layout: stmatrix for 16-bit outputs."""
    if dtype.width != 16:
        raise TypeError(f"warpgroup.store writes 16-bit shared tiles (stmatrix); got {dtype}")
    atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), dtype)
    return cute.make_tiled_copy_S(atom, cute.make_tiled_copy_C_atom(atom, src.tiled_mma))


class sync:
    """A named barrier over `n_warpgroups` warpgroups (TK `group<N>::sync(id)`); ids start at 1
    (0 is __syncthreads)."""

    def __init__(self, barrier_id: int, n_warpgroups: int):
        self.barrier = cutlass.pipeline.NamedBarrier(
            barrier_id=barrier_id, num_threads=n_warpgroups * WARPGROUP_THREADS
        )

    def __call__(self):
        self.barrier.arrive_and_wait()
