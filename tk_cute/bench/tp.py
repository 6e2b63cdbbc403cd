"""A tensor-parallel MLP block on 1-8 GPUs: tk_cute NVFP4 against torch's bf16 tensor parallelism.

    python -m tk_cute.bench tp [--world 1 2 4 8] [--m 16 256 4096] [--hidden 8192]
                               [--intermediate 28672] [--chunks 4] [--rounds 20] [--json FILE]

For each world size p (at most the GPUs present) the bench spawns p NCCL processes
(`tk_cute.distributed.spawn`: multicast off, bounded waits), each holding its shards of one
random Llama-sized MLP block ``down(silu(gate(x)) * up(x))`` (hidden H, intermediate I; the
same seeded weights on every rank), sequence parallel: x's M rows arrive sharded (M / p per
rank) and leave sharded. Variants (`VARIANTS`):

- "torch bf16 TP": Megatron-LM's layout in plain torch: all-gather x (bf16, NCCL), cuBLAS
  ``F.linear`` on the bf16 weight shards, reduce-scatter the bf16 partial sums (NCCL); no
  overlap (torch's overlapped "async TP" needs symmetric memory, which stays off here);
- "tk_cute w4a16 TP": `tk_cute.distributed.TensorParallelMLP` W4A16, one gather, one
  reduce-scatter in fp32 (``chunks=1``);
- "tk_cute w4a16 TP overlap": the same with the gather and the reduce-scatter in ``--chunks``
  pieces pipelined with the GEMMs;
- "tk_cute w4a4 TP" / "tk_cute w4a4 TP overlap": W4A4, the activations quantized with the
  whole tensor's global scale and gathered as NVFP4 (3.56x fewer bytes than bf16).

Per variant and M the bench also times its communication alone (the same collectives on the
same byte counts, "comm") and its computation alone (the same GEMMs on local data, "compute"),
and reports the fraction of communication hidden: ``(comm + compute - total) / comm`` (0: none,
1: all; noise can put it slightly outside). Scaling: each variant's time at p against its time
at p = 1 on one GPU (where the collectives are skipped): speedup and efficiency (speedup / p).

Timing: each round, every rank synchronizes (a barrier), records CUDA events around one call
per weight copy and takes the time per call; the step time is the slowest rank's (an
all-reduce MAX); variants interleave round by round; medians over rounds. Cold L2: each variant
rotates through enough copies of its weight shards to exceed 3x the L2 (the p = 8 NVFP4 shards
of the default block, 50 MB, fit in an H200's 60 MB L2).

Not run yet (no multi-GPU machine so far): docs/distributed.md lists what to run. This module
imports on a CPU; `build` and `variants` build and run the variants on any process group,
gloo on a CPU included (tests/tk_cute/test_bench_variants.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F

# The collectives (and gather buffer) of tk_cute.distributed, so both sides call the same ops
from tk_cute.distributed.gemm import all_gather_tensor, gather_buffer, reduce_scatter_tensor

DEFAULT_M = [16, 256, 4096]
DEFAULT_WORLD = [1, 2, 4, 8]
BASELINE = "torch bf16 TP"
VARIANTS = [BASELINE, "tk_cute w4a16 TP", "tk_cute w4a16 TP overlap", "tk_cute w4a4 TP",
            "tk_cute w4a4 TP overlap"]
WEIGHT_BYTES = {"torch": 2.0, "tk_cute": 0.5625}  # per weight element


class TorchTP:
    """Sequence-parallel bf16 MLP shards in plain torch (cuBLAS + NCCL), the baseline."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, group=None):
        self.gate, self.up, self.down, self.group = gate, up, down, group
        self.size = dist.get_world_size(group)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        full = gather_buffer(x, self.size)
        all_gather_tensor(full, x, group=self.group)
        return full

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return y
        out = torch.empty((y.shape[0] // self.size, *y.shape[1:]), dtype=y.dtype,
                          device=y.device)
        reduce_scatter_tensor(out, y, group=self.group)
        return out

    def compute(self, full: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(full, self.gate)) * F.linear(full, self.up), self.down)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.scatter(self.compute(self.gather(x)))


def build(hidden: int, intermediate: int, group=None, device=None, seed: int = 0,
          chunks: int = 4) -> dict:
    """Every variant's model on this rank: {variant: model(x_local)}; all ranks build the same
    full block from `seed` and keep their shards (the full block is freed)."""
    from tk_cute import nvfp4
    from tk_cute.bench.model import MLP
    from tk_cute.distributed import TensorParallelMLP

    rank, size = dist.get_rank(group), dist.get_world_size(group)
    base = MLP.random(hidden, intermediate, device, seed)
    n, k = intermediate // size, intermediate // size
    rows = slice(rank * n, (rank + 1) * n)
    models = {BASELINE: TorchTP(base.gate.weight[rows].clone(), base.up.weight[rows].clone(),
                                base.down.weight[:, rank * k:(rank + 1) * k].clone(), group)}
    w4a16 = nvfp4.quantize_(base, activations="bf16")  # in place: the bf16 weights are freed
    for act in ("bf16", "nvfp4"):
        name = "w4a16" if act == "bf16" else "w4a4"
        for c, suffix in ((1, ""), (chunks, " overlap")):
            models[f"tk_cute {name} TP{suffix}"] = TensorParallelMLP.from_mlp(
                w4a16, group, activations=act, sequence_parallel=True, chunks=c)
    del w4a16
    return models


def variants(models: dict) -> dict:
    """{variant: fn(x_local) -> y_local} for `VARIANTS`, in that order."""
    return {name: models[name] for name in VARIANTS}


def components(models: dict, m_local: int, hidden: int, device) -> dict:
    """{variant: (comm(), compute())}: each variant's collectives alone (the same ops on the same
    byte counts) and its computation alone on local data, for the fraction of communication
    hidden."""
    from tk_cute import nvfp4

    tp = models[BASELINE]
    size, group = tp.size, tp.group
    M = m_local * size
    x = torch.randn(m_local, hidden, device=device, dtype=torch.bfloat16)
    full = torch.randn(M, hidden, device=device, dtype=torch.bfloat16)
    part_bf16 = torch.zeros(M, hidden, device=device, dtype=torch.bfloat16)
    part_f32 = torch.zeros(M, hidden, device=device, dtype=torch.float32)
    packed = torch.zeros(m_local, hidden // 2 + hidden // 16, device=device, dtype=torch.uint8)
    stats = torch.zeros(3, device=device)

    def gather(t):
        all_gather_tensor(gather_buffer(t, size), t, group=group)

    def scatter(t):
        reduce_scatter_tensor(torch.empty((t.shape[0] // size, *t.shape[1:]), dtype=t.dtype,
                                    device=device), t, group=group)

    def comm_bf16():  # torch: x in bf16, partial sums in bf16
        if size > 1:
            gather(x)
            scatter(part_bf16)

    def comm_tk(nv: bool):
        if size == 1:
            return
        if nv:  # the amax all-reduces of quantize_shared (gate/up input, down input)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
        gather(packed if nv else x)  # NVFP4: data + scales in one buffer
        scatter(part_f32)

    def compute_tk(mlp, nv: bool):
        a = nvfp4.quantize(full, check_finite=False) if nv else full
        g, u = nvfp4.gemm(a, mlp.gate.weight), nvfp4.gemm(a, mlp.up.weight)
        h = F.silu(g) * u
        ha = nvfp4.quantize(h, check_finite=False) if nv else h
        return nvfp4.gemm(ha, mlp.down.weight, torch.float32)

    out = {BASELINE: (comm_bf16, lambda: tp.compute(full))}
    for name in VARIANTS[1:]:
        nv = "w4a4" in name
        out[name] = (lambda nv=nv: comm_tk(nv), lambda m=models[name], nv=nv: compute_tk(m, nv))
    return out


def _weight_bytes(name: str, hidden: int, intermediate: int, size: int) -> float:
    per = WEIGHT_BYTES["torch" if name == BASELINE else "tk_cute"]
    return 3 * hidden * intermediate / size * per


def _timed(fns: dict, copies: dict, rounds: int, group) -> dict:
    """{name: median ms per call}, the slowest rank's per round (module docstring)."""
    times = {name: [] for name in fns}
    for fn_name, fn in fns.items():  # warm-up: kernels compile at a shape's first call
        for c in range(copies.get(fn_name, 1)):
            fn(c)
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            n = copies.get(name, 1)
            dist.barrier(group=group)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for c in range(n):
                fn(c)
            end.record()
            end.synchronize()
            t = torch.tensor([start.elapsed_time(end) / n], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            times[name].append(float(t))
    return {name: statistics.median(t) for name, t in times.items()}


@torch.inference_mode()
def rank_main(rank: int, world: int, opts: dict) -> list[dict] | None:
    """One rank of one world size: every M, every variant; rank 0 returns the result rows."""
    H, I, chunks = opts["hidden"], opts["intermediate"], opts["chunks"]
    dev = torch.device("cuda", torch.cuda.current_device())
    models = build(H, I, None, dev, opts["seed"], chunks)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    copies = {name: max(2, math.ceil(3 * l2 / _weight_bytes(name, H, I, world)))
              for name in VARIANTS}
    copies = {name: min(c, 8) for name, c in copies.items()}  # memory: at most 8 copies
    stacks = {name: [models[name]] + [copy.deepcopy(models[name]) for _ in range(c - 1)]
              for name, c in copies.items()}
    rows = []
    for M in opts["m"]:
        if M % world:
            continue
        m = M // world
        x = torch.randn(m, H, device=dev, dtype=torch.bfloat16,
                        generator=torch.Generator(dev).manual_seed(opts["seed"] + rank))
        ref = models[BASELINE](x).float()
        errs, names = {}, []
        for name in VARIANTS:
            try:  # also the first call of each shape (kernels compile)
                errs[name] = float((models[name](x).float() - ref).norm() / ref.norm())
                names.append(name)
            except NotImplementedError as e:  # e.g. W4A16 on Blackwell: the same on every rank
                rows.append({"world": world, "variant": name, "M": M, "skipped": str(e)})
        total = _timed({name: (lambda c, s=stacks[name], x=x: s[c](x)) for name in names},
                       copies, opts["rounds"], None)
        parts = {n: f for n, f in components(models, m, H, dev).items() if n in names}
        comm = _timed({name: (lambda c, f=f: f()) for name, (f, _) in parts.items()}, {},
                      opts["rounds"], None)
        comp = _timed({name: (lambda c, f=f: f()) for name, (_, f) in parts.items()}, {},
                      opts["rounds"], None)
        for name in names:
            hidden = ((comm[name] + comp[name] - total[name]) / comm[name]
                      if world > 1 and comm[name] > 0 else None)
            rows.append({"world": world, "variant": name, "M": M, "H": H, "I": I,
                         "ms": total[name], "comm_ms": comm[name], "compute_ms": comp[name],
                         "hidden": hidden, "rel_err_vs_bf16": errs[name],
                         "speedup": total[BASELINE] / total[name], "copies": copies[name]})
    return rows if rank == 0 else None


def _parser():
    p = argparse.ArgumentParser(prog="python -m tk_cute.bench tp",
                                description="A tensor-parallel MLP block: tk_cute NVFP4 vs torch "
                                            "bf16 TP (cuBLAS + NCCL), 1-8 GPUs.")
    p.add_argument("--world", type=int, nargs="+", default=DEFAULT_WORLD,
                   help="GPU counts to run (those above the GPUs present are skipped)")
    p.add_argument("--m", type=int, nargs="+", default=DEFAULT_M, help="tokens (activation rows)")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--intermediate", type=int, default=28672)
    p.add_argument("--chunks", type=int, default=4, help="pieces per rank of the overlap")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="per world size, seconds")
    p.add_argument("--json", help="write every result to this JSON file")
    return p


def table(rows: list[dict]) -> str:
    """The result rows as text, with the scaling against p = 1 where it was run."""
    one = {(r["variant"], r["M"]): r["ms"] for r in rows if r["world"] == 1 and "ms" in r}
    lines = [("| p | variant                  |    M |   time us | vs torch | comm us | "
              "compute us | hidden | vs p=1 (eff.) | rel err vs bf16")]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['world']} | {r['variant']:<24} | {r['M']:4d} | skipped: "
                         f"{r['skipped']}")
            continue
        base = one.get((r["variant"], r["M"]))
        scale = (f"{base / r['ms']:5.2f}x ({base / r['ms'] / r['world']:.0%})" if base
                 else "      -      ")
        hid = f"{r['hidden']:6.0%}" if r["hidden"] is not None else "     -"
        lines.append(f"| {r['world']} | {r['variant']:<24} | {r['M']:4d} | {r['ms'] * 1e3:9.1f} | "
                     f"{r['speedup']:7.3f}x | {r['comm_ms'] * 1e3:7.1f} | "
                     f"{r['compute_ms'] * 1e3:10.1f} | {hid} | {scale} | "
                     f"{r['rel_err_vs_bf16']:.4f}")
    return "\n".join(lines)


def main(argv=None):
    from tk_cute.distributed import spawn

    args = _parser().parse_args(argv)
    gpus = torch.cuda.device_count()
    worlds = [w for w in args.world if 1 <= w <= gpus]
    if not worlds:
        print(f"python -m tk_cute.bench tp needs CUDA GPUs (found {gpus}; asked for "
              f"{args.world})")
        return 2
    opts = {"hidden": args.hidden, "intermediate": args.intermediate, "chunks": args.chunks,
            "rounds": args.rounds, "seed": args.seed, "m": args.m}
    from tk_cute.bench.harness import environment

    env = environment()
    print(env)
    print(f"TP MLP block, hidden {args.hidden}, intermediate {args.intermediate}, sequence "
          f"parallel, overlap chunks {args.chunks}; worlds {worlds}; NVLink multicast off")
    rows = []
    for w in worlds:
        res = spawn(rank_main, w, opts, backend="nccl", timeout_s=args.timeout,
                    join_timeout_s=2 * args.timeout + 120)
        rows += res[0]
        print(table(rows), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"environment": env, "results": rows}, f, indent=1)
    return 0
