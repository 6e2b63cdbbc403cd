# SPDX-License-Identifier: MIT
"""How the NVFP4 quantizer launches (`kernels/nvfp4_quantize.py`, every target): a tensor of at
most `ONE_LAUNCH_MAX_BYTES` with the computed global scale runs the one-launch kernel (one
cluster: the amax through distributed shared memory, then the codes); anything else the amax
pass then the quantize pass (a given global scale: the quantize pass alone).

Why: an eager call pays the host ~4 us per launch (docs/facts.md#host-time), more than either
pass runs on a small tensor. The bound and `CTA_BYTES` are a model: a cluster CTA of 1024
threads keeps 64 KiB of loads in flight per amax step, so 8 CTAs read 512 KiB in one step's
latency and re-read it from L2 to quantize. Timed on the H100, the one launch is SLOWER on the
GPU at every size (`in_gemm_config`; docs/facts.md#quantizer-latency): it keeps only the host
launch it saves, which is what an eager call of a small tensor waits for; calls whose GPU time
counts (inside a W4A4 GEMM call) take the two launches. A GPU that cannot hold the cluster at
once (its SMs restricted: `runtime.resident_clusters`) takes the two launches.
`python -m tk_cute.bench quantize --shapes 1x256,16x8192 ...` times both ways side by side.
"""

from __future__ import annotations

from tk_cute.kernels import nvfp4_quantize as nq

ONE_LAUNCH_MAX_BYTES = 1 << 19  # x's bytes (all L batches)
CTA_BYTES = 1 << 16  # x's bytes per cluster CTA (one amax step of 1024 threads x 4 x 16 B)
# The one-launch kernel's CTA: 32 warps; two row segments in flight per warp keep it at 64
# registers (1024 threads).
ONE_LAUNCH = {"one_launch": True, "warps": 32, "rows_in_flight": 2}


def in_gemm_config() -> nq.Config:
    """The quantizer's Config inside a W4A4 GEMM call that quantizes its bf16 activations first
    (`launch.QuantizeA`): the two launches at every size, whose GPU time is what such a call
    adds once its GEMM keeps the GPU busy (a CUDA graph, a compiled model, an eager model at
    16 rows and up). H100 (2026-12-06, CUDA-graph replay, us, one launch / two launches, bf16
    M x K): 1x2048 4.8 / 4.2, 1x8192 7.6 / 4.7, 16x8192 8.3 / 5.4, 64x2880 10.4 / 8.9,
    16x28672 16.6 / 5.7, 1x28672 9.4 / 4.7 (docs/facts.md#quantizer-latency). A plain
    `quantize` call keeps `config`'s one launch for small inputs: one host launch fewer, and
    an eager call of a small tensor is host-bound."""
    return nq.Config()


def config(x_bytes: int, given: bool) -> nq.Config:
    """The default Config of a quantize call (dtype, scale mode and arch are the caller's)."""
    if given or x_bytes > ONE_LAUNCH_MAX_BYTES:
        return nq.Config()
    return nq.Config(**ONE_LAUNCH)


def one_launch_ctas(cfg: nq.Config, segments: int, x_bytes: int) -> int:
    """CTAs of the one-launch cluster for `segments` row segments (L * M * ceil(K / cfg.cols))
    of `x_bytes`: enough that each warp has one batch of segments and each CTA at most
    `CTA_BYTES` to read, at most `nq.MAX_CLUSTER`."""
    per_cta = cfg.warps * cfg.rows_in_flight
    want = max(-(-segments // per_cta), -(-x_bytes // CTA_BYTES))
    return max(1, min(nq.MAX_CLUSTER, want))

