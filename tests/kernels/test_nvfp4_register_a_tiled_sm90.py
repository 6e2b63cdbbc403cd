"""Tiled register-A W4A16 kernel (kernels/gemm/nvfp4_register_a_tiled_sm90.py): compile checks,
layout proofs and whole tiles in the emulator on the CPU, every output element against the exact
product on the GPU."""

import pytest
import torch
from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst
from tk_cute.layouts import nvfp4_scales

from tk_cute.compile import build

pytestmark = pytest.mark.slow  # the slow tier: `python -m pytest --full`


@pytest.fixture(scope="module", params=[(256, 1), (128, 1), (192, 1), (256, 2), (64, 1),
                                        (80, 1), (112, 1), (144, 1), (208, 1), (64, 2), (80, 2),
                                        (96, 2)],
                ids=["nb256", "nb128", "nb192", "nb256_2sets", "nb64", "nb80", "nb112", "nb144",
                     "nb208", "nb64_2sets", "nb80_2sets", "nb96_2sets"])
def built(request):
    nb, sets = request.param
    cfg = rst.Config(Nb=nb, A_SETS=sets)
    k = rst.GemmNvfp4RegisterATiledSm90(cfg)
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
    # PDL: the permute pass lets the GEMM launch, which waits for it before reading memory
    assert b.ptx_count(r"griddepcontrol\.launch_dependents") == 1
    assert b.ptx_count(r"griddepcontrol\.wait") == 2  # the pass's (no-op: not a dependent)
    # ... in the SASS too (ptxas moves read-only loads above the wait)
    assert all(reads == [] for reads in b.reads_before_pdl_wait().values())
    for r in b.resources:
        assert r.local_bytes == 0 and r.stack_bytes == 0, r
    assert b.sass_count(r"\bLDL\b") == 0 and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.parametrize("nb", rst.NBS)
def test_every_width_builds_its_wgmma_without_spills(nb):
    """Every width of `rst.NBS` (multiples of 16 from 64 to 256) builds for sm_90a: 8 wgmma
    m64 n Nb k16 per stage, no local memory, at least 3 stages."""
    cfg = rst.Config(Nb=nb)
    k = rst.GemmNvfp4RegisterATiledSm90(cfg)
    b = build(k, *rst.signature(cfg).compile_args(132), arch="sm_90a")
    assert b.sass_count(rf"HGMMA\.64x{nb}x16") == 8
    assert all(r.local_bytes == 0 for r in b.resources) and b.sass_count(r"\bSTL\b") == 0
    assert k.LOAD_PIPE_DEPTH >= 3


def test_ring_fills_shared_memory(built):
    cfg, k, _ = built
    assert k.LOAD_PIPE_DEPTH == {256: 3, 208: 3, 192: 3, 144: 5, 128: 5, 112: 6, 96: 6, 80: 7,
                                 64: 8}[cfg.Nb]
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
    for nb in (48, 72, 264):
        with pytest.raises(ValueError, match=rf"Nb must be a multiple of 16 from 64 to 256 "
                                             rf".wgmma N., got {nb}"):
            rst.Config(Nb=nb)
    with pytest.raises(ValueError, match="LOAD_PIPE_DEPTH"):
        rst.Config(LOAD_PIPE_DEPTH=1)
    with pytest.raises(ValueError, match="of shared memory; the budget is"):
        rst.GemmNvfp4RegisterATiledSm90(rst.Config(LOAD_PIPE_DEPTH=4))
    with pytest.raises(ValueError, match="N % 8 == 0 .16-byte rows of D., got N=140"):
        rst.check_shape(300, 140, 256)
    with pytest.raises(ValueError, match="N=136 is not a multiple of 128: the Config needs "
                                         "N_TAIL=True"):
        rst.check_shape(300, 136, 256, rst.Config())
    rst.check_shape(300, 136, 256, rst.Config(N_TAIL=True))
    with pytest.raises(ValueError, match="the NVFP4 epilogue writes whole 128-column bands"):
        rst.Config(N_TAIL=True, out_dtype="nvfp4")
    with pytest.raises(ValueError, match="K % 16 == 0 .*got K=8200"):
        rst.check_shape(300, 256, 8200)
    assert rst.supports(300, 256, 8208)  # K % 32 != 0: rows of codes padded to 16 bytes
    with pytest.raises(ValueError, match="K_TAIL=True"):
        rst.check_shape(300, 256, 2880, rst.Config())
    assert rst.supports(1, 256, 128) and rst.supports(5, 200, 128) and not rst.supports(5, 4, 128)
    assert rst.tiles(300, 136, rst.Config(Nb=128)) == 2 * 3  # a partial second band
    assert rst.supports(300, 256, 2880) and rst.supports(300, 256, 32)
    from tk_cute.tuning import sm90 as sm90_tuning

    assert sm90_tuning.register_a_tiled_config(300, 256, 2880, "bfloat16", 132).K_TAIL
    assert not sm90_tuning.register_a_tiled_config(300, 256, 2944, "bfloat16", 132).K_TAIL
    assert sm90_tuning.register_a_tiled_config(300, 2880, 2880, "bfloat16", 132).N_TAIL
    assert not sm90_tuning.register_a_tiled_config(300, 2944, 2880, "bfloat16", 132).N_TAIL
    # N % 128 != 0: the tiled kernel's partial last band, on few weight bands too (23 x 2
    # tiles of 128 rows at 256 rows: sm90_tuning.few_bands_plan's 64-wide whole tiles), but
    # "dequantize" on fewer still (5 bands, K = 2880)
    for w4a4 in (False, True):
        assert sm90_tuning.hopper_path(w4a4, 300, 2880, 2880, 132) == "register_a_tiled"
        assert sm90_tuning.hopper_path(w4a4, 256, 2880, 2880, 132) == "register_a_tiled"
        assert sm90_tuning.hopper_path(w4a4, 256, 576, 2880, 132) == "dequantize"
    assert sm90_tuning.check_hopper_path("register_a_tiled", False, 300, 2880, 2880,
                                        "bfloat16") == "register_a_tiled"


@pytest.mark.parametrize("M, N, nb, stream_k", [
    (129, 8192, 144, True), (200, 8192, 208, True), (257, 8192, 144, False),
    (300, 8192, 160, False), (170, 8192, 176, True), (400, 8192, 208, False),
    (129, 28672, 144, True), (208, 28672, 208, True), (240, 8192, 128, False),
    (240, 28672, 240, True),
    (256, 8192, 128, False), (384, 8192, 192, False), (512, 8192, 256, False),
    (640, 8192, 128, True), (768, 8192, 192, False), (1024, 8192, 256, False),
    (1536, 8192, 256, False), (2048, 8192, 256, True), (3072, 8192, 256, True),
    (4096, 8192, 256, True), (256, 28672, 256, True), (384, 28672, 192, True),
    (512, 28672, 256, True), (768, 28672, 256, True), (1024, 28672, 256, True),
    (1152, 28672, 192, True), (2048, 28672, 256, True)])
def test_tile_width_is_the_faster_measured_one(M, N, nb, stream_k):
    """The schedule the H200 A/Bs measured fastest (docs/facts.md#tiled-widths; 3072 rows: 256
    and 192 within 0.3%; 170, 208 and 400 rows: not measured, the rule's width): up to 208 rows one
    split tile as wide as M (`sm90_tuning.SPLIT_TILE_MAX_M`, stream-K along K); with few weight
    tiles (N = 8192, up to 512 rows) two activation tiles per weight tile, each the narrowest
    of `rst.NBS` covering half the rows; else the rounds model over whole tiles and stream-K
    shares: stream-K where whole tiles would leave the last round part empty (1024 x 8192^2,
    1.94 tiles per SM: whole tiles), 256 wide unless its tiles pad the rows (384: 192)."""
    from tk_cute.tuning import sm90 as sm90_tuning

    cfg = sm90_tuning.register_a_tiled_config(M, N, 8192, "bfloat16", 132)
    assert (cfg.Nb, cfg.STREAM_K) == (nb, stream_k)
    assert cfg.A_SETS == (2 if nb <= 96 else 1)


def test_narrow_tiles_take_two_register_sets_only_at_long_k():
    """Two A register sets up to Nb = 96 from K = 8192 (sm90_tuning.TILED_TWO_SETS_*: slower at
    K = 2880 and from Nb = 112 on, docs/facts.md#tiled-two-sets): 240 rows on 40 weight bands
    are three 80-row tiles per band (`few_tiles_width`)."""
    from tk_cute.tuning import sm90 as sm90_tuning

    cfg = lambda M, K: sm90_tuning.register_a_tiled_config(M, 5120, K, "bfloat16", 132)  # noqa: E731
    assert cfg(240, 8192).Nb == 80 and cfg(240, 8192).A_SETS == 2
    assert cfg(240, 28672).A_SETS == 2
    assert cfg(240, 2880).A_SETS == 1 and cfg(240, 4096).A_SETS == 1
    assert cfg(129, 8192).A_SETS == 1 and cfg(4096, 8192).A_SETS == 1


@pytest.mark.parametrize("N, K", [(128, 2880), (384, 160), (256, 32)])
def test_k_tail_scale_tiles_hold_each_stage_atoms(N, K):
    """With a K tail (`Config.K_TAIL`) the scales are one batch of rows per band: the stage-k
    tile of band b (rows 4k .. 4k + 3 of 256 bytes in batch b) holds exactly the scale bytes of
    rows 128b .. 128b + 127 at K 128k .. 128k + 127 that exist."""
    rk = -(-K // nvfp4_scales.ATOM_K)
    for b in range(N // 128):
        for k in range(-(-K // 128)):
            lo = (b * rk * 2 + 4 * k) * 256
            for m in (0, 31, 32, 77, 127):
                for kb in range(8 * k, min(8 * k + 8, K // 16)):
                    off = nvfp4_scales.blocked_offset(128 * b + m, kb, N, K)
                    assert lo <= off < lo + 1024


def test_packing_matches_dsl():
    rst.compile_launcher(rst.Config(Nb=128), 132, options="--gpu-arch sm_90a")
    rst.compile_launcher(rst.Config(Nb=128, a_format="nvfp4"), 132, options="--gpu-arch sm_90a")


@pytest.mark.parametrize("nb, out, sets", [(256, "bfloat16", 1), (128, "nvfp4", 1),
                                           (80, "nvfp4", 2)])
def test_w4a4_runs_the_w4a16_gemm_after_the_decode_pass(nb, out, sets):
    """W4A4 (`a_format` "nvfp4"): the register-A kernels' decode-permute pass instead of the
    permute kernel, then the W4A16 GEMM unchanged (the same PTX body), no spills."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_nvfp4_register_a_sm90 import _entries

    w16 = rst.Config(Nb=nb, out_dtype=out, A_SETS=sets)
    w4 = dataclasses.replace(w16, a_format="nvfp4")
    b16, b4 = (build(rst.launch_fn(c), *rst.signature(c).compile_args(132), arch="sm_90a")
               for c in (w16, w4))
    gemm = lambda b: [v for k, v in _entries(b.ptx).items() if "permute" not in k]  # noqa: E731
    assert gemm(b16) == gemm(b4) and len(gemm(b4)) == 1
    assert [k for k in _entries(b4.ptx) if "_decode_permute_kernel" in k]
    assert all(k.local_bytes == 0 for k in b4.resources)
    with pytest.raises(ValueError, match="a_format must be one of"):
        rst.Config(a_format="fp8")


# --- GPU --------------------------------------------------------------------------------------


def _weights(N, K):
    from tk_cute.nvfp4 import quantize

    return quantize(torch.randn(N, K, device="cuda") * 0.02)


def _poisoned(M, N, dtype):
    return torch.full((M, N), float("nan"), device="cuda", dtype=dtype)


def _poisoned_nvfp4(M, N, global_scale):
    """An NVFP4Tensor (M, N) out with D's decode scale and 0xFF in every data and scale byte
    (codes -6, scales NaN), on global_scale's device, for a kernel to overwrite."""
    from tk_cute.nvfp4 import NVFP4Tensor

    dev = global_scale.device
    return NVFP4Tensor.trusted(
        torch.full((M, N // 2), 0xFF, dtype=torch.uint8, device=dev),
        torch.full(nvfp4_scales.blocked_shape(M, N), 0xFF, dtype=torch.uint8, device=dev),
        global_scale, (M, N))


def _assert_nvfp4_out_quantizes_fp32(a, b, fp32_cfg, nvfp4_cfg):
    """The fused NVFP4 epilogue of `nvfp4_cfg` is bit for bit `quantize` of the fp32 D of
    `fp32_cfg` (a global scale 1% above the amax: no block saturates)."""
    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch, validate

    (M, _), N = a.shape, b.M
    d32 = launch.gemm_rs_tiled(a, b, torch.float32, config=fp32_cfg)
    g = torch.tensor(1.01 * float(d32.abs().max()) / 2688, device="cuda")
    q = launch.register_a_tiled_nvfp4(a, b, nvfp4_cfg, validate.nvfp4_out(
        (M, N), b.device, _poisoned_nvfp4(M, N, g), g))
    want = nvfp4.quantize(d32, global_scale=g)
    assert torch.equal(q.data, want.data) and torch.equal(q.scales, want.scales)


@pytest.mark.gpu
@pytest.mark.parametrize("nb, sets", [(128, 1), (192, 1), (256, 1), (128, 2), (256, 2), (64, 2),
                                     (80, 2), (96, 2)])
@pytest.mark.parametrize("M, N, K", [(129, 256, 128), (300, 1024, 2048), (1000, 384, 1152),
                                     (256, 8192, 8192), (4097, 512, 256), (300, 384, 2880),
                                     (129, 256, 32), (1000, 256, 160)])
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


def test_partial_weight_bands_build_their_column_check():
    """`Config.N_TAIL` (N % 128 != 0): the same wgmma and stores, each store behind a column
    check too (more compares), no spills."""
    whole, tail = rst.Config(Nb=128), rst.Config(Nb=128, N_TAIL=True)
    b0, b1 = (build(rst.GemmNvfp4RegisterATiledSm90(c), *rst.signature(c).compile_args(132),
                    arch="sm_90a") for c in (whole, tail))
    assert b1.sass_count(r"HGMMA\.64x128x16") == b0.sass_count(r"HGMMA\.64x128x16") == 8
    assert b1.ptx_count(r"st\.global\.b16") == b0.ptx_count(r"st\.global\.b16") == 64
    assert b1.ptx_count(r"setp\.") > b0.ptx_count(r"setp\.")
    assert all(r.local_bytes == 0 for r in b1.resources) and b1.sass_count(r"\bSTL\b") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(300, 2880, 2880), (129, 136, 48), (1000, 4000, 8192),
                                     (257, 8, 256), (200, 2880, 8208), (600, 1000, 512)])
def test_partial_weight_bands_match_the_exact_product(seed, M, N, K):
    """N % 128 != 0 (gpt-oss's 2880, the issue's 136 and 4000, N = 8): every element of
    bf16 / fp32 / fp16 D within the exact product's bound, nothing written past the M x N
    output (a poisoned guard after it stays NaN), whole tiles and stream-K, W4A16 and W4A4,
    through the public `gemm(path="register_a_tiled")`."""
    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch
    from tk_cute.testing import assert_gemm_close

    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    aq = nvfp4.quantize(a.float())
    for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
        for stream_k in (False, True):
            cfg = rst.Config(Nb=128, STREAM_K=stream_k)
            flat = torch.full((M * N + 4096,), float("nan"), device="cuda", dtype=out_dtype)
            d = launch.gemm_rs_tiled(a, b, out=flat[:M * N].view(M, N), config=cfg)
            assert_gemm_close(d, a, b, f"N={N} stream-K={stream_k} {out_dtype}")
            assert flat[M * N:].isnan().all(), "a store past the output"
        d4 = nvfp4.gemm(aq, b, out_dtype, out=_poisoned(M, N, out_dtype),
                        path="register_a_tiled")
        assert_gemm_close(d4, aq, b, f"W4A4 N={N} {out_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("nb", [nb for nb in rst.NBS if nb not in (128, 192, 256)])
@pytest.mark.parametrize("M, N, K", [(129, 256, 128), (300, 1024, 2048), (257, 8192, 2880)])
def test_narrow_widths_match_the_exact_product(seed, nb, M, N, K):
    """The other widths (`rst.NBS`, picked by `sm90_tuning.few_tiles_width`), every element of
    three output types (K = 2880: a partial last stage)."""
    from tk_cute.nvfp4 import launch
    from tk_cute.testing import assert_gemm_close

    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)  # poison
        d = launch.gemm_rs_tiled(a, b, out=out, config=rst.Config(Nb=nb))
        assert_gemm_close(d, a, b, f"Nb={nb} {out_dtype}")


@pytest.mark.parametrize("M, N, K, nb, sms", [
    (130, 256, 400, 64, 2),  # 3 x 2 tiles on 2 CTAs, 4 stages (a partial last one)
    (70, 200, 2880, 80, 1)])  # a partial band, 23 stages; both tiles on one CTA
def test_whole_tiles_in_the_emulator(seed, M, N, K, nb, sms):
    """The permute pass and the tiled GEMM's whole tiles run in the emulator on fresh random
    operands, several tiles per CTA, D poisoned: every element within the exact product's
    bound, no hazard."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize
    from tk_cute.testing import assert_gemm_close

    cfg = rst.Config(Nb=nb, K_TAIL=K % rst.STAGE_K != 0, N_TAIL=N % rst.ROWS != 0)
    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=g))
    a = torch.randn(M, K, generator=g).bfloat16()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    machines = hopper.register_a_tiled(a, b, cfg, out, sms)
    assert [h for m in machines for h in m.hazards] == []
    assert len(machines) == 2  # the permute pass, the GEMM
    assert_gemm_close(out, a, b, f"{cfg}")
    with pytest.raises(ValueError, match="whole tiles on bf16 activations into a dense D"):
        hopper.register_a_tiled(a, b, rst.Config(Nb=nb, STREAM_K=True), out, sms)


def test_emulated_gemm_runs_the_planned_whole_tiles(seed):
    """`emulator.gemm.gemm(..., arch="sm_90a")` runs the tiled plan's whole tiles (bf16
    activations) on fresh random operands: every element within the exact product's bound;
    a stream-K plan is refused, naming it."""
    from tk_cute.emulator import gemm as G
    from tk_cute.nvfp4 import quantize
    from tk_cute.testing import assert_gemm_close

    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(2048, 512, generator=g))
    a = torch.randn(300, 512, generator=g).bfloat16()
    run = G.gemm(a, b, arch="sm_90a")
    assert run.kernel == "register_a_tiled" and not run.config.STREAM_K
    assert [h for m in run.machines for h in m.hazards] == []
    assert_gemm_close(run.out, a, b, f"{run.config}")
    with pytest.raises(G.NoKernel, match=r"whole tiles on bf16 .*plans "
                                         r"register_a_tiled\(Nb=144, stream-K teams\)"):
        G.gemm(torch.randn(129, 2048).bfloat16(), quantize(torch.randn(2048, 2048)),
               arch="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(256, 2880, 2880), (256, 1536, 7168), (1024, 576, 7168)])
def test_few_band_plans_match_the_exact_product(seed, M, N, K):
    """The plans on few weight bands (`sm90_tuning.few_bands_plan`: 64-wide whole tiles with a
    K tail and a partial band; teams of 5 and of 3 parts of 128-wide tiles) through the public
    dispatch, W4A16 and W4A4, fp32 and bf16 out: every element within the exact product's
    bound, poisoned D."""
    from tk_cute import nvfp4
    from tk_cute.testing import assert_gemm_close
    from tk_cute.tuning import sm90 as sm90_tuning

    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    aq = nvfp4.quantize(a.float())
    for x in (a, aq):
        p = nvfp4.plan(x, b)
        assert p.path == "register_a_tiled", p
        assert p.config.TEAMS == (K >= sm90_tuning.FEW_BANDS_TEAMS_MIN_K)
        for out_dtype in (torch.float32, torch.bfloat16):
            d = nvfp4.gemm(x, b, out=_poisoned(M, N, out_dtype))
            assert_gemm_close(d, x, b, f"{p} {out_dtype}")


@pytest.mark.gpu
def test_deterministic_and_public_dispatch(seed):
    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch
    from tk_cute.testing import assert_gemm_close

    M, N, K = 600, 2048, 4096  # dispatch takes this kernel (16 bands x 5 tiles)
    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    d = launch.gemm_rs_tiled(a, b, torch.float32, out=_poisoned(M, N, torch.float32))
    again = launch.gemm_rs_tiled(a, b, torch.float32, out=_poisoned(M, N, torch.float32))
    assert torch.equal(d, again)  # one order of sums (an unwritten NaN element fails too)
    assert nvfp4.plan(a, b).path == "register_a_tiled"
    assert torch.equal(nvfp4.gemm(a, b, torch.float32, out=_poisoned(M, N, torch.float32)), d)
    aq = nvfp4.quantize(a.float())
    p = nvfp4.plan(aq, b)
    assert p.path == "register_a_tiled" and p.config.a_format == "nvfp4"
    assert_gemm_close(nvfp4.gemm(aq, b, out=_poisoned(M, N, torch.bfloat16)), aq, b,
                      "W4A4 decoded in the tiled kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, nb, sets", [
    (200, 256, 512, 128, 1), (1000, 384, 1152, 256, 1), (257, 1024, 2048, 256, 1),
    (300, 256, 2880, 128, 1), (200, 8192, 512, 112, 1), (257, 1024, 2880, 144, 1),
    (129, 8192, 8192, 80, 2)])
def test_w4a4_in_kernel_decode_equals_w4a16_on_decoded_activations(seed, M, N, K, nb, sets):
    """W4A4 on the tiled kernel (activations decoded in its permute pass, D's scale written by
    that pass) is bit for bit the W4A16 kernel on the exactly decoded activations with D's
    scale gA * gB, for bf16 / fp32 and fused NVFP4 output."""
    import dataclasses

    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch, validate

    b = _weights(N, K)
    a = nvfp4.quantize(torch.randn(M, K, device="cuda"))
    a16, gs = launch.dequantize_blocks(a), a.global_scale * b.global_scale
    for out_dtype in ("bfloat16", "float32"):
        w16 = rst.Config(Nb=nb, A_SETS=sets, out_dtype=out_dtype, K_TAIL=K % rst.STAGE_K != 0)
        w4 = dataclasses.replace(w16, a_format="nvfp4")
        d4 = launch.register_a_tiled(a, b, _poisoned(M, N, getattr(torch, out_dtype)), w4)
        d16 = launch.register_a_tiled(a16, b, _poisoned(M, N, getattr(torch, out_dtype)), w16,
                                      gs)
        assert not d4.isnan().any() and torch.equal(d4, d16)
    g = torch.tensor(float(d16.abs().max()) / 2688, device="cuda")
    w16 = rst.Config(Nb=nb, A_SETS=sets, K_TAIL=K % rst.STAGE_K != 0)
    q4 = launch.register_a_tiled_nvfp4(a, b, dataclasses.replace(w16, a_format="nvfp4"),
                                       validate.nvfp4_out((M, N), b.device, _poisoned_nvfp4(
                                           M, N, g), g))
    q16 = launch.register_a_tiled_nvfp4(a16, b, w16, validate.nvfp4_out(
        (M, N), b.device, _poisoned_nvfp4(M, N, g), g), gs)
    assert torch.equal(q4.data, q16.data) and torch.equal(q4.scales, q16.scales)


# --- NVFP4 output (the fused epilogue) ---------------------------------------------------------


@pytest.mark.parametrize("nb, sets", [(128, 1), (256, 1), (80, 2)])
def test_nvfp4_epilogue_compiles_to_the_recipe(nb, sets):
    cfg = rst.Config(Nb=nb, out_dtype="nvfp4", A_SETS=sets)
    b = build(rst.GemmNvfp4RegisterATiledSm90(cfg), *rst.signature(cfg).compile_args(132),
              arch="sm_90a")
    columns = nb // 4  # accumulator columns per thread, each one 16-element block of D
    assert b.ptx_count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == columns  # one scale per block
    assert b.ptx_count(r"selp\.f32") >= columns  # zero-scale blocks: s_enc = 0
    assert b.ptx_count(r"div\.rn\.f32") == 2 * columns + 1  # amax / 6, 1 / d; 1 / s_dec_g
    assert b.ptx_count(r"\bfma\.") == 0  # the recipe forbids contraction
    assert b.ptx_count(r"st\.global\.(u8|b8)") == 3 * columns  # 2 code bytes + 1 scale byte
    assert b.ptx_count(r"atom\.global\.or|red\.global\.or") == 1  # the saturation flag
    assert b.resources[0].local_bytes == 0 and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.parametrize("nb", [128, 256])
def test_nvfp4_epilogue_addresses_are_the_blocked_layout(nb):
    """Every (row, 16-column block) of a tile gets its scale byte at `blocked_offset`, and the
    even lane groups' code bytes cover each block's 8 bytes exactly once."""
    M, N = 1000, 1024
    rk = N // nvfp4_scales.ATOM_K
    for tile_r in range(N // rst.ROWS):
        for warp_rows in range(0, rst.ROWS, 16):  # the 8 warps' 16-row (16-column) blocks
            n_w = tile_r * rst.ROWS + warp_rows
            for m in range(0, M, 37):
                assert nvfp4_scales.band_offset(m, n_w // 16, rk) == (
                    nvfp4_scales.blocked_offset(m, n_w // 16, M, N))
            written = sorted(rst.nvfp4_out_byte(n_w, gq, h) for gq in range(0, 8, 2)
                             for h in range(2))
            assert written == list(range(n_w // 2, n_w // 2 + 8))


def _block_bound(q):
    """Per element of an NVFP4Tensor's decode: its block's decode scale d = sf * g (an E2M1
    code is within half its spacing, <= 1 in units of d; a clipped element within 6 * 2^-4 d)."""
    from tk_cute.nvfp4.format import e4m3_decode

    sf = e4m3_decode(q.scales_logical()).double() * q.global_scale.double()
    return sf.repeat_interleave(16, dim=-1)


def test_nvfp4_output_on_cpu_and_bad_input(seed):
    from tk_cute import nvfp4

    b = nvfp4.quantize(torch.randn(64, 128))
    a = torch.randn(5, 128).bfloat16()
    d = nvfp4.w4a16_reference(a, b, torch.float32).double()
    g = 1.01 * float(d.abs().max()) / 2688  # (1.01: no block at the rounding edge of 448)
    q = nvfp4.gemm(a, b, "nvfp4", out_global_scale=g)
    assert isinstance(q, nvfp4.NVFP4Tensor) and q.shape == (5, 64)
    assert int(q.saturated) == 0
    err = (q.dequantize(torch.float64) - d).abs()
    assert (err <= _block_bound(q) + 1e-30).all()
    tiny = nvfp4.gemm(a, b, "nvfp4", out_global_scale=g / 4)  # blocks past 448 * 6 * g / 4
    assert int(tiny.saturated) == 1
    out = _poisoned_nvfp4(5, 64, q.global_scale)
    assert nvfp4.gemm(a, b, out=out) is out and torch.equal(out.data, q.data)
    assert torch.equal(out.scales, q.scales) and int(out.saturated) == 0
    with pytest.raises(ValueError, match="N % 16 == 0"):
        nvfp4.gemm(a[:, :32], nvfp4.quantize(torch.randn(24, 32)), "nvfp4",
                   out_global_scale=1.0)
    with pytest.raises(TypeError, match="exactly one of global_scale"):
        nvfp4.gemm(a, b, "nvfp4")
    with pytest.raises(ValueError, match="positive, finite"):
        nvfp4.gemm(a, b, "nvfp4", out_global_scale=-1.0)
    with pytest.raises(TypeError, match="only with out_dtype 'nvfp4'"):
        nvfp4.gemm(a, b, torch.bfloat16, out_global_scale=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(300, 1024, 1024), (4097, 512, 256), (600, 8192, 8192)])
def test_fused_nvfp4_output_is_the_quantized_fp32_output(seed, M, N, K):
    """Bit for bit: the fused epilogue's bytes equal the CUDA quantizer's on the same kernel's
    fp32 output, with the same global scale; also with all-zero rows, a saturating global scale
    (reported) and W4A4 (decoded activations)."""
    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch, validate

    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    a[7] = 0  # an all-zero row of D: zero scales, codes +0
    cfg = rst.Config(Nb=256 if M >= 512 else 128)
    d32 = launch.gemm_rs_tiled(a, b, torch.float32, out=_poisoned(M, N, torch.float32),
                               config=cfg)
    amax = float(d32.abs().max())
    for g, saturates in ((1.01 * amax / 2688, 0), (amax / 2688 / 8, 1)):  # (1.01: rounding)
        gs = torch.tensor(g, device="cuda")
        out = validate.nvfp4_out((M, N), b.device, _poisoned_nvfp4(M, N, gs), gs)
        q = launch.register_a_tiled_nvfp4(a, b, cfg, out)
        assert q is out
        want = nvfp4.quantize(d32, global_scale=gs)
        assert torch.equal(q.data, want.data) and torch.equal(q.scales, want.scales)
        assert int(q.saturated) == saturates
    tiled = "register_a_tiled"  # (forced: the dispatch picks it where not dequantize_wins)
    assert nvfp4.plan(a, b, torch.float32, path=tiled).path == tiled
    # the fused path; the plan's schedule may differ from cfg's (stream-K: other fp32 sums)
    public = nvfp4.gemm(a, b, "nvfp4", out_global_scale=gs, path=tiled)
    want = nvfp4.quantize(nvfp4.gemm(a, b, torch.float32, path=tiled), global_scale=gs)
    assert torch.equal(public.data, want.data) and torch.equal(public.scales, want.scales)
    aq = nvfp4.quantize(a.float())
    fused = nvfp4.gemm(aq, b, "nvfp4", out_global_scale=gs, path=tiled)
    want = nvfp4.quantize(nvfp4.gemm(aq, b, torch.float32, path=tiled), global_scale=gs)
    assert torch.equal(fused.data, want.data) and torch.equal(fused.scales, want.scales)


@pytest.mark.gpu
def test_unfused_nvfp4_output_paths(seed):
    """Shapes without the fused epilogue (small M, K % 128, a partial weight band: the split
    tile at 200 x 1040) quantize the fp32 output: decodes within each block's spacing of the
    exact product, saturation reported."""
    from tk_cute import nvfp4
    from tk_cute.testing import gemm_bound

    assert nvfp4.plan(torch.empty(200, 1024, device="cuda", dtype=torch.bfloat16),
                      _weights(1040, 1024), torch.float32).config.N_TAIL
    for M, N, K in ((16, 1024, 1024), (3, 256, 48), (200, 1040, 1024)):
        b = _weights(N, K)
        a = torch.randn(M, K, device="cuda").bfloat16()
        d = nvfp4.w4a16_reference(a, b, torch.float32).double()
        g = 1.01 * float(d.abs().max()) / 2688
        q = nvfp4.gemm(a, b, "nvfp4", out_global_scale=g)
        assert int(q.saturated) == 0
        dq = q.dequantize(torch.float64)
        # The derived bound. `exact` (the float64 product of the exactly decoded operands) is
        # within gemm_bound's fp32 bound of the kernel's fp32 D; the encode of that D (quantize
        # docstring; no saturation: t <= 2688 / 6 / 1.01 < 448) errs by at most the block's
        # decode scale S = sf * g in a normal block (half the largest E2M1 gap, 1 in units of S;
        # a clipped element: sf >= t / (1 + 2^-4), so at most 6 * 2^-4 / (1 - 2^-4) S), by at
        # most 6 * 2^-10 g = 3 * 2^-9 g in a subnormal or zero one (t - sf <= 2^-10); 2^-20
        # relative for the fp32 roundings of t, d and 1 / d.
        exact, fp32_bound = gemm_bound(a, b, torch.float32)
        gq = q.global_scale.double()
        encode = torch.clamp(_block_bound(q), min=3 * 2.0**-9 * gq) * (1 + 2.0**-20)
        assert ((dq - exact).abs() <= encode + fp32_bound).all()
        # The earlier, empirical bound, kept so that no element's tolerance grows (the derived
        # one is tighter except in blocks of small S, where its worst-case fp32 term,
        # (K + 16) 2^-24 |a| @ |b|^T, dominates): 1.01 S (the encode, with room for its
        # roundings) plus 1e-6 max |d| (the fp32 sums' error as observed, not a worst case).
        assert ((dq - d).abs() <= 1.01 * _block_bound(q) + 1e-6 * d.abs().max()).all()


# --- stream-K ----------------------------------------------------------------------------------


def _segments(cta, ctas, tiles, k_steps):
    """The (tile, k0, k1) segments of CTA `cta`'s share, walked as `LCF._consume_shares` does
    (`schedule.Shares`)."""
    from tk_cute.ops import schedule

    out = []
    u, end = schedule.stream_k_share(cta, ctas, tiles * k_steps)
    while u < end:
        t, k0 = divmod(u, k_steps)
        k1 = min(k_steps, k0 + end - u)
        out.append((t, k0, k1))
        u += k1 - k0
    return out


@pytest.mark.parametrize("tiles, k_steps", [
    (224, 64), (448, 8), (132, 23), (1120, 4), (133, 1), (7168, 64), (64, 64), (40, 64),
    (96, 64), (16, 23), (16, 3), (1, 64), (1, 300), (100, 1), (131, 7), (3, 5), (264, 64),
    (160, 64), (640, 64)])
def test_stream_k_shares_hand_each_split_tile_to_its_head(tiles, k_steps):
    """On `schedule.stream_k_grid`'s grid (132 SMs) every tile's K steps are covered once and
    every share is at least one unit. A tile's first segment (k0 = 0) is its head and the last
    segment of its CTA c; its other parts are the first (and, inside the tile, only) segments
    of CTAs c + 1 .. `stream_k_owner` of the tile's last unit, so each CTA writes at most one
    partial, no slot is shared, and a head waits only for CTAs after its own. At least as many
    tiles as CTAs: at most two CTAs per tile; fewer, on an aligned grid (`stream_k_grid`'s
    split): exactly `split` CTAs per tile."""
    from tk_cute.ops import schedule

    ctas = schedule.stream_k_grid(tiles, k_steps, 132)
    units = tiles * k_steps
    covered = {}
    for c in range(ctas):
        shared = _segments(c, ctas, tiles, k_steps)
        assert shared, f"CTA {c} has an empty share"
        for i, (t, k0, k1) in enumerate(shared):
            covered.setdefault(t, []).append((k0, k1, c))
            if k0 > 0:
                assert i == 0  # a part after the head opens its share (its one partial)
            elif k1 < k_steps:
                assert i == len(shared) - 1  # a head closes it
    assert sorted(covered) == list(range(tiles))
    for t, parts in covered.items():
        parts.sort()
        assert parts[0][0] == 0 and parts[-1][1] == k_steps
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, once
        head = parts[0][2]
        last = schedule.stream_k_owner(t * k_steps + k_steps - 1, ctas, units)
        assert [c for _, _, c in parts] == list(range(head, last + 1))
        if tiles >= 132:
            assert ctas == 132 and len(parts) <= 2
        elif ctas % tiles == 0:
            assert len(parts) == ctas // tiles


@pytest.mark.parametrize("tiles, k_steps", [(64, 64), (64, 23), (63, 32), (23, 23), (8, 64),
                                            (16, 3), (44, 2), (66, 5), (2, 300)])
def test_stream_k_teams_cover_each_tile_and_warp_once(tiles, k_steps):
    """On `schedule.stream_k_team_grid`'s grid (132 SMs), as `LCF._consume_team` walks it: each
    CTA's share is one segment of tile cta // team, part cta % team (the kernel's arithmetic:
    team = ctas // (units // k_steps)); a tile's parts cover its K steps once; each of the 8
    consumer warps' rows of a tile is finished by exactly one part (w % team), which waits for
    the flag (cta, w) of every other part, and every such flag is released by exactly its
    part's warp w: no flag waited for that nobody releases, none released twice."""
    from tk_cute.ops import schedule

    ctas = schedule.stream_k_team_grid(tiles, k_steps, 132)
    team = ctas // (tiles * k_steps // k_steps)
    assert 2 <= team <= schedule.TEAM_MAX and ctas == team * tiles <= 132
    released, waited, finished = set(), set(), {}
    for c in range(ctas):
        (t, k0, k1), = _segments(c, ctas, tiles, k_steps)  # one segment per CTA
        part = c % team
        assert t == c // team and (k0 == 0) == (part == 0) and (k1 == k_steps) == (
            part == team - 1)
        for w in range(schedule.TEAM_MAX):
            if w % team == part:
                finished.setdefault((t, w), []).append(c)
                waited |= {(c - part + j, w) for j in range(team) if j != part}
            else:
                assert (c, w) not in released
                released.add((c, w))
    assert waited == released
    assert all(len(cs) == 1 for cs in finished.values())
    assert sorted(finished) == [(t, w) for t in range(tiles) for w in range(schedule.TEAM_MAX)]
    for t in range(tiles):
        parts = [_segments(c, ctas, tiles, k_steps)[0] for c in range(t * team, (t + 1) * team)]
        assert parts[0][1] == 0 and parts[-1][2] == k_steps
        assert all(a[2] == b[1] for a, b in zip(parts, parts[1:]))  # contiguous, once


@pytest.mark.parametrize("nb, out, a_format", [(256, "bfloat16", "bf16"), (192, "nvfp4", "bf16"),
                                              (128, "float32", "nvfp4")])
def test_stream_k_builds_its_handover(nb, out, a_format):
    """STREAM_K (the schedules the dispatch picks, W4A4 and NVFP4 output too): the tile loop's
    wgmma unchanged, the flag handover (an acquire loop, one release), Nb / 2 fp32 partial
    stores and loads per thread, no spills; the grid check."""
    cfg = rst.Config(Nb=nb, STREAM_K=True, out_dtype=out, a_format=a_format)
    b = build(rst.launch_fn(cfg), *rst.signature(cfg).compile_args(132), arch="sm_90a")
    assert b.sass_count(rf"HGMMA\.64x{nb}x16") == 8
    assert b.ptx_count(r"ld\.acquire\.gpu\.global\.b32") >= 1
    assert b.ptx_count(r"st\.release\.gpu\.global\.b32") == 1
    assert b.ptx_count(r"st\.global\.f32") >= nb // 2
    assert b.ptx_count(r"ld\.global\.b32") >= nb // 2
    assert all(r.local_bytes == 0 for r in b.resources) and b.sass_count(r"\bSTL\b") == 0
    assert rst.partial_bytes(cfg) == 128 * nb * 4


@pytest.mark.parametrize("nb", [208, 128])
def test_stream_k_vector_partials_build(nb):
    """PARTIAL_V4 (`StreamK.partial_v4`): the partials move as 16-byte vectors, Nb / 8 stores and
    loads per thread and no scalar fp32 partial access left; the wgmma and no spills as
    before."""
    cfg = rst.Config(Nb=nb, STREAM_K=True, PARTIAL_V4=True)
    b = build(rst.launch_fn(cfg), *rst.signature(cfg).compile_args(132), arch="sm_90a")
    assert b.sass_count(rf"HGMMA\.64x{nb}x16") == 8
    assert b.ptx_count(r"st\.global\.v4\.f32") >= nb // 8
    assert b.ptx_count(r"ld\.global\.v4\.f32") >= nb // 8
    assert b.ptx_count(r"st\.global\.f32") == 0
    assert all(r.local_bytes == 0 for r in b.resources) and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.parametrize("nb, out", [(208, "bfloat16"), (144, "float32")])
def test_stream_k_teams_build(nb, out):
    """TEAMS (`StreamK.teams`): the hand-over as warps (acquire loops, one release, warp
    barriers), the wgmma and no spills as before; the Config check and the team grid
    (`schedule.stream_k_team_grid`)."""
    from tk_cute.ops import schedule

    cfg = rst.Config(Nb=nb, STREAM_K=True, TEAMS=True, out_dtype=out)
    b = build(rst.launch_fn(cfg), *rst.signature(cfg).compile_args(132), arch="sm_90a")
    assert b.sass_count(rf"HGMMA\.64x{nb}x16") == 8
    assert b.ptx_count(r"ld\.acquire\.gpu\.global\.b32") >= 1
    assert b.ptx_count(r"st\.release\.gpu\.global\.b32") == 1
    assert b.ptx_count(r"bar\.warp\.sync") >= 3
    assert all(r.local_bytes == 0 for r in b.resources) and b.sass_count(r"\bSTL\b") == 0
    with pytest.raises(ValueError, match="STREAM_K=True"):
        rst.Config(Nb=nb, TEAMS=True)
    from tk_cute.templates.lcf import WholeTiles
    from tk_cute.templates.stream_k import StreamK

    k = rst.kernel_for(cfg)  # the stream-K schedule, with the config's hand-over flags
    assert isinstance(k.sched, StreamK) and k.sched.teams and k.sched.partial_v4 is False
    assert isinstance(rst.kernel_for(rst.Config(Nb=nb)).sched, WholeTiles)
    assert schedule.stream_k_team_grid(64, 64, 132) == 128  # two parts per tile
    assert schedule.stream_k_team_grid(23, 23, 132) == 115  # five
    assert schedule.stream_k_team_grid(8, 64, 132) == 64  # at most TEAM_MAX (8 warps)
    assert schedule.stream_k_team_grid(16, 3, 132) == 48  # at most the K steps
    with pytest.raises(ValueError, match="two parts per tile"):
        schedule.stream_k_team_grid(128, 64, 132)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, nb", [(256, 28672, 1024, 256), (1000, 8192, 2880, 256),
                                         (520, 28672, 512, 128), (384, 28672, 4096, 192),
                                         (2000, 16896, 256, 256),
                                         # fewer tiles than SMs: 2, 3, 8, 4 CTAs per tile
                                         (200, 8192, 8192, 208), (256, 5120, 1024, 256),
                                         (129, 2048, 2880, 144), (300, 1024, 512, 256)])
def test_stream_k_matches_the_exact_product_and_the_whole_tile_kernel(seed, M, N, K, nb):
    """Stream-K (tiles split between two CTAs, K tails, shares shorter and longer than a
    tile; fewer tiles than SMs: each split into equal parts, the last ones one stage): every
    element of bf16 / fp32 / fp16 D within the exact product's bound, run twice bit for bit
    (the handover flags were left clear), W4A4 too, and NVFP4 output bit for bit the
    quantized fp32 output."""
    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch
    from tk_cute.testing import assert_gemm_close

    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    cfg = rst.Config(Nb=nb, STREAM_K=True, K_TAIL=K % rst.STAGE_K != 0)
    for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
        d = launch.gemm_rs_tiled(a, b, out=_poisoned(M, N, out_dtype), config=cfg)
        assert_gemm_close(d, a, b, f"stream-K Nb={nb} {out_dtype}")
        again = launch.gemm_rs_tiled(a, b, out=_poisoned(M, N, out_dtype), config=cfg)
        assert torch.equal(d, again)
    _assert_nvfp4_out_quantizes_fp32(a, b, cfg, cfg)
    import dataclasses

    aq = nvfp4.quantize(a.float())
    w4 = dataclasses.replace(cfg, a_format="nvfp4")
    d4 = launch.register_a_tiled(aq, b, _poisoned(M, N, torch.bfloat16), w4)
    assert_gemm_close(d4, aq, b, "stream-K W4A4")


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, nb", [(200, 8192, 8192, 208), (129, 8192, 2880, 144),
                                         (150, 8000, 4096, 160), (129, 2880, 2880, 144),
                                         (100, 1024, 8192, 112)])
def test_stream_k_teams_match(seed, M, N, K, nb):
    """TEAMS: two parts per tile (64 tiles; an odd 23 K steps; a partial band on 63 tiles)
    sum what the head-takes-all hand-over sums: D bit for bit its D, fp32 and bf16 out (and
    with 16-byte partials), W4A4 too, NVFP4 out bit for bit; five parts (23 tiles) and eight
    (8 tiles): within the exact product's bound and the same on a second run. Poisoned D."""
    import dataclasses

    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs

    from tk_cute import nvfp4
    from tk_cute.nvfp4 import launch
    from tk_cute.ops.schedule import stream_k_grid, stream_k_team_grid
    from tk_cute.runtime import sm_count
    from tk_cute.testing import assert_gemm_close

    cfg = rst.Config(Nb=nb, STREAM_K=True, K_TAIL=K % rst.STAGE_K != 0,
                     N_TAIL=N % rst.ROWS != 0)
    tiles, k_steps = rst.tiles(M, N, cfg), rs.k_blocks(cfg.K_TAIL, K)
    sms = sm_count(torch.device("cuda"))
    team_ctas = stream_k_team_grid(tiles, k_steps, sms)
    same_sums = team_ctas == 2 * tiles == stream_k_grid(tiles, k_steps, sms)
    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    teams = dataclasses.replace(cfg, TEAMS=True)
    for c in (teams, dataclasses.replace(teams, PARTIAL_V4=True)):
        for out_dtype in (torch.float32, torch.bfloat16):
            d = launch.gemm_rs_tiled(a, b, out=_poisoned(M, N, out_dtype), config=c)
            assert_gemm_close(d, a, b, f"stream-K teams Nb={nb} {out_dtype}")
            again = launch.gemm_rs_tiled(a, b, out=_poisoned(M, N, out_dtype),
                                         config=cfg if same_sums else c)
            assert torch.equal(d, again)
    aq = nvfp4.quantize(a.float())
    w4 = [launch.register_a_tiled(aq, b, _poisoned(M, N, torch.bfloat16),
                                  dataclasses.replace(c, a_format="nvfp4"))
          for c in (teams, cfg if same_sums else teams)]
    assert_gemm_close(w4[0], aq, b, "stream-K teams W4A4")
    assert torch.equal(w4[0], w4[1])
    if not cfg.N_TAIL:  # (the NVFP4 epilogue writes whole bands)
        _assert_nvfp4_out_quantizes_fp32(a, b, teams, teams)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, nb", [(200, 8192, 8192, 208), (129, 2048, 2880, 144),
                                         (113, 4000, 8208, 128)])
def test_stream_k_vector_partials_match(seed, M, N, K, nb):
    """PARTIAL_V4 moves the same sums in the same order as the scalar hand-over: D bit for bit
    that of PARTIAL_V4=False (fp32 out: no rounding hides a lost part), and within the exact
    product's bound, every element written (poisoned D; K tail and a partial band too)."""
    import dataclasses

    from tk_cute.nvfp4 import launch
    from tk_cute.testing import assert_gemm_close

    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    cfg = rst.Config(Nb=nb, STREAM_K=True, K_TAIL=K % rst.STAGE_K != 0,
                     N_TAIL=N % rst.ROWS != 0)
    v4 = dataclasses.replace(cfg, PARTIAL_V4=True)
    d = launch.gemm_rs_tiled(a, b, out=_poisoned(M, N, torch.float32), config=v4)
    assert_gemm_close(d, a, b, f"stream-K v4 partials Nb={nb}")
    assert torch.equal(d, launch.gemm_rs_tiled(a, b, out=_poisoned(M, N, torch.float32),
                                               config=cfg))


@pytest.mark.gpu
def test_stream_k_replays_in_a_cuda_graph(seed):
    """A captured stream-K GEMM replayed: each replay sets and clears its handover flags, so
    every replay equals the eager result (new inputs copied in between)."""
    from tk_cute.nvfp4 import launch

    M, N, K = 256, 28672, 512
    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    cfg = rst.Config(Nb=256, STREAM_K=True)
    launch.gemm_rs_tiled(a, b, config=cfg)  # compile outside the capture
    out = _poisoned(M, N, torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            launch.gemm_rs_tiled(a, b, out=out, config=cfg)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        a.copy_(torch.randn(M, K, device="cuda").bfloat16())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, launch.gemm_rs_tiled(a, b, config=cfg))
