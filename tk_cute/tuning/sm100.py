# SPDX-License-Identifier: MIT
"""Blackwell (sm_100a, sm_103a) and Rubin (sm_107a): each call's kernel config, chosen by a
cost MODEL.

No sm_100 / sm_103 / sm_107 GPU exists here, so nothing below is measured on one: the dispatch
enumerates the configs a call can run (tile, stages, cluster, scheduler, operand order, split
K), estimates each with `estimate` and runs the cheapest. The estimate is a roofline with wave
quantization; its figures (`PEAKS`, vendor numbers; `EDGE_ROW_COST`, measured on the H200; the
rest assumptions, each with its reason) are all in this file. `python -m tk_cute report` prints
the pick and its estimate.

    time = max(compute, dram, load, smem) + fixed
    compute = waves x (2 x tile rows x tile cols x K per unit) / (peak / cluster slots)
    dram    = unique bytes (operands once; D, or split K's partial D's) / bandwidth, the busy
              SMs drawing at most SM_LOAD_SHARE times their even share of HBM
    load    = waves x (TMA box rows of a unit, rows past the tensor x EDGE_ROW_COST) x K bytes
              / (SM_LOAD_SHARE x HBM / SMs x SMs of a cluster)
    smem    = waves x operand bytes the MMAs read from shared memory per CTA / its bandwidth
    fixed   = LAUNCH_US, and for split K two more launches (the sum, the cast) and their
              bytes at HBM speed (the partials read, the fp32 sum written and read, D written)
"""

from __future__ import annotations

import functools

from tk_cute.arch import target
from tk_cute.ops import schedule

# Vendor peak figures: dense NVFP4 FLOP/s, dense BF16 FLOP/s, HBM bytes/s
# (../shared/reference/rubin.md; docs/facts.md#vendor-peaks). A MODEL, not a measurement.
PEAKS = {
    "sm_107a": (35e15, 4e15, 22e12, "Rubin (VR200): 35 PF NVFP4, 4 PF BF16, 22 TB/s"),
    "sm_100a": (9e15, 2.25e15, 8e12, "B200: 9 PF NVFP4, 2.25 PF BF16, 8 TB/s"),
    "sm_103a": (9e15, 2.25e15, 8e12, "B300 modelled with B200 figures: 9 PF NVFP4, 8 TB/s"),
}
# A TMA box row past the tensor costs the load unit about 2.3 valid rows (measured on the H200,
# docs/facts.md#tma-box-past-tensor; assumed to carry over to Blackwell's TMA).
EDGE_ROW_COST = 2.3
# ASSUMPTION: one SM's loads (L2 hits included) draw at most 4x its even share of HBM
# bandwidth: an SM reads about 128 bytes per clock from L2 (Hopper's figure), 4-5x the even share
# on B200 (8 TB/s / 148 SMs); a tile whose load boxes are mostly rows past the tensor, or a grid
# that leaves SMs idle, is load-bound before HBM is.
SM_LOAD_SHARE = 4.0
# ASSUMPTION: the MMAs read their operands from shared memory at 128 bytes per clock per SM
# (Hopper's and, by NVIDIA's statements, Blackwell's shared-memory bandwidth), at a 1.9 GHz
# clock on every target. With Rubin's 4x FP4 rate a 256 x 256 pair tile would need ~150 B per
# clock: why the Rubin kernel shares B between two M halves (Mb = 512, the B collector).
SMEM_BYTES_PER_CLOCK, CLOCK_HZ = 128, 1.9e9
# ASSUMPTION: a launch costs 2 us of a call inside a CUDA graph (the H200's graph replay of a
# 10 us kernel added about 0.8 us per call: docs/facts.md#graph-calls; rounded up).
LAUNCH_US = 2.0
# ASSUMPTION: clusters of 4 CTAs fit on 120 of the H200's 132 SMs (docs/facts.md, measured),
# and the same share of a Blackwell / Rubin GPU.
CLUSTER4_SM_SHARE = 120 / 132
SPLIT_K_MAX = 8  # split K's partial D's are summed by one torch reduction after the kernel
GRID_Z_MAX = 65535  # CUDA's limit on gridDim.z (batches x split runs, where they are the z)
FP4_BYTES = 0.5 + 1 / 16  # an NVFP4 element: half a byte of code, a UE4M3 scale per 16
D_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "nvfp4": FP4_BYTES}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _box(extent: int, tile: int, nbytes: float, boxed: bool) -> float:
    """Bytes per K element that loading one tile of `tile` rows costs: the average tile's valid
    rows, and (TMA boxes) its rows past the tensor at `EDGE_ROW_COST` each."""
    valid = min(tile, extent / max(1, _ceil(extent, tile)))
    return (valid + (EDGE_ROW_COST * (tile - valid) if boxed else 0.0)) * nbytes


def estimate(cfg, m: int, n: int, k: int, l: int = 1) -> dict:
    """MODEL: the estimated time of a call D (m x n, l batches) = A (m x k) B (n x k)^T with
    `cfg` (either sm100 kernel's Config: `kernels.gemm.nvfp4_sm100` W4A4, or
    `kernels.gemm.nvfp4_w4a16_sm100` W4A16), and its terms (module docstring). Not a
    measurement: no sm_100+ GPU has run these kernels."""
    from tk_cute.kernels.gemm import nvfp4_w4a16_sm100 as W

    w4a16 = isinstance(cfg, W.Config)
    fp4_peak, bf16_peak, hbm, label = PEAKS[cfg.arch]
    sms = target(cfg.arch).sm_count or 148
    # the MMA's A side (rows) and B side (cols): extent, tile, bytes per element, TMA boxes
    if w4a16:  # one CTA per tile; X (bf16) by TMA boxes, the weights by plain loads
        x, wt = (m, cfg.x_rows, 2.0, True), (n, W.W_ROWS, FP4_BYTES, False)
        (rows, tile_r, a_bytes, a_box), (cols, tile_c, b_bytes, b_box) = (
            (wt, x) if cfg.swap_ab else (x, wt))
        ctas, kb, cn, peak = 1, W.Kb, 1, bf16_peak
    else:  # pair tiles: Mb rows (both CTAs), Nb columns; swapped, the weights are the rows
        rows, cols = (n, m) if cfg.swap_ab else (m, n)
        tile_r, tile_c, ctas, kb, cn = cfg.Mb, cfg.Nb, 2, cfg.Kb, cfg.CLUSTER_N
        peak, a_bytes, b_bytes, a_box, b_box = fp4_peak, FP4_BYTES, FP4_BYTES, True, True
    k_steps = _ceil(k, kb)
    splits = schedule.k_split_count(cfg.SPLIT_K, k_steps)
    k_unit = _ceil(k_steps, splits) * kb
    tiles_r, tiles_c = _ceil(rows, tile_r), _ceil(cols, tile_c)
    units = tiles_r * _ceil(tiles_c, cn) * l * splits  # clusters of work
    usable = sms * (CLUSTER4_SM_SHARE if ctas * cn == 4 else 1.0)
    slots = int(usable) // (ctas * cn)  # clusters resident at once (one CTA per SM)
    waves = max(1, _ceil(units, slots))
    busy = max(1, min(units, slots)) * ctas * cn / sms
    flops = 2 * tile_r * tile_c * k_unit * cn  # a unit's MMAs, padded tiles included
    compute = waves * flops / (peak / slots)
    # a unit's loads: A's rows, B's (W4A16's weights by plain loads: valid rows only)
    box = _box(rows, tile_r, a_bytes, a_box) + _box(cols, tile_c * cn, b_bytes, b_box)
    load = waves * box * k_unit / (SM_LOAD_SHARE * hbm / sms * ctas * cn)
    # operand bytes the MMAs read from shared memory per K element of a CTA (W4A16: bf16; the
    # Rubin B collector reads B once for both M halves)
    if w4a16:
        smem_k = (tile_r + tile_c) * 2.0
    else:
        halves = 1 if cfg.b_reuse else cfg.m_mmas
        smem_k = (tile_r // 2 + tile_c // 2 * halves) * 0.5
    smem = waves * smem_k * k_unit / (SMEM_BYTES_PER_CLOCK * CLOCK_HZ)
    dram_bytes = l * k * (m * (2.0 if w4a16 else FP4_BYTES) + n * FP4_BYTES)
    fixed = LAUNCH_US * 1e-6
    if cfg.SPLIT_K > 1:  # the kernel writes partial D's; a sum reads them and writes fp32, a
        # cast reads that and writes D
        partial = l * splits * m * n * D_BYTES[cfg.d_type]
        dram_bytes += partial
        fixed += 2 * LAUNCH_US * 1e-6 + (partial + l * m * n * (8 + D_BYTES[cfg.out])) / hbm
    else:
        dram_bytes += l * m * n * D_BYTES[cfg.out]
    dram = dram_bytes / (hbm * min(1.0, busy * SM_LOAD_SHARE))
    terms = {"compute": compute, "dram": dram, "load": load, "smem": smem}
    t = max(terms.values()) + fixed
    return {"model": "cost MODEL (not measured)", "peaks": label, "time_us": t * 1e6,
            "bound": max(terms, key=terms.get), "waves": waves, "units": units,
            "splits": splits, "busy_sm_share": busy,
            **{f"{k}_us": v * 1e6 for k, v in terms.items()}, "fixed_us": fixed * 1e6}


def _deepest(make, depth_field: str, most: int):
    """`make(**{depth_field: d})` for the most stages d <= most that fit shared memory."""
    from tk_cute.kernels.gemm.nvfp4_sm100 import SmemBudgetError

    for depth in range(most, 1, -1):
        try:
            return make(**{depth_field: depth})
        except SmemBudgetError as e:
            error = e
    raise error


def w4a4_candidates(arch: str, m: int, n: int, k: int, out: str = "bfloat16",
                    sf: str = "ue4m3", l: int = 1):
    """Every `kernels.gemm.nvfp4_sm100.Config` the dispatch considers for a call: operand order
    (weights as the MMA's A for a dense D), pair tile 512 x 256 (Rubin: two accumulators in its
    576 exclusive columns), 256 x 256 or 256 x 128 (two accumulator stages), A multicast to a
    second pair along N where there are columns for it, split K (dense D), the most stages that
    fit; the scheduler: cluster launch control where the tiles take more than one wave."""
    from tk_cute.kernels.gemm.nvfp4_sm100 import Config

    t = target(arch)
    sms = t.sm_count or 148
    k_steps = _ceil(k, 256)
    if l > GRID_Z_MAX:
        raise ValueError(f"{l} batches: the sm100 kernels put the batch in the grid's z, at most "
                         f"{GRID_Z_MAX} (CUDA); split the batch")
    tiles = [(256, 256, 1), (256, 128, 2)] + ([(512, 256, 1)] if t.exclusive_tmem_columns
                                              else [])
    for swap in (False, True) if out != "nvfp4" else (False,):
        cols = m if swap else n
        for mb, nb, acc in tiles:
            for cn in (1, 2) if cols >= 2 * nb else (1,):
                for splits in sorted({schedule.k_split_count(s, k_steps)
                                      for s in range(1, SPLIT_K_MAX + 1)}):
                    if splits > 1 and out == "nvfp4":
                        continue
                    rows = n if swap else m
                    clusters = _ceil(rows, mb) * _ceil(cols, nb * cn) * l * splits
                    usable = int(sms * (CLUSTER4_SM_SHARE if cn == 2 else 1.0))
                    sched = schedule.CLC if clusters > usable // (2 * cn) else schedule.STATIC
                    if sched == schedule.CLC and l * splits > GRID_Z_MAX:
                        continue  # (CLC's grid z is batches x runs)
                    yield _deepest(functools.partial(
                        Config, arch=arch, Mb=mb, Nb=nb, ACC_PIPE_DEPTH=acc, CLUSTER_N=cn,
                        out=out, sf=sf, scheduler=sched, swap_ab=swap, SPLIT_K=splits),
                        "LOAD_PIPE_DEPTH", 8)


def w4a16_candidates(arch: str, m: int, n: int, k: int, out: str = "bfloat16",
                     sf: str = "ue4m3", l: int = 1):
    """Every `kernels.gemm.nvfp4_w4a16_sm100.Config` the dispatch considers: X tiles of 128
    rows, or swapped (the decoded weights as the MMA's A) with X tiles of 16-128 rows; split
    K; the most stages (up to 6) that fit."""
    from tk_cute.kernels.gemm.nvfp4_w4a16_sm100 import X_ROWS, Config, Kb

    k_steps = _ceil(k, Kb)
    if l > GRID_Z_MAX:
        raise ValueError(f"{l} batches: the W4A16 kernel puts the batch in the grid's z, at most "
                         f"{GRID_Z_MAX} (CUDA); split the batch")
    for swap, x_rows in [(False, 128)] + [(True, r) for r in X_ROWS]:
        for splits in sorted({schedule.k_split_count(s, k_steps)
                              for s in range(1, SPLIT_K_MAX + 1)}):
            if l * splits > GRID_Z_MAX:
                continue
            yield _deepest(functools.partial(Config, arch=arch, out=out, sf=sf, SPLIT_K=splits,
                                             swap_ab=swap, x_rows=x_rows), "STAGES", 6)


def _cheapest(cands, m, n, k, l):
    """The candidate of least estimated time (the first of equals: the candidates come in
    order of preference, fewer splits first)."""
    return min(cands, key=lambda c: estimate(c, m, n, k, l)["time_us"])


@functools.lru_cache(maxsize=1024)  # a call plans per shape: keep it off the hot path
def w4a4_config(arch: str, m: int, n: int, k: int, out: str = "bfloat16", sf: str = "ue4m3",
                l: int = 1):
    """The `kernels.gemm.nvfp4_sm100.Config` for an NVFP4 x NVFP4 call (D of type `out`,
    "nvfp4": quantized in the epilogue; `sf` the operands' scale format, UE5M3 on sm_107a only):
    the cheapest of `w4a4_candidates` by `estimate` (a MODEL)."""
    return _cheapest(w4a4_candidates(arch, m, n, k, out, sf, l), m, n, k, l)


@functools.lru_cache(maxsize=1024)
def w4a16_config(arch: str, m: int, n: int, k: int, out: str = "bfloat16", sf: str = "ue4m3",
                 l: int = 1):
    """The `kernels.gemm.nvfp4_w4a16_sm100.Config` for a bf16 x NVFP4 call: the cheapest of
    `w4a16_candidates` by `estimate` (a MODEL)."""
    return _cheapest(w4a16_candidates(arch, m, n, k, out, sf, l), m, n, k, l)


def describe(cfg) -> str:
    """The config in a few words (plans and reports print it)."""
    from tk_cute.kernels.gemm import nvfp4_w4a16_sm100 as W

    if isinstance(cfg, W.Config):
        tile = (f"{cfg.tile[0]}x{cfg.tile[1]}x{W.Kb} tile, {cfg.STAGES} stages"
                + (", A/B swapped (D^T)" if cfg.swap_ab else ""))
    else:
        tile = (f"{cfg.Mb}x{cfg.Nb}x{cfg.Kb} pair tile, {cfg.LOAD_PIPE_DEPTH} stages, cluster "
                f"{cfg.CLUSTER_M}x{cfg.CLUSTER_N}, {cfg.scheduler}"
                + (", A/B swapped (D^T)" if cfg.swap_ab else ""))
    return tile + (f", split K {cfg.SPLIT_K}" if cfg.SPLIT_K > 1 else "")

