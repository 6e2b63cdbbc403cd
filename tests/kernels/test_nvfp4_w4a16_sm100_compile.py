"""Compile-only checks of the W4A16 tcgen05 kernel on sm_100a, sm_103a and sm_107a (no GPU; it
runs in the emulator: tests/tk_cute/emulator/test_sm100.py). Every build also passes the
synchronization lint (tests/conftest.py)."""

import pytest

from tk_cute.arch import target
from tk_cute.kernels.gemm import nvfp4_w4a16_sm100 as W

ARCHS = ["sm_100a", "sm_103a", "sm_107a"]


@pytest.fixture(scope="module", params=ARCHS)
def built(request):
    cfg = W.Config(arch=request.param, STAGES=4)  # X tiles of 128 rows, the operands in order
    b, kern = W.compile(cfg)
    return request.param, cfg, b


def test_f16_mmas_from_decoded_weights(built):
    """Kb / 16 kind::f16 MMAs of one CTA per stage; no block-scaled MMA and no TMA of the
    weights (the transform warps read codes and scales and write the decoded tile)."""
    arch, cfg, b = built
    assert b.ptx_count(r"tcgen05\.mma\.cta_group::1\.kind::f16") == W.Kb // 16
    assert b.ptx_count(r"block_scale|mxf4nvf4") == 0
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global") == 1  # X only
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared") == 1  # D's store
    assert b.ptx_count(r"ld\.global\.L1::evict_first\.v4\.b32") == 2  # 32 code bytes a row
    assert b.ptx_count(r"mul\.rn\.bf16x2") >= 16  # the exact decode
    assert b.ptx_count(r"st\.shared\.v4\.u32") == 8  # 8 swizzled 16-byte chunks a row
    assert b.ptx_count(r"tcgen05\.wait::ld") >= 1 and b.ptx_count(r"tcgen05\.dealloc") == 1


def test_resources(built):
    arch, cfg, b = built
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0
    assert cfg.smem_bytes <= target(arch).smem_bytes
    assert b.ptx_count(r"\.reqntid 192, 1, 1") == 1


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("x_rows", W.X_ROWS)
def test_swapped_small_m_tiles(arch, x_rows):
    """Swapped: the decoded weights are the MMA's A (128 rows), X's tile of x_rows its B; the
    MMA is 128 x x_rows, TMEM holds x_rows columns (at least 32), D's store is TMA."""
    cfg = W.Config(arch=arch, STAGES=4, swap_ab=True, x_rows=x_rows, SPLIT_K=2)
    b, kern = W.compile(cfg, 16, 256, 1024)
    assert b.ptx_count(r"tcgen05\.mma\.cta_group::1\.kind::f16") == W.Kb // 16
    assert b.ptx_count(r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32") == 1
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared") >= 1  # D: TMA only
    assert b.ptx_count(r"st\.global") == 0
    assert b.kernel.local_bytes == 0 and cfg.smem_bytes <= target(arch).smem_bytes
    assert cfg.tile == (128, x_rows) and cfg.d_type == "float32"


@pytest.mark.parametrize("kwargs", [dict(arch="sm_90a"), dict(out="nvfp4"),
                                    dict(arch="sm_100a", sf="ue5m3"), dict(STAGES=64),
                                    dict(x_rows=16), dict(swap_ab=True, x_rows=8),
                                    dict(SPLIT_K=0)])
def test_config_rejections(kwargs):
    with pytest.raises(W.ConfigError):
        W.Config(**kwargs)
