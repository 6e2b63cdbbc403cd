# %% [markdown]
# # Ladder 04 - Tensor cores: warpgroup MMA (wgmma)
#
# You will learn:
# - TK's register tile `rt`: the fp32 accumulator a warpgroup (4 warps, 128 threads) owns,
#   spread over its threads in the MMA's layout (`rt.accumulator`);
# - `warpgroup.mma_ABt(acc, sA, sB)`: acc += A B^T from two shared tiles, asynchronous: fence,
#   issue, `mma_commit_group`, `mma_async_wait` before the tiles are reused;
# - `warpgroup.store_global`: each thread writes its part of the accumulator;
# - what that compiles to: `wgmma.mma_async` (SASS `HGMMA`) replaces thousands of FMAs.
# One warpgroup, a 128 x 128 tile of C, one stage: TMA and MMAs still take turns.

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

Mb, Nb, Kb = 128, 128, 64  # Kb: four wgmma K steps of 16
TILE = (Mb, Nb, Kb)
a_tile, b_tile = st(cutlass.BFloat16, Mb, Kb), st(cutlass.BFloat16, Nb, Kb)

# %%
@cute.kernel
def kernel(A: gl, B: gl, mC: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    i, j, _ = cute.arch.block_idx()
    smem = Shared()
    arrived = semaphore(smem.barriers(1))
    sA, sB = smem.alloc(a_tile), smem.alloc(b_tile)
    if warp.warpid() == 0:
        with warp.elect_leader():
            arrived.init(1)
    init_fence()
    cute.arch.sync_threads()

    acc = rt.accumulator(warpgroup.tiled_mma(cutlass.BFloat16, Nb), tid, Mb, Nb)
    register.zero(acc)
    warpgroup.mma_fence()  # the zeroed registers are visible to the tensor cores
    phase = cutlass.Int32(0)
    for k in cutlass.range(cute.size(A.tiles(), mode=[3]), unroll=1):
        if warp.warpid() == 0:
            with warp.elect_leader():
                arrived.expect_bytes(a_tile.bytes + b_tile.bytes)
            tma.load_async(sA[None, None, 0], A, coord(i, k), arrived.ptr)
            tma.load_async(sB[None, None, 0], B, coord(j, k), arrived.ptr)
        arrived.wait(phase)
        phase ^= 1
        warpgroup.mma_ABt(acc, sA[None, None, 0], sB[None, None, 0])
        warpgroup.mma_commit_group()
        warpgroup.mma_async_wait(0)  # the MMAs have read the tiles
        cute.arch.sync_threads()  # ... in every warp, before warp 0 loads the next ones
    # mma_ABt set the MMA's accumulate flag inside the loop, a value the DSL cannot carry out
    # of it: the epilogue sees the same registers through a fresh description of the MMA.
    mma = warpgroup.tiled_mma(cutlass.BFloat16, Nb)
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
# New in the PTX: `wgmma.mma_async` m64n128k16, 2 row blocks x 4 K steps per stage, with its
# fence / commit / wait; the scalar FMAs and shared loads of level 03 are gone.

# %%
def test_compiles_to_wgmma():
    b = compiled()
    assert b.ptx_count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16") == 8
    assert b.sass_count(r"HGMMA") == 8
    assert b.ptx_count(r"wgmma\.fence") >= 1 and b.ptx_count(r"wgmma\.commit_group") == 1
    assert b.ptx_count(r"wgmma\.wait_group\.sync\.aligned\s+0;") == 1
    assert b.ptx_count(r"ld\.shared|fma\.rn\.f32") == 0
    assert b.kernel.local_bytes == 0


@pytest.mark.gpu
def test_matches_the_exact_product():
    common.check(gemm, TILE)


def bench():
    return common.bench(gemm, TILE, name="ladder 04 wgmma")


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    common.run_cells(test_compiles_to_wgmma, test_matches_the_exact_product, bench)
