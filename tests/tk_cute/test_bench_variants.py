"""Benchmark variant lists build on the host (no GPU): a renamed config field must fail here,
not on the H200."""

import pytest

from tk_cute.bench import nvfp4 as bench_nvfp4


@pytest.mark.parametrize("M, N, K", [(1, 8192, 8192), (16, 28672, 8192), (64, 8192, 28672),
                                     (128, 28672, 8192), (1024, 8192, 8192)])
def test_nvfp4_variants_with_tuning(M, N, K):
    v = bench_nvfp4._variants(M, N, K, tune=True, sms=132)
    assert {"tk_cute w4a16", "tk_cute w4a4", "cuBLAS bf16 (deq W)"} <= set(v)
    tuned = [n for n in v if n.startswith("tk_cute w4a16 MT")]
    assert bool(tuned) == (M <= 64)
    assert ("tk_cute w4a16 fused" in v) == (M % 128 == 0)
    assert ("tk_cute w4a16 small-M kernel" in v) == (9 <= M <= 64)
    assert ("tk_cute w4a16 rs" in v) == (M < 9)
    assert (bench_nvfp4.SPEED_OF_LIGHT in v) == (M <= 128)
