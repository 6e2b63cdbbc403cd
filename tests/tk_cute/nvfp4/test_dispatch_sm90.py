"""`tk_cute.nvfp4.gemm` on Hopper: every valid shape runs a kernel, never the reference.

CPU tier: the plans (`gemm._plan_hopper`, pure host logic) over the issue's shape grid: every
part is a path that can take its shape, N-padding exactly where D's rows would not be 16-byte
aligned; validation of every argument.
GPU tier (marker gpu): the same grid run through `gemm` with poisoned outputs, every element
within `tk_cute.testing.assert_gemm_close`'s bound of the exact float64 product, with the
references patched to raise (a call that reached one would fail).
"""

import dataclasses
import itertools

import pytest
import torch
from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv

from tk_cute.nvfp4 import NVFP4Tensor, gemm, plan, quantize
from tk_cute.nvfp4.gemm import Plan, _plan_hopper
from tk_cute.tuning import rounds
from tk_cute.tuning import sm90 as sm90_tuning

GRID_M = [1, 3, 17, 100, 129, 200, 255, 257, 1000, 4000]
GRID_N = [8, 136, 4000, 8192]
GRID_K = [16, 48, 8208, 8192]
OUTS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SMS = 132  # H200


def _covered(p: Plan, M: int, N: int, K: int, w4a4: bool, out: str) -> None:
    """Raise unless every one-kernel part of `p` can run its (sub)shape."""
    assert p.path != "reference"
    sm90_tuning.check_hopper_path(p.path, w4a4, M, N, K, out)


@pytest.mark.parametrize("out", list(OUTS))
@pytest.mark.parametrize("w4a4", [False, True], ids=["W4A16", "W4A4"])
def test_every_grid_shape_has_a_kernel_plan(w4a4, out):
    for M, N, K in itertools.product(GRID_M, GRID_N, GRID_K):
        p = _plan_hopper(w4a4, M, N, K, out, SMS, False)
        _covered(p, M, N, K, w4a4, out)
        per_row = 16 // OUTS[out].itemsize
        assert p.pad_n == (0 if N % per_row == 0 else -(-N // per_row) * per_row)
        if w4a4 and p.path in ("register_a", "register_a_tiled"):  # in the permute pass
            assert p.config.a_format == "nvfp4"
        if w4a4 and p.path == "register_a":
            assert p.config.permute == "call"


# Real layers' N and K (Llama 3 8B / 70B, Qwen2.5 7B, Mistral 7B, gpt-oss, DeepSeek-V3), odd
# and prime sizes, every M regime.
PROP_M = [1, 2, 4, 8, 9, 16, 17, 64, 100, 112, 113, 128, 129, 200, 208, 209, 256, 257, 384,
          512, 1000, 2048, 4096]
PROP_N = [128, 136, 1024, 2880, 3584, 4096, 5760, 7168, 8192, 14336, 18944, 28672]
PROP_K = [256, 2048, 2880, 3584, 4096, 8192, 8208, 18944]


def _props():
    for w4a4, M, N, K in itertools.product((False, True), PROP_M, PROP_N, PROP_K):
        yield w4a4, M, N, K, _plan_hopper(w4a4, M, N, K, "bfloat16", SMS, False)


def _ctas(path: str, cfg, M: int, N: int, K: int) -> tuple[int, int]:
    """(CTAs launched, the most that can be busy) of a stream-K plan: register-A's (row block
    x stage) units; the tiled kernel's (tile x stage) units, split as
    `launch.stream_k_buffers` splits them, teams at most TEAM_MAX parts per tile (each part
    finishes whole consumer warps' rows)."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
    from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst

    from tk_cute.ops import schedule

    if path == "register_a":
        return sm90_tuning.register_a_grid(cfg, N, K, SMS), min(SMS, rs.stream_units(cfg, N, K))
    tiles, steps = rst.tiles(M, N, cfg), rs.k_blocks(cfg.K_TAIL, K)
    if cfg.TEAMS:  # equal parts of every tile
        return (schedule.stream_k_team_grid(tiles, steps, SMS),
                tiles * min(SMS // tiles, steps, schedule.TEAM_MAX))
    return schedule.stream_k_grid(tiles, steps, SMS), min(SMS, tiles * steps)


def test_every_layer_shape_plans_a_kernel_by_the_rules():
    """Every real-layer shape plans one kernel path (never the reference) that can take it:
    the small-M kernel below `RS_MIN_M` rows where it takes the shape (W4A4 up to
    `W4A4_NATIVE_MAX_M`), no register-A or small-M kernel above their 128 / 64 rows, the tiled
    kernel's split tile (as wide as M, stream-K) up to `SPLIT_TILE_MAX_M` rows, "dequantize"
    only where it wins or the tiled kernel cannot take the shape; the register-A kernels' K
    tail and activation format set from the call, and D stored by the GEMM (`DIRECT`, the
    plan's text "register_a(D direct)") exactly where its grid gives whole row blocks."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
    from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst

    for w4a4, M, N, K, p in _props():
        _covered(p, M, N, K, w4a4, "bfloat16")
        small = M <= (sm90_tuning.W4A4_NATIVE_MAX_M if w4a4 else sm90_tuning.RS_MIN_M - 1)
        if small and gv.supports(M, N, K):
            assert p.path == "small_m", (w4a4, M, N, K, p)
        if p.path == "small_m":  # a K split the kernel takes (uneven: within one trip)
            gv.check_shape(p.config, M, N, K)
        if M > 128:
            assert p.path in ("register_a_tiled", "dequantize"), (w4a4, M, N, K, p)
        if p.path == "register_a_tiled" and M <= sm90_tuning.SPLIT_TILE_MAX_M:
            assert p.config.STREAM_K and p.config.Nb == sm90_tuning.split_tile_width(M)
        if p.path == "register_a_tiled":  # the plan's text, as the bench prints it
            assert str(p).startswith(f"register_a_tiled(Nb={p.config.Nb}")
            assert ("stream-K" in str(p)) == p.config.STREAM_K
        if p.path == "dequantize":
            assert (sm90_tuning.dequantize_wins(w4a4, M, N, K, SMS)
                    or not rst.supports(M, N, K)), (w4a4, M, N, K)
        if p.path == "register_a":  # D from the GEMM exactly where the grid allows it
            ctas, _ = _ctas(p.path, p.config, M, N, K)
            assert p.config.DIRECT == rs.whole_blocks(p.config, N, K, ctas)
            assert (str(p) == "register_a(D direct)") == p.config.DIRECT
            assert ("cluster sum" in str(p)) == (p.config.CLUSTER > 1)
        if p.path in ("register_a", "register_a_tiled"):
            assert p.config.K_TAIL == (K % (256 if p.path == "register_a" else 128) != 0)
            assert p.config.a_format == ("nvfp4" if w4a4 else "bf16")


def test_stream_k_plans_fill_the_sms_where_the_shape_allows():
    """Every tiled stream-K plan (split tile, stream-K widths) launches at least 90% of the
    CTAs its work can keep busy (`_ctas`); a register-A grid gives no CTA more units than one
    CTA per SM would plus the misaligned grid's modelled cost
    (`sm90_tuning.RS_MISALIGNED_UNITS`), and takes fewer than 90% of the SMs only where its
    shares line up with the row blocks."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs

    for w4a4, M, N, K, p in _props():
        if p.path == "register_a_tiled" and p.config.STREAM_K:
            ctas, most = _ctas(p.path, p.config, M, N, K)
            assert ctas >= 0.9 * most, (w4a4, M, N, K, p, ctas, most)
        if p.path == "register_a" and p.config.CLUSTER > 1:  # (aligned: a cluster per block)
            stream_k = dataclasses.replace(p.config, CLUSTER=1)
            assert _ctas(p.path, p.config, M, N, K)[0] >= _ctas(p.path, stream_k, M, N, K)[0]
        elif p.path == "register_a":
            ctas, most = _ctas(p.path, p.config, M, N, K)
            units = rs.stream_units(p.config, N, K)
            assert -(-units // ctas) <= -(-units // most) + sm90_tuning.RS_MISALIGNED_UNITS
            assert ctas >= 0.9 * most or rounds.aligned(units, rs.k_stages(p.config, K), ctas)


def test_small_m_fat_ctas_run_in_one_round():
    """At M <= 8 a small-M plan split along K (S = 2..16 warps of WN row groups, 16 // (WN x
    S) CTAs per SM: MIN_CTAS) fits all its CTAs on the SMs at once (no partial second round),
    on every property shape and the real layers whose split it shrank
    (docs/facts.md#small-m-round)."""
    from tk_cute.bench.nvfp4 import MODEL_LAYERS

    layers = {(N, K) for fam in MODEL_LAYERS.values() for _, N, K in fam}
    cases = [(w4a4, M, N, K, p) for w4a4, M, N, K, p in _props()] + [
        (w4a4, M, N, K, _plan_hopper(w4a4, M, N, K, "bfloat16", SMS, False))
        for w4a4 in (False, True) for M in (1, 8) for N, K in sorted(layers)]
    checked = 0
    for w4a4, M, N, K, p in cases:
        c = p.config
        if p.path == "small_m" and c.AHEAD and 2 <= c.S <= 16:
            assert N // c.rows * c.CLUSTER <= SMS * c.MIN_CTAS, (w4a4, M, N, K, p)
            checked += 1
    assert checked > 100
    assert _plan_hopper(False, 1, 4608, 3584, "bfloat16", SMS, False).config.S == 7
    # the A/B's winners (H100: 1x36864x7168 S = 2 x WN = 4, 288 CTAs, 75.3 us; S = 1 x WN = 8
    # 59.0; 1x24576x1536 S = 3 x WN = 2 11.0, S = 2 x WN = 4 9.9)
    for M, N, K, S, WN in ((1, 36864, 7168, 1, 8), (8, 37888, 3584, 1, 8), (1, 24576, 1536, 2, 4)):
        c = _plan_hopper(False, M, N, K, "bfloat16", SMS, False).config
        assert (c.S, c.WN) == (S, WN), (M, N, K, c)


def test_small_m_ctas_keep_their_trips_registers():
    """No small-M plan has more warps per CTA than its trips' registers allow (65536 / threads
    per thread: SMALL_M_MAX_WARPS = 16, 128 registers; W4A4 decoding two activation tiles of 4
    steps per trip SMALL_M_MAX_WARPS_DECODING = 12), on every property shape and listed layer;
    the compile test checks the spills of such plans (tests/kernels/test_nvfp4_small_m_sm90.py:
    1x576x7168 at the aim's 28 warps spilled 83 loads and stores per trip)."""
    from tk_cute.bench.nvfp4 import MODEL_LAYERS

    layers = {(N, K) for fam in MODEL_LAYERS.values() for _, N, K in fam}
    cases = list(_props()) + [
        (w4a4, M, N, K, _plan_hopper(w4a4, M, N, K, "bfloat16", SMS, False))
        for w4a4 in (False, True) for M in (1, 2, 8, 9, 16) for N, K in sorted(layers)]
    most = 0
    for w4a4, M, N, K, p in cases:
        c = p.config
        if p.path == "small_m":
            decoding = c.decodes_activations and c.NT * c.UNROLL > 4
            assert c.WN * c.S <= (12 if decoding else 16), (w4a4, M, N, K, c)
            most = max(most, c.WN * c.S)
    assert most == 16
    assert _plan_hopper(False, 1, 576, 7168, "bfloat16", SMS, False).config.S == 14


def test_tiled_widths_are_the_rounds_models_cheapest():
    """Above the split tile, where few weight tiles do not set the width, the tiled kernel's
    (Nb, stream-K) is the rounds model's least time over every width and both schedules
    (stream-K only where the bf16 activations fit TILED_STREAM_K_MAX_A_BYTES)."""
    from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst

    from tk_cute.tuning import rounds

    for w4a4, M, N, K, p in _props():
        if (p.path != "register_a_tiled" or M <= sm90_tuning.SPLIT_TILE_MAX_M
                or sm90_tuning.few_tiles_width(M, N, SMS) or sm90_tuning.few_bands(M, N, SMS)):
            continue
        bands = -(-N // rst.ROWS)
        overhead = sm90_tuning.TILED_STREAM_K_OVERHEAD * 8192 / K

        def time(nb, sk, M=M, bands=bands, overhead=overhead):
            tiles = bands * -(-M // nb)
            if sk:
                n_rounds = tiles / SMS + overhead if tiles >= SMS else float("inf")
            else:
                n_rounds = rounds.tile_rounds(bands, M, nb, SMS)
            return n_rounds * nb * sm90_tuning.TILED_TILE_COST[nb]

        kinds = (False, True) if 2 * M * K <= sm90_tuning.TILED_STREAM_K_MAX_A_BYTES else (False,)
        best = min(time(nb, sk) for nb in sm90_tuning.TILED_TILE_COST for sk in kinds)
        picked = p.config.Nb  # (a stream-K tile as wide as M narrowed to hold M alone)
        if picked not in sm90_tuning.TILED_TILE_COST:
            assert p.config.STREAM_K and picked == sm90_tuning.split_tile_width(M), p
            picked = min(w for w in sm90_tuning.TILED_TILE_COST if w >= M)
        assert time(picked, p.config.STREAM_K) == best, (M, N, K, p)


def test_few_bands_take_the_tiled_kernel_where_it_has_a_plan():
    """Beyond the split tile on few weight bands (`few_bands`: the 128-row tiles fewer than
    DEQUANTIZE_MAX_TILES x the SMs): stream-K teams of 128-wide tiles from
    FEW_BANDS_TEAMS_MIN_K of at most FEW_BANDS_TEAMS_MAX parts (while the bf16 activations fit
    TILED_STREAM_K_MAX_A_BYTES), else whole tiles of the narrowest width that covers M in
    one round and fills FEW_BANDS_MIN_FILL of the SMs, else "dequantize", both formats; on
    every property shape (each case recounted here from the tiles and parts), at the rule's
    edges, and the H100 A/B's picks (docs/facts.md#few-bands)."""
    T = sm90_tuning
    from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst

    def parts(M, N, K):  # a team's parts of 128-wide tiles, 0 where teams do not apply
        c = rst.Config(Nb=128, STREAM_K=True, TEAMS=True, K_TAIL=K % 128 != 0,
                       N_TAIL=N % 128 != 0)
        n = T.stream_k_team(M, N, K, c, SMS)
        fits = K >= T.FEW_BANDS_TEAMS_MIN_K and 2 * M * K <= T.TILED_STREAM_K_MAX_A_BYTES
        return n if fits and 2 <= n <= T.FEW_BANDS_TEAMS_MAX else 0

    def whole(M, N):  # the narrowest width covering M in one round, if it fills enough SMs
        bands = -(-N // 128)
        nb = next((w for w in rst.NBS if w * (SMS // bands) >= M), None)
        return nb if nb and bands * -(-M // nb) >= T.FEW_BANDS_MIN_FILL * SMS else None

    seen = set()
    for w4a4, M, N, K, p in _props():
        if not T.few_bands(M, N, SMS) or T.dequantize_by_rows(w4a4, M, N, K):
            continue  # (the row rules come first)
        c = p.config
        if p.path == "dequantize":
            assert not parts(M, N, K) and whole(M, N) is None, (w4a4, M, N, K)
            seen.add("dequantize")
        elif c.TEAMS:
            assert (c.Nb, c.STREAM_K, c.PARTIAL_V4) == (128, True, True), (w4a4, M, N, K, p)
            assert parts(M, N, K) == T.stream_k_team(M, N, K, c, SMS)
            seen.add("teams")
        else:
            assert p.path == "register_a_tiled" and not c.STREAM_K, (w4a4, M, N, K, p)
            assert not parts(M, N, K) and c.Nb == whole(M, N), (w4a4, M, N, K, p)
            assert -(-N // 128) * -(-M // c.Nb) <= SMS  # one round
            seen.add("whole")
    assert seen == {"dequantize", "teams", "whole"}

    def picked(M, N, K):
        p = _plan_hopper(False, M, N, K, "bfloat16", SMS, False)
        return None if p.path == "dequantize" else (p.config.Nb, p.config.TEAMS)

    # the edges: teams from K = FEW_BANDS_TEAMS_MIN_K (1536 wide: 5 parts); 6 parts are too
    # many (576 wide at 512 rows); whole tiles from FEW_BANDS_MIN_FILL (23 bands x 4 tiles of
    # 64 at 256 rows fill 0.70; 20 bands x 4 fill 0.61, 19 x 4 0.58)
    assert picked(256, 1536, T.FEW_BANDS_TEAMS_MIN_K) == (128, True)
    assert picked(256, 1536, T.FEW_BANDS_TEAMS_MIN_K - 16) is None
    assert picked(512, 576, 8192) is None and picked(1024, 576, 8192) == (128, True)
    assert picked(256, 20 * 128, 2048) == (64, False) and picked(256, 19 * 128, 2048) is None
    for M, N, K, nb, teams in ((256, 2880, 2880, 64, False), (256, 2880, 4096, 64, False),
                               (256, 1536, 7168, 128, True), (512, 1536, 7168, 128, True),
                               (1024, 576, 7168, 128, True), (256, 576, 7168, None, None),
                               (512, 576, 7168, None, None)):
        for w4a4 in (False, True):
            p = _plan_hopper(w4a4, M, N, K, "bfloat16", SMS, False)
            if nb is None:
                assert p.path == "dequantize", (M, N, K, p)
            else:
                assert p.path == "register_a_tiled", (M, N, K, p)
                assert (p.config.Nb, p.config.TEAMS) == (nb, teams), (M, N, K, p)


def test_cluster_sums_where_their_grid_covers_the_stream_k_grid():
    """`rs.Config.CLUSTER` (`register_a_cluster`) on every register-A plan: only at N_ACT 32-64
    with the per-call permute, never with DIRECT, and exactly where c CTAs per row block give
    at least the stream-K grid's CTAs, at least c stages each and clusters that all run at once
    (the largest such c); the H100 A/B's points (docs/facts.md#rs-cluster) on either side:
    64x2880^2 and 64x3584^2 in clusters of 4, 64x4096^2 (32 clusters of 4 overfill the GPCs)
    and 64x1536x7168 (8 per block would be needed) not, 16 rows not, pdl's per-stage permute
    not."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs

    T = sm90_tuning
    picked = 0
    for w4a4, M, N, K, p in _props():
        if p.path != "register_a":
            continue
        cfg = dataclasses.replace(p.config, CLUSTER=1)
        blocks, stages = rs.row_blocks(cfg, N), rs.k_stages(cfg, K)
        fits = [c for c, resident in T.CLUSTERS_RESIDENT.items()
                if blocks * c >= _ctas(p.path, cfg, M, N, K)[0] and blocks <= resident
                and stages >= c]
        want = (max(fits) if fits and 32 <= cfg.N_ACT <= 64 and cfg.permute == "call"
                and not p.config.DIRECT else 1)
        assert p.config.CLUSTER == want, (w4a4, M, N, K, p)
        picked += want > 1
    assert picked >= 20
    plan = lambda M, N, K, pdl=False: _plan_hopper(False, M, N, K, "bfloat16", SMS, pdl)
    assert plan(64, 2880, 2880).config.CLUSTER == plan(64, 3584, 3584).config.CLUSTER == 4
    assert plan(64, 7168, 2048).config.CLUSTER == 2
    assert plan(64, 4096, 4096).config.CLUSTER == plan(64, 1536, 7168).config.CLUSTER == 1
    assert plan(16, 5760, 2880).config.CLUSTER == 1
    assert plan(32, 2880, 2880, pdl=True).config.CLUSTER == 1
    assert plan(64, 2880, 2880, pdl=True).config.CLUSTER == 4  # (per-call permute at 64 rows)


def test_measured_boundaries():
    """The measured thresholds of `tuning.sm90`, each at its edge (docs/facts.md anchors in
    the module): the split tile from SPLIT_TILE_MIN_M rows on SPLIT_TILE_MIN_BANDS bands,
    stream-K teams on few bands, stream-K up to TILED_STREAM_K_MAX_A_BYTES of activations,
    "dequantize" from DEQUANTIZE_FROM rows (narrow layers at long K: DEQUANTIZE_NARROW_N), the
    small-M kernel on N % 128 != 0 up to SMALL_M_TAIL_MAX_M rows where its CTAs fill
    SMALL_M_TAIL_MIN_FILL of the SMs."""
    T = sm90_tuning
    bands_n = T.SPLIT_TILE_MIN_BANDS * 128
    assert _plan_hopper(False, T.SPLIT_TILE_MIN_M - 1, 8192, 8192, "bfloat16", SMS,
                        False).path == "register_a"
    assert _plan_hopper(False, T.SPLIT_TILE_MIN_M, bands_n, 8192, "bfloat16", SMS,
                        False).path == "register_a_tiled"
    assert _plan_hopper(False, 128, bands_n - 128, 8192, "bfloat16", SMS,
                        False).path == "register_a"
    p = _plan_hopper(False, 200, 2880, 2880, "bfloat16", SMS, False)  # 23 bands: 5 parts
    assert p.config.TEAMS and p.config.PARTIAL_V4
    p = _plan_hopper(False, 200, 8192, 8192, "bfloat16", SMS, False)  # 64 bands: 2 parts
    assert p.config.STREAM_K and not p.config.TEAMS
    # stream-K while the activations fit TILED_STREAM_K_MAX_A_BYTES (64 MiB: 4096 x 8192 bf16)
    assert _plan_hopper(False, 4096, 8192, 8192, "bfloat16", SMS, False).config.STREAM_K
    assert not _plan_hopper(False, 4096, 8192, 8192 + 64, "bfloat16", SMS,
                            False).config.STREAM_K
    for w4a4, N, K, rows in ((False, 8192, 7168, 2048), (True, 8192, 3072, 2048),
                             (False, 8192, 15360, 8192), (True, 8192, 15360, 8192),
                             (True, 8192, 7168, 8192), (True, 4096, 7168, 8192),
                             # narrow layers at long K (H100: the tiled kernel 0.54x cuBLAS
                             # bf16 at 2048x3584x18944, "dequantize" 0.87x)
                             (False, 7168, 18432, 2048), (True, 8064, 8192, 2048),
                             (False, 8192, 28672, 8192)):
        assert _plan_hopper(w4a4, rows - 1, N, K, "bfloat16", SMS, False).path == \
            "register_a_tiled", (w4a4, N, K)
        assert _plan_hopper(w4a4, rows, N, K, "bfloat16", SMS, False).path == "dequantize", \
            (w4a4, N, K)
    assert _plan_hopper(False, 100, 100, 64, "bfloat16", SMS, False).pad_n == 104
    # N % 128 != 0 keeps the small-M kernel up to SMALL_M_TAIL_MAX_M rows where its N / 32
    # CTAs fill SMALL_M_TAIL_MIN_FILL of the SMs (2880: 90 of 132), not on 576 (18)
    for w4a4 in (False, True):
        for M in (9, T.SMALL_M_TAIL_MAX_M):
            assert _plan_hopper(w4a4, M, 2880, 2880, "bfloat16", SMS, False).path == "small_m"
            assert _plan_hopper(w4a4, M, 576, 7168, "bfloat16", SMS, False).path == \
                "register_a"
        fill = int(T.SMALL_M_TAIL_MIN_FILL * SMS) * 32  # the least N that fills half the SMs
        assert fill % 128 and _plan_hopper(w4a4, 16, fill, 8192, "bfloat16", SMS,
                                           False).path == "small_m"
        assert _plan_hopper(w4a4, 16, fill - 32, 8192, "bfloat16", SMS, False).path == \
            "register_a"
    # ... and on whole-step K above SMALL_M_SHORT_K_MAX up to SMALL_M_WHOLE_K_MAX where its
    # CTAs fill half the SMs at up to SMALL_M_MAX_CTAS_PER_SM per SM (W4A4: one), not past an
    # edge: 4096x7168 and 4096x14336 both, 8192x8192 W4A16 only, 2176 (68 CTAs) not 2048 (64)
    k, most = T.SMALL_M_WHOLE_K_MAX, T.SMALL_M_MAX_CTAS_PER_SM * SMS * 32
    for w4a4 in (False, True):
        wide = "register_a" if w4a4 else "small_m"
        for M, N, K, path in ((16, 4096, 7168, "small_m"), (9, 8192, 8192, wide),
                              (16, 4096, k, "small_m"), (16, 4096, k + 128, "register_a"),
                              (16, 4096, k - 64, "register_a"), (16, most, 8192, wide),
                              (16, SMS * 32, 8192, "small_m"),
                              (16, SMS * 32 + 128, 8192, wide),
                              (16, most + 128, 8192, "register_a"),
                              (16, 2176, 8192, "small_m"), (16, 2048, 8192, "register_a"),
                              (16, 8192, 4096 + 128, wide), (16, 8192, 4096, "register_a"),
                              (17, 4096, 7168, "register_a")):
            assert _plan_hopper(w4a4, M, N, K, "bfloat16", SMS, False).path == path, (
                w4a4, M, N, K)
    # At 9-16 rows, where the N / 32 CTAs of one row group exceed the SMs but fit two per SM,
    # two steps per trip split at most SMALL_M_TWO_TILES_MAX_S ways, two CTAs per SM; the
    # short-K rule takes K % 128 == 64 there (gpt-oss's 5120x2880 and 5760x2880), not where
    # one round of one per SM holds them (132 CTAs: register-A); more CTAs than two per SM hold
    # (N % 128 != 0: the tail rule) keep the aim (11 slices of K = 2880's 11 chunks)
    for w4a4 in (False, True):
        for M, N, capped in ((16, 5120, True), (9, 5760, True), (16, SMS * 32, None),
                             (16, SMS * 32 + 32, True), (16, 2 * SMS * 32 + 32, False)):
            p = _plan_hopper(w4a4, M, N, 2880, "bfloat16", SMS, False)
            assert p.path == ("register_a" if capped is None else "small_m"), (w4a4, M, N)
            if capped is not None:
                assert (p.config.S, p.config.WN, p.config.MIN_CTAS) == (
                    (T.SMALL_M_TWO_TILES_MAX_S, 1, 2) if capped else (11, 1, 0)), (w4a4, M, N)
    # ... at 9-16 rows only (four or eight activation tiles keep their split: no spill)
    assert T.small_m_config(64, 5120, 3584).MIN_CTAS == 0
    # The small-M kernel's K split: a divisor of the chunks near the aim (K = 8192: 32 chunks,
    # S = 8), but for Qwen2.5-7B's down projection (K = 18944: 74 chunks = 2 x 37, aim 19) 15
    # slices of 4 or 5 chunks (SMALL_M_EVEN_MIN, SMALL_M_MAX_WARPS), not the divisor 2
    assert T.small_m_config(1, 8192, 8192).S == 8
    for w4a4 in (False, True):
        p = _plan_hopper(w4a4, 1, 3584, 18944, "bfloat16", SMS, False)
        assert p.path == "small_m" and p.config.S == 15
        assert _plan_hopper(w4a4, 1, 3584, 18432, "bfloat16", SMS, False).path == "small_m"


def test_pdl_reaches_the_kernels_that_take_it():
    """pdl=True: early weight loads in the small-M kernel and in the register-A kernel that
    permutes per stage, which W4A16 then does up to N_ACT = PDL_STAGE_MAX_N_ACT (a forced
    Config's permute kept); the small-M kernel launches as a programmatic dependent either
    way."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs

    def config(M, pdl, N=8192):
        return _plan_hopper(False, M, N, 8192, "bfloat16", SMS, pdl).config

    assert config(1, True).PDL and config(1, True).EARLY_WEIGHTS
    assert config(1, False).PDL and not config(1, False).EARLY_WEIGHTS
    # (16x8192^2 takes the small-M kernel, 10240 rows register-A)
    assert config(16, True, 10240).PDL and config(16, True, 10240).EARLY_WEIGHTS  # stage
    assert not config(16, False, 10240).PDL
    for M in (17, 32, 48):  # with pdl per stage up to PDL_STAGE_MAX_N_ACT, else the pass
        assert config(M, True).permute == "stage" and config(M, True).EARLY_WEIGHTS
        assert config(M, False).permute == "call" and not config(M, False).PDL
        w4a4 = _plan_hopper(True, M, 8192, 8192, "bfloat16", SMS, True).config
        assert w4a4.permute == "call" and not w4a4.PDL  # the decode pass permutes them
    assert sm90_tuning.PDL_STAGE_MAX_N_ACT == 48
    assert not config(49, True).PDL and config(49, True).permute == "call"
    forced = sm90_tuning.complete("register_a", rs.Config(N_ACT=32, PERMUTE="call"), 2880, 2880,
                                  False, "bfloat16", "ue4m3", True)  # a forced Config: kept
    assert forced.permute == "call" and not forced.PDL
    assert not config(64, True).PDL  # call
    assert not config(64, False).PDL


def test_forced_paths_are_checked():
    with pytest.raises(ValueError, match="path 'register_a' cannot run M=129"):
        _plan_hopper(False, 129, 8192, 8192, "bfloat16", SMS, False, "register_a")
    with pytest.raises(ValueError, match="path must be one of"):
        _plan_hopper(False, 16, 8192, 8192, "bfloat16", SMS, False, "fast")
    p = _plan_hopper(False, 16, 8192, 8192, "bfloat16", SMS, False, "dequantize")
    assert p.path == "dequantize"


def test_cpu_tensors_plan_the_reference(seed):
    a, b = quantize(torch.randn(8, 32)), quantize(torch.randn(4, 32))
    assert plan(a, b).path == "reference" and plan(a, b).kernels() == ["reference"]


# ---------------------------------------------------------------- validation (CPU)


def test_rejects_bad_arguments(seed):
    b = quantize(torch.randn(64, 32))
    a = torch.randn(5, 32).bfloat16()
    with pytest.raises(TypeError, match="pdl must be True or False, got 'yes'"):
        gemm(a, b, pdl="yes")
    with pytest.raises(TypeError, match="W4A16 activations must be a torch.bfloat16 tensor, "
                                        "got torch.float16"):
        gemm(a.half(), b)
    with pytest.raises(ValueError, match="K mismatch: a has K=16, b has K=32"):
        gemm(a[:, :16], b)
    with pytest.raises(TypeError, match="operand a must be an NVFP4Tensor .* got list"):
        gemm([1, 2], b)
    with pytest.raises(ValueError, match=r"out has shape \(5, 63\) \(needs \(5, 64\)\)"):
        gemm(a, b, out=torch.empty(5, 63, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="dtype torch.float16 .needs torch.bfloat16."):
        gemm(a, b, torch.bfloat16, out=torch.empty(5, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="needs contiguous"):
        gemm(a, b, out=torch.empty(64, 5, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="needs 16-byte alignment"):
        gemm(a, b, out=torch.empty(5 * 64 + 1, dtype=torch.bfloat16)[1:].view(5, 64))
    with pytest.raises(ValueError, match="batched weights .* need activations"):
        gemm(a, quantize(torch.randn(2, 64, 32)))
    meta = NVFP4Tensor(b.data.to("meta"), b.scales.to("meta"), b.global_scale.to("meta"),
                       b.shape)
    with pytest.raises(ValueError, match="one device: a is on cpu, b on meta"):
        gemm(a, meta)
    with pytest.raises(ValueError, match="path='register_a' forces a GPU kernel; tensors on "
                                         "cpu run the exact reference"):
        gemm(a, b, path="register_a")


def test_strided_weight_scales_are_made_contiguous_once(seed):
    """Strided scales are copied once when an NVFP4Tensor is made, so no launch copies them on
    every call (the launches' `aligned` then finds them contiguous); the tensor's product is
    within `assert_gemm_close`'s bound of the exact one."""
    from tk_cute.testing import assert_gemm_close

    q = quantize(torch.randn(300, 48))  # 3 bands of scales
    wide = torch.zeros(*q.scales.shape[:-1], 1024, dtype=torch.uint8)
    wide[..., :512] = q.scales
    strided = wide[..., :512]
    assert not strided.is_contiguous()
    t = NVFP4Tensor(q.data, strided, q.global_scale, q.shape)
    assert t.scales.is_contiguous() and torch.equal(t.scales, q.scales)
    a = torch.randn(3, 48).bfloat16()
    assert_gemm_close(gemm(a, t), a, q)


def test_out_and_leading_dims(seed):
    from tk_cute.testing import assert_gemm_close

    b = quantize(torch.randn(24, 48))
    a = torch.randn(2, 3, 48).bfloat16()
    out = torch.full((2, 3, 24), float("nan"), dtype=torch.float32)
    d = gemm(a, b, out=out)  # out_dtype follows out
    assert d is out and d.dtype == torch.float32
    assert_gemm_close(d.view(6, 24), a.view(6, 48), b)


# ---------------------------------------------------------------- GPU


def _weights(N, K):
    return quantize(torch.randn(N, K, device="cuda") * 0.05)


@pytest.fixture
def no_reference(monkeypatch):
    """The references raise: a CUDA call that reached one fails."""
    from tk_cute.nvfp4 import reference

    def refuse(*args, **kwargs):
        raise AssertionError("tk_cute.nvfp4.gemm ran a reference on a CUDA tensor")

    monkeypatch.setattr(reference, "gemm_reference", refuse)
    monkeypatch.setattr(reference, "w4a16_reference", refuse)


def _run(M, N, K, w4a4, out_dtype, path=None):
    """One call through `gemm` on a NaN-poisoned out: a kernel path (`path` where given),
    every element within `assert_gemm_close`'s bound."""
    from tk_cute.testing import assert_gemm_close

    b = _weights(N, K)
    x = torch.randn(M, K, device="cuda")
    a = quantize(x) if w4a4 else x.bfloat16()
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)  # poison
    p = plan(a, b, out_dtype)
    assert p.path != "reference" and path in (None, p.path), p
    d = gemm(a, b, out=out)
    assert d.data_ptr() == out.data_ptr()
    assert_gemm_close(d, a, b, f"{M}x{N}x{K} {'W4A4' if w4a4 else 'W4A16'} via {p}")


@pytest.mark.gpu
@pytest.mark.parametrize("w4a4", [False, True], ids=["W4A16", "W4A4"])
@pytest.mark.parametrize("M", GRID_M)
def test_grid_bf16_every_element(seed, no_reference, M, w4a4):
    for N, K in itertools.product(GRID_N, GRID_K):
        _run(M, N, K, w4a4, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("w4a4", [False, True], ids=["W4A16", "W4A4"])
def test_grid_16_and_32_bit_outputs(seed, no_reference, w4a4, out_dtype):
    pairs = list(itertools.product(GRID_N, GRID_K))
    for i, M in enumerate(GRID_M):  # every M, with (N, K) pairs rotating through the grid
        N, K = pairs[(5 * i) % len(pairs)]
        _run(M, N, K, w4a4, out_dtype)
    _run(100, 100, 64, w4a4, out_dtype)  # N-padded D (200-byte bf16 rows)


# Issue 19's table, as a user calls it: (M, N, K, W4A4, out dtype)
TABLE_ROWS = [(129, 8192, 8192, False, torch.bfloat16), (200, 8192, 8192, False, torch.bfloat16),
              (1000, 8192, 8192, False, torch.bfloat16), (4000, 8192, 8192, False, torch.bfloat16),
              (100, 8192, 8192, True, torch.bfloat16), (16, 8192, 8208, False, torch.bfloat16),
              (16, 8192, 8192, False, torch.float32), (256, 8192, 8192, False, torch.bfloat16),
              (512, 8192, 8192, False, torch.bfloat16), (1024, 8192, 8192, False, torch.bfloat16),
              (1024, 8192, 8192, True, torch.bfloat16), (64, 8192, 28672, True, torch.bfloat16),
              (128, 8192, 28672, True, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, w4a4, out_dtype", TABLE_ROWS,
                         ids=[f"{m}x{n}x{k}-{'W4A4' if q else 'W4A16'}-{str(o)[6:]}"
                              for m, n, k, q, o in TABLE_ROWS])
def test_issue_table_rows_every_element(seed, no_reference, M, N, K, w4a4, out_dtype):
    """Every row of the table that opened issue 19 (each then ran the float64 reference or a
    dequantize-first path) through `gemm` on a NaN-poisoned out: a kernel path, every element
    within `assert_gemm_close`'s bound."""
    _run(M, N, K, w4a4, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("w4a4", [False, True], ids=["W4A16", "W4A4"])
@pytest.mark.parametrize("M, N, K", [(9, 4096, 7168), (16, 4096, 14336), (16, 8192, 8192),
                                     (16, 5120, 2880), (12, 5760, 2880)])
def test_small_m_at_9_to_16_rows_every_element(seed, no_reference, M, N, K, w4a4):
    """9-16 rows on whole-step K up to SMALL_M_WHOLE_K_MAX (Llama 3 8B's 4096x14336,
    DeepSeek-V3's 4096x7168; 8192^2 W4A16 only) and at two CTAs per SM
    (`SMALL_M_TWO_TILES_MAX_S`: gpt-oss's 5120x2880 and 5760x2880, K % 128 == 64) take the
    small-M kernel: every element within the bound."""
    _run(M, N, K, w4a4, torch.bfloat16, "register_a" if w4a4 and N == 8192 else "small_m")


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(240, 17024, 8192), (208, 1040, 2880), (129, 136, 8192),
                                     (113, 4000, 8208)])
def test_split_tile_edges_every_element(seed, no_reference, M, N, K):
    """The tiled schedules at their edges: 240 rows over 133 weight bands (the rounds model's
    one-tile stream-K narrowed to Nb = 240), the split tile's last M with a partial band and a
    K tail, 129 rows on two bands (64 K parts per tile summed by its head), and its first M
    (`sm90_tuning.SPLIT_TILE_MIN_M`) with a partial band and a K tail."""
    for w4a4 in (False, True):
        p = plan(quantize(torch.randn(M, K, device="cuda")) if w4a4 else
                 torch.empty(M, K, device="cuda", dtype=torch.bfloat16), _weights(N, K))
        assert p.path == "register_a_tiled" and p.config.STREAM_K, p
        assert p.config.Nb == {240: 240, 208: 208, 129: 144, 113: 128}[M]
        _run(M, N, K, w4a4, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["w4a4", "w4a4_padded_rows", "w4a16_batched",
                                  "w4a16_leading_dims"])
def test_batched(seed, no_reference, case):
    from tk_cute.testing import assert_gemm_close

    L, M, N, K = 3, 129, 256, 512
    if case == "w4a4_padded_rows":  # K % 32 != 0: batches of padded rows of codes
        case, K = "w4a4", 272
    if case == "w4a4":
        a = quantize(torch.randn(L, M, K, device="cuda"))
        b = quantize(torch.randn(L, N, K, device="cuda"))
    elif case == "w4a16_batched":
        a = torch.randn(L, M, K, device="cuda").bfloat16()
        b = quantize(torch.randn(L, N, K, device="cuda"))
    else:
        a = torch.randn(L, 7, K, device="cuda").bfloat16()
        b = _weights(N, K)
    out = torch.full((*a.shape[:-1], N), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = gemm(a, b, out=out)
    if case == "w4a16_leading_dims":
        assert_gemm_close(d.view(-1, N), a.reshape(-1, K), b)
        return
    for l in range(L):
        al = a[l] if isinstance(a, torch.Tensor) else NVFP4Tensor.trusted(
            a.data[l], a.scales[l], a.global_scale, a.shape[1:])
        bl = NVFP4Tensor.trusted(b.data[l], b.scales[l], b.global_scale, b.shape[1:])
        assert_gemm_close(d[l], al, bl, f"batch {l}")


@pytest.mark.gpu
def test_strided_activations_are_copied_once_and_run_a_kernel(seed, no_reference):
    """A non-contiguous bf16 activation (a column slice; the docstring: copied once, a small M x
    K tensor) runs a kernel: every element of the poisoned out within `assert_gemm_close`'s
    bound of the exact product."""
    from tk_cute.testing import assert_gemm_close

    b = _weights(256, 512)
    wide = torch.randn(40, 640, device="cuda").bfloat16()
    a = wide[:, 64:576]
    assert not a.is_contiguous()
    out = torch.full((40, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert gemm(a, b, out=out) is out
    assert_gemm_close(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [64, 128])
def test_forced_paths_agree(seed, no_reference, M):
    """Every path that can take a shape computes D within the bound (M = 64: small_m,
    register_a, register_a_tiled, dequantize; M = 128: the same but small_m)."""
    from tk_cute.testing import assert_gemm_close

    N, K = 512, 1024
    b = _weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    ran = []
    for path in sm90_tuning.PATHS:
        for out_dtype in (torch.float32, torch.bfloat16):
            out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)  # poison
            try:
                d = gemm(a, b, out_dtype, out=out, path=path)
            except ValueError as e:
                assert "cannot run" in str(e)
                continue
            assert d.data_ptr() == out.data_ptr()
            assert_gemm_close(d, a, b, f"path {path}")
            ran.append(path)
    assert len(set(ran)) == (4 if M == 64 else 3), ran


@pytest.mark.gpu
def test_pdl_rows_chain(seed, no_reference):
    from tk_cute.testing import assert_gemm_close

    M, N, K = 300, 1024, 1024
    b = _weights(N, K)
    xs = [torch.randn(M, K, device="cuda").bfloat16()]
    # Poisoned outputs, all filled before the chain so its GEMMs run back to back.
    outs = [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(3)]
    for out in outs:
        xs.append(gemm(xs[-1], b, out=out, pdl=True))
        assert xs[-1].data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    for x, d in zip(xs, xs[1:]):
        assert_gemm_close(d, x, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(32, 2880, 2880), (48, 2880, 2880), (32, 576, 7168),
                                     (40, 8192, 8192), (33, 1000, 1040)])
def test_pdl_stage_permute_chains(seed, no_reference, M, N, K):
    """pdl=True at 17-48 rows: register-A permuting per stage, each call a programmatic
    dependent of the one before that wrote its activations (read after write), poisoned
    outputs, every element."""
    from tk_cute.testing import assert_gemm_close

    b = _weights(N, K)
    assert plan(torch.empty(M, K, device="cuda", dtype=torch.bfloat16), b,
                pdl=True).config.permute == "stage"
    b_sq = _weights(K, K)  # a K x K layer keeps the chain's activations K wide
    xs = [torch.randn(M, K, device="cuda").bfloat16()]
    outs = [torch.full((M, K), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(2)]
    for out in outs:
        xs.append(gemm(xs[-1], b_sq, out=out, pdl=True))
    d = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(xs[-1], b, out=d, pdl=True)
    torch.cuda.synchronize()
    for x, y in itertools.pairwise(xs):
        assert_gemm_close(y, x, b_sq)
    assert_gemm_close(d, xs[-1], b)


def test_k_tails_plan_kernels_with_a_tail():
    """K % 32 == 0 but not a whole number of stages (gpt-oss's 2880, 160) takes the register-A
    kernels with a partial last stage, but at decode K % 64 == 0 (2880) the small-M kernel's
    half step (K_TAIL); K % 32 != 0 (padded rows of codes) the register-A kernels."""
    for M in (1, 17, 128, 150):
        for K in (2880, 160, 2912):
            p = _plan_hopper(True, M, 384, K, "bfloat16", SMS, False)
            subs = [sub for _, _, sub in p.parts] if p.parts else [p]
            if M <= sm90_tuning.W4A4_NATIVE_MAX_M and K % 64 == 0:
                assert p.path == "small_m" and p.config.K_TAIL, (M, K, p)
                continue
            assert all(s.path.startswith("register_a") and s.config.K_TAIL for s in subs), \
                (M, K, p)
    # (N = 4096 beyond 208 rows: 384 is few weight bands, "dequantize")
    p = _plan_hopper(True, 1000, 4096, 4160, "bfloat16", SMS, False)
    assert p.path == "register_a_tiled" and p.config.K_TAIL
    # Short K at large M: the dequantized operands and the dense GEMM were faster
    assert _plan_hopper(True, 2048, 4096, 2880, "bfloat16", SMS, False).path == "dequantize"
    assert _plan_hopper(True, 1024, 4096, 2880, "bfloat16", SMS, False).path == \
        "register_a_tiled"
    p = _plan_hopper(True, 300, 4096, 2880, "bfloat16", SMS, False)  # fewer rows: tiled
    assert p.path == "register_a_tiled" and p.config.K_TAIL
    for M, K in ((16, 8208), (1, 48), (100, 2896), (300, 8208)):  # (N: not few bands)
        p = _plan_hopper(False, M, 4096, K, "bfloat16", SMS, False)
        subs = [sub for _, _, sub in p.parts] if p.parts else [p]
        assert all(s.path.startswith("register_a") and s.config.K_TAIL for s in subs), (M, K, p)


@pytest.mark.gpu
@pytest.mark.parametrize("w4a4", [False, True], ids=["W4A16", "W4A4"])
@pytest.mark.parametrize("M", [1, 17, 150, 1000])
def test_k_tails_every_element(seed, no_reference, M, w4a4):
    for N, K in ((384, 2880), (256, 160), (384, 2896)):  # 2896: padded rows of codes
        _run(M, N, K, w4a4, torch.bfloat16)
    _run(M, 256, 2912, w4a4, torch.float32)
    _run(M, 256, 48, w4a4, torch.float32)
