"""NVFP4 GEMM benchmark on Hopper: tk_cute beside cuBLAS, same process, cold L2.

    python -m tk_cute.bench nvfp4 [--m 1 16 64 128 1024 8192] [--nk 8192,8192 28672,8192 ...]

Variants per shape: tk_cute W4A16 and W4A4 through the public `tk_cute.nvfp4.gemm` (which picks
`kernels/gemm/nvfp4_rs_sm90.py` for W4A16 at 9 <= M <= 128, `kernels/gemm/nvfp4_gemv_sm90.py` for
the other M <= 64 and the dequantize + bf16 GEMM path of `kernels/gemm/nvfp4_sm90.py` for
M % 128 == 0; the paths not taken run beside it where they apply), cuBLAS bf16 on
the dequantized weights (`a @ w.t()`), cuBLAS fp8 e4m3 (`torch._scaled_mm`, per-tensor scales)
and the torch path a user would write (LUT dequantize to bf16, then cuBLAS). For M <= 128
also `tk_cute.nvfp4.gemm(pdl=True)`, whose back-to-back calls overlap (each starts reading its
weights during the previous call's tail: what a chain of decode GEMMs on static weights gets),
and "speed of light: read W": `kernels/stream_read.py` reading the same weight bytes (codes and
scales) and nothing else, with the fastest read pattern measured on the H200; its "vs base" is
about the largest speedup over cuBLAS bf16 a memory-bound NVFP4 kernel can reach in that run.
GB/s counts the NVFP4 weight payload (0.5625 B/element) for every variant, so the column
compares speeds on one scale; the device-to-device copy bandwidth (read + write) is measured in
the same run.
`--tune` adds small-M tk_cute variants over the tiling (MT MMA row tiles per warp, WN warps
along N, U 128-K steps per trip, ahead: the next trip's weights in flight, cN: a register cap for
N CTAs per SM) and split-K (S warps along K, for about 8, 16 or 32 warps per SM).
"""

from __future__ import annotations

import argparse

import torch

from tk_cute.bench.harness import HEADER, bench, environment, host_overhead, input_sets, row

DEFAULT_NK = ["8192,8192", "28672,8192", "8192,28672"]
SPEED_OF_LIGHT = "speed of light: read W"


def _dequant_torch(b) -> torch.Tensor:
    """What a user writes: E2M1 lookup, UE4M3 scales, one bf16 tensor (N, K)."""
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       device=b.data.device, dtype=torch.float32)
    codes = torch.stack((b.data & 15, b.data >> 4), dim=-1).reshape(b.M, b.K)
    sf = b.scales_logical().view(torch.float8_e4m3fn).float()
    w = lut[codes.long()] * sf.repeat_interleave(16, dim=-1) * b.global_scale
    return w.bfloat16()


def _make(M, N, K):
    from tk_cute.nvfp4 import quantize

    b = quantize(torch.randn(N, K, device="cuda") * 0.02)
    a = torch.randn(M, K, device="cuda").bfloat16()
    w = b.dequantize(torch.bfloat16)
    sw = (w.float().abs().amax() / 448).reshape(())
    sa = (a.float().abs().amax() / 448).reshape(())
    m16 = max(M, 16)  # cuBLASLt fp8 wants M % 16 == 0: pad (the extra rows cost no weight bytes)
    a8 = torch.zeros(m16, K, device="cuda", dtype=torch.float8_e4m3fn)
    a8[:M] = (a.float() / sa).to(torch.float8_e4m3fn)
    return dict(a=a, aq=quantize(a), b=b, w=w, w8=(w.float() / sw).to(torch.float8_e4m3fn),
                a8=a8, sa=sa.float(), sw=sw.float())


def _variants(M, N, K, tune: bool, sms: int):
    from tk_cute.kernels.gemm import nvfp4_gemv_sm90 as gv

    from tk_cute import nvfp4

    v = {
        "tk_cute w4a16": lambda s: nvfp4.gemm(s["a"], s["b"]),
        "tk_cute w4a4": lambda s: nvfp4.gemm(s["aq"], s["b"]),
        "cuBLAS bf16 (deq W)": lambda s: s["a"] @ s["w"].t(),
        "cuBLAS fp8 _scaled_mm": lambda s: torch._scaled_mm(
            s["a8"], s["w8"].t(), scale_a=s["sa"], scale_b=s["sw"], out_dtype=torch.bfloat16),
        "torch deq + matmul": lambda s: s["a"] @ _dequant_torch(s["b"]).t(),
    }
    from tk_cute.kernels.gemm import nvfp4_rs_sm90 as rs
    from tk_cute.kernels.gemm import nvfp4_sm90

    if M > gv.MAX_M and nvfp4_sm90.supports(M, N, K):  # the other large-M paths, side by side
        if M <= rs.MAX_M:  # (`tk_cute.nvfp4.gemm` took rs)
            v["tk_cute w4a16 dequantize"] = lambda s: nvfp4_sm90.gemm(s["a"], s["b"])
        v["tk_cute w4a16 fused"] = lambda s: nvfp4_sm90.gemm(s["a"], s["b"], path="fused")
        v["tk_cute w4a4 fused"] = lambda s: nvfp4_sm90.gemm(s["aq"], s["b"], path="fused")
    if M <= rs.MAX_M:  # the memory-bound regime
        from tk_cute.kernels.stream_read import stream_read

        # back-to-back calls that may overlap (static weights), and the floor: only reading the
        # weight bytes
        v["tk_cute w4a16 pdl"] = lambda s: nvfp4.gemm(s["a"], s["b"], pdl=True)
        v[SPEED_OF_LIGHT] = lambda s: stream_read(s["b"].data, s["b"].scales)
    if rs.MIN_M <= M <= gv.MAX_M and gv.supports(M, N, K):  # the small-M kernel beside rs
        v["tk_cute w4a16 small-M kernel"] = lambda s: gv.gemm_small_m(s["a"], s["b"])
    if rs.supports(M, N, K) and M < rs.MIN_M:  # where the dispatch does not take it
        v["tk_cute w4a16 rs"] = lambda s: rs.gemm_rs(s["a"], s["b"])
    if tune and M <= gv.MAX_M:
        import dataclasses

        base = gv.config_for(M, N, K)
        plain = dict(AHEAD=False, MIN_CTAS=0)
        tilings = [dict(UNROLL=2, **plain), dict(UNROLL=4, **plain),
                   dict(UNROLL=2, AHEAD=True, MIN_CTAS=2), dict(WN=2, UNROLL=4, **plain),
                   dict(MT=1, WN=2, UNROLL=4, **plain), dict(MT=4, UNROLL=1, **plain)]
        for tiling in tilings:
            cfg = dataclasses.replace(base, S=1, **tiling)
            if N % cfg.rows or K % cfg.k_chunk:
                continue
            kind = f"MT{cfg.MT} WN{cfg.WN} U{cfg.UNROLL}" + (" ahead" if cfg.AHEAD else "") + (
                f" c{cfg.MIN_CTAS}" if cfg.MIN_CTAS else "")
            for S in sorted({gv.split_k(cfg, N, K, sms, per_sm) for per_sm in (1, 2, 4)}):
                v[f"tk_cute w4a16 {kind} S{S}"] = (
                    lambda s, c=dataclasses.replace(cfg, S=S): gv.gemm_small_m(
                        s["a"], s["b"], config=c))
    return v


def copy_bandwidth(nbytes: int = 1 << 30, rounds: int = 10) -> float:
    """Device-to-device copy, GB/s counting read + write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    r = bench({"copy": lambda _: dst.copy_(src)}, [None], rounds=rounds)["copy"]
    return 2 * nbytes / r.ms / 1e6


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tk_cute.bench nvfp4")
    p.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 128, 1024, 8192])
    p.add_argument("--nk", nargs="+", default=DEFAULT_NK)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--tune", action="store_true", help="add WN / split-K variants of tk_cute")
    p.add_argument("--no-torch-deq", action="store_true", help="skip the slow torch path")
    args = p.parse_args(argv)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(environment())
    print(f"device-to-device copy: {copy_bandwidth():.0f} GB/s (read + write, 1 GiB)")
    print("timing: CUDA graph replay, cold L2 (rotating input sets); GB/s = 0.5625 B x N x K")
    print(HEADER)
    for nk in args.nk:
        N, K = map(int, nk.split(","))
        for M in args.m:
            sets = input_sets(lambda: _make(M, N, K), N * K * 9 // 16 + M * K * 2)
            variants = _variants(M, N, K, args.tune, sms)
            if args.no_torch_deq:
                variants.pop("torch deq + matmul")
            for name in list(variants):
                try:
                    variants[name](sets[0])
                except Exception as e:  # noqa: BLE001 - report and keep the others
                    print(f"| {name:<28} | M={M} N={N} K={K} | failed: {type(e).__name__}: {e}")
                    variants.pop(name)
            res = bench(variants, sets, rounds=args.rounds, graph=True)
            base = res.get("cuBLAS bf16 (deq W)")
            shape = f"{M}x{N}x{K}"
            for name, r in res.items():
                print(row(name, shape, r.ms, 2 * M * N * K, N * K * 0.5625,
                          base.ms if base else None, f"spread {r.spread:.0%}"), flush=True)
            del sets
            torch.cuda.empty_cache()
    from tk_cute.kernels.gemm import nvfp4_gemv_sm90 as gv

    s = _make(16, 8192, 8192)
    us = host_overhead(lambda s: gv.gemm_small_m(s["a"], s["b"]), s)
    print(f"host overhead per eager gemm_small_m call (16x8192x8192): {us:.1f} us")
    return 0
