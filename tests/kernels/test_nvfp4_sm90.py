"""Hopper NVFP4 GEMM by exact emulation (kernels/gemm/nvfp4_sm90.py), large-M path."""

import pytest
import torch

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from tk_cute.arch import target
from tk_cute.compile import build
from tk_cute.kernels.gemm.nvfp4_sm90 import Config, GemmNvfp4Sm90, check_shapes


def _fake(dtype, col_div):
    r, c = cute.sym_int64(divisibility=128), cute.sym_int64(divisibility=col_div)
    return make_fake_tensor(dtype, (r, c, 1), (c, 1, r * c), assumed_align=16)


def _fake_scales():
    r = cute.sym_int64(divisibility=2)
    return make_fake_tensor(cutlass.Uint8, (r, 256, 1), (256, 1, r * 256), assumed_align=16)


@pytest.fixture(scope="module", params=["nvfp4", "bf16"])
def built(request):
    from cuda.bindings import driver as cuda

    k = GemmNvfp4Sm90(Config(a_format=request.param))
    a = _fake(cutlass.Uint8, 32) if request.param == "nvfp4" else _fake(cutlass.BFloat16, 64)
    alpha = make_fake_tensor(cutlass.Float32, (1,), (1,), assumed_align=4)
    args = (a, _fake_scales(), _fake(cutlass.Uint8, 32), _fake_scales(),
            _fake(cutlass.BFloat16, 256), alpha, 132, cuda.CUstream(0))
    return request.param, k, build(k, *args, arch="sm_90a")


def test_decodes_with_integer_ops_and_multiplies_with_wgmma(built):
    fmt, k, b = built
    # 16-byte chunks (32 elements) decoded per stage and operand: TRANSFORM_SHARE of them by the
    # 96 transform threads, the rest by the 256 consumer threads; rounds = unrolled chunk loops.
    rounds = 0
    for rows in (k.Mb, k.Nb) if fmt == "nvfp4" else (k.Nb,):
        mine = int(rows * 2 * k.TRANSFORM_SHARE)
        rounds += -(-mine // k.TRANSFORM_THREADS) + -(-(rows * 2 - mine) // 256)
    assert b.sass_count(r"HGMMA\.64x256x16\.F32\.BF16") == 4
    # FP4 decode: byte-permute spreads nibbles, exact bf16x2 multiplies place and scale them;
    # no float conversion instruction touches FP4 (sm_90a has none).
    assert b.sass_count(r"\bPRMT\b") >= 4 * rounds
    # one bf16x2 multiply per two elements + two per scale (the 2^-8 shift is in the scale)
    assert b.sass_count(r"HMUL2\.BF16") == 20 * rounds
    assert b.ptx_count(r"cvt\.\S*e2m1") == 0
    assert b.sass_count(r"STS\.128") >= 4 * rounds  # 16-byte stores into the bf16 tiles
    assert b.sass_count(r"LDS\.128") >= rounds  # 16-byte reads of packed FP4
    assert b.sass_count(r"\bSTS\.(U8|U16|32|64)\b") == 0  # no narrow stores
    assert b.ptx_count(r"cp\.async\.bulk\.tensor") >= 4
    assert b.kernel.local_bytes == 0 and b.sass_count(r"\bSTL\b") == 0


def test_shared_memory_fits(built):
    _, k, _ = built
    assert k.LOAD_PIPE_DEPTH >= 3
    assert k.dynamic_shared_memory() <= target("sm_90a").smem_bytes


def test_config_and_shape_rejections():
    with pytest.raises(ValueError, match="a_format"):
        Config(a_format="fp8")
    with pytest.raises(ValueError, match="COMPUTE_PIPE_DEPTH must be >= 2"):
        Config(COMPUTE_PIPE_DEPTH=1)
    k = GemmNvfp4Sm90()
    with pytest.raises(ValueError, match="N=384 must be a multiple of 256"):
        check_shapes(128, 384, 64, k)
    with pytest.raises(ValueError, match="K=96 must be a multiple of 64"):
        check_shapes(128, 256, 96, k)


# --- GPU -------------------------------------------------------------------------------------

SHAPES = [(128, 256, 64), (256, 512, 512), (1024, 768, 1024), (2048, 2048, 4096),
          (384, 1280, 2112)]


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["dequantize", "fused"])
@pytest.mark.parametrize("w4a4", [True, False], ids=["W4A4", "W4A16"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_matches_exact_reference(seed, path, w4a4, M, N, K):
    # Operands come from the host recipe on the GPU (quantize_reference) so that this test does
    # not depend on the quantizer kernel, which has tests of its own.
    from tk_cute import nvfp4
    from tk_cute.testing import assert_gemm_close

    x = torch.randn(M, K, device="cuda") * torch.rand(M, 1, device="cuda") * 10
    w = nvfp4.quantize_reference(torch.randn(N, K, device="cuda"))
    a = nvfp4.quantize_reference(x) if w4a4 else x.to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    d = nvfp4.gemm(a, w, out=out, path=path)
    assert d.data_ptr() == out.data_ptr()
    assert_gemm_close(d, a, w, f"path {path}")  # every element (bound: tk_cute.testing)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["dequantize", "fused"])
def test_w4a4_fp16_output(seed, path):
    from tk_cute import nvfp4
    from tk_cute.testing import assert_gemm_close

    a = nvfp4.quantize_reference(torch.randn(256, 512, device="cuda"))
    b = nvfp4.quantize_reference(torch.randn(256, 512, device="cuda"))
    out = torch.full((256, 256), float("nan"), device="cuda", dtype=torch.float16)  # poison
    d = nvfp4.gemm(a, b, out_dtype=torch.float16, out=out, path=path)
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


def test_the_dispatch_never_picks_the_fused_kernel():
    """Every shape the fused kernel takes (M % 128, N % 256, K % 64) a register-A kernel takes
    too (K % 32, N % 128): "fused" runs only when forced, and every path the rules pick decodes
    UE5M3 scales as well."""
    from tk_cute.kernels.gemm import nvfp4_sm90 as sm90
    from tk_cute.nvfp4 import heuristics

    for M in (128, 256, 1024, 8192):
        for N in (256, 8192, 28672):
            for K in (64, 192, 2880, 8192):
                assert sm90.supports(M, N, K)
                for w4a4 in (False, True):
                    assert heuristics.hopper_path(w4a4, M, N, K, 132) in heuristics.UE5M3_PATHS
