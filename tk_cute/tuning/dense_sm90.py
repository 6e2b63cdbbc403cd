# SPDX-License-Identifier: MIT
"""The dense Hopper GEMM's plans (`tk_cute.gemm`, `kernels/gemm/gemm_sm90.py`), measured on the
H200: the output tile (128 rows, 192 where a third fewer bands fill a round, 64 for few rows),
its width and cluster shape (`tile_plan`, `few_rows_plan`), C^T = B A^T for a few hundred ragged
rows (`swap_plan`), and the Config they make (`default_config`, `plan_config`). The numbers
behind each constant are in docs/facts.md (one anchor each, cited below); the kernel's design in
docs/dense_gemm.md."""

from __future__ import annotations

import functools

import torch

from tk_cute.runtime import dtype_name
from tk_cute.tuning import rounds


# Time per output column of a 128 x Nb tile relative to Nb = 256 (narrower wgmmas issue more
# instructions per column and read more operand bytes per MMA), and of a cluster shape's tiles
# relative to none (multicast: fewer L2 reads per MMA): the multiples of 32 a least-squares fit
# of log time over the H200 sweeps of 36 shapes x 7 widths x 3 cluster shapes in
# docs/facts.md#dense-tile-cost; 112, 144 and 208 timed afterwards:
# 208 against 224 in one round of the same tile count (400x8192 transposed), 112 and 144 set
# where the A/B of 95 changed plans put them (112 ran 2-13% slower than 96 at the same tile
# count, 3000x384, so 1.30, still below 128 per tile at 333x5120; 144 1.155, so that 129x8192
# keeps 128 x 96, 4-8% faster than 64 x 144), 176 interpolated in 1 / Nb (and timed in
# 192-row tiles, TALL_COST). The other 16-column steps (80, 240) compile and run
# (`gemm_sm90.NBS`) but are not planned: untimed, the interpolation put 240 in place of 256 and
# 192 at 3000x5000, where it ran 2% slower.
TILE_COST = {256: 1.0, 224: 1.05, 208: 1.17, 192: 1.057, 176: 1.081, 160: 1.11, 144: 1.155,
             128: 1.15, 112: 1.30, 96: 1.415, 64: 1.82}
CLUSTER_COST = {(1, 1): 1.0, (2, 1): 0.972, (1, 2): 0.982}
# Aligned rows in clusters from this tile width on: a 64-wide tile's B is 8 KiB a stage, so
# multicast saves little and the cluster costs more (257x2056x4096 +8%, 2056x384x4096 +14% in
# 2 x 1 clusters, docs/facts.md#dense-tile-cost)
CLUSTER_MIN_WIDTH = 96
# 192-row tiles (three consumer warpgroups, `Config.Mb = 192`; at most 192 wide,
# `gemm_sm90.max_width`): where 128-row bands leave a round part-empty, a third fewer bands
# may fill one (2056 x 2056: 11 x 12 = 132 tiles of 192 x 176 against 17 x 13 of 128 x 160).
# Their time against 1.5 128-row tiles of the width: 1.01-1.05 (H200,
# docs/facts.md#dense-tall-tiles, 2056^2 at K = 8192 / 4096: 94.7 / 50.4 us against 113.8 /
# 58.3 for 128 x 160 in 2 x 1, cuBLAS 94.3 / 48.2). 1 x 2 clusters (A multicast) even at K =
# 4096 (51.1 us); 2 x 1 (B multicast) ran twice as long (99.0 us at 192 x 176, 90.5 at 192 x
# 160), so none.
TALL_MB = 192
TALL_COST = 1.03
TALL_CLUSTER_COST = {(1, 1): 1.0, (1, 2): 1.0}


# The few-rows regime: outputs of a few 64-row bands stream B, and 128-row tiles there keep
# few SMs busy (at M <= 64, half their MMAs multiply zero rows: the second consumer
# warpgroup's rows are all past M). 64-row tiles instead (`Config.Mb = 64`, one consumer
# warpgroup), at the narrowest width (64, then 128) whose clusters fit one round of those the
# GPU holds at once: 1 x 4 clusters that multicast A, else 1 x 2 (one band) or 2 x 1 that
# multicast B between two bands (several bands; 1 x 4 first, as 2 x 1 is slow where a band is
# mostly past M: 80x4096x4096 18.8 us in 2 x 1 against 16.2 in 1 x 4, 160x2048x8192 35.2
# against 24.0). H200,
# docs/facts.md#dense-few-rows, against 128-row tiles: 64x8192x4096 28.7 -> 20.2 us (cuBLAS 20.5),
# 16x8192x8208 59.7 -> 36.2, 1x8192x8192 62.7 -> 34.8, 128x8192x8192 48.0 -> 38.5 (cuBLAS
# 38.3), 100x8192x8192 46.9 -> 40.1, 128x2048x8192 41.0 -> 21.8, 192x4096x4096 30.2 -> 18.8,
# 256x4096x4096 19.2 -> 17.4. Where no width fits one round, several bands take 128-row tiles
# (128x28672x8192: 126.1 against 129.8-177.0 us, 256x8192x4096 26.5 against 31.5), one band
# 64-row tiles 128 wide in 1 x 4 clusters (64x28672x8192 127.8 -> 110.5 us).
FEW_ROWS_MAX_M = 256
FEW_ROWS_WIDTHS = (64, 128)
ONE_BAND_CLUSTERS = ((1, 4), (1, 2))  # CTAs along N sharing A
BANDS_CLUSTERS = ((1, 4), (2, 1))  # then two bands sharing B


def held_ctas(cluster: tuple[int, int], sms: int, quads: int | None = None) -> int:
    """The CTAs a persistent grid of `cluster`-shaped clusters holds at once on `sms` SMs
    (`quads`: the 4-CTA clusters the GPU holds, `few_rows_plan`; 2-CTA clusters fill it)."""
    size = cluster[0] * cluster[1]
    return size * {1: sms, 2: sms // 2, 4: sms // 4 if quads is None else quads}[size]


def few_rows_plan(M: int, N: int, sms: int, quads: int | None = None,
                  nb: int | None = None) -> tuple[int, tuple[int, int]] | None:
    """(Nb, (CLUSTER_M, CLUSTER_N)) of 64-row tiles for an M x N output of M <=
    FEW_ROWS_MAX_M rows (see the few-rows regime above), or None where 128-row tiles are the
    plan. `quads`: the 4-CTA clusters the GPU holds at once (`runtime.resident_clusters`;
    None: sms // 4); 2-CTA clusters are taken to fill the SMs. `nb`: that width only."""
    if M > FEW_ROWS_MAX_M:
        return None
    bands, widths = -(-M // 64), (nb,) if nb else FEW_ROWS_WIDTHS
    for cm, cn in ONE_BAND_CLUSTERS if bands == 1 else BANDS_CLUSTERS:
        ctas = held_ctas((cm, cn), sms, quads)  # the CTAs of the clusters that run at once
        for w in widths:
            if -(-N // w) >= cn and rounds.tile_rounds(bands, N, w, ctas, (cm, cn)) == 1:
                return w, (cm, cn)
    if bands > 1:
        return None
    w = nb or (FEW_ROWS_WIDTHS[0] if N <= FEW_ROWS_WIDTHS[0] else FEW_ROWS_WIDTHS[-1])
    return w, next((c for c in ONE_BAND_CLUSTERS if -(-N // w) >= c[1]), (1, 1))


def tile_plan(M: int, N: int, sms: int, lines: bool = True, nb: int | None = None,
              clusters: bool = True, quads: int | None = None
              ) -> tuple[int, int, tuple[int, int]]:
    """(Mb, Nb, (CLUSTER_M, CLUSTER_N)) of Mb x Nb output tiles for an M x N output on `sms`
    SMs. Few rows (`few_rows_plan`): 64-row tiles. Otherwise 128-row tiles:
    `rounds.cluster_plan`'s rounds of tiles (padded to whole clusters) times Nb *
    TILE_COST[Nb] * CLUSTER_COST[cluster]. Wide tiles where they fill the SMs, narrower ones
    where wide tiles leave a round nearly empty (N = 384, M or N just past a multiple of the
    tile, few tiles); clusters where their padding costs no round, for tiles from
    CLUSTER_MIN_WIDTH wide. With one row of 128-row tiles the call streams B and 64-wide
    tiles keep too few bytes in flight per SM: Nb >= 128 there. `lines` False
    (`line_aligned`): 2 x 1 clusters from two rows of tiles on, at any width. `nb`: that width
    only; `clusters` False: none, and 128-row tiles (stream-K). `quads`: as in
    `few_rows_plan`."""
    if nb is not None and nb not in TILE_COST:
        raise ValueError(f"tile width must be one of {tuple(TILE_COST)}, got {nb}")
    few = few_rows_plan(M, N, sms, quads, nb) if clusters else None
    if few:
        return (64, *few)
    widths = ({nb: TILE_COST[nb]} if nb else
              {w: c for w, c in TILE_COST.items() if M > 128 or w >= 128})
    if clusters and not lines and M > 128:
        return (128, *rounds.cluster_plan(-(-M // 128), N, sms, widths, {(2, 1): 1.0}))
    shapes = CLUSTER_COST if clusters else {(1, 1): 1.0}
    plans = [(128, *rounds.cluster_plan(-(-M // 128), N, sms, widths, shapes,
                                          CLUSTER_MIN_WIDTH))]
    from tk_cute.kernels.gemm.gemm_sm90 import max_width

    tall = {w: c for w, c in widths.items() if w <= max_width(TALL_MB)}
    if clusters and M > FEW_ROWS_MAX_M and tall:
        plans.append((TALL_MB, *rounds.cluster_plan(-(-M // TALL_MB), N, sms, tall,
                                                      TALL_CLUSTER_COST, CLUSTER_MIN_WIDTH)))
    return min(plans, key=lambda p: direct_time(M, N, p, sms))


def direct_time(M: int, N: int, plan: tuple[int, int, tuple[int, int]], sms: int) -> float:
    """`tile_plan`'s model of an (Mb, Nb, cluster) plan of 128- or 192-row tiles: the rounds
    of its tiles (padded to whole clusters) times Mb / 128 * Nb * TILE_COST[Nb] * the cluster's
    cost (TALL_COST, TALL_CLUSTER_COST for 192 rows)."""
    mb, nb, cluster = plan
    tall = mb == TALL_MB
    return (rounds.cluster_time(-(-M // mb), N, sms, nb, cluster, TILE_COST,
                                  TALL_CLUSTER_COST if tall else CLUSTER_COST)
            * mb / 128 * (TALL_COST if tall else 1.0))


# Few rows as wgmma's N: C^T = B @ A^T (`gemm_sm90.Config.TRANSPOSE_C`, A and B swapped on the
# launch) cuts M into tiles of a width (steps of 16) instead of 128-row bands, and B's rows
# make the bands: a band of one row no longer takes a whole band's time, and the rows of M
# are padded to a width, not to 128. Both plans run with their edge tiles shifted inside the
# tensors (`Config.SHIFT_EDGES`, `default_config`), so only a tile wider than its whole
# dimension (M < Nb) still has a box past the tensor: its rows there cost about EDGE_ROW_COST
# valid rows each (zero fill; H200, docs/facts.md#tma-box-past-tensor: the same 128 tiles of
# 64 x 160 at M = 320 / 300 / 288 / 257, unshifted, take 18.0 / 18.7 / 22.3 / 26.9 us at N =
# K = 4096).
# Swapped widths are picked by `transposed_time`; its constants fitted to 20 shapes x 13-24
# shifted variants (M 129-400, N 2056-28672; docs/facts.md#dense-transposed): the
# pick, transposed or direct, is the fastest variant timed or within 2.3% of it at 18 of them,
# 1.2% on average (333x5120x4096: 10%, 200x8192x8192: 5%).
SWAP_MAX_M = 400  # timed up to 400; 1000x5000x4096: the best transposed 79.8 us, direct 60.1
EDGE_ROW_COST = 2.3
TRANSPOSED_CLUSTER_COST = {(1, 1): 1.0, (2, 1): 1.0, (1, 2): 0.9}  # 1 x 2: B's bands shared
# A 64-row band's time per row against a 128-row band's: 1.1-1.4 fit equally; from 1.5 the
# 64 x 160 tiles at 288-320 rows x 4096 (18.0-18.7 us, against 20.4-25.4 for 128 x 96) lose
TRANSPOSED_MB64_COST = 1.3
# Against the direct plan in the same model (its M rows as the bands), both shifted: at
# 0.68-0.90 the transposed plan timed 0.71-0.93 of the direct one (200x8192 at K = 4096 / 8192,
# 0.90: 1.01 / 1.05); at 0.98-1.11 the direct plan ties or wins (230x6144: 21.7 us against 25.0,
# 380x8192x8192 even) but for 333x5120 (1.11: the transposed 0.91 of it)
SWAP_GAIN = 0.95


def _edge_cost(n: int, tile: int) -> float:
    """The load box along a dimension of n elements in tiles of `tile` (edge tiles shifted
    inside it, `Config.SHIFT_EDGES`), against a whole one: 1 where n holds a tile, else its
    rows past n cost EDGE_ROW_COST each."""
    return 1.0 if n >= tile else (n + EDGE_ROW_COST * (tile - n)) / tile


def transposed_time(M: int, N: int, plan: tuple[int, int, tuple[int, int]], sms: int,
                    quads: int | None = None) -> float:
    """The model's time of an (Mb, Nb, cluster) plan of the transposed output (N x M: bands of
    Mb of B's N rows, tiles of Nb of A's M rows), edge tiles shifted: the rounds before the
    last at a whole tile's time (Mb / 128 * Nb * TILE_COST[Nb], TRANSPOSED_MB64_COST for
    64-row bands, TRANSPOSED_CLUSTER_COST), the last at its slowest tile's (both
    `_edge_cost`s). `quads`: as in `few_rows_plan`."""
    mb, nb, cluster = plan
    n_rounds = rounds.tile_rounds(-(-N // mb), M, nb, held_ctas(cluster, sms, quads), cluster)
    tile = (mb / 128 * nb * TILE_COST[nb] * TRANSPOSED_CLUSTER_COST[cluster]
            * (TRANSPOSED_MB64_COST if mb == 64 else 1.0))
    return tile * (n_rounds - 1 + _edge_cost(N, mb) * _edge_cost(M, nb))


def swap_candidates(M: int) -> list[tuple[int, int, tuple[int, int]]]:
    """The transposed (Mb, Nb, cluster) plans `swap_plan` weighs for M rows (the data
    `transposed_time` is fitted to: `python -m tk_cute.bench gemm --candidates`): both band
    heights, t = 1-4 tiles of the narrowest width that holds M / t rows, each cluster shape."""
    return sorted({(mb, nb, cluster)
                   for mb in (128, 64) for t in (1, 2, 3, 4)
                   for nb in [next((w for w in sorted(TILE_COST) if w >= -(-M // t)), None)]
                   if nb for cluster in TRANSPOSED_CLUSTER_COST})


def swap_plan(M: int, N: int, sms: int, quads: int | None = None
              ) -> tuple[int, int, tuple[int, int]] | None:
    """The (Mb, Nb, cluster) of the transposed output (N x M) where swapping A and B pays,
    else None: M <= SWAP_MAX_M rows whose direct plan takes 128-row bands, the last one partly
    past M, and a transposed plan whose `transposed_time` is below SWAP_GAIN of the direct
    plan's (the same model with the roles of M and N exchanged). Of `swap_candidates(M)`, the
    least `transposed_time` (ties: the taller band, the wider tile, no cluster)."""
    direct = tile_plan(M, N, sms, quads=quads)
    if M > SWAP_MAX_M or M % 128 == 0 or direct[0] != 128:
        return None
    best = min(swap_candidates(M), key=lambda p: (round(transposed_time(M, N, p, sms, quads), 6),
                                                  -p[0], -p[1], p[2][0] * p[2][1]))
    gain = transposed_time(M, N, best, sms, quads) / transposed_time(N, M, direct, sms, quads)
    return best if gain < SWAP_GAIN else None


# Split-K (`Config.SPLIT_K`): where a plan's few tiles stream a long K on few SMs, each
# tile's K steps are cut into ranges that spread over more CTAs, and a second kernel sums the
# ranges' fp32 planes. `split_time` models a plan's time in us, fitted to `bench gemm --splits
# 2 4 8 16 32` on 12 few-tile shapes (H100, docs/facts.md#dense-split-fit: 5% mean error over
# 64 timings): a call's fixed cost (SPLIT_LAUNCH_US: launch, prologue, one tile's epilogue; a
# one-step call takes 2.4-2.8 us); the K steps one CTA runs (`unit_time`), each the longer of
# its stage's bytes at what one SM's TMA loads stream alone (SPLIT_SM_BYTES_S: 136-154 GB/s
# fitted) and its MMAs at one SM's dense rate (SPLIT_SM_FLOPS: 5.5 TFLOP/s per SM measured in
# 128 x 192 tiles on a full H200, docs/facts.md#dense-tile-cost, over TILE_COST[192]; fp8
# twice); or, where longer, the operands' bytes at the HBM bandwidth (SPLIT_HBM_BYTES_S, the
# H100's ~3 TB/s); with split-K plus the planes written and read at that bandwidth, the sum's
# launch and wait (SPLIT_SUM_US) and its rounds of SUM_AHEAD plane loads (SPLIT_SUM_ROUND_US).
# A plan is split where the best split is modelled at most SPLIT_GAIN of the unsplit time.
SPLIT_LAUNCH_US = 2.7
SPLIT_SM_BYTES_S = 150e9
SPLIT_SM_FLOPS = 5.8e12
SPLIT_HBM_BYTES_S = 3.0e12
SPLIT_SUM_US = 1.2
SPLIT_SUM_ROUND_US = 0.4
SPLIT_GAIN = 0.9

# Programmatic dependent launch (`Config.PDL`): planned where one CTA's work (`unit_time`) is
# at most PDL_MAX_UNIT_US. The launch and prologue it hides behind the kernel before (0.2-0.7
# us) are a large part of short calls (1.03-1.30x at 2-8 us); on long calls of 65-120 CTAs the
# next call's early CTAs cost up to 17% (H100, 122 shapes, docs/facts.md#dense-pdl).
PDL_MAX_UNIT_US = 6.0


def plan_tiles(rows: int, cols: int, config) -> int:
    """The tiles of `config`'s plan over the kernel's rows x cols output, padded to whole
    clusters (`rounds.cluster_tiles`)."""
    return rounds.cluster_tiles(-(-rows // config.Mb), cols, config.Nb,
                                (config.CLUSTER_M, config.CLUSTER_N))


def unit_time(config, K: int, splits: int = 1) -> float:
    """The us one CTA of `config`'s plan spends on one tile's K steps at inner dimension K in
    `splits` ranges: each step the longer of its stage's bytes at SPLIT_SM_BYTES_S and its
    MMAs at SPLIT_SM_FLOPS (one SM alone)."""
    width = config.in_type.width // 8
    stage = (config.Mb + config.Nb) * config.k_block * width
    flops = 2 * config.Mb * config.Nb * config.k_block * (2 if width == 1 else 1)
    return 1e6 * -(-config.k_steps(K) // splits) * max(stage / SPLIT_SM_BYTES_S,
                                                        flops / SPLIT_SM_FLOPS)


def split_time(rows: int, cols: int, K: int, config, splits: int) -> float:
    """The split-K model's time in us (see the constants above) of `config`'s plan over the
    kernel's rows x cols output at inner dimension K in `splits` K ranges per tile (all of its
    tile ranges in one round)."""
    hbm = 1e6 * (rows + cols) * K * (config.in_type.width // 8) / SPLIT_HBM_BYTES_S
    body = SPLIT_LAUNCH_US + max(unit_time(config, K, splits), hbm)
    if splits == 1:
        return body
    from tk_cute.kernels.gemm.gemm_sm90 import SUM_AHEAD

    planes = 1e6 * 8 * splits * rows * cols / SPLIT_HBM_BYTES_S
    return body + planes + SPLIT_SUM_US + SPLIT_SUM_ROUND_US * -(-splits // SUM_AHEAD)


def split_counts(rows: int, cols: int, K: int, config, sms: int,
                 quads: int | None = None) -> range:
    """The K range counts 2.. that `config`'s tiles over the kernel's rows x cols output may
    take at inner dimension K: their units fit the CTAs the GPU holds at once (one round), at
    most `MAX_SPLIT_K`, at most one range per K step."""
    from tk_cute.kernels.gemm.gemm_sm90 import MAX_SPLIT_K

    held = held_ctas((config.CLUSTER_M, config.CLUSTER_N), sms, quads)
    return range(2, min(MAX_SPLIT_K, held // plan_tiles(rows, cols, config),
                        config.k_steps(K)) + 1)


def split_plan(rows: int, cols: int, K: int, config, sms: int, quads: int | None = None) -> int:
    """K ranges per tile (`Config.SPLIT_K`) for the unsplit `config` over the kernel's rows x
    cols output at inner dimension K: of `split_counts`, the least `split_time`, where it is
    at most SPLIT_GAIN of the unsplit time; else 1."""
    counts = split_counts(rows, cols, K, config, sms, quads)
    if not counts:
        return 1
    best = min(counts, key=lambda s: (split_time(rows, cols, K, config, s), s))
    return best if (split_time(rows, cols, K, config, best)
                    <= SPLIT_GAIN * split_time(rows, cols, K, config, 1)) else 1


@functools.lru_cache(maxsize=4096)  # host time: a plan and a Config cost ~10-30 us per call
def default_config(dtype: torch.dtype, out_dtype: torch.dtype, M: int = 8192, N: int = 8192,
                   sms: int = 132, nb: int | None = None, lines: bool = True,
                   quads: int | None = None, swap_ab: bool = True, K: int | None = None):
    """The kernel config `gemm` uses for an M x N output on `sms` SMs: `tile_plan`'s tile (or
    width `nb`) and cluster shape; 32-column epilogue blocks, or 16 where a width is an odd
    multiple of 32 (160: ten blocks, not five); a 16-bit C stages the whole tile, one shared
    buffer per epilogue block (no block waits for an earlier one's store to read its buffer:
    3-7% faster on short-K shapes and no loss at 4096^3, where the load ring is a stage
    shorter; H100 A/B, docs/facts.md#dense-epilogue-buffers), fp32 C two buffers (each 128 x 32
    fp32 block is 16 KiB).
    `lines`: the operands' rows start on L2 lines (`line_aligned`); where they do not and the
    output has two or more 128-row tiles, 2 x 1 clusters multicast B (H200,
    docs/facts.md#l2-line-rows: 3000x7000x5000 0.67 -> 0.94x cuBLAS, 8192x8192x8200 0.76 ->
    1.01x, 2056^3 0.55 -> 0.69x).
    An odd count of row tiles leaves the last cluster half outside the output: the scheduler
    rounds clusters up, and that CTA loads zeros, shares its B half and stores nothing
    (GPU-tested), or, with shifted edges, repeats the last band. Where a partial edge tile
    follows a whole one, the edge band and column of tiles are shifted back inside the output
    (`Config.SHIFT_EDGES`; not with stream-K): H200, docs/facts.md#dense-shift-edges, the same
    tiles unshifted / shifted, 333x5120x4096 32.0 / 26.8 us, 257x2056x4096 14.9 / 13.5,
    129x4096x8192 33.9 / 31.0, 200x8192x4096 29.2 / 27.5; 2056^2, 1000-4000 x 5000, 3000x384
    and the transposed plans within 2%. `quads`: the 4-CTA clusters the GPU holds at once
    (`few_rows_plan`).
    (Stream-K shares lost to whole tiles at every shape timed on the H200 and were deleted:
    docs/facts.md#dense-stream-k.) `swap_ab`: take `swap_plan`'s transposed tiles
    where it gives them (`Config.TRANSPOSE_C`; rows on L2 lines, no forced width, no
    stream-K); False: always the direct plan. `K`: the inner dimension, for `split_plan`'s
    split-K and the programmatic dependent launch where a CTA's work is short (`unit_time` at
    most PDL_MAX_UNIT_US; None: neither)."""
    swap = swap_plan(M, N, sms, quads) if lines and nb is None and swap_ab else None
    plan = swap or tile_plan(M, N, sms, lines, nb, True, quads)
    config = plan_config(dtype, out_dtype, M, N, plan, transposed=swap is not None)
    if K is None:
        return config
    rows, cols = (N, M) if swap else (M, N)
    split = split_plan(rows, cols, K, config, sms, quads)
    pdl = unit_time(config, K, split) <= PDL_MAX_UNIT_US
    if split == 1 and not pdl:
        return config
    return plan_config(dtype, out_dtype, M, N, plan, transposed=swap is not None, split=split,
                       pdl=pdl)


def plan_config(dtype: torch.dtype, out_dtype: torch.dtype, M: int, N: int,
                plan: tuple[int, int, tuple[int, int]], transposed: bool = False,
                split: int = 1, pdl: bool = False):
    """The kernel config of an (Mb, Nb, cluster) `plan` of an M x N output (`transposed`: of
    C^T, N x M, `Config.TRANSPOSE_C`; `split`: K ranges per tile, `Config.SPLIT_K`; `pdl`:
    `Config.PDL`): the epilogue blocks and buffers and the edge shift `default_config`
    describes."""
    from tk_cute.kernels.gemm.gemm_sm90 import Config

    mb, nb, (cluster_m, cluster_n) = plan
    fp32 = out_dtype == torch.float32 or split > 1  # (split-K stores fp32 partial planes)
    epi_n = 32 if nb % 64 == 0 else 16
    depth = 2 if fp32 else nb // epi_n  # (a 16-bit C: every block its own buffer)
    rows, cols = (N, M) if transposed else (M, N)  # the kernel's M and N
    return Config(dtype=dtype_name(dtype), out_dtype=dtype_name(out_dtype), Mb=mb, Nb=nb,
                  EPI_N=epi_n,
                  EPI_PIPE_DEPTH=depth, CLUSTER_M=cluster_m, CLUSTER_N=cluster_n,
                  TRANSPOSE_C=transposed, SPLIT_K=split, PDL=pdl,
                  SHIFT_EDGES=any(n > tile and n % tile for n, tile in
                                                   ((rows, mb), (cols, nb))))
