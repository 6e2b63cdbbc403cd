"""NVFP4 quantizer benchmark: tk_cute's kernels beside the torch quantizer a user would write
(`quantize_reference` on CUDA) and a device-to-device copy, same process, cold L2.

    python -m tk_cute.bench quantize [--shapes 8192x8192,16384x16384,4096x4096] [--dtype bf16]
                                     [--sweep]

GPU time: the unchecked variants (no host sync) are captured in CUDA graphs and timed by replay
(`bench(..., graph=True)`), beside a graph-captured copy; their host cost per call is reported
apart (`host_overhead`). The checked variant reads a flag back (one sync per call), so it cannot
be captured: it and the torch reference (whose finite check syncs too) are timed eagerly, beside
an eager copy, and include host time.
GB/s counts the bytes that must move: read 2 B + write 0.5625 B per bf16 element, plus one more
2 B read for the amax pass (none with a given global scale). Copy GB/s counts read + write.
The bar (issue 6): amax+quantize >= 70% of copy bandwidth at 8192^2 and 16384^2 bf16.
`--sweep` also times the tuning configurations of `SWEEP` and the row splits of
`tuning.quantize.SPLITS` (graph replay). "tk amax+quantize" is
the call's own plan; "two launches" / "one launch" force each way (`tuning.quantize`: small
inputs take one launch), e.g. ``--shapes 1x256,16x4096,16x8192,64x8192``.
"""

from __future__ import annotations

import argparse

import torch

from tk_cute.bench.harness import HEADER, bench, environment, host_overhead, input_sets, row

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
SWEEP = {
    "w4 rif4 occ0": dict(warps=4, rows_in_flight=4, min_ctas_per_sm=0),
    "w8 rif1": dict(rows_in_flight=1),
    "w8 rif2 occ3": dict(min_ctas_per_sm=3),
    "w8 rif4 occ0": dict(rows_in_flight=4, min_ctas_per_sm=0),
    "w16 rif2 occ2": dict(warps=16, rows_in_flight=2, min_ctas_per_sm=2),
    "forward order": dict(reverse=False),
    "amax 512x2 u4": dict(amax_threads=512, amax_ctas_per_sm=2),
    "amax 256x8 u4": dict(amax_threads=256, amax_ctas_per_sm=8),
    "amax 1024x1 u8": dict(amax_unroll=8),
    "no PDL": {"pdl": False},
}


def _amax_only(s):
    """The amax kernel alone (internal: for the GPU-time breakdown)."""
    from tk_cute.kernels import nvfp4_quantize as nq
    from tk_cute.nvfp4 import launch
    from tk_cute.runtime import raw_stream

    x = s[0]
    plan = launch._quantize_plan(x, False, False, nq.Config())  # (two launches: the amax one)
    ws = torch.empty(plan.ws_words, dtype=torch.float32, device=x.device)
    plan.amax(x=x.data_ptr(), partials=ws.data_ptr(), stream=raw_stream(plan.device_index))


def _variants(sweep: bool):
    from tk_cute.kernels import nvfp4_quantize as nq
    from tk_cute.nvfp4 import launch, quantize_reference
    from tk_cute.runtime import sm_count
    from tk_cute.tuning import quantize as quantize_tuning

    copy = lambda s: s[1].copy_(s[0])
    eager = {
        "tk amax+quantize (checked)": lambda s: launch.quantize(s[0]),
        "torch reference (CUDA)": lambda s: quantize_reference(s[0]),
        "copy (x -> y)": copy,
    }
    one = nq.Config(**quantize_tuning.ONE_LAUNCH)
    two = lambda x: quantize_tuning.pass_config(x.shape, x.element_size(), sm_count(x.device))
    graph = {
        "tk amax+quantize (no check)": lambda s: launch.quantize(s[0], check_finite=False),
        "tk two launches (no check)": lambda s: launch.quantize(s[0], check_finite=False,
                                                                 config=two(s[0])),
        "tk one launch (no check)": lambda s: launch.quantize(s[0], check_finite=False,
                                                               config=one),
        "tk given scale (no check)": lambda s: launch.quantize(s[0], s[2], check_finite=False),
        "tk amax pass only": _amax_only,
        "copy (x -> y)": copy,
    }
    if sweep:
        splits = {f"row split {k}": kw for k, kw in quantize_tuning.SPLITS.items()}
        for name, kw in {**SWEEP, **splits}.items():
            cfg = nq.Config(**kw)
            graph[f"tk no check {name}"] = (
                lambda s, cfg=cfg: launch.quantize(s[0], check_finite=False, config=cfg))
    return eager, graph


def _print(res, spec, dtype_name, n, esize, base_ms, mode):
    copy_gbs = 2 * n * esize / res["copy (x -> y)"].ms / 1e6
    must = n * (esize + 0.5625)
    for name, r in res.items():
        if name.startswith("copy"):
            nbytes = 2 * n * esize
        elif "given" in name:
            nbytes = must
        elif "amax pass only" in name:
            nbytes = n * esize
        else:
            nbytes = must + n * esize
        gbs = nbytes / r.ms / 1e6
        extra = f"{mode}; {gbs / copy_gbs * 100:5.1f}% of {mode} copy; spread {r.spread:.2f}"
        print(row(name, spec + " " + dtype_name, r.ms, 0, nbytes, base_ms, extra))
    return copy_gbs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tk_cute.bench quantize")
    p.add_argument("--shapes", default="8192x8192,16384x16384,4096x4096")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args(argv)
    dtype = DTYPES[args.dtype]
    esize = torch.empty((), dtype=dtype).element_size()
    print(environment())
    print(HEADER)
    from tk_cute.nvfp4 import launch, quantize_reference

    for spec in args.shapes.split(","):
        shape = tuple(int(s) for s in spec.split("x"))
        n = 1
        for s in shape:
            n *= s

        def make():
            x = torch.randn(shape, device="cuda", dtype=dtype)
            return (x, torch.empty_like(x), torch.tensor(float(x.abs().max()) / 2688,
                                                         device="cuda"))

        sets = input_sets(make, n * esize)
        eager, graph = _variants(args.sweep)
        # correctness first: the kernel must equal the reference on this very input
        got, ref = launch.quantize(sets[0][0]), quantize_reference(sets[0][0])
        exact = (torch.equal(got.data, ref.data) and torch.equal(got.scales, ref.scales)
                 and torch.equal(got.global_scale, ref.global_scale))
        rounds = max(args.rounds, 50 // len(sets) + 1)
        res_e = bench(eager, sets, rounds=rounds)
        res_g = bench(graph, sets, rounds=rounds, graph=True)
        base = res_e["torch reference (CUDA)"].ms
        ce = _print(res_e, spec, args.dtype, n, esize, base, "eager")
        cg = _print(res_g, spec, args.dtype, n, esize, base, "graph")
        hu = {k: host_overhead(graph[k], sets[0]) for k in
              ("tk amax+quantize (no check)", "tk two launches (no check)",
               "tk one launch (no check)", "tk given scale (no check)")}
        print(f"  copy {cg:.0f} GB/s (graph), {ce:.0f} GB/s (eager); bit-exact vs reference: "
              f"{exact}; host overhead us/call: "
              + ", ".join(f"{k} {v:.1f}" for k, v in hu.items())
              + f"; compile s: {sum(launch._QUANTIZE.compile_seconds.values()):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
