"""UE5M3 block scales on the Hopper kernels (issue 23): compile checks on the CPU, GPU runs marked.

The small-M (`nvfp4_small_m_sm90`), register-A (`nvfp4_register_a_sm90`), tiled register-A
(`nvfp4_register_a_tiled_sm90`) kernels and the block dequantize (`nvfp4_dequantize`) take a scale
format (`Config.sf` / `sf_format`). CPU tier: each UE5M3 build decodes with the UE5M3 constants
(2^112 to restore sf from its bits << 4, 2^110 to prescale it) and undoes the decode's 2^-16 (not
2^-8) per operand, with no spill; the UE4M3 builds are unchanged (their PTX was hashed before
and after the change, and the kernel symbols keep no trace of the default format). GPU tier
(marker gpu; run on the H200, 2026-12-01): `tk_cute.nvfp4.gemm` on UE5M3 operands against
the exact reference, every path that takes them, and the block dequantize against
`dequantize`: ``python -m pytest -m gpu tests/kernels/test_nvfp4_ue5m3_sm90.py``.
"""

import dataclasses
import re

import pytest
import torch
from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv
from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst

from tk_cute.compile import build
from tk_cute.ops import nvfp4 as fp4
from tk_cute.tuning import sm90 as sm90_tuning

UNBIAS, PRESCALE = fp4.UE5M3_BF16_UNBIAS, fp4.UE5M3_BF16_PRESCALE  # 2^112, 2^110 per half
UE4M3_PAIR = (0x7B807B80, 0x7A807A80)  # 2^120, 2^118


def _movs(b) -> set:
    return {int(v) for v in re.findall(r"mov\.b32\s+%r\d+, (\d+);", b.ptx)}


def _f32(b, value: float) -> int:
    """PTX lines using the float32 constant `value` (0fXXXXXXXX)."""
    import struct

    return b.ptx_count("0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0])


def _no_spills(b):
    for r in b.resources:
        assert r.local_bytes == 0 and r.stack_bytes == 0, r


@pytest.mark.parametrize("w4a4", [False, True])
def test_small_m_ue5m3_decode(w4a4):
    cfg = dataclasses.replace(sm90_tuning.small_m_config(8 if w4a4 else 1, 8192, 8192, w4a4),
                              sf="ue5m3")
    b = build(gv._launch, *gv.signature(cfg).compile_args(cfg), arch="sm_90a")
    base = sm90_tuning.small_m_config(8 if w4a4 else 1, 8192, 8192, w4a4)
    b4 = build(gv._launch, *gv.signature(base).compile_args(base), arch="sm_90a")
    assert {UNBIAS, PRESCALE} <= _movs(b) and not set(UE4M3_PAIR) & _movs(b)
    assert set(UE4M3_PAIR) <= _movs(b4)
    # D's scale: gB * 2^16 (W4A4: times gA * 2^16), 2^8 for UE4M3
    assert _f32(b, 2.0**16) >= 1 and _f32(b, 2.0**8) == 0 and _f32(b4, 2.0**8) >= 1
    # the same decode otherwise: as many bf16 multiplies and MMAs
    for pat in (r"mul\.rn\.bf16x2", r"mma\.sync\.aligned\.m16n8k16"):
        assert b.ptx_count(pat) == b4.ptx_count(pat), pat
    _no_spills(b)
    # the default format stays out of the kernel symbol (the UE4M3 PTX is what it was)
    assert "sfue5m3" in b.ptx and "sfue4m3" not in b4.ptx and repr(base) == repr(
        dataclasses.replace(base, sf="ue4m3"))


def test_register_a_ue5m3_decode():
    cfg = rs.Config(N_ACT=16, sf="ue5m3")
    b = build(rs._launch, *rs.signature(cfg).compile_args(cfg), arch="sm_90a")
    b4 = build(rs._launch, *rs.signature(rs.Config(N_ACT=16)).compile_args(rs.Config(N_ACT=16)),
               arch="sm_90a")
    assert {UNBIAS, PRESCALE} <= _movs(b) and not set(UE4M3_PAIR) & _movs(b)
    assert _f32(b, 2.0**16) >= 1 and _f32(b, 2.0**8) == 0  # the reduction undoes 2^-16
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n16k16\.f32\.bf16\.bf16"
    assert b.ptx_count(mma) == b4.ptx_count(mma) == 16
    _no_spills(b)


@pytest.mark.parametrize("out", ["bfloat16", "nvfp4"])
def test_tiled_register_a_ue5m3_decode(out):
    """UE5M3 weights; an NVFP4 D keeps UE4M3 scales (its epilogue's encode is unchanged)."""
    cfg = rst.Config(Nb=128, out_dtype=out, sf="ue5m3")
    b = build(rst.GemmNvfp4RegisterATiledSm90(cfg), *rst.signature(cfg).compile_args(132),
              arch="sm_90a")
    assert {UNBIAS, PRESCALE} <= _movs(b) and not set(UE4M3_PAIR) & _movs(b)
    assert _f32(b, 2.0**16) >= 1 and _f32(b, 2.0**8) == 0
    assert b.ptx_count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16") == 8
    if out == "nvfp4":
        assert b.ptx_count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") >= 1
    _no_spills(b)


def test_block_dequantize_ue5m3():
    from tk_cute.kernels import nvfp4_dequantize as dq

    args = lambda fmt: dq.signature().compile_args(fmt)  # noqa: E731
    b5 = build(dq._dequantize, *args("ue5m3"), arch="sm_90a")
    b4 = build(dq._dequantize, *args("ue4m3"), arch="sm_90a")
    assert UNBIAS in _movs(b5) and UE4M3_PAIR[0] not in _movs(b5)
    assert UE4M3_PAIR[0] in _movs(b4) and UNBIAS not in _movs(b4)
    # the same accesses: one 4-byte code load, one scale byte, one 16-byte store per word
    for pat in (r"LDG\.E\.U8", r"STG\.E\.128"):
        assert b5.sass_count(pat) == b4.sass_count(pat) == dq.WORDS_PER_THREAD
    _no_spills(b5)
    with pytest.raises(ValueError, match="sf_format must be one of"):
        dq.compile_launcher("ue8m0", options="--gpu-arch sm_90a")


def test_configs_reject_unknown_formats():
    for make in (lambda: gv.Config(sf="ue8m0"), lambda: rs.Config(sf="ue8m0"),
                 lambda: rst.Config(sf="e4m3")):
        with pytest.raises(ValueError, match="sf must be one of"):
            make()


# --- GPU tier (an H200) ---------------------------------------------------------------------


def _ue5m3(shape, scale=1.0):
    """A UE5M3 NVFP4Tensor of random values spanning many octaves (quantized on the CPU: the
    CUDA quantizer writes UE4M3 only), moved to the GPU."""
    from tk_cute.nvfp4 import quantize

    x = torch.randn(shape) * torch.logspace(-5, 5, shape[-1]) * scale
    return quantize(x, scale_dtype="ue5m3").to("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("path, m", [("small_m", 1), ("small_m", 16), ("register_a", 64),
                                     ("register_a_tiled", 512),
                                     ("dequantize", 200)])
@pytest.mark.parametrize("w4a4", [False, True])
def test_gemm_ue5m3_matches_the_exact_reference(seed, path, m, w4a4):
    """Every element within `assert_gemm_close`'s bound of the exact product (UE5M3 products
    are exact in bf16, so the Hopper emulation sums the same products as a tensor core)."""
    from tk_cute import nvfp4
    from tk_cute.testing import assert_gemm_close

    n, k = 1024, 1024
    b = _ue5m3((n, k))
    a = _ue5m3((m, k)) if w4a4 else torch.randn(m, k, device="cuda").bfloat16()
    if path == "small_m" and w4a4 and m > sm90_tuning.W4A4_NATIVE_MAX_M:
        pytest.skip("W4A4 small_m takes M <= 8")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)  # poison
    d = nvfp4.gemm(a, b, torch.float32, out=out, path=path)
    assert d.data_ptr() == out.data_ptr()
    assert nvfp4.plan(a, b, torch.float32, path=path).kernels()[0] == path
    assert_gemm_close(d, a, b, f"{path} UE5M3 {'W4A4' if w4a4 else 'W4A16'}")


@pytest.mark.gpu
def test_block_dequantize_ue5m3_matches_dequantize():
    from tk_cute.nvfp4 import launch

    q = _ue5m3((300, 512))
    out = torch.full((300, 512), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    got = launch.dequantize_blocks(q, out)
    assert got.data_ptr() == out.data_ptr()
    want = (q.cpu().dequantize(torch.float64) / float(q.global_scale)).bfloat16()
    assert torch.equal(got.cpu(), want)
