"""Tiled register-A W4A16 kernel (kernels/gemm/nvfp4_rst_sm90.py): compile checks and layout
proofs on the CPU, every output element against the exact product on the GPU."""

import pytest
import torch

from tk_cute.compile import build
from tk_cute.kernels.gemm import nvfp4_rst_sm90 as rst
from tk_cute.layouts import nvfp4_scales


@pytest.fixture(scope="module", params=[(256, 1), (128, 1), (256, 2)],
                ids=["nb256", "nb128", "nb256_2sets"])
def built(request):
    nb, sets = request.param
    cfg = rst.Config(Nb=nb, A_SETS=sets)
    k = rst.GemmNvfp4RsTiledSm90(cfg)
    return cfg, k, build(k, *rst.signature(cfg).compile_args(132), arch="sm_90a")


def test_register_a_wgmma_fed_by_tma_without_spills(built):
    cfg, k, b = built
    # One 128-K stage per batch: 8 wgmma m64 n Nb k16 with A from registers, issued once in the
    # consumer loop per A register set; the A operand is decoded from two 16-byte shared loads
    # per thread.
    sets = cfg.A_SETS
    inst = rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.Nb}k16\.f32\.bf16\.bf16"
    assert b.ptx_count(inst) == 8 * sets
    assert b.sass_count(rf"HGMMA\.64x{cfg.Nb}x16") == 8 * sets
    assert b.ptx_count(inst + r"\s+\{") == 8 * sets  # (register A: a register list)
    assert b.sass_count(r"LDS\.128") == 2 * sets
    # Two sets: neither branch waits between its MMAs (ptxas would serialize them, C7513, if
    # the decode of one set touched registers the other's MMAs read).
    assert b.sass_count(r"WARPGROUP\.DEPBAR") <= 3
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global") >= 3
    assert b.ptx_count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232") == 1
    assert b.ptx_count(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40") == 1
    for r in b.resources:
        assert r.local_bytes == 0 and r.stack_bytes == 0, r
    assert b.sass_count(r"\bLDL\b") == 0 and b.sass_count(r"\bSTL\b") == 0


def test_ring_fills_shared_memory(built):
    cfg, k, _ = built
    assert k.LOAD_PIPE_DEPTH == {256: 3, 128: 5}[cfg.Nb]
    assert k.stage_bytes() == 128 * 64 + 1024 + cfg.Nb * 128 * 2
    assert k.dynamic_shared_memory() <= rst.SMEM_BUDGET


@pytest.mark.parametrize("N, K", [(128, 128), (384, 1024), (8192, 8192)])
def test_scale_tiles_hold_each_stage_atoms(N, K):
    """The stage-k scale tile of band b (tile index b * K / 128 + k of the scales viewed as
    1 KiB tiles) holds exactly the scale bytes of rows 128b..128b+127, K 128k..128k+127:
    `blocked_offset` of every such (row, scale column) lands in it."""
    half_atoms = K // (2 * nvfp4_scales.ATOM_K)
    for b in range(N // 128):
        for k in range(K // 128):
            tile = b * half_atoms + k
            for m in (0, 31, 32, 77, 127):
                for kb in range(8 * k, 8 * k + 8):
                    off = nvfp4_scales.blocked_offset(128 * b + m, kb, N, K)
                    assert tile * 1024 <= off < tile * 1024 + 1024


def test_config_and_shape_rules():
    with pytest.raises(ValueError, match="Nb must be 128 or 256"):
        rst.Config(Nb=64)
    with pytest.raises(ValueError, match="LOAD_PIPE_DEPTH"):
        rst.Config(LOAD_PIPE_DEPTH=1)
    with pytest.raises(ValueError, match="of shared memory; the budget is"):
        rst.GemmNvfp4RsTiledSm90(rst.Config(LOAD_PIPE_DEPTH=4))
    with pytest.raises(ValueError, match="N % 128 == 0, got N=136"):
        rst.check_shape(300, 136, 256)
    with pytest.raises(ValueError, match="K % 128 == 0, got K=8208"):
        rst.check_shape(300, 256, 8208)
    assert rst.supports(1, 256, 128) and not rst.supports(5, 200, 128)


def test_packing_matches_dsl():
    rst.compile_launcher(rst.Config(Nb=128), 132, options="--gpu-arch sm_90a")


# --- GPU --------------------------------------------------------------------------------------


def _weights(N, K):
    from tk_cute.nvfp4 import quantize

    return quantize(torch.randn(N, K, device="cuda") * 0.02)


@pytest.mark.gpu
@pytest.mark.parametrize("nb, sets", [(128, 1), (256, 1), (128, 2), (256, 2)])
@pytest.mark.parametrize("M, N, K", [(129, 256, 128), (300, 1024, 2048), (1000, 384, 1152),
                                     (256, 8192, 8192), (4097, 512, 256)])
def test_every_element_matches_the_exact_product(seed, nb, sets, M, N, K):
    from tk_cute.nvfp4 import launch
    from tk_cute.testing import assert_gemm_close

    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)  # poison
        d = launch.gemm_rs_tiled(a, b, out=out, config=rst.Config(Nb=nb, A_SETS=sets))
        assert d.data_ptr() == out.data_ptr()
        assert_gemm_close(d, a, b, f"Nb={nb} A_SETS={sets} {out_dtype}")


@pytest.mark.gpu
def test_deterministic_and_public_dispatch(seed):
    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch
    from tk_cute.testing import assert_gemm_close

    M, N, K = 600, 1024, 1024
    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    d = launch.gemm_rs_tiled(a, b, torch.float32)
    assert torch.equal(d, launch.gemm_rs_tiled(a, b, torch.float32))  # one order of sums
    assert nvfp4.plan(a, b).path == "register_a_tiled"
    assert torch.equal(nvfp4.gemm(a, b, torch.float32), d)
    aq = nvfp4.quantize(a.float())
    p = nvfp4.plan(aq, b)
    assert p.path == "register_a_tiled" and p.decode_a
    assert_gemm_close(nvfp4.gemm(aq, b), aq, b, "W4A4 via decode_a + tiled")
