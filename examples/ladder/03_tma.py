# %% [markdown]
# # Ladder 03 - TMA loads and an mbarrier
#
# You will learn:
# - TK's global layout `gl`: a tensor viewed in tiles of one `st` type, with the TMA descriptor
#   built on the host (`gl.load`); `coord(r, c)` names a tile;
# - `tma.load_async(st, gl, coord, sem)`: one warp asks the copy engine for a whole tile; the
#   bytes land in the tile's swizzled layout and complete on a `semaphore` (an mbarrier) that
#   was told how many bytes to expect (`expect_bytes`);
# - waiting on a semaphore's phase, which flips every time it completes;
# - what that compiles to: `cp.async.bulk.tensor` and `mbarrier` instructions in place of the
#   per-thread global loads and shared stores of level 02.
# The compute is still level 02's scalar loop; level 04 hands it to the tensor cores.

# %%
import functools

import cutlass
import cutlass.cute as cute
import pytest

import ladder_common as common
from tk_cute.ops import tma, warp
from tk_cute.types import coord, gl, st
from tk_cute.types.semaphore import init_fence, semaphore
from tk_cute.types.st import Shared

Mb, Nb, Kb = 32, 32, 32
TILE = (Mb, Nb, Kb)
a_tile, b_tile = st(cutlass.BFloat16, Mb, Kb), st(cutlass.BFloat16, Nb, Kb)

# %% [markdown]
# Warp 0 issues both loads (a TMA copy elects its own lane; `expect_bytes` is one arrival, from
# one lane); every thread waits for phase `phase` of the semaphore, then computes.

# %%
@cute.kernel
def kernel(A: gl, B: gl, mC: cute.Tensor):
    x, y, _ = cute.arch.thread_idx()
    i, j, _ = cute.arch.block_idx()
    smem = Shared()
    arrived = semaphore(smem.barriers(1))
    sA, sB = smem.alloc(a_tile), smem.alloc(b_tile)
    if warp.warpid() == 0:
        with warp.elect_leader():
            arrived.init(1)
    init_fence()
    cute.arch.sync_threads()

    acc = cutlass.Float32(0.0)
    phase = cutlass.Int32(0)
    for k in cutlass.range(cute.size(A.tiles(), mode=[3]), unroll=1):
        if warp.warpid() == 0:
            with warp.elect_leader():
                arrived.expect_bytes(a_tile.bytes + b_tile.bytes)
            tma.load_async(sA[None, None, 0], A, coord(i, k), arrived.ptr)
            tma.load_async(sB[None, None, 0], B, coord(j, k), arrived.ptr)
        arrived.wait(phase)
        phase ^= 1
        for kk in cutlass.range_constexpr(Kb):
            acc += sA[y, kk, 0].to(cutlass.Float32) * sB[x, kk, 0].to(cutlass.Float32)
        cute.arch.sync_threads()  # the tiles are read before the next loads overwrite them
    mC[i * Mb + y, j * Nb + x, 0] = acc.to(mC.element_type)


@cute.jit
def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
    grid = (c.shape[0] // Mb, c.shape[1] // Nb, 1)
    kernel(gl.load(a, a_tile), gl.load(b, b_tile), c).launch(
        grid=grid, block=(Nb, Mb, 1), stream=stream)


@functools.cache
def compiled(arch: str = common.ARCH):
    return common.compile_level(gemm, TILE, arch=arch)


compiled()  # in a notebook: registers, spills, instruction mix (`.ptx` has the text)

# %% [markdown]
# New in the PTX: the bulk tensor copies (one per operand per K step) and the mbarrier that
# counts their bytes; the per-thread global loads are gone from the main loop.

# %%
def test_compiles_to_tma_and_mbarriers():
    b = compiled()
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global.*mbarrier") == 2
    assert b.ptx_count(r"mbarrier\.init") == 1
    assert b.ptx_count(r"mbarrier\.arrive\.expect_tx") == 1
    assert b.ptx_count(r"mbarrier\.try_wait") >= 1
    assert b.ptx_count(r"ld\.global") == 0 and b.ptx_count(r"wgmma") == 0
    assert b.sass_count(r"UTMALDG") == 2


@pytest.mark.gpu
def test_matches_the_exact_product():
    common.check(gemm, TILE)


def bench():
    return common.bench(gemm, TILE, name="ladder 03 tma", rounds=3)


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    common.run_cells(test_compiles_to_tma_and_mbarriers, test_matches_the_exact_product, bench)
