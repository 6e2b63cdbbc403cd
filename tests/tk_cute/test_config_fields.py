"""Every kernel Config field and who varies it (the house rule: a field exists only where the
dispatch varies it or a user needs it).

`FIELDS` names, per Config, each field's varier. A sweep of shapes through every planner (the
Hopper NVFP4 plans, the dense GEMM's `default_config`, the Blackwell / Rubin cost model) checks
that each field marked "dispatch" takes at least two values; the fields the sweep never varies
are "fixed" (one value on every path: a constant kept as a field because a test or the bench
varies it, listed in `FIXED` with the reason); no GEMM Config keeps a switch that no dispatch
picks. A field missing from the table, or a "dispatch" field the sweep never varies, fails."""

import dataclasses
import itertools

import pytest
import torch
from tk_cute.kernels.gemm import (
    gemm_sm90,
    nvfp4_small_m_sm90,
    nvfp4_register_a_sm90,
    nvfp4_register_a_tiled_sm90,
    nvfp4_sm100,
    nvfp4_w4a16_sm100,
)

from tk_cute.tuning import dense_sm90 as dense_tuning
from tk_cute.nvfp4.gemm import _plan_hopper
from tk_cute.tuning import sm100 as sm100_tuning
from tk_cute.tuning import sm90 as sm90_tuning

D, F = "dispatch", "fixed"
FIELDS = {
    gemm_sm90.Config: {
        "dtype": D, "out_dtype": D, "Mb": D, "Nb": D, "EPI_N": D, "EPI_PIPE_DEPTH": D,
        "CLUSTER_M": D, "CLUSTER_N": D, "TRANSPOSE_C": D, "SHIFT_EDGES": D, "SPLIT_K": D,
        "PDL": D, "Kb": F, "LOAD_PIPE_DEPTH": F, "SUPERGROUP_SIZE": F, "arch": F},
    nvfp4_small_m_sm90.Config: {
        "NT": D, "WN": D, "UNROLL": D, "w4a4": D, "out_dtype": D, "MIN_CTAS": D, "S": D,
        "AHEAD": D, "EARLY_WEIGHTS": D, "XSMEM": D, "L2_FETCH": D, "sf": D, "K_TAIL": D,
        "REST": D, "QUANTIZE_A": D, "CLUSTER": D, "MT": F, "PDL": F},
    nvfp4_register_a_sm90.Config: {
        "N_ACT": D, "ROWS": D, "PDL": D, "EARLY_WEIGHTS": D, "DIRECT": D, "out_dtype": D,
        "sf": D,
        "K_TAIL": D, "N_TAIL": D, "a_format": D,
        "TILES": D, "PERMUTE": D, "STAGES": F, "A_SETS": F, "CLUSTER": D},
    nvfp4_register_a_tiled_sm90.Config: {
        "Nb": D, "A_SETS": D, "out_dtype": D, "sf": D, "a_format": D, "K_TAIL": D,
        "N_TAIL": D, "STREAM_K": D, "PARTIAL_V4": D, "TEAMS": D,
        "LOAD_PIPE_DEPTH": F, "SUPERGROUP_SIZE": F, "PDL": F},
    nvfp4_sm100.Config: {
        "arch": D, "Mb": D, "Nb": D, "LOAD_PIPE_DEPTH": D, "ACC_PIPE_DEPTH": D,
        "CLUSTER_N": D, "out": D, "scheduler": D, "swap_ab": D, "SPLIT_K": D, "sf": D,
        "Kb": F, "EPI_PIPE_DEPTH": F, "EPI_N": F, "CLUSTER_M": F, "SUPERGROUP_SIZE": F},
    nvfp4_w4a16_sm100.Config: {
        "arch": D, "out": D, "sf": D, "SPLIT_K": D, "swap_ab": D, "x_rows": D,
        "STAGES": F, "EPI_N": F, "EPI_PIPE_DEPTH": F},
}
# Why each fixed field is a field: 0 = "as many as fit" / "4 MMA K steps" (the tests and the
# bench's --plans pin other values), the SM count's supergroup (tests walk others), the tile
# epilogue's block and buffers (the compile tests' epilogue-layout proofs vary them), the
# target (one Config type per kernel family).
FIXED = {"Kb", "LOAD_PIPE_DEPTH", "SUPERGROUP_SIZE", "arch", "MT", "PDL", "STAGES", "A_SETS",
         "EPI_PIPE_DEPTH", "EPI_N", "CLUSTER_M"}


def _sweep() -> dict:
    """Config type -> field -> the values the planners chose over a sweep of calls."""
    seen: dict = {}

    def add(cfg):
        fields = seen.setdefault(type(cfg), {})
        for f in dataclasses.fields(cfg):
            fields.setdefault(f.name, set()).add(repr(getattr(cfg, f.name)))

    ms = (1, 3, 9, 16, 33, 64, 113, 129, 200, 256, 1000, 4000)
    ns = (136, 576, 2880, 4000, 8192, 28672)
    ks = (48, 2880, 8192, 8208, 29568)  # (29568: 231 128-K steps, an odd count)
    for w4a4, m, n, k, out, pdl, sf in itertools.product(
            (False, True), ms, ns, ks, ("bfloat16", "float32", "float16"), (False, True),
            ("ue4m3", "ue5m3")):
        p = _plan_hopper(w4a4, m, n, k, out, 132, pdl, None, sf)
        if p.config is not None:
            add(p.config)
    for m, n, k in itertools.product(ms, ns, ks):  # W4A4 from bf16 in one launch
        cfg = sm90_tuning.quantize_in_gemm(m, n, k)
        if cfg is not None:
            add(cfg)
    for m, n, dt, od, lines in itertools.product(
            ms + (8192,), ns + (8,), (torch.bfloat16, torch.float8_e4m3fn),
            (torch.bfloat16, torch.float32), (True, False)):
        for k in (None, 4096, 14448):  # (K: split-K where few tiles stream a long K)
            add(dense_tuning.default_config(dt, od, m, n, 132, lines=lines, quads=30, K=k))
    for arch, m, n, k in itertools.product(("sm_100a", "sm_103a", "sm_107a"),
                                           (1, 16, 128, 4096), (8, 3584, 8192),
                                           (16, 2880, 18944)):
        sfs = ("ue4m3", "ue5m3") if arch == "sm_107a" else ("ue4m3",)
        for out, sf in itertools.product(("bfloat16", "float32", "nvfp4"), sfs):
            add(sm100_tuning.w4a4_config(arch, m, n, k, out, sf))
            if out != "nvfp4":
                add(sm100_tuning.w4a16_config(arch, m, n, k, out, sf))
    return seen


@pytest.fixture(scope="module")
def swept():
    return _sweep()


@pytest.mark.parametrize("config", list(FIELDS), ids=lambda c: c.__module__.split(".")[-1])
def test_every_field_is_listed_with_its_varier(config, swept):
    names = {f.name for f in dataclasses.fields(config)}
    assert names == set(FIELDS[config]), (names ^ set(FIELDS[config]))
    values = swept[config]
    for name, who in FIELDS[config].items():
        if who == D:
            assert len(values[name]) > 1, f"{config.__module__}.{name}: never varied"
        else:
            assert len(values[name]) == 1, f"{config.__module__}.{name} is varied: mark it {D}"
        if who == F:
            assert name in FIXED, name
