"""Rows of NVFP4 codes `layouts.nvfp4_codes.row_pitch(K)` bytes apart: K % 32 != 0 tensors are
stored with 16-byte padded rows (what the TMA needs), every way a tensor is made or moved
keeps that layout, and the values are those of the unpadded codes. CPU only (the kernels that
read and write the padded rows are GPU-tested in tests/tk_cute/nvfp4/test_dispatch_sm90.py's
grid, K in {16, 48, 8208}, and tests/kernels/test_nvfp4_quantize.py)."""

import importlib

import numpy as np
import pytest
import torch
from _oracles import E2M1_MAGS, E4M3_POS

from tk_cute import nvfp4
from tk_cute.layouts import nvfp4_codes
from tk_cute.layouts.nvfp4_scales import blocked_offset, blocked_shape
from tk_cute.nvfp4 import NVFP4Tensor
from tk_cute.nvfp4.tensor import has_row_pitch

SHAPES = [(7, 48), (130, 8208), (2, 5, 80), (3, 64), (1, 16)]


def test_row_pitch_is_half_k_rounded_up_to_16_bytes():
    for K, pitch in ((16, 16), (32, 16), (48, 32), (64, 32), (2896, 1456), (8192, 4096),
                     (8208, 4112)):
        assert nvfp4_codes.row_pitch(K) == pitch
        assert nvfp4_codes.padded(K) == (K % 32 != 0)
    assert nvfp4_codes.strides(3, 48, batched=True) == (96, 32, 1)
    assert nvfp4_codes.strides(3, 64) == (32, 1)


def _parts(shape, seed):
    *lead, M, K = shape
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (*lead, M, K // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 0x7F, blocked_shape(M, K, *lead), dtype=torch.uint8, generator=g)
    return data, scales, torch.tensor(0.375)


def _oracle_values(data: torch.Tensor, scales: torch.Tensor, gs: float, shape) -> np.ndarray:
    """Element (l, m, k) = +-E2M1[code] * UE4M3[scale byte at the blocked offset] * gs, from
    the unpadded codes (numpy, one element at a time through the layout formula)."""
    *lead, M, K = shape
    d = data.reshape(-1, M, K // 2).numpy()
    flat = scales.reshape(-1).numpy()
    out = np.empty((d.shape[0], M, K))
    for l in range(d.shape[0]):
        for m in range(M):
            for k in range(K):
                code = (d[l, m, k // 2] >> (4 * (k % 2))) & 15
                mag = E2M1_MAGS[code & 7] * (-1.0 if code & 8 else 1.0)
                sf = E4M3_POS[flat[blocked_offset(m, k // 16, M, K, l)]]
                out[l, m, k] = mag * sf * gs
    return out.reshape(shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_constructor_pads_rows_and_keeps_the_values(shape):
    *lead, M, K = shape
    data, scales, gs = _parts(shape, M * K)
    q = NVFP4Tensor(data, scales, gs, shape)
    assert has_row_pitch(q.data, K)
    assert M == 1 or q.data.stride()[-2] == nvfp4_codes.row_pitch(K)
    assert q.data.is_contiguous() == (K % 32 == 0 or M == 1)
    assert q.data.shape == data.shape and torch.equal(q.data, data)
    stored = q.data_padded
    assert stored.is_contiguous() and stored.shape[-1] == nvfp4_codes.row_pitch(K)
    assert bool((stored[..., K // 2:] == 0).all())  # the padding: zeros
    if M * K <= 4096:  # the element-wise oracle is slow
        want = _oracle_values(data, scales, 0.375, shape)
        np.testing.assert_array_equal(q.dequantize(torch.float64).numpy(), want)


def test_every_way_of_making_or_moving_a_tensor_keeps_the_pitch():
    g = importlib.import_module("tk_cute.nvfp4.gemm")  # (the module: `nvfp4.gemm` is the call)
    x = torch.randn(2, 130, 96, generator=torch.Generator().manual_seed(3))
    q = nvfp4.quantize(x[0, :, :48])  # the CPU recipe
    assert has_row_pitch(q.data, 48)
    made = {
        "trusted from contiguous": NVFP4Tensor.trusted(q.data.contiguous(), q.scales,
                                                       q.global_scale, q.shape),
        "to meta": q.to("meta"),
        "batch view": g._batch(nvfp4.quantize(x[:, :, :48]), 1),
        "shard of K = 96": nvfp4.shard(nvfp4.quantize(x[0]), dim=1, index=1, count=2),
        "parts of the custom op": nvfp4.ops.parts(q.data.contiguous(), q.scales,
                                                  q.global_scale),
    }
    made["unshard"] = nvfp4.unshard([made["shard of K = 96"]] * 2, dim=1)
    for name, t in made.items():
        assert has_row_pitch(t.data, t.K), (name, t.data.stride())
    assert torch.equal(made["trusted from contiguous"].data, q.data)


def test_linear_keeps_padded_rows_through_module_moves():
    lin = torch.nn.Linear(48, 24, bias=False)
    mod = nvfp4.Linear.from_linear(lin)
    assert has_row_pitch(mod.weight_data, 48)
    want = mod.weight.data.clone()
    moved = nvfp4.Linear.from_linear(lin).to("meta")  # a move copies the buffers contiguous
    assert has_row_pitch(moved.weight_data, 48)  # and _apply pads them again, once
    assert nvfp4.Linear(48, 24).weight_data.stride() == (32, 1)
    fresh = nvfp4.Linear(48, 24)
    fresh.load_state_dict({"weight_data": want, "weight_scales": mod.weight_scales,
                           "weight_global_scale": torch.tensor(1.0)})
    assert has_row_pitch(fresh.weight_data, 48)


def test_fake_quantize_op_has_the_real_strides():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(9, 48)
    real = torch.ops.tk_cute.nvfp4_quantize(x, None, True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.tk_cute.nvfp4_quantize(torch.empty(9, 48), None, True)
    assert [t.stride() for t in fake] == [t.stride() for t in real]
    assert real[0].stride() == (32, 1)


def test_custom_ops_pass_opcheck_on_padded_rows():
    """torch.library.opcheck (schema, fake vs real, aliasing, AOT dispatch) with K = 48: the
    quantizer's padded-row output and the GEMM taking such parts."""
    x = torch.randn(9, 48)
    torch.library.opcheck(torch.ops.tk_cute.nvfp4_quantize.default, (x, None, True))
    q = nvfp4.quantize(torch.randn(24, 48))
    a = torch.randn(5, 48).bfloat16()
    torch.library.opcheck(torch.ops.tk_cute.nvfp4_gemm.default,
                          (a, None, None, q.data, q.scales, q.global_scale, torch.bfloat16))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_linear_hands_the_op_its_padded_codes(monkeypatch, backend):
    """Traced by torch.compile (AOT dispatch), a Linear at K % 32 != 0 passes its padded code
    rows to the GEMM op as they are: no call after the first copies them into new padded rows
    (`codes_storage`). opcheck's aot_dispatch test above builds contiguous codes of its own,
    which the op pads on that call."""
    from tk_cute.nvfp4 import tensor

    made = []
    storage = tensor.codes_storage
    monkeypatch.setattr(tensor, "codes_storage", lambda *a: made.append(a) or storage(*a))
    layer = nvfp4.Linear(48, 24)
    assert has_row_pitch(layer.weight_data, 48)
    x = torch.randn(5, 48).bfloat16()
    with torch.no_grad():
        compiled = torch.compile(layer, fullgraph=True, backend=backend)
        compiled(x)  # traces (the fake impl normalizes its fake parts once)
        made.clear()
        for _ in range(2):
            compiled(torch.randn(5, 48).bfloat16())
    assert made == []


def test_nvfp4_out_is_padded_and_checked():
    from tk_cute.nvfp4 import validate

    gs = torch.tensor(1.0)
    out = validate.nvfp4_out((5, 48), "cpu", None, gs)
    assert has_row_pitch(out.data, 48) and bool((out.data_padded[:, 24:] == 0).all())
    bad = NVFP4Tensor.trusted(out.data, out.scales, gs, (5, 48))
    bad.data = out.data.contiguous()  # a layout no kernel writes
    with pytest.raises(ValueError, match="row_pitch"):
        validate.nvfp4_out((5, 48), "cpu", bad, gs)


def test_kernel_addresses_reject_a_broken_layout():
    from tk_cute.nvfp4 import launch

    q = nvfp4.quantize(torch.randn(4, 48))
    assert launch.codes(q) == q.data.data_ptr()
    q.data = q.data.contiguous()  # bypassing the constructor
    with pytest.raises(ValueError, match="rows 32 bytes apart"):
        launch.codes(q)


def test_sm100_nvfp4_epilogue_stores_codes_at_the_row_pitch():
    from tk_cute.kernels.gemm.nvfp4_sm100 import nvfp4_out_store

    m, n = 3, 48  # n % 32 != 0: rows of D's codes 32 bytes apart
    for l in (0, 1):
        for row in range(m):
            for col in (0, 16, 32):
                at, ok, _, _ = nvfp4_out_store(l, row, col, m, n)
                assert at == (l * m + row) * 32 + col // 2 and ok


# ---------------------------------------------------------------- GPU: kernels on padded rows


@pytest.mark.gpu
@pytest.mark.parametrize("K", [48, 2896, 8208])
def test_block_dequantize_reads_padded_rows(seed, K):
    """`launch.dequantize_blocks` (e2m1 * sf, exact in bf16) times gs equals the exact decode
    (`NVFP4Tensor.dequantize`, float64 products rounded once to fp32) bit for bit: both are
    one rounding of the same exact product. N = 136 rows: a partial 128-row scale band."""
    from tk_cute.nvfp4 import launch

    q = nvfp4.quantize(torch.randn(136, K, device="cuda"))
    assert q.data.stride() == (nvfp4_codes.row_pitch(K), 1)
    out = torch.full((136, K), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = launch.dequantize_blocks(q, out=out)
    got = d.float() * q.global_scale
    assert torch.equal(got, q.dequantize(torch.float32))


@pytest.mark.gpu
def test_nvfp4_output_with_padded_rows(seed):
    """D quantized to NVFP4 with N = 80 (rows of D's codes padded from 40 to 48 bytes): the
    bytes, padding included, equal the CPU reference recipe's (`quantize_reference`, torch on
    the host) on the fp32 D of the same path."""
    a = torch.randn(17, 256, device="cuda").bfloat16()
    b = nvfp4.quantize(torch.randn(80, 256, device="cuda"))
    d32 = nvfp4.gemm(a, b, torch.float32)
    gs = torch.tensor(float(d32.abs().max()) / 2688 * 1.01, device="cuda")
    q = nvfp4.gemm(a, b, "nvfp4", out_global_scale=gs).to("cpu")
    want = nvfp4.quantize_reference(d32.cpu(), global_scale=gs.cpu())
    assert q.data.stride() == (48, 1)
    assert torch.equal(q.data_padded, want.data_padded) and torch.equal(q.scales, want.scales)


@pytest.mark.gpu
def test_linear_with_padded_rows_moves_to_cuda(seed):
    """A CPU-quantized Linear of in_features = 8208 moved to CUDA keeps its padded rows (one
    copy at the move), and its forward runs the register-A kernel within the GEMM bound."""
    from tk_cute.testing import assert_gemm_close

    mod = nvfp4.Linear.from_linear(torch.nn.Linear(8208, 256, bias=False)).to("cuda")
    assert has_row_pitch(mod.weight_data, 8208) and mod.weight_data.is_cuda
    x = torch.randn(16, 8208, device="cuda").bfloat16()
    assert nvfp4.plan(x, mod.weight).path == "register_a"
    assert_gemm_close(mod(x), x, mod.weight, "Linear 16x256x8208")
