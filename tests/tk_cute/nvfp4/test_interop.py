"""Conversions to and from torchao (the real library, skipped where it does not import) and
FlashInfer (against its documented layout, written out here from the spec): bit-exact round
trips, the global-scale conventions, bad input."""

import math

import pytest
import torch

from tk_cute.nvfp4 import (
    NVFP4Tensor,
    from_flashinfer,
    from_torchao,
    quantize,
    to_flashinfer,
    to_torchao,
    unpack_fp4,
)

SHAPES = [(200, 96), (128, 64), (1, 16), (2, 128, 48)]


def same(p: NVFP4Tensor, q: NVFP4Tensor) -> bool:
    return (p.shape == q.shape and torch.equal(p.data, q.data) and torch.equal(p.scales, q.scales)
            and torch.equal(p.global_scale, q.global_scale)
            and p.global_scale.dtype == q.global_scale.dtype == torch.float32)


# ---------------------------------------------------------------- torchao


@pytest.fixture
def torchao_nvfp4():
    mod = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    return mod


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("swizzled", [True, False])
def test_torchao_round_trips_are_bit_exact(torchao_nvfp4, shape, swizzled, seed):
    q = quantize(torch.randn(shape) * 5)
    if len(shape) == 3 and swizzled and shape[1] % 128:
        with pytest.raises(ValueError, match="pass swizzled=False"):
            to_torchao(q, swizzled=swizzled)
        return
    t = to_torchao(q, swizzled=swizzled)
    assert isinstance(t, torchao_nvfp4.NVFP4Tensor) and t.is_swizzled_scales == swizzled
    assert tuple(t.shape) == tuple(shape) and t.orig_dtype == torch.bfloat16
    assert t.scale.dtype == torch.float8_e4m3fn and t.block_size == 16
    assert same(from_torchao(t), q)
    # torchao's own decode of our bytes: e2m1 * fl32(per_tensor_scale * sf), ours rounds
    # e2m1 * sf * g once: equal where e2m1 is a power of two, else within one float32 ulp.
    ours, theirs = q.dequantize(), t.dequantize(torch.float32)
    assert (theirs - ours).abs().le(ours.abs() * 2.0**-23).all()
    pow2 = torch.isin(unpack_fp4(q.data) & 7, torch.tensor([0, 1, 2, 4, 6]))  # 0, 0.5, 1, 2, 4
    assert pow2.any() and torch.equal(theirs[pow2], ours[pow2])


@pytest.mark.parametrize("shape", [(200, 96), (256, 128)])
@pytest.mark.parametrize("swizzled", [True, False])
def test_from_torchao_of_torchao_quantized_data(torchao_nvfp4, shape, swizzled, seed):
    x = (torch.randn(shape) * torch.rand(shape[0], 1) * 8).bfloat16()
    q = quantize(x)
    # The global-scale convention: torchao's per_tensor_scale is the DECODE scale amax / 2688,
    # computed exactly as ours.
    pts = torchao_nvfp4.per_tensor_amax_to_scale(x.float().abs().amax())
    assert torch.equal(pts, q.global_scale)
    t = torchao_nvfp4.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts, is_swizzled_scales=swizzled)
    r = from_torchao(t)
    assert torch.equal(r.global_scale, pts)
    assert same(from_torchao(to_torchao(r, swizzled=swizzled)), r)
    t2 = to_torchao(r, swizzled=swizzled)
    assert torch.equal(t2.qdata, t.qdata) and torch.equal(t2.scale.view(torch.uint8),
                                                          t.scale.view(torch.uint8))
    # The two quantizers round in a different order (torchao divides by the decode scale, ours
    # multiplies by the encode scale), so a few bytes may differ; a wrong convention (encode
    # taken for decode) would leave almost none equal.
    assert (r.scales == q.scales).float().mean() > 0.95
    assert (r.data == q.data).float().mean() > 0.95
    ours, theirs = q.dequantize(), t.dequantize(torch.float32)
    assert (theirs - r.dequantize()).abs().le(theirs.abs() * 2.0**-23).all()
    # Where they differ, each is still x's NVFP4 value: within half the widest E2M1 gap (one
    # block scale s, between 4 s and 6 s) of x, or saturated at 6 s where s was rounded down;
    # s = sf * g, sf the e4m3 rounding of the block's amax / (6 g): relatively within 2^-4,
    # absolutely within 2^-10 (subnormal scales). So the two agree within twice that.
    g = float(q.global_scale)
    amax = x.float().abs().reshape(shape[0], -1, 16).amax(-1, keepdim=True)
    one = amax / 6 * (1 + 2.0**-4) + 6 * 2.0**-10 * g
    bound = (2 * one).expand(-1, -1, 16).reshape(shape)
    assert (ours - theirs).abs().le(bound * (1 + 2.0**-20)).all()


def test_from_torchao_single_level_and_bad_input(torchao_nvfp4, seed):
    x = torch.randn(64, 32)
    t = torchao_nvfp4.NVFP4Tensor.to_nvfp4(x, is_swizzled_scales=True)  # no per-tensor scale
    r = from_torchao(t)
    assert float(r.global_scale) == 1.0
    assert torch.equal(r.dequantize(), t.dequantize(torch.float32))  # 1.0 * sf: no rounding
    with pytest.raises(TypeError, match="takes a torchao NVFP4Tensor"):
        from_torchao(x)
    with pytest.raises(ValueError, match="pass w, not w.t"):
        from_torchao(t.t())


def test_a_torchao_tensor_where_ours_is_needed_is_named_and_pointed_to_from_torchao(
        torchao_nvfp4, seed):
    """Both classes are called NVFP4Tensor: the messages name torchao's with its module and
    say how to convert it (gemm took it as bf16 activations and failed inside torchao)."""
    from tk_cute.nvfp4 import Linear, dequantize, gemm

    w = quantize(torch.randn(48, 64))
    t = to_torchao(w)
    hint = (r"got torchao\.prototype\.mx_formats\.nvfp4_tensor\.NVFP4Tensor \(torchao's: "
            r"convert it with tk_cute\.nvfp4\.from_torchao")
    for call in (lambda: gemm(w, t), lambda: gemm(t, w), lambda: dequantize(t),
                 lambda: Linear.from_nvfp4(t)):
        with pytest.raises(TypeError, match=hint):
            call()
    assert same(from_torchao(t), w)  # (what the message says works)


# ---------------------------------------------------------------- FlashInfer


def flashinfer_sf_offset(b, m, k, num_rows, num_cols_sf):
    """FlashInfer's get_sf_out_offset_128x4 (include/flashinfer/comm/
    trtllm_allreduce_fusion.cuh), transcribed: layout [numMTiles, numKTiles, 32, 4, 4]."""
    inner_k, inner_m, outer_m = k % 4, (m % 128) // 32, m % 32
    k_tile, m_tile = k // 4, m // 128
    num_k_tiles = (num_cols_sf * 16 + 63) // 64  # numCols (elements) rounded up to 64
    m_tile_stride = num_k_tiles * 512
    b_tile_stride = ((num_rows + 127) // 128) * m_tile_stride
    return (b * b_tile_stride + m_tile * m_tile_stride + k_tile * 512 + outer_m * 16
            + inner_m * 4 + inner_k)


def flashinfer_expected_sf(q: NVFP4Tensor) -> torch.Tensor:
    """The flat swizzled scale buffer FlashInfer would hold for q, placed byte by byte."""
    logical = q.scales_logical().reshape(-1, q.M, q.K // 16)
    L = logical.shape[0]
    rows, cols = math.ceil(q.M / 128) * 128, math.ceil(q.K / 64) * 4
    flat = torch.zeros(L * rows * cols, dtype=torch.uint8)  # padding: zero
    for b in range(L):
        for m in range(q.M):
            for k in range(q.K // 16):
                flat[flashinfer_sf_offset(b, m, k, q.M, q.K // 16)] = logical[b, m, k]
    return flat


@pytest.mark.parametrize("shape", [(200, 96), (1, 16), (2, 130, 80)])
def test_flashinfer_layout_and_round_trips(shape, seed):
    q = quantize(torch.randn(shape) * 3)
    fi = to_flashinfer(q)
    assert fi.data.dtype == torch.uint8 and fi.data.shape == (*shape[:-1], shape[-1] // 2)
    assert torch.equal(fi.data, q.data)  # the same packing: even element in the low nibble
    assert fi.scales.dim() == 1 and torch.equal(fi.scales, flashinfer_expected_sf(q))
    assert fi.global_scale_decode.shape == (1,) and fi.global_scale_encode.shape == (1,)
    assert torch.equal(fi.global_scale_decode.reshape(()), q.global_scale)
    assert torch.equal(fi.global_scale_encode, torch.div(torch.ones(1), fi.global_scale_decode))
    # FlashInfer's encode scale is 448 * 6 / amax (fp4_quantize's global_scale).
    x_amax = float(q.dequantize().abs().amax())
    assert math.isclose(float(fi.global_scale_encode), 2688 / x_amax, rel_tol=0.2)
    back = from_flashinfer(fi.data, fi.scales, global_scale_decode=fi.global_scale_decode)
    assert same(back, q)
    # Through the encode scale: 1 / (1 / g) in float32, which need not be g.
    via_enc = from_flashinfer(fi.data.view(torch.float4_e2m1fn_x2),
                              fi.scales.view(torch.float8_e4m3fn),
                              global_scale_encode=fi.global_scale_encode, shape=shape)
    assert torch.equal(via_enc.data, q.data) and torch.equal(via_enc.scales, q.scales)
    assert torch.equal(via_enc.global_scale,
                       torch.div(torch.ones(()), fi.global_scale_encode.reshape(())))
    # The linear (is_sf_swizzled_layout=False) layout: row-major (..., M, K // 16).
    lin = to_flashinfer(q, is_sf_swizzled_layout=False)
    assert torch.equal(lin.scales, q.scales_logical())
    assert same(from_flashinfer(lin.data, lin.scales.reshape(-1), global_scale_decode=float(
        q.global_scale), is_sf_swizzled_layout=False, shape=shape), q)


def test_from_flashinfer_fp4_quantize_shapes(seed):
    # fp4_quantize returns the scale factors reshaped to (-1, K // 16): any shape holding the
    # swizzled bytes in order is accepted.
    q = quantize(torch.randn(256, 128))
    fi = to_flashinfer(q)
    two_d = fi.scales.reshape(-1, 128 // 16)
    assert same(from_flashinfer(fi.data, two_d, global_scale_decode=fi.global_scale_decode), q)


def test_from_flashinfer_rejects_ambiguous_or_bad_input(seed):
    q = quantize(torch.randn(64, 32))
    fi = to_flashinfer(q)
    with pytest.raises(TypeError, match="exactly one of global_scale_encode"):
        from_flashinfer(fi.data, fi.scales)
    with pytest.raises(TypeError, match="exactly one of global_scale_encode"):
        from_flashinfer(fi.data, fi.scales, global_scale_encode=fi.global_scale_encode,
                        global_scale_decode=fi.global_scale_decode)
    with pytest.raises(ValueError, match="swizzled scale factors for shape"):
        from_flashinfer(fi.data, fi.scales[:-1], global_scale_decode=fi.global_scale_decode)
    with pytest.raises(ValueError, match="fp4 data for shape"):
        from_flashinfer(fi.data, fi.scales, global_scale_decode=1.0, shape=(64, 64))
    with pytest.raises(ValueError, match="row-major scale factors"):
        from_flashinfer(fi.data, fi.scales, global_scale_decode=1.0, is_sf_swizzled_layout=False)
    with pytest.raises(ValueError, match="global_scale .*must be positive"):
        from_flashinfer(fi.data, fi.scales, global_scale_encode=0.0)  # decode inf
    bad = fi.scales.clone()
    bad[3] = 0x7F  # E4M3 NaN
    with pytest.raises(ValueError, match="0x7F"):
        from_flashinfer(fi.data, bad, global_scale_decode=fi.global_scale_decode)
