"""`python -m tk_cute` (or `tk-cute`): the main job, and `report` for kernel reports.

    python -m tk_cute [--m 256 --n 512 --k 1024] [--seed S]
        quantizes a random A (M, K) and B (N, K) to NVFP4, runs `tk_cute.nvfp4.gemm` (the
        fastest path for this machine: a GPU kernel where one exists, the exact reference on
        CPU), checks it against `gemm_reference` and prints the format's figures.
    python -m tk_cute report --arch sm_107a ...
        compile-only kernel report for any target (see `tk_cute.report`).
"""

from __future__ import annotations

import argparse
import sys


def _main_job(argv) -> int:
    import torch

    from tk_cute import nvfp4

    p = argparse.ArgumentParser(prog="python -m tk_cute")
    p.add_argument("--m", type=int, default=256)
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(args.m, args.k, device=device)
    w = torch.randn(args.n, args.k, device=device)
    a, b = nvfp4.quantize(x), nvfp4.quantize(w)
    # On a GPU the kernels write bf16 (the dispatch's fast path); on the CPU the exact reference
    # writes fp32.
    out_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    d = nvfp4.gemm(a, b, out_dtype=out_dtype)
    ref = nvfp4.gemm_reference(a, b, out_dtype=torch.float32).double()
    kernel_err = ((d.double() - ref).norm() / ref.norm()).item()
    exact = x.double() @ w.double().t()
    quant_err = ((ref - exact).norm() / exact.norm()).item()
    elems = args.m * args.k
    data_bytes, scale_bytes = a.data.numel(), a.scales.numel()
    print(f"tk_cute NVFP4 GEMM on {device}: D ({args.m}, {args.n}) = A ({args.m}, {args.k}) "
          f"x B ({args.n}, {args.k})^T, {str(out_dtype).removeprefix('torch.')} output")
    print(f"  format: E2M1 elements (2 per byte) + one UE4M3 scale per 16 K-elements + fp32 "
          f"global scale = {0.5 + 1 / 16} bytes/element (bf16: 2)")
    print(f"  A: data {tuple(a.data.shape)} uint8 = {data_bytes} B, scales {tuple(a.scales.shape)}"
          f" (128x4 blocked, padded) = {scale_bytes} B, {(data_bytes + scale_bytes) / elems:.4f}"
          f" B/element; global scale (decode) {a.global_scale.item():.6g}")
    print(f"  gemm vs exact NVFP4 reference: relative error {kernel_err:.3g}")
    print(f"  NVFP4 vs fp64 GEMM of the unquantized inputs: relative error {quant_err:.3g}")
    # Exact products with fp32 accumulation: the output rounding decides, 2^-9 per element for
    # bf16 (2^-8 leaves a 2x margin), 2^-24 for fp32 (1e-5 is generous).
    ok = kernel_err < (2**-8 if out_dtype == torch.bfloat16 else 1e-5)
    print("  check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "report":
        from tk_cute import report

        return report.main(argv[1:])
    return _main_job(argv)


if __name__ == "__main__":
    sys.exit(main())
