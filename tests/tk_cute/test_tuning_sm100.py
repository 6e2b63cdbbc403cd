"""The Blackwell / Rubin config choice (`tk_cute.tuning.sm100`): properties of the cost model's
picks over a seeded random sweep of shapes, not pinned picks. The model is a model (no
sm_100+ GPU here); what is checked is that every call gets a config, the pick is the cheapest
by the model's own estimate, never costs more than the plain configuration (no swap, no split),
and fills the GPU where the shape allows."""

import random

import pytest

from tk_cute.arch import target
from tk_cute.kernels.gemm import nvfp4_sm100 as K
from tk_cute.kernels.gemm import nvfp4_w4a16_sm100 as W
from tk_cute.tuning import sm100 as T

ARCHS = ("sm_100a", "sm_103a", "sm_107a")


def _shapes(seed, count=40):
    r = random.Random(seed)
    out = []
    for _ in range(count):
        m = r.choice([1, 2, 3, 8, 16, 33, 64, 100, 256, 777, 2048, 8192])
        n = r.choice([8, 136, 1000, 2880, 3584, 5760, 7168, 8192, 28672])
        k = 16 * r.randint(1, 2048)
        out.append((m, n, k))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_every_call_gets_the_cheapest_valid_config(arch):
    for m, n, k in _shapes(ARCHS.index(arch)):
        for out in ("bfloat16", "float32", "nvfp4"):
            cfg = T.w4a4_config(arch, m, n, k, out)
            assert isinstance(cfg, K.Config) and cfg.arch == arch and cfg.out == out
            best = T.estimate(cfg, m, n, k)["time_us"]
            assert all(best <= T.estimate(c, m, n, k)["time_us"] + 1e-9
                       for c in T.w4a4_candidates(arch, m, n, k, out))
            if out == "nvfp4":  # the whole sum is quantized in the epilogue, along D's rows
                assert not cfg.swap_ab and cfg.SPLIT_K == 1
        w = T.w4a16_config(arch, m, n, k)
        assert isinstance(w, W.Config) and w.arch == arch


@pytest.mark.parametrize("arch", ARCHS)
def test_the_pick_never_costs_more_than_the_plain_config(arch):
    """The plain configuration (the operands in order, K whole, 256 x 128 pair tiles) is one
    candidate: the model's pick is at least as cheap by its own estimate."""
    for m, n, k in _shapes(7):
        plain = next(c for c in T.w4a4_candidates(arch, m, n, k)
                     if not c.swap_ab and c.SPLIT_K == 1 and (c.Mb, c.Nb) == (256, 128))
        pick = T.w4a4_config(arch, m, n, k)
        assert T.estimate(pick, m, n, k)["time_us"] <= T.estimate(plain, m, n, k)["time_us"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("m", [1, 4, 16, 64])
def test_decode_on_few_weight_bands_keeps_hbm_busy(arch, m):
    """Small M on a layer whose weights have few 256-row bands (Qwen2.5-7B's down projection,
    N = 3584): the pick keeps enough SMs streaming weights to draw the whole HBM bandwidth by
    the model's own assumption (`SM_LOAD_SHARE` times an SM's even share each), splitting K
    where the plain grid would not (at M <= 16 it does, on every target)."""
    n, k = 3584, 18944
    for cfg in (T.w4a4_config(arch, m, n, k), T.w4a16_config(arch, m, n, k)):
        est = T.estimate(cfg, m, n, k)
        assert est["busy_sm_share"] * T.SM_LOAD_SHARE >= 1, (T.describe(cfg), est)
    if m <= 16:
        assert T.w4a4_config(arch, m, n, k).SPLIT_K > 1


def test_rubin_shares_b_between_two_m_halves_on_big_shapes():
    """Rubin's FP4 rate needs more operand bytes per clock than shared memory gives a 256 x 256
    pair tile: the model picks Mb = 512 (the B collector) for a big GEMM."""
    cfg = T.w4a4_config("sm_107a", 8192, 8192, 8192)
    assert cfg.Mb == 512 and cfg.b_reuse
    est = T.estimate(cfg, 8192, 8192, 8192)
    assert est["bound"] == "compute" and est["model"].startswith("cost MODEL")


def test_estimate_terms():
    cfg = T.w4a4_config("sm_100a", 4096, 4096, 4096)
    est = T.estimate(cfg, 4096, 4096, 4096)
    assert est["time_us"] == pytest.approx(max(est[t + "_us"] for t in (
        "compute", "dram", "load", "smem")) + est["fixed_us"])
    flops = 2 * 4096 ** 3
    assert est["compute_us"] >= flops / T.PEAKS["sm_100a"][0] * 1e6  # never above the peak
    sms = target("sm_100a").sm_count
    assert 0 < est["busy_sm_share"] <= 1 and est["waves"] >= est["units"] / sms
