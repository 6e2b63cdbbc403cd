"""tk_cute.nvfp4.Linear / quantize_ / F.linear on NVFP4 weights: values against the exact
references, torch.compile with no graph break, state-dict round trips, devices, bad input; on
a GPU the model compiled and graph-captured against the exact reference of each layer."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tk_cute import nvfp4
from tk_cute.nvfp4 import Linear, NVFP4Tensor, quantize, quantize_
from tk_cute.nvfp4.reference import gemm_reference, w4a16_reference
from tk_cute.testing import HALF_SUBNORMAL, UNIT_ROUNDOFF, assert_gemm_close, gemm_bound

ACTIVATIONS = ("bf16", "nvfp4")


class MLP(nn.Module):
    def __init__(self, hidden=64, intermediate=96, bias=False):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=bias)
        self.up = nn.Linear(hidden, intermediate, bias=bias)
        self.down = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def bf16_mlp(**kw):
    return MLP(**kw).to(torch.bfloat16).requires_grad_(False)


def layer_reference(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """What a CPU Linear must return, from the exact references (x: (..., K))."""
    w = layer.weight
    if layer.activations == "nvfp4":
        x2 = x.reshape(-1, layer.in_features)
        y = gemm_reference(quantize(x2), w, x.dtype).reshape(*x.shape[:-1], -1)
    else:
        y = w4a16_reference(x, w, torch.bfloat16)
    return y if layer.bias is None else y + layer.bias


def assert_layer_close(y: torch.Tensor, layer: Linear, x: torch.Tensor, what: str = "Linear"):
    """Every element of a CPU Linear's y = layer(x) against the float64 product d of the exactly
    decoded operands (x quantized as the layer does for W4A4), independently of the references.
    Without a bias: `assert_gemm_close`'s bound B on D. With one, y = fl(D + bias) adds one
    rounding to y's dtype (the CPU add may round to fp32 first: u' = u (1 + 2^-15) covers both
    roundings, u y's unit roundoff): |y - (d + bias)| <= (1 + u') B + u' |d + bias| + tiny."""
    K, N = layer.in_features, layer.out_features
    x2 = x.reshape(-1, K)
    a = quantize(x2) if layer.activations == "nvfp4" else x2
    y2 = y.reshape(-1, N)
    if layer.bias is None:
        assert_gemm_close(y2, a, layer.weight, what)
        return
    d, bound = gemm_bound(a, layer.weight, y.dtype)
    want = d + layer.bias.double()  # exact: a bf16 bias added in float64 to a float64 d
    u = UNIT_ROUNDOFF[y.dtype] * (1 + 2.0**-15)
    tol = (1 + u) * bound + u * want.abs() + HALF_SUBNORMAL[y.dtype]
    bad = ~((y2.double() - want).abs() <= tol)  # NaN fails too
    assert not bad.any(), f"{what}: {int(bad.sum())} of {y2.numel()} elements outside the bound"


# ---------------------------------------------------------------- one layer


@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_the_exact_reference(activations, bias, seed):
    lin = nn.Linear(80, 48, bias=bias).to(torch.bfloat16)
    layer = Linear.from_linear(lin, activations=activations)
    assert isinstance(layer.weight, NVFP4Tensor) and layer.weight.shape == (48, 80)
    ref_w = quantize(lin.weight.detach())  # the weight's bytes are quantize's
    assert torch.equal(layer.weight_data, ref_w.data) and torch.equal(layer.weight_scales,
                                                                      ref_w.scales)
    assert torch.equal(layer.weight_global_scale, ref_w.global_scale)
    x = torch.randn(2, 7, 80, dtype=torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 7, 48) and y.dtype == torch.bfloat16
    assert torch.equal(y, layer_reference(layer, x))
    # element-wise against the float64 product of the exactly decoded operands (plus the bias)
    assert_layer_close(y, layer, x, f"Linear {activations} bias={bias}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_w4a4_keeps_the_activation_dtype(dtype, seed):
    layer = Linear.from_linear(nn.Linear(32, 16, bias=False), activations="nvfp4")
    x = torch.randn(5, 32, dtype=dtype)
    y = layer(x)
    assert y.dtype == dtype
    assert torch.equal(y, gemm_reference(quantize(x), layer.weight, dtype))
    assert_gemm_close(y, quantize(x), layer.weight, f"W4A4 Linear {dtype}")


@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_f_linear_and_matmul_on_an_nvfp4_weight_equal_the_module(activations, seed):
    layer = Linear.from_linear(nn.Linear(64, 32).to(torch.bfloat16), activations=activations)
    w, b = layer.weight, layer.bias
    x = torch.randn(9, 64, dtype=torch.bfloat16)
    y = layer(x)
    if activations == "bf16":
        assert torch.equal(F.linear(x, w, b), y)
        assert torch.equal(F.linear(x, weight=w, bias=b), y)
        assert torch.equal(x @ w.t() + b, y)
        assert torch.equal(torch.matmul(x, w.T) + b, y)
        assert torch.equal(torch.mm(x, w.mT) + b, y)
        assert torch.equal(nvfp4.linear(x, w, b), y)
    else:  # W4A4 is F.linear on the quantized activations
        xq = quantize(x)
        assert torch.equal(F.linear(xq, w, b), y)
        assert torch.equal(xq @ w.t() + b, y)  # TransposedNVFP4.__rmatmul__
        assert torch.equal(torch.matmul(xq, w.t()) + b, y)


def test_torch_functions_other_than_linear_raise(seed):
    w = quantize(torch.randn(16, 32))
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="not torch.add: call .dequantize"):
        torch.add(w, 1)
    with pytest.raises(TypeError, match="not torch.cat"):
        torch.cat([w.data, w])
    with pytest.raises(TypeError, match=r"x @ w.t\(\)"):
        torch.matmul(x, w)  # the weight untransposed: D would be x @ w, not x @ w^T
    with pytest.raises(TypeError, match=r"x @ w.t\(\)"):
        x @ w
    with pytest.raises(TypeError, match="W4A16 activations must be a torch.bfloat16"):
        F.linear(x.double(), w)
    assert w.t().t() is w and w.t().shape == (32, 16)
    assert torch.equal(w.t().dequantize(), w.dequantize().t())


def test_linear_is_inference_only(seed):
    layer = Linear.from_linear(nn.Linear(32, 16).to(torch.bfloat16))
    x = torch.randn(3, 32, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="inference-only"):
        layer(x)
    with pytest.raises(RuntimeError, match="inference-only"):
        F.linear(x, layer.weight)
    with torch.no_grad():
        y = layer(x)
    assert not y.requires_grad and torch.equal(y, layer(x.detach()))
    with torch.inference_mode():
        assert torch.equal(layer(x), y)


def test_linear_rejects_bad_input(seed):
    with pytest.raises(TypeError, match="takes an nn.Linear"):
        Linear.from_linear(nn.Conv1d(16, 16, 1))
    with pytest.raises(ValueError, match="in_features % 16"):
        Linear.from_linear(nn.Linear(40, 16))
    with pytest.raises(ValueError, match="activations must be"):
        Linear.from_linear(nn.Linear(32, 16), activations="fp8")
    bad = nn.Linear(32, 16)
    with torch.no_grad():
        bad.weight[3, 5] = float("nan")
    with pytest.raises(ValueError, match="NaN/Inf"):
        Linear.from_linear(bad)
    layer = Linear.from_linear(nn.Linear(32, 16))
    with pytest.raises(ValueError, match="in_features=32"):
        layer(torch.randn(2, 48, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="W4A16 Linear takes bfloat16"):
        layer(torch.randn(2, 32).double())
    w4a4 = Linear.from_linear(nn.Linear(32, 16), activations="nvfp4")
    x = torch.randn(2, 32)
    x[1, 3] = float("inf")
    with pytest.raises(ValueError, match="finite"):  # CPU forwards always check
        w4a4(x)


# ---------------------------------------------------------------- quantize_


@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_quantize_swaps_every_linear_and_matches_layer_references(activations, seed):
    model = bf16_mlp(bias=True)
    ref = copy.deepcopy(model)
    assert quantize_(model, activations=activations) is model
    assert all(isinstance(getattr(model, n), Linear) for n in ("gate", "up", "down"))
    assert model.gate.activations == activations
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    want = layer_reference(model.down, F.silu(layer_reference(model.gate, x))
                           * layer_reference(model.up, x))
    y = model(x)
    assert torch.equal(y, want)
    # Each layer on its own input against the exact product plus its bias (not the references).
    h = F.silu(model.gate(x)) * model.up(x)
    for name, layer, inp in (("gate", model.gate, x), ("up", model.up, x), ("down", model.down, h)):
        assert_layer_close(layer(inp), layer, inp, f"{name} {activations}")
    # Against the bf16 model: NVFP4's error on random data (module docstring of the example).
    err = float((y.float() - ref(x).float()).norm() / ref(x).float().norm())
    assert err < (0.25 if activations == "bf16" else 0.35), err


def test_quantize_filter_shared_modules_and_errors(seed):
    model = bf16_mlp()
    quantize_(model, lambda m, fqn: isinstance(m, nn.Linear) and fqn != "down")
    assert isinstance(model.gate, Linear) and isinstance(model.down, nn.Linear)

    shared = nn.Linear(32, 32).to(torch.bfloat16)
    pair = nn.Sequential(shared, nn.ReLU(), shared)
    quantize_(pair)
    assert isinstance(pair[0], Linear) and pair[0] is pair[2]  # quantized once, still shared

    with pytest.raises(TypeError, match="only nn.Linear modules are swapped"):
        quantize_(nn.Sequential(nn.Linear(16, 16), nn.ReLU()), lambda m, fqn: True)
    with pytest.raises(TypeError, match="for one layer use Linear.from_linear"):
        quantize_(nn.Linear(32, 16))
    with pytest.raises(ValueError, match="'1', which NVFP4 cannot serve: in_features=24"):
        quantize_(nn.Sequential(nn.Linear(16, 24), nn.Linear(24, 16)), lambda m, fqn: True)
    with pytest.raises(ValueError, match="activations must be"):
        quantize_(bf16_mlp(), activations="int4")


def test_quantize_skips_what_it_cannot_serve_and_says_so(seed, caplog):
    # nn.TransformerEncoderLayer: MultiheadAttention's out_proj is multiplied by
    # F.multi_head_attention_forward itself (it reads .weight): skipped, as torchao skips it
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=96, batch_first=True,
                                       dropout=0.0).to(torch.bfloat16).eval()
    ref = copy.deepcopy(layer)
    model = nn.Sequential(layer, nn.Linear(64, 24), nn.Linear(24, 8)).to(torch.bfloat16)
    plan = nvfp4.quantize_plan(model)
    assert sorted(plan.swap) == ["0.linear1", "0.linear2", "1"]
    assert set(plan.skip) == {"0.self_attn.out_proj", "2"}
    assert "dense tensor" in plan.skip["0.self_attn.out_proj"] and "24" in plan.skip["2"]
    with caplog.at_level("INFO", logger="tk_cute.nvfp4"):
        assert quantize_(model) is model
    assert "3 nn.Linear swapped, 2 skipped" in caplog.text and "0.self_attn.out_proj" in caplog.text
    assert isinstance(layer.linear1, Linear) and isinstance(layer.linear2, Linear)
    assert type(layer.self_attn.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    assert isinstance(model[1], Linear) and type(model[2]) is nn.Linear
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        y, want = layer(x), ref(x)
    assert y.shape == want.shape and y.dtype == torch.bfloat16
    err = float((y.float() - want.float()).norm() / want.float().norm())
    assert err < 0.1, err  # two NVFP4 layers inside a residual block (LayerNorm'd)
    with torch.no_grad():
        assert model(x).shape == (2, 5, 8)
    with pytest.raises(ValueError, match="out_proj', which NVFP4 cannot serve"):
        quantize_(nn.TransformerEncoderLayer(64, 4, 96), lambda m, fqn: isinstance(m, nn.Linear))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_fp32_and_fp16_models_run(dtype, activations, seed):
    ref = MLP(bias=True).to(dtype).requires_grad_(False)
    model = quantize_(copy.deepcopy(ref), activations=activations)
    x = torch.randn(3, 64, dtype=dtype)
    with torch.no_grad():
        y = model(x)
    assert y.dtype == dtype
    layer = model.gate
    with torch.no_grad():
        got = layer(x)
    if activations == "bf16":  # cast in, W4A16 writing D in x's dtype, then the bias
        want = w4a16_reference(x.to(torch.bfloat16), layer.weight, dtype) + layer.bias
    else:
        want = gemm_reference(quantize(x), layer.weight, dtype) + layer.bias
    assert torch.equal(got, want)
    err = float((y.float() - ref(x).float()).norm() / ref(x).float().norm())
    assert err < (0.25 if activations == "bf16" else 0.35), err


def test_outputs_keep_the_input_dtype_whatever_the_bias_dtype(seed):
    """D is in x's dtype: W4A16 writes fp32 / fp16 D from the kernel (not bf16 cast back), and
    a bias of another dtype is cast to it (no type promotion), in the module and F.linear."""
    w = quantize(torch.randn(48, 64))
    x = torch.randn(5, 64)
    for dtype in (torch.float32, torch.float16):
        want = w4a16_reference(x.to(dtype).bfloat16(), w, dtype)
        assert torch.equal(F.linear(x.to(dtype), w), want)
    want = F.linear(x, w)  # fp32 D: the sums, not their bf16 rounding
    assert want.dtype == torch.float32 and not torch.equal(want, want.bfloat16().float())
    bias = torch.randn(48)  # float32
    y = F.linear(x.bfloat16(), w, bias)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, w4a16_reference(x.bfloat16(), w) + bias.bfloat16())
    layer = Linear.from_linear(nn.Linear(64, 48).to(torch.bfloat16))
    with torch.no_grad():
        y = layer(x.half())
    assert y.dtype == torch.float16
    assert torch.equal(y, w4a16_reference(x.half().bfloat16(), layer.weight, torch.float16)
                       + layer.bias.half())


def test_tied_weights_are_skipped_by_default(seed):
    """An output head sharing the embedding's weight stays dense by default (a swap would keep
    both copies); a filter_fn selecting it raises."""
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.body = nn.Embedding(100, 64), nn.Linear(64, 64)
            self.head = nn.Linear(64, 100, bias=False)
            self.head.weight = self.emb.weight

    model = Tied().to(torch.bfloat16)
    plan = nvfp4.quantize_plan(model)
    assert plan.swap == ["body"] and "shared with 'emb'" in plan.skip["head"]
    quantize_(model)
    assert isinstance(model.body, Linear) and model.head.weight is model.emb.weight
    with pytest.raises(ValueError, match="head', which NVFP4 cannot serve: its weight is shared"):
        quantize_(Tied(), lambda m, fqn: fqn == "head")


def test_compiled_functional_calls_trace_the_ops(seed):
    """`gemm` and `quantize` (check_finite=False) trace as the custom ops under torch.compile
    (fullgraph, equal to eager); calls the ops cannot express run eagerly behind a graph break,
    and under fullgraph raise naming why."""
    torch._dynamo.reset()
    w = quantize(torch.randn(48, 64))
    x = torch.randn(2, 3, 64)
    fns = {"w4a16": lambda x: nvfp4.gemm(x.bfloat16(), w),
           "quantize_a": lambda x: nvfp4.gemm(x, w, torch.float32, quantize_a=True),
           "w4a4": lambda x: nvfp4.gemm(quantize(x[0], check_finite=False), w)}
    for name, fn in fns.items():
        assert torch.equal(torch.compile(fn, fullgraph=True, backend="aot_eager")(x), fn(x)), name
    checked = lambda x: quantize(x[0]).data  # check_finite: a host sync
    assert torch.equal(torch.compile(checked, backend="aot_eager")(x), checked(x))
    torch._dynamo.reset()  # (else the graph-broken frame above is reused)
    with pytest.raises(Exception, match="check_finite=False"):
        torch.compile(checked, fullgraph=True, backend="aot_eager")(x)
    torch._dynamo.reset()


@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_empty_batches_return_empty_outputs(activations, seed):
    layer = Linear.from_linear(nn.Linear(32, 16).to(torch.bfloat16), activations)
    for shape in [(0, 32), (3, 0, 32), (0, 0, 32)]:
        for dtype in (torch.bfloat16, torch.float32):
            y = layer(torch.empty(shape, dtype=dtype))
            assert y.shape == (*shape[:-1], 16) and y.dtype == dtype
    y = F.linear(torch.empty(0, 32, dtype=torch.bfloat16), layer.weight, layer.bias)
    assert y.shape == (0, 16) and y.dtype == torch.bfloat16


def test_to_half_and_parameters_behave_as_documented(seed):
    model = quantize_(bf16_mlp(bias=True))
    assert list(model.parameters()) == []  # every part is a buffer: nothing to train
    assert {n.rsplit(".", 1)[1] for n, _ in model.named_buffers()} == {
        "weight_data", "weight_scales", "weight_global_scale", "bias"}
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        y = model(x)
        model.half()
        assert model.gate.weight_global_scale.dtype == torch.float32
        assert model.gate.bias.dtype == torch.float16
        assert model.gate.weight_data.dtype == torch.uint8
        y16 = model(x.half())
        model.float()
        y32 = model(x.float())
    assert y16.dtype == torch.float16 and y32.dtype == torch.float32
    assert float((y16.float() - y.float()).norm() / y.float().norm()) < 2.0**-6
    assert float((y32 - y.float()).norm() / y.float().norm()) < 2.0**-6


def test_static_input_scale_is_carried_and_checked(seed):
    w = quantize(torch.randn(16, 32))
    layer = Linear.from_nvfp4(w, activations="nvfp4", input_global_scale=torch.tensor([0.01]))
    assert layer.input_global_scale.shape == () and "input_scale=True" in repr(layer)
    layer.half()
    assert layer.input_global_scale.dtype == torch.float32
    with pytest.raises(ValueError, match="input_global_scale"):
        Linear.from_nvfp4(w, input_global_scale=torch.tensor(float("nan")))
    sd = layer.state_dict()
    with pytest.raises(RuntimeError, match="input_global_scale"):
        Linear(32, 16).load_state_dict(dict(sd, input_global_scale=torch.tensor(-1.0)))
    fresh = Linear(32, 16)  # no input scale yet: loading one adds the buffer
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.input_global_scale, layer.input_global_scale)


# ---------------------------------------------------------------- state dict and devices


@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_state_dict_round_trip_is_bitwise(activations, seed):
    model = quantize_(bf16_mlp(bias=True), activations=activations)
    sd = model.state_dict()
    assert set(sd) == {f"{n}.{p}" for n in ("gate", "up", "down")
                       for p in ("weight_data", "weight_scales", "weight_global_scale", "bias")}
    assert all(type(t) is torch.Tensor for t in sd.values())  # plain tensors
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    fresh = quantize_(bf16_mlp(bias=True), activations=activations)  # other random weights
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert not torch.equal(fresh(x), model(x))
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh(x), model(x))
    empty = MLP(bias=True)  # or a model of empty Linear modules of the right shapes
    for n in ("gate", "up", "down"):
        old = getattr(empty, n)
        setattr(empty, n, Linear(old.in_features, old.out_features, bias=True,
                                 activations=activations))
    empty.load_state_dict(loaded)
    assert torch.equal(empty(x), model(x))


def test_state_dict_holds_contiguous_codes_and_loads_them_padded(seed):
    """K % 32 != 0: the codes' rows are 16-byte padded in memory, but the state dict holds them
    contiguous (N, K // 2), as safetensors requires; loading pads them again."""
    model = quantize_(nn.Sequential(nn.Linear(48, 32)).to(torch.bfloat16))
    assert not model[0].weight_data.is_contiguous()
    sd = model.state_dict()
    assert sd["0.weight_data"].is_contiguous() and sd["0.weight_data"].shape == (32, 24)
    assert torch.equal(sd["0.weight_data"], model[0].weight_data)
    fresh = quantize_(nn.Sequential(nn.Linear(48, 32)).to(torch.bfloat16))
    fresh.load_state_dict(sd)
    assert fresh[0].weight_data.stride() == model[0].weight_data.stride()
    x = torch.randn(3, 48, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


def test_to_moves_every_part_and_keeps_the_decode_scale_float32(seed):
    layer = Linear.from_linear(nn.Linear(32, 16).to(torch.bfloat16))
    gs = layer.weight_global_scale.clone()
    layer.to(torch.float16)
    assert layer.weight_global_scale.dtype == torch.float32
    assert torch.equal(layer.weight_global_scale, gs) and layer.bias.dtype == torch.float16
    layer.to("meta")
    assert {t.device.type for t in layer.state_dict().values()} == {"meta"}
    q = quantize(torch.randn(8, 32))
    assert q.cpu() is q and q.to("cpu") is q
    m = q.to("meta")
    assert {t.device.type for t in (m.data, m.scales, m.global_scale)} == {"meta"}


@pytest.mark.gpu
def test_cuda_moves_every_part(seed):
    layer = Linear.from_linear(nn.Linear(64, 32).to(torch.bfloat16)).cuda()
    assert {t.device.type for t in layer.state_dict().values()} == {"cuda"}
    back = copy.deepcopy(layer).cpu()
    assert all(torch.equal(a.cpu(), b) for a, b in zip(layer.state_dict().values(),
                                                       back.state_dict().values()))
    q = quantize(torch.randn(8, 32)).cuda()
    assert q.device.type == "cuda" and torch.equal(q.cpu().data, q.data.cpu())


# ---------------------------------------------------------------- NVFP4Tensor forms


def test_nvfp4tensor_accepts_torch_fp4_fp8_flat_and_1_element_forms(seed):
    q = quantize(torch.randn(130, 96))
    assert q.data_fp4x2.dtype == torch.float4_e2m1fn_x2 and q.data_fp4x2.shape == q.data.shape
    assert q.scales_e4m3.dtype == torch.float8_e4m3fn and q.scales_e4m3.shape == q.scales.shape
    r = NVFP4Tensor(q.data_fp4x2, q.scales_e4m3.reshape(-1), q.global_scale.reshape(1), q.shape)
    assert r.data.dtype == torch.uint8 and r.scales.shape == q.scales.shape
    assert r.global_scale.shape == () and torch.equal(r.dequantize(), q.dequantize())
    with pytest.raises(ValueError, match="scales must be uint8 of shape"):  # logical, not blocked
        NVFP4Tensor(q.data, q.scales_logical(), q.global_scale, q.shape)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        NVFP4Tensor(q.data.tolist(), q.scales, q.global_scale, q.shape)


# ---------------------------------------------------------------- torch.compile (CPU)


@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_compiled_model_has_no_graph_break_and_equals_eager(activations, seed):
    import torch._inductor.config as inductor_config

    model = quantize_(bf16_mlp(), activations=activations)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    # Inductor keeps silu(gate) * up in fp32 (one rounding) unless told to round like eager.
    with inductor_config.patch(emulate_precision_casts=True):
        compiled = torch.compile(model, fullgraph=True)
        assert torch.equal(compiled(x), model(x))
    aot = torch.compile(model, fullgraph=True, backend="aot_eager")  # the fake impls, traced
    x2 = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(aot(x2), model(x2))
    torch._dynamo.reset()
    with inductor_config.patch(emulate_precision_casts=True):  # max-autotune compiles too
        tuned = torch.compile(model, mode="max-autotune", fullgraph=True)
        assert torch.equal(tuned(x), model(x))
    torch._dynamo.reset()
    with inductor_config.patch(emulate_precision_casts=True):  # and symbolic batch sizes
        dynamic = torch.compile(model, dynamic=True, fullgraph=True)
        for rows in (3, 17):
            xr = torch.randn(rows, 64, dtype=torch.bfloat16)
            assert torch.equal(dynamic(xr), model(xr))


def _tk_cute_ops_called(fn) -> list[str]:
    """The tk_cute custom ops the dispatcher saw while fn() ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "tk_cute":
                self.names.append(func.name())
            return func(*args, **(kwargs or {}))

    with Log() as log:
        fn()
    return log.names


@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_eager_forward_skips_the_dispatcher_the_ops_reach_it(activations, seed):
    # Eager forwards call the functions the ops wrap (the dispatcher's host cost, modules
    # `_gemm`); the ops themselves, what torch.compile traces, do reach it (the log works).
    layer = Linear.from_linear(nn.Linear(64, 48, dtype=torch.bfloat16), activations)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert _tk_cute_ops_called(lambda: layer(x)) == []
    assert _tk_cute_ops_called(lambda: F.linear(x, layer.weight)) == []
    w = (layer.weight_data, layer.weight_scales, layer.weight_global_scale)
    called = _tk_cute_ops_called(lambda: torch.ops.tk_cute.nvfp4_gemm(x, None, None, *w,
                                                                       torch.bfloat16))
    assert called == ["tk_cute::nvfp4_gemm"]


# ---------------------------------------------------------------- GPU


def _capture(fn, static_x):
    """A CUDA graph of fn(static_x) after warm-up on a side stream (kernels compile there)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(static_x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = fn(static_x)
    return g, static_y


def _layer_inputs(model, x):
    """{layer name: (input, output)} of every NVFP4 Linear in one eager forward."""
    seen, hooks = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, Linear):
            hooks.append(mod.register_forward_hook(
                lambda m, args, out, n=name: seen.__setitem__(n, (args[0], out))))
    model(x)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 16, 200])
def test_gpu_model_compiled_and_graphed(activations, tokens, seed):
    H, I = 1024, 4096  # Hopper kernels: N % 128, K % 256 (the register-A and small-M paths)
    ref_model = bf16_mlp(hidden=H, intermediate=I).cuda()
    model = quantize_(copy.deepcopy(ref_model), activations=activations)
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        y = model(x)
        # Each layer against its exact reference, element by element (the activations of a
        # W4A4 layer are quantize's bytes: the CUDA quantizer is bit-exact with it).
        for name, (a, out) in _layer_inputs(model, x).items():
            layer = model.get_submodule(name)
            a2 = a.reshape(-1, layer.in_features)
            a_op = quantize(a2) if activations == "nvfp4" else a2
            assert_gemm_close(out.reshape(-1, layer.out_features), a_op, layer.weight, name)
        # Against the bf16 model: NVFP4's error on random data (0.16 / 0.24 measured on CPU).
        ref = ref_model(x).float()
        err = float((y.float() - ref).norm() / ref.norm())
        assert err < (0.25 if activations == "bf16" else 0.35), err
        # A CUDA graph of the eager forward: the same kernels, so the same bits.
        static_x = x.clone()
        g, static_y = _capture(model, static_x)
        x2 = torch.randn_like(x)
        static_x.copy_(x2)
        static_y.fill_(float("nan"))  # poisoned: the replay must write every element
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, model(x2))
        # Compiled (the elementwise ops are inductor's: its SiLU * up rounds differently by a
        # bf16 ulp here and there). W4A16: within bf16 rounding of eager. W4A4: those ulps can
        # flip activation codes of the next layer's quantization (its steps are 1/8 to 1/3 of
        # a value), so the compiled model is held to the format's own bound against bf16, as
        # eager is (on the H200: 0.049 relative to eager at 512 tokens).
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        yc = compiled(x2)
        want = model(x2).float()
        if activations == "bf16":
            assert float((yc.float() - want).norm() / want.norm()) < 2.0**-6
        else:
            ref2 = ref_model(x2).float()
            assert float((yc.float() - ref2).norm() / ref2.norm()) < 0.35
        gc, static_yc = _capture(compiled, static_x)
        static_yc.fill_(float("nan"))
        gc.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_yc, yc)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "default"])
@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_gpu_compile_modes_across_batch_sizes(activations, mode, seed):
    """torch.compile(mode="reduce-overhead") (CUDA graph trees) over several batch sizes in one
    process, each recorded once and replayed, coming back to earlier ones: every replay is the
    compiled graph's result for its fresh input (W4A16: within bf16 rounding of eager; W4A4:
    the format's bound against bf16, as in test_gpu_model_compiled_and_graphed); "max-autotune"
    and "default" (kept buffers on the default stream, `runtime.per_call_buffers`) the same
    way."""
    H, I = 1024, 4096
    ref_model = bf16_mlp(hidden=H, intermediate=I).cuda()
    model = quantize_(copy.deepcopy(ref_model), activations=activations)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode=mode, fullgraph=True)
    with torch.inference_mode():
        for tokens in (1, 16, 256, 1, 16):
            for _ in range(3):  # warm-up, record, replay
                x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
                y = compiled(x).clone()
            if activations == "bf16":
                want = model(x).float()
                assert float((y.float() - want).norm() / want.norm()) < 2.0**-6, tokens
            else:
                ref = ref_model(x).float()
                assert float((y.float() - ref).norm() / ref.norm()) < 0.35, tokens


def test_linear_reads_parts_that_are_no_longer_buffers(seed):
    """A bias made a Parameter (no longer a buffer) is still added."""
    layer = Linear.from_linear(nn.Linear(32, 16).bfloat16())
    layer.bias = nn.Parameter(torch.randn(16).bfloat16(), requires_grad=False)
    x = torch.randn(3, 32).bfloat16()
    with torch.no_grad():
        want = w4a16_reference(x, layer.weight, torch.bfloat16) + layer.bias
        assert torch.equal(layer(x), want)
