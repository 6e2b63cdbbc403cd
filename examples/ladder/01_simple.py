# %% [markdown]
# # Ladder 01 - The simplest tiled GEMM
#
# C = A @ B^T in bf16 with fp32 sums: A is (M, K), B is (N, K), both K-major, as every level
# of this ladder takes them.
#
# You will learn:
# - how a CuTe DSL kernel is written (`@cute.kernel`) and launched (`@cute.jit` host function);
# - the grid of output tiles: one CTA per 16 x 16 tile of C, one thread per element;
# - what that compiles to: global loads and scalar FMAs (`ld.global`, `fma.rn.f32`), nothing
#   shared between threads: every A and B element is read from memory Mb or Nb times.
#
# Runs on a CPU (compile and read the PTX); checks and times itself on a GPU.

# %%
import functools

import cutlass
import cutlass.cute as cute
import pytest

import ladder_common as common

Mb, Nb, Kb = 16, 16, 1  # the CTA's output tile; K is walked one element at a time
TILE = (Mb, Nb, Kb)

# %% [markdown]
# The kernel: thread (x, y) of CTA (i, j) owns C[i * Mb + y, j * Nb + x]. Consecutive threads
# of a warp take consecutive columns n, so their B reads are K elements apart: nothing is
# coalesced, which is what later levels fix.

# %%
@cute.kernel
def kernel(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
    x, y, _ = cute.arch.thread_idx()
    i, j, _ = cute.arch.block_idx()
    m, n = i * Mb + y, j * Nb + x
    acc = cutlass.Float32(0.0)
    for k in cutlass.range(mA.shape[1], unroll=1):
        acc += mA[m, k, 0].to(cutlass.Float32) * mB[n, k, 0].to(cutlass.Float32)
    mC[m, n, 0] = acc.to(mC.element_type)


@cute.jit
def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
    grid = (cute.ceil_div(c.shape[0], Mb), cute.ceil_div(c.shape[1], Nb), 1)
    kernel(a, b, c).launch(grid=grid, block=(Nb, Mb, 1), stream=stream)


@functools.cache
def compiled(arch: str = common.ARCH):
    return common.compile_level(gemm, TILE, arch=arch)


compiled()  # in a notebook: registers, spills and the instruction mix; `.ptx` has the text

# %% [markdown]
# Global loads and one FMA per K element; nothing else.

# %%
def test_compiles_to_global_loads_and_fma():
    b = compiled()
    assert b.ptx_count(r"ld\.global") == 2 and b.ptx_count(r"fma\.rn\.f32") == 1
    assert b.ptx_count(r"ld\.shared|wgmma|cp\.async") == 0  # no reuse yet
    assert b.kernel.local_bytes == 0


@pytest.mark.gpu
def test_matches_the_exact_product():
    common.check(gemm, TILE, mnk=(256, 512, 320))


def bench():
    return common.bench(gemm, TILE, name="ladder 01 simple", rounds=3)


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    common.run_cells(test_compiles_to_global_loads_and_fma, test_matches_the_exact_product, bench)
