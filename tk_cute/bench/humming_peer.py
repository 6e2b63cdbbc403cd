"""humming (the vLLM project's JIT-compiled quantized GEMM library, `pip install
humming-kernels`) as the NVFP4 peer of the Hopper benchmarks (`bench nvfp4 --humming`).

On Hopper humming runs NVFP4 weights with bf16 activations only (its FP4 activations need
sm_120, and its fp8 activations need weight-scale groups of 32 or more, not NVFP4's 16), so the
peer sits beside tk_cute's W4A16. Its weights come from the tk_cute tensor through the ModelOpt
tensors humming loads (`checkpoint.to_modelopt`: codes, row-order E4M3 block scales, the fp32
decode scale); humming repacks them for its wgmma kernels once per layer (`transform`). Its kernel
is the one its own heuristic picks for the call's M (`humming.tune.get_heuristics_config`), so
each shape compiles one kernel (JIT: nvcc or NVRTC on the GPU machine) at the untimed first call.

humming splits K (stream-K) and adds the parts in bf16, so its results are checked norm-wise
(`check`), not against tk_cute's per-element bound.
"""

from __future__ import annotations

import importlib

import torch

# humming's K-split partial sums are added in bf16 (2^-8 relative each): a Frobenius-relative
# error above this is a wrong result, not rounding
REL_ERR_MAX = 2e-2


def unavailable() -> str | None:
    """None where humming imports on this machine, else why not (for the bench's header)."""
    try:
        for module in ("humming.layer", "humming.tune"):
            importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer
        return f"{type(e).__name__}: {e}"
    return None


class HummingNVFP4:
    """humming's NVFP4 weight-only GEMM on tk_cute weights `b` (NVFP4Tensor, 2-D, UE4M3, CUDA)
    for calls of M activation rows: ``HummingNVFP4(b, M)(x)`` = x @ deq(b)^T in bf16."""

    def __init__(self, b, M: int):
        from humming.layer import HummingLayer
        from humming.tune import get_heuristics_config

        from tk_cute.nvfp4.checkpoint import to_modelopt

        layer = HummingLayer(shape_n=b.M, shape_k=b.K, torch_dtype=torch.bfloat16,
                             weight_config={"quant_method": "modelopt", "quant_algo": "nvfp4"})
        layer = layer.to(b.device)
        tensors = to_modelopt(b)
        tensors["weight_scale_2"] = tensors["weight_scale_2"].reshape(1)
        layer.load_from_tensors(tensors)
        layer.transform()
        self.layer = layer
        self.tuning = get_heuristics_config(layer.humming_config, shape_m=M, device=b.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, tuning_config=self.tuning)


def check(out: torch.Tensor, a: torch.Tensor, b) -> None:
    """Raise AssertionError unless humming's `out` is a @ deq(b)^T within REL_ERR_MAX
    (Frobenius-relative, float64 reference)."""
    ref = a.double() @ b.dequantize(torch.float64).t()
    err = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
    if not err <= REL_ERR_MAX:  # NaN fails too
        raise AssertionError(f"humming NVFP4: relative error {err:.3g} > {REL_ERR_MAX}")
