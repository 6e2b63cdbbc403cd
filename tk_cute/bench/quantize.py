"""NVFP4 quantizer benchmark: tk_cute's kernels beside the torch quantizer a user would write
(`quantize_reference` on CUDA) and a device-to-device copy, same process, cold L2.

    python -m tk_cute.bench quantize [--shapes 8192x8192,16384x16384,4096x4096] [--dtype bf16]
                                     [--sweep]

GB/s counts the bytes that must move: read 2 B + write 0.5625 B per bf16 element, plus one more
2 B read for the amax pass (none with a given global scale). Copy GB/s counts read + write.
The bar (issue 6): amax+quantize >= 70% of copy bandwidth at 8192^2 and 16384^2 bf16.
`--sweep` also times blocks_per_thread 1/2/8 configurations.
"""

from __future__ import annotations

import argparse

import torch

from tk_cute.bench.harness import HEADER, bench, environment, host_overhead, input_sets, row

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _variants(dtype, sweep: bool):
    from tk_cute.kernels import nvfp4_quantize as nq
    from tk_cute.nvfp4 import quantize_reference

    v = {
        "tk amax+quantize (checked)": lambda s: nq.quantize_cuda(s[0]),
        "tk amax+quantize (no check)": lambda s: nq.quantize_cuda(s[0], check_finite=False),
        "tk given scale (no check)": lambda s: nq.quantize_cuda(s[0], s[2], check_finite=False),
        "torch reference (CUDA)": lambda s: quantize_reference(s[0]),
        "copy (x -> y)": lambda s: s[1].copy_(s[0]),
    }
    if sweep:
        for bpt in (1, 2, 8):
            cfg = nq.Config(blocks_per_thread=bpt)
            v[f"tk no check bpt={bpt}"] = (
                lambda s, cfg=cfg: nq.quantize_cuda(s[0], check_finite=False, config=cfg))
    return v


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
        variants = _variants(dtype, args.sweep)
        # correctness first: the kernel must equal the reference on this very input
        from tk_cute.kernels import nvfp4_quantize as nq
        from tk_cute.nvfp4 import quantize_reference

        got, ref = nq.quantize_cuda(sets[0][0]), quantize_reference(sets[0][0])
        exact = torch.equal(got.data, ref.data) and torch.equal(got.scales, ref.scales)
        res = bench(variants, sets, rounds=max(args.rounds, 50 // len(sets) + 1))
        base = res["torch reference (CUDA)"].ms
        copy_ms = res["copy (x -> y)"].ms
        copy_gbs = 2 * n * esize / copy_ms / 1e6
        must = n * (esize + 0.5625)
        for name, r in res.items():
            if name.startswith("copy"):
                nbytes = 2 * n * esize
            elif "given" in name:
                nbytes = must
            else:
                nbytes = must + n * esize
            gbs = nbytes / r.ms / 1e6
            extra = f"{gbs / copy_gbs * 100:5.1f}% of copy; spread {r.spread:.2f}"
            print(row(name, spec + " " + args.dtype, r.ms, 0, nbytes, base, extra))
        hu = host_overhead(variants["tk amax+quantize (no check)"], sets[0])
        print(f"  copy {copy_gbs:.0f} GB/s; bit-exact vs reference: {exact}; host overhead "
              f"(no check) {hu:.1f} us/call; compile s: {nq._cache().compile_seconds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
