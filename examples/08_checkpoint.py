# %% [markdown]
# # 08 - NVFP4 checkpoints as published
#
# You will learn:
# - how the two NVFP4 formats on the Hugging Face Hub store a quantized layer: compressed-tensors'
#   `nvfp4-pack-quantized` (`weight_packed`, `weight_scale`, `weight_global_scale`) and ModelOpt's
#   (`weight`, `weight_scale`, `weight_scale_2`), and which per-tensor scale is an ENCODE scale
#   and which a DECODE scale;
# - how `tk_cute.nvfp4.load_checkpoint` loads such a checkpoint into `nvfp4.Linear` layers of a
#   `transformers` model built from its config, checking every weight once;
# - that tk_cute's model computes what the library's own dequantized model computes (each layer
#   within the bound of both GEMMs' arithmetic), and generates tokens;
# - how `tk_cute.nvfp4.save_checkpoint` writes both formats back.
# Runs on a CPU in seconds (a tiny random Llama, the exact reference GEMMs); on a GPU the same
# code runs the kernels (a larger random Llama, sized for them). Nothing is downloaded: the
# checkpoint is written here by compressed-tensors itself.

# %%
import json
import tempfile
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, CompressedTensorsConfig, LlamaConfig

from tk_cute import nvfp4
from tk_cute.compare import Table

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# CPU: tiny; GPU: every NVFP4 layer's N a multiple of 128 and K of 256, as the kernels take
SIZE = ({"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 8} if GPU
        else {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4})
CONFIG = LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, vocab_size=256,
                     max_position_embeddings=128, tie_word_embeddings=False, **SIZE)
WORK = Path(tempfile.mkdtemp(prefix="tk_cute_checkpoint_"))
torch.manual_seed(0)

# %% [markdown]
# A random bf16 Llama, quantized and saved by compressed-tensors the way llm-compressor does it:
# its `NVFP4A16` scheme on every `Linear` but `lm_head`, its own helpers for the per-tensor
# scale (`generate_gparam`: `448 * 6 / amax`) and the block scales, its compressor, its config.

# %%
def write_compressed_tensors(path):
    model = AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16)
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_global_scale"):
            w = module.weight.detach()
            gs = generate_gparam(w.amin(), w.amax())
            blocks = w.float().unflatten(-1, (-1, 16))
            scale, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1),
                                         module.quantization_scheme.weights, global_scale=gs)
            module.weight_global_scale.data.copy_(gs)
            module.weight_scale.data = scale.to(module.weight_scale.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, "nvfp4-pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)


CT_DIR = WORK / "compressed-tensors"
write_compressed_tensors(CT_DIR)
files = load_file(str(CT_DIR / "model.safetensors"))
Table(["tensor", "dtype", "shape"],
      [[k, str(v.dtype).removeprefix("torch."), tuple(v.shape)] for k, v in files.items()
       if k.startswith("model.layers.0.self_attn.q_proj.")])

# %% [markdown]
# One layer's tensors: codes two per byte (element 2i in the low nibble, as tk_cute stores
# them), float8 e4m3 block scales in row order (tk_cute keeps the 128x4 blocked layout the
# kernels read: loading reorders them), and a float32 per-tensor scale. Which direction that
# scale goes differs between the formats (docs/torch.md#checkpoints has the sources):
#
# | format | per-tensor scale | meaning | tk_cute's decode scale |
# |---|---|---|---|
# | compressed-tensors | `weight_global_scale` (1,) | ENCODE `448 * 6 / amax` (its dequantize divides by it) | `fl32(1 / g)` |
# | ModelOpt | `weight_scale_2` () | DECODE `amax / (448 * 6)` (its dequantize multiplies) | the same value |
#
# Loading: build the model from the checkpoint's config, then `load_checkpoint` swaps each
# quantized `nn.Linear` for an `nvfp4.Linear` (W4A16 here) and loads the rest.

# %%
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(CT_DIR),
                                         dtype=torch.bfloat16).eval()
report = nvfp4.load_checkpoint(model, CT_DIR)
model.to(DEVICE)
print(report.format, len(report.quantized), "NVFP4 layers; kept dense:",
      [n for n, m in model.named_modules() if type(m) is torch.nn.Linear])
print(model.model.layers[0].mlp)

# %% [markdown]
# The library's own answer: transformers loads the same files through compressed-tensors,
# dequantized to bf16 weights (`run_compressed=False`), a plain model. tk_cute's layers multiply
# the NVFP4 weights themselves. The logits agree up to bf16 roundings (the library rounds its
# dequantized weights to bf16; tk_cute never materialises them), and every layer, given the
# library's own input, agrees element by element within the bound of both GEMMs
# (tests/tk_cute/nvfp4/test_checkpoint.py).

# %%
library = AutoModelForCausalLM.from_pretrained(
    CT_DIR, dtype=torch.bfloat16,
    quantization_config=CompressedTensorsConfig(run_compressed=False)).eval().to(DEVICE)
tokens = torch.randint(0, CONFIG.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
tokens = tokens.to(DEVICE)


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


with torch.inference_mode():
    logits, lib_logits = model(tokens).logits, library(tokens).logits
    down = model.model.layers[0].mlp.down_proj
    w_err = rel_err(down.weight.dequantize(torch.float32),
                    library.model.layers[0].mlp.down_proj.weight)
Table(["comparison", "relative error"],
      [["logits, tk_cute vs compressed-tensors' dequantized model",
        f"{rel_err(logits, lib_logits):.2e}"],
       ["layer 0 down_proj weights (library's bf16 vs exact)", f"{w_err:.2e}"]])

# %% [markdown]
# Generating a few tokens greedily works as with any transformers model (the weights are random,
# so the tokens are too; where two logits nearly tie, bf16 roundings can pick either).

# %%
with torch.inference_mode():
    greedy = {"attention_mask": torch.ones_like(tokens), "max_new_tokens": 8,
              "do_sample": False, "pad_token_id": 0}
    ours = model.generate(tokens, **greedy)
    theirs = library.generate(tokens, **greedy)
Table(["model", "generated tokens"],
      [["tk_cute NVFP4", ours[0, tokens.shape[1]:].tolist()],
       ["compressed-tensors (dequantized)", theirs[0, tokens.shape[1]:].tolist()]])

# %% [markdown]
# Saving back: to compressed-tensors (the library loads it, to the same values), and to
# ModelOpt's format (`weight_scale_2` is our decode scale, bit for bit; a ModelOpt checkpoint
# saves back byte-identical). The encode scale is `fl32(1 / d)`: a float32 reciprocal does not
# always round-trip, so a compressed-tensors checkpoint can come back with some global scales
# one ulp off (a relative 2^-23 in their tensors' values).

# %%
nvfp4.save_checkpoint(model, WORK / "saved-ct", "compressed-tensors")
nvfp4.save_checkpoint(model, WORK / "saved-modelopt", "modelopt")
print(json.dumps(json.loads((WORK / "saved-modelopt" / "hf_quant_config.json").read_text()),
                 indent=1))
reloaded = AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16).eval()
nvfp4.load_checkpoint(reloaded, WORK / "saved-modelopt")
again = AutoModelForCausalLM.from_pretrained(
    WORK / "saved-ct", dtype=torch.bfloat16,
    quantization_config=CompressedTensorsConfig(run_compressed=False)).eval().to(DEVICE)
with torch.inference_mode():
    same = torch.equal(reloaded.to(DEVICE)(tokens).logits, logits)
    lib_again = rel_err(again(tokens).logits, lib_logits)
Table(["round trip", "result"],
      [["tk_cute -> ModelOpt -> tk_cute", "bitwise equal logits" if same else "DIFFERENT"],
       ["tk_cute -> compressed-tensors -> library, logits vs the original",
        f"{lib_again:.2e}"]])

# %% [markdown]
# Every NVFP4 weight is checked once as it is loaded: a checkpoint whose scales decode to NaN,
# or whose global scale is zero, negative, infinite or NaN, is refused with the layer's name
# (`trusted=True` skips the check; writes into a loaded model's buffers are not re-checked:
# `nvfp4.Linear.validate()` does that).

# %%
bad = dict(files)
bad["model.layers.1.mlp.up_proj.weight_global_scale"] = torch.tensor([float("nan")])
try:
    nvfp4.load_checkpoint(AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16), bad)
except ValueError as e:
    print("a NaN global scale in the checkpoint is refused, as it must be:", e)

# %%
def test_tk_cute_matches_the_library():
    assert report.format == "compressed-tensors" and len(report.quantized) == 14
    assert rel_err(logits, lib_logits) < 2.0**-5
    assert w_err < 2.0**-7  # bf16 roundings of the library's dequantized weights
    assert ours.shape == theirs.shape == (1, tokens.shape[1] + 8)


def test_round_trips():
    assert same and lib_again < 2.0**-5


def test_bad_checkpoints_are_refused():
    import pytest

    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj: weight_global_scale"):
        nvfp4.load_checkpoint(AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16),
                              bad)
