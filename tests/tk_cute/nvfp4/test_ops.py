"""The torch custom ops (torch.ops.tk_cute.*): values equal the library calls they wrap, the fake
implementations agree with the real ones (torch.library.opcheck), torch.compile traces them
with no graph break, bad input raises; on a GPU no host sync and CUDA-graph capture."""

import pytest
import torch

import tk_cute.nvfp4  # noqa: F401 - registers the ops
from tk_cute.nvfp4 import NVFP4Tensor, gemm, quantize
from tk_cute.nvfp4.reference import gemm_reference, w4a16_reference
from tk_cute.testing import assert_gemm_close

ops = torch.ops.tk_cute


def parts(q: NVFP4Tensor):
    return q.data, q.scales, q.global_scale


def test_ops_are_registered_with_their_schemas():
    assert "nvfp4_quantize(Tensor x, Tensor? global_scale=None, bool check_finite=False)" in str(
        ops.nvfp4_quantize.default._schema)
    assert ("ScalarType out_dtype, bool pdl=False, bool quantize_a=False) -> Tensor"
            in str(ops.nvfp4_gemm.default._schema))
    assert "gemm(Tensor a, Tensor b, ScalarType out_dtype) -> Tensor" in str(
        ops.gemm.default._schema)


@pytest.mark.parametrize("shape", [(130, 96), (2, 33, 64)])
@pytest.mark.parametrize("given", [False, True])
def test_quantize_op_is_quantize(shape, given, seed):
    x = torch.randn(shape, dtype=torch.bfloat16) * 3
    gs = torch.tensor(0.01) if given else None
    data, scales, g = ops.nvfp4_quantize(x, gs)
    q = quantize(x, global_scale=gs)
    assert torch.equal(data, q.data) and torch.equal(scales, q.scales)
    assert torch.equal(g, q.global_scale) and g.shape == () and g.dtype == torch.float32


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gemm_op_is_gemm(out_dtype, seed):
    a = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    b = quantize(torch.randn(48, 64))
    d = ops.nvfp4_gemm(a, None, None, *parts(b), out_dtype)
    assert d.shape == (3, 5, 48) and torch.equal(d, w4a16_reference(a, b, out_dtype))
    # (the references are what the CPU op runs: also every element against the exact product)
    assert_gemm_close(d, a, b, f"nvfp4_gemm W4A16 {out_dtype}")
    aq = quantize(torch.randn(7, 64))
    d4 = ops.nvfp4_gemm(*parts(aq), *parts(b), out_dtype)
    assert torch.equal(d4, gemm_reference(aq, b, out_dtype))
    assert_gemm_close(d4, aq, b, f"nvfp4_gemm W4A4 {out_dtype}")
    # The NVFP4Tensor constructor's other forms: fp4x2 / e4m3 views, flat scales, (1,) scale.
    alt = (b.data_fp4x2, b.scales_e4m3.reshape(-1), b.global_scale.reshape(1))
    assert torch.equal(ops.nvfp4_gemm(a, None, None, *alt, out_dtype), d)
    # Batched weights (L, N, K) with activations (L, M, K).
    bb = quantize(torch.randn(2, 40, 32))
    ab = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    db = ops.nvfp4_gemm(ab, None, None, *parts(bb), out_dtype)
    assert torch.equal(db, gemm(ab, bb, out_dtype))
    assert_gemm_close(db, ab, bb, f"nvfp4_gemm batched {out_dtype}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_dense_gemm_op_on_cpu_is_a_float32_matmul(dtype, out_dtype, seed):
    a = torch.randn(33, 80).to(dtype)
    b = torch.randn(24, 80).to(dtype)
    c = ops.gemm(a, b, out_dtype)
    assert c.dtype == out_dtype and c.shape == (33, 24)
    assert_gemm_close(c, a, b, f"tk_cute::gemm CPU {dtype}")


def _opcheck_cases():
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    b = quantize(torch.randn(24, 64))
    aq = quantize(torch.randn(40, 64))
    return [
        (ops.nvfp4_quantize.default, (x, None, False)),
        (ops.nvfp4_quantize.default, (x.float(), torch.tensor(0.02), False)),
        (ops.nvfp4_gemm.default, (x, None, None, *parts(b), torch.bfloat16, False)),
        (ops.nvfp4_gemm.default, (*parts(aq), *parts(b), torch.float32, False)),
        (ops.gemm.default, (x, torch.randn(24, 64, dtype=torch.bfloat16), torch.bfloat16)),
        (ops.nvfp4_gemm.default, (x, None, None, *parts(b), torch.bfloat16, False, True)),
    ]


@pytest.mark.parametrize("case", range(6))
def test_opcheck(case, seed):
    op, args = _opcheck_cases()[case]
    torch.library.opcheck(op, args)  # schema, fake impl vs real, AOT dispatch (static/dynamic)


def test_fake_outputs_match_the_real_ones(seed):
    from torch._subclasses.fake_tensor import FakeTensorMode

    for op, args in _opcheck_cases():
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        real, fake = (r if isinstance(r, tuple) else (r,) for r in (real, fake))
        assert [(t.shape, t.dtype) for t in real] == [(t.shape, t.dtype) for t in fake], op


def test_compile_traces_the_ops_with_no_graph_break(seed):
    b = quantize(torch.randn(32, 64))

    def w4a4(x, wd, ws, wg):
        a = ops.nvfp4_quantize(x, None, False)
        return torch.relu(ops.nvfp4_gemm(*a, wd, ws, wg, torch.bfloat16))

    x = torch.randn(6, 64, dtype=torch.bfloat16)
    explanation = torch._dynamo.explain(w4a4)(x, *parts(b))
    assert explanation.graph_break_count == 0
    compiled = torch.compile(w4a4, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, *parts(b)), w4a4(x, *parts(b)))


def test_ops_reject_bad_input(seed):
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    b = quantize(torch.randn(16, 64))
    aq = quantize(torch.randn(8, 64))
    with pytest.raises(ValueError, match="needs a_global_scale too"):
        ops.nvfp4_gemm(aq.data, aq.scales, None, *parts(b), torch.bfloat16)
    with pytest.raises(ValueError, match="a_global_scale without a_scales"):
        ops.nvfp4_gemm(x, None, aq.global_scale, *parts(b), torch.bfloat16)
    with pytest.raises(ValueError, match="scales must be uint8 of shape"):
        ops.nvfp4_gemm(x, None, None, b.data, b.scales_logical(), b.global_scale,
                       torch.bfloat16)
    with pytest.raises(ValueError, match="K mismatch"):
        ops.nvfp4_gemm(torch.randn(8, 32, dtype=torch.bfloat16), None, None, *parts(b),
                       torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype must be"):
        ops.nvfp4_gemm(x, None, None, *parts(b), torch.int32)
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.nvfp4_quantize(torch.randn(4, 24), None, False)
    with pytest.raises(ValueError, match="K\\)"):
        ops.gemm(x, torch.randn(16, 32, dtype=torch.bfloat16), torch.bfloat16)
    # The fake implementations raise the same errors while tracing.
    with pytest.raises(Exception, match="needs a_global_scale too"):
        torch.compile(lambda d, s: ops.nvfp4_gemm(d, s, None, *parts(b), torch.bfloat16),
                      fullgraph=True, backend="aot_eager")(aq.data, aq.scales)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 300])
def test_gpu_ops_do_not_sync_and_capture_in_a_graph(M, seed):
    K, N = 1024, 2048
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = quantize(torch.randn(N, K, device="cuda"))
    w = parts(b)

    def step(x):
        a = ops.nvfp4_quantize(x, None, False)
        return ops.nvfp4_gemm(x, None, None, *w, torch.bfloat16), ops.nvfp4_gemm(
            *a, *w, torch.bfloat16)

    y16, y4 = step(x)  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync in a forward raises
    try:
        step(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_gemm_close(y16, x, b, "W4A16 op")
    assert_gemm_close(y4, quantize(x), b, "W4A4 op")
    g = torch.cuda.CUDAGraph()
    static_x = x.clone()
    with torch.cuda.graph(g):
        s16, s4 = step(static_x)
    x2 = torch.randn_like(x)
    static_x.copy_(x2)
    s16.fill_(float("nan"))
    s4.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    w16, w4 = step(x2)
    assert torch.equal(s16, w16) and torch.equal(s4, w4)


@pytest.mark.gpu
def test_gpu_dense_gemm_op(seed):
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
    c = ops.gemm(a, b, torch.bfloat16)
    assert_gemm_close(c, a, b, "tk_cute::gemm")


@pytest.mark.gpu
def test_gpu_opcheck(seed):
    # The CUDA quantizer returns its global scale as a 0-dim view into a small workspace (a
    # nonzero storage offset); opcheck compares that with the fake's metadata.
    x = torch.randn(40, 256, device="cuda", dtype=torch.bfloat16)
    b = quantize(torch.randn(128, 256, device="cuda"))
    aq = quantize(torch.randn(40, 256, device="cuda"))
    torch.library.opcheck(ops.nvfp4_quantize.default, (x, None, False))
    torch.library.opcheck(ops.nvfp4_gemm.default,
                          (x, None, None, *parts(b), torch.bfloat16, False))
    torch.library.opcheck(ops.nvfp4_gemm.default,
                          (*parts(aq), *parts(b), torch.bfloat16, False))
    torch.library.opcheck(ops.nvfp4_gemm.default,  # W4A4 quantized in the small-M kernel
                          (x[:1], None, None, *parts(b), torch.bfloat16, False, True))


def test_ops_refuse_inputs_that_require_grad(seed):
    """No autograd formula: an input that requires grad with grad mode on raises (no gradient
    is dropped silently); under no_grad the same call runs and its output needs no grad."""
    a = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(16, 32, dtype=torch.bfloat16)
    x = torch.randn(4, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        ops.gemm(a, b, torch.bfloat16)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        ops.nvfp4_quantize(x, None, False)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        ops.nvfp4_gemm(a, None, None, *parts(quantize(b.float())), torch.bfloat16)
    with torch.no_grad():
        c = ops.gemm(a, b, torch.bfloat16)
        q = ops.nvfp4_quantize(x, None, False)
    assert not c.requires_grad and not any(t.requires_grad for t in q)
