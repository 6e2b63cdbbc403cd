# SPDX-License-Identifier: MIT
"""`python -m tk_cute emulate`: what `nvfp4.gemm` runs on a target GPU, run on this CPU.

    python -m tk_cute emulate --arch sm_107a --mnk 256,256,512 [--activations nvfp4|bf16]
        [--out-dtype bfloat16|float16|float32|nvfp4] [--scale-format ue4m3|ue5m3]
        [--adversarial] [--seed S]

Random exactly representable operands (`emulator.gemm.random_operands`), the kernel the
dispatch plans for the target, every element checked against the exact reference (NVFP4 D bit
for bit against the quantizer's recipe), the hazards, the instructions per warp role and the
time. Exit status 0 only when D matches with no hazard; 1 for a mismatch, a hazard or a
deadlock; 2 when the target has no kernel for the call (or bad arguments).
"""

from __future__ import annotations

import argparse
import sys

ARCHS = ("sm_90a", "sm_100a", "sm_103a", "sm_107a")


def _mnk(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected M,N,K (three integers), got {text!r}") \
            from None
    if min(m, n, k) < 1 or k % 16:
        raise argparse.ArgumentTypeError(f"M, N, K must be positive and K a multiple of 16 (the "
                                         f"NVFP4 scale block), got {m},{n},{k}")
    return m, n, k


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tk_cute emulate", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=ARCHS, required=True, help="the GPU to emulate")
    p.add_argument("--mnk", type=_mnk, required=True, help="M,N,K of D = A @ B^T")
    p.add_argument("--activations", choices=("nvfp4", "bf16"), default="nvfp4",
                   help="A's format: nvfp4 (W4A4, default) or bf16 (W4A16)")
    p.add_argument("--out-dtype", choices=("bfloat16", "float16", "float32", "nvfp4"),
                   default="bfloat16")
    p.add_argument("--scale-format", choices=("ue4m3", "ue5m3"), default="ue4m3",
                   help="block scales (ue5m3: sm_107a only)")
    p.add_argument("--adversarial", action="store_true",
                   help="random warp order, asynchronous operations completed at random points")
    p.add_argument("--seed", type=int, default=0, help="data and schedule seed")
    return p


def roles(kernel_cls) -> dict[int, str]:
    """Warp index -> role name, from a kernel class's *_WARP(S) attributes."""
    out = {}
    for name in dir(kernel_cls):
        if name.endswith(("_WARP", "_WARPS")):
            value = getattr(kernel_cls, name)
            role = name.rsplit("_", 1)[0].lower().replace("epi", "epilogue").replace(
                "sched", "scheduler").replace("load", "producer")
            for w in (value if isinstance(value, tuple) else (value,)):
                out[w] = role
    return out


def _kernel_class(path: str):
    """The kernel class a plan path runs (its *_WARP attributes name the warp roles)."""
    from tk_cute.kernels.gemm import nvfp4_sm100, nvfp4_w4a16_sm100

    return {"sm100": nvfp4_sm100.GemmNvfp4Sm100,
            "sm100_w4a16": nvfp4_w4a16_sm100.GemmW4A16Sm100}.get(path, object)


def main(argv=None) -> int:
    import torch

    from tk_cute.emulator import gemm as G
    from tk_cute.emulator.machine import Deadlock
    from tk_cute.emulator.memory import EmulatorError

    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    m, n, k = args.mnk
    a, b = G.random_operands(m, n, k, activations=args.activations,
                             scale_format=args.scale_format, seed=args.seed)
    gs = torch.tensor(4.0) if args.out_dtype == "nvfp4" else None
    print(f"emulating {args.arch}: D ({m}, {n}) {args.out_dtype} = A ({m}, {k}) "
          f"{'NVFP4' if args.activations == 'nvfp4' else 'bf16'} x B ({n}, {k})^T NVFP4 "
          f"({args.scale_format} scales), seed {args.seed}"
          f"{', adversarial schedule' if args.adversarial else ''}")
    try:
        run = G.gemm(a, b, args.out_dtype, arch=args.arch, out_global_scale=gs,
                     adversarial=args.adversarial, seed=args.seed)
    except G.NoKernel as e:
        print(f"  {e}")
        return 2
    except ValueError as e:
        print(f"  the dispatch refuses the call: {e}")
        return 2
    except Deadlock as e:
        print(f"  {e}")
        return 1
    except EmulatorError as e:
        print(f"  the emulator stopped: {e}")
        return 1
    ok, what = G.check(run, a, b, args.out_dtype, gs)
    print(f"  kernel: {run.kernel} {run.config}")
    print(f"  launch: grid {run.launch.grid}, block {run.launch.block}, cluster "
          f"{run.launch.cluster}, {run.launch.smem_bytes} B dynamic shared memory")
    print(f"  check: {'PASS' if ok else 'FAIL'}: {what}")
    if args.arch == "sm_107a":
        print("  sm_107a: unconfirmed by hardware (K = 128 scale reads, UE5M3, the B collector, "
              "tcgen05.ld.red and the exclusive allocation are emulated as the DSL encodes "
              "them: docs/emulator.md)")
    print(f"  hazards: {len(run.hazards) or 'none'}")
    for h in run.hazards[:20]:
        print(f"    {h}")
    names = roles(_kernel_class(run.kernel))
    per = run.instructions_by_warp()
    by_role: dict[str, int] = {}
    for w, count in sorted(per.items()):
        by_role[names.get(w, f"warp {w}")] = by_role.get(names.get(w, f"warp {w}"), 0) + count
    print("  warp-instructions by role: " + ", ".join(f"{r} {c:,}" for r, c in
                                                      by_role.items()))
    print(f"  time: {run.seconds:.2f} s, {run.executed:,} warp-instructions "
          f"({run.executed / max(run.seconds, 1e-9):,.0f} per second)")
    return 0 if ok and not run.hazards else 1


if __name__ == "__main__":
    sys.exit(main())
