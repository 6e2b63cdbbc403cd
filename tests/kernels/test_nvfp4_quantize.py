"""NVFP4 quantizer: CPU compile checks for every target, GPU byte-for-byte checks vs the reference.

CPU tier: builds the amax and quantize kernels from fake tensors for sm_90a/100a/103a/107a and
asserts the instructions (native ``cvt ... e2m1x2`` on sm_100a+ only, IEEE ``div.rn``, no
approximate division), and no spills.
GPU tier (marker gpu): `quantize_cuda` equals `quantize_reference` byte for byte (data, scales
including padding, global scale) on many shapes and adversarial values.
"""

import pytest
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from tk_cute.compile import build
from tk_cute.kernels import nvfp4_quantize as nq

ARCHS = ("sm_90a", "sm_100a", "sm_103a", "sm_107a")
ELEM = {"bf16": cutlass.BFloat16, "f16": cutlass.Float16, "f32": cutlass.Float32}


def _fake(dtype, align=16):
    n = cute.sym_int64(divisibility=16)
    return cute.runtime.make_fake_tensor(dtype, (n,), (1,), assumed_align=align)


def _stream():
    from cuda.bindings import driver

    return driver.CUstream(0)


def _build_quantize(arch, dtype="bf16", given=False):
    cfg = nq.Config(dtype=dtype, arch=arch, given_scale=given,
                    blocks_per_thread=2 if dtype == "f32" else 4)
    args = (cfg, _fake(ELEM[dtype]), _fake(cutlass.Uint8), _fake(cutlass.Uint8),
            _fake(cutlass.Int32), _fake(cutlass.Float32, 4), _fake(cutlass.Float32, 4),
            Int32(128), Int32(64), Int32(1), _stream())
    return build(nq._quantize, *args, arch=arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_kernel_instructions(arch):
    b = _build_quantize(arch)
    native = b.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2\.f32")
    if arch == "sm_90a":
        assert native == 0
        assert b.ptx_count(r"add\.rn\.f32") > 0  # the magic-add E2M1 rounding
    else:
        assert native == 4 * 2 * 4  # 4 pairs x 2 words x 4 blocks per thread
    assert b.ptx_count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == 4
    assert b.ptx_count(r"div\.rn\.f32") == 2 * 4 + 2  # 2 per block + the global scales
    assert b.ptx_count(r"div\.(approx|full)") == 0
    assert b.ptx_count(r"\bfma\.") == 0  # the recipe forbids contraction
    assert b.kernel.local_bytes == 0, b.kernel
    assert b.sass_count(r"LDG\.E\.EF\.128") == 8


@pytest.mark.parametrize("arch", ("sm_90a", "sm_100a"))
@pytest.mark.parametrize("dtype", ("f16", "f32"))
def test_quantize_kernel_dtypes_compile(arch, dtype):
    b = _build_quantize(arch, dtype)
    assert b.kernel.local_bytes == 0
    assert (b.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2") > 0) == (arch != "sm_90a")


@pytest.mark.parametrize("arch", ("sm_90a", "sm_107a"))
def test_given_scale_skips_amax_word(arch):
    b = _build_quantize(arch, given=True)
    assert b.kernel.local_bytes == 0
    assert b.ptx_count(r"div\.rn\.f32") == 2 * 4 + 1  # only 1/s_dec_g globally


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ("bf16", "f32"))
def test_amax_kernel_compiles(arch, dtype):
    cfg = nq.Config(dtype=dtype, arch=arch)
    b = build(nq._amax, cfg, _fake(ELEM[dtype]), _fake(cutlass.Int32), Int64(64), Int32(1),
              _stream(), arch=arch)
    assert b.kernel.local_bytes == 0
    loads = b.sass_count(r"LDG\.E\.EF\.128")  # ptxas may unroll the grid-stride loop further
    assert loads >= nq.AMAX_UNROLL and loads % nq.AMAX_UNROLL == 0
    assert b.sass_count(r"REDUX") >= 1


# ---------------------------------------------------------------- GPU tier


def _check(x, global_scale=None):
    from tk_cute.nvfp4 import quantize_reference

    ref = quantize_reference(x, global_scale=global_scale)
    got = nq.quantize_cuda(x, None if global_scale is None else
                           torch.as_tensor(global_scale, dtype=torch.float32, device=x.device))
    torch.cuda.synchronize()
    assert got.data.shape == ref.data.shape and got.scales.shape == ref.scales.shape
    bad = (got.data != ref.data).nonzero()
    assert bad.numel() == 0, f"data differs at {bad[:8].tolist()} (shape {tuple(x.shape)})"
    bad = (got.scales != ref.scales).nonzero()
    assert bad.numel() == 0, f"scales differ at {bad[:8].tolist()} (shape {tuple(x.shape)})"
    assert got.global_scale.view(torch.int32).item() == ref.global_scale.view(torch.int32).item()
    return got


SHAPES = [(1, 16), (7, 48), (128, 64), (129, 80), (300, 272), (256, 4096), (1000, 1008),
          (3, 5, 32), (2, 130, 208), (4, 64, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
def test_random_matches_reference(shape, dtype, seed):
    x = torch.randn(shape, device="cuda").to(dtype)
    _check(x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
def test_huge_dynamic_range_and_zero_blocks(dtype, seed):
    lim = {torch.bfloat16: 120, torch.float16: 14, torch.float32: 120}[dtype]
    x = torch.randn(3, 257, 528, device="cuda")
    x = x * torch.exp2(torch.randint(-lim, lim, x.shape, device="cuda").float())
    x[:, :, 32:48] = 0  # zero blocks
    x[:, 5] = 0
    x[:, 6, ::3] = -0.0
    if dtype != torch.float32:
        x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)
    _check(x.to(dtype))
    _check(torch.zeros(130, 64, device="cuda", dtype=dtype))  # all-zero tensor


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_ties_and_saturation_points(dtype):
    # With global_scale 1/2688 and a block amax of 6*448/2688*... choose blocks whose scale
    # comes out exactly 1: amax 6 -> t = 1 * s_enc_g... use a given scale so s_enc = 1 exactly.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    near = [v * (1 + s * 2.0**-7) for v in ties for s in (-1, 1)]
    vals = torch.tensor(ties + [-v for v in ties] + near[:32], dtype=torch.float32)
    x = vals.reshape(-1, 16)
    x[:, 0] = 6.0  # block amax 6 -> sf = E4M3(1.0 * 448 / 448) with s_dec_g = 1/448
    x = torch.cat([x, x * 2.0**-5, x * 2.0**5]).to("cuda").to(dtype)
    _check(x, global_scale=1.0 / 448)
    _check(x, global_scale=2.0**-126)  # t overflows: scales saturate to 448 (0x7E)
    _check(x)
    # saturation: blocks where x*s_enc lands just above 6 and E4M3 scale ties
    y = torch.randn(64, 256, device="cuda")
    y[:, ::16] = 448.0 * 6 / 2688 * 17
    _check(y.to(dtype))


@pytest.mark.gpu
def test_given_global_scale_random(seed):
    x = torch.randn(2, 200, 160, device="cuda", dtype=torch.bfloat16)
    for gs in (1e-3, 0.37, 3.0, 1e-30):
        _check(x, global_scale=gs)


@pytest.mark.gpu
def test_non_finite_rejected_and_opt_out():
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[100, 17] = bad
        with pytest.raises(ValueError, match="finite"):
            nq.quantize_cuda(y)
        with pytest.raises(ValueError, match="finite"):
            nq.quantize_cuda(y, torch.tensor(0.01, device="cuda"))
        nq.quantize_cuda(y, check_finite=False)  # no error, no sync
    # finite input: same bytes with and without the check
    a, b = nq.quantize_cuda(x), nq.quantize_cuda(x, check_finite=False)
    assert torch.equal(a.data, b.data) and torch.equal(a.scales, b.scales)


@pytest.mark.gpu
def test_outputs_fully_written():
    """Poisoned allocations: every data and scale byte (padding too) must be written."""
    x = torch.randn(130, 48, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    # The caching allocator hands back the poisoned blocks of the same sizes.
    for _ in range(2):
        ref = nq.quantize_cuda(x)
        junk = [torch.full_like(ref.data, 0xAB), torch.full_like(ref.scales, 0xAB)]
        del ref, junk
    got = _check(x)
    assert (got.scales.view(-1)[got.scales.numel() - 1] == 0)
