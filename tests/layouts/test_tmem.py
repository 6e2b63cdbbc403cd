"""TMEM column maps of the NVFP4 GEMM and the allocator's column choice."""

import pytest

from tk_cute.layouts.tmem import nvfp4_columns, scale_columns
from tk_cute.types.tt import alloc_columns, is_exclusive


def test_rubin_two_accumulators_fill_576_columns():
    cols = nvfp4_columns(m_cta=256, n=256, kb=256, m_mmas=2, acc_stages=1)
    assert (cols["acc"].columns, cols["SFA"].columns, cols["SFB"].columns) == (512, 32, 32)
    assert cols["SFB"].end == 576 == alloc_columns(576, "sm_107a")
    assert is_exclusive(576, "sm_107a") and not is_exclusive(512, "sm_107a")


def test_blackwell_single_pair_tile():
    cols = nvfp4_columns(m_cta=128, n=256, kb=256, m_mmas=1, acc_stages=1)
    assert cols["SFB"].end == 304 and alloc_columns(304, "sm_100a") == 512
    assert scale_columns(128, 256) == 16 and scale_columns(256, 256) == 32


def test_over_budget_and_rounding():
    assert alloc_columns(560, "sm_107a") == 576  # exclusive: multiple of 32
    assert alloc_columns(33, "sm_100a") == 64
    with pytest.raises(ValueError):
        alloc_columns(576, "sm_100a")
