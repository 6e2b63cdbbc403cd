# %% [markdown]
# # Ladder 07 - The persistent kernel on the `lcf` template (tk_cute's Hopper GEMM)
#
# Level 06 is already TK's H100 GEMM in shape (128 x 256 tile, one producer and two consumer
# warpgroups, a 4-stage ring, setmaxnreg). `kernels/gemm/gemm_sm90.py` is that kernel written
# on TK's load-compute-finish template (`tk_cute/templates/lcf.py`), which adds:
# - persistence: one CTA per SM walks many tiles (`ops/schedule.py`, supergroup order: CTAs
#   that run together share A and B panels in L2), so the ring never drains between tiles;
# - an epilogue through shared memory: registers -> `stmatrix` -> a few small buffers -> TMA
#   store, overlapped with the next tile's loads (the producer runs ahead);
# - the ring as `cutlass.pipeline.PipelineTmaAsync` (level 06's two semaphores per slot, with
#   the phase kept in a pipeline state), clusters with TMA multicast, any M, N, K.
# The kernel itself is 4 methods: `load` (producer), `setup`, `compute`, `finish` (consumers).

# %%
import functools
import inspect

import pytest

import ladder_common as common
from tk_cute import viz
from tk_cute.kernels.gemm.gemm_sm90 import Config, GemmSm90

kernel = GemmSm90(Config(dtype="bfloat16"))
TILE = (kernel.Mb, kernel.Nb, kernel.Kb)
print(inspect.getsource(GemmSm90.load))
print(inspect.getsource(GemmSm90.compute))

# %% [markdown]
# Which CTA takes which tile: 132 persistent CTAs over an 8192 x 8192 C (64 x 32 tiles), in
# supergroups of 8 tile rows (drawn from the scheduler's own `supergroup_coord`).

# %%
viz.schedule_plot(8192 // kernel.Mb, 8192 // kernel.Nb, ctas=common.SMS,
                  supergroup=kernel.SUPERGROUP_SIZE)

# %%
@functools.cache
def compiled(arch: str = common.ARCH):
    return common.compile_level(kernel, TILE, common.SMS, arch=arch)


compiled()

# %% [markdown]
# New in the PTX against level 06: `stmatrix` and the TMA store of the epilogue; the same
# wgmma, ring and register split.

# %%
def test_compiles_to_the_persistent_lcf_kernel():
    b = compiled()
    assert b.ptx_count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16") == 4
    assert b.ptx_count(r"stmatrix") > 0
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta") >= 1  # TMA store
    assert b.ptx_count(r"setmaxnreg") == 2 and b.kernel.local_bytes == 0
    assert b.ptx_count(r"st\.global") == 0  # every store of C goes through TMA


@pytest.mark.gpu
def test_matches_the_exact_product():
    common.check(kernel, TILE, common.SMS)


def bench():
    return common.bench(kernel, TILE, common.SMS, name="ladder 07 lcf persistent")


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    common.run_cells(test_compiles_to_the_persistent_lcf_kernel,
                     test_matches_the_exact_product, bench)
