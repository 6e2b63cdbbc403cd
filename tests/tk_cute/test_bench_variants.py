"""Benchmark variant lists build on the host (no GPU): a renamed config field must fail here,
not on the H200."""

import inspect
import json

import pytest
import torch

from tk_cute.bench import nvfp4 as bench_nvfp4


@pytest.mark.parametrize("M, N, K", [(1, 8192, 8192), (16, 28672, 8192), (64, 8192, 28672),
                                     (64, 2880, 2880), (128, 28672, 8192), (200, 8192, 8192),
                                     (1024, 8192, 8192), (256, 2880, 2880)])
def test_nvfp4_variants_with_tuning(M, N, K):
    v, notes = bench_nvfp4._variants(M, N, K, paths=True, tune=True, sms=132)
    assert {"tk_cute w4a16", "tk_cute w4a4", bench_nvfp4.BASELINE} <= set(v)
    for name, f in v.items():  # each tk_cute variant writes the poisoned D `checked_call` gives
        assert ("d" in inspect.signature(f).parameters) == name.startswith("tk_cute"), name
    tuned = [n for n in v if n.startswith("tk_cute w4a16 MT")]
    assert bool(tuned) == (M <= 64)
    rs_grids = [n for n in v if n.startswith("tk_cute w4a16 register_a")]
    assert bool(rs_grids) == (9 <= M <= 128)  # `sm90_tuning.RS_MIN_M`, the kernel's MAX_M
    if (M, N, K) == (64, 2880, 2880):  # one CTA per SM, the aligned grids, the cluster sums of
        # 23 row blocks (2 and 4 per block; 8 would take 184 SMs); no 256 rows: N % 256
        assert rs_grids == [f"tk_cute w4a16 register_a ROWS=128 ctas={c}"
                            for c in (132, 92, 69, 46)] + [
                                f"tk_cute w4a16 register_a CLUSTER={c}" for c in (2, 4)]
    if (M, N, K) == (64, 8192, 28672):
        assert "tk_cute w4a16 register_a ROWS=128" in rs_grids
    tiled = [n for n in v if n.startswith("tk_cute w4a16 tiled")]
    assert bool(tiled) == (M >= 113)  # from `sm90_tuning.SPLIT_TILE_MIN_M`
    if M == 200:  # the split tile beside the few-tiles width it replaced (two 112-row tiles),
        # and with 16-byte partials
        assert {"tk_cute w4a16 tiled Nb=208 stream-K", "tk_cute w4a16 tiled Nb=112 few tiles",
                "tk_cute w4a16 tiled Nb=208 stream-K v4 partials",
                "tk_cute w4a16 tiled Nb=208 stream-K teams of 2"} <= set(tiled)
    if (M, N, K) == (256, 2880, 2880):  # few bands: the candidates of `few_bands_plan` (92
        # 64-wide tiles: no team of two fits 132 SMs)
        assert {"tk_cute w4a16 tiled Nb=64", "tk_cute w4a16 tiled Nb=128 stream-K teams v4"
                } <= set(tiled)
        assert "tk_cute w4a16 tiled Nb=64 stream-K teams v4" not in tiled
    from tk_cute.tuning.sm90 import PATHS

    forced = {notes[n][1] for n in v if "path=" in n and n in notes}
    assert forced == set(PATHS)  # every path beside the dispatch's choice (those that fail drop)
    assert "tk_cute w4a4 path=dequantize two launches" in v
    assert (bench_nvfp4.SPEED_OF_LIGHT in v) == (M <= 128)


def test_nvfp4_shapes_and_help():
    assert bench_nvfp4.shapes([1, 16], ["8192,8192"], ["129,8192,8208"]) == [
        (1, 8192, 8192), (16, 8192, 8192), (129, 8192, 8208)]
    text = bench_nvfp4._parser().format_help()
    assert "--plot" in text and "--paths" in text
    # the issue rows join the default grid only; a chosen grid runs as given
    parse = bench_nvfp4._parser().parse_args
    assert bench_nvfp4.extra_shapes(parse([])) == bench_nvfp4.DEFAULT_SHAPES
    assert "129,8192,8192" in bench_nvfp4.DEFAULT_SHAPES
    assert bench_nvfp4.extra_shapes(parse(["--m", "16"])) == []
    assert bench_nvfp4.extra_shapes(parse(["--nk", "2880,2880"])) == []
    assert bench_nvfp4.extra_shapes(parse(["--shapes"])) == []
    assert bench_nvfp4.extra_shapes(parse(["--m", "16", "--shapes", "3,8,16"])) == ["3,8,16"]


def test_nvfp4_model_layers():
    """`--models`: each family's layers at every M, each (N, K) once; the layers are whole
    NVFP4 operands (K % 16, N % 8: every Hopper path's alignment); unknown names exit."""
    for family, layers in bench_nvfp4.MODEL_LAYERS.items():
        assert layers, family
        assert all(K % 16 == 0 and N % 8 == 0 for _, N, K in layers), family
    got = bench_nvfp4.model_shapes(["gpt-oss"], [1, 128])
    assert got[:2] == [(1, 5120, 2880), (128, 5120, 2880)] and len(got) == 8
    every = bench_nvfp4.model_shapes([], [1])
    assert len(every) == len(set(every)) and (1, 7168, 2048) in every  # DeepSeek's expert down
    with pytest.raises(SystemExit, match="--models takes"):
        bench_nvfp4.model_shapes(["llama-9"], [1])
    args = bench_nvfp4._parser().parse_args(["--models", "qwen2.5-7b"])
    assert args.models == ["qwen2.5-7b"] and args.m == bench_nvfp4.DEFAULT_M


def test_nvfp4_markdown_table():
    """`--markdown`: the performance page's table from a run's rows (fresh numbers), with the
    command, environment and commit; a shape missing a variant is left out."""
    import random

    rng = random.Random()
    rows, want = [], {}
    for M in (1, 256):
        base = rng.uniform(10, 100)
        us = {"tk_cute w4a16": base / 2.5, "tk_cute w4a4": base / 2.4, bench_nvfp4.BASELINE: base}
        if M == 1:
            us[bench_nvfp4.SPEED_OF_LIGHT] = base / 3.2
            us["tk_cute w4a16 pdl"] = base / 2.9
            us[bench_nvfp4.HUMMING] = base / 2.2
        for name, t in us.items():
            rows.append(dict(variant=name, M=M, N=8192, K=8192, us=t, speedup=base / t,
                             path="small_m" if M == 1 else "register_a_tiled(Nb=128)"))
        want[M] = us
    rows.append(dict(variant="tk_cute w4a16", M=3, N=8, K=16, us=1.0, speedup=1.0, path="x"))
    md = bench_nvfp4.markdown(rows, "H200 env", "python -m tk_cute.bench nvfp4", "abc1234")
    lines = md.splitlines()
    assert lines[0] == "`python -m tk_cute.bench nvfp4`, commit abc1234. H200 env"
    body = [line for line in lines if line.startswith("| 1x") or line.startswith("| 256x")]
    assert len(body) == 2 and not any(line.startswith("| 3x") for line in lines)
    one = [c.strip() for c in body[0].split("|")[1:-1]]
    assert one[1] == f"{want[1]['tk_cute w4a16']:.1f}" and one[2] == "2.500"
    assert one[6] == "3.200" and one[7] == "2.200" and one[8] == "small_m (pdl=True 2.900x)"
    assert [c.strip() for c in body[1].split("|")[1:-1]][6:] == ["-", "-", "register_a_tiled(Nb=128)"]


def test_model_bars_count_each_bar_and_name_the_worst():
    """`model_bars`: per bar, the shapes below it among those it covers and the worst, from
    random times built to land on either side of each bar (W4A16 at M <= 16 against the
    speed of light, both formats against humming and, at M <= 64, cuBLAS bf16; the geometric
    mean at M >= 256)."""
    import math
    import random

    rng = random.Random()
    rows = []
    fast_sol, low_hum, low_64, big = rng.uniform(0.86, 0.99), rng.uniform(0.5, 0.9), \
        rng.uniform(0.5, 0.9), [rng.uniform(0.6, 1.4) for _ in range(3)]

    def add(M, N, name, speedup, base=100.0):
        rows.append({"variant": name, "M": M, "N": N, "K": 4096, "us": base / speedup,
                     "speedup": speedup, "path": "x"})

    for M, N in ((1, 1024), (16, 2048)):  # W4A16 at 2.0x; read W at 2.0 / f: f of the read
        f = fast_sol if M == 1 else 0.5
        add(M, N, bench_nvfp4.BASELINE, 1.0)
        add(M, N, "tk_cute w4a16", 2.0)
        add(M, N, "tk_cute w4a4", 2.0)
        add(M, N, bench_nvfp4.SPEED_OF_LIGHT, 2.0 / f)
        add(M, N, bench_nvfp4.HUMMING, 2.0 / low_hum if M == 16 else 1.5)
    add(64, 4096, bench_nvfp4.BASELINE, 1.0)
    add(64, 4096, "tk_cute w4a16", low_64)
    add(64, 4096, "tk_cute w4a4", 1.2)
    for i, x in enumerate(big):
        add(256 * (i + 1), 8192, bench_nvfp4.BASELINE, 1.0)
        add(256 * (i + 1), 8192, "tk_cute w4a16", x)
        add(256 * (i + 1), 8192, "tk_cute w4a4", x)
    lines = bench_nvfp4.model_bars(rows)
    assert len(lines) == 7
    assert lines[0].startswith("W4A16 at M <= 16") and "1 of 2 below 0.85" in lines[0] \
        and "worst 0.500 (16x2048x4096)" in lines[0]
    assert "w4a16 x humming" in lines[1] and "1 of 2 below 1.0" in lines[1] \
        and f"worst {low_hum:.3f} (16x2048x4096)" in lines[1]
    assert "1 of 3 below 1.0" in lines[3] and f"worst {low_64:.3f} (64x4096x4096)" in lines[3]
    assert "0 of 3 below 1.0" in lines[4]
    mean = math.exp(sum(map(math.log, big)) / 3)
    assert f"geometric mean {mean:.3f} over 3 shapes" in lines[5]
    assert f"worst {min(big):.3f}" in lines[6]


def test_nvfp4_report_reads_json_parts_without_a_gpu(tmp_path, capsys):
    """`--report`: the --json files of one run's parts, merged: the bars of every part's rows,
    the first part's environment, the markdown table of both."""
    parts = []
    for i, M in enumerate((1, 512)):
        rows = [{"variant": name, "M": M, "N": 4096, "K": 4096, "us": us, "speedup": 20.0 / us,
                 "path": "p"}
                for name, us in ((bench_nvfp4.BASELINE, 20.0), ("tk_cute w4a16", 8.0 + M / 64),
                                 ("tk_cute w4a4", 9.0))]
        parts.append(tmp_path / f"part{i}.json")
        parts[-1].write_text(json.dumps({"environment": f"GPU {i}", "results": rows}))
    md = tmp_path / "t.md"
    assert bench_nvfp4.main(["--report", *map(str, parts), "--markdown", str(md),
                             "--commit", "abc"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "GPU 0"
    assert "x cuBLAS bf16 at M >= 256: geometric mean 1.250 over 1 shapes" in out
    assert "0 of 1 below 1.0" in out
    table = md.read_text()
    assert "| 1x4096x4096 |" in table and "| 512x4096x4096 |" in table and "commit abc" in table


def test_humming_peer_variant_and_check(seed):
    """The humming peer: a variant only when asked, its set's build error raised at its first
    call, and its norm-wise check passing a product within bf16 rounding and failing one off
    by a block's worth (fresh random operands, CPU reference decode)."""
    from tk_cute.bench import humming_peer
    from tk_cute.testing import random_weights

    assert bench_nvfp4.HUMMING not in bench_nvfp4._variants(1, 256, 256, False, False, 132)[0]
    v, _ = bench_nvfp4._variants(1, 256, 256, False, False, 132, humming=True)
    with pytest.raises(ValueError, match="cannot take"):
        v[bench_nvfp4.HUMMING]({"humming": ValueError("cannot take"), "a": None})
    b = random_weights(64, 128, device="cpu")
    a = torch.randn(3, 128, dtype=torch.bfloat16)
    ref = a.double() @ b.dequantize(torch.float64).t()
    humming_peer.check(ref.bfloat16(), a, b)
    wrong = ref.clone()
    wrong[:, :16] *= 1.5
    with pytest.raises(AssertionError, match="relative error"):
        humming_peer.check(wrong.bfloat16(), a, b)
    why = humming_peer.unavailable()
    assert why is None or why


def test_checked_call_fails_a_wrong_unwritten_or_other_d(seed, monkeypatch):
    """`harness.checked_call`, run on every tk_cute variant before a bench times it: a D within
    the bound passes; one element off by 2% of its magnitude, rows left unwritten (the poison),
    or a D other than the one given fail, and the message names the first wrong row, found in
    any slice of rows (`tk_cute.testing.CHECK_BYTES` shrunk to a few rows per slice)."""
    from tk_cute import testing
    from tk_cute.bench.harness import checked_call
    from tk_cute.testing import random_weights

    M, N, K = 13, 64, 256
    b = random_weights(N, K, device="cpu")
    a = torch.randn(M, K, dtype=torch.bfloat16)
    right = (a.float() @ b.dequantize(torch.float32).t()).bfloat16()
    monkeypatch.setattr(testing, "CHECK_BYTES", 3 * 32 * N)  # slices of 3 rows

    def variant(change=None, other=False):
        def call(s, d):
            d.copy_(right)
            if change:
                change(d)
            return d.clone() if other else d
        return call

    checked_call(variant(), {}, (M, N), torch.bfloat16, a, b, "right")
    A, B = testing.exact(a), testing.exact(b)  # decoded once, as `bench nvfp4` passes them
    checked_call(variant(), {}, (M, N), torch.bfloat16, A, B, "right")
    i, j = 10, int(right[10].float().abs().argmax())

    def off(d):
        d[i, j] = d[i, j].float() * 1.02

    def half(d):
        d[M // 2:] = float("nan")

    with pytest.raises(AssertionError, match=rf"off: 1 of {3 * N} elements .* worst at "
                                             rf"\({i}, {j}\)"):
        checked_call(variant(off), {}, (M, N), torch.bfloat16, a, b, "off")
    with pytest.raises(AssertionError, match=rf"off: 1 of {3 * N} elements"):
        checked_call(variant(off), {}, (M, N), torch.bfloat16, A, B, "off")
    with pytest.raises(AssertionError, match=rf"half: .* worst at \({M // 2}, "):
        checked_call(variant(half), {}, (M, N), torch.bfloat16, a, b, "half")
    with pytest.raises(AssertionError, match="other than the D it was given"):
        checked_call(variant(other=True), {}, (M, N), torch.bfloat16, a, b, "other")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a GPU")
@pytest.mark.parametrize("bench", ["gemm", "nvfp4", "quantize", "model"])
def test_benches_exit_clearly_without_a_gpu(bench):
    """A bench on a machine without a CUDA GPU exits with a message saying so (not a torch
    assertion from deep inside the first CUDA call)."""
    from tk_cute.bench.__main__ import main

    with pytest.raises(SystemExit, match="times kernels on a CUDA GPU; torch .* sees none"):
        main([bench])


def test_bench_help_lists_every_bench(capsys):
    from tk_cute.bench.__main__ import BENCHES, main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BENCHES)
    assert main(["nope"]) == 2


def test_model_bench_variants_build_and_run_on_the_host(seed):
    import torch

    from tk_cute.bench import model as bench_model

    models = bench_model.build_models(64, 128, "cpu", seed=seed)
    v = bench_model.variants(models, compile=True)
    kinds = ("bf16", "fp8 _scaled_mm", "tk_cute w4a16", "tk_cute w4a4")
    assert set(v) == {f"{k} eager" for k in kinds} | {
        f"{a} compiled {mode}" for a in ("bf16", "tk_cute w4a16", "tk_cute w4a4")
        for mode in bench_model.COMPILE_MODES}
    graphs = bench_model.graph_variants(v)
    assert set(graphs) == {f"{k} CUDA graph" for k in kinds}
    assert bench_model.BASELINE in v and bench_model.GRAPH_BASELINE in graphs
    assert {bench_model._kind(n) for n in v} == set(bench_model.WEIGHT_BYTES)
    # The two tk_cute models share their weight buffers (one quantization).
    assert models["tk_cute w4a4"].gate.weight_data is models["tk_cute w4a16"].gate.weight_data
    # The whole output's error against the bf16 model concentrates from 64 rows on: over 150
    # seeds W4A16 0.167 +- 0.004, W4A4 0.234 +- 0.006 (each layer's activations quantized too),
    # fp8 0.066 +- 0.002 (NVFP4's one mantissa bit: ~10% RMS per quantized operand); the bounds
    # sit > 10 standard deviations above. At 3 rows it spreads (W4A4 0.22, up to 0.39): there
    # only shapes and dtypes are checked (M = 3: the fp8 rows are padded).
    small = {"x": torch.randn(3, 64, dtype=torch.bfloat16)}
    s = {"x": torch.randn(64, 64, dtype=torch.bfloat16)}
    with torch.inference_mode():
        ref, ref_small = v[bench_model.BASELINE](s), v[bench_model.BASELINE](small)
        for name, fn in v.items():
            if name.endswith("eager"):
                y, y_small = fn(s), fn(small)
                assert y_small.shape == ref_small.shape and y_small.dtype == torch.bfloat16
                assert y.shape == ref.shape and y.dtype == torch.bfloat16
                assert bench_model._rel_err(y, ref) < (0.1 if "fp8" in name else 0.3), name
    text = bench_model._parser().format_help()
    assert "--hidden" in text and "--intermediate" in text and "--no-compile" in text
    assert bench_model._parser().parse_args([]).m == [1, 16, 256, 2048]


def _tp_variants_worker(rank, world):
    import torch

    from tk_cute.bench import tp as bench_tp

    models = bench_tp.build(64, 128, device="cpu", seed=3, chunks=2)
    v = bench_tp.variants(models)
    x = torch.randn(4, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(rank))
    with torch.inference_mode():
        outs = {name: fn(x) for name, fn in v.items()}
        parts = bench_tp.components(models, 4, 64, "cpu")
        for comm, compute in parts.values():  # the timed pieces run (collectives included)
            comm()
            compute()
    return {"names": list(v), "parts": list(parts), "outs": outs, "x": x}


def test_tp_bench_variants_build_and_run_on_two_gloo_processes():
    import torch

    from tk_cute.bench import tp as bench_tp
    from tk_cute.distributed import spawn

    res = spawn(_tp_variants_worker, 2, timeout_s=60, join_timeout_s=120)
    assert res[0]["names"] == bench_tp.VARIANTS == res[0]["parts"]
    assert bench_tp.VARIANTS[0] == bench_tp.BASELINE
    for r in res:
        ref = r["outs"][bench_tp.BASELINE]  # this rank's 4 rows of the bf16 TP block
        assert ref.shape == (4, 64) and ref.dtype == torch.bfloat16
        for name, y in r["outs"].items():
            assert y.shape == ref.shape and y.dtype == torch.bfloat16, name
            err = float((y.float() - ref.float()).norm() / ref.float().norm())
            assert err < (0.25 if "w4a16" in name else 0.35 if "w4a4" in name else 1e-6), name
        # The overlapped forms compute the same elements (the CPU reference: bitwise).
        for kind in ("w4a16", "w4a4"):
            a, b = r["outs"][f"tk_cute {kind} TP"], r["outs"][f"tk_cute {kind} TP overlap"]
            assert torch.equal(a, b), kind
    rows = [{"world": w, "variant": n, "M": 16, "ms": 0.1 * (i + 1) / w, "comm_ms": 0.02,
             "compute_ms": 0.09, "hidden": 0.5 if w > 1 else None, "rel_err_vs_bf16": 0.1,
             "speedup": 1.0 / (i + 1)} for w in (1, 2) for i, n in enumerate(bench_tp.VARIANTS)]
    rows.append({"world": 2, "variant": "tk_cute w4a16 TP", "M": 256, "skipped": "no kernel"})
    text = bench_tp.table(rows)
    assert "2.00x (100%)" in text and "50%" in text  # scaling against p = 1, hidden fraction
    assert "skipped: no kernel" in text
    args = bench_tp._parser().parse_args([])
    assert (args.world, args.m, args.hidden, args.intermediate) == ([1, 2, 4, 8],
                                                                    [16, 256, 4096], 8192, 28672)


def test_gemm_bench_random_shapes_are_seeded_and_have_16_byte_rows():
    from tk_cute.bench import gemm as bench_gemm

    shapes = bench_gemm.random_shapes(300, seed=7)
    assert shapes == bench_gemm.random_shapes(300, seed=7) != bench_gemm.random_shapes(300, 8)
    mnk = [tuple(map(int, s.split(","))) for s in shapes]
    assert all(1 <= m <= bench_gemm.RANDOM_MAX and n % 16 == 0 and k % 16 == 0
               and 16 <= n <= bench_gemm.RANDOM_MAX and 16 <= k <= bench_gemm.RANDOM_MAX
               for m, n, k in mnk)
    # log-uniform: every decade of each dimension comes up (small K, few rows, large ones)
    for dim, lo in ((0, 1), (1, 16), (2, 16)):
        values = [s[dim] for s in mnk]
        assert min(values) < 10 * lo and max(values) > bench_gemm.RANDOM_MAX // 10


def test_gemm_bench_summary():
    from tk_cute.bench.gemm import summary

    line = summary({"a": 1.0, "b": 0.5, "c": 2.0})
    assert line == "3 shapes: geometric mean 1.000x cuBLAS, worst 0.500x (b), 1 below 0.9x"
    assert summary({}) == "no shapes timed"


def test_gemm_bench_parts_cover_the_shapes_once_in_order():
    from tk_cute.bench.gemm import part

    shapes = [str(i) for i in range(101)]
    for p in (1, 2, 3, 7):
        runs = [part(shapes, f"{i}/{p}") for i in range(1, p + 1)]
        assert sum(runs, []) == shapes
        assert max(map(len, runs)) - min(map(len, runs)) <= 1
    for bad in ("0/2", "3/2", "x", "1/0"):
        with pytest.raises(ValueError, match=f"--part takes I/P with 1 <= I <= P, got '{bad}'"):
            part(shapes, bad)


def test_every_random_gemm_shape_has_a_dense_plan():
    """The random sweep's shapes (bf16 and fp8, C in bf16 and fp32) all plan a kernel on the
    H200's 132 SMs (30 resident 4-CTA clusters), operand rows on L2 lines or not, split-K
    where the plan takes it."""
    import torch
    from tk_cute.kernels.gemm.gemm_sm90 import GemmSm90

    from tk_cute.bench.gemm import random_shapes
    from tk_cute.tuning import dense_sm90

    for shape in random_shapes(100):
        M, N, K = map(int, shape.split(","))
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            for out in (torch.bfloat16, torch.float32):
                lines = K * dtype.itemsize % 128 == 0
                cfg = dense_sm90.default_config(dtype, out, M, N, 132, lines=lines, quads=30,
                                                K=K)
                GemmSm90(cfg)  # a Config the kernel takes
                cfg.check_k(K)  # (split-K: no empty K range)


@pytest.mark.parametrize("n_sets", [1, 2, 5, 64, 70])
def test_harness_rounds_queue_graph_calls_eager_and_captured(monkeypatch, n_sets):
    """Every timed round, eager or captured, holds whole passes over the input sets and at
    least GRAPH_CALLS calls, queued between its two events (stand-in events and graphs: what is
    checked is which calls a round times, not a time)."""
    from tk_cute.bench import harness

    log = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            log.append("event")

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 1.0

    class Graph:
        def replay(self):
            log.append("replay")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(harness, "_captured", lambda fn, sets: (
        [fn(s) for s in sets], lambda _: Graph().replay())[1])
    sets = list(range(n_sets))
    passes = -(-harness.GRAPH_CALLS // n_sets)
    for graph in (False, True):
        log.clear()
        out = harness.bench({"f": lambda s: log.append(s)}, sets, warmup=1, rounds=3,
                            graph=graph)
        warm = n_sets + (passes * n_sets if graph else 0)  # the warm-up pass, the capture
        assert log[:warm] == sets + (sets * passes if graph else [])
        rounds = log[warm:]
        batch = ["replay"] if graph else sets * passes
        assert rounds == (["event", *batch, "event"]) * 3
        assert out["f"].ms == pytest.approx(1.0 / (passes * n_sets))
