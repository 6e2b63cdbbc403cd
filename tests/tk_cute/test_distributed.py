"""`tk_cute.distributed`: tensor-parallel NVFP4 GEMMs and modules on 2 and 4 gloo processes (CPU,
the exact reference path), checked against the single-process results computed here, plus bad
input that must raise on every rank; multi-GPU tests (marker multigpu) for NCCL.

One spawn per world size runs every case (a child costs ~2 s of imports on the 2-core CI
machine); the children return their outputs and the tests below compare them. Every wait is
bounded: the collectives' timeout is 60 s (`spawn`'s default), the join timeout 180 s.

Numerics asserted: column-parallel results, the sequence-parallel gathers and
`quantize_shared` are bitwise the single-process ones; row-parallel results are within
`tk_cute.distributed.numerics`' element-wise bound of the exact product, every difference from
the single-process result is explained by a rounding boundary within that bound, and for p = 2
(one commutative addition) the fp32 reduction equals ``fl(P0 + P1)`` computed here bitwise.
"""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch
import torch.distributed as dist

from tk_cute import nvfp4
from tk_cute.distributed import (
    MULTICAST_OFF,
    ColumnParallelLinear,
    RowParallelLinear,
    SpawnError,
    TensorParallelMLP,
    all_gather_gemm,
    assert_row_parallel_close,
    column_parallel_gemm,
    explain_mismatches,
    gemm_reduce_scatter,
    quantize_shared,
    row_parallel_gemm,
    spawn,
)
from tk_cute.nvfp4 import quantize, shard

M, K, N = 24, 128, 48  # rows (24 / 4 = 6 per rank: uneven chunks of 4), K / 4 = 32, N / 4 = 12
H, I = 64, 128  # the MLP block: I / 4 = 32 (K shards on 16-element blocks)
CHUNKS = 4
SEED = 1234


def data(seed: int = SEED) -> dict:
    """The inputs every process builds alike (a seeded generator: no communication needed)."""
    from tk_cute.bench.model import MLP

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = torch.randn(N, K, generator=g) * torch.exp2(torch.randint(-3, 4, (N, 1), generator=g))
    return {"x": x, "w": w, "wq": quantize(w), "mlp": MLP.random(H, I, seed=seed),
            "xm": torch.randn(M, H, generator=g).to(torch.bfloat16)}


def _parts(q: nvfp4.NVFP4Tensor) -> tuple:
    return q.data, q.scales, q.global_scale


def _raises(fn) -> tuple[str, str] | None:
    """(type, message) of what fn raised, None if it returned; then a barrier-like all-reduce
    proves the group is still in step (no rank left waiting in another collective)."""
    try:
        fn()
        out = None
    except (TypeError, ValueError, NotImplementedError) as e:
        out = (type(e).__name__, str(e))
    check = torch.ones(1)
    dist.all_reduce(check)
    assert int(check) == dist.get_world_size()
    return out


def worker(rank: int, p: int) -> dict:
    """Every case on one rank of a p-process gloo group; returns outputs for the tests."""
    d = data()
    x, wq = d["x"], d["wq"]
    kl, m = K // p, M // p
    xk = x[:, rank * kl:(rank + 1) * kl]  # this rank's K slice
    xr = x[rank * m:(rank + 1) * m]  # this rank's rows (sequence parallel)
    w_n, w_k = shard(wq, 0, rank, p), shard(wq, 1, rank, p)
    out = {"time": {}, "env": {k: os.environ.get(k) for k in MULTICAST_OFF}}
    t0 = time.perf_counter()

    # Column parallel (W cut along N): W4A16 and W4A4, local slice and gathered.
    out["col"] = column_parallel_gemm(x, w_n, out_features=N)
    out["col gathered"] = column_parallel_gemm(x, w_n, gather_output=True)
    out["col w4a4 gathered"] = column_parallel_gemm(quantize(x), w_n, gather_output=True,
                                                    out_dtype=torch.float32)
    # Row parallel (W and x cut along K).
    out["row"] = row_parallel_gemm(xk, w_k, in_features=K)
    out["row fp32 out"] = row_parallel_gemm(xk, w_k, out_dtype=torch.float32)
    out["row bf16 reduce"] = row_parallel_gemm(xk, w_k, reduce_dtype=torch.bfloat16)
    out["row reduce_scatter"] = row_parallel_gemm(xk, w_k, reduce="reduce_scatter")
    out["row w4a4"] = row_parallel_gemm(shard(quantize(x), 1, rank, p), w_k)
    out["partial fp32"] = nvfp4.gemm(xk, w_k, torch.float32)  # for the p = 2 exact-order check
    # Overlapped forms: chunked gather + GEMM, GEMM + chunked reduce-scatter.
    w2 = shard(quantize(d["w"][:, :].flip(0)), 0, rank, p)  # a second weight for one gather
    out["ag"] = all_gather_gemm(xr, w_n)
    out["ag chunks"] = all_gather_gemm(xr, [w_n, w2], chunks=CHUNKS)
    out["ag 3-d"] = all_gather_gemm(xr.reshape(m // 2, 2, K), w_n, chunks=2)
    xq = quantize_shared(xr)
    out["qs rows"] = _parts(xq)
    out["qs k"] = _parts(quantize_shared(xk))
    out["ag w4a4 chunks"] = all_gather_gemm(xq, w_n, chunks=CHUNKS, out_dtype=torch.float32)
    out["rs chunks"] = gemm_reduce_scatter(xk, w_k, chunks=CHUNKS)
    out["rs w4a4 chunks"] = gemm_reduce_scatter(quantize_shared(xk), w_k, chunks=CHUNKS,
                                                out_dtype=torch.float32)
    # UE5M3 block scales (Rubin's): the functional forms take them (the CPU references).
    w5 = quantize(d["w"], scale_dtype="ue5m3")
    out["col ue5m3 gathered"] = column_parallel_gemm(x, shard(w5, 0, rank, p), gather_output=True)
    out["qs k ue5m3"] = _parts(quantize_shared(xk, scale_dtype="ue5m3"))
    out["ag ue5m3 chunks"] = all_gather_gemm(quantize_shared(xr, scale_dtype="ue5m3"),
                                             shard(w5, 0, rank, p), chunks=CHUNKS)
    out["time"]["gemms"] = time.perf_counter() - t0

    # Modules: the MLP block, plain and sequence parallel, W4A16 and W4A4.
    t0 = time.perf_counter()
    xm = d["xm"]
    with torch.inference_mode():
        for act in ("bf16", "nvfp4"):
            single = nvfp4.quantize_(copy.deepcopy(d["mlp"]), activations=act)
            tp = TensorParallelMLP.from_mlp(single, activations=act)
            out[f"mlp {act}"] = tp(xm)
            sp = TensorParallelMLP.from_mlp(single, activations=act, sequence_parallel=True,
                                            chunks=2)
            out[f"mlp {act} sp"] = sp(xm[rank * (M // p):(rank + 1) * (M // p)])
        # More pieces than rows per rank: the modules take one piece per row.
        many = TensorParallelMLP.from_mlp(single, sequence_parallel=True, chunks=64)
        out["mlp sp chunks clamped"] = many(xm[rank * (M // p):(rank + 1) * (M // p)])
        # Linears with biases; a state dict round trip into an empty module of the same shape.
        lin = torch.nn.Linear(K, N, bias=True)
        with torch.no_grad():
            lin.weight.copy_(d["w"])
            lin.bias.copy_(torch.arange(N) / 8)
        lin = lin.to(torch.bfloat16)
        col = ColumnParallelLinear.from_linear(lin, gather_output=True)
        out["col linear"] = col(x)
        fresh = ColumnParallelLinear(K, N, bias=True, gather_output=True)
        fresh.load_state_dict(col.state_dict())
        out["col linear reloaded"] = fresh(x)
        row = RowParallelLinear.from_linear(lin)
        out["row linear"] = row(xk)
        out["state dict keys"] = sorted(col.state_dict())
    out["time"]["modules"] = time.perf_counter() - t0

    # Bad input: each must raise on EVERY rank, and leave the group in step.
    t0 = time.perf_counter()
    bad = {}
    other_k = quantize(torch.randn(w_n.M, K + 16, generator=torch.Generator().manual_seed(1)))
    bad["K disagrees"] = _raises(lambda: column_parallel_gemm(
        x if rank == 0 else torch.cat([x, x[:, :16]], 1), w_n if rank == 0 else other_k))
    own = quantize(d["w"][rank * (N // p):(rank + 1) * (N // p)])  # each slice its own amax
    bad["global scale disagrees"] = _raises(lambda: column_parallel_gemm(x, own))
    bad["one rank's dtype"] = _raises(lambda: column_parallel_gemm(
        x.float() if rank == 1 else x, w_n))
    half = shard(wq, 0, rank, 2 * p)  # cut for twice as many ranks
    bad["group size"] = _raises(lambda: column_parallel_gemm(x, half, out_features=N))
    bad["row group size"] = _raises(lambda: row_parallel_gemm(
        x[:, :K // (2 * p)], shard(wq, 1, rank, 2 * p), in_features=K))
    kr = K // p if rank else K // p + 16  # rank 0's K slice is 16 wider
    bad["row K disagrees"] = _raises(lambda: row_parallel_gemm(
        torch.zeros(M, kr, dtype=torch.bfloat16), quantize(torch.ones(N, kr))))
    bad["column count"] = _raises(lambda: ColumnParallelLinear(K, 2 * p + 1))
    bad["row count"] = _raises(lambda: RowParallelLinear(16 * p + 8 * p, N))
    bad["reduce_scatter rows"] = _raises(lambda: gemm_reduce_scatter(xk[:p + 1], w_k))
    bad["chunks"] = _raises(lambda: all_gather_gemm(xr, w_n, chunks=m + 1))
    nan = xr.clone()
    if rank == p - 1:
        nan[0, 0] = float("nan")
    bad["NaN on one rank"] = _raises(lambda: quantize_shared(nan))
    bad["bad input on one rank"] = _raises(lambda: quantize_shared(
        xr[:, :8] if rank == 0 else xr))
    bad["scale formats disagree"] = _raises(lambda: column_parallel_gemm(
        x, shard(w5, 0, rank, p) if rank == 0 else w_n))
    bad["module ue5m3"] = _raises(lambda: ColumnParallelLinear.from_nvfp4(w5))
    mod = RowParallelLinear.from_shard(quantize(d["w"][:, rank * kl:(rank + 1) * kl]),
                                       in_features=K)
    bad["module shards"] = _raises(lambda: mod(xk))
    out["bad"] = bad
    out["time"]["bad input"] = time.perf_counter() - t0
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["p2", "p4"])
def run(request):
    p = request.param
    t0 = time.perf_counter()
    results = spawn(worker, p, timeout_s=60, join_timeout_s=180)
    wall = time.perf_counter() - t0
    print(f"{p} gloo processes: {wall:.1f} s wall; per rank: {results[0]['time']}")
    return p, results, data()


def test_column_parallel_is_exact(run):
    p, res, d = run
    x, wq = d["x"], d["wq"]
    full = nvfp4.gemm(x, wq)
    n = N // p
    for r, out in enumerate(res):
        assert torch.equal(out["col"], full[:, r * n:(r + 1) * n])
        assert torch.equal(out["col gathered"], full)
        assert torch.equal(out["col w4a4 gathered"], nvfp4.gemm(quantize(x), wq, torch.float32))


def test_row_parallel_within_the_reduction_bound(run):
    p, res, d = run
    x, wq = d["x"], d["wq"]
    single = nvfp4.gemm(x, wq)  # the exact reference, rounded once
    mism = {}
    for r, out in enumerate(res):
        assert torch.equal(out["row"], res[0]["row"])  # every rank receives the same bits
        assert_row_parallel_close(out["row"], x, wq, p, what=f"rank {r}")
        assert_row_parallel_close(out["row fp32 out"], x, wq, p, what=f"fp32 out, rank {r}")
        assert_row_parallel_close(out["row bf16 reduce"], x, wq, p, torch.bfloat16,
                                  what=f"bf16 reduce, rank {r}")
        mism[r] = explain_mismatches(out["row"], single, x, wq, p)
        xq = quantize(x)
        assert_row_parallel_close(out["row w4a4"], xq, wq, p, what=f"W4A4, rank {r}")
        explain_mismatches(out["row w4a4"], nvfp4.gemm(xq, wq), xq, wq, p)
    scattered = torch.cat([out["row reduce_scatter"] for out in res])
    assert_row_parallel_close(scattered, x, wq, p, what="reduce_scatter")
    explain_mismatches(scattered, single, x, wq, p)
    # The bf16 reduction is coarser: its worst element error exceeds the fp32 one's.
    exact = (x.double() @ wq.dequantize(torch.float64).T)
    err = lambda y: float((y.double() - exact).abs().max())
    assert err(res[0]["row fp32 out"]) <= err(res[0]["row bf16 reduce"])
    print(f"p={p}: bf16 outputs differing from the single-process result: {mism}")


def test_two_ranks_sum_in_a_fixed_order(run):
    # p = 2: one fp32 addition, commutative: the collective's result is fl(P0 + P1) exactly.
    p, res, _ = run
    if p != 2:
        pytest.skip("p >= 3: the sum's order is the collective's (bounded, not fixed)")
    total = res[0]["partial fp32"] + res[1]["partial fp32"]
    for out in res:
        assert torch.equal(out["row fp32 out"], total)
        assert torch.equal(out["row"], total.to(torch.bfloat16))


def test_overlapped_gather_and_quantize_shared_are_exact(run):
    p, res, d = run
    x, wq = d["x"], d["wq"]
    w2q = quantize(d["w"].flip(0))
    xq = quantize(x)
    for r, out in enumerate(res):
        w_n, w2 = shard(wq, 0, r, p), shard(w2q, 0, r, p)
        want = nvfp4.gemm(x, w_n)
        assert torch.equal(out["ag"], want)
        assert torch.equal(out["ag chunks"][0], want)
        assert torch.equal(out["ag chunks"][1], nvfp4.gemm(x, w2))
        assert torch.equal(out["ag 3-d"], want.reshape(M // 2, 2, -1))
        assert torch.equal(out["ag w4a4 chunks"], nvfp4.gemm(xq, w_n, torch.float32))
        for key, dim in (("qs rows", 0), ("qs k", 1)):
            s = shard(xq, dim, r, p)
            for got, want_part in zip(out[key], _parts(s)):
                assert torch.equal(got, want_part), (key, r)
        # UE5M3: the same, with the format's own floor and denominator for the global scale.
        w5, x5 = quantize(d["w"], scale_dtype="ue5m3"), quantize(x, scale_dtype="ue5m3")
        assert torch.equal(out["col ue5m3 gathered"], nvfp4.gemm(x, w5))
        for got, want_part in zip(out["qs k ue5m3"], _parts(shard(x5, 1, r, p))):
            assert torch.equal(got, want_part), ("qs k ue5m3", r)
        assert torch.equal(out["ag ue5m3 chunks"], nvfp4.gemm(x5, shard(w5, 0, r, p)))


def test_overlapped_reduce_scatter_within_the_bound(run):
    p, res, d = run
    x, wq = d["x"], d["wq"]
    xq = quantize(x)
    ys = torch.cat([out["rs chunks"] for out in res])
    assert_row_parallel_close(ys, x, wq, p, what="gemm_reduce_scatter chunks")
    explain_mismatches(ys, nvfp4.gemm(x, wq), x, wq, p)
    y4 = torch.cat([out["rs w4a4 chunks"] for out in res])
    assert_row_parallel_close(y4, xq, wq, p, what="W4A4 gemm_reduce_scatter chunks")


def test_mlp_block_matches_the_single_process_model(run):
    import torch.nn.functional as F

    p, res, d = run
    xm = d["xm"]
    with torch.inference_mode():
        for act in ("bf16", "nvfp4"):
            single = nvfp4.quantize_(copy.deepcopy(d["mlp"]), activations=act)
            ref = single(xm)
            h = F.silu(single.gate(xm)) * single.up(xm)  # bitwise what the TP ranks compute
            a = quantize(h) if act == "nvfp4" else h
            w_down = single.down.weight
            for r, out in enumerate(res):
                assert_row_parallel_close(out[f"mlp {act}"], a, w_down, p, what=f"{act} r{r}")
                explain_mismatches(out[f"mlp {act}"], ref, a, w_down, p)
            y_sp = torch.cat([out[f"mlp {act} sp"] for out in res])
            assert_row_parallel_close(y_sp, a, w_down, p, what=f"{act} sequence parallel")
            explain_mismatches(y_sp, ref, a, w_down, p)
        y_many = torch.cat([out["mlp sp chunks clamped"] for out in res])  # W4A4: the last act
        assert_row_parallel_close(y_many, a, w_down, p, what="chunks clamped to the rows")
        explain_mismatches(y_many, ref, a, w_down, p)


def test_linears_with_bias_and_state_dict(run):
    p, res, d = run
    x = d["x"]
    wq = quantize(d["w"].to(torch.bfloat16))
    bias = (torch.arange(N) / 8).to(torch.bfloat16)
    from tk_cute.distributed import row_parallel_bound

    # The row layer adds the full bias once, after the reduction: one more bf16 rounding.
    d, bound = row_parallel_bound(x, wq, p)
    bound = bound + 2.0**-8 * (d.abs() + bound + bias.double().abs())
    for r, out in enumerate(res):
        assert torch.equal(out["col linear"], nvfp4.gemm(x, wq) + bias)
        assert torch.equal(out["col linear reloaded"], out["col linear"])
        assert out["state dict keys"] == ["bias", "weight_data", "weight_global_scale",
                                          "weight_scales"]
        err = (out["row linear"].double() - (d + bias.double())).abs()
        assert bool((err <= bound).all()), f"row linear, rank {r}: {float(err.max())}"


BAD = {  # case -> (exception type, text every rank's message must contain)
    "K disagrees": ("ValueError", "ranks must agree on K, got rank 0: 128, rank 1: 144"),
    "global scale disagrees": ("ValueError", "must agree on weight global scale"),
    "one rank's dtype": ("TypeError", "bad input on rank(s) 1 of"),
    "group size": ("ValueError", "the group size does not match how the weight was sharded"),
    "row group size": ("ValueError", "not in_features=128"),
    "row K disagrees": ("ValueError", "must agree on K"),
    "column count": ("ValueError", "cannot be split over the group's"),
    "row count": ("ValueError", "K / count % 16 == 0 is needed"),
    "reduce_scatter rows": ("ValueError", "must be a multiple of the group's size"),
    "chunks": ("ValueError", "chunks must be an int in [1, rows per rank"),
    "NaN on one rank": ("ValueError", "holds NaN/Inf"),
    "bad input on one rank": ("ValueError", "K (last dim) must be a multiple of 16"),
    "module shards": ("ValueError", "must agree on weight global scale"),
    "scale formats disagree": ("ValueError", ("must agree on weight scale format, got rank 0: "
                                              "'ue5m3', rank 1: 'ue4m3'")),
    "module ue5m3": ("NotImplementedError", "the modules take UE4M3 NVFP4 weights only"),
}


def test_bad_input_raises_on_every_rank(run):
    _, res, _ = run
    others = ("ValueError", ("quantize_shared: another rank's input is not a valid quantize "
                             "input (its own error names it)"))
    for case, (kind, text) in BAD.items():
        for r, out in enumerate(res):
            got = out["bad"][case]
            assert got is not None, f"{case}: rank {r} did not raise"
            if case == "bad input on one rank" and r != 0:  # the others learn of it
                assert got == others, got
                continue
            assert got[0] == kind and text in got[1], (case, r, got)
            assert got == res[0]["bad"][case], (case, r)  # the same error on every rank
    hint = res[0]["bad"]["global scale disagrees"][1]
    assert "tk_cute.nvfp4.shard" in hint and "rank 1:" in hint


# ---------------------------------------------------------------- numerics, in one process


def test_from_shard_rejects_a_shard_cut_for_another_group_size(monkeypatch, seed):
    """A shard does not know the group size it was cut for: `from_shard` takes the full
    layer's size and checks it (here on one process, in a group of 2 as the modules see it)."""
    from tk_cute.distributed import modules

    monkeypatch.setattr(modules, "group_info", lambda group=None: (0, 2))
    wq = quantize(torch.randn(N, K))
    col = ColumnParallelLinear.from_shard(shard(wq, 0, 0, 2), out_features=N)
    assert (col.out_features, col.full_shape) == (N // 2, (N, K))
    assert torch.equal(col.weight_data, shard(wq, 0, 0, 2).data)
    row = RowParallelLinear.from_shard(shard(wq, 1, 1, 2), in_features=K)
    assert (row.in_features, row.full_shape) == (K // 2, (N, K))
    with pytest.raises(ValueError, match=r"the shards make 24, not out_features=48.*count = 4"):
        ColumnParallelLinear.from_shard(shard(wq, 0, 0, 4), out_features=N)
    with pytest.raises(ValueError, match=r"the shards make 64, not in_features=128.*count = 4"):
        RowParallelLinear.from_shard(shard(wq, 1, 0, 4), in_features=K)
    with pytest.raises(TypeError, match="needs out_features=, the full layer's size"):
        ColumnParallelLinear.from_shard(shard(wq, 0, 0, 2), out_features=None)
    with pytest.raises(TypeError, match=r"2-D NVFP4Tensor, got a Tensor of shape \(48, 128\)"):
        RowParallelLinear.from_shard(torch.randn(N, K), in_features=K)


def test_bounds_explain_every_difference_of_simulated_reductions():
    # The row-parallel arithmetic on one process (p fp32 partials summed in two orders): with
    # 65536 elements some round to the other bf16 neighbour of the exact value; each must be
    # explained, and a planted error must not be.
    from tk_cute.distributed import row_parallel_bound

    torch.manual_seed(0)
    p, x = 4, torch.randn(256, 256).to(torch.bfloat16)
    w = quantize(torch.randn(256, 256))
    kl = 256 // p
    P = [nvfp4.gemm(x[:, i * kl:(i + 1) * kl], shard(w, 1, i, p), torch.float32)
         for i in range(p)]
    ref = nvfp4.gemm(x, w)
    counts = []
    for total in ((P[0] + P[1]) + (P[2] + P[3]), ((P[3] + P[2]) + P[1]) + P[0]):
        y = total.to(torch.bfloat16)
        assert_row_parallel_close(y, x, w, p)
        assert_row_parallel_close(total, x, w, p)  # fp32 out: no output rounding
        counts.append(explain_mismatches(y, ref, x, w, p))
    assert all(c > 0 for c in counts), counts  # the check was exercised
    d, bound = row_parallel_bound(x, w, p)
    assert float((bound / (d.abs() + 1e-30)).median()) < 2.0**-7  # the bf16 rounding dominates
    planted = ref.clone()
    i = int((d - ref.double()).abs().argmin())  # the element closest to its rounded value
    planted.view(-1)[i] = torch.nextafter(ref.view(-1)[i], torch.tensor(float("inf"),
                                                                       dtype=torch.bfloat16))
    with pytest.raises(AssertionError, match="not near a rounding boundary"):
        explain_mismatches(planted, ref, x, w, p)
    planted.view(-1)[i] = ref.view(-1)[i] * 1.5
    with pytest.raises(AssertionError, match="by more than one step"):
        explain_mismatches(planted, ref, x, w, p)
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_row_parallel_close(planted, x, w, p)


# ---------------------------------------------------------------- spawn itself


def _stuck(rank: int, p: int) -> None:
    if rank == 0:
        raise RuntimeError("rank 0 fails before the collective")
    dist.all_reduce(torch.ones(1))  # never completed: rank 0 is gone


def test_spawn_bounds_a_rank_left_waiting():
    with pytest.raises(SpawnError) as info:
        spawn(_stuck, 2, timeout_s=3, join_timeout_s=60)
    errors = {e.rank: e for e in info.value.errors}
    assert errors[0].type == "RuntimeError" and "fails before" in errors[0].message
    assert 1 in errors  # never a hang
    # Rank 1 was released by its collective (the 3 s timeout, or the lost peer: its own
    # exception) or died on its own; not held until spawn's 60 s join deadline, which
    # terminates it and reports "had not finished and was terminated".
    assert "had not finished" not in errors[1].message, errors[1]
    assert errors[1].traceback or "exited with code" in errors[1].message, errors[1]


def test_spawn_rejects_functions_children_cannot_import():
    with pytest.raises(ValueError, match="module-level function"):
        spawn(lambda rank, p: None, 2)
    with pytest.raises(ValueError, match="'file.py:name' or 'module:name'"):
        spawn("no_colon", 2)


def test_every_process_runs_with_multicast_off(run):
    from tk_cute.distributed import MULTICAST_OFF

    assert MULTICAST_OFF == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                             "NVSHMEM_DISABLE_NVLS": "1"}
    for out in run[1]:
        assert out["env"] == MULTICAST_OFF


# ---------------------------------------------------------------- multi-GPU (NCCL)


def _gpu_worker(rank: int, p: int, m: int, hidden: int, inter: int) -> dict:
    """The TP MLP at real sizes on NCCL: every layer's output element-wise within its bound
    (`tk_cute.testing.assert_gemm_close` for the column layers, the row-parallel bound with
    kernel partials for down, each against the intermediate that path itself computed)."""
    import torch.nn.functional as F

    from tk_cute.bench.model import MLP
    from tk_cute.distributed.modules import gathered_forward
    from tk_cute.testing import assert_gemm_close

    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    # (CPU under gloo too: the same logic at small sizes is dry-run where there is no GPU.)
    cuda = dist.get_backend() == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    base = MLP.random(hidden, inter, dev, seed=0)
    x = torch.randn(m, hidden, dtype=torch.bfloat16,
                    generator=torch.Generator().manual_seed(1)).to(dev)
    rows = m // p
    out = {}
    with torch.inference_mode():
        for act in ("bf16", "nvfp4"):
            single = nvfp4.quantize_(copy.deepcopy(base), activations=act)
            a = quantize(x) if act == "nvfp4" else x
            for sp in (False, True):
                tp = TensorParallelMLP.from_mlp(single, activations=act, sequence_parallel=sp,
                                                chunks=4)
                if sp:  # the module's own pieces: one pipelined gather for gate and up
                    g, u = gathered_forward([tp.gate, tp.up], x[rank * rows:(rank + 1) * rows])
                else:
                    g, u = tp.gate(x), tp.up(x)
                assert_gemm_close(g, a, tp.gate.weight, f"gate rank {rank} sp={sp}")
                assert_gemm_close(u, a, tp.up.weight, f"up rank {rank} sp={sp}")
                h = F.silu(g) * u
                y = tp.down(h)
                h_full = torch.cat(_gather(h, p), dim=-1)  # (m, I): every rank's columns
                ha = quantize(h_full) if act == "nvfp4" else h_full  # = quantize_shared's
                if sp:
                    ha = ha[rank * rows:(rank + 1) * rows] if act == "bf16" else (
                        nvfp4.shard(ha, 0, rank, p))
                assert_row_parallel_close(y, ha, single.down.weight, p,
                                          what=f"down rank {rank} {act} sp={sp}")
                ref = single(x)[rank * rows:(rank + 1) * rows] if sp else single(x)
                out[f"{act} sp={sp}"] = float((y.float() - ref.float()).norm()
                                              / ref.float().norm())
    return out


def _gather(t: torch.Tensor, p: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(p)]
    dist.all_gather(parts, t.contiguous())
    return parts


def _gpus(world: int) -> None:
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs, this machine has {torch.cuda.device_count()}")


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("m", [16, 256])
def test_tp_mlp_on_gpus(world, m):
    _gpus(world)
    res = spawn(_gpu_worker, world, m, 8192, 28672, backend="nccl", timeout_s=300,
                join_timeout_s=900)
    for r in res:  # against the unsharded NVFP4 model (the element-wise checks ran above)
        for key, err in r.items():
            # W4A16: re-associated sums and other kernels' roundings; W4A4: those ulps can
            # also flip the down layer's activation codes (steps of 1/8 to 1/3 of a value).
            assert err < (2.0**-6 if key.startswith("bf16") else 2.0**-4), (key, err)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4, 8])
def test_tp_bench_runs_on_gpus(world, tmp_path):
    import json
    import math

    _gpus(world)
    from tk_cute.bench import tp as bench_tp

    out = tmp_path / "tp.json"
    assert bench_tp.main(["--world", "1", str(world), "--m", "16", "256", "4096", "--rounds",
                          "5", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    for m in (16, 256, 4096):
        names = {r["variant"] for r in rows if r["M"] == m and r["world"] == world}
        assert set(bench_tp.VARIANTS) <= names, (m, names)
    hidden = [r["hidden"] for r in rows if r.get("hidden") is not None]
    assert hidden and all(math.isfinite(h) for h in hidden)  # noise can pass 0 or 1
