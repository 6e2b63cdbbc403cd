# SPDX-License-Identifier: MIT
"""How the NVFP4 quantizer launches (`kernels/nvfp4_quantize.py`, every target): a tensor of at
most `ONE_LAUNCH_MAX_BYTES` with the computed global scale runs the one-launch kernel (one
cluster: the amax through distributed shared memory, then the codes); anything else the amax
pass then the quantize pass (a given global scale: the quantize pass alone), whose CTAs
`pass_config` splits where its 128-row tiles are few.

Why: an eager call pays the host ~4 us per launch (docs/facts.md#host-time), more than either
pass runs on a small tensor. The bound and `CTA_BYTES` are a model: a cluster CTA of 1024
threads keeps 64 KiB of loads in flight per amax step, so 8 CTAs read 512 KiB in one step's
latency and re-read it from L2 to quantize. Timed on the H100, the one launch is SLOWER on the
GPU at every size (`pass_config`; docs/facts.md#quantizer-latency): it keeps only the host
launch it saves, which is what an eager call of a small tensor waits for; calls whose GPU time
counts (inside a W4A4 GEMM call) take the two launches. A GPU that cannot hold the cluster at
once (its SMs restricted: `runtime.resident_clusters`) takes the two launches.
`python -m tk_cute.bench quantize --shapes 1x256,16x8192 ...` times both ways side by side.
"""

from __future__ import annotations

import math

from tk_cute.kernels import nvfp4_quantize as nq

ONE_LAUNCH_MAX_BYTES = 1 << 19  # x's bytes (all L batches)
CTA_BYTES = 1 << 16  # x's bytes per cluster CTA (one amax step of 1024 threads x 4 x 16 B)
# The one-launch kernel's CTA: 32 warps; two row segments in flight per warp keep it at 64
# registers (1024 threads).
ONE_LAUNCH = {"one_launch": True, "warps": 32, "rows_in_flight": 2}


# The quantize pass where its tiles (128-row x 512-byte: ceil(M / 128) x ceil(K x bytes / 512)
# x L) are fewer than SPLIT_BELOW x the SMs: each tile's rows split over `row_split` CTAs, the
# largest split (of `SPLITS`, each CTA geometry as timed) whose CTAs stay within
# SPLIT_CTAS_PER_SM x the SMs. A 128-row tile's CTA otherwise runs its few real rows in
# batches one after another on 12-32 SMs. H100 A/B (2026-12-06, CUDA-graph replay, us,
# amax + quantize, bf16 M x K, one CTA per tile / split 16 / 8 (4 warps of 4 rows) / 4,
# docs/facts.md#quantizer-split): 64x2880 (12 tiles) 8.9 / 4.5 / 5.7 / 6.3, 64x7168 (28) 7.1 /
# 5.0 / 5.1 / 5.4, 128x8192 (32) 9.3 / 5.4 / 5.4 / 5.7, 256x4096 (32) 9.4 / 5.5 / 5.5 / 5.8,
# 16x8192 (32) 5.3 / 4.6 / 4.8 / 4.7, 1x8192 4.6 / 4.5 / 4.2 / 4.2; given scale 64x2880 6.6 /
# 2.4, 128x8192 6.7 / 2.9; but 16x28672 (112 tiles) 5.6 / 7.3 / 6.3 / 6.0 and 1024x8192 (256)
# 18.9 / 23.5 / 19.0 / 18.8.
SPLITS = {16: {"row_split": 16, "rows_in_flight": 1},
          8: {"row_split": 8, "warps": 4, "rows_in_flight": 4},
          4: {"row_split": 4}}
SPLIT_BELOW = 0.5
SPLIT_CTAS_PER_SM = 2


def pass_config(shape, esize: int, sms: int) -> nq.Config:
    """The quantize pass's Config (two launches, or the given-scale pass) for an input of
    `shape` ((L, M, K) or (M, K)) and `esize`-byte elements on a GPU of `sms` SMs: the tiles'
    rows split over more CTAs where the tiles are few (`SPLITS`). Also the quantizer's Config
    inside a W4A4 GEMM call that quantizes its bf16 activations first (`launch.QuantizeA`):
    two launches at every size, whose GPU time is what such a call adds once its GEMM keeps
    the GPU busy (a CUDA graph, a compiled model, an eager model at 16 rows and up). H100
    (2026-12-06, CUDA-graph replay, us, one launch / two launches before the split, bf16 M x
    K): 1x2048 4.8 / 4.2, 1x8192 7.6 / 4.7, 16x8192 8.3 / 5.4, 64x2880 10.4 / 8.9, 16x28672
    16.6 / 5.7, 1x28672 9.4 / 4.7 (docs/facts.md#quantizer-latency); with the split and the
    pass launched dependent on the amax pass (PDL), two launches 1x8192 3.2, 16x8192 3.9,
    64x2880 3.8 (docs/facts.md#quantizer-split). A plain `quantize` call keeps `config`'s one
    launch for small inputs: one host launch fewer, and an eager call of a small tensor is
    host-bound."""
    *lead, M, K = shape
    tiles = -(-M // nq.ATOM_ROWS) * -(-K * esize // nq.SEG_BYTES) * (lead[0] if lead else 1)
    if tiles < SPLIT_BELOW * sms:
        for split, kw in SPLITS.items():
            if tiles * split <= SPLIT_CTAS_PER_SM * sms:
                return nq.Config(**kw)
    return nq.Config()


def config(shape, esize: int, given: bool, sms: int) -> nq.Config:
    """The default Config of a quantize call (dtype, scale mode and arch are the caller's):
    one launch for at most ONE_LAUNCH_MAX_BYTES with the computed scale, else `pass_config`."""
    if given or math.prod(shape) * esize > ONE_LAUNCH_MAX_BYTES:
        return pass_config(shape, esize, sms)
    return nq.Config(**ONE_LAUNCH)


def one_launch_ctas(cfg: nq.Config, segments: int, x_bytes: int) -> int:
    """CTAs of the one-launch cluster for `segments` row segments (L * M * ceil(K / cfg.cols))
    of `x_bytes`: enough that each warp has one batch of segments and each CTA at most
    `CTA_BYTES` to read, at most `nq.MAX_CLUSTER`."""
    per_cta = cfg.warps * cfg.rows_in_flight
    want = max(-(-segments // per_cta), -(-x_bytes // CTA_BYTES))
    return max(1, min(nq.MAX_CLUSTER, want))

