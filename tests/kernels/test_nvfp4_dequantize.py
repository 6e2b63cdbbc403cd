"""Hopper NVFP4 "dequantize" path: the operands expanded to exact bf16 (block dequantize,
`kernels/nvfp4_dequantize.py`), then the dense GEMM with gA gB in its epilogue."""

import pytest
import torch

from tk_cute.compile import build

# --- GPU -------------------------------------------------------------------------------------

SHAPES = [(128, 256, 64), (256, 512, 512), (1024, 768, 1024), (2048, 2048, 4096),
          (384, 1280, 2112)]


@pytest.mark.gpu
@pytest.mark.parametrize("w4a4", [True, False], ids=["W4A4", "W4A16"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_matches_exact_reference(seed, w4a4, M, N, K):
    # Operands come from the host recipe on the GPU (quantize_reference) so that this test does
    # not depend on the quantizer kernel, which has tests of its own.
    from tk_cute import nvfp4
    from tk_cute.testing import assert_gemm_close

    x = torch.randn(M, K, device="cuda") * torch.rand(M, 1, device="cuda") * 10
    w = nvfp4.quantize_reference(torch.randn(N, K, device="cuda"))
    a = nvfp4.quantize_reference(x) if w4a4 else x.to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    d = nvfp4.gemm(a, w, out=out, path="dequantize")
    assert d.data_ptr() == out.data_ptr()
    assert_gemm_close(d, a, w, "path dequantize")  # every element (bound: tk_cute.testing)


@pytest.mark.gpu
def test_w4a4_fp16_output(seed):
    from tk_cute import nvfp4
    from tk_cute.testing import assert_gemm_close

    a = nvfp4.quantize_reference(torch.randn(256, 512, device="cuda"))
    b = nvfp4.quantize_reference(torch.randn(256, 512, device="cuda"))
    out = torch.full((256, 256), float("nan"), device="cuda", dtype=torch.float16)  # poison
    d = nvfp4.gemm(a, b, out_dtype=torch.float16, out=out, path="dequantize")
    assert d.dtype == torch.float16 and d.data_ptr() == out.data_ptr()
    assert_gemm_close(d, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M, K", [(300, 192), (7, 16), (129, 48), (64, 8208)])
def test_dequantize_blocks_is_exact(seed, M, K):
    from tk_cute import nvfp4
    from tk_cute.nvfp4.launch import dequantize_blocks

    q = nvfp4.quantize_reference(torch.randn(M, K, device="cuda") * 100)
    got = dequantize_blocks(q, out=torch.full((M, K), float("nan"), device="cuda",
                                              dtype=torch.bfloat16))  # poisoned
    # e2m1 * ue4m3 is exact in bf16: the block values without the global scale, bit for bit.
    want = (q.dequantize(torch.float64) / q.global_scale.double()).to(torch.bfloat16)
    assert torch.equal(got, want)


def test_dequantize_blocks_compiles_to_vector_accesses():
    from tk_cute.kernels import nvfp4_dequantize as dq

    b = build(dq._dequantize, *dq.signature().compile_args("ue4m3"), arch="sm_90a")
    dq.compile_launcher("ue4m3", options="--gpu-arch sm_90a")  # our packing == the DSL's
    # Per word of 8 codes: one 4-byte load, its scale byte, one 16-byte store (coalesced across
    # the warp); WORDS_PER_THREAD words per thread.
    n = dq.WORDS_PER_THREAD
    assert b.sass_count(r"LDG\.E\b(?!\.)") == n and b.sass_count(r"STG\.E\.128") == n
    assert b.sass_count(r"LDG\.E\.U8") == n
    assert b.kernel.local_bytes == 0


def test_dequantize_pair_compiles_to_vector_accesses():
    """Both W4A4 operands in one walk: per word the single kernel's accesses (one 4-byte code
    load, its scale byte, one 16-byte store), twice the words per thread's round (A's or
    B's), and one fp32 multiply for D's scale."""
    from tk_cute.kernels import nvfp4_dequantize as dq

    b = build(dq._dequantize_pair, *dq.pair_signature().compile_args("ue4m3"), arch="sm_90a")
    dq.compile_launcher("ue4m3", options="--gpu-arch sm_90a", pair=True)
    n = dq.WORDS_PER_THREAD
    assert b.sass_count(r"STG\.E\.128") == 2 * n and b.sass_count(r"LDG\.E\.U8") == 2 * n
    assert b.sass_count(r"\bFMUL\b") == 1
    assert b.kernel.local_bytes == 0


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(100, 136, 272), (1000, 2880, 2880), (3, 8192, 8192)])
def test_dequantize_pair_matches_two_launches(seed, M, N, K):
    """`dequantize_pair` writes what two `dequantize_blocks` write, bit for bit, into poisoned
    outputs (K % 32 != 0: padded rows of codes), and gA * gB as torch multiplies them; the
    paired "dequantize" GEMM is bit for bit the two-launch one."""
    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch

    a = nvfp4.quantize(torch.randn(M, K, device="cuda"))
    b = nvfp4.quantize(torch.randn(N, K, device="cuda") * 0.02)
    nan = lambda r: torch.full((r, K), float("nan"), device="cuda", dtype=torch.bfloat16)  # noqa: E731
    a16, b16, scale = launch.dequantize_pair(a, b, out_a=nan(M), out_b=nan(N))
    assert torch.equal(a16, launch.dequantize_blocks(a))
    assert torch.equal(b16, launch.dequantize_blocks(b))
    assert torch.equal(scale, a.global_scale * b.global_scale)
    outs = [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(2)]
    for out, paired in zip(outs, (True, False)):
        launch.dequantize(a, b, out, paired=paired)
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="one K"):
        launch.dequantize_pair(a, nvfp4.quantize(torch.randn(N, K + 16, device="cuda")))
