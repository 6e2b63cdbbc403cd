"""A transformer MLP block in torch: tk_cute NVFP4 beside bf16 and fp8, same process, cold L2.

    python -m tk_cute.bench model [--m 1 16 256 2048] [--hidden 8192] [--intermediate 28672]
                                  [--activations bf16 nvfp4] [--no-compile] [--rounds 20]
                                  [--json FILE] [--host-only]

The block is ``down(silu(gate(x)) * up(x))`` (Llama's MLP, no biases; hidden H, intermediate
I), one model per variant built from the same random bf16 weights:
- "bf16": ``nn.Linear`` in bfloat16 (cuBLAS), the baseline;
- "fp8 _scaled_mm": torch's fp8 path, e4m3 weights with a per-tensor scale and activations
  quantized per call with a per-tensor scale (amax, divide, cast), ``torch._scaled_mm``
  (cuBLASLt) with bf16 output; rows padded to a multiple of 16 for cuBLASLt;
- "tk_cute w4a16" / "tk_cute w4a4": `tk_cute.nvfp4.quantize_` of the bf16 model (the two share
  the weight buffers; W4A4 quantizes its activations per call).
Each runs "eager" (a Python forward per call: host time included) and "CUDA graph" (the harness
captures the eager forwards, `harness.bench(graph=True)`: GPU time alone); the tk_cute models and
bf16 (torch's own compile cost, the yardstick) also run "compiled default"
(``torch.compile(fullgraph=True)``: eager launches of the compiled graph) and "compiled
reduce-overhead" (the same in torch's CUDA graph trees), one compiled model per variant for
every M in one process (a graph, and a graph tree, per M). The per-call host costs at 1x256x256
(`host_costs`, `--host-only`: interleaved rounds, ratios to torch's own call per round) follow.
"vs base" is against "bf16 eager" for the eager and compiled rows and against "bf16 CUDA graph"
for the graph rows; notes give tokens/s (M rows per call) and the output's relative error
against the bf16 model's (Frobenius norms). GB/s
counts each variant's weight bytes (2, 1 and 0.5625 B per element). Everything runs under
``torch.inference_mode()``.

Timing is `tk_cute.bench.harness` (interleaved variants, medians over rounds, CUDA events).
Cold L2: the weights (3 * H * I elements, 396 MB as NVFP4 at the default sizes) are many
times the L2 and read once per call, so the activation sets only rotate the inputs
(`input_sets` sized by the weight bytes: 2 sets).

This module imports on a CPU (no CUDA call at import): `build_models` and `variants` build the
models and the variant list anywhere (tests/tk_cute/test_bench_variants.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from tk_cute.bench.harness import (
    HEADER,
    bench,
    environment,
    host_overhead,
    host_overheads,
    input_sets,
    row,
)

DEFAULT_M = [1, 16, 256, 2048]
BASELINE, GRAPH_BASELINE = "bf16 eager", "bf16 CUDA graph"
WEIGHT_BYTES = {"bf16": 2.0, "fp8 _scaled_mm": 1.0, "tk_cute w4a16": 0.5625,
                "tk_cute w4a4": 0.5625}
FP8_MAX = 448.0
FP8_ROWS = 16  # cuBLASLt's fp8 GEMMs want M % 16 == 0


class MLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` over any three linear modules."""

    def __init__(self, gate: nn.Module, up: nn.Module, down: nn.Module):
        super().__init__()
        self.gate, self.up, self.down = gate, up, down

    @classmethod
    def random(cls, hidden: int, intermediate: int, device=None, seed: int = 0) -> MLP:
        """bf16 ``nn.Linear`` layers with weights ~ N(0, 1/fan_in) (unit-variance outputs)."""
        g = torch.Generator().manual_seed(seed)

        def lin(k, n):
            layer = nn.Linear(k, n, bias=False, device="meta")
            w = torch.randn(n, k, generator=g) / k**0.5
            layer.weight = nn.Parameter(w.to(device=device, dtype=torch.bfloat16),
                                        requires_grad=False)
            return layer

        return cls(lin(hidden, intermediate), lin(hidden, intermediate),
                   lin(intermediate, hidden))

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Fp8Linear(nn.Module):
    """torch's per-tensor fp8 linear: e4m3 weights (N, K) with a decode scale, activations
    quantized per call with their own per-tensor scale, ``torch._scaled_mm``, bf16 out."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax() / FP8_MAX).clamp(min=2.0**-126)
        self.register_buffer("weight", (w / scale).to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", scale.reshape(()))

    def forward(self, x):
        xf = x.float()
        scale = (xf.abs().amax() / FP8_MAX).clamp(min=2.0**-126)
        xq = (xf / scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, self.weight.t(), scale_a=scale, scale_b=self.weight_scale,
                                out_dtype=torch.bfloat16)


class Fp8MLP(MLP):
    """The block on `Fp8Linear` layers; rows padded to a multiple of FP8_ROWS on the way in
    (rows are independent) and cut on the way out."""

    def forward(self, x):
        M = x.shape[0]
        pad = -M % FP8_ROWS
        y = super().forward(F.pad(x, (0, 0, 0, pad)) if pad else x)
        return y[:M] if pad else y


def build_models(hidden: int, intermediate: int, device=None, seed: int = 0,
                 activations=("bf16", "nvfp4")) -> dict[str, nn.Module]:
    """The variant models of the module docstring, from one random bf16 model."""
    from tk_cute import nvfp4

    base = MLP.random(hidden, intermediate, device, seed)
    models = {"bf16": base, "fp8 _scaled_mm": Fp8MLP(*(Fp8Linear(l) for l in
                                                       (base.gate, base.up, base.down)))}
    w4a16 = nvfp4.quantize_(copy.deepcopy(base), activations="bf16")
    if "bf16" in activations:
        models["tk_cute w4a16"] = w4a16
    if "nvfp4" in activations:  # the same weight buffers, W4A4 forwards
        models["tk_cute w4a4"] = MLP(*(nvfp4.Linear.from_nvfp4(l.weight, activations="nvfp4")
                                       for l in (w4a16.gate, w4a16.up, w4a16.down)))
    return models


def variants(models: dict[str, nn.Module], compile: bool = True) -> dict:
    """{variant name: fn(inputs)} for the timed-eagerly group: every model "eager", the tk_cute
    ones and bf16 also "compiled" (bf16's compiled rows: what torch.compile costs torch's own
    model, the yardstick of the tk_cute ones; ``torch.compile`` is lazy: nothing compiles
    until a call). The CUDA-graph group is the eager entries renamed (`graph_variants`)."""
    v = {}
    for name, model in models.items():
        v[f"{name} eager"] = lambda s, m=model: m(s["x"])
        if compile and (name == "bf16" or name.startswith("tk_cute")):
            for mode in COMPILE_MODES:
                compiled = torch.compile(model, fullgraph=True, dynamic=False, mode=mode)
                v[f"{name} compiled {mode}"] = lambda s, m=compiled: m(s["x"])
    return v


COMPILE_MODES = ("default", "reduce-overhead")


def host_costs(M: int = 1, N: int = 256, K: int = 256) -> dict[str, list[float]]:
    """Host microseconds per eager call at a tiny shape (the GPU idles: what is measured is
    the Python and launch cost), torch's own calls first, in interleaved rounds
    (`harness.host_overheads`): {name: [us per round]}. `nvfp4.quantize` runs unchecked
    (`check_finite=False`) and checked (its one host sync, waiting for the GPU)."""
    from tk_cute import nvfp4

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    lin = nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    qw, qx = nvfp4.quantize(lin.weight.detach()), nvfp4.quantize(x)
    l16 = nvfp4.Linear.from_nvfp4(qw)
    l4 = nvfp4.Linear.from_nvfp4(qw, activations="nvfp4")
    fns = {"torch a @ w.t()": lambda: x @ w.t(), "torch nn.Linear": lambda: lin(x),
           "nvfp4.gemm w4a16": lambda: nvfp4.gemm(x, qw),
           "nvfp4.gemm w4a4": lambda: nvfp4.gemm(qx, qw),
           "nvfp4.Linear w4a16": lambda: l16(x), "nvfp4.Linear w4a4": lambda: l4(x),
           "nvfp4.quantize unchecked": lambda: nvfp4.quantize(x, check_finite=False),
           "nvfp4.quantize checked (syncs)": lambda: nvfp4.quantize(x)}
    with torch.inference_mode():
        return host_overheads(fns)


def print_host_costs(M: int = 1, N: int = 256, K: int = 256) -> list[dict]:
    """`host_costs` as lines: each call's median over the rounds and, for tk_cute's, the median
    of its per-round ratios to torch's call (`a @ w.t()` for gemm and quantize, `nn.Linear` for
    Linear), with their range."""
    costs = host_costs(M, N, K)
    rows = []
    print(f"host time per eager call at {M}x{N}x{K} (median of {len(costs['torch nn.Linear'])} "
          f"interleaved rounds of 200 calls), us:")
    for name, us in costs.items():
        base = costs["torch nn.Linear" if "Linear" in name else "torch a @ w.t()"]
        ratios = sorted(u / b for u, b in zip(us, base))
        ratio = None if name.startswith("torch") else statistics.median(ratios)
        note = "" if ratio is None else (f" ({ratio:.2f}x torch's; rounds "
                                         f"{ratios[0]:.2f}-{ratios[-1]:.2f}x)")
        print(f"  {name:<32} {statistics.median(us):7.1f}{note}")
        rows.append({"call": name, "M": M, "N": N, "K": K, "host_us": statistics.median(us),
                     "vs_torch": ratio})
    return rows


def graph_variants(v: dict) -> dict:
    """The eager variants, to be captured by `harness.bench(graph=True)`."""
    return {n.replace(" eager", " CUDA graph"): fn for n, fn in v.items() if n.endswith(" eager")}


def _parser():
    p = argparse.ArgumentParser(prog="python -m tk_cute.bench model",
                                description="A transformer MLP block: tk_cute NVFP4 vs bf16 / fp8.")
    p.add_argument("--m", type=int, nargs="+", default=DEFAULT_M, help="tokens (activation rows)")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--intermediate", type=int, default=28672)
    p.add_argument("--activations", nargs="+", default=["bf16", "nvfp4"],
                   choices=["bf16", "nvfp4"], help="tk_cute W4A16 (bf16) and/or W4A4 (nvfp4)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every result to this JSON file")
    p.add_argument("--host-only", action="store_true",
                   help="only the per-call host costs at 1x256x256 beside torch's")
    return p


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def _kind(name: str) -> str:
    return next(k for k in WEIGHT_BYTES if name.startswith(k))


@torch.inference_mode()
def main(argv=None):
    args = _parser().parse_args(argv)
    H, I = args.hidden, args.intermediate
    env = environment()
    print(env)
    if args.host_only:
        host = print_host_costs()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"environment": env, "host": host}, f, indent=1)
        return 0
    print(f"MLP block down(silu(gate(x)) * up(x)), hidden {H}, intermediate {I}; timing: "
          f"tk_cute/bench/harness.py (eager/compiled: host included; CUDA graph: GPU alone)")
    models = build_models(H, I, "cuda", args.seed, tuple(args.activations))
    flops_per_row, elements = 2 * 3 * H * I, 3 * H * I
    print(HEADER)
    results = []
    # One set of compiled models for every M, as a server runs them: each new M is one more
    # graph (dynamic=False), and reduce-overhead keeps every M's CUDA graph tree in one
    # process. Every compiled variant traces the same `MLP.forward` code object, whose
    # recompile limit counts all their graphs: raised to (compiled variants) x (M count).
    all_variants = variants(models, compile=not args.no_compile)
    compiled = sum(" compiled " in name for name in all_variants)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               compiled * len(args.m))
    for M in args.m:
        sets = input_sets(lambda M=M: {"x": torch.randn(M, H, device="cuda",
                                                        dtype=torch.bfloat16)},
                          int(elements * WEIGHT_BYTES["tk_cute w4a16"]))
        eager = dict(all_variants)
        ref = models["bf16"](sets[0]["x"])
        errs = {}
        for name in list(eager):
            try:
                errs[name] = _rel_err(eager[name](sets[0]), ref)  # also the first (compile) call
            except Exception as e:  # noqa: BLE001 - report and keep the others
                print(f"| {name:<28} | M={M} | failed: {type(e).__name__}: {e}")
                eager.pop(name)
        graphs = graph_variants(eager)
        for name in graphs:
            errs[name] = errs[name.replace(" CUDA graph", " eager")]
        timed = [(bench(eager, sets, rounds=args.rounds), BASELINE),
                 (bench(graphs, sets, rounds=args.rounds, graph=True), GRAPH_BASELINE)]
        shape = f"{M}x{H}x{I}"
        for res, base_name in timed:
            base = res.get(base_name)
            for name, r in res.items():
                tokens = M / (r.ms * 1e-3)
                note = f"{tokens:,.0f} tok/s; rel err {errs[name]:.4f}; spread {r.spread:.0%}"
                print(row(name, shape, r.ms, flops_per_row * M, elements * WEIGHT_BYTES[
                    _kind(name)], base.ms if base else None, note), flush=True)
                results.append({"variant": name, "M": M, "H": H, "I": I, "us": r.ms * 1e3,
                                "tokens_per_s": tokens, "rel_err": errs[name],
                                "spread": r.spread, "speedup": base.ms / r.ms if base else None})
        del sets
        torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"environment": env, "results": results}, f, indent=1)
    x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
    for name in ("tk_cute w4a16", "tk_cute w4a4", "bf16"):
        if name in models:
            us = host_overhead(lambda s, m=models[name]: m(s), x)
            print(f"host time per eager forward, M = 1, {name}: {us:.1f} us")
    host = print_host_costs()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": results, "host": host}, f, indent=1)
    return 0
