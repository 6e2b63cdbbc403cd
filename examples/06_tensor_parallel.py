# %% [markdown]
# # 06 - Tensor-parallel NVFP4 GEMMs
#
# You will learn:
# - how `tk_cute.nvfp4.shard` cuts NVFP4 weights along N (column parallelism) or K (row
#   parallelism), byte for byte what quantizing the slice with the same global scale gives,
#   and which shard counts the format allows;
# - how the column- and row-parallel GEMMs of `tk_cute.distributed` combine the ranks' results
#   (torch.distributed: gloo processes here, NCCL on GPUs), and what re-associating the
#   row-parallel sum costs: an fp32 reduction stays within a bound far below the bf16 output's
#   rounding;
# - the tensor-parallel MLP block (`TensorParallelMLP`: gate and up column-parallel, down
#   row-parallel), plain and sequence parallel with the all-gather and the reduce-scatter
#   pipelined with the GEMMs, W4A4 activations travelling as NVFP4 (3.56x fewer bytes);
# - on 2+ GPUs: the block at Llama-70B sizes against torch's bf16 tensor parallelism
#   (`python -m tk_cute.bench tp`).
# Runs on a CPU: 2 gloo processes, under 10 s with their start.

# %%
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tk_cute import nvfp4
from tk_cute.compare import Table  # rows of values: text when printed, HTML in a notebook
from tk_cute.distributed import (
    TensorParallelMLP,
    assert_row_parallel_close,
    explain_mismatches,
    row_parallel_bound,
    spawn,
)
from tk_cute.nvfp4 import quantize, shard, unshard

# This file, also when run as a notebook (Jupyter runs it from examples/): the worker
# processes import the functions below from it.
HERE = Path(globals().get("__file__", "06_tensor_parallel.py")).resolve()
WORLD = 2  # gloo processes on a CPU
HIDDEN, INTERMEDIATE, ROWS = 64, 256, 8
SEED = 0


# %% [markdown]
# ## Shards
# A (N, K) weight is cut along N for column parallelism (each rank computes N / p output
# features) and along K for row parallelism (each rank a partial sum over K / p). With a given
# global scale the NVFP4 recipe encodes each 16-element block of each row on its own, so a
# shard is exactly the quantization of the slice, as long as it keeps the tensor's global
# scale and, along K, starts and ends on 16-element blocks. The scales are re-blocked (the
# 128x4 layout is re-padded for the shard's rows and columns).

# %%
g = torch.Generator().manual_seed(SEED)
w_values = torch.randn(INTERMEDIATE, HIDDEN, generator=g)
w = quantize(w_values)
rows = []
for dim, count in ((0, 2), (0, 4), (1, 2), (1, 4)):
    parts = [shard(w, dim, i, count) for i in range(count)]
    step = w.shape[dim] // count
    same = all(
        torch.equal(s.data, q.data) and torch.equal(s.scales, q.scales)
        and torch.equal(s.global_scale, q.global_scale)
        for i, s in enumerate(parts)
        for q in [quantize(w_values.narrow(dim, i * step, step), global_scale=w.global_scale)])
    back = unshard(parts, dim)
    rows.append([f"{'N' if dim == 0 else 'K'} / {count}", tuple(parts[0].shape),
                 tuple(parts[0].scales.shape), same,
                 torch.equal(back.data, w.data) and torch.equal(back.scales, w.scales)])
shards_table = Table(["cut", "shard shape", "blocked scales", "== quantize(slice, g)",
                      "unshard == w"], rows)
shards_table

# %% [markdown]
# Counts the format cannot take raise, naming the constraint: K shards must hold whole
# 16-element blocks; row shards can split anywhere, but must be equal.

# %%
def rejection(dim, count):
    try:
        shard(w, dim, 0, count)
        return "fine"
    except ValueError as e:
        return str(e)


# (A table, not prints: the worker processes below re-run this file's top level.)
rejected = Table(["cut", "error"], [[f"{'N' if d == 0 else 'K'} / {c}", rejection(d, c)]
                                    for d, c in ((1, 3), (1, 8), (0, 3))], left=2)
rejected


# %% [markdown]
# ## The tensor-parallel MLP block on 2 processes
# `tp_worker` is what every rank runs: it builds the same random block from one seed,
# quantizes it with `nvfp4.quantize_` (the single-process model), keeps its shards in a
# `TensorParallelMLP` and runs it plain (input replicated, one all-reduce) and sequence
# parallel (input rows sharded, a pipelined all-gather for gate and up, a pipelined
# reduce-scatter after down), W4A16 and W4A4. `spawn` starts the gloo processes (with NVLink
# multicast off, as on GPUs) and bounds every wait, so a failing rank cannot hang the others.

# %%
def block(seed=SEED):
    from tk_cute.bench.model import MLP

    return MLP.random(HIDDEN, INTERMEDIATE, seed=seed)


def inputs(seed=SEED + 1):
    return torch.randn(ROWS, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(
        torch.bfloat16)


def tp_worker(rank, world):
    x, out = inputs(), {}
    m = ROWS // world
    with torch.inference_mode():
        for act in ("bf16", "nvfp4"):
            single = nvfp4.quantize_(block(), activations=act)
            tp = TensorParallelMLP.from_mlp(single, activations=act)
            out[f"{act} gate"] = tp.gate(x)  # this rank's I / p columns
            out[f"{act} y"] = tp(x)  # replicated
            coarse = TensorParallelMLP.from_mlp(single, activations=act,
                                                reduce_dtype=torch.bfloat16)
            out[f"{act} y bf16 reduce"] = coarse(x)
            sp = TensorParallelMLP.from_mlp(single, activations=act, sequence_parallel=True,
                                            chunks=2)
            out[f"{act} y sp"] = sp(x[rank * m:(rank + 1) * m])  # this rank's rows
    return out


def run_tp(world=WORLD):
    """Spawn the ranks, then check what they computed against the single-process model."""
    start = time.perf_counter()
    res = spawn(f"{HERE}:tp_worker", world, timeout_s=60, join_timeout_s=180)
    wall = time.perf_counter() - start
    x, rows = inputs(), []
    with torch.inference_mode():
        for act in ("bf16", "nvfp4"):
            single = nvfp4.quantize_(block(), activations=act)
            ref, gate = single(x), single.gate(x)
            h = F.silu(gate) * single.up(x)  # what the ranks compute, bitwise
            a = quantize(h) if act == "nvfp4" else h
            wd, n = single.down.weight, INTERMEDIATE // world
            exact_cols = all(torch.equal(r[f"{act} gate"], gate[:, i * n:(i + 1) * n])
                             for i, r in enumerate(res))
            rows.append([act, "gate (column parallel)", "bitwise", exact_cols])
            d, _ = row_parallel_bound(a, wd, world)
            worst = lambda y: f"{float((y.double() - d).abs().max() / d.abs().max()):.2e}"  # noqa
            rows.append([act, "block on one process", worst(ref), "-"])
            for key, what, dtype in ((" y", "block, fp32 reduce", torch.float32),
                                     (" y bf16 reduce", "block, bf16 reduce", torch.bfloat16),
                                     (" y sp", "sequence parallel + overlap", torch.float32)):
                if key == " y sp":
                    y = torch.cat([r[act + key] for r in res])
                else:
                    y = res[0][act + key]
                    assert all(torch.equal(r[act + key], y) for r in res)  # same bits everywhere
                assert_row_parallel_close(y, a, wd, world, dtype, what)  # every element
                note = (f"{explain_mismatches(y, ref, a, wd, world)} of {y.numel()} differ "
                        f"(each explained)" if dtype == torch.float32 else
                        f"{int((y != ref).sum())} of {y.numel()} differ")
                rows.append([act, what, worst(y), note])
    gathered = {"bf16": 2 * HIDDEN, "nvfp4": HIDDEN // 2 + HIDDEN // 16}
    rows.append(["bytes per gathered row", f"bf16 {gathered['bf16']}",
                 f"NVFP4 {gathered['nvfp4']}", f"{gathered['bf16'] / gathered['nvfp4']:.2f}x"])
    rows.append(["processes", f"{world} gloo", f"{wall:.1f} s with start-up", ""])
    return Table(["activations", "what", "worst error / max |exact|", "vs single process"],
                 rows, left=2)


# %%
tp_results = run_tp() if __name__ == "__main__" else None  # pytest runs the test below
tp_results

# %% [markdown]
# Reading the table: every element of every output is within
# `tk_cute.distributed.numerics`' bound of the exact product (asserted above). The
# column-parallel layers compute the same elements as one process (bitwise, on the CPU
# reference). The row-parallel sum is re-associated across ranks: in fp32 its bound adds
# about p * 2^-24 of the magnitudes to one GEMM's, so the bf16 output differs from the
# single-process one only where the exact value lies that close to a bf16 rounding boundary
# (each such element is checked; at this size there are usually none); a bf16 reduction adds
# up to p * 2^-8 and its error shows. With p = 2 the fp32 sum is one commutative addition:
# the same bits whatever the collective's order.

# %%
def test_shards_are_the_quantized_slices():
    assert all(r[3] and r[4] for r in shards_table.rows)


def test_tp_block_on_two_gloo_processes():
    table = run_tp()  # raises if any element is outside its bound
    assert all(r[3] for r in table.rows if r[1] == "gate (column parallel)")


def gpu_worker(rank, world):
    """The block at Llama-70B sizes on NCCL: the same checks, GPU bounds (kernels)."""
    from tk_cute.bench.model import MLP

    dev = torch.device("cuda", torch.cuda.current_device())
    base = MLP.random(8192, 28672, dev, seed=0)
    x = torch.randn(256, 8192, device=dev, dtype=torch.bfloat16,
                    generator=torch.Generator(dev).manual_seed(1))
    with torch.inference_mode():
        single = nvfp4.quantize_(base, activations="bf16")
        tp = TensorParallelMLP.from_mlp(single, sequence_parallel=True, chunks=4)
        m = x.shape[0] // world
        y = tp(x[rank * m:(rank + 1) * m])
        ref = single(x)[rank * m:(rank + 1) * m]
        return float((y.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.multigpu
def test_tp_block_on_gpus():
    errs = spawn(f"{HERE}:gpu_worker", torch.cuda.device_count(), backend="nccl",
                 timeout_s=300, join_timeout_s=900)
    assert max(errs) < 2.0**-6, errs


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    print(shards_table)
    print(rejected)
    print(tp_results)
    if torch.cuda.device_count() >= 2:
        test_tp_block_on_gpus()
        print("timing: python -m tk_cute.bench tp (docs/distributed.md)")
    else:
        print(f"multi-GPU cell skipped: {torch.cuda.device_count()} CUDA GPU(s) here; the NCCL "
              f"run and `python -m tk_cute.bench tp` need 2 or more")
