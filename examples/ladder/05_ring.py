# %% [markdown]
# # Ladder 05 - A multi-stage ring
#
# You will learn:
# - a ring of STAGES shared tiles with one semaphore each (TK's `inputs_arrived`): loads for
#   the next STAGES - 1 K steps are in flight while the tensor cores work on this one;
# - the phase of a ring slot: K step k uses slot k % STAGES and waits for phase
#   (k // STAGES) % 2 of its semaphore;
# - `mma_async_wait(1)`: keep one batch of MMAs running, and reuse the slot of the batch before;
# - what that compiles to: the same wgmma, now with `wgmma.wait_group 1` and one mbarrier per
#   stage; the MMAs no longer wait for a load that was issued just before them.
# Level 04's tile and warpgroup; only the loads' timing changes (and the shared memory a CTA
# holds, which decides how many CTAs share an SM).

# %%
import functools

import cutlass
import cutlass.cute as cute
import pytest

import ladder_common as common
from tk_cute.ops import register, tma, warp, warpgroup
from tk_cute.types import coord, gl, rt, st
from tk_cute.types.semaphore import init_fence, semaphore
from tk_cute.types.st import Shared

Mb, Nb, Kb = 128, 128, 64
# 3 x 32 KiB: two CTAs fit an SM and hide each other's barrier waits (one warpgroup cannot keep
# the tensor cores busy alone). On the H200 at 4096^3 4 stages (one CTA per SM) ran at 315
# TFLOP/s, 3 at 452, 2 at 349 (2026-12-01, one run each).
STAGES = 3
TILE = (Mb, Nb, Kb)
a_tile, b_tile = st(cutlass.BFloat16, Mb, Kb), st(cutlass.BFloat16, Nb, Kb)

# %% [markdown]
# Warp 0 fills STAGES - 1 slots before the first MMA; after the MMAs of step k are issued and
# those of step k - 1 have finished, it refills their slot with step k + STAGES - 1.

# %%
@cute.jit
def load(A: gl, B: gl, sA, sB, bars, i, j, k):
    """Warp 0: K step k of this CTA's A rows and B columns into ring slot k % STAGES."""
    s = k % STAGES
    arrived = semaphore(bars + s)
    with warp.elect_leader():
        arrived.expect_bytes(a_tile.bytes + b_tile.bytes)
    tma.load_async(sA[None, None, s], A, coord(i, k), arrived.ptr)
    tma.load_async(sB[None, None, s], B, coord(j, k), arrived.ptr)


@cute.kernel
def kernel(A: gl, B: gl, mC: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    i, j, _ = cute.arch.block_idx()
    smem = Shared()
    bars = smem.barriers(STAGES)
    sA, sB = smem.alloc(a_tile, STAGES), smem.alloc(b_tile, STAGES)
    producer = warp.warpid() == 0
    if producer:
        with warp.elect_leader():
            for s in cutlass.range_constexpr(STAGES):
                semaphore(bars + s).init(1)
    init_fence()
    cute.arch.sync_threads()

    k_steps = cute.size(A.tiles(), mode=[3])
    if producer:
        for k in cutlass.range_constexpr(STAGES - 1):
            if k < k_steps:
                load(A, B, sA, sB, bars, i, j, k)
    acc = rt.accumulator(warpgroup.tiled_mma(cutlass.BFloat16, Nb), tid, Mb, Nb)
    register.zero(acc)
    warpgroup.mma_fence()
    for k in cutlass.range(k_steps, unroll=1):
        s = k % STAGES
        semaphore(bars + s).wait((k // STAGES) % 2)
        warpgroup.mma_ABt(acc, sA[None, None, s], sB[None, None, s])
        warpgroup.mma_commit_group()
        warpgroup.mma_async_wait(1)  # step k - 1's MMAs are done: its slot is free
        cute.arch.sync_threads()  # ... in every warp
        if producer and k + STAGES - 1 < k_steps:
            load(A, B, sA, sB, bars, i, j, k + STAGES - 1)
    warpgroup.mma_async_wait(0)
    mma = warpgroup.tiled_mma(cutlass.BFloat16, Nb)  # see level 04: a fresh view for the epilogue
    warpgroup.store_global(cute.local_tile(mC[None, None, 0], (Mb, Nb), (i, j)),
                           rt(acc.frag, mma, mma.get_slice(tid), Mb, Nb))


@cute.jit
def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
    grid = (c.shape[0] // Mb, c.shape[1] // Nb, 1)
    kernel(gl.load(a, a_tile), gl.load(b, b_tile), c).launch(
        grid=grid, block=(warpgroup.WARPGROUP_THREADS, 1, 1), stream=stream)


@functools.cache
def compiled(arch: str = common.ARCH):
    return common.compile_level(gemm, TILE, arch=arch)


compiled()  # in a notebook: registers, spills, instruction mix (`.ptx` has the text)

# %% [markdown]
# New in the PTX: STAGES mbarriers, `wgmma.wait_group 1` in the loop (one batch in flight),
# and the loads of the prologue beside those of the loop.

# %%
def test_compiles_to_a_ring():
    b = compiled()
    assert b.ptx_count(r"mbarrier\.init") == STAGES
    assert b.ptx_count(r"wgmma\.wait_group\.sync\.aligned\s+1;") == 1
    assert b.ptx_count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16") == 8
    assert b.ptx_count(r"cp\.async\.bulk\.tensor") == 2 * STAGES  # prologue + loop
    assert b.kernel.local_bytes == 0


@pytest.mark.gpu
def test_matches_the_exact_product():
    common.check(gemm, TILE)
    common.check(gemm, TILE, mnk=(128, 128, 128))  # fewer K steps than stages


def bench():
    return common.bench(gemm, TILE, name="ladder 05 ring")


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    common.run_cells(test_compiles_to_a_ring, test_matches_the_exact_product, bench)
