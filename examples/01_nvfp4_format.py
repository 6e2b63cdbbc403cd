# %% [markdown]
# # 01 - The NVFP4 format, bit by bit
#
# You will learn:
# - what an NVFP4 tensor stores (E2M1 nibbles, UE4M3 block scales, an fp32 global scale);
# - how the 128x4 blocked scale layout places a scale byte;
# - how close an NVFP4 GEMM is to the unquantized one, and that `tk_cute.nvfp4.gemm` equals its
#   exact reference.
# Runs on a CPU (and on a GPU when there is one).

# %%
import torch

from tk_cute import nvfp4, viz

# %% [markdown]
# The 16 E2M1 codes: sign bit, 2 exponent bits (bias 1), 1 mantissa bit.

# %%
print("E2M1 values by code:", nvfp4.E2M1_VALUES)

# %% [markdown]
# Quantize a random matrix: one UE4M3 scale per 16 elements along K, data packed two codes per
# byte (element 2i in the low nibble).

# %%
def quantize_example(M=200, K=96, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(M, K)
    q = nvfp4.quantize(x)
    return x, q


x, q = quantize_example()
print(q, "data", tuple(q.data.shape), "scales", tuple(q.scales.shape))

# %% [markdown]
# Where does the scale of row m, block kb live? `blocked_offset` is the 128x4 layout
# (cuBLASLt VEC16_UE4M3, torch's `to_blocked`, what tcgen05 reads).

# %%
m, kb = 130, 5
print("byte offset of the scale of (130, 5):", nvfp4.blocked_offset(m, kb, 200, 96))


# %% [markdown]
# The same lookup as a picture (`tk_cute.viz.scale_tiling_plot`, drawn from `blocked_offset`):
# the padded (256, 8) scale matrix in 128x4 atoms, the byte of element (130, 80)'s scale
# inside its atom, and where the kernel's K stage puts atoms in tensor memory.

# %%
picture = viz.scale_tiling_plot(200, 96, element=(130, 80), stage=0)
assert picture.drawn["element"]["offset"] == nvfp4.blocked_offset(130, 80 // 16, 200, 96)
picture


# %%
def test_scale_lookup_matches_the_logical_matrix():
    x, q = quantize_example(seed=1)
    logical = q.scales_logical()
    flat = q.scales.reshape(-1)
    for m, kb in [(0, 0), (31, 3), (130, 5), (199, 2)]:
        assert flat[nvfp4.blocked_offset(m, kb, 200, 96)] == logical[m, kb]


# %% [markdown]
# Rows of codes start 16 bytes apart: the TMA's global strides must be multiples of 16 bytes.
# K % 32 == 0 gives that for free (K / 2 bytes a row); for any other K % 16 (K = 48 here, 8208
# in a real model) the rows are padded once, when the tensor is made: `data` keeps its logical
# shape (M, K / 2) as a view of the padded rows, `data_padded` shows the bytes as stored.

# %%
def test_rows_of_codes_are_16_bytes_apart():
    from tk_cute.layouts.nvfp4_codes import row_pitch

    q48 = nvfp4.quantize(torch.randn(4, 48))
    assert q48.data.shape == (4, 24) and q48.data.stride() == (row_pitch(48), 1) == (32, 1)
    assert q48.data_padded.shape == (4, 32) and bool((q48.data_padded[:, 24:] == 0).all())
    return q48


print("K = 48: data", tuple(test_rows_of_codes_are_16_bytes_apart().data.stride()),
      "strides (the row pitch is 32 bytes)")


# %% [markdown]
# An NVFP4 GEMM. On a GPU `nvfp4.gemm` runs a kernel (`nvfp4.plan` names it), checked element
# by element against the float64 product of the exactly decoded operands
# (`tk_cute.testing.assert_gemm_close`, whose docstring derives the bound). On a CPU there is
# no kernel: `gemm` runs the exact integer reference, which is then what we check, against the
# same independent float64 product.

# %%
def test_gemm_matches_the_exact_product():
    from tk_cute.testing import assert_gemm_close

    torch.manual_seed(2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = nvfp4.quantize(torch.randn(256, 512, device=device))
    b = nvfp4.quantize(torch.randn(256, 512, device=device))
    plan = nvfp4.plan(a, b, torch.float32)
    assert (plan.path == "reference") == (device == "cpu")
    d = nvfp4.gemm(a, b, out_dtype=torch.float32)
    assert_gemm_close(d, a, b, f"nvfp4.gemm via {plan}")
    return plan


if __name__ == "__main__":
    test_scale_lookup_matches_the_logical_matrix()
    test_rows_of_codes_are_16_bytes_apart()
    plan = test_gemm_matches_the_exact_product()
    print(f"ok: nvfp4.gemm ran {plan} and matched the float64 product element by element")
