"""UE5M3 block scales end to end on the CPU (issue 23): the format, quantize, dequantize, the
exact GEMM reference, the NVFP4Tensor attribute and the refusals.

UE5M3 (``FloatNV8E5M3FNU``): unsigned, exponent bias 15, 3 mantissa bits, 2^-17 .. 114688, NaN
only at 0xFF (`tk_cute.nvfp4.format`); the recipe is UE4M3's with the format's numbers
(`tk_cute.nvfp4.quantize` docstring). Oracles here are independent: a scalar float32 recipe over
the explicit value grid, the DSL's own MLIR type semantics, Python fractions for the GEMM.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from _oracles import nearest_even  # tests/_oracles.py (tests/conftest.py puts it on sys.path)
from _oracles import slow_quantize as oracle_quantize

from tk_cute.nvfp4 import NVFP4Tensor, dequantize, gemm, gemm_reference, quantize, unpack_fp4
from tk_cute.nvfp4.format import (SCALE_FORMATS, UE5M3_MAX, UE5M3_VALUES, scale_format,
                                  ue5m3_decode, ue5m3_encode_rne)

F = np.float32
UE5M3 = SCALE_FORMATS["ue5m3"]
GRID = np.array(UE5M3_VALUES[:0xFF])  # bytes 0..0xFE, ascending


# --- the format ------------------------------------------------------------------------------


def test_ue5m3_values_are_the_dsl_types_semantics():
    """Every byte against CuTe DSL's own FloatNV8E5M3FNU (MLIR fnv8E5M3FNU) constants, parsed
    from their bit patterns: the bias (15), the subnormals (b * 2^-17) and 0xFF = NaN are the
    DSL's, not this library's guess. (The MLIR printer shows 6 significant digits, neighbours
    differ by >= 1/16, and for this unsigned type a spurious '-' on bytes >= 0x80: magnitudes
    are compared.)"""
    from cutlass._mlir import ir

    with ir.Context(), ir.Location.unknown():
        text = "module {\n" + "\n".join(f"  %c{b} = arith.constant 0x{b:02X} : fnv8E5M3FNU"
                                        for b in range(256)) + "\n}"
        printed = str(ir.Module.parse(text))
    consts = [line.split("constant ")[1].split(" :")[0] for line in printed.splitlines()
              if "arith.constant" in line]
    assert len(consts) == 256 and consts[0xFF] == "0xFF" and math.isnan(UE5M3_VALUES[0xFF])
    for b in range(0xFF):
        assert abs(float(consts[b])) == pytest.approx(UE5M3_VALUES[b], rel=1e-5, abs=0), b
    assert UE5M3_VALUES[1] == 2.0**-17 and UE5M3_VALUES[8] == 2.0**-14
    assert UE5M3_VALUES[0x78] == 1.0 and UE5M3_VALUES[0xFE] == UE5M3_MAX == 1.75 * 2**16
    assert list(GRID) == sorted(GRID) and len(set(GRID)) == 255


def test_ue5m3_round_trip_and_ties_to_even():
    b = torch.arange(0xFF, dtype=torch.uint8)
    assert torch.equal(ue5m3_encode_rne(ue5m3_decode(b)), b)
    mids = (GRID[:-1] + GRID[1:]) / 2  # exact in float32 (5 significant bits)
    got = ue5m3_encode_rne(torch.tensor(mids, dtype=torch.float32)).long()
    lo = torch.arange(0xFE)
    assert torch.equal(got, torch.where(lo % 2 == 0, lo, lo + 1))  # ties to the even byte
    up = torch.tensor(np.nextafter(mids.astype(F), F(np.inf)))
    down = torch.tensor(np.nextafter(mids.astype(F), F(0)))
    assert torch.equal(ue5m3_encode_rne(up).long(), lo + 1)
    assert torch.equal(ue5m3_encode_rne(down).long(), lo)


def test_ue5m3_saturation_zero_nan_and_sign():
    x = torch.tensor([UE5M3_MAX, 118784.0, 122880.0, 1e30, float("inf"), 2.0**-18,
                      2.0**-18 * (1 + 2.0**-20), 0.0, -0.0, -3.0, float("nan"), 2.0**-149])
    got = ue5m3_encode_rne(x).tolist()
    # 118784: the tie between 114688 and 122880 (0xFF, NaN) saturates; 2^-18: the tie to 0
    assert got == [0xFE, 0xFE, 0xFE, 0xFE, 0xFE, 0, 1, 0, 0, int(ue5m3_encode_rne(
        torch.tensor([3.0]))), 0xFF, 0]


def test_ue5m3_brute_force_nearest(seed):
    v = torch.exp2(torch.rand(100000) * 40 - 22)  # 2^-22 .. 2^18: subnormal to saturated
    want = nearest_even(v.double().numpy(), GRID)
    assert np.array_equal(ue5m3_encode_rne(v).numpy(), want)


def test_scale_format_registry():
    assert scale_format("ue4m3").global_denom == 2688 and UE5M3.global_denom == 688128
    assert UE5M3.amax_floor == 21 * 2.0**-93 and F(UE5M3.amax_floor) == UE5M3.amax_floor
    assert scale_format("ue4m3").amax_floor == 2688 * 2.0**-116
    with pytest.raises(ValueError, match="unknown block-scale format 'ue8m0'"):
        scale_format("ue8m0")


# --- quantize --------------------------------------------------------------------------------


def slow_quantize_ue5m3(x, global_scale=None):
    """The recipe, one block at a time in numpy float32 over the explicit UE5M3 grid
    (`tests/_oracles.slow_quantize`)."""
    xf = x.float().reshape(-1, *x.shape[-2:]).numpy()
    return oracle_quantize(xf, GRID, 688128, UE5M3.amax_floor, global_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape, given", [((130, 48), None), ((2, 33, 96), None),
                                          ((64, 64), 1.0), ((40, 32), 1e-3)])
def test_quantize_ue5m3_matches_the_scalar_recipe(shape, given, dtype, seed):
    # block amaxes over 24 octaves (past UE4M3's 18), finite in float16
    spread = torch.exp2(torch.rand(*shape[:-1], shape[-1] // 16, 1) * 24 - 12)
    x = (torch.randn(*shape[:-1], shape[-1] // 16, 16) * spread).reshape(shape).to(dtype)
    q = quantize(x, global_scale=given, scale_dtype="ue5m3")
    codes, scales, s_dec = slow_quantize_ue5m3(x, given)
    assert q.scale_format == "ue5m3" and q.global_scale.item() == float(s_dec)
    assert torch.equal(unpack_fp4(q.data).reshape(codes.shape), torch.from_numpy(codes))
    assert torch.equal(q.scales_logical().reshape(scales.shape), torch.from_numpy(scales))
    # the same 128x4 blocked layout as UE4M3 (padding zero)
    from tk_cute.layouts.nvfp4_scales import to_blocked

    assert torch.equal(q.scales, to_blocked(q.scales_logical()))


@pytest.mark.parametrize("j", [-60, -20, 0, 20, 60])
def test_quantize_ue5m3_is_scale_invariant(j, seed):
    """The docstring's argument with UE5M3's numbers (floor 688128 * 2^-108): x * 2^j gives the
    same bytes and a global scale times 2^j exactly."""
    x0 = torch.randn(3, 40, 64) * torch.exp2(torch.rand(3, 40, 4, 1) * 40 - 20).repeat_interleave(
        16, -1).reshape(3, 40, 64)
    x = x0 * 2.0**j
    assert torch.equal(x * 2.0**-j, x0)
    q0, q = quantize(x0, scale_dtype="ue5m3"), quantize(x, scale_dtype="ue5m3")
    assert torch.equal(q.data, q0.data) and torch.equal(q.scales, q0.scales)
    assert q.global_scale.item() == q0.global_scale.item() * 2.0**j


def test_quantize_ue5m3_below_the_floor_and_zero():
    z = quantize(torch.zeros(4, 32), scale_dtype="ue5m3")
    assert z.global_scale.item() == 2.0**-108 and (z.scales == 0).all()
    x = torch.zeros(1, 32)
    x[0, 0] = UE5M3.amax_floor / 4  # below the floor: s_dec_g stays 2^-108
    assert quantize(x, scale_dtype="ue5m3").global_scale.item() == 2.0**-108


def test_ue5m3_keeps_blocks_ue4m3_flushes(seed):
    """The reason for the format: blocks 2^-20 .. 2^-31 below the tensor's amax get a zero
    UE4M3 scale (decode 0) but a nonzero UE5M3 one (decode within the E2M1 error)."""
    x = torch.randn(8, 80)
    x[:, 16:64] *= torch.tensor([2.0**-20, 2.0**-25, 2.0**-30]).repeat_interleave(16)
    # a last block at amax * 2^-31: t = 114688 * 2^-31 = 7 * 2^-17, a subnormal UE5M3 scale
    sign = torch.tensor([1.0, -0.5, 0.25, -1.0]).repeat(4)
    x[:, 64:] = x[:, :16].abs().max() * 2.0**-31 * sign  # (block 0 holds the tensor's amax)
    q4, q5 = quantize(x), quantize(x, scale_dtype="ue5m3")
    assert (q4.scales_logical()[:, 1:] == 0).all()
    assert (q5.scales_logical() > 0).all()
    err = (dequantize(q5, torch.float64) - x.double()).abs()
    # `test_dequantize_error_bound`'s derivation with UE5M3's quantum: at most half the largest
    # E2M1 gap (1) times the block's decode scale S = sf * g for a normal sf; for a subnormal
    # one (k * 2^-17) the saturation error is at most 3 * 2^-17 * g; 2^-20 relative slack
    g = q5.global_scale.double()
    S = (ue5m3_decode(q5.scales_logical()).double() * g).repeat_interleave(16, -1)
    assert (err <= torch.clamp(S, min=3 * 2.0**-17 * g) * (1 + 2.0**-20)).all()
    assert (q5.scales_logical() < 8).any()  # the subnormal regime is exercised


def test_dequantize_ue5m3_is_exact(seed):
    q = quantize(torch.randn(33, 80) * 1000, scale_dtype="ue5m3")
    vals = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6],
                        dtype=torch.float64)[unpack_fp4(q.data).long()]
    sf = torch.tensor(UE5M3_VALUES, dtype=torch.float64)[q.scales_logical().long()]
    want = vals * sf.repeat_interleave(16, -1) * q.global_scale.double()
    assert torch.equal(dequantize(q, torch.float64), want)
    assert torch.equal(q.dequantize(), want.float())


def test_quantize_ue5m3_rejects(monkeypatch):
    with pytest.raises(ValueError, match="unknown block-scale format"):
        quantize(torch.randn(4, 16), scale_dtype="e4m3")
    # a CUDA tensor: the CUDA quantizer writes UE4M3 only (no silent reference)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(NotImplementedError, match="ue5m3.*no CUDA kernel"):
        quantize(torch.randn(4, 16), scale_dtype="ue5m3")


# --- NVFP4Tensor -----------------------------------------------------------------------------


def _parts(byte, fmt):
    from tk_cute.layouts.nvfp4_scales import blocked_shape

    sc = torch.zeros(blocked_shape(130, 64), dtype=torch.uint8)
    sc[1, 0, 7] = byte  # a real scale (row 128 + 7 // 16 ... of the second band)
    sc[1, 0, 511] = byte if fmt == "pad" else 0  # and a padding byte
    return torch.zeros(130, 32, dtype=torch.uint8), sc, torch.tensor(1.0), (130, 64)


def test_nvfp4tensor_scale_format_attribute():
    q = quantize(torch.randn(40, 32))
    assert q.scale_format == "ue4m3" and "scale_format" not in repr(q)
    q5 = quantize(torch.randn(40, 32), scale_dtype="ue5m3")
    assert q5.scale_format == "ue5m3" and "scale_format='ue5m3'" in repr(q5)
    assert q5.to("cpu") is q5 and q5.to("meta").scale_format == "ue5m3"
    assert NVFP4Tensor(q5.data, q5.scales, q5.global_scale, q5.shape, "ue5m3") == q5
    with pytest.raises(TypeError, match="UE4M3 scales"):
        _ = q5.scales_e4m3
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        NVFP4Tensor(q5.data, q5.scales.view(torch.float8_e4m3fn), q5.global_scale, q5.shape,
                    "ue5m3")
    with pytest.raises(ValueError, match="unknown block-scale format"):
        NVFP4Tensor(q5.data, q5.scales, q5.global_scale, q5.shape, "ue8m0")


@pytest.mark.parametrize("byte, ok4, ok5", [(0x7E, True, True), (0x7F, False, True),
                                            (0x80, False, True), (0xFE, False, True),
                                            (0xFF, False, False)])
def test_nvfp4tensor_validates_scale_bytes_per_format(byte, ok4, ok5):
    for fmt, ok in (("ue4m3", ok4), ("ue5m3", ok5)):
        for where in ("scale", "pad"):
            data, sc, gs, shape = _parts(byte, where if where == "pad" else fmt)
            if ok:
                NVFP4Tensor(data, sc, gs, shape, fmt)
            else:
                with pytest.raises(ValueError, match=f"0x{byte:02X}"):
                    NVFP4Tensor(data, sc, gs, shape, fmt)


# --- the exact GEMM reference ----------------------------------------------------------------


def _wide_operand(rows, k, fmt, rng):
    """Random codes with scales from the whole range of `fmt` (extremes in every row)."""
    from tk_cute.layouts.nvfp4_scales import to_blocked

    codes = torch.randint(0, 16, (rows, k), generator=rng, dtype=torch.uint8)
    top = 0xFE if fmt == "ue5m3" else 0x7E
    sf = torch.randint(0, top + 1, (rows, k // 16), generator=rng, dtype=torch.uint8)
    sf[:, 0], sf[:, -1] = top, 1  # 114688 (448) and 2^-17 (2^-9) in one dot product
    data = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8)
    g = torch.tensor(float(torch.rand((), generator=rng)) * 3 + 0.1, dtype=torch.float32)
    return NVFP4Tensor(data, to_blocked(sf), g, (rows, k), fmt)


@pytest.mark.parametrize("fa, fb", [("ue5m3", "ue5m3"), ("ue4m3", "ue5m3"),
                                    ("ue5m3", "ue4m3")])
def test_gemm_reference_ue5m3_is_exactly_rounded(fa, fb):
    """Python fractions as the oracle: the exact sum (operand integers past int64 products:
    up to 2^76 each, the wide path) times gA gB, rounded to float64 then float32."""
    rng = torch.Generator().manual_seed(23)
    a, b = _wide_operand(5, 128, fa, rng), _wide_operand(4, 128, fb, rng)
    A = dequantize(a, torch.float64) / a.global_scale.double()
    B = dequantize(b, torch.float64) / b.global_scale.double()
    ga, gb = Fraction(a.global_scale.item()), Fraction(b.global_scale.item())
    d = gemm_reference(a, b, torch.float32)
    d16 = gemm_reference(a, b, torch.bfloat16)
    for m in range(5):
        for n in range(4):
            exact = sum(Fraction(x) * Fraction(y) for x, y in zip(A[m].tolist(), B[n].tolist()))
            want = torch.tensor(float(exact * ga * gb), dtype=torch.float64)
            assert d[m, n].item() == want.float().item()
            from tk_cute.nvfp4.format import round_float64

            assert d16[m, n].item() == round_float64(want, torch.bfloat16).item()
    assert torch.equal(gemm(a, b, torch.float32), d)  # CPU tensors: the reference path


def test_wide_reference_equals_the_int64_one_on_ue4m3(seed):
    from tk_cute.nvfp4 import reference as R

    a, b = quantize(torch.randn(2, 40, 96) * 7), quantize(torch.randn(2, 24, 96))
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(R._wide_reference(a, b, dt), gemm_reference(a, b, dt))


# --- refusals on paths that cannot carry UE5M3 -----------------------------------------------


def test_torch_ops_and_interop_refuse_ue5m3():
    from tk_cute.nvfp4 import Linear, linear, to_flashinfer, to_torchao

    w = quantize(torch.randn(32, 64), scale_dtype="ue5m3")
    with pytest.raises(NotImplementedError, match="UE4M3 NVFP4 tensors only"):
        Linear.from_nvfp4(w)
    with pytest.raises(NotImplementedError, match="UE4M3 NVFP4 tensors only"):
        linear(torch.randn(2, 64).bfloat16(), w)
    with pytest.raises(ValueError, match="FlashInfer's NVFP4 form has UE4M3 scales"):
        to_flashinfer(w)
    try:
        import torchao  # noqa: F401
    except ImportError:
        return
    with pytest.raises(ValueError, match="torchao's NVFP4 form has UE4M3 scales"):
        to_torchao(w)


def test_nvfp4_output_of_ue5m3_operands_on_cpu(seed):
    """D = a @ b^T of UE5M3 operands quantized to NVFP4 (UE4M3 scales): on CPU tensors the
    reference then the quantizer, bit for bit (the documented CPU path); and, independently of
    both, every decoded element within the encode's error of the exact product."""
    from tk_cute.nvfp4.format import e4m3_decode
    from tk_cute.testing import gemm_bound

    a = quantize(torch.randn(20, 128) * 1e4, scale_dtype="ue5m3")
    b = quantize(torch.randn(48, 128) * 1e-4, scale_dtype="ue5m3")
    d32 = gemm_reference(a, b, torch.float32)
    g = 1.01 * float(d32.abs().max()) / 2688  # (1.01: no block at the rounding edge of 448)
    q = gemm(a, b, "nvfp4", out_global_scale=g)
    want = quantize(d32, global_scale=g)
    assert q.scale_format == "ue4m3" and torch.equal(q.data, want.data)
    assert torch.equal(q.scales, want.scales) and int(q.saturated) == 0
    # The oracle: d, the float64 product of the exactly decoded operands; D's fp32 value lies
    # within gemm_bound's fp32 bound of it. The encode (quantize docstring, no saturation as
    # t <= 2688 / 6 / 1.01 < 448) errs by at most the block's decode scale S = sf * g in a
    # normal block (half the largest E2M1 gap, 1 in units of S; a clipped element: sf >= t / (1
    # + 2^-4), so at most 6 * 2^-4 / (1 - 2^-4) S), and in a subnormal or zero one (sf = k * 2^-9,
    # t - sf <= 2^-10) by at most 6 * 2^-10 g = 3 * 2^-9 g; 2^-20 relative slack for the fp32
    # roundings of t, d and 1 / d.
    d, fp32_bound = gemm_bound(a, b, torch.float32)
    gq = q.global_scale.double()
    S = (e4m3_decode(q.scales_logical()).double() * gq).repeat_interleave(16, -1)
    err = (q.dequantize(torch.float64) - d).abs()
    assert (err <= torch.clamp(S, min=3 * 2.0**-9 * gq) * (1 + 2.0**-20) + fp32_bound).all()


@pytest.mark.parametrize("g", [0.0, -1.0, float("nan"), float("inf"), 2.0**-127,
                               torch.tensor([1.0, 2.0])])
def test_nvfp4_output_rejects_bad_global_scales(g):
    a = quantize(torch.randn(8, 64), scale_dtype="ue5m3")
    b = quantize(torch.randn(16, 64), scale_dtype="ue5m3")
    with pytest.raises((ValueError, TypeError), match="positive, finite|one-element"):
        gemm(a, b, "nvfp4", out_global_scale=g)
