"""NVFP4 checkpoints (tk_cute.nvfp4.checkpoint) against the libraries that publish them.

compressed-tensors: the real library (with transformers, CPU) writes a tiny random Llama in its
``nvfp4-pack-quantized`` format, transformers loads it dequantized (the library's own
``decompress``), and tk_cute's model loaded from the same files is compared element by element:
the bytes exactly, the dequantized weights within the library's own roundings, each layer's
output within the bound of both GEMMs' arithmetic. tk_cute's saved checkpoints are loaded back
by the library the same way.

ModelOpt: its library does not install here (and transformers does not load its NVFP4 format),
so its documented formats are transcribed (``NVFP4QTensor.quantize`` / ``dequantize`` of
modelopt/torch/quantization/qtensor/nvfp4_tensor.py) to write synthetic checkpoints that
tk_cute loads, checked the same way; saving back is bit-exact.
"""

import json
import math

import pytest
import torch
from torch import nn

from tk_cute import nvfp4
from tk_cute.nvfp4 import Linear, NVFP4Tensor, quantize
from tk_cute.nvfp4.reference import gemm_reference
from tk_cute.testing import HALF_SUBNORMAL, gemm_bound

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

U32 = 2.0**-24
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def tiny_llama(**kw):
    from transformers import LlamaConfig

    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
               tie_word_embeddings=False)
    cfg.update(kw)
    return LlamaConfig(**cfg)


def from_config(cfg):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def nvfp4_linears(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, Linear)}


def layer_io(model, x, names):
    """{name: (input, output)} of the named modules in one forward of `model` on tokens x."""
    seen, hooks = {}, []
    for name in names:
        mod = model.get_submodule(name)
        hooks.append(mod.register_forward_hook(
            lambda m, args, out, n=name: seen.__setitem__(n, (args[0].detach(), out.detach()))))
    with torch.no_grad():
        logits = model(x).logits
    for h in hooks:
        h.remove()
    return seen, logits


def assert_weights_close(w_lib, layer: Linear, rel: float, what: str):
    """The library's dequantized weight against tk_cute's exact decode T = e2m1 * sf * d:
    |w_lib - T| <= rel * |T| + half the smallest subnormal of w_lib's dtype, zero where T is."""
    T = layer.weight.dequantize(torch.float64)
    got = w_lib.double()
    tol = rel * T.abs() + HALF_SUBNORMAL[w_lib.dtype]
    bad = ~((got - T).abs() <= tol) | ((T == 0) & (got != 0))
    assert not bad.any(), f"{what}: {int(bad.sum())} of {T.numel()} weights off"


def assert_layer_matches_library(x, y_lib, w_lib, layer: Linear, what: str):
    """tk_cute's layer(x) against the library's y_lib = x @ w_lib^T (a dense weight), element by
    element: each lies within `gemm_bound` of its own exact product (fp32 sums, one rounding to
    the output dtype), and the exact products differ by at most sum_k |x| |W_tk - W_lib|."""
    with torch.no_grad():
        y = layer(x)
    assert y.shape == y_lib.shape and y.dtype == y_lib.dtype
    K = layer.in_features
    x2, y2, ylib2 = x.reshape(-1, K), y.reshape(-1, y.shape[-1]), y_lib.reshape(-1, y.shape[-1])
    _, b_tk = gemm_bound(x2, layer.weight, y.dtype)
    _, b_lib = gemm_bound(x2, w_lib, y.dtype)
    dw = x2.double().abs() @ (layer.weight.dequantize(torch.float64) - w_lib.double()).abs().T
    tol = b_tk + b_lib + dw * (1 + 2.0**-40)
    bad = ~((y2.double() - ylib2.double()).abs() <= tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {y2.numel()} outputs outside the bound"


def assert_models_agree(tk_model, lib_model, weight_rel: float, what: str):
    """Every NVFP4 layer of tk_model against the same layer of lib_model (dense weights): the
    weights (`assert_weights_close`) and the outputs on the library's own layer inputs
    (`assert_layer_matches_library`); the logits of the whole model close in norm (errors
    compound through norms and softmax: no element-wise bound exists there)."""
    names = list(nvfp4_linears(tk_model))
    assert names, "no NVFP4 layer"
    x = torch.randint(0, tk_model.config.vocab_size, (2, 11))
    seen, logits_lib = layer_io(lib_model, x, names)
    for name in names:
        layer, w_lib = tk_model.get_submodule(name), lib_model.get_submodule(name).weight
        assert_weights_close(w_lib.detach(), layer, weight_rel, f"{what} {name} weight")
        inp, out = seen[name]
        assert_layer_matches_library(inp, out, w_lib.detach(), layer, f"{what} {name}")
    with torch.no_grad():
        logits = tk_model(x).logits
    err = float((logits.float() - logits_lib.float()).norm() / logits_lib.float().norm())
    assert err < 2.0**-5, f"{what}: logits differ by {err:.3g} (relative)"


# ---------------------------------------------------------------- compressed-tensors


def write_compressed_tensors(model, path, scheme="NVFP4A16", act_amax=None):
    """`model` quantized and saved by compressed-tensors itself: its scheme, its global and
    block scale helpers (what llm-compressor's observers call), its compressor, its config."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    qc = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(scheme, ["Linear"])},
                            ignore=["lm_head"])
    apply_quantization_config(model, qc)
    for _, mod in model.named_modules():
        if not hasattr(mod, "weight_global_scale"):
            continue
        w = mod.weight.detach()
        gs = generate_gparam(w.amin(), w.amax())
        blocks = w.float().unflatten(-1, (-1, 16))
        sc, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), mod.quantization_scheme.weights,
                                  global_scale=gs)
        mod.weight_global_scale.data.copy_(gs)
        mod.weight_scale.data = sc.to(mod.weight_scale.dtype)
        if hasattr(mod, "input_global_scale"):
            a = torch.tensor(act_amax * (0.5 + torch.rand(()).item()))
            mod.input_global_scale.data.copy_(generate_gparam(-a, a))
    comp = ModelCompressor.from_pretrained_model(model, quantization_format="nvfp4-pack-quantized")
    comp.compress_model(model)
    model.save_pretrained(path)
    comp.update_config(path)


def library_model(path):
    """transformers + compressed-tensors' own dequantized model (bf16 dense weights)."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16,
        quantization_config=CompressedTensorsConfig(run_compressed=False)).eval()


@pytest.fixture
def ct_checkpoint(tmp_path, seed):
    pytest.importorskip("compressed_tensors")
    path = tmp_path / "ct"
    cfg = tiny_llama()
    write_compressed_tensors(from_config(cfg), path)
    return cfg, path


# compressed-tensors' dequantized weights, as transformers 4.57 loads a bfloat16 model: the
# global scale g is loaded into a bfloat16 parameter and the decompression runs in bfloat16,
# bf16(e2m1 * bf16(sf / bf16(g))): three bf16 roundings (transformers 5 keeps g float32 and
# computes in float32: bf16(fl32(e2m1 * fl32(sf / g))), one). tk_cute decodes e2m1 * sf * d,
# d = fl32(1 / g). Relative to it: (1 + 2^-8)^2 / (1 - 2^-8) * (1 + 2^-24) - 1 < 3 * 2^-8 + 2^-14.
CT_WEIGHT_REL = 3 * 2.0**-8 + 2.0**-14


def test_compressed_tensors_checkpoint_matches_the_library(ct_checkpoint):
    cfg, path = ct_checkpoint
    model = from_config(cfg)
    report = nvfp4.load_checkpoint(model, path)
    assert report.format == "compressed-tensors" and not report.missing
    assert len(report.quantized) == 14 and "lm_head" not in report.quantized  # 7 per layer
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, Linear)
    sd = safetensors_torch.load_file(str(path / "model.safetensors"))
    for name, layer in nvfp4_linears(model).items():  # the bytes, exactly
        assert torch.equal(layer.weight_data, sd[f"{name}.weight_packed"])
        assert torch.equal(layer.weight.scales_logical(),
                           sd[f"{name}.weight_scale"].view(torch.uint8))
        enc = sd[f"{name}.weight_global_scale"]
        assert enc.dtype == torch.float32 and enc.shape == (1,)
        assert torch.equal(layer.weight_global_scale, (1 / enc).reshape(()))  # ENCODE scale
    assert_models_agree(model, library_model(path), CT_WEIGHT_REL, "compressed-tensors")


def test_compressed_tensors_round_trips(ct_checkpoint, tmp_path):
    cfg, path = ct_checkpoint
    model = from_config(cfg)
    nvfp4.load_checkpoint(model, path)
    out = tmp_path / "saved"
    nvfp4.save_checkpoint(model, out, "compressed-tensors")
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == "nvfp4-pack-quantized" and qcfg["ignore"] == ["lm_head"]
    # the library loads what tk_cute saved, to the same values
    assert_models_agree(model, library_model(out), CT_WEIGHT_REL, "tk_cute -> compressed-tensors")
    old = safetensors_torch.load_file(str(path / "model.safetensors"))
    new = safetensors_torch.load_file(str(out / "model.safetensors"))
    assert set(old) == set(new)
    for k, v in old.items():
        if k.endswith("weight_global_scale"):  # 1 / (1 / g): within one float32 ulp of g
            ulp = torch.nextafter(v, torch.full_like(v, math.inf)) - v
            assert (new[k] - v).abs() <= ulp, k
        else:
            assert torch.equal(new[k].view(torch.uint8) if v.dtype == torch.float8_e4m3fn
                               else new[k], v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn
                               else v), k
    again = from_config(cfg)  # tk_cute -> compressed-tensors -> tk_cute is bit-exact
    nvfp4.load_checkpoint(again, out)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_compressed_tensors_w4a4_checkpoint_carries_its_input_scales(tmp_path, seed):
    pytest.importorskip("compressed_tensors")
    cfg = tiny_llama()
    write_compressed_tensors(from_config(cfg), tmp_path / "ct", scheme="NVFP4", act_amax=3.0)
    sd = safetensors_torch.load_file(str(tmp_path / "ct" / "model.safetensors"))
    model = from_config(cfg)
    report = nvfp4.load_checkpoint(model, tmp_path / "ct", activations="nvfp4")
    assert report.input_scales == report.quantized and len(report.quantized) == 14
    for name, layer in nvfp4_linears(model).items():
        assert layer.activations == "nvfp4"
        enc = sd[f"{name}.input_global_scale"]
        assert torch.equal(layer.input_global_scale, (1 / enc).reshape(()))
        # W4A4 computes the activations' global scale per call (the static one is carried)
        x = torch.randn(3, layer.in_features, dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(layer(x), gemm_reference(quantize(x), layer.weight, x.dtype))
    nvfp4.save_checkpoint(model, tmp_path / "out", "compressed-tensors")
    qcfg = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert qcfg["config_groups"]["group_0"]["input_activations"]["dynamic"] == "local"
    new = safetensors_torch.load_file(str(tmp_path / "out" / "model.safetensors"))
    for k in sd:
        if k.endswith("input_global_scale"):
            ulp = torch.nextafter(sd[k], torch.full_like(sd[k], math.inf)) - sd[k]
            assert (new[k] - sd[k]).abs() <= ulp, k
    # a plain state dict with input scales loads into a model quantize_ made (buffers appear)
    fresh = nvfp4.quantize_(from_config(cfg), lambda m, n: isinstance(m, nn.Linear)
                            and n != "lm_head", activations="nvfp4")
    fresh.load_state_dict(model.state_dict())
    assert all(m.input_global_scale is not None for m in nvfp4_linears(fresh).values())


# ---------------------------------------------------------------- ModelOpt (transcribed)


def modelopt_quantize(w: torch.Tensor):
    """ModelOpt's NVFP4QTensor.quantize (nvfp4_tensor.py), transcribed: (weight uint8 (N, K/2),
    weight_scale float8_e4m3fn (N, K/16), weight_scale_2 float32 0-dim)."""
    w = w.float()
    scale_2 = w.abs().amax() / (6.0 * 448.0)  # get_weights_scaling_factor_2
    blk = w.unflatten(-1, (-1, 16)).abs().amax(-1)
    sf = blk / (6.0 * scale_2)  # get_weights_scaling_factor
    sf[sf == 0] = 1.0
    sf = sf.clamp(min=2**-9).to(torch.float8_e4m3fn)
    scaled = (w.unflatten(-1, (-1, 16)) / (sf.float() * scale_2).unsqueeze(-1)).flatten(-2)
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5])  # _cast_fp4
    sign = (scaled < 0).to(torch.uint8)
    a = scaled.abs()
    ordinal = torch.searchsorted(bounds, a, out_int32=True).to(torch.uint8)
    odd = torch.any(a.unsqueeze(-1) == bounds[[1, 3, 5]], dim=-1).to(torch.uint8)
    q = (sign << 3) + ordinal + odd
    return (q[..., 1::2] << 4) | q[..., 0::2], sf, scale_2


def modelopt_dequantize(weight, weight_scale, weight_scale_2) -> torch.Tensor:
    """ModelOpt's NVFP4QTensor.dequantize (float32), transcribed."""
    unpacked = torch.empty(*weight.shape[:-1], 2 * weight.shape[-1], dtype=torch.long)
    unpacked[..., 1::2], unpacked[..., 0::2] = weight >> 4, weight & 0x0F
    per_block_scale = weight_scale.to(torch.float32) * weight_scale_2
    deq = E2M1[unpacked].unflatten(-1, (-1, 16)) * per_block_scale.unsqueeze(-1)
    return deq.flatten(-2)


def write_modelopt(model, path, w4a4: bool):
    """A ModelOpt-format checkpoint of `model` (every Linear but lm_head), written from the
    transcription; returns its state dict and a dense model holding its dequantized weights."""
    dense = from_config(model.config)
    dense.load_state_dict(model.state_dict())
    sd = dict(model.state_dict())
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or name == "lm_head":
            continue
        weight, sf, s2 = modelopt_quantize(sd.pop(f"{name}.weight"))
        sd.update({f"{name}.weight": weight, f"{name}.weight_scale": sf,
                   f"{name}.weight_scale_2": s2})
        if w4a4:
            sd[f"{name}.input_scale"] = torch.tensor(2.5 * (1 + torch.rand(()).item()) / 2688)
        with torch.no_grad():
            dense.get_submodule(name).weight.copy_(modelopt_dequantize(weight, sf, s2))
    path.mkdir()
    safetensors_torch.save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    algo = "NVFP4" if w4a4 else "W4A16_NVFP4"
    (path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.x"},
        "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": 16,
                         "exclude_modules": ["lm_head"]}}))
    return sd, dense


@pytest.mark.parametrize("w4a4", [False, True])
def test_modelopt_checkpoint_matches_its_documented_format(tmp_path, seed, w4a4):
    cfg = tiny_llama()
    sd, dense = write_modelopt(from_config(cfg), tmp_path / "mo", w4a4)
    model = from_config(cfg)
    report = nvfp4.load_checkpoint(model, tmp_path / "mo")
    assert report.format == "modelopt" and len(report.quantized) == 14
    assert report.input_scales == (report.quantized if w4a4 else [])
    for name, layer in nvfp4_linears(model).items():
        assert torch.equal(layer.weight_data, sd[f"{name}.weight"])  # codes, as stored
        assert torch.equal(layer.weight.scales_logical(),
                           sd[f"{name}.weight_scale"].view(torch.uint8))  # row order
        assert torch.equal(layer.weight_global_scale, sd[f"{name}.weight_scale_2"])  # DECODE
        if w4a4:
            assert torch.equal(layer.input_global_scale, sd[f"{name}.input_scale"])
        # ModelOpt's float32 dequantize: fl(e2m1 * fl(sf * scale_2)), two roundings
        deq = modelopt_dequantize(sd[f"{name}.weight"], sd[f"{name}.weight_scale"],
                                  sd[f"{name}.weight_scale_2"])
        assert_weights_close(deq, layer, 2 * U32 * (1 + U32), f"modelopt {name}")
    # its dequantized model in bf16 (the forward a dequantizing runtime runs) against tk_cute's
    assert_models_agree(model, dense, 2.0**-8 + 3 * U32, "modelopt")
    # saving back is bit-exact (same names, dtypes, bytes); a plain load_state_dict works too
    nvfp4.save_checkpoint(model, tmp_path / "back", "modelopt")
    back = safetensors_torch.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(back) == set(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k].view(torch.uint8) if v.dtype == torch.float8_e4m3fn
                           else back[k], v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn
                           else v), k
    hf_quant = json.loads((tmp_path / "back" / "hf_quant_config.json").read_text())
    assert hf_quant["quantization"]["quant_algo"] == ("NVFP4" if w4a4 else "W4A16_NVFP4")
    assert hf_quant["quantization"]["exclude_modules"] == ["lm_head"]


def test_modelopt_to_compressed_tensors_through_tk_cute(tmp_path, seed):
    pytest.importorskip("compressed_tensors")
    cfg = tiny_llama()
    write_modelopt(from_config(cfg), tmp_path / "mo", w4a4=False)
    model = from_config(cfg)
    nvfp4.load_checkpoint(model, tmp_path / "mo")
    nvfp4.save_checkpoint(model, tmp_path / "ct", "compressed-tensors")
    assert_models_agree(model, library_model(tmp_path / "ct"), CT_WEIGHT_REL,
                        "modelopt -> tk_cute -> compressed-tensors")


# ---------------------------------------------------------------- validation


def _bad_states():
    """The seven crafted state dicts of issue 47 (name, part, bad value)."""
    return [("NaN scale byte", "weight_scales", 0x7F), ("negative scale byte", "weight_scales",
                                                         0x85),
            ("NaN global", "weight_global_scale", math.nan),
            ("zero global", "weight_global_scale", 0.0),
            ("negative global", "weight_global_scale", -0.5),
            ("inf global", "weight_global_scale", math.inf),
            ("NaN scale byte in padding", "weight_scales", "pad")]


@pytest.mark.parametrize("case", _bad_states(), ids=lambda c: c[0])
def test_load_state_dict_rejects_bad_values_unless_trusted(case, seed):
    _, part, value = case
    layer = Linear.from_linear(nn.Linear(32, 40).to(torch.bfloat16))  # rows 40..127: padding
    sd = {k: v.clone() for k, v in layer.state_dict().items()}
    if value == "pad":
        sd[part].view(-1)[-1] = 0xFF
    elif part == "weight_scales":
        sd[part][0, 0, 5] = value
    else:
        sd[part].fill_(value)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.raises(RuntimeError, match="NVFP4 Linear"):
        layer.load_state_dict(sd)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())  # unchanged
    trusting = Linear(32, 40, bias=True, trusted=True)
    trusting.load_state_dict(sd)  # the documented opt-out
    with pytest.raises(ValueError, match="NVFP4 Linear"):
        trusting.validate()


def test_load_state_dict_rejects_wrong_dtypes(seed):
    layer = Linear.from_linear(nn.Linear(32, 16).to(torch.bfloat16))
    sd = layer.state_dict()
    with pytest.raises(RuntimeError, match="weight_scales: NVFP4 Linear needs a torch.uint8"):
        layer.load_state_dict(dict(sd, weight_scales=sd["weight_scales"].view(torch.float8_e4m3fn)))
    with pytest.raises(RuntimeError, match="weight_global_scale: NVFP4 Linear needs a "
                                           "torch.float32"):
        layer.load_state_dict(dict(sd, weight_global_scale=sd["weight_global_scale"].double()))


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
@pytest.mark.parametrize("bad", ["nan", "zero", "negative", "inf", "nan_byte", "sign_byte"])
def test_load_checkpoint_rejects_bad_values_unless_trusted(fmt, bad, seed):
    q = quantize(torch.randn(16, 64))
    conv = nvfp4.to_modelopt(q) if fmt == "modelopt" else nvfp4.to_compressed_tensors(q)
    gs_key = "weight_scale_2" if fmt == "modelopt" else "weight_global_scale"
    value = {"nan": math.nan, "zero": 0.0, "negative": -1.0, "inf": math.inf}.get(bad)
    if value is not None:
        conv[gs_key] = torch.full_like(conv[gs_key], value)
    else:
        conv["weight_scale"].view(torch.uint8)[3, 1] = 0x7F if bad == "nan_byte" else 0x90
    model = nn.Sequential(nn.Linear(64, 16, bias=False).to(torch.bfloat16))
    sd = {f"0.{k}": v for k, v in conv.items()}
    with pytest.raises(ValueError, match="^0: "):
        nvfp4.load_checkpoint(model, sd)
    assert isinstance(model[0], nn.Linear)  # nothing swapped
    nvfp4.load_checkpoint(model, sd, trusted=True)
    assert isinstance(model[0], Linear)


def test_load_checkpoint_checks_shapes_and_keys(seed):
    q = quantize(torch.randn(16, 64))
    sd = {f"0.{k}": v for k, v in nvfp4.to_modelopt(q).items()}
    with pytest.raises(ValueError, match="the model has Linear"):
        nvfp4.load_checkpoint(nn.Sequential(nn.Linear(32, 16)), sd)
    with pytest.raises(ValueError, match="bias"):
        nvfp4.load_checkpoint(nn.Sequential(nn.Linear(64, 16)), sd)
    model = nn.Sequential(nn.Linear(64, 16, bias=False), nn.LayerNorm(16))
    with pytest.raises(RuntimeError, match=r"missing keys \['1.weight', '1.bias'\]"):
        nvfp4.load_checkpoint(model, sd)
    report = nvfp4.load_checkpoint(nn.Sequential(nn.Linear(64, 16, bias=False),
                                                 nn.LayerNorm(16)), sd, strict=False)
    assert report.missing == ["1.weight", "1.bias"] and report.quantized == ["0"]
    with pytest.raises(ValueError, match="both ModelOpt"):
        nvfp4.load_checkpoint(model, dict(sd, **{"2.weight_packed": q.data}))
    w = nvfp4.from_modelopt(*nvfp4.to_modelopt(q).values())
    assert isinstance(w, NVFP4Tensor) and torch.equal(w.dequantize(), q.dequantize())
    c = nvfp4.from_compressed_tensors(*nvfp4.to_compressed_tensors(q).values())
    assert torch.equal(c.data, q.data) and torch.equal(c.scales, q.scales)
