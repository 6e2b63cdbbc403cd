"""The kernel report: a real compile's resources plus a labelled roofline model."""

import pytest

from tk_cute import report as R
from tk_cute.kernels.gemm import nvfp4_sm100 as K
from tk_cute.nvfp4 import dispatch_sm100 as D


def test_roofline_model_numbers():
    r = R.roofline("sm_107a", 16384, 16384, 16384)
    assert r["model"].startswith("roofline") and "35 PF" in r["peaks"] and "22 TB/s" in r["peaks"]
    assert r["bound"] == "compute"
    assert r["time_us"] == pytest.approx(2 * 16384**3 / 35e15 * 1e6)
    small = R.roofline("sm_100a", 128, 8192, 8192)  # decode-like: bandwidth-bound
    assert small["bound"] == "memory"
    assert small["time_us"] == pytest.approx(small["bytes"] / 8e12 * 1e6)


def test_report_sm107a(capsys):
    assert R.main(["--arch", "sm_107a", "--mnk", "16384,16384,16384"]) == 0
    out = capsys.readouterr().out
    assert "ROOFLINE MODEL" in out and "576 / 576 columns (exclusive)" in out
    cfg = D.select_config("sm_107a", 16384, 16384, 16384)
    r = R.report(cfg, 16384, 16384, 16384)
    assert r["spill_bytes"] == 0 and r["smem_bytes"] <= r["smem_capacity"]
    # 64 K stages x (2 MMAs of K = 128 x 2 M halves) per 512x256 tile
    assert r["mma_instructions_per_tile"] == 16384 // 256 * 4
