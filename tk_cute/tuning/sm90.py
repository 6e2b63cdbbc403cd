"""The Hopper NVFP4 GEMM heuristics (Blackwell / Rubin: `tk_cute.tuning.sm100`): which kernel
takes a shape, and each kernel's default Config. Kernels keep their `Config` (what can run) and
`supports` (what some Config can run); this module decides what should run, from the shape and
the device. The numbers behind each rule are in docs/facts.md (one anchor per constant, cited
below); the kernels' designs and limits in docs/nvfp4_hopper.md.

Hopper (sm_90a), one 2-D GEMM of M activation rows (`hopper_path`):
- "small_m" (`kernels/gemm/nvfp4_small_m_sm90.py`, mma.sync streaming the weights): M < RS_MIN_M
  and, for W4A4 (which it decodes natively), M <= W4A4_NATIVE_MAX_M; up to
  SMALL_M_TAIL_MAX_M where N % 128 != 0 (unless its N / 32 CTAs fill less than
  SMALL_M_TAIL_MIN_FILL of the SMs), and where K <= SMALL_M_SHORT_K_MAX and N <=
  NARROW_MAX_N (small layers; K % 128 == 64 only where its CTAs exceed the SMs but fit two
  per SM) or K % 128 == 0, K <= SMALL_M_WHOLE_K_MAX and the CTAs fill
  SMALL_M_TAIL_MIN_FILL of the SMs at up to SMALL_M_MAX_CTAS_PER_SM each (W4A4: one); also
  W4A16 M <= 64 where the register-A kernel cannot take N or K. It takes K % 64 == 0 (a last
  half step: `Config.K_TAIL`, set here from K; docs/facts.md#small-m-k-tail).
- "register_a" (`kernels/gemm/nvfp4_register_a_sm90.py`, weights decoded into wgmma A registers):
  RS_MIN_M <= M < SPLIT_TILE_MIN_M, up to 128 on fewer than SPLIT_TILE_MIN_BANDS weight bands
  or below K = SPLIT_TILE_MIN_K (`split_tile_wins`; below RS_MIN_M too where the small-M
  kernel cannot take K: K % 64 != 0), any N % 8 == 0 (N % 128 != 0: a partial last row block,
  `rs.Config.N_TAIL`).
- "register_a_tiled" (`kernels/gemm/nvfp4_register_a_tiled_sm90.py`, register-A wgmma over
  persistent 128 x Nb output tiles): M >= SPLIT_TILE_MIN_M on SPLIT_TILE_MIN_BANDS bands or more
  from K = SPLIT_TILE_MIN_K, and every M > 128, any N % 8 == 0 (a partial last weight band,
  `rst.Config.N_TAIL`), but "dequantize" from enough rows (2048 at a short K or on a narrow
  layer at a long one, else 8192), or on few weight bands where `few_bands_plan` has no plan
  (`dequantize_wins`). Its schedule (`register_a_tiled_config`): on few bands
  `few_bands_plan`'s, else up to SPLIT_TILE_MAX_M rows one tile as wide as M split along K
  (stream-K), then the tile width Nb, stream-K shares and A register sets of the few-tiles and
  rounds models.
- "dequantize" (`kernels/nvfp4_dequantize.py` + `kernels/gemm/gemm_sm90.py`): everything else
  (any M, any K % 16, any N, any output dtype): N % 8 != 0, and `dequantize_wins`.
The register-A kernels take any K % 16 == 0 (rows of codes padded to 16 bytes for the TMA where
K % 32 != 0, as NVFP4Tensor stores them), a partial last stage where K % 256 (K % 128 tiled)
!= 0 (`Config.K_TAIL`, set here from K).
W4A4 on "register_a" and "register_a_tiled" decodes its activations in the kernel's permute
pass (`Config.a_format` "nvfp4": bit for bit the W4A16 kernel on the exactly decoded
activations). D quantized to NVFP4 (`gemm_nvfp4`) takes the tiled kernel's fused
epilogue on whole weight bands only; with N % 128 != 0 it is quantized after the GEMM.
Every path decodes UE4M3 and UE5M3 scales alike. Paths the rules never picked were deleted
(docs/history.md: "rows", "fused").
Blackwell / Rubin configs are chosen by a cost model in `tk_cute.tuning.sm100`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv
from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst
from tk_cute.ops import schedule
from tk_cute.tuning import rounds

# Below this M the small-M kernel beats the register-A one: its M = 1 path (one n8 MMA tile,
# staged activations) on the H200 (1x8192^2: 14.2 vs 18.2 us, docs/facts.md#rs-min-m).
RS_MIN_M = 9
# N_ACT given 256 rows per CTA: up to WIDE_MAX_N_ACT, on more than NARROW_MAX_N weight rows.
# There the consumers have 104 registers (640 threads, one A register set from N_ACT = 32 on),
# the ring 2-5 stages. On the H200 (docs/facts.md#rs-wide-rows, activations permuted once per
# call) 256 rows were 2% faster than 128 at 8192^2 at N_ACT = 48, even at 64, and 128 rows 18%
# faster at 80 (two A sets, 3 stages). On real layers up to N = NARROW_MAX_N 128 rows were
# faster at every N_ACT timed: at 16 and 32 on 15 of 18 (H200, N x K from 2880^2 to
# 3584x18944, up to 1.20x), at 48 and 64 on all 14 (H100, 1.03-1.32x), and on DeepSeek-V3's
# 7168-wide layers at 16, 32, 48 and 64 rows on all 12 (H100, us, 128 / 256 rows:
# 64x7168x2048 11.3 / 14.1, 64x7168x18432 41.1 / 45.0, 16x7168x16384 31.9 / 33.2). Wider
# layers (8192 up) keep 256 rows.
WIDE_MAX_N_ACT = 64
NARROW_MAX_N = 7168
# W4A4 up to this M runs the small-M kernel, which decodes NVFP4 activations in registers; above
# it the register-A kernels decode them in their permute pass (at M = 1 the small-M kernel's
# in-register decode costs less than a pass).
W4A4_NATIVE_MAX_M = 8
# W4A4 at M = 1 decodes its activation row once per CTA into shared memory up to this K. H200
# A/B (docs/facts.md#w4a4-stage-max-k; W4A16 time / W4A4 time, staged vs decoded in every
# trip): 1x8192^2 0.945 vs 0.922, 1x28672x8192 0.988 vs 0.884; at 1x8192x28672 each CTA decodes
# 28672 elements before its first trip: 0.927 vs 0.955.
W4A4_STAGE_MAX_K = 8192
# Where N % 128 != 0 (the register-A kernel's partial last row block, `rs.Config.N_TAIL`) the
# small-M kernel keeps up to this M. H200 A/B (docs/facts.md#small-m-tail; vs cuBLAS
# bf16, small-M / register-A): 16x4000x8192 W4A16 1.99 / 1.63x, W4A4 2.04 / 1.58x; 64x4000x8192
# W4A16 0.81 / 1.44x.
SMALL_M_TAIL_MAX_M = 16
# ... unless its CTAs (one per 32 weight rows: MT = 2 row tiles of 16, `small_m_config`) fill
# less than this fraction of the SMs: there the register-A kernel's stream over more CTAs wins
# (H100 2026-12-07, docs/facts.md#small-m-fill; us, small-M / register-A, W4A16: 9, 12, 16 x
# 576x7168 (18 CTAs) 9.0 / 7.4, 9.0 / 7.3, 9.4 / 7.4; at 2880x2880 (90 CTAs) 6.2 / 7.8,
# 6.2 / 7.7, 6.4 / 7.7 and 2880x4096 6.8-7.1 / 8.6-8.7 small-M keeps them).
SMALL_M_TAIL_MIN_FILL = 0.5
SMALL_M_MT = 2  # the small-M kernel's MMA row tiles per warp (`gv.Config.MT`; 16 rows each)
# Up to SMALL_M_TAIL_MAX_M rows the small-M kernel also takes short whole-step K (K % 128 == 0,
# K <= this): there the register-A kernel's row blocks split into few stages per CTA. H200 A/B
# (2026-12-05, weights L2-resident, docs/facts.md#small-m-short-k; vs cuBLAS bf16 at 16 rows,
# small-M / register-A at 128 rows / the 256-row register-A it replaced): 3584^2 0.98 / 0.88 /
# 0.73x, 4608x3584 0.92 / 0.82 / 0.76x, 4096^2 1.04 / 1.04 / 0.89x, 6144x4096 1.57 / 1.36 /
# 1.28x; at K = 2880 (K % 128 == 64) it lost (5120x2880 0.66 / 0.72x, 5760x2880 0.75 /
# 0.80x), at K = 18944 too (3584x18944 1.65 / 2.03x); at 32 rows it lost on 3 of 5 such
# layers. Up to N = NARROW_MAX_N (the layers measured): on the H100 (cold weights)
# 16x37888x3584 ran 49.6 us on it where register-A ran 32 rows in 43.2; 16x7168x2048 W4A16
# 9.1 us on it / 9.2 at 128 register-A rows, W4A4 7.4 / 9.9 (the 256 rows then planned).
SMALL_M_SHORT_K_MAX = 4096
# (K % 128 == 64 too where the CTAs exceed the SMs but fit two per SM: the loss at K = 2880
# above was the split's CTAs, 160 and 180 of one per SM in two rounds; at two per SM,
# `SMALL_M_TWO_TILES_MAX_S`, small-M won there: H100, docs/facts.md#small-m-two-per-sm. One-round
# shapes at K % 128 == 64 were not timed.)
# ... and whole-step K above that up to SMALL_M_WHOLE_K_MAX where its N / 32 CTAs fill at
# least SMALL_M_TAIL_MIN_FILL of the SMs at up to SMALL_M_MAX_CTAS_PER_SM CTAs each (W4A4: one;
# its two decoded activation tiles' registers hold one 8-warp CTA per SM). H100 (2026-12-07,
# `bench nvfp4 --models --m 16 --paths`, commit 6556aa2, docs/facts.md#small-m-16-rows; us at
# 16 rows, small-M / register-A, W4A16 and W4A4): 4096x7168 (128 CTAs) 10.8 / 12.9, 10.6 / 13.7;
# 4096x14336 18.7 / 19.5, 18.0 / 20.2; 8192x8192 (256) 19.6 / 21.4, W4A4 22.6 / 22.4; lost at
# 10240x8192 (320 CTAs) 34.0 / 25.9, at K = 16384 (7168 wide, 224) 33.9 / 31.7 and 18944
# (3584 wide) 24.8 / 22.9, and on 1536x7168 (48 CTAs) 9.4 / 8.4.
SMALL_M_WHOLE_K_MAX = 14336
SMALL_M_MAX_CTAS_PER_SM = 2
# The small-M kernel's K split (`small_m_splits`): the divisor of its K chunks nearest the split
# it aims for (every slice the same trips, as the H200 sweeps of docs/facts.md#small-m-config
# ran), unless divisibility leaves it under this fraction of the aim among every split that fits
# a CTA: then the fewest slices, one trip apart (`gv.k_slice`), whose longest slice is as short
# as at the aim. Divisors only gave 1x3584x18944 (Qwen2.5-7B down: 74 chunks = 2 x 37)
# S = 2 where 19 was the aim: 52.0 us, 0.75x cuBLAS bf16 (H200 2026-12-05,
# docs/facts.md#small-m-split); now S = 15 (4 or 5 trips each): 13.5 us (the old S = 2: 42.6).
# Where K's steps are not whole trips (`gv.Config.REST`) the first slice runs them anyway, so no
# split is even and the aim's S is taken: 1x8192x29568 (115 trips and a step) at S = 8 ran 46.9
# us against 59.7 at S = 5 = 115 / 23 (H200 2026-12-05, docs/facts.md#small-m-rest).
SMALL_M_EVEN_MIN = 0.5
# The most warps (WN x S) of a small-M CTA, so its trips keep their registers: a CTA of T
# threads gets 65536 / T registers per thread, and the trips need up to 128 (sm_90a builds,
# `compile.Build.local_in_loops`; docs/facts.md#small-m-warps): 1x576x7168 and 1x1536x7168 at
# the aim's S = 28 (896 threads: 72 registers) spilled 83 loads and stores per trip, at S = 20
# 47, at 16 none; at 19 warps an uneven split spilled too. H100, planned S = 14 / the old 28,
# us: 1x1536x7168 7.1 / 8.3, W4A4 2x1536x7168 7.8 / 11.8. W4A4 decoding two activation tiles
# (9-16 rows) of 4 steps in every trip needs 134-138: at most SMALL_M_MAX_WARPS_DECODING
# (16x576x7168 at S = 14, 448 threads, spilled 13 per trip; S = 12 none; 2 steps per trip:
# none at 16).
SMALL_M_MAX_WARPS = 16
SMALL_M_MAX_WARPS_DECODING = 12
# At 9-16 rows a trip of 2 steps on two activation tiles needs up to 168 registers (sm_90a
# builds: W4A4 168, W4A16 142; at 8 warps, 128 registers, both spill): two CTAs share an SM up to
# this many warps (65536 / (2 x 192) = 170), so where the N / 32 CTAs exceed the SMs but fit two
# per SM the split stops here (`small_m_config`; also K % 128 == 64 on the short-K rule). H100
# A/B (2026-12-07, docs/facts.md#small-m-two-per-sm; us, W4A16 / W4A4): 16x5120x2880 (160
# CTAs) at S = 6 8.0 / 7.8, S = 5 9.2, S = 8 9.8 / 9.5 (two per SM at 128 registers), the
# register-A kernel planned then 10.5 / 10.7; 16x5760x2880 (180) 8.0 / 7.8 against 10.7 / 10.8.
SMALL_M_TWO_TILES_MAX_S = 6
# The small-M K split over clusters (`small_m_cluster`): the CTAs per row block it tries, the
# largest first, the most rows, and the fewest 128-K steps each CTA must get (won by 24-27% from
# 14, K = 7168; by 3-5% at 8, K = 4096, and lost there on 256x4096 before the ranks summed their
# own slices first: untaken). Clusters of 8 (two CTAs per SM) ran 2-3% faster than 4 on
# 576x7168, the run-to-run spread (docs/facts.md#small-m-cluster): untaken.
SMALL_M_CLUSTERS = (4, 2)
SMALL_M_CLUSTER_MAX_M = 8
SMALL_M_CLUSTER_MIN_STEPS = 14
# Where "dequantize" beats the tiled register-A kernel: (K below, from M rows on), for W4A16 and
# W4A4. The dequantize pass costs N x K whatever M is, so it pays from enough rows, and sooner at
# a short K (the tiled kernel's per-tile costs weigh more there). H200 A/B
# (docs/facts.md#dequantize-rule; tiled / dequantize us, W4A16 | W4A4, W4A4 "dequantize" in
# one launch):
# K = 2880, N = 2880: 384 rows 18.4 / 24.7 | 18.2 / 25.3, 512 21.8 / 25.0 | 21.4 / 25.8, 1024
# 33.5 / 33.5 | 32.7 / 34.8, 2048 61.0 / 57.9 | 59.1 / 61.3, 4096 124.7 / 108.5 | 123.9 /
# 115.6; N = 5760: 512 37.3 / 38.3 | 37.0 / 39.4, 1024 62.0 / 63.1 | 61.2 / 64.8, 2048 118.7 /
# 112.3 | 118.3 / 114.0. K = 4096 (vs cuBLAS bf16), W4A16 1024x4096 0.84 /
# 0.75x, 2048x4096 0.83 / 0.86x, W4A4 2048x4096 0.85 / 0.78x (a second A/B: 2048x4096^2 W4A4
# 100-108 / 108 us, even); K = 8192: tiled at every M (W4A16 0.90 / 0.77x at 1024 rows, 0.90 /
# 0.88x at 2048, within 3% either way from 4096 rows). W4A16 at any K from 8192 rows: there
# the dequantize pass is about 5% of cuBLAS's time whatever K is (both scale with N x K), and
# the tiled kernel fell behind at long K (H100 real layers, docs/facts.md#dequantize-rule;
# tiled at 8192 rows, x cuBLAS bf16: 3584x18944 0.49, 7168x18432 0.57, 7168x16384 0.57,
# 10240x8192 0.69, 4096x14336 0.86, 8192x8192 0.91, 8192x28672 0.92, 57344x8192 0.89, 59136x8192
# 0.94; "dequantize" at 8192 rows on the 17 layers of K < 8192 in the same run 0.89-1.11;
# H100 A/B, W4A16 tiled / dequantize: 8192x10240x8192 0.73 / 1.02x, 8192x7168x18432 0.54 /
# 1.00x). W4A4 too from 8192 rows (its pass also decodes the M x K activations, a smaller share
# the wider the layer): 8192x10240x8192 0.75 / 1.02x, 8192x8192^2 0.90 / 1.00x, 8192x7168x18432
# 0.55 / 0.96x, 8192x3584x18944 0.49 / 0.86x.
DEQUANTIZE_FROM = {False: ((8192, 2048), (math.inf, 8192)),
                   True: ((4096, 2048), (math.inf, 8192))}
# Below this N (56 weight bands or fewer), from K = 8192 on, from 2048 rows, W4A16 and W4A4: the
# tiled kernel on few bands ran far below the dequantize pass + cuBLAS, whose share of the time
# depends on M only (H100 A/B, docs/facts.md#dequantize-rule; x cuBLAS bf16, tiled as planned /
# "dequantize", W4A16 | W4A4: 2048x3584x18944 0.54 / 0.87 | 0.54 / 0.81, 4096x3584x18944 0.55 /
# 0.97 | 0.57 / 0.88, 2048x7168x18432 0.68 / 0.85 | 0.71 / 0.85, 4096x7168x18432 0.76 / 0.95 |
# 0.77 / 0.94; on 64 bands, 8192x28672 and 8192x29568 at 2048-4096 rows, tiled ran 0.88-1.03x).
DEQUANTIZE_NARROW_N = 8192
# Beyond the split tile's rows (`SPLIT_TILE_MAX_M`): "dequantize" where the weight bands times
# the 128-row activation tiles are fewer than this fraction of the SMs (the tiled kernel's few
# tiles then take longer than the dequantize pass + cuBLAS). W4A4 too since its operands decode
# in one launch (`DEQUANTIZE_PAIRED`; 256x2880^2 tiled 21.9 us, one-launch dequantize
# 18.7, W4A16's 18.3: docs/facts.md#dequantize-paired). H200 A/B (docs/facts.md#dequantize-rule;
# vs cuBLAS bf16, tiled / dequantize), 240 and 256 rows: 1024x8192
# 0.31-0.36 / 0.49-0.50x, 2048x4096 0.40-0.42 / 0.49-0.55x, 2880x2880 0.42 / 0.49-0.51x (46
# tiles); 4000x8192 (64 tiles) 0.82-0.90 / 0.48-0.56x. Up to 208 rows the split tile won
# there: 129x2880x2880 0.42 / 0.27x, 200x2880x2880 0.40 / 0.38x.
DEQUANTIZE_MAX_TILES = 0.4
# ... unless the tiled kernel has a plan for those few bands (`few_bands_plan`): 128-wide tiles
# in stream-K teams from FEW_BANDS_TEAMS_MIN_K where a team has at most FEW_BANDS_TEAMS_MAX
# parts (a long K pays for the hand-over, many parts do not), else whole tiles of the
# few-tiles width where they fill FEW_BANDS_MIN_FILL of the SMs. H100 A/B
# (docs/facts.md#few-bands; us, this plan / "dequantize", the other tiled candidates beside):
# 256x2880x2880 Nb = 64 whole 16.0 / 21.6 (teams of 2 at 128: 17.8), 256x2880x4096 Nb = 64
# 19.8 / 29.5 (teams 21.5), 256x1536x7168 teams of 5 21.3 / 29.0 (Nb = 64 teams of 2 23.2),
# 512x1536x7168 teams of 2 31.3 / 37.8 (Nb = 64 whole 36.2), 1024x576x7168 teams of 3 31.8 /
# 33.6; "dequantize" kept where a team has more parts: 256x576x7168 (8 parts) 20.5 / 18.8,
# 512x576x7168 (6) 23.4 / 21.3. Teams only while the bf16 activations fit
# TILED_STREAM_K_MAX_A_BYTES, as every stream-K plan of the tiled kernel.
FEW_BANDS_TEAMS_MIN_K = 6144
FEW_BANDS_TEAMS_MAX = 5
FEW_BANDS_MIN_FILL = 0.6
# W4A4 "dequantize" with one launch for both operands and D's scale (`launch.dequantize_pair`)
# rather than two dequantize launches and torch's gA * gB. H200 A/B
# (docs/facts.md#dequantize-paired; two launches / one, us): 256x2880^2 23.4 / 18.7,
# 1024x2880^2 38.9 / 37.0, 2048x2880^2 66.3 / 60.5, 256x4096^2 36.5 / 32.2,
# 2048x4096^2 113.5 / 107.8.
DEQUANTIZE_PAIRED = True
PATHS = ("small_m", "register_a", "register_a_tiled", "dequantize")


def hopper_path(w4a4: bool, M: int, N: int, K: int, sms: int) -> str:
    """The path of one 2-D Hopper GEMM on a GPU of `sms` SMs (module docstring); every valid
    shape has one."""
    if gv.supports(M, N, K) and (M <= W4A4_NATIVE_MAX_M if w4a4 else M < RS_MIN_M):
        return "small_m"
    ctas = N // (16 * SMALL_M_MT)
    if M <= SMALL_M_TAIL_MAX_M and gv.supports(M, N, K) and (
            (N % rs.BAND and ctas >= SMALL_M_TAIL_MIN_FILL * sms)
            or (K <= SMALL_M_SHORT_K_MAX and N <= NARROW_MAX_N and (
                K % gv.STEP_K == 0 or _two_per_sm(N, sms)))
            or (K % gv.STEP_K == 0 and SMALL_M_SHORT_K_MAX < K <= SMALL_M_WHOLE_K_MAX
                and SMALL_M_TAIL_MIN_FILL * sms <= ctas
                <= (1 if w4a4 else SMALL_M_MAX_CTAS_PER_SM) * sms)):
        return "small_m"
    if rs.supports(M, N, K) and not split_tile_wins(M, N, K):
        return "register_a"
    if M <= gv.MAX_M and not w4a4 and gv.supports(M, N, K):
        return "small_m"
    if rst.supports(M, N, K) and not dequantize_wins(w4a4, M, N, K, sms):
        return "register_a_tiled"
    return "dequantize"


def split_tile_wins(M: int, N: int, K: int) -> bool:
    """Whether the tiled kernel takes M rows rather than the register-A kernel: every M above
    the latter's 128, and from SPLIT_TILE_MIN_M on SPLIT_TILE_MIN_BANDS weight bands or more
    from K = SPLIT_TILE_MIN_K, where one split tile beat it (H100 and H200 A/Bs above
    SPLIT_TILE_MIN_M)."""
    return M > rs.MAX_M or (M >= SPLIT_TILE_MIN_M and K >= SPLIT_TILE_MIN_K
                            and -(-N // rst.ROWS) >= SPLIT_TILE_MIN_BANDS)


def dequantize_wins(w4a4: bool, M: int, N: int, K: int, sms: int) -> bool:
    """Whether "dequantize" beats the tiled register-A kernel: at M rows and this K
    (`dequantize_by_rows`), or on few weight bands (`few_bands`) where the tiled kernel has
    no plan for them (`few_bands_plan`)."""
    return dequantize_by_rows(w4a4, M, N, K) or (
        few_bands(M, N, sms) and few_bands_plan(M, N, K, sms) is None)


def dequantize_by_rows(w4a4: bool, M: int, N: int, K: int) -> bool:
    """Whether M rows at this K are enough for "dequantize" (`DEQUANTIZE_FROM`; narrow layers
    at long K: `DEQUANTIZE_NARROW_N`)."""
    if N < DEQUANTIZE_NARROW_N and K >= 8192:
        return M >= 2048
    return next((M >= rows for below, rows in DEQUANTIZE_FROM[w4a4] if K < below), False)


def check_hopper_path(path: str, w4a4: bool, M: int, N: int, K: int, out_dtype: str,
                      sf: str = "ue4m3") -> str:
    """`path` if it can run this Hopper GEMM (a forced path), else ValueError naming why."""
    takes = {
        "small_m": gv.supports(M, N, K),
        "register_a": M <= rs.MAX_M and rs.supports(M, N, K),
        "register_a_tiled": rst.supports(M, N, K),
        "dequantize": True,
    }
    if path not in takes:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if not takes[path]:
        raise ValueError(f"path {path!r} cannot run M={M}, N={N}, K={K}, out {out_dtype} "
                         f"(small_m: M <= 64, N % 32, K % 64 and K >= 128; "
                         f"register_a: M <= 128, N % 8, K % 16; "
                         f"register_a_tiled: N % 8 (NVFP4 out: N % 128), K % 16)")
    return path


@functools.lru_cache(maxsize=1024)
def small_m_config(M: int, N: int, K: int, w4a4: bool = False, out_dtype: str = "bfloat16",
                   sms: int = 132, clusters: bool = True) -> gv.Config:
    """The default configuration for a problem on a GPU with `sms` SMs (raises ValueError if
    the shape is unsupported); `clusters` False: without `small_m_cluster` (one CTA per row
    block, the bench's baseline). Cached: it is on every call's host path."""
    if not 1 <= M <= gv.MAX_M:
        raise ValueError(f"the small-M kernel supports 1 <= M <= {gv.MAX_M}, got M={M}")
    if K % gv.TAIL_K or K < gv.STEP_K:
        raise ValueError(f"the small-M kernel needs K to be a multiple of {gv.TAIL_K} and at "
                         f"least {gv.STEP_K}, got K={K}")
    if N % 32:
        raise ValueError(f"the small-M kernel needs N to be a multiple of 32, got N={N}")
    NT = max(1, -(-M // 8))
    NT = 1 << (NT - 1).bit_length()
    # H200 sweeps (docs/facts.md#small-m-config): warps of 2 MMA row tiles; 2 steps per trip, the
    # next trip's weights in flight at M <= 8 (registers capped for 16 warps per SM), 4 steps
    # with two activation tiles (M 9..16); about 8 warps per CTA, at least one CTA per SM.
    # Where K's steps are not whole trips, 4 shrinks to 2 while that divides them, and an odd
    # count keeps 2: the first K-slice runs the step left over (`Config.REST`).
    steps = K // gv.STEP_K
    unroll = 4 if NT == 2 else 2
    while unroll > 2 and steps % unroll:
        unroll //= 2
    unroll = min(unroll, steps)
    # Launched as a programmatic dependent, nothing read before the kernel before it has ended
    # (safe whatever that kernel writes): back-to-back calls overlap one's tail with the next
    # one's launch, 1-8% at M = 1 and 2-3% at M = 8-16 (H200 A/B, docs/facts.md#pdl).
    cfg = gv.Config(MT=SMALL_M_MT, NT=NT, WN=1, UNROLL=unroll, w4a4=w4a4, out_dtype=out_dtype,
                    AHEAD=NT == 1, PDL=True, **small_m_k_fields(K, unroll))
    cfg = dataclasses.replace(cfg, S=small_m_splits(cfg, N, K, sms))
    # 4 steps per trip halve the K-slices a short K can give: where 2 steps per trip give twice
    # the slices (up to SMALL_M_MAX_WARPS) and their CTAs (one row group each, one per SM at
    # that many warps) fit the SMs in one round, they run (H100, docs/facts.md#small-m-short-k:
    # 16x3584^2 W4A16 U4 S7 8.8 us, U2 S14 6.8; 16x2880x4096 U4 S8 9.3, U2 S16 6.9;
    # 16x4096^2 U4 S8 9.6, U2 S16 7.3; at 16x4608x3584, 144 CTAs, U4 S7 9.1, U2 S14 11.9; at
    # 16x576x7168 U4 S14 9.2, U2 S28 12.8).
    if unroll == 4:
        two = dataclasses.replace(cfg, UNROLL=2, **small_m_k_fields(K, 2))
        two = dataclasses.replace(two, S=small_m_splits(two, N, K, sms))
        if 2 * cfg.S <= two.S and N // two.rows <= sms:
            cfg = two
    # At M <= 8 (AHEAD: MIN_CTAS = 16 // (WN x S) per SM) the aim can give more CTAs than the
    # SMs hold at once: the rest would run in a partial second round. S shrinks (WN, the row
    # groups per CTA, growing with it) until every CTA is resident. H200 (WN = 1):
    # 1x4608x3584 at S = 14 (144 CTAs, 132 slots) 1.16x cuBLAS bf16, 1x3584x3584 (112 CTAs)
    # 2.22x; H100 A/B (WN > 1; us, planned / resident): 1x36864x7168 S = 2 WN = 4 (288 CTAs,
    # 264 slots) 75.3 / S = 1 WN = 8 59.0, 8x36864x7168 80.0 / 66.3, 1x37888x3584 37.7 / 30.5,
    # 1x24576x1536 S = 3 WN = 2 11.0 / S = 2 WN = 4 9.9 (docs/facts.md#small-m-round).
    # At 9-16 rows (two activation tiles, 2 steps per trip, nothing ahead) a trip needs up to
    # 168 registers: a CTA of more than SMALL_M_TWO_TILES_MAX_S warps holds an SM alone, so where
    # the N / 32 CTAs exceed the SMs but fit two per SM the split is capped there, one row group
    # per CTA, two CTAs per SM: one round (docs/facts.md#small-m-two-per-sm).
    two_per_sm = (NT == 2 and cfg.UNROLL == 2 and cfg.S > SMALL_M_TWO_TILES_MAX_S
                  and _two_per_sm(N, sms))
    if two_per_sm:
        cfg = dataclasses.replace(cfg, S=small_m_splits(cfg, N, K, sms,
                                                        most=SMALL_M_TWO_TILES_MAX_S))
    WN = 1 if two_per_sm else _row_groups(cfg.S, N, sms)
    while cfg.AHEAD and cfg.S > 1 and N // (32 * WN) > max(1, 16 // (WN * cfg.S)) * sms:
        cfg = dataclasses.replace(cfg, S=small_m_splits(cfg, N, K, sms, most=cfg.S - 1))
        WN = _row_groups(cfg.S, N, sms)
    ctas = (max(1, 16 // (WN * cfg.S)) if cfg.AHEAD
            else SMALL_M_MAX_CTAS_PER_SM if two_per_sm else 0)
    # W4A4 at M = 1 stages its activation row decoded (once per CTA instead of in every warp's
    # trips) up to K = W4A4_STAGE_MAX_K; bf16 rows are not staged (`gv.Config.XSMEM`).
    xs = gv.xsmem_bytes(M, K) if M == 1 and w4a4 and K <= W4A4_STAGE_MAX_K else 0
    cfg = dataclasses.replace(cfg, WN=WN, MIN_CTAS=ctas, XSMEM=xs if xs <= gv.MAX_XSMEM else 0)
    cfg = small_m_cluster(cfg, M, N, K, sms) if clusters else cfg
    # (the L2 fetch follows the final steps per trip: `l2_fetch`)
    return dataclasses.replace(cfg, L2_FETCH=l2_fetch(cfg.NT, cfg.UNROLL, K))


def small_m_cluster(cfg: gv.Config, M: int, N: int, K: int, sms: int) -> gv.Config:
    """`cfg` with its K split spread over clusters of c CTAs per row block (`gv.Config.CLUSTER`,
    c the first of SMALL_M_CLUSTERS that fits) where the row blocks are so few that the
    clusters' CTAs still fit the SMs (and their clusters all run at once, `CLUSTERS_RESIDENT`),
    at M <= SMALL_M_CLUSTER_MAX_M and K of at least SMALL_M_CLUSTER_MIN_STEPS 128-K steps per
    CTA: one step per trip, S = the steps per CTA up to SMALL_M_MAX_WARPS (one step per warp at
    K = 7168 in clusters of 4), W4A4's row not staged (each CTA would decode all of it); else
    `cfg`. H100, 2026-12-07 (docs/facts.md#small-m-cluster; us, one CTA per row block /
    clusters, W4A16, `bench nvfp4 --tune` at commit 3f1fbf4): 576x7168 (c = 4) at 1 / 2 / 4
    rows 6.5 / 4.8, 6.6 / 4.8, 6.6 / 5.0 (W4A4 5.0-5.1), 512x8192 6.5-6.7 / 4.9-5.0; at 8 rows
    576x7168 6.72 / 5.09 (W4A4 5.15; ad-hoc `.prof/smc.py`, 09:16 UTC); 1536x7168 (48 row
    blocks, c = 2, S = 16; ad-hoc, commit 6556aa2) at 1 / 4 / 8 rows 7.07 / 7.16, 7.20 / 6.56,
    7.28 / 6.74, W4A4 7.39 / 7.31, 7.72 / 6.69, 7.69 / 6.68 (the clusters with the L2 line
    fetch at M = 1; without it, `l2_fetch`, 6.3 us at 1 row)."""
    blocks, steps = N // cfg.rows, K // gv.STEP_K
    if M > SMALL_M_CLUSTER_MAX_M:
        return cfg
    for c in SMALL_M_CLUSTERS:
        if (blocks * c <= sms and blocks <= CLUSTERS_RESIDENT[c] * sms // 132
                and steps >= c * SMALL_M_CLUSTER_MIN_STEPS):
            S = min(SMALL_M_MAX_WARPS // cfg.WN, steps // c)
            return dataclasses.replace(cfg, UNROLL=1, **small_m_k_fields(K, 1), S=S, CLUSTER=c,
                                       MIN_CTAS=max(1, 16 // (cfg.WN * S)), XSMEM=0)
    return cfg


def l2_fetch(NT: int, unroll: int, K: int) -> int:
    """`gv.Config.L2_FETCH` of a small-M plan: 128 where a trip reads each weight row's whole
    128-byte line as two 64-byte loads (one activation tile, 2 steps per trip, the next trip's
    weights in flight: each load asking L2 for its line was 2-4% faster at M = 1 on the H200
    and 0-7% at M = 2-8 on 16 layers on the H100) and every row starts on a line (K % 256 ==
    0: at K = 29568 every other row's 128 bytes straddle two lines and the fetch asked for
    both, 1x8192x29568 69.6 us with it, 55.9 without); else 0. With one step per trip (the
    cluster split, 64 bytes of each row) the fetch lost (1-8x1536x7168 6.3-6.7 -> 7.0-7.4 us,
    W4A4 alike; 576x7168 even), with two activation tiles (4 steps per trip, nothing ahead)
    9-10%; 256 bytes never beat 128 and lost up to 29% on the large layers (H100 A/Bs,
    docs/facts.md#small-m-l2-fetch)."""
    return 128 if NT == 1 and unroll == 2 and K % 256 == 0 else 0


def _two_per_sm(N: int, sms: int) -> bool:
    """Whether the small-M kernel's N / 32 CTAs of one row group exceed the SMs but fit
    SMALL_M_MAX_CTAS_PER_SM per SM (`SMALL_M_TWO_TILES_MAX_S`)."""
    return sms < N // (16 * SMALL_M_MT) <= SMALL_M_MAX_CTAS_PER_SM * sms


def _row_groups(S: int, N: int, sms: int) -> int:
    """WN: the small-M CTA's 32-row groups at S K-slices, about 8 warps per CTA while the CTAs
    (N / (32 x WN)) still cover the SMs."""
    WN = max(1, 8 // S)
    while WN > 1 and (N % (32 * WN) or N // (32 * WN) < sms):
        WN //= 2
    return WN


def small_m_k_fields(K: int, unroll: int) -> dict:
    """The small-M Config fields K fixes for `unroll` steps per trip: the 128-K steps past the
    whole trips (REST) and K's last half step (K_TAIL)."""
    return {"REST": K // gv.STEP_K % unroll, "K_TAIL": K % gv.STEP_K != 0}


@functools.lru_cache(maxsize=1024)
def quantize_in_gemm(M: int, N: int, K: int, out_dtype: str = "bfloat16",
                     sms: int = 132) -> gv.Config | None:
    """The small-M Config that quantizes bf16 activations in the kernel (`gv.Config.QUANTIZE_A`:
    W4A4 from bf16 in one launch, bit for bit `quantize(a, check_finite=False)` then the GEMM)
    wherever W4A4 takes the small-M path and its M rows fit staged in shared memory
    (`gv.MAX_XSMEM`); None elsewhere (the quantizer's launch, then the GEMM). H200 A/B
    (docs/facts.md#quantize-in-gemm; CUDA-graph us, one launch / quantize + GEMM): 1x8192^2 13.7
    / 25.4, 1x4096^2 5.7 / 14.1, 1x28672x8192 37.9 / 50.2, 1x8192x28672 42.8 / 55.9 (rows
    staged past W4A4_STAGE_MAX_K), 2x8192^2 19.1 / 25.6, 8x4096x2048 10.6 / 12.1; host time
    per eager call ~15 / ~52 us."""
    if hopper_path(True, M, N, K, sms) != "small_m" or gv.xsmem_bytes(M, K) > gv.MAX_XSMEM:
        return None
    # (one CTA per row block: in a cluster every CTA would stage and quantize all the rows,
    # 2x576x7168 8.9 against 9.3 us, 4x 11.7 against 12.7 with the first cluster sum,
    # docs/facts.md#small-m-cluster)
    cfg = small_m_config(M, N, K, True, out_dtype, sms, clusters=False)
    return dataclasses.replace(cfg, XSMEM=gv.xsmem_bytes(M, K), QUANTIZE_A=True)


# Register-A with `pdl` permutes the activations per stage up to this N_ACT: one launch a call,
# whose start overlaps the call before (the per-call pass between the calls took PDL's gain,
# `rs.CALL_PERMUTE_MIN_N_ACT`). H100 2026-12-07 (docs/facts.md#rs-stage-pdl; us, calls
# chained in a graph, the pass / per stage with PDL): 32x2880^2 8.1 / 6.9, 48x2880^2 9.7 / 7.8,
# 32x576x7168 7.5 / 6.4; at 64 rows per stage lost (64x2880^2 10.4 / 10.8, 64x3584^2 12.9 /
# 17.0).
PDL_STAGE_MAX_N_ACT = 48


def complete(path: str, cfg, N: int, K: int, w4a4: bool, out_dtype: str, sf: str, pdl: bool,
             sms: int | None = None):
    """`cfg` (a path's Config: the planner's pick or a tuning entry's forced one) with every
    field the call fixes filled in, the one place a Config is completed from a call: D's type,
    the block-scale format, the activations' format (W4A4: decoded in the kernel), the K and N
    tails of the shape, programmatic dependent launch with early weight loads where `pdl`
    asks for it and the path takes it (small-M; register-A where it permutes per stage, which
    it does with `pdl` up to N_ACT = PDL_STAGE_MAX_N_ACT), and
    given the GPU's `sms`, register-A's D stored by the GEMM where its planned grid
    (`register_a_ctas`) gives every row block to one CTA (`rs.Config.DIRECT`, no reduction
    launch: Llama 3 8B's gate_up, DeepSeek-V3's q_b and kv_b at 9-96 rows), elsewhere its
    partials summed in clusters where `register_a_cluster` says so (`rs.Config.CLUSTER`)."""
    if path == "small_m":
        return dataclasses.replace(cfg, w4a4=w4a4, out_dtype=out_dtype, sf=sf,
                                   **small_m_k_fields(K, cfg.UNROLL), PDL=cfg.PDL or pdl,
                                   EARLY_WEIGHTS=cfg.EARLY_WEIGHTS or pdl)
    a_format = "nvfp4" if w4a4 else "bf16"
    if path == "register_a":
        cfg = dataclasses.replace(cfg, out_dtype=out_dtype, sf=sf, a_format=a_format,
                                  K_TAIL=K % rs.STAGE_K != 0, N_TAIL=N % rs.BAND != 0)
        if (pdl and not w4a4 and cfg.PERMUTE == "auto" and cfg.permute == "call"
                and cfg.N_ACT <= PDL_STAGE_MAX_N_ACT):
            cfg = dataclasses.replace(cfg, PERMUTE="stage")
        if pdl and cfg.permute == "stage":
            cfg = dataclasses.replace(cfg, PDL=True, EARLY_WEIGHTS=True)
        if sms is not None and cfg.CLUSTER == 1:
            if rs.whole_blocks(cfg, N, K, register_a_grid(cfg, N, K, sms)):
                cfg = dataclasses.replace(cfg, DIRECT=True)
            else:
                cfg = dataclasses.replace(cfg, CLUSTER=register_a_cluster(cfg, N, K, sms))
        return cfg
    if path == "register_a_tiled":
        return dataclasses.replace(cfg, out_dtype=out_dtype, sf=sf, a_format=a_format,
                                   K_TAIL=K % rst.STAGE_K != 0, N_TAIL=N % rst.ROWS != 0)
    raise ValueError(f"path {path!r} has no kernel Config (one of {PATHS[:3]})")


def default_config(path: str, M: int, N: int, K: int, w4a4: bool, out_dtype: str, sms: int):
    """The planner's Config for a one-kernel Hopper path, before `complete`."""
    if path == "small_m":
        return small_m_config(M, N, K, w4a4, out_dtype, sms)
    if path == "register_a":
        return register_a_config(M, N, K, out_dtype)
    return register_a_tiled_config(M, N, K, out_dtype, sms)


def small_m_splits(cfg: gv.Config, N: int, K: int, sms: int,
                   ctas_per_sm: int | None = None, most: int | None = None) -> int:
    """S: K-slices (warps along K), nearest (in ratio; ties: larger) to about ctas_per_sm x 8
    warps per SM in all: enough 16-byte loads in flight to cover HBM latency; at most what fits
    a CTA and K / k_chunk. A divisor of K / k_chunk (balanced slices) unless that starves the
    split (`SMALL_M_EVEN_MIN`) or K's steps are not whole trips (`cfg.REST`: the first slice
    runs the rest); then slices one trip apart (`gv.k_slice`). Default
    ctas_per_sm: 2 for up to two activation tiles (M <= 16), else 1 (H200 sweeps: S=8 at
    N=K=8192 and S=2 at N=28672 for M=1 and 16; S=4 at M=64), at most SMALL_M_MAX_WARPS
    warps per CTA (SMALL_M_MAX_WARPS_DECODING where W4A4 decodes two activation tiles of 4
    steps in every trip). `most`: the largest S allowed (`small_m_config`: every CTA resident in
    one round)."""
    if ctas_per_sm is None:
        ctas_per_sm = 2 if cfg.NT <= 2 else 1
    chunks, groups = K // cfg.k_chunk, N // (16 * cfg.MT)
    want = max(1.0, sms * ctas_per_sm * 8 / groups)
    warps = (SMALL_M_MAX_WARPS_DECODING if cfg.decodes_activations and cfg.NT * cfg.UNROLL > 4
             else SMALL_M_MAX_WARPS)
    fits = [d for d in range(1, min(chunks, most or chunks, warps // cfg.WN) + 1)
            if cfg.fits(d)]
    nearest = lambda splits: min(splits, key=lambda d: (abs(math.log(d / want)), -d))
    aim, even = nearest(fits), nearest([d for d in fits if chunks % d == 0])
    if even >= SMALL_M_EVEN_MIN * aim and not cfg.REST:
        return even
    longest = -(-chunks // aim)  # chunks of the longest slice
    return -(-chunks // longest)



@functools.lru_cache(maxsize=1024)
def register_a_config(M: int, N: int, K: int, out_dtype: str = "bfloat16") -> rs.Config:
    """N_ACT = M rounded up to 16 (8 up to M = 8). Where N allows, 256 rows per CTA (each
    activation byte then serves twice the weight rows): as four warpgroups of one MMA tile up
    to N_ACT = WIDE_MAX_N_ACT on more than NARROW_MAX_N weight rows (on fewer: 128, more CTAs
    and stages per CTA), and as two of two tiles where 128 rows would leave a ring of two
    stages anyway (N_ACT = 128; beyond that 128 rows keep three stages and were faster)."""
    tail, n_tail = K % rs.STAGE_K != 0, N % rs.BAND != 0
    rs.check_shape(rs.Config(N_ACT=rs.MAX_M, K_TAIL=tail, N_TAIL=n_tail), M, N, K)
    n_act = 8 if M <= 8 else -(-M // 16) * 16
    narrow = rs.Config(N_ACT=n_act, out_dtype=out_dtype, K_TAIL=tail, N_TAIL=n_tail)
    if N % (2 * rs.BAND) or (n_act <= WIDE_MAX_N_ACT and N <= NARROW_MAX_N):
        return narrow
    if n_act <= WIDE_MAX_N_ACT:
        return rs.Config(N_ACT=n_act, ROWS=2 * rs.BAND, out_dtype=out_dtype, K_TAIL=tail)
    if narrow.stages == 2:
        return rs.Config(N_ACT=n_act, ROWS=2 * rs.BAND, TILES=2, out_dtype=out_dtype,
                         K_TAIL=tail)
    return narrow


# A tiled register-A tile's time per activation row (column of D^T) relative to Nb = 256: the
# narrower the tile, the fewer activations each decoded weight serves. Fitted to H200 A/Bs of
# the widths (docs/facts.md#tiled-widths: 8 shapes at 128, 7 at 192; per
# row 1.05-1.18 at 128, 0.97-1.06 at 192).
TILED_TILE_COST = {256: 1.0, 192: 1.02, 128: 1.08}
# Narrow tiled tiles decode more weights per MMA than a warpgroup's other warpgroup hides (at
# Nb = 80 the tensor pipe is busy 60% of the active cycles, at 256 92%): up to this width, and
# from this K on, each warpgroup decodes a stage into a second A register set while its previous
# stage's MMAs run (`rst.Config.A_SETS`). H200 A/B (docs/facts.md#tiled-two-sets; vs
# cuBLAS bf16, one set / two): 129x8192^2 Nb = 80 0.97 / 1.02x, 170x8192^2 96 0.81 / 0.87x,
# 200x4096x8192 64 0.78 / 0.80x, 129x8192x28672 80 0.80 / 0.84x; but 150x8192x2880 80 0.96 /
# 0.92x, and from Nb = 112 on two sets were slower (200x8192^2 0.84 / 0.80x, 1024x8192^2 Nb = 256
# 0.92 / 0.88x).
# Stream-K on the tiled kernel (`rst.Config.STREAM_K`, `rounds.width_plan`): a CTA's equal
# share of the (tile x stage) units costs its tiles' time plus about this fraction of one tile
# at K = 8192 (the fp32 hand-over of the tiles split between two CTAs, a fixed cost: a smaller
# fraction of a longer tile). Fitted to an H200 A/B
# (docs/facts.md#tiled-stream-k; vs cuBLAS bf16, whole tiles / stream-K): 1024x8192^2 (1.94
# tiles per SM) 0.901 / 0.872x at Nb = 256, 4096x8192^2 (7.76) 0.964 / 0.979x, 256x28672x8192
# (1.70) 0.938 / 1.015x, 768x28672x8192 1.016 / 1.094x (192 / 256), 384x28672x8192 0.78 /
# 0.91x (192), 1024x8192x28672 1.000 / 1.044x.
TILED_STREAM_K_OVERHEAD = 0.12
# ... and only while the bf16 activations (M x K) are at most this many bytes. Equal shares
# start the CTAs at staggered K offsets, so the CTAs on one activation tile no longer read its
# K slices together and, once A outgrows the L2 (50 MB on H100 and H200), every reader fetches
# them from DRAM: 4096x7168x18432 (A 151 MB) read 4.47 GB from DRAM as stream-K, 1.26 GB as
# whole tiles (ncu, L2 hit rate 45% / 77%), 1906 / 1647 us. H100 A/B
# (docs/facts.md#tiled-stream-k; stream-K / whole tiles, us): 2048x8192x28672 (A 117 MB) 1528
# / 1446, 4096x8192x28672 3083 / 2963; but up to 64 MiB stream-K held or won: 4096x8192^2 882
# / 890, 2048x10240x8192 540 / 554, 1024x57344x8192 1364 / 1450, 512x28672x4096 189 / 212.
TILED_STREAM_K_MAX_A_BYTES = 64 << 20
# The split tile: above 128 rows (the register-A kernel's most) and up to this M, the tiled
# kernel runs one activation tile as wide as M (`split_tile_width`) on every 128-row weight
# band, its K split into stream-K shares (`schedule.stream_k_grid`: equal parts of each tile
# where the bands are fewer than the SMs, else shares that straddle the tiles). Every weight
# is then decoded once, for all M rows, and no padded tile is spent on a nearly empty second
# row of tiles. H200 A/B (docs/facts.md#split-tile; vs cuBLAS bf16, split tile / the
# previous pick): 129x8192^2 1.17 / 1.02x (two 80-row tiles), 129x8192x28672 1.25 / 0.94x,
# 129x5120^2 1.00 / 0.87x, 150x28672x8192 1.07 / 0.75x ("rows"), 200x8192x28672 1.02 / 0.92x,
# 200x8192^2 and 200x5120^2 even (0.81, 0.79x); at 240 and 256 rows it lost at N = 8192
# (240x8192^2 0.83 / 0.89x, 256x8192^2 0.79-0.84 / 0.90-0.95x for two 128-row tiles).
SPLIT_TILE_MAX_M = 208
# From this M the split tile (one tile of `split_tile_width`, 128 here) beats the register-A
# kernel's 128-row blocks. H200 A/B (docs/facts.md#split-tile; vs cuBLAS bf16, split
# tile / register-A) at N x K = 8192^2, 28672x8192, 8192x28672: 128 rows 1.13 / 1.03x, 1.26 /
# 1.20x, 1.22 / 1.23x; 120 rows 1.11 / 1.01x, 1.20 / 1.14x, 1.23 / 1.24x; 112 rows 1.22 /
# 1.26x, 1.27 / 1.24x, 1.30 / 1.33x; 96 rows register-A ahead at all three (1.31 / 1.22x ...).
# Also at 113 and 128 rows: 2880^2 0.44 / 0.42x, 5120^2 0.80 / 0.64x, 4000x8192 0.93 / 0.87x
# (113) and 0.89 / 0.83x (128). On 8 weight bands the split tile lost with one head adding
# the parts (1024x8192 0.43 / 0.52x), won as teams of 8 (`TILED_TEAMS_MIN`;
# 113 and 128 rows: 19.8 and 19.9 us / 22.0 and 21.7): from SPLIT_TILE_MIN_BANDS
# 128-row bands the split tile.
SPLIT_TILE_MIN_M = 113
SPLIT_TILE_MIN_BANDS = 8
# ... and from this K: below it the split tile's K parts are a few 128-wide stages each and the
# register-A kernel won (at 128 rows on 256-row bands: two-tile warpgroups, `TILES` = 2).
# H100 A/B at 128 rows (docs/facts.md#split-tile; us, register-A / split tile, W4A16):
# 128x32768x512 15.6 / 19.8, 128x24576x1536 25.3 / 27.6; from K = 2048 the split tile won on 9
# of the 11 layers timed (128x7168x2048 19.0 / 17.7, 128x5120x2880 21.1 / 17.8, 128x3584x18944
# 46.8 / 40.2), even on 1536x7168 and 5760x2880.
SPLIT_TILE_MIN_K = 2048
TILED_TWO_SETS_MAX_NB = 96
TILED_TWO_SETS_MIN_K = 8192
# `few_tiles_width`'s tiles fill at least this fraction of the SMs (the widths A/B'd at N =
# 8192, docs/facts.md#tiled-widths, all filled more).
FEW_TILES_MIN_FILL = 0.75
# Stream-K teams with 16-byte partials (`rst.Config.TEAMS`, `PARTIAL_V4`) where each tile
# splits into this many equal parts or more (`stream_k_team`): the parts finish their warps'
# rows side by side instead of one head adding every other part. H200 A/B
# (docs/facts.md#tiled-teams; vs cuBLAS bf16, head-takes-all / teams / teams + v4): five parts
# (23 bands) 113x2880^2 0.44 / 0.50 / 0.52x, 200x2880^2 0.40 / 0.47 / 0.49x; eight (8 bands)
# 200x1024x8192 0.37 / 0.47 / 0.50x; but two parts (64 bands) 113x8192^2 1.22 / 1.17 / 1.18x,
# 200x8192^2 0.87 / 0.86 / 0.87x.
TILED_TEAMS_MIN = 3


def register_a_tiled_config(M: int, N: int, K: int, out_dtype: str, sms: int) -> rst.Config:
    """Nb (activation rows per tile) and stream-K. Up to SPLIT_TILE_MAX_M rows one split tile
    as wide as M, stream-K along K (`split_tile_width`). Above: `few_tiles_width` where it
    applies, else the rounds model of `rounds.width_plan` over the (N / 128) x ceil(M / Nb)
    tiles (`TILED_TILE_COST`): 256 where its tiles fill their rounds, 192 or 128 where 256-row
    tiles would leave a round nearly empty or their last row of tiles half empty. H200 A/Bs
    (docs/facts.md#tiled-widths), vs cuBLAS bf16, Nb = 256 / 192 / 128: 384x8192^2 0.72 /
    0.91 / 0.66x, 768x28672x8192 0.87 / 1.02 / 0.92x, 512x8192^2 0.90 / - / 0.84x,
    3072x8192^2 0.93 / 0.93 / 0.87x. With at least one tile per SM the same model weighs
    stream-K shares
    (`TILED_STREAM_K_OVERHEAD`) where the activations fit `TILED_STREAM_K_MAX_A_BYTES`; its
    stream-K pick with one tile as wide as M is narrowed to
    `split_tile_width` (240x28672x8192 at Nb = 240 1.006x against 0.962x at 256). A_SETS: two
    register sets for narrow tiles at long K (`TILED_TWO_SETS_MAX_NB`).
    Stream-K teams with 16-byte partials where a tile splits into TILED_TEAMS_MIN parts or
    more. On few bands (`few_bands`) `few_bands_plan`'s tiles where it has one."""
    tails = {"out_dtype": out_dtype, "K_TAIL": K % rst.STAGE_K != 0, "N_TAIL": N % rst.ROWS != 0}
    few = few_bands_plan(M, N, K, sms) if few_bands(M, N, sms) else None
    if few is not None:
        nb, teams = few
        return rst.Config(Nb=nb, A_SETS=_a_sets(nb, K), STREAM_K=teams, TEAMS=teams,
                          PARTIAL_V4=teams, **tails)
    if M <= SPLIT_TILE_MAX_M:
        nb, stream_k = split_tile_width(M), True
    else:
        nb, stream_k = few_tiles_width(M, N, sms), False
    if nb is None:
        overhead = (TILED_STREAM_K_OVERHEAD * 8192 / K
                    if 2 * M * K <= TILED_STREAM_K_MAX_A_BYTES else None)
        nb, stream_k = rounds.width_plan(-(-N // rst.ROWS), M, sms, TILED_TILE_COST, overhead)
        if stream_k and nb >= M:  # one activation tile either way: the narrowest that holds M
            nb = split_tile_width(M)
    cfg = rst.Config(Nb=nb, A_SETS=_a_sets(nb, K), STREAM_K=stream_k, **tails)
    if stream_k and stream_k_team(M, N, K, cfg, sms) >= TILED_TEAMS_MIN:
        cfg = dataclasses.replace(cfg, TEAMS=True, PARTIAL_V4=True)
    return cfg


def _a_sets(nb: int, K: int) -> int:
    """A register sets of an Nb-wide tiled tile at this K (`TILED_TWO_SETS_MAX_NB`)."""
    return 2 if nb <= TILED_TWO_SETS_MAX_NB and K >= TILED_TWO_SETS_MIN_K else 1


def few_bands(M: int, N: int, sms: int) -> bool:
    """Beyond the split tile's rows, the 128-row tiles (weight bands x ceil(M / 128)) fewer
    than DEQUANTIZE_MAX_TILES x the SMs: the tiled kernel's usual widths leave most SMs idle."""
    return (M > SPLIT_TILE_MAX_M
            and -(-N // rst.ROWS) * -(-M // rst.ROWS) < DEQUANTIZE_MAX_TILES * sms)


def few_bands_plan(M: int, N: int, K: int, sms: int) -> tuple[int, bool] | None:
    """The tiled kernel's (Nb, stream-K teams) on few bands (`few_bands`): 128-wide tiles in
    stream-K teams from FEW_BANDS_TEAMS_MIN_K where a team has at most FEW_BANDS_TEAMS_MAX
    parts and the bf16 activations fit TILED_STREAM_K_MAX_A_BYTES; else whole tiles of
    `few_tiles_width` where they fill FEW_BANDS_MIN_FILL of the SMs; else None
    ("dequantize")."""
    teams = rst.Config(Nb=rst.ROWS, STREAM_K=True, TEAMS=True, K_TAIL=K % rst.STAGE_K != 0,
                       N_TAIL=N % rst.ROWS != 0)
    if (K >= FEW_BANDS_TEAMS_MIN_K and 2 * M * K <= TILED_STREAM_K_MAX_A_BYTES
            and 2 <= stream_k_team(M, N, K, teams, sms) <= FEW_BANDS_TEAMS_MAX):
        return rst.ROWS, True
    nb = few_tiles_width(M, N, sms, FEW_BANDS_MIN_FILL)
    return None if nb is None else (nb, False)


def stream_k_team(M: int, N: int, K: int, cfg: rst.Config, sms: int) -> int:
    """Parts per tile of `cfg`'s tiles as a stream-K team launch on `sms` SMs
    (`schedule.stream_k_team`); 0 where fewer than two fit."""
    return schedule.stream_k_team(rst.tiles(M, N, cfg), rs.k_blocks(cfg.K_TAIL, K), sms)


def split_tile_width(M: int) -> int:
    """The narrowest tiled width (`rst.NBS`) that holds all M activation rows in one tile."""
    return next(nb for nb in rst.NBS if nb >= M)


def few_tiles_width(M: int, N: int, sms: int, min_fill: float = FEW_TILES_MIN_FILL) -> int | None:
    """Where the N / 128 weight tiles leave SMs idle, the activation rows are cut into as many
    tiles per weight tile as one round of the SMs holds, each the narrowest of the kernel's
    widths (`rst.NBS`, each GPU-tested) that covers them: the fewest padded rows in one full
    round. None where no width covers them, or their tiles fill less than `min_fill` of the
    SMs (FEW_TILES_MIN_FILL; on few bands FEW_BANDS_MIN_FILL): the rounds model then.
    H200 A/B (docs/facts.md#tiled-widths), N = K = 8192, vs cuBLAS bf16, this width /
    before: 129 rows Nb = 80 0.95x / "rows" 0.83x, 160: 80 0.82 / "rows" 0.63x, 200: 112 0.80 /
    128 0.74x, 257: 144 0.86 / 192 0.67x, 300: 160 0.90 / 192 0.75x."""
    bands = -(-N // rst.ROWS)
    per = sms // bands  # activation tiles per weight tile in one round
    fits = [nb for nb in rst.NBS if nb * per >= M]
    if per < 1 or not fits or bands * -(-M // fits[0]) < min_fill * sms:
        return None
    return fits[0]


# What a register-A grid whose shares straddle row blocks costs, in 128-row units (row block
# x 256-K stage) a CTA streams: H100 2026-12-05 (docs/facts.md#rs-grid), 11 layers at 16-64
# rows, the misaligned grid of one CTA per SM 1.0-4.1 us slower than an aligned grid taking
# as many units per CTA, a 128-row unit 0.5-0.7 us.
RS_MISALIGNED_UNITS = 4


# Clusters of c CTAs a 132-SM GPU runs at once at one CTA per SM (register-A's cluster sum,
# `rs.Config.CLUSTER`, and the small-M K split, `small_m_cluster`; read on the H200,
# docs/facts.md#resident-clusters: its GPCs' SM counts are not multiples of 4; the H100's read
# alike, docs/facts.md#small-m-cluster), scaled to other SM counts; no 8 (clusters of 8 lost
# on a larger grid than the plan's: 1536x7168, 96 CTAs against 84); and the activation rows
# register-A's sum was timed at (32-64: the per-call permute; at 16 rows, permuting per stage, it
# lost 2% on 5760x2880, one of the two layers it would take there).
CLUSTERS_RESIDENT = {4: 30, 2: 66}
RS_CLUSTER_N_ACT = (32, 64)


def register_a_cluster(cfg: rs.Config, N: int, K: int, sms: int) -> int:
    """CLUSTER for a register-A plan (before `complete` sets it): the largest c of
    CLUSTERS_RESIDENT whose grid (c CTAs per row block, `rs.cluster_ctas`) has at least the
    stream-K grid's CTAs (`register_a_ctas`), whose clusters all run at once and whose row
    blocks have at least c stages, at N_ACT in RS_CLUSTER_N_ACT with the per-call permute (not
    beside pdl's per-stage permute, untimed together); else 1 (the stream-K grid and its
    reduction kernel). H100 A/B (docs/facts.md#rs-cluster), us, stream-K / cluster at 64
    rows: 2880^2 10.27 / 9.72 (c = 4), 3584^2 12.77 / 10.27 (4), 2880x4096 10.87 / 10.15 (4),
    7168x2048 11.86 / 11.39 (2); at 32 rows 2880^2 and 2880x4096 1-2% slower (8.03 / 8.14,
    8.40 / 8.60), 3584^2 10.62 / 9.06; where the rule says no: 4096^2 12.17 / 14.34 (2: half
    the CTAs) / 17.96 (4: 32 clusters of 4, two rounds), 1536x7168 10.03 / 10.46 (8)."""
    lo, hi = RS_CLUSTER_N_ACT
    if not lo <= cfg.N_ACT <= hi or cfg.permute != "call":
        return 1
    blocks, stages = rs.row_blocks(cfg, N), rs.k_stages(cfg, K)
    ctas = register_a_grid(cfg, N, K, sms)
    for c, resident in sorted(CLUSTERS_RESIDENT.items(), reverse=True):
        if blocks * c >= ctas and blocks <= resident * sms // 132 and stages >= c:
            return c
    return 1


def register_a_grid(cfg: rs.Config, N: int, K: int, sms: int) -> int:
    """The CTAs a register-A Config launches on `sms` SMs: CLUSTER per row block
    (`rs.cluster_ctas`) with `cfg.CLUSTER`, else the stream-K grid (`register_a_ctas`, at most
    one CTA per unit)."""
    if cfg.CLUSTER > 1:
        return rs.cluster_ctas(cfg, N)
    return min(register_a_ctas(cfg, N, K, sms), rs.stream_units(cfg, N, K))


@functools.lru_cache(maxsize=1024)  # on every register-A call's host path (~2 us uncached)
def register_a_ctas(cfg: rs.Config, N: int, K: int, sms: int) -> int:
    """The register-A kernel's stream-K grid (`rounds.stream_k_ctas`): the fewest units per
    CTA, counting RS_MISALIGNED_UNITS more (halved for 256-row units) where the shares
    straddle row blocks; at most one CTA per SM and per unit. 2880^2 (23 row blocks x 12
    stages) at 64 rows: 92 CTAs of 3 units, 11.0 us against 15.1 on 132."""
    units = rs.stream_units(cfg, N, K)
    return rounds.stream_k_ctas(units, rs.k_stages(cfg, K), sms,
                                RS_MISALIGNED_UNITS * rs.BAND / cfg.ROWS)
