# %% [markdown]
# # Ladder 02 - Shared-memory tiles
#
# You will learn:
# - TK's shared tile `st(dtype, rows, cols)`: a typed, swizzled tile in shared memory, placed by
#   `Shared.alloc`;
# - the load / sync / compute / sync loop: a CTA stages one (Mb, Kb) slice of A and one (Nb, Kb)
#   slice of B, every thread reads them Kb times from shared memory instead of global memory;
# - what that compiles to: `st.shared`, `ld.shared` and `bar.sync`.
#
# Runs on a CPU (compile and read the PTX); checks and times itself on a GPU.

# %%
import functools

import cutlass
import cutlass.cute as cute
import pytest

import ladder_common as common
from tk_cute.types import st
from tk_cute.types.st import Shared

Mb, Nb, Kb = 32, 32, 32  # one thread per output element, 1024 threads
TILE = (Mb, Nb, Kb)
a_tile, b_tile = st(cutlass.BFloat16, Mb, Kb), st(cutlass.BFloat16, Nb, Kb)

# %% [markdown]
# Thread (x, y) copies A[row y, col x] and B[row y, col x] of the slice (consecutive threads read
# consecutive K: coalesced), then sums its 32 products from shared memory. The swizzle is
# invisible here: indexing a CuTe tensor of the tile's layout applies it.

# %%
@cute.kernel
def kernel(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
    x, y, _ = cute.arch.thread_idx()
    i, j, _ = cute.arch.block_idx()
    smem = Shared()
    sA, sB = smem.alloc(a_tile), smem.alloc(b_tile)
    acc = cutlass.Float32(0.0)
    for k0 in cutlass.range(0, mA.shape[1], Kb, unroll=1):
        sA[y, x, 0] = mA[i * Mb + y, k0 + x, 0]
        sB[y, x, 0] = mB[j * Nb + y, k0 + x, 0]
        cute.arch.sync_threads()  # the slice is complete
        for kk in cutlass.range_constexpr(Kb):
            acc += sA[y, kk, 0].to(cutlass.Float32) * sB[x, kk, 0].to(cutlass.Float32)
        cute.arch.sync_threads()  # everyone is done reading before the next slice lands
    mC[i * Mb + y, j * Nb + x, 0] = acc.to(mC.element_type)


@cute.jit
def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
    grid = (c.shape[0] // Mb, c.shape[1] // Nb, 1)
    kernel(a, b, c).launch(grid=grid, block=(Nb, Mb, 1), stream=stream)


@functools.cache
def compiled(arch: str = common.ARCH):
    return common.compile_level(gemm, TILE, arch=arch)


compiled()  # in a notebook: registers, spills, instruction mix (`.ptx` has the text)

# %% [markdown]
# New in the PTX: shared stores and loads, and the CTA barrier between them.

# %%
def test_compiles_to_shared_loads_and_barriers():
    b = compiled()
    assert b.ptx_count(r"st\.shared") >= 2 and b.ptx_count(r"ld\.shared") >= 2 * Kb // 2
    assert b.ptx_count(r"bar\.sync|barrier\.sync") >= 2
    assert b.ptx_count(r"wgmma|cp\.async\.bulk") == 0
    assert b.kernel.local_bytes == 0


@pytest.mark.gpu
def test_matches_the_exact_product():
    common.check(gemm, TILE)


def bench():
    return common.bench(gemm, TILE, name="ladder 02 shared tiles", rounds=3)


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    common.run_cells(test_compiles_to_shared_loads_and_barriers,
                     test_matches_the_exact_product, bench)
