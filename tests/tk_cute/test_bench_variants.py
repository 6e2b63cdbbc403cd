"""Benchmark variant lists build on the host (no GPU): a renamed config field must fail here,
not on the H200."""

import pytest

from tk_cute.bench import nvfp4 as bench_nvfp4


@pytest.mark.parametrize("M, N, K", [(1, 8192, 8192), (16, 28672, 8192), (64, 8192, 28672),
                                     (128, 28672, 8192), (1024, 8192, 8192)])
def test_nvfp4_variants_with_tuning(M, N, K):
    v, notes = bench_nvfp4._variants(M, N, K, paths=True, tune=True, sms=132)
    assert {"tk_cute w4a16", "tk_cute w4a4", bench_nvfp4.BASELINE} <= set(v)
    tuned = [n for n in v if n.startswith("tk_cute w4a16 MT")]
    assert bool(tuned) == (M <= 64)
    from tk_cute.nvfp4.heuristics import PATHS

    forced = {notes[n][1] for n in v if "path=" in n}
    assert forced == set(PATHS)  # every path beside the dispatch's choice (those that fail drop)
    assert (bench_nvfp4.SPEED_OF_LIGHT in v) == (M <= 128)


def test_nvfp4_shapes_and_help():
    assert bench_nvfp4.shapes([1, 16], ["8192,8192"], ["129,8192,8208"]) == [
        (1, 8192, 8192), (16, 8192, 8192), (129, 8192, 8208)]
    text = bench_nvfp4._parser().format_help()
    assert "--plot" in text and "--paths" in text


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
    assert set(v) == {f"{k} eager" for k in kinds} | {"tk_cute w4a16 compiled",
                                                       "tk_cute w4a4 compiled"}
    graphs = bench_model.graph_variants(v)
    assert set(graphs) == {f"{k} CUDA graph" for k in kinds}
    assert bench_model.BASELINE in v and bench_model.GRAPH_BASELINE in graphs
    assert {bench_model._kind(n) for n in v} == set(bench_model.WEIGHT_BYTES)
    # The two tk_cute models share their weight buffers (one quantization).
    assert models["tk_cute w4a4"].gate.weight_data is models["tk_cute w4a16"].gate.weight_data
    s = {"x": torch.randn(3, 64, dtype=torch.bfloat16)}  # M = 3: the fp8 rows are padded
    with torch.inference_mode():
        ref = v[bench_model.BASELINE](s)
        for name, fn in v.items():
            if name.endswith("eager"):
                y = fn(s)
                assert y.shape == ref.shape and y.dtype == torch.bfloat16
                assert bench_model._rel_err(y, ref) < (0.1 if "fp8" in name else 0.35), name
    text = bench_model._parser().format_help()
    assert "--hidden" in text and "--intermediate" in text and "--no-compile" in text
    assert bench_model._parser().parse_args([]).m == [1, 16, 256, 2048]
