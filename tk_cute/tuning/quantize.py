# SPDX-License-Identifier: MIT
"""How the NVFP4 quantizer launches (`kernels/nvfp4_quantize.py`, every target): a tensor of at
most `ONE_LAUNCH_MAX_BYTES` with the computed global scale runs the one-launch kernel (one
cluster: the amax through distributed shared memory, then the codes); anything else the amax
pass then the quantize pass (a given global scale: the quantize pass alone).

Why: an eager call pays the host ~4 us per launch (docs/facts.md#host-time), more than either
pass runs on a small tensor. The bound and `CTA_BYTES` are a MODEL (not yet timed on a GPU):
a cluster CTA of 1024 threads keeps 64 KiB of loads in flight per amax step, so 8 CTAs read
512 KiB in one step's latency and re-read it from L2 to quantize, about what the second launch
and its grid cost the GPU. A GPU that cannot hold the cluster at once (its SMs restricted:
`runtime.resident_clusters`) takes the two launches.
`python -m tk_cute.bench quantize --shapes 1x256,16x8192 ...` times both ways side by side.
"""

from __future__ import annotations

from tk_cute.kernels import nvfp4_quantize as nq

ONE_LAUNCH_MAX_BYTES = 1 << 19  # x's bytes (all L batches)
CTA_BYTES = 1 << 16  # x's bytes per cluster CTA (one amax step of 1024 threads x 4 x 16 B)
# The one-launch kernel's CTA: 32 warps; two row segments in flight per warp keep it at 64
# registers (1024 threads).
ONE_LAUNCH = {"one_launch": True, "warps": 32, "rows_in_flight": 2}


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

