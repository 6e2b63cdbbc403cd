# %% [markdown]
# # 05 - NVFP4 inside a torch model
#
# You will learn:
# - how `tk_cute.nvfp4.quantize_` swaps a model's `nn.Linear` layers for NVFP4 `Linear`s:
#   W4A16 (bf16 activations) or W4A4 (activations quantized to NVFP4 on every call);
# - how far the quantized model's output is from the bf16 model's, and that each layer equals
#   its exact reference;
# - that `torch.compile(fullgraph=True)` traces the model in one graph (`torch._dynamo.explain`:
#   0 graph breaks), through the custom ops `torch.ops.tk_cute.nvfp4_quantize / nvfp4_gemm`;
# - that its `state_dict` is plain tensors that reload bitwise;
# - on a GPU: tokens/s eager, compiled and replayed as a CUDA graph (the forward never syncs
#   the host, so it captures as is).
# Runs on a CPU (small sizes, under a minute) and on a GPU (Llama-3-8B-sized MLP).

# %%
import copy
import io
import time

import pytest
import torch

from tk_cute import nvfp4, viz
from tk_cute.bench.model import MLP
from tk_cute.compare import Table

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
HIDDEN, INTERMEDIATE = (4096, 14336) if GPU else (256, 512)

# %% [markdown]
# A transformer MLP block (Llama's: gate and up projections, SiLU, down projection:
# `tk_cute.bench.model.MLP`, the block `python -m tk_cute.bench model` times), with random
# Gaussian bf16 weights: nothing is downloaded.

# %%
def bf16_model(seed=0):
    return MLP.random(HIDDEN, INTERMEDIATE, DEVICE, seed=seed)  # nn.Linear layers, no grad


def rel_err(y, ref):
    return float((y.float() - ref.float()).norm() / ref.float().norm())


# %% [markdown]
# `quantize_` swaps every `nn.Linear` in place (torchao's convention; `filter_fn(module, fqn)`
# picks a subset). The weights become three buffers per layer: packed E2M1 codes, UE4M3 block
# scales in the 128x4 layout, a float32 decode scale.

# %%
reference = bf16_model()
w4a16 = nvfp4.quantize_(copy.deepcopy(reference), activations="bf16")
w4a4 = nvfp4.quantize_(copy.deepcopy(reference), activations="nvfp4")
print(w4a16)
x = torch.randn(2, 8, HIDDEN, generator=torch.Generator().manual_seed(1)).to(
    DEVICE, torch.bfloat16)  # (batch, tokens, hidden)
with torch.inference_mode():
    ref_y = reference(x)
    errors = Table(["model", "relative error vs bf16"],
                   [[name, f"{rel_err(model(x), ref_y):.3f}"]
                    for name, model in (("W4A16", w4a16), ("W4A4", w4a4))])
errors

# %% [markdown]
# The error is the format's: on random Gaussian data one NVFP4 quantization errs by about
# 9.5% (relative, Frobenius), and the block compounds two (W4A16: gate/up, then down: about
# 0.16-0.18) or four (W4A4 adds the activations: about 0.24). Each layer itself is exact: it
# equals the exact reference of `tk_cute.nvfp4.reference` on CPU, and on a GPU it is within
# `tk_cute.testing.assert_gemm_close`'s element-wise bound (tests/tk_cute/nvfp4/test_modules.py).

# %%
def test_quantized_model_is_close_to_bf16_and_each_layer_exact():
    from tk_cute.testing import assert_gemm_close

    with torch.inference_mode():
        ref_y = reference(x)
        for model, bound in ((w4a16, 0.25), (w4a4, 0.35)):
            assert rel_err(model(x), ref_y) < bound
            layer = model.gate
            a = x.reshape(-1, HIDDEN)
            a = nvfp4.quantize(a) if layer.activations == "nvfp4" else a
            assert_gemm_close(layer(x).reshape(-1, INTERMEDIATE), a, layer.weight, "gate")


# %% [markdown]
# Which kernel runs a layer on a Hopper GPU depends on the tokens per call (M) and the layer's
# N and K: the dispatch's map at the gate / up projections' K (`viz.paths_plot`, drawn from
# `tk_cute.tuning.sm90`' own rules; `nvfp4.plan(a, layer.weight)` names one call's path).
# Decode batches run the weight-streaming kernels (small_m, register_a), from 129 rows the
# tiled register-A kernel (up to 208 rows one tile as wide as M, its K split between CTAs).

# %%
viz.paths_plot(HIDDEN)

# %% [markdown]
# `torch.compile(fullgraph=True)`: the NVFP4 layers are custom ops with fake implementations,
# so dynamo traces the whole block as one graph. Inductor fuses `silu(gate) * up` in float32
# (one rounding instead of eager's two); `emulate_precision_casts` makes it round like eager,
# which gives bitwise the eager output on a CPU.

# %%
def check_compiles_in_one_graph():
    """The assertions of the test below; returns dynamo's explanation (for the printout)."""
    import torch._inductor.config as inductor_config

    with torch.inference_mode():
        for model in (w4a16, w4a4):
            explanation = torch._dynamo.explain(model)(x)
            assert explanation.graph_break_count == 0 and explanation.graph_count == 1
            torch._dynamo.reset()
            with inductor_config.patch(emulate_precision_casts=True):
                y = torch.compile(model, fullgraph=True)(x)
            if not GPU:
                assert torch.equal(y, model(x))
            elif model is w4a16:  # inductor's SiLU is its own on a GPU: bf16 rounding apart
                assert rel_err(y, model(x)) < 2.0**-6
            else:  # W4A4: those ulps can flip the next layer's activation codes (steps of 1/8
                # to 1/3 of a value): the format's own bound against the bf16 model
                assert rel_err(y, reference(x)) < 0.35
    return explanation


def test_compiles_in_one_graph():
    check_compiles_in_one_graph()


# %% [markdown]
# Saving: the state dict holds plain tensors (`torch.load(weights_only=True)` reads it). Load
# it into a freshly quantized model of the same architecture (or one built of empty
# `nvfp4.Linear(in, out)` modules) and the outputs are bitwise the same.

# %%
def check_state_dict_reloads_bitwise():
    """The assertions of the test below; returns the saved state dict's bytes."""
    buf = io.BytesIO()
    torch.save(w4a4.state_dict(), buf)
    buf.seek(0)
    fresh = nvfp4.quantize_(bf16_model(seed=1), activations="nvfp4")  # other weights
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    with torch.inference_mode():
        assert torch.equal(fresh(x), w4a4(x))
    return buf.getbuffer().nbytes


def test_state_dict_reloads_bitwise():
    check_state_dict_reloads_bitwise()


# %% [markdown]
# On a GPU: the block captures as a CUDA graph as is (its forward never syncs the host), and
# the replay writes the same bits as the eager forward; the compiled forward stays within the
# bounds above. Decode (1 token) and prefill (512 tokens) sizes.

# %%
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 512])
def test_gpu_graph_replay_and_compiled_forward(tokens):
    with torch.inference_mode():
        xt = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        for name, model in (("bf16", reference), ("W4A16", w4a16), ("W4A4", w4a4)):
            eager = model(xt)  # also the warm-up: the kernels compile on their first call
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_y = model(xt)
            static_y.fill_(float("nan"))  # poisoned: the replay must write it all
            g.replay()
            assert torch.equal(static_y, eager)  # same kernels, same bits
            if name != "bf16":
                torch._dynamo.reset()
                y = torch.compile(model, fullgraph=True)(xt)
                if name == "W4A16":
                    assert rel_err(y, eager) < 2.0**-6  # (as above)
                else:
                    assert rel_err(y, reference(xt)) < 0.35


# %% [markdown]
# On a GPU: tokens per second of the block, eager (a Python forward per call), compiled, and
# as a CUDA graph replay (no host work per call), timed by `tk_cute.bench.harness.bench`
# (variants interleaved, medians over rounds; `graph=True` captures the eager forward).
# Measured numbers belong in docs/performance.md with the GPU, date, command and commit
# (`python -m tk_cute.bench model` times the same block against cuBLAS bf16 and fp8).

# %%
def tokens_per_second(tokens, rounds=20):
    """{variant: tokens/s} of the three models at `tokens` rows (GPU only)."""
    from tk_cute.bench import harness

    models = {"bf16": reference, "W4A16": w4a16, "W4A4": w4a4}
    with torch.inference_mode():
        # Cold L2 as in `tk_cute.bench.model`: each call reads the weights (3 H I elements,
        # 0.5625 bytes each as NVFP4), which evicts the L2; sets sized by them rotate x
        sets = harness.input_sets(
            lambda: torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16),
            int(3 * HIDDEN * INTERMEDIATE * 0.5625))
        torch._dynamo.reset()
        eager = {f"{n} eager": m for n, m in models.items()}  # variant(inputs): m(x)
        compiled = {f"{n} compiled": torch.compile(m, fullgraph=True)
                    for n, m in models.items() if n != "bf16"}
        res = harness.bench({**eager, **compiled}, sets, rounds=rounds)
        graphs = harness.bench(eager, sets, rounds=rounds, graph=True)
        res.update({n.replace(" eager", " CUDA graph"): r for n, r in graphs.items()})
    order = [f"{n} {how}" for n in models for how in ("eager", "CUDA graph", "compiled")]
    return {n: tokens / (res[n].ms * 1e-3) for n in order if n in res}


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    test_quantized_model_is_close_to_bf16_and_each_layer_exact()
    print(errors)
    t0 = time.perf_counter()
    e = check_compiles_in_one_graph()
    print(f"torch.compile(fullgraph=True): {e.graph_count} graph, {e.graph_break_count} graph "
          f"breaks ({time.perf_counter() - t0:.1f} s with compiling)")
    print(f"state dict: {check_state_dict_reloads_bitwise()} bytes, reloaded bitwise")
    if GPU:
        for n in (1, 512):
            test_gpu_graph_replay_and_compiled_forward(n)
            for name, rate in tokens_per_second(n).items():
                print(f"{n:4d} tokens, {name:<18} {rate:12,.0f} tokens/s")
    else:
        print("GPU cell skipped: no CUDA device (the tokens/s of eager, compiled and CUDA-graph "
              "forwards need one)")
