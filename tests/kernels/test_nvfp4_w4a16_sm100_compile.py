"""Compile-only checks of the W4A16 tcgen05 kernel on sm_100a, sm_103a and sm_107a (no GPU; it
runs in the emulator: tests/tk_cute/emulator/test_sm100.py). Every build also passes the
synchronization lint (tests/conftest.py)."""

import pytest

from tk_cute.arch import target
from tk_cute.kernels.gemm import nvfp4_w4a16_sm100 as W
from tk_cute.nvfp4 import heuristics

ARCHS = ["sm_100a", "sm_103a", "sm_107a"]


@pytest.fixture(scope="module", params=ARCHS)
def built(request):
    cfg = heuristics.sm100_w4a16_config(request.param, 256, 256, 512)
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


@pytest.mark.parametrize("kwargs", [dict(arch="sm_90a"), dict(out="nvfp4"),
                                    dict(arch="sm_100a", sf="ue5m3"), dict(STAGES=64)])
def test_config_rejections(kwargs):
    with pytest.raises(W.ConfigError):
        W.Config(**kwargs)
