"""GEMM benchmark: tk_cute's Hopper GEMM beside cuBLAS (bf16 matmul, fp8 `_scaled_mm`) and
CUTLASS's CuTe DSL persistent Hopper GEMM, same process, same inputs, cold L2.

    python -m tk_cute.bench gemm [--mnk 8192,8192,8192 ...] [--random N [--seed S]] [--peer PATH]

`--random N` draws N shapes (`random_shapes`: seeded, log-uniform M, N, K with 16-byte rows)
instead of the listed ones and ends with a summary of tk_cute against cuBLAS over them
(`--part I/P`: the I-th of P runs of them, for a sweep longer than one command may take).
Every tk_cute variant's C is checked element by element before it is timed
(`harness.checked_call`); the run ends with the count (exit status 1 where one failed).

`--peer` is the path of CUTLASS's
`examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py` (public
CUTLASS repository, tag v4.7.0 or main at 7107b05; not vendored: copy it into the git-ignored
`.peers/`). The peer runs with its own defaults (tile 128x256, cluster 1x1). `--nb`,
`--supergroups` and `--clusters` add forced tk_cute configs beside the default
(`--splits`: the plan's tiles in split-K K ranges; `--pdl`: the plan with `Config.PDL`, the
programmatic dependent launch, the other way; `--candidates`: every transposed
plan `dense_tuning.swap_plan` weighs, up to 400 rows; `--unshifted`: the plan with its edge tiles
left on the grid).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util

import torch

from tk_cute.bench.harness import (
    HEADER,
    bench,
    checked_call,
    environment,
    host_overhead,
    input_sets,
    row,
)
from tk_cute.runtime import resident_clusters

# The square and LLM shapes, then ragged ones whose tiles do not fill the rounds evenly (odd,
# prime and few-rows M, some on the transposed plan; N off the tile widths; the issue's
# 4000x5000x4096)
DEFAULT_SHAPES = ["8192,8192,8192", "4096,4096,4096", "4096,14336,4096", "4096,4096,14336",
                  "4000,5000,4096", "1000,5000,4096", "997,5000,4096", "2056,2056,4096",
                  "3000,384,4096", "257,8192,4096", "300,4096,4096", "129,8192,8192",
                  "128,4096,4096", "64,8192,4096", "16,8192,8208"]


PEER_CLASS = "HopperWgmmaGemmPersistentKernel"
RANDOM_MAX = 16384  # the random shapes' largest M, N, K


def ours(config=None):
    """A tk_cute variant on an input set (a, b, C): ``tk_cute.gemm(a, b, config=config, out=d)``
    (`d`: the poisoned C of `harness.checked_call`, else a new one)."""
    import tk_cute

    return lambda s, d=None: tk_cute.gemm(s[0], s[1], config=config, out=d)


def random_shapes(n: int, seed: int = 0) -> list[str]:
    """`n` seeded "M,N,K" shapes: each dimension log-uniform (M in 1..RANDOM_MAX, N and K in
    16..RANDOM_MAX), N and K rounded to multiples of 16 (16-byte rows of bf16 and fp8
    operands and bf16 C), so small K, few rows and ragged tiles all come up."""
    import math
    import random

    rng = random.Random(seed)

    def draw(lo: int, step: int) -> int:
        v = math.exp(rng.uniform(math.log(lo), math.log(RANDOM_MAX)))
        return max(lo, round(v / step) * step)

    return [f"{draw(1, 1)},{draw(16, 16)},{draw(16, 16)}" for _ in range(n)]


def part(shapes: list, which: str) -> list:
    """The I-th of P contiguous, near-equal runs of `shapes` (`which` = "I/P", 1 <= I <= P)."""
    try:
        i, p = map(int, which.split("/"))
    except ValueError:
        i = p = 0
    if not 1 <= i <= p:
        raise ValueError(f"--part takes I/P with 1 <= I <= P, got {which!r}")
    return shapes[(i - 1) * len(shapes) // p:i * len(shapes) // p]


def summary(ratios: dict[str, float], floor: float = 0.9) -> str:
    """A line over {shape: tk_cute speedup over cuBLAS}: geometric mean, the worst shape and
    how many are below `floor`."""
    import statistics

    if not ratios:
        return "no shapes timed"
    worst = min(ratios, key=ratios.get)
    geo = statistics.geometric_mean(ratios.values())
    below = sum(r < floor for r in ratios.values())
    return (f"{len(ratios)} shapes: geometric mean {geo:.3f}x cuBLAS, worst {ratios[worst]:.3f}x "
            f"({worst}), {below} below {floor}x")


def peer_kernel(path):
    """CUTLASS's persistent Hopper GEMM loaded from `path`, with its own defaults: fp32
    accumulators, tile 128x256, cluster 1x1."""
    import cutlass

    spec = importlib.util.spec_from_file_location("cutlass_peer_gemm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, PEER_CLASS)(cutlass.Float32, (128, 256), (1, 1), 1, True)


def _peer(path, dtype, sms, kernel=None):
    """A callable running CUTLASS's persistent Hopper GEMM (`kernel`, default
    `peer_kernel(path)`) on (a, b, c) torch tensors, and its class's line count."""
    import cutlass.cute as cute

    from tk_cute.runtime import as_cute, batched, stream

    kernel = kernel if kernel is not None else peer_kernel(path)
    compiled = {}

    def run(a, b, c):
        args = [as_cute(batched(t), leading_dim=1) for t in (a, b, c)]
        if "fn" not in compiled:
            compiled["fn"] = cute.compile(kernel, *args, sms, stream())
        compiled["fn"](*args, stream())

    return run, _class_lines(path, PEER_CLASS)


def _parse_plan(text: str):
    """'MbxNb:CMxCN' (or with ':t', transposed) -> (plan, transposed) for
    `dense_tuning.plan_config`."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "t"):
        raise ValueError(f"a plan is MbxNb:CMxCN or MbxNb:CMxCN:t, got {text!r}")
    (mb, nb), cluster = (tuple(map(int, p.split("x"))) for p in parts[:2])
    return (mb, nb, cluster), len(parts) == 3


def _class_lines(path, name) -> int:
    tree = ast.parse(open(path).read())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return node.end_lineno - node.lineno + 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tk_cute.bench gemm")
    p.add_argument("--mnk", nargs="+", default=DEFAULT_SHAPES)
    p.add_argument("--random", type=int, default=0, metavar="N",
                   help="time N seeded random shapes (`random_shapes`) instead of --mnk")
    p.add_argument("--seed", type=int, default=0, help="the random shapes' seed")
    p.add_argument("--part", default="1/1", metavar="I/P",
                   help="time the I-th of P equal runs of the shapes, in order (a sweep too long "
                        "for one command: e.g. --random 100 --part 1/2, then 2/2)")
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float8_e4m3fn"])
    p.add_argument("--peer", default=None, help="path of CUTLASS dense_gemm_persistent.py")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--supergroups", type=int, nargs="*", default=[],
                   help="also time these SUPERGROUP_SIZE values (default config: 8)")
    p.add_argument("--nb", type=int, nargs="*", default=[],
                   help="also time these tile widths, each in the cluster shape "
                        "dense_tuning.tile_plan gives it (--clusters 1x1: none)")
    p.add_argument("--clusters", nargs="*", default=[],
                   help="also time these cluster shapes, e.g. 2x1 1x2 (TMA multicast)")
    p.add_argument("--unshifted", action="store_true",
                   help="also time the plan (and a transposed plan's direct one) with its edge "
                        "tiles left on the tile grid, past the tensors (`Config.SHIFT_EDGES` "
                        "off)")
    p.add_argument("--candidates", action="store_true",
                   help="also time every transposed plan `dense_tuning.swap_candidates` gives "
                        "shapes of up to SWAP_MAX_M rows (what `transposed_time` is fitted to)")
    p.add_argument("--plans", nargs="*", default=[],
                   help="also time these plans, each MbxNb:CMxCN (a C^T plan: MbxNb:CMxCN:t, "
                        "Mb of N's rows by Nb of M's), e.g. 192x176:1x1 128x112:2x1:t")
    p.add_argument("--splits", type=int, nargs="*", default=[],
                   help="also time the unsplit plan's tiles in these split-K range counts "
                        "(`Config.SPLIT_K`; those the shape's K steps and the CTAs the GPU "
                        "holds allow), and the unsplit plan where the plan splits")
    p.add_argument("--pdl", action="store_true",
                   help="also time the plan with the programmatic dependent launch the other "
                        "way (`Config.PDL`, planned where a CTA's work is short: each call of "
                        "the timed chain starts during the one before)")
    p.add_argument("--eager", action="store_true",
                   help="time eager calls (host overhead included) instead of CUDA-graph replay")
    args = p.parse_args(argv)

    import tk_cute
    from tk_cute import dense_gemm as gemm_mod
    from tk_cute.kernels.gemm.gemm_sm90 import Config
    from tk_cute.tuning import dense_sm90 as dense_tuning

    print(environment())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("timing:", "eager calls" if args.eager else "CUDA graph replay (GPU time; host "
          "overhead reported below)")
    shapes = part(random_shapes(args.random, args.seed) if args.random else args.mnk, args.part)
    ratios = {"tk_cute": {}}  # name -> {shape: speedup over cuBLAS}
    checked, wrong = [], []  # tk_cute calls whose C was checked; those outside the bound
    print(HEADER)
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        peer = _peer(args.peer, dtype, sms) if args.peer else None
        for mnk in dict.fromkeys(shapes):
            M, N, K = map(int, mnk.split(","))
            if dtype.itemsize == 1 and (N % 16 or K % 16):
                print(f"| skipped {mnk} [{dtype_name}]: cuBLAS fp8 (torch._scaled_mm) needs N "
                      f"and K multiples of 16")
                continue

            def make():
                a = torch.randn(M, K, device="cuda").to(dtype)
                b = torch.randn(N, K, device="cuda").to(dtype)
                return a, b, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)

            sets = input_sets(make, (M * K + N * K) * dtype.itemsize + M * N * 2)
            one = torch.ones((), device="cuda")
            if dtype.itemsize == 2:
                base = "cuBLAS bf16 matmul"
                cublas = lambda s: torch.matmul(s[0], s[1].t())  # noqa: E731
            else:
                base = "cuBLAS fp8 _scaled_mm"
                cublas = lambda s: torch._scaled_mm(  # noqa: E731
                    s[0], s[1].t(), one, one, out_dtype=torch.bfloat16)
            variants = {base: cublas, "tk_cute": ours()}
            quads = resident_clusters(torch.device("cuda"), 4)
            plan = gemm_mod.config_for(*sets[0][:2])  # what `tk_cute.gemm` runs here
            notes = {"tk_cute": f"{plan.Mb}x{plan.Nb} tiles, cluster "
                                f"{plan.CLUSTER_M}x{plan.CLUSTER_N}"}
            if plan.TRANSPOSE_C:  # the transposed plan, and the direct one beside it
                notes["tk_cute"] = (f"transposed: C^T = B A^T in {plan.Mb}x{plan.Nb} tiles "
                                    f"(N x M), cluster {plan.CLUSTER_M}x{plan.CLUSTER_N}")
                direct = dense_tuning.default_config(dtype, torch.bfloat16, M, N, sms,
                                                 quads=quads, swap_ab=False)
                variants["tk_cute direct"] = ours(direct)
                notes["tk_cute direct"] = (f"{direct.Mb}x{direct.Nb} tiles, cluster "
                                           f"{direct.CLUSTER_M}x{direct.CLUSTER_N}")
            if plan.SHIFT_EDGES:
                notes["tk_cute"] += "; edge tiles shifted inside"
            if plan.SPLIT_K > 1:
                notes["tk_cute"] += f"; split-K in {plan.SPLIT_K} K ranges"
            if plan.PDL:
                notes["tk_cute"] += "; PDL"
            rows, cols = (N, M) if plan.TRANSPOSE_C else (M, N)
            counts = dense_tuning.split_counts(rows, cols, K, plan, sms, quads)
            for split in sorted({1, *args.splits} - {plan.SPLIT_K}) if args.splits else ():
                if split == 1 or split in counts:
                    tiles = (plan.Mb, plan.Nb, (plan.CLUSTER_M, plan.CLUSTER_N))
                    cfg = dense_tuning.plan_config(dtype, torch.bfloat16, M, N, tiles,
                                                   plan.TRANSPOSE_C, split, plan.PDL)
                    variants[f"tk_cute split {split}"] = ours(cfg)
            for name in ("tk_cute", "tk_cute direct") if args.unshifted else ():
                shifted = plan if name == "tk_cute" else dense_tuning.default_config(
                    dtype, torch.bfloat16, M, N, sms, quads=quads, swap_ab=False)
                if shifted.SHIFT_EDGES and (name == "tk_cute" or shifted != plan):
                    unshifted = dataclasses.replace(shifted, SHIFT_EDGES=False)
                    variants[f"{name} unshifted"] = ours(unshifted)
            for cand in dense_tuning.swap_candidates(M) if (args.candidates
                                                        and M <= dense_tuning.SWAP_MAX_M) else ():
                cfg = dense_tuning.plan_config(dtype, torch.bfloat16, M, N, cand, transposed=True)
                name = f"tk_cute C^T {cand[0]}x{cand[1]}, {cand[2][0]}x{cand[2][1]}"
                if cfg != plan:
                    variants[name] = ours(cfg)
            for text in args.plans:
                cfg = dense_tuning.plan_config(dtype, torch.bfloat16, M, N, *_parse_plan(text))
                variants[f"tk_cute {text}"] = ours(cfg)
            for nb in args.nb:
                cfg = dense_tuning.default_config(dtype, torch.bfloat16, M, N, sms, nb=nb,
                                              quads=quads)
                variants[f"tk_cute Nb={nb}"] = ours(cfg)
                notes[f"tk_cute Nb={nb}"] = (f"{cfg.Mb} rows, cluster "
                                             f"{cfg.CLUSTER_M}x{cfg.CLUSTER_N}")
            for sg in args.supergroups:
                cfg = Config(dtype=dtype_name, SUPERGROUP_SIZE=sg)
                variants[f"tk_cute supergroup {sg}"] = ours(cfg)
            for cl in args.clusters:
                cm, cn = map(int, cl.split("x"))
                for nb in args.nb or [plan.Nb]:
                    cfg = dataclasses.replace(dense_tuning.default_config(
                        dtype, torch.bfloat16, M, N, sms, nb=nb, quads=quads),
                        CLUSTER_M=cm, CLUSTER_N=cn)
                    variants[f"tk_cute cluster {cl} Nb={nb}"] = ours(cfg)
            if args.pdl:
                other = dataclasses.replace(plan, PDL=not plan.PDL)
                variants["tk_cute without pdl" if plan.PDL else "tk_cute pdl"] = ours(other)
            if peer:
                variants["CUTLASS CuTe DSL peer"] = lambda s: peer[0](*s)
            for name in [n for n in variants if n.startswith("tk_cute")]:
                what = f"{name} {M}x{N}x{K} [{dtype_name}]"
                try:  # D checked element by element before it is timed
                    checked_call(variants[name], sets[0], (M, N), torch.bfloat16,
                                 *sets[0][:2], what)
                    checked.append(what)
                except AssertionError as e:
                    print(f"| {what} | failed: {e}")
                    wrong.append(what)
                    variants.pop(name)
            res = bench(variants, sets, rounds=args.rounds, graph=not args.eager)
            for name in ("tk_cute", "tk_cute pdl", "tk_cute without pdl"):
                if name in res:
                    ratios.setdefault(name, {})[f"{M}x{N}x{K} [{dtype_name}]"] = (
                        res[base].ms / res[name].ms)
            for name, r in res.items():
                print(row(f"{name} [{dtype_name}]", f"{M}x{N}x{K}", r.ms, 2 * M * N * K,
                          baseline_ms=res[base].ms,
                          extra=f"spread {r.spread:.2f}" + (f"; {notes[name]}" if name in notes
                                                             else "")))
    for name, r in ratios.items():
        print(f"{name} vs cuBLAS:", summary(r))
    print(f"tk_cute outputs checked element by element: {len(checked)} calls, "
          f"{len(wrong)} outside the bound" + (": " + ", ".join(wrong) if wrong else ""))
    a = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    print(f"host overhead per call at 256^3 (us): tk_cute.gemm "
          f"{host_overhead(lambda s: tk_cute.gemm(*s), (a, a)):.1f}, torch.matmul "
          f"{host_overhead(lambda s: torch.matmul(s[0], s[1].t()), (a, a)):.1f}")
    print("compile seconds:", {str(k[0]): round(v, 2)
                               for k, v in gemm_mod.compile_seconds().items()})
    if args.peer:
        from tk_cute.kernels.gemm import gemm_sm90

        lines = len(open(gemm_sm90.__file__).read().splitlines())
        print(f"source lines: tk_cute gemm_sm90.py {lines} (+ lcf template, vocabulary); "
              f"CUTLASS HopperWgmmaGemmPersistentKernel class {peer[1]}")
    return 1 if wrong else 0
