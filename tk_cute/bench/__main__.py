"""`python -m tk_cute.bench {gemm,nvfp4,quantize} ...`: the benchmarks (H100/H200)."""

import importlib
import sys

BENCHES = {
    "gemm": ("tk_cute.bench.gemm", "dense bf16/fp16/fp8 GEMM vs cuBLAS and the CUTLASS peer"),
    "nvfp4": ("tk_cute.bench.nvfp4", "NVFP4 GEMM (W4A16, W4A4) vs cuBLAS bf16 / fp8, all M"),
    "quantize": ("tk_cute.bench.quantize", "the NVFP4 quantizer vs copy bandwidth"),
    "model": ("tk_cute.bench.model", "an MLP block in torch: tk_cute NVFP4 (eager, compiled, "
              "CUDA graph) vs bf16 / fp8"),
    "tp": ("tk_cute.bench.tp", "a tensor-parallel MLP block on 1-8 GPUs vs torch bf16 TP"),
}


def usage() -> str:
    lines = ["usage: python -m tk_cute.bench BENCH [options]   (BENCH --help for its options)",
             "", "benches:"]
    lines += [f"  {name:<9} {desc}" for name, (_, desc) in BENCHES.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in BENCHES:
        print(f"{usage()}\n\nerror: unknown bench {argv[0]!r}", file=sys.stderr)
        return 2
    return importlib.import_module(BENCHES[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
