"""`python -m tk_cute` (or `tk-cute`): the main job and the command-line tools.

    python -m tk_cute [run] [--m M --n N --k K] [--seed S]
    python -m tk_cute report --arch sm_107a --mnk 16384,16384,16384
    python -m tk_cute draw {scales,swizzle,tmem,schedule,stream-k,roofline,speedup,paths} \
        --out FILE.png
    python -m tk_cute compare --arch sm_90a [--peer PATH] [--plot FILE.png]
    python -m tk_cute emulate --arch sm_107a --mnk 256,256,512 [--out-dtype nvfp4] ...
    python -m tk_cute --help
"""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "run": "the main job: NVFP4 GEMMs checked element by element (kernels on a GPU; on a CPU "
           "the exact reference, the Rubin kernel compiled, checked and run in the emulator)",
    "report": "compile-only kernel report for any target: resources, MMAs, roofline model",
    "draw": "pictures (PNG/SVG): NVFP4 scale tiling, st swizzle, TMEM map, tile schedule, "
            "stream-K shares, roofline, bench speedups, the NVFP4 dispatch's paths",
    "compare": "the same GEMM in tk_cute and a CuTe DSL peer side by side: source lines, "
               "instruction mix, resources, time",
    "emulate": "run what nvfp4.gemm runs on a Blackwell / Rubin GPU on this CPU (the PTX "
               "emulator), checked element by element, with its hazards",
}


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tk_cute run",
        description=COMMANDS["run"] + ". --m/--n/--k set the checked GEMM (and the compiled "
        "Rubin kernel's shape); the emulator runs its own 256x256x512 (seconds of CPU time)")
    p.add_argument("--m", type=_positive_int, default=256, help="rows of A (default 256)")
    p.add_argument("--n", type=_positive_int, default=512, help="rows of B (default 512)")
    p.add_argument("--k", type=_positive_int, default=1024,
                   help="K, a multiple of 16 (default 1024)")
    p.add_argument("--seed", type=int, default=None)
    return p


def _check(label: str, fn) -> bool:
    try:
        detail = fn()
    except AssertionError as e:
        print(f"  FAIL {label}: {e}")
        return False
    except NotImplementedError as e:  # this GPU has no kernel for the case: say so, not a pass
        print(f"  skip {label}: {e}")
        return True
    print(f"  ok   {label}{': ' + detail if detail else ''}")
    return True


def _main_job(argv) -> int:
    import torch

    from tk_cute import nvfp4
    from tk_cute.runtime import dtype_name
    from tk_cute.testing import assert_gemm_close

    p = _run_parser()
    args = p.parse_args(argv)
    if args.k % 16:
        p.error(f"--k must be a multiple of 16 (the NVFP4 scale block), got {args.k}")
    if args.seed is not None:
        torch.manual_seed(args.seed)
    device = _device()
    M, N, K = args.m, args.n, args.k
    x = torch.randn(M, K, device=device)
    w = torch.randn(N, K, device=device)
    a, b = nvfp4.quantize(x), nvfp4.quantize(w)
    print(f"tk_cute NVFP4 on {device}: D ({M}, {N}) = A ({M}, {K}) x B ({N}, {K})^T")
    print(f"  format: E2M1 elements (2 per byte) + one UE4M3 scale per 16 K-elements + fp32 "
          f"global scale = {0.5 + 1 / 16} bytes/element (bf16: 2); B's decode scale "
          f"{b.global_scale.item():.6g}")
    exact = x.double() @ w.double().t()
    quant_err = ((nvfp4.gemm_reference(a, b, torch.float32).double() - exact).norm()
                 / exact.norm()).item()
    print(f"  NVFP4 vs fp64 GEMM of the unquantized inputs: relative error {quant_err:.3g} "
          f"(the format's own error)")
    ok = True
    for kind, act in (("W4A4", a), ("W4A16", x.bfloat16())):
        for out_dtype in (torch.bfloat16, torch.float32):
            def gemm_check(act=act, out_dtype=out_dtype, kind=kind):
                plan = nvfp4.plan(act, b, out_dtype)
                d = nvfp4.gemm(act, b, out_dtype)
                assert_gemm_close(d, act, b, f"{kind} via {plan}")
                return f"every element within the fp32-sum + output-rounding bound, ran {plan}"

            ok &= _check(f"{kind} -> {dtype_name(out_dtype)}", gemm_check)
    if device == "cpu":
        print("  no GPU: gemm ran the exact integer reference (checked above against the "
              "independent float64 product); the kernels are checked by compiling them, and "
              "the Rubin one by running it in the emulator:")
        ok &= _check("Rubin (sm_107a) NVFP4 GEMM compiled", lambda: _rubin_compile(M, N, K))
        ok &= _check("Hopper (sm_90a) register-A kernel compiled", _hopper_compile)
        ok &= _check("Rubin (sm_107a) NVFP4 GEMM run in the PTX emulator, 256x256x512",
                     _rubin_emulated)
    print("  check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def _device() -> str:
    """"cuda" where this process's GPU has tk_cute kernels, else "cpu" (saying why when there is
    a GPU without them: the job then runs the exact reference and the compile checks)."""
    import torch

    from tk_cute import arch

    if not torch.cuda.is_available():
        return "cpu"
    try:
        arch.device_target(torch.device("cuda"))
    except ValueError as e:
        print(f"{e}\n-> running the CPU checks instead")
        return "cpu"
    return "cuda"


def _rubin_compile(M: int, N: int, K: int) -> str:
    """Compile the Rubin kernel (the heuristics' config for the shape, K rounded up to its
    Kb) and assert what the compiler produced."""
    from tk_cute import report
    from tk_cute.tuning.sm100 import w4a4_config

    K = -(-K // 256) * 256
    cfg = w4a4_config("sm_107a", M, N, K)
    r = report.report(cfg, M, N, K)
    assert r["mma_instructions_per_stage"] > 0, "no tcgen05 block-scaled MMA in the PTX"
    assert r["spill_bytes"] == 0, f"{r['spill_bytes']} bytes of register spills"
    assert r["smem_bytes"] <= r["smem_capacity"], "shared memory over capacity"
    assert r["tmem_columns"] <= r["tmem_capacity"], "tensor memory over capacity"
    return (f"{r['tile_per_pair']} tiles, {r['mma_instructions_per_stage']} MMAs per stage, "
            f"{r['registers']} registers, 0 spills, {r['smem_bytes']} B shared, "
            f"{r['tmem_columns']} TMEM columns")


def _rubin_emulated() -> str:
    """The kernel the dispatch picks for an sm_107a GPU, run on this CPU (`tk_cute.emulator`)
    on exactly representable operands: every element equal to the exact product, no hazard."""
    from tk_cute.emulator import gemm as emulated

    a, b = emulated.random_operands(256, 256, 512)
    run = emulated.gemm(a, b, "bfloat16", arch="sm_107a")
    ok, what = emulated.check(run, a, b, "bfloat16")
    assert ok, what
    assert not run.hazards, "; ".join(str(h) for h in run.hazards)
    return (f"{what}, no hazard, {run.machine.executed:,} warp-instructions in "
            f"{run.seconds:.1f} s")


def _hopper_compile() -> str:
    from tk_cute.compile import build
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs

    cfg = rs.Config(N_ACT=16)
    b = build(rs._launch, *rs.signature(cfg).compile_args(cfg), arch="sm_90a")
    wgmma = b.ptx_count(r"wgmma\.mma_async\.sync\.aligned\.m64n16k16\.f32\.bf16\.bf16")
    assert wgmma > 0, "no register-A wgmma in the PTX"
    assert all(k.local_bytes == 0 for k in b.resources), "register spills"
    return f"{wgmma} wgmma m64n16k16 per unit, 0 spills in {len(b.resources)} kernels"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tk_cute", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="tk_cute: ThunderKittens-style NVFP4 GEMMs on the CuTe DSL.",
        epilog="commands:\n" + "\n".join(f"  {name:<8} {desc}" for name, desc in
                                         COMMANDS.items())
        + "\n\nWithout a command: run. `python -m tk_cute COMMAND --help` for its options.")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    if argv and argv[0] == "report":
        from tk_cute import report

        return report.main(argv[1:])
    if argv and argv[0] == "draw":
        from tk_cute import viz

        return viz.main(argv[1:])
    if argv and argv[0] == "compare":
        from tk_cute import compare

        return compare.main(argv[1:])
    if argv and argv[0] == "emulate":
        from tk_cute.emulator import cli

        return cli.main(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    elif argv and not argv[0].startswith("-"):
        _parser().error(f"unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)})")
    return _main_job(argv)


if __name__ == "__main__":
    sys.exit(main())
