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
