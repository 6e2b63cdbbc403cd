# %% [markdown]
# # 03 - A ThunderKittens-style GEMM on Hopper, from Python
#
# You will learn:
# - how `kernels/gemm/gemm_sm90.py` reads as TK's H100 GEMM: a `Config`, tile types, and the
#   `lcf` template's load / compute / finish;
# - what it compiles to (wgmma, TMA, setmaxnreg; no spills) without a GPU;
# - how to call it from torch (`tk_cute.gemm`) when there is one.
# Measured on an H200 (docs/performance.md): bf16 8192^3 670-744 TFLOP/s, at parity with cuBLAS
# and with CUTLASS's CuTe DSL persistent GEMM.

# %%
import functools

import pytest
import torch

from tk_cute import viz
from tk_cute.arch import target
from tk_cute.kernels.gemm.gemm_sm90 import Config, GemmSm90

SMS = target("sm_90a").sm_count  # the persistent grid the compile assumes: 132 on an H100/H200

# %% [markdown]
# The kernel's tiles: 128 x 256 outputs per CTA, 64-wide K steps for bf16, as many stages as
# fit in the 227 KiB of shared memory next to the epilogue's buffers.

# %%
kernel = GemmSm90(Config(dtype="bfloat16"))
print(f"tile {kernel.Mb}x{kernel.Nb}x{kernel.Kb}, {kernel.LOAD_PIPE_DEPTH} stages, "
      f"{kernel.dynamic_shared_memory()} bytes of shared memory, {kernel.threads} threads")


@functools.cache
def compile_for_hopper(dtype="bfloat16"):
    import cutlass
    import cutlass.cute as cute
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import make_fake_tensor

    from tk_cute.compile import build

    k = GemmSm90(Config(dtype=dtype))

    def fake(t):
        r, c = cute.sym_int64(divisibility=256), cute.sym_int64(divisibility=128)
        return make_fake_tensor(t, (r, c, 1), (c, 1, r * c), assumed_align=16)

    return build(k, fake(k.a_tile.dtype), fake(k.b_tile.dtype), fake(cutlass.BFloat16), SMS,
                 cuda.CUstream(0), arch="sm_90a")


def test_compiles_to_the_hopper_instructions():
    b = compile_for_hopper()
    assert b.sass_count("HGMMA") == 4 and b.kernel.local_bytes == 0
    assert b.ptx_count(r"setmaxnreg") == 2


# %% [markdown]
# What it compiled to (in a notebook: resources and the instruction mix; the PTX is `.ptx`).

# %%
compile_for_hopper()

# %% [markdown]
# The A tile's shared-memory swizzle: each 16-byte chunk of a 128-byte row moves to chunk
# `c ^ (row % 8)`, so the 8 rows of one chunk column (what one ldmatrix / wgmma phase reads)
# hit all 32 banks.

# %%
viz.swizzle_plot(kernel.a_tile)

# %% [markdown]
# Which of the `SMS` (132) persistent CTAs computes which 128 x 256 tile of a 4096 x 4096 C, in
# supergroups of 8 tile rows (`ops/schedule.py`).

# %%
viz.schedule_plot(4096 // kernel.Mb, 4096 // kernel.Nb, ctas=SMS,
                  supergroup=kernel.SUPERGROUP_SIZE)

# %% [markdown]
# A 257 x 8192 C makes only 3 x 32 = 96 tiles: whole tiles leave 36 of the 132 SMs idle.
# Stream-K (`Config(STREAM_K=True)`) gives every CTA an equal run of (tile x 64-K step) units
# instead; a tile split between CTAs is summed by its head (outlined), which adds the later
# parts' fp32 sums in CTA order before its epilogue. On the H200 the dense GEMM's stream-K was
# slower than whole tiles everywhere (docs/facts.md#dense-stream-k), so `tk_cute.gemm` does not
# pick it; the NVFP4 tiled kernel runs the same code by default from 113 to 208 rows (one
# activation tile as wide as M, its K split between CTAs: 129 x 8192^2 at 1.18x cuBLAS bf16).

# %%
viz.stream_k_plot(-(-257 // kernel.Mb) * (8192 // kernel.Nb), 8192 // kernel.Kb)


# %% [markdown]
# On a Hopper GPU: C = A @ B^T against torch.

# %%
@pytest.mark.gpu
def test_gemm_on_the_gpu():
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    a = torch.randn(1000, 520, device="cuda", dtype=torch.bfloat16)  # partial edge tiles
    b = torch.randn(776, 520, device="cuda", dtype=torch.bfloat16)
    c = tk_cute.gemm(a, b)
    assert_gemm_close(c, a, b)  # every element: fp32 sums, one bf16 rounding


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    b = compile_for_hopper()
    print(f"compiled for sm_90a in {b.compile_seconds:.2f} s: {b.kernel.registers} registers, "
          f"{b.sass_count('HGMMA')} HGMMA per K step, {b.kernel.local_bytes} spill bytes")
    if torch.cuda.is_available():
        test_gemm_on_the_gpu()
        print("GPU check passed")
    else:
        print("GPU cell skipped: no CUDA device (test_gemm_on_the_gpu needs a Hopper GPU)")
