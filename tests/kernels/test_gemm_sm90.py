"""Hopper GEMM (kernels/gemm/gemm_sm90.py): compile checks on the CPU, numerics on the GPU."""

import dataclasses

import pytest
import torch

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from tk_cute.arch import target
from tk_cute.compile import build
from tk_cute.kernels.gemm import gemm_sm90
from tk_cute.kernels.gemm.gemm_sm90 import Config, GemmSm90

SMS = 132  # H100/H200: the persistent grid size the compile assumes


def _fake(dtype, rows, cols):
    r, c = cute.sym_int64(divisibility=128), cute.sym_int64(divisibility=128)
    return make_fake_tensor(dtype, (r, c, 1), (c, 1, r * c), assumed_align=16)


@pytest.fixture(scope="module", params=["bfloat16", "float8_e4m3fn"])
def built(request):
    from cuda.bindings import driver as cuda

    k = GemmSm90(Config(dtype=request.param))
    a = _fake(k.a_tile.dtype, 0, 0)
    b = _fake(k.b_tile.dtype, 0, 0)
    c = _fake(cutlass.BFloat16, 0, 0)
    return request.param, k, build(k, a, b, c, SMS, cuda.CUstream(0), arch="sm_90a")


def test_compiles_to_wgmma_tma_setmaxnreg_without_spills(built):
    dtype, k, b = built
    inst = "m64n256k16.f32.bf16.bf16" if dtype == "bfloat16" else "m64n256k32.f32.e4m3.e4m3"
    # 4 MMA K-steps per stage, issued once in the consumer loop.
    assert b.ptx_count(rf"wgmma\.mma_async\.sync\.aligned\.{inst}") == 4
    assert b.sass_count("HGMMA" if dtype == "bfloat16" else "QGMMA") == 4
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global\.tile\.mbarrier") >= 2
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta") >= 1  # TMA store
    assert b.ptx_count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232") == 1
    assert b.ptx_count(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40") == 1
    assert b.ptx_count(r"stmatrix") > 0
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0
    assert b.sass_count(r"\bSTL\b") == 0 and b.sass_count(r"\bLDL\b") == 0


def test_shared_memory_fits_the_target(built):
    _, k, _ = built
    assert k.LOAD_PIPE_DEPTH == 4  # 48 KiB per stage + 32 KiB of epilogue buffers
    assert k.dynamic_shared_memory() <= target("sm_90a").smem_bytes


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dtype="float32"), "input dtype"),
        (dict(out_dtype="float64"), "out_dtype"),
        (dict(Nb=72), "tile must be"),
        (dict(Mb=96), "tile must be one of \\(64, 128, 192\\) rows"),
        (dict(Mb=256), "tile must be one of \\(64, 128, 192\\) rows"),
        (dict(Mb=192, Nb=208), "192-row tile is at most 192 wide"),
        (dict(EPI_N=64), "EPI_N must be 16 or 32"),
        (dict(Nb=80), "EPI_N must be 16 or 32 columns dividing Nb=80, got 32"),
        (dict(Nb=96, EPI_N=32, EPI_PIPE_DEPTH=4), "EPI_PIPE_DEPTH must be 1 to Nb / EPI_N = 3"),
        (dict(arch="sm_100a"), "needs wgmma"),
        (dict(CLUSTER_M=4, CLUSTER_N=2), "exceeds 4"),
        (dict(LOAD_PIPE_DEPTH=6), "shared memory"),
        ({"SPLIT_K": 0}, "SPLIT_K must be 1 to 32 K ranges per tile, got 0"),
        ({"SPLIT_K": 33}, "SPLIT_K must be 1 to 32 K ranges per tile, got 33"),
    ],
)
def test_config_rejects_misuse(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GemmSm90(Config(**kwargs))


# --- GPU -------------------------------------------------------------------------------------

SHAPES = [(128, 256, 64), (256, 512, 128), (1024, 768, 512), (4096, 4096, 4096),
          (384, 2048, 1024)]
# Partial edge tiles (any M, N, K with 16-byte aligned rows): primes, one element past a tile,
# the ragged shape.
RAGGED = [(4000, 5000, 4096), (384, 384, 384), (1, 8, 16), (129, 136, 48), (257, 4000, 8192),
          (97, 104, 200), (1000, 264, 72)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("M,N,K", SHAPES + RAGGED)
def test_gemm_matches_fp64_every_element(seed, dtype, M, N, K):
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    if dtype.itemsize == 1 and K % 16:
        pytest.skip("fp8 rows need K % 16 == 0 (16-byte TMA rows)")
    a = torch.randn(M, K, device="cuda").to(dtype)
    b = torch.randn(N, K, device="cuda").to(dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    c = tk_cute.gemm(a, b, out=out)
    assert c.data_ptr() == out.data_ptr()
    assert_gemm_close(c, a, b)  # every element (bound: tk_cute.testing)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("M,N,K", [(256, 256, 128), (4000, 5000, 4096), (129, 136, 48)])
def test_gemm_16_and_32_bit_outputs(seed, out_dtype, M, N, K):
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(N, K, device="cuda", dtype=torch.float16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    c = tk_cute.gemm(a, b, out_dtype=out_dtype, out=out)
    assert c.dtype == out_dtype
    assert_gemm_close(c, a, b)


@pytest.mark.gpu
def test_gemm_rejections(seed):
    import tk_cute

    a = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="K mismatch"):
        tk_cute.gemm(a, b[:, :64])
    with pytest.raises(ValueError, match="CUDA device"):
        tk_cute.gemm(a.cpu(), b.cpu())
    with pytest.raises(TypeError, match="same dtype"):
        tk_cute.gemm(a, b.bfloat16())
    ragged = torch.randn(256, 129, device="cuda", dtype=torch.float16)[:, :128]
    with pytest.raises(ValueError, match="16-byte aligned rows"):
        tk_cute.gemm(ragged, b)  # rows 258 bytes apart
    out = torch.full((256, 256), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    c = tk_cute.gemm(a[:, :100], b[:, :100], out=out)  # K = 100, rows 256 bytes apart: legal
    assert c.data_ptr() == out.data_ptr()
    from tk_cute.testing import assert_gemm_close

    assert_gemm_close(c, a[:, :100], b[:, :100])
    with pytest.raises(ValueError, match="N % 8 == 0"):
        tk_cute.gemm(a, b[:100])  # 200-byte rows of bf16 C
    with pytest.raises(ValueError, match="out has shape"):
        tk_cute.gemm(a, b, out=torch.empty(256, 255, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("cm,cn", [(2, 1), (1, 2)])
def test_cluster_configs_multicast_tma(cm, cn):
    from cuda.bindings import driver as cuda

    k = GemmSm90(Config(CLUSTER_M=cm, CLUSTER_N=cn))
    b = build(k, _fake(cutlass.BFloat16, 0, 0), _fake(cutlass.BFloat16, 0, 0),
              _fake(cutlass.BFloat16, 0, 0), SMS, cuda.CUstream(0), arch="sm_90a")
    # The operand shared along the cluster is multicast: each CTA loads its slice for both.
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global.*multicast") >= 1
    assert b.ptx_count(r"barrier\.cluster\.arrive") >= 1
    assert b.kernel.local_bytes == 0


@pytest.mark.gpu
@pytest.mark.parametrize("cm,cn", [(2, 1), (1, 2)])
def test_cluster_gemm_matches_reference(seed, cm, cn):
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    M, N, K = 1152, 1672, 768  # 9 row tiles, 7 column tiles of 256: odd counts both ways
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    c = tk_cute.gemm(a, b, config=Config(CLUSTER_M=cm, CLUSTER_N=cn), out=out)
    assert_gemm_close(c, a, b)


# --- tile width ------------------------------------------------------------------------------

@pytest.mark.parametrize("M, N, plan", [
    (8192, 8192, (256, (2, 1))),  # 2048 tiles of 256: 15.5 rounds, pairs of row tiles share B
    (4000, 5000, (256, (2, 1))),
    (2056, 5000, (224, (1, 1))),  # 17 x 23 tiles: 3 rounds; a cluster's padding makes 4
    (1000, 5000, (160, (2, 1))),  # 8 x 32 = 256 tiles of 160: 2 rounds, as 216 of 192
    (4096, 384, (96, (2, 1))),    # 32 x 4 tiles of 96 in one round; 128: 96 tiles, 4/3 wider
    (1000, 3000, (192, (2, 1))),  # 128 tiles of 192 in one round against 96 of 256
    (3000, 2056, (192, (2, 1))),  # 24 x 11 = 264 tiles of 192: 2 rounds; 256: 216 tiles, 2
    (1000, 384, (64, (1, 1))),    # 48 tiles of 64 in one round, against 24 of 128 twice as
                                  # long; 64 wide: no cluster (`CLUSTER_MIN_WIDTH`)
    (256, 8192, (128, (2, 1))),   # four 64-row bands in no round of clusters: 128-row tiles
    (128, 28672, (224, (1, 2))),  # two bands whose 64-row tiles fill no round of clusters
])
def test_tile_plan_follows_the_rounds_of_the_persistent_grid(M, N, plan):
    from tk_cute.tuning.dense_sm90 import tile_plan

    assert tile_plan(M, N, SMS, quads=30) == (128, *plan)


@pytest.mark.parametrize("M, N, plan", [
    (64, 8192, (128, (1, 4))),   # 128 tiles of 64 are 32 clusters of 4, past the 30 that fit
    (16, 8192, (128, (1, 4))),
    (1, 8192, (128, (1, 4))),
    (32, 4096, (64, (1, 4))),    # 64 tiles of 64: 16 clusters
    (48, 1024, (64, (1, 4))),
    (128, 4096, (128, (1, 4))),  # two bands x 8 clusters of 4 x 128 columns
    (128, 2048, (64, (1, 4))),   # two bands x 8 clusters of 4 x 64 columns
    (192, 4096, (128, (1, 4))),  # three bands x 8
    (65, 8192, (128, (2, 1))),   # 2 x 16 clusters of 4 exceed 30: 2 bands share B, 64 of 2
    (100, 8192, (128, (2, 1))),
    (256, 4096, (128, (2, 1))),  # 4 bands: 2 x 32 clusters of 2
    (64, 28672, (128, (1, 4))),  # one band: 64-row tiles whatever the rounds
    (64, 136, (64, (1, 2))),     # three column tiles
    (1, 8, (64, (1, 1))),        # one tile
])
def test_few_rows_take_64_row_tiles_in_clusters_that_fit_one_round(M, N, plan):
    """`few_rows_plan` on the H200 (132 SMs, 30 resident 4-CTA clusters): the narrowest width
    whose tiles fit one round of 1 x 4 clusters, else of 1 x 2 (one band) or 2 x 1 clusters
    (several bands)."""
    from tk_cute.tuning.dense_sm90 import few_rows_plan, tile_plan

    assert few_rows_plan(M, N, SMS, quads=30) == plan
    assert tile_plan(M, N, SMS, quads=30) == (64, *plan)
    assert few_rows_plan(257, N, SMS, quads=30) is None
    assert few_rows_plan(128, 28672, SMS, quads=30) is None  # two bands, no round: 128 rows
    assert few_rows_plan(256, 8192, SMS, quads=30) is None


def test_few_rows_plan_counts_the_clusters_the_gpu_holds():
    """64 x 8192 in 1 x 4 clusters: 64 wide (32 clusters) where 33 would fit, 128 wide (16)
    where 30 do; stream-K plans keep 128-row tiles."""
    from tk_cute.tuning.dense_sm90 import default_config, few_rows_plan, tile_plan

    assert few_rows_plan(64, 8192, SMS, quads=33) == (64, (1, 4))
    assert few_rows_plan(64, 8192, SMS) == (64, (1, 4))  # quads None: sms // 4
    assert few_rows_plan(64, 8192, SMS, nb=256) == (256, (1, 4))
    assert tile_plan(64, 8192, SMS, clusters=False)[0] == 128
    cfg = default_config(torch.bfloat16, torch.bfloat16, 16, 8192, SMS, quads=30)
    assert (cfg.Mb, cfg.Nb, cfg.CLUSTER_M, cfg.CLUSTER_N) == (64, 128, 1, 4)
    assert GemmSm90(cfg).NUM_CONSUMERS == 1


@pytest.mark.parametrize("dtype, inst", [("bfloat16", "m64n128k16.f32.bf16.bf16"),
                                         ("float8_e4m3fn", "m64n128k32.f32.e4m3.e4m3")])
def test_64_row_tiles_compile_to_one_consumer_warpgroup(dtype, inst):
    """`Config.Mb = 64`: one consumer warpgroup (256 threads with the producer's), its 4
    wgmma per stage, A multicast along a 1 x 4 cluster, no spills."""
    from cuda.bindings import driver as cuda

    k = GemmSm90(Config(dtype=dtype, Mb=64, Nb=128, CLUSTER_N=4))
    assert (k.NUM_CONSUMERS, k.threads) == (1, 256)
    b = build(k, _fake(k.a_tile.dtype, 0, 0), _fake(k.b_tile.dtype, 0, 0),
              _fake(cutlass.BFloat16, 0, 0), SMS, cuda.CUstream(0), arch="sm_90a")
    assert b.ptx_count(rf"wgmma\.mma_async\.sync\.aligned\.{inst}") == 4
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.\S*multicast") >= 1
    assert b.ptx_count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232") == 1
    assert b.kernel.local_bytes == 0 and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.gpu
def test_resident_clusters_are_what_the_gpu_holds():
    from tk_cute.runtime import resident_clusters, sm_count

    dev = torch.device("cuda")
    sms = sm_count(dev)
    assert resident_clusters(dev, 1) == sms
    assert 1 <= resident_clusters(dev, 4) <= sms // 4
    assert resident_clusters(dev, 4) <= resident_clusters(dev, 2) <= sms // 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, out_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float8_e4m3fn, torch.bfloat16),
                                              (torch.float16, torch.float32)])
@pytest.mark.parametrize("M, N, K", [(1, 8192, 8192), (3, 136, 48), (16, 8192, 8208),
                                     (17, 4000, 16), (64, 1000, 4096), (65, 8192, 256),
                                     (100, 4000, 512), (128, 2056, 1040), (1, 8, 16),
                                     (64, 28672, 256), (150, 3000, 208), (200, 4096, 208)])
def test_few_rows_match_fp64_every_element(seed, dtype, M, N, K, out_dtype):
    """The 64-row tiles `gemm` runs for few rows (`few_rows_plan`: 1 x 4, 1 x 2 and 2 x 1
    clusters, tiles past N or M in the last cluster, one to three bands, partial K steps)
    against float64, every element of a poisoned output."""
    import tk_cute
    from tk_cute import dense_gemm
    from tk_cute.testing import assert_gemm_close

    if dtype.itemsize == 1 and K % 16:
        pytest.skip("fp8 rows need K % 16 == 0 (16-byte TMA rows)")
    a = torch.randn(M, K, device="cuda").to(dtype)
    b = torch.randn(N, K, device="cuda").to(dtype)
    assert dense_gemm.config_for(a, b, out_dtype).Mb == 64
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    assert_gemm_close(tk_cute.gemm(a, b, out_dtype, out=out), a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("nb", [64, 128, 192, 256])
@pytest.mark.parametrize("cluster", [(1, 1), (1, 2), (1, 4), (2, 1)])
def test_64_row_tiles_in_every_cluster_match_fp64_every_element(seed, nb, cluster):
    """64-row tiles at any width and cluster shape, three bands and a column count that leaves
    the last cluster part outside the output."""
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    M, N, K = 150, 1000, 328
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    cfg = Config(Mb=64, Nb=nb, EPI_PIPE_DEPTH=2, EPI_N=16 if nb // 32 % 2 else 32,
                 CLUSTER_M=cluster[0], CLUSTER_N=cluster[1])
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert_gemm_close(tk_cute.gemm(a, b, config=cfg, out=out), a, b)


def test_tile_plan_takes_forced_widths_and_rows_off_lines():
    from tk_cute.tuning.dense_sm90 import tile_plan

    assert tile_plan(8192, 8192, SMS, nb=160) == (128, 160, (2, 1))
    assert tile_plan(16, 8192, SMS, nb=64, quads=30) == (64, 64, (1, 2))  # forced width
    assert tile_plan(16, 8192, SMS, nb=64, clusters=False) == (128, 64, (1, 1))  # stream-K
    assert tile_plan(2056, 5000, SMS, lines=False) == (128, 176, (2, 1))  # rows off lines
    assert tile_plan(2056, 5000, SMS, clusters=False) == (128, 224, (1, 1))  # stream-K: none
    with pytest.raises(ValueError, match="tile width must be one of .* got 80"):
        tile_plan(1000, 1000, SMS, nb=80)  # runs (gemm_sm90.NBS), not planned: untimed


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_every_tile_width_makes_a_valid_config(dtype, out_dtype):
    from tk_cute.tuning.dense_sm90 import TILE_COST, default_config

    for nb in TILE_COST:
        k = GemmSm90(default_config(dtype, out_dtype, nb=nb))
        assert k.Nb == nb and k.LOAD_PIPE_DEPTH >= 3
        assert k.dynamic_shared_memory() <= target("sm_90a").smem_bytes


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("nb", gemm_sm90.NBS)
def test_every_tile_width_matches_fp64_every_element(seed, nb, out_dtype, cluster):
    """Every width in every cluster shape: 3 row tiles and, at every width, an odd count of
    column tiles or a last one partial, so a cluster's last CTA may lie outside the output."""
    import tk_cute
    from tk_cute.tuning.dense_sm90 import plan_config
    from tk_cute.testing import assert_gemm_close

    M, N, K = 300, 1000, 328  # partial tiles on every side for every width
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)  # poison
    # (the config of an 8192^2 output: whole tiles, edges unshifted; widths planned or not)
    cfg = plan_config(a.dtype, out_dtype, 8192, 8192, (128, nb, cluster))
    c = tk_cute.gemm(a, b, out_dtype, config=cfg, out=out)
    assert_gemm_close(c, a, b)


@pytest.mark.parametrize("nb", [64, 160, 192])
def test_narrow_tiles_compile_to_their_wgmma_without_spills(nb):
    """A width's 4 wgmma per stage, no spills; the epilogue's stmatrix.x4 (16 columns of a
    warp's 16 rows each) once per 16 columns: 160 runs ten 16-column blocks."""
    from cuda.bindings import driver as cuda

    from tk_cute.tuning.dense_sm90 import default_config

    k = GemmSm90(default_config(torch.bfloat16, torch.bfloat16, nb=nb))
    b = build(k, *(_fake(cutlass.BFloat16, 0, 0) for _ in range(3)), SMS, cuda.CUstream(0),
              arch="sm_90a")
    assert b.ptx_count(rf"wgmma\.mma_async\.sync\.aligned\.m64n{nb}k16\.f32\.bf16\.bf16") == 4
    assert b.sass_count(r"\bSTSM\b") == nb // 16
    assert b.kernel.local_bytes == 0 and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.parametrize("mb, nb, regs", [(192, 176, 152), (192, 192, 152)])
def test_tall_tiles_compile_to_one_warpgroup_per_64_rows(mb, nb, regs):
    """192-row tiles: three consumer warpgroups (512 threads), each raised to what the
    producer's drop leaves them (`warpgroup.consumer_registers`), 4 wgmma per stage, no
    spills; 16 columns an epilogue block where Nb is not a multiple of 64 (176: eleven blocks in
    two buffers, not whole rounds of them), each block one stmatrix.x4."""
    from tk_cute.tuning.dense_sm90 import plan_config

    cfg = plan_config(torch.bfloat16, torch.bfloat16, 2056, 2056, (mb, nb, (1, 1)))
    assert cfg.EPI_N == (32 if nb % 64 == 0 else 16) and cfg.SHIFT_EDGES
    k = GemmSm90(cfg)
    groups = mb // 64
    assert k.NUM_CONSUMERS == groups and k.threads == 128 * (1 + groups)
    b = build(k.call_ptrs, *gemm_sm90.signature(cfg).compile_args(SMS), arch="sm_90a")
    assert b.ptx_count(rf"wgmma\.mma_async\.sync\.aligned\.m64n{nb}k16\.f32\.bf16\.bf16") == 4
    assert b.sass_count(r"\bSTSM\b") == nb // 16
    assert b.ptx_count(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{regs}") == 1
    assert b.kernel.local_bytes == 0 and b.sass_count(r"\bSTL\b") == 0
    assert k.dynamic_shared_memory() <= target("sm_90a").smem_bytes


@pytest.mark.parametrize("M, N, plan", [
    (2056, 2056, (192, 176, (1, 1))),  # 11 x 12 = 132 tiles: one round (128 x 160: 17 x 13)
    (2048, 2056, (192, 176, (1, 1))),
    (1500, 3000, (192, 192, (1, 1))),
    (3000, 1000, (192, 128, (1, 1))),
    (1000, 2056, (128, 144, (2, 1))),  # 8 x 15 = 120 tiles of 144 in one round
    (4096, 2056, (128, 176, (2, 1))),
    (4000, 5000, (128, 256, (2, 1))),  # unchanged: 256 wide fills its rounds
    (3000, 384, (128, 96, (2, 1))),    # 96 against 112 at the same tile count
])
def test_tile_plan_weighs_192_row_tiles_and_16_column_steps(M, N, plan):
    """`tile_plan` on the H200 (132 SMs): 192-row tiles (no 2 x 1 clusters) where a third
    fewer bands fill a round, 144 / 176 wide tiles between the multiples of 32; each pick here
    timed against the plan before them (docs/facts.md#dense-tile-cost, commit 0d40bcb:
    2056^2 59.2 -> 50.1 us, 1000x2056 32.4 -> 29.7)."""
    from tk_cute.tuning import dense_sm90 as dense_tuning

    assert dense_tuning.tile_plan(M, N, SMS, quads=30) == plan
    assert dense_tuning.direct_time(M, N, plan, SMS) == min(
        dense_tuning.direct_time(M, N, p, SMS) for p in
        [(128, nb, c) for nb in dense_tuning.TILE_COST for c in dense_tuning.CLUSTER_COST
         if nb >= dense_tuning.CLUSTER_MIN_WIDTH or c == (1, 1)]
        + [(192, nb, c) for nb in dense_tuning.TILE_COST if nb <= 192
           for c in dense_tuning.TALL_CLUSTER_COST if nb >= dense_tuning.CLUSTER_MIN_WIDTH
           or c == (1, 1)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, out_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float8_e4m3fn, torch.float16),
                                              (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("M, N, K, plan, transposed", [
    (2056, 2056, 512, (192, 176, (1, 1)), False),
    (1000, 1000, 256, (192, 192, (1, 2)), False),
    (700, 1000, 512, (192, 128, (1, 1)), False),
    (700, 1000, 512, (192, 112, (2, 1)), False),
    (1000, 5000, 320, (192, 160, (1, 1)), False),
    (997, 5000, 336, (192, 176, (1, 2)), False),
    (300, 2056, 256, (192, 144, (2, 1)), True),
    (1000, 2056, 320, (128, 144, (2, 1)), False),
    (333, 5120, 256, (128, 112, (1, 1)), True),
    (257, 8192, 256, (128, 144, (1, 2)), True),
    (400, 4104, 256, (128, 208, (1, 1)), True),
    (129, 3000, 272, (64, 144, (1, 1)), True),
])
def test_tall_tiles_and_16_column_steps_match_fp64_every_element(seed, dtype, out_dtype, M, N,
                                                                  K, plan, transposed):
    """192-row tiles and 16-column widths through `gemm(config=)`, edges shifted, on a
    NaN-poisoned out: every element within `assert_gemm_close`'s bound of float64."""
    import tk_cute
    from tk_cute.tuning import dense_sm90 as dense_tuning
    from tk_cute.testing import assert_gemm_close

    cfg = dense_tuning.plan_config(dtype, out_dtype, M, N, plan, transposed=transposed)
    a = torch.randn(M, K, device="cuda").to(dtype)
    b = torch.randn(N, K, device="cuda").to(dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    assert tk_cute.gemm(a, b, out_dtype, config=cfg, out=out) is out
    assert_gemm_close(out, a, b)


# --- C stored transposed (the host's swap of A and B) ---------------------------------------

@pytest.mark.parametrize("out_dtype, pieces", [("bfloat16", 2), ("float32", 4)])
def test_transposed_c_compiles_to_transposing_stmatrix_and_tma_stores(out_dtype, pieces):
    """`Config.TRANSPOSE_C`: the same 4 wgmma per stage; each 32-column block of a 16-bit C
    goes through stmatrix's transposing form (one per 16 columns, as the row-major epilogue),
    and a block's 128 rows, now the contiguous mode, leave in `pieces` TMA stores of one
    128-byte swizzle row each (2 x 64 bf16, 4 x 32 fp32) instead of one; no spills."""
    cfg = Config(TRANSPOSE_C=True, out_dtype=out_dtype, EPI_PIPE_DEPTH=2)
    b = build(GemmSm90(cfg).call_ptrs, *gemm_sm90.signature(cfg).compile_args(SMS),
              arch="sm_90a")
    row = build(GemmSm90(dataclasses.replace(cfg, TRANSPOSE_C=False)).call_ptrs,
                *gemm_sm90.signature(cfg).compile_args(SMS), arch="sm_90a")
    assert b.sass_count("HGMMA") == 4
    tma_store = r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta"
    assert b.ptx_count(tma_store) == pieces * row.ptx_count(tma_store) == pieces * 256 // 32
    if out_dtype == "bfloat16":
        assert b.ptx_count(r"stmatrix\.sync\.aligned\.m8n8\.x4\.trans") == 256 // 16
        assert row.ptx_count(r"stmatrix\S*\.trans") == 0
    assert b.kernel.local_bytes == 0 and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, out_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float8_e4m3fn, torch.float16),
                                              (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("mb, nb, cluster", [(128, 256, (1, 1)), (128, 160, (2, 1)),
                                             (64, 96, (4, 1)), (128, 128, (2, 2)),
                                             (64, 224, (1, 2))])
def test_transposed_c_matches_fp64_every_element(seed, dtype, out_dtype, mb, nb, cluster):
    """`TRANSPOSE_C` configs through `gemm` (out^T = b @ a^T on the kernel): partial tiles on
    both sides, clusters whose last CTAs lie past the output, a partial K step, every element
    of a poisoned output against float64."""
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    for M, N, K in ((257, 1000, 208), (65, 4000, 1040), (3, 136, 48)):
        a = torch.randn(M, K, device="cuda").to(dtype)
        b = torch.randn(N, K, device="cuda").to(dtype)
        cfg = Config(dtype=str(dtype)[6:], out_dtype=str(out_dtype)[6:], Mb=mb, Nb=nb,
                     EPI_N=16 if nb // 32 % 2 else 32, EPI_PIPE_DEPTH=2, CLUSTER_M=cluster[0],
                     CLUSTER_N=cluster[1], TRANSPOSE_C=True)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
        assert_gemm_close(tk_cute.gemm(a, b, out_dtype, config=cfg, out=out), a, b)


@pytest.mark.parametrize("M, N, plan", [
    (257, 8192, (128, 144, (1, 2))),  # two 144-row tiles of A sharing each band of B
    (257, 4096, (64, 144, (1, 2))),  # the second tile shifted to rows 113-256
    (257, 2056, (64, 96, (1, 2))),
    (300, 4096, (64, 160, (1, 2))),
    (129, 8192, (128, 96, (1, 2))),  # the direct plan: a 128-row band of one row
    (400, 2056, (64, 112, (1, 2))),
    (65, 8192, None), (200, 4096, None), (128, 4096, None),  # 64-row bands: direct
    (384, 8192, None), (256, 8192, None),  # whole 128-row bands
    (450, 8192, None), (1000, 5000, None),  # beyond SWAP_MAX_M
])
def test_swap_plan_transposes_where_the_last_band_lies_mostly_past_m(M, N, plan):
    """`swap_plan` on the H200 (132 SMs, 30 resident 4-CTA clusters): the transposed tiles
    (Mb of N, Nb of M) where the direct plan's last 128-row band is mostly past M, edge tiles
    shifted either way; where timed the fastest or within 2.3% of it among 13-24 variants
    (docs/facts.md#dense-transposed); with the 16-column widths (commits 0d40bcb, 2251fd2)
    257x8192 / 257x4096 ran 0.92 / 0.93 of the 160-wide picks, 400x2056 1.00 and
    129x8192 kept 128 x 96 (64 x 144, within 1% in the model, ran 4-8% slower)."""
    from tk_cute.tuning import dense_sm90 as dense_tuning

    assert dense_tuning.swap_plan(M, N, SMS, quads=30) == plan
    cfg = dense_tuning.default_config(torch.bfloat16, torch.bfloat16, M, N, SMS, quads=30)
    assert cfg.TRANSPOSE_C == (plan is not None)
    if plan:
        assert (cfg.Mb, cfg.Nb, (cfg.CLUSTER_M, cfg.CLUSTER_N)) == plan
        for off in (dict(lines=False), dict(nb=128), dict(swap_ab=False)):
            assert not dense_tuning.default_config(torch.bfloat16, torch.bfloat16, M, N, SMS,
                                                 quads=30, **off).TRANSPOSE_C


def test_swap_candidates_hold_the_swap_plan_and_build_transposed_configs():
    """`swap_candidates` (what `bench gemm --candidates` times) holds every pick of
    `swap_plan`, each candidate holding M's rows in at most 4 tiles; `plan_config` builds each
    as a transposed config of that tile and cluster, 16-column epilogue blocks for odd
    multiples of 32, and edges shifted where the kernel's M (N here) or N (M here) has a
    partial tile after a whole one."""
    from tk_cute.tuning import dense_sm90 as dense_tuning

    for M in (129, 150, 257, 300, 333, 390, 400):
        cands = dense_tuning.swap_candidates(M)
        assert all(4 * nb >= M and mb in (64, 128) for mb, nb, _ in cands)
        for N in (2056, 4096, 8192, 28672):
            swap = dense_tuning.swap_plan(M, N, SMS, quads=30)
            assert swap is None or swap in cands
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            for mb, nb, cluster in cands:
                cfg = dense_tuning.plan_config(dtype, torch.bfloat16, M, 4100, (mb, nb, cluster),
                                             transposed=True)
                assert cfg.TRANSPOSE_C
                assert (cfg.Mb, cfg.Nb, (cfg.CLUSTER_M, cfg.CLUSTER_N)) == (mb, nb, cluster)
                assert cfg.EPI_N == (32 if nb % 64 == 0 else 16)
                assert cfg.SHIFT_EDGES == (4100 % mb != 0 or (M > nb and M % nb != 0))


def test_transposed_time_charges_rows_past_the_tensor():
    """The model, edge tiles shifted inside the tensors: only a tile wider than its whole
    dimension has a box past it, whose rows there cost EDGE_ROW_COST valid rows; at 129 rows,
    two shifted 96-row tiles model faster than one of 160 (timed 41.0 against 51.7 us at
    8192^2)."""
    from tk_cute.tuning.dense_sm90 import EDGE_ROW_COST, _edge_cost, transposed_time

    assert _edge_cost(320, 160) == _edge_cost(257, 160) == _edge_cost(160, 160) == 1.0
    assert _edge_cost(129, 160) == pytest.approx((129 + EDGE_ROW_COST * 31) / 160)
    t = {p: transposed_time(129, 8192, p, SMS, 30)
         for p in ((128, 96, (1, 2)), (64, 160, (2, 1)))}
    assert t[(128, 96, (1, 2))] < t[(64, 160, (2, 1))]


@pytest.mark.parametrize("M, N, shifted", [
    (2056, 2056, True), (333, 5120, True), (4000, 5000, True), (3000, 384, True),
    (384, 8192, True),  # whole bands, 8192 columns in 192-wide tiles
    (8192, 8192, False), (4096, 14336, False), (256, 8192, False),  # whole tiles
    (257, 8192, True),  # transposed: M in two 144-wide tiles
    (129, 8192, True),  # transposed: M in two 96-wide tiles
    (16, 8192, False),  # one 64-row band of 16 rows: nothing to move
    (100, 8192, True)])  # two 64-row bands, the second shifted to rows 36-99
def test_default_config_shifts_the_edges_where_the_tiles_do_not_divide_the_output(M, N, shifted):
    """`default_config` sets `SHIFT_EDGES` where an edge tile of the (transposed, for
    `swap_plan`'s shapes) grid can move back inside the kernel's M x N (a partial tile after a
    whole one), never with stream-K (which raises with it); elsewhere the unshifted kernel."""
    from tk_cute.tuning import dense_sm90 as dense_tuning

    cfg = dense_tuning.default_config(torch.bfloat16, torch.bfloat16, M, N, SMS, quads=30)
    rows, cols = (N, M) if cfg.TRANSPOSE_C else (M, N)
    assert cfg.SHIFT_EDGES == shifted == any(n > t and n % t for n, t in ((rows, cfg.Mb),
                                                                         (cols, cfg.Nb)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, out_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float8_e4m3fn, torch.bfloat16),
                                              (torch.float16, torch.float32)])
@pytest.mark.parametrize("M, N, K", [(257, 8192, 1152), (129, 8192, 4224), (300, 2056, 384),
                                     (400, 4096, 128), (257, 2056, 4096)])
def test_transposed_plan_matches_fp64_every_element(seed, dtype, out_dtype, M, N, K):
    """The shapes `gemm` runs transposed by default (`swap_plan`: rows on L2 lines, so K a
    multiple of 128 bytes, whole K steps; partial ones: the `TRANSPOSE_C` configs above),
    against float64, every element of a poisoned output; and through `scaled` (alpha on the
    transposed accumulator)."""
    import tk_cute
    from tk_cute import dense_gemm
    from tk_cute.testing import assert_gemm_close

    a = torch.randn(M, K, device="cuda").to(dtype)
    b = torch.randn(N, K, device="cuda").to(dtype)
    assert dense_gemm.config_for(a, b, out_dtype).TRANSPOSE_C
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    c = tk_cute.gemm(a, b, out_dtype, out=out)
    assert_gemm_close(c, a, b)
    if dtype == torch.bfloat16:  # fp32 out: alpha * acc is then the kernel's last rounding
        alpha = torch.tensor([0.375], device="cuda")
        poison = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
        scaled = dense_gemm.scaled(a, b, alpha, poison)
        assert torch.equal(scaled, 0.375 * tk_cute.gemm(a, b, torch.float32))


# --- edge tiles moved inside the tensors (`Config.SHIFT_EDGES`) -------------------------------

@pytest.mark.parametrize("transposed", [False, True])
def test_shifted_edges_compile_to_the_same_pipeline(transposed):
    """`SHIFT_EDGES` changes only where the loads and stores point (element origins off the
    tile grid): the same wgmma, TMA loads and stores, no spills, and the default PTX is not
    this one."""
    cfg = Config(TRANSPOSE_C=transposed, EPI_PIPE_DEPTH=2)
    shifted = dataclasses.replace(cfg, SHIFT_EDGES=True)
    b, base = (build(gemm_sm90.kernel_for(c).call_ptrs, *gemm_sm90.signature(c).compile_args(SMS),
                     arch="sm_90a") for c in (shifted, cfg))
    for pattern in ("HGMMA", r"\bSTSM\b"):
        assert b.sass_count(pattern) == base.sass_count(pattern) > 0
    for pattern in (r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global",
                    r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta"):
        assert b.ptx_count(pattern) == base.ptx_count(pattern) > 0
    assert b.ptx != base.ptx
    assert b.kernel.local_bytes == 0 and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.parametrize("M, N, mb, nb", [(2056, 2056, 128, 160), (257, 1000, 64, 96),
                                         (300, 136, 128, 256), (3, 40, 128, 64),
                                         (4096, 4096, 128, 256), (100, 100, 64, 64)])
@pytest.mark.parametrize("out_dtype, transposed", [("bfloat16", False), ("float32", False),
                                                   ("float16", True)])
def test_shifted_edges_cover_the_output_with_boxes_inside_the_tensors(M, N, mb, nb, out_dtype,
                                                                      transposed):
    """`GemmSm90.origin` (host proof, Python ints): over the tile grid and a cluster's padding
    past it, every tile's rows and columns start on the grid but for the last, which ends at M
    (N); along C's contiguous dimension (N, or M transposed) that start is rounded up to 16
    bytes of C, so its box reaches fewer than 16 bytes past the tensor; where the tensor holds
    a whole tile no other box reaches past it, and the tiles still cover every row and
    column."""
    from types import SimpleNamespace

    from tk_cute.types.gl import coord

    k = GemmSm90(Config(Mb=mb, Nb=nb, EPI_N=16 if nb // 32 % 2 else 32, EPI_PIPE_DEPTH=2,
                        out_dtype=out_dtype, TRANSPOSE_C=transposed, SHIFT_EDGES=True))
    align = 16 // torch.empty((), dtype=getattr(torch, out_dtype)).element_size()
    g = SimpleNamespace(A=SimpleNamespace(tensor=SimpleNamespace(shape=(M, 64, 1))),
                        B=SimpleNamespace(tensor=SimpleNamespace(shape=(N, 64, 1))))
    for extent, tile, axis in ((M, mb, 0), (N, nb, 1)):
        tiles = -(-extent // tile)
        starts = [k.origin(g, coord(t, t))[axis] for t in range(tiles + 1)]  # + a padding tile
        assert starts[:tiles - 1] == [t * tile for t in range(tiles - 1)]
        contiguous = axis == (0 if transposed else 1)
        if extent >= tile:
            edge = -(-(extent - tile) // align) * align if contiguous else extent - tile
            assert starts[tiles - 1:] == [edge] * 2  # the edge and padding end at M (N)
            assert edge + tile - extent < (align if contiguous else 1)
        else:
            assert starts == [0] * (tiles + 1)  # less than a tile: nothing to move
        if contiguous:
            assert all(s % align == 0 for s in starts)
        covered = set().union(*(range(s, s + tile) for s in starts))
        assert covered >= set(range(extent))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, out_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float8_e4m3fn, torch.float32)])
@pytest.mark.parametrize("mb, nb, cluster, transposed", [
    (128, 160, (2, 1), False), (128, 256, (1, 2), False), (64, 128, (1, 4), False),
    (128, 160, (1, 2), True), (64, 96, (2, 1), True), (128, 192, (1, 1), False)])
def test_shifted_edges_match_fp64_every_element(seed, dtype, out_dtype, mb, nb, cluster,
                                                transposed):
    """`SHIFT_EDGES` against float64, every element of a poisoned output: edge bands and
    columns moved back inside the tensors (rows and columns computed and stored twice), a
    cluster's padding CTAs, outputs smaller than one tile (nothing to move), a partial K step,
    both orientations; twice bit for bit (the rows stored twice hold one value)."""
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    for M, N, K in ((2056, 2056, 208), (257, 1000, 1040), (300, 136, 4096), (3, 40, 48)):
        a = torch.randn(M, K, device="cuda").to(dtype)
        b = torch.randn(N, K, device="cuda").to(dtype)
        cfg = Config(dtype=str(dtype)[6:], out_dtype=str(out_dtype)[6:], Mb=mb, Nb=nb,
                     EPI_N=16 if nb // 32 % 2 else 32, EPI_PIPE_DEPTH=2, CLUSTER_M=cluster[0],
                     CLUSTER_N=cluster[1], TRANSPOSE_C=transposed, SHIFT_EDGES=True)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
        c = tk_cute.gemm(a, b, out_dtype, config=cfg, out=out)
        assert_gemm_close(c, a, b)
        again = tk_cute.gemm(a, b, out_dtype, config=cfg, out=torch.full_like(out, float("nan")))
        assert torch.equal(c, again)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_shifted_edges_into_a_padded_c_every_element(seed, out_dtype):
    """The NVFP4 "dequantize" path's N-padded D (`dense_gemm.scaled` into an (M, N rounded up
    to 8) buffer): C's last column tile, shifted back from an N off 16 bytes, starts rounded
    up to 16 bytes (an fp16 store from column 36 faulted), every element against float64, in
    the default plan of each shape (direct, transposed, clusters). The pad columns past N are
    not C (the NVFP4 path copies D[:, :N] out): with 16-bit C they were written (H200,
    commit c82bbc2; fp32 C's were not), so they are not checked."""
    from tk_cute import dense_gemm
    from tk_cute.testing import assert_gemm_close

    for M, N, K in ((100, 100, 64), (300, 1004, 192), (257, 12, 4096), (2056, 2052, 128)):
        a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        b = torch.randn(N, K, device="cuda").to(torch.bfloat16)
        assert dense_gemm.config_for(a, b, out_dtype).SHIFT_EDGES
        wide = torch.full((M, -(-N // 8) * 8), float("nan"), device="cuda", dtype=out_dtype)
        dense_gemm.scaled(a, b, torch.ones(1, device="cuda"), wide)
        assert_gemm_close(wide[:, :N], a, b)


@pytest.mark.parametrize("M, K, cluster", [
    (3000, 5000, (2, 1)),   # rows 10000 bytes apart: 24 row tiles in 2 x 1 clusters sharing B
    (3000, 5120, None),     # rows on L2 lines: `tile_plan`'s cluster
    (2056, 2056, (2, 1)),   # 17 row tiles: the last cluster half outside the output
    (100, 5000, None),      # two 64-row bands: `tile_plan`'s 1 x 4 clusters sharing A
    (1000, 72, (2, 1)),
])
def test_operand_rows_off_l2_lines_run_in_clusters(M, K, cluster):
    """Rows that do not start on a 128-byte line (`dense_gemm.line_aligned`) put each TMA row
    piece of a stage across two lines; where the row tiles pair up, 2 x 1 clusters halve B's
    reads (docs/facts.md#l2-line-rows)."""
    from tk_cute import dense_gemm
    from tk_cute.tuning import dense_sm90 as dense_tuning

    def on_line(rows, cols, dtype=torch.bfloat16):  # a (rows, cols) tensor at a 128-byte address
        flat = torch.zeros(rows * cols + 128, dtype=dtype)
        skip = (-flat.data_ptr() % 128) // flat.element_size()
        return flat[skip:skip + rows * cols].view(rows, cols)

    a, b = on_line(M, K), on_line(64, K)
    lines = dense_gemm.line_aligned(a, b)
    assert lines == ((K * 2) % 128 == 0)
    cfg = dense_tuning.default_config(a.dtype, torch.bfloat16, M, 4096, SMS, lines=lines)
    assert (cfg.CLUSTER_M, cfg.CLUSTER_N) == (cluster or dense_tuning.tile_plan(M, 4096, SMS)[2])
    wide, narrow = on_line(M, 5056), on_line(64, 64)
    assert dense_gemm.line_aligned(wide[:, :5000], narrow)  # a pitch of 79 lines: aligned
    assert not dense_gemm.line_aligned(wide[:, 8:], narrow)  # starts 16 bytes into a line
    assert not dense_gemm.line_aligned(on_line(M, 192, torch.float8_e4m3fn))  # 1.5 lines


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("M, N, K", [(512, 520, 208), (1000, 4000, 5008), (256, 136, 48),
                                     (300, 1000, 208), (2056, 2056, 2056)])
def test_operand_rows_off_l2_lines_match_fp64_every_element(seed, dtype, M, N, K):
    """The clustered calls of rows off L2 lines (row tiles 4, 8, 2, and odd counts: 3, 17,
    whose last cluster lies half outside the output) against float64, every element of a
    poisoned output."""
    import tk_cute
    from tk_cute import dense_gemm
    from tk_cute.tuning import dense_sm90 as dense_tuning
    from tk_cute.testing import assert_gemm_close

    if dtype.itemsize == 1 and K % 16:
        pytest.skip("fp8 rows need K % 16 == 0 (16-byte TMA rows)")
    a = torch.randn(M, K, device="cuda").to(dtype)
    b = torch.randn(N, K, device="cuda").to(dtype)
    assert dense_tuning.default_config(dtype, torch.bfloat16, M, N, SMS,
                                     lines=dense_gemm.line_aligned(a, b)).CLUSTER_M == 2
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert_gemm_close(tk_cute.gemm(a, b, out=out), a, b)


# --- raw-pointer launch ----------------------------------------------------------------------

@pytest.mark.parametrize("scaled", [False, True])
def test_launches_pass_exactly_the_signature_by_name(monkeypatch, scaled):
    """`tk_cute.gemm` / `scaled` hand the compiled launcher every argument its `signature`
    declares (checked on the CPU with the launcher replaced by a recorder: a wrong or missing
    name would only fail on a GPU otherwise), with the operands' row strides."""
    from tk_cute import dense_gemm
    from tk_cute.tuning import dense_sm90 as dense_tuning

    calls = []

    def get(key, build):
        config, is_scaled, _ = key
        sig = gemm_sm90.signature(config, is_scaled)
        return lambda **values: (sig.pack(values), calls.append(values))

    monkeypatch.setattr(dense_gemm._CACHE, "get", get)
    monkeypatch.setattr(dense_gemm, "device_index", lambda device: 0)
    monkeypatch.setattr(dense_gemm, "raw_stream", lambda index: 0)
    monkeypatch.setattr(dense_gemm, "_check_device", lambda device: SMS)
    a = torch.randn(300, 72).bfloat16()[:, :64]  # rows 72 elements apart
    b = torch.randn(136, 64).bfloat16()
    c = torch.empty(300, 136, dtype=torch.float32)
    alpha = torch.tensor([0.5])
    config = dense_tuning.default_config(a.dtype, c.dtype, 300, 136, SMS, swap_ab=False)
    dense_gemm._run(config, a, b, c, alpha if scaled else None)
    (call,) = calls
    assert (call["a"], call["b"], call["c"]) == (a.data_ptr(), b.data_ptr(), c.data_ptr())
    assert (call["M"], call["N"], call["K"]) == (300, 136, 64)
    assert (call["lda"], call["ldb"], call["ldc"]) == (72, 64, 136)
    assert ("alpha" in call) == scaled
    assert "ws" not in call
    calls.clear()  # transposed: the kernel's A is b, its (N, M) output the same c
    dense_gemm._run(dataclasses.replace(config, TRANSPOSE_C=True), a, b, c,
                    alpha if scaled else None)
    (call,) = calls
    assert (call["a"], call["b"], call["c"]) == (b.data_ptr(), a.data_ptr(), c.data_ptr())
    assert (call["M"], call["N"], call["K"]) == (136, 300, 64)
    assert (call["lda"], call["ldb"], call["ldc"]) == (64, 72, 136)
    calls.clear()  # split-K: a workspace of its planes (CPU: a fresh tensor per call)
    dense_gemm._run(dataclasses.replace(config, SPLIT_K=2, Kb=32), a, b, c,
                    alpha if scaled else None)
    (call,) = calls
    assert call["ws"] % 16 == 0 and call["c"] == c.data_ptr()
    with pytest.raises(ValueError, match="SPLIT_K=3 needs at least that many K steps of 32; "
                                         "K=64 has 2"):
        dense_gemm._run(dataclasses.replace(config, SPLIT_K=3, Kb=32), a, b, c)


@pytest.mark.parametrize("scaled", [False, True])
def test_raw_pointer_launchers_compile_with_the_dsls_packing(scaled):
    """The launcher compiles for sm_90a without a GPU and its argument slots equal the DSL's
    own packing (`Signature.compile` checks it)."""

    launcher = gemm_sm90.compile_launcher(Config(), SMS, scaled, options="--gpu-arch sm_90a")
    assert launcher.signature.names[-3:] == ("lda", "ldb", "ldc")


# --- split-K (`Config.SPLIT_K`, `dense_sm90.split_plan`) --------------------------------------

@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_split_k_compiles_to_the_same_gemm_and_a_plane_sum(out_dtype):
    """Split-K keeps the GEMM's MMAs and TMA traffic, stores fp32 planes (no spills) and adds
    the plane sum's kernel, launched with PDL behind it (the GEMM's CTAs let it launch as they
    start; it waits for the GEMM's end)."""
    cfg = Config(out_dtype=out_dtype, EPI_PIPE_DEPTH=2)
    split = dataclasses.replace(cfg, SPLIT_K=4)
    b, base = (build(gemm_sm90.kernel_for(c).call_ptrs, *gemm_sm90.signature(c).compile_args(SMS),
                     arch="sm_90a") for c in (split, cfg))
    assert b.sass_count("HGMMA") == base.sass_count("HGMMA") > 0
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta") > 0
    assert b.ptx_count(r"griddepcontrol\.wait") == 1 + base.ptx_count(r"griddepcontrol\.wait")
    assert b.ptx_count(r"griddepcontrol\.launch_dependents") == 1  # (the GEMM lets it launch)
    waits = b.reads_before_pdl_wait()  # the sum reads no plane before the GEMM has ended
    assert len(waits) == 1 and all(reads == [] for reads in waits.values())
    assert base.ptx_count(r"griddepcontrol\.launch_dependents") == 0
    assert b.ptx_count(r"ld\.global\.v4\.f32") == 4  # one per plane, unrolled
    assert len(b.resources) == 2 and all(k.local_bytes == 0 for k in b.resources)
    assert b.sass_count(r"\bSTL\b") == 0
    with pytest.raises(ValueError, match="launches without a workspace: SPLIT_K=4"):
        gemm_sm90.kernel_for(split)._no_split("__call__")


def test_split_plan_takes_the_modelled_best_split_where_it_pays():
    """Over a seeded sweep of shapes (bf16 and fp8, every plan and cluster the planner takes):
    the split config is the unsplit plan's with SPLIT_K K ranges, its ranges' CTAs fit the
    ones the GPU holds, none empty, at most MAX_SPLIT_K; its modelled time is the least of
    every allowed split and at most SPLIT_GAIN of the unsplit one; an unsplit plan has no
    allowed split under that bar. The few-tile long-K shapes split; large outputs do not."""
    import random

    from tk_cute.tuning import dense_sm90 as dt

    rng = random.Random(0)
    split_seen = 0
    for _ in range(300):
        M, N, K = (int(2 ** rng.uniform(0, 14)) for _ in range(3))
        dtype = rng.choice([torch.bfloat16, torch.float8_e4m3fn])
        N, K = max(8, N // 8 * 8), max(16, K // 16 * 16)
        cfg = dt.default_config(dtype, torch.bfloat16, M, N, SMS, quads=30, K=K)
        plain = dt.default_config(dtype, torch.bfloat16, M, N, SMS, quads=30)
        assert dataclasses.replace(cfg, SPLIT_K=1, EPI_PIPE_DEPTH=plain.EPI_PIPE_DEPTH,
                                   PDL=False) == plain
        rows, cols = (N, M) if cfg.TRANSPOSE_C else (M, N)
        held = dt.held_ctas((cfg.CLUSTER_M, cfg.CLUSTER_N), SMS, 30)
        allowed = dt.split_counts(rows, cols, K, plain, SMS, 30)
        tiles, steps = dt.plan_tiles(rows, cols, cfg), cfg.k_steps(K)
        top = min(gemm_sm90.MAX_SPLIT_K, held // tiles, steps)  # (one round, one step each)
        assert allowed == range(2, top + 1)
        unsplit = dt.split_time(rows, cols, K, plain, 1)
        if cfg.SPLIT_K > 1:
            split_seen += 1
            assert cfg.SPLIT_K in allowed and cfg.EPI_PIPE_DEPTH == 2
            cfg.check_k(K)
            best = dt.split_time(rows, cols, K, plain, cfg.SPLIT_K)
            assert best <= dt.SPLIT_GAIN * unsplit
            assert all(best <= dt.split_time(rows, cols, K, plain, s) for s in allowed)
        else:
            assert all(dt.split_time(rows, cols, K, plain, s) > dt.SPLIT_GAIN * unsplit
                       for s in allowed)
    assert split_seen >= 10
    for M, N, K in ((1, 48, 14448), (16, 192, 11344), (56, 32, 8704)):
        assert dt.default_config(torch.bfloat16, torch.bfloat16, M, N, SMS, quads=30,
                                 K=K).SPLIT_K > 1
    for M, N, K in ((8192, 8192, 8192), (64, 8192, 4096), (1000, 5000, 4096)):
        assert dt.default_config(torch.bfloat16, torch.bfloat16, M, N, SMS, quads=30,
                                 K=K).SPLIT_K == 1


def test_pdl_is_planned_where_a_ctas_work_is_short():
    """Over a seeded sweep (bf16 and fp8, split or not): the plan launches as a programmatic
    dependent exactly where one CTA's modelled work (`unit_time`, in its K ranges) is at most
    PDL_MAX_UNIT_US; and never without K (no model). The random sweep's 2-8 us shapes take it;
    the long few-CTA shapes where it lost 12-17% (H100) do not."""
    import random

    from tk_cute.tuning import dense_sm90 as dt

    rng = random.Random(1)
    seen = set()
    for _ in range(300):
        M, N, K = (int(2 ** rng.uniform(0, 14)) for _ in range(3))
        dtype = rng.choice([torch.bfloat16, torch.float8_e4m3fn])
        N, K = max(8, N // 8 * 8), max(16, K // 16 * 16)
        cfg = dt.default_config(dtype, torch.bfloat16, M, N, SMS, quads=30, K=K)
        assert cfg.PDL == (dt.unit_time(cfg, K, cfg.SPLIT_K) <= dt.PDL_MAX_UNIT_US)
        assert not dt.default_config(dtype, torch.bfloat16, M, N, SMS, quads=30).PDL
        seen.add(cfg.PDL)
    assert seen == {False, True}
    for (M, N, K), planned in zip(
            ((1, 304, 32), (2745, 32, 48), (3, 5952, 256), (1, 48, 14448), (287, 8672, 528),
             (4808, 112, 14112), (11, 8768, 14544), (93, 4368, 6896), (469, 1184, 2288),
             (8192, 8192, 8192)), [True] * 5 + [False] * 5):
        cfg = dt.default_config(torch.bfloat16, torch.bfloat16, M, N, SMS, quads=30, K=K)
        assert cfg.PDL == planned, (M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, out_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float8_e4m3fn, torch.bfloat16),
                                              (torch.float16, torch.float32)])
@pytest.mark.parametrize("M, N, K", [(1, 48, 14464), (16, 192, 11264), (938, 112, 4480),
                                     (56, 32, 8704), (466, 32, 2448)])
def test_split_k_plan_matches_fp64_every_element(seed, dtype, out_dtype, M, N, K):
    """Shapes the planner splits (few tiles, long K), against float64, every element of a
    poisoned output; through `scaled` with alpha = 0.25 (a power of two: exact on every
    plane, so equal to a quarter of the fp32 result)."""
    import tk_cute
    from tk_cute import dense_gemm
    from tk_cute.testing import assert_gemm_close

    a = torch.randn(M, K, device="cuda").to(dtype)
    b = torch.randn(N, K, device="cuda").to(dtype)
    assert dense_gemm.config_for(a, b, out_dtype).SPLIT_K > 1
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    assert_gemm_close(tk_cute.gemm(a, b, out_dtype, out=out), a, b)
    if dtype == torch.bfloat16:
        alpha = torch.tensor([0.25], device="cuda")
        poison = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
        scaled = dense_gemm.scaled(a, b, alpha, poison)
        assert torch.equal(scaled, 0.25 * tk_cute.gemm(a, b, torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [
    {"SPLIT_K": 2, "TRANSPOSE_C": True, "Nb": 64, "EPI_N": 16, "SHIFT_EDGES": True},
    {"SPLIT_K": 7, "Mb": 64, "Nb": 96, "EPI_N": 16, "CLUSTER_N": 2},
    {"SPLIT_K": 32, "Mb": 192, "Nb": 176, "EPI_N": 16, "SHIFT_EDGES": True},
], ids=["transposed-shifted", "uneven-ranges-cluster", "32-ranges-tall"])
def test_split_k_configs_match_fp64_every_element(seed, config):
    """Forced split-K configs (uneven ranges, clusters, the transposed and shifted epilogue,
    the most ranges) on ragged shapes, every element of a poisoned output."""
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    M, N, K = (72, 200, 4096) if config.get("TRANSPOSE_C") else (300, 136, 4160)
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(N, K, device="cuda").bfloat16()
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = Config(EPI_PIPE_DEPTH=2, **config)
    assert_gemm_close(tk_cute.gemm(a, b, config=cfg, out=out), a, b)


# --- programmatic dependent launch (`Config.PDL`) ---------------------------------------------

@pytest.mark.parametrize("split, scaled", [(1, False), (4, False), (1, True)])
def test_pdl_waits_before_any_global_read_and_lets_the_next_call_launch(split, scaled):
    """`Config.PDL` keeps the GEMM's MMAs and TMA traffic; the GEMM waits for the kernel
    before it (griddepcontrol.wait) before reading anything (the scaled kernel's alpha too:
    the NVFP4 "dequantize" path plans PDL as `tk_cute.gemm` does), and lets the next kernel
    launch (one launch_dependents: with split-K the same one that lets the plane sum launch)."""
    cfg = Config(EPI_PIPE_DEPTH=2, SPLIT_K=split)
    pdl = dataclasses.replace(cfg, PDL=True)
    b, base = (build(gemm_sm90.kernel_for(c, scaled).call_ptrs,
                     *gemm_sm90.signature(c, scaled).compile_args(SMS), arch="sm_90a")
               for c in (pdl, cfg))
    assert b.sass_count("HGMMA") == base.sass_count("HGMMA") > 0
    assert b.ptx_count(r"cp\.async\.bulk\.tensor") == base.ptx_count(r"cp\.async\.bulk\.tensor")
    assert b.ptx_count(r"griddepcontrol\.wait") == 1 + base.ptx_count(r"griddepcontrol\.wait")
    assert b.ptx_count(r"griddepcontrol\.launch_dependents") == 1
    waits = b.reads_before_pdl_wait()
    assert len(waits) == (2 if split > 1 else 1)
    assert all(reads == [] for reads in waits.values())
    assert all(k.local_bytes == 0 for k in b.resources) and b.sass_count(r"\bSTL\b") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("config", [{}, {"SPLIT_K": 4}, {"CLUSTER_N": 2, "Nb": 128}],
                         ids=["plain", "split", "cluster"])
def test_pdl_chain_matches_fp64_every_element(seed, config):
    """A chain of PDL GEMMs, each reading the one before's output (C1 = A B^T, C2 = C1 B2^T)
    and the third overwriting what the second read (C3 = C2 B2^T into C1's buffer): every
    element of poisoned outputs against float64 (C1 recomputed after the chain: the GEMM is
    deterministic), so no call reads or writes before its predecessor has ended."""
    import tk_cute
    from tk_cute.testing import assert_gemm_close

    M, N, K = 300, 256, 4160
    cfg = Config(EPI_PIPE_DEPTH=2, PDL=True, **config)
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(N, K, device="cuda").bfloat16()
    b2 = torch.randn(N, N, device="cuda").bfloat16()
    c1, c2 = (torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
              for _ in range(2))
    tk_cute.gemm(a, b, config=cfg, out=c1)
    tk_cute.gemm(c1, b2, config=cfg, out=c2)
    c3 = tk_cute.gemm(c2, b2, config=cfg, out=c1)
    c1 = tk_cute.gemm(a, b, config=cfg)
    assert_gemm_close(c1, a, b)
    assert_gemm_close(c2, c1, b2)
    assert_gemm_close(c3, c2, b2)
