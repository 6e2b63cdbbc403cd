"""The kernel report: a real compile's resources plus a labelled roofline model."""

import pytest

from tk_cute import report as R
from tk_cute.tuning import sm100 as sm100_tuning


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
    cfg = sm100_tuning.w4a4_config("sm_107a", 16384, 16384, 16384)
    r = R.report(cfg, 16384, 16384, 16384)
    assert r["spill_bytes"] == 0 and r["smem_bytes"] <= r["smem_capacity"]
    # 64 K stages x (2 MMAs of K = 128 x 2 M halves) per 512x256 tile
    assert r["mma_instructions_per_tile"] == 16384 // 256 * 4


@pytest.mark.parametrize("m, n, k, out", [(256, 256, 100, "bfloat16"), (0, 100, 256, "bfloat16"),
                                         (256, 264, 256, "nvfp4")])
def test_report_refuses_a_shape_the_dispatch_refuses(m, n, k, out):
    """As `tk_cute.nvfp4.gemm` on these targets and the command line: no report of a GEMM that
    cannot run (the build argument, never compiled, would fail if it were read)."""
    cfg = sm100_tuning.w4a4_config("sm_107a", 256, 256, 256, out=out)
    with pytest.raises(ValueError, match=rf"K % 16 == 0 \(N % 16 == 0.*M={m}, N={n}, K={k}"):
        R.report(cfg, m, n, k, build=object())


_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
_FI_SM107 = _ROOT / ".peers" / "flashinfer" / "dense_blockscaled_gemm_sm107.py"


@pytest.mark.skipif(not _FI_SM107.exists() or not (_ROOT / ".peers" /
                    "dense_blockscaled_gemm_persistent.py").exists(),
                    reason="FlashInfer sm107 peer not copied into the git-ignored .peers/")
def test_peer_flashinfer_sm107():
    """The FlashInfer column of docs/rubin.md: its untuned 8192^3 choice, then the B-reuse form."""
    from tk_cute.arch import target

    r = R.peer_flashinfer(str(_FI_SM107), "sm_107a", 8192, 8192, 8192)
    assert r["config"]["untuned_choice"] == ((256, 256, 256), (256, 256, 128), (2, 1), False)
    assert r["mma_forms"] == ["tcgen05.mma.cta_group::2.kind::mxf4nvf4.block_scale.block16"
                              ".collector::a::discard"]
    assert r["mma_per_stage"] == 2 and r["mma_per_tile"] == 8192 // 256 * 2
    assert r["sass_mma"] == ["UTCOMMA.2CTA.BLOCK16"] and r["sass_b_collector"] == []
    assert r["spill_bytes"] == 0 and r["stages"] == (8, 2, 2)
    assert r["smem_bytes"] <= target("sm_107a").smem_bytes
    assert r["tmem_columns"] == 576 and r["tmem_exclusive"]
    assert not (r["early_a_release"] or r["pdl"] or r["clc"])

    breuse = R.peer_flashinfer(str(_FI_SM107), "sm_107a", 8192, 8192, 8192,
                               mma_tiler=(512, 256, 256), mma_inst_shape=(256, 256, 128),
                               cluster_shape_mn=(2, 2))
    assert [f.rsplit(".", 1)[1] for f in breuse["mma_forms"]] == ["collector::b::fill",
                                                                  "collector::b::lastuse"]
    assert breuse["mma_per_stage"] == 4 and breuse["stages"] == (5, 1, 2)
    assert breuse["sass_b_collector"] == [".B_KEEP", ".B_REUSE"] and breuse["spill_bytes"] == 0


def test_roofline_counts_nvfp4_output_bytes():
    """An NVFP4 D is written as 0.5625 bytes per element (codes 0.5, UE4M3 scales 1/16), a
    bf16 one as 2."""
    m, n, k = 4096, 8192, 256
    dense, fused = R.roofline("sm_107a", m, n, k), R.roofline("sm_107a", m, n, k, "nvfp4")
    assert dense["bytes"] - fused["bytes"] == m * n * (2 - 0.5625)
    assert fused["bytes"] == (m + n) * k * 0.5625 + m * n * 0.5625 == (m + n) * k // 2 + (
        m + n) * k // 16 + m * n // 2 + m * n // 16
    assert R.D_BYTES["nvfp4"] == 0.5625
    assert R.roofline("sm_107a", m, n, k, "float32")["bytes"] - dense["bytes"] == m * n * 2
    with pytest.raises(ValueError, match="out must be one of"):
        R.roofline("sm_107a", m, n, k, "int8")


def test_report_nvfp4_out(capsys):
    """`python -m tk_cute report --arch sm_107a --out nvfp4`: the fused-epilogue kernel."""
    assert R.main(["--arch", "sm_107a", "--mnk", "16384,16384,16384", "--out", "nvfp4"]) == 0
    out = capsys.readouterr().out
    assert "out nvfp4" in out and "reducing_tmem_loads 4" in out and "tma_stores 0" in out
    cfg = sm100_tuning.w4a4_config("sm_107a", 16384, 16384, 16384, out="nvfp4")
    r = R.report(cfg, 16384, 16384, 16384)
    assert r["epilogue"]["reducing_tmem_loads"] == 4 and r["epilogue"]["e2m1_cvt"] == 32
    assert r["spill_bytes"] == 0 and r["smem_bytes"] <= r["smem_capacity"]
    assert r["roofline"]["bytes"] == R.roofline("sm_107a", 16384, 16384, 16384, "nvfp4")["bytes"]
    with pytest.raises(SystemExit):  # N % 16 for an NVFP4 D
        R.main(["--arch", "sm_107a", "--mnk", "256,264,256", "--out", "nvfp4"])
