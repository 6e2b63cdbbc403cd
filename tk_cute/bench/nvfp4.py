"""NVFP4 GEMM benchmark on Hopper: tk_cute beside cuBLAS, same process, cold L2.

    python -m tk_cute.bench nvfp4 [--m 1 16 64 128 256 ...] [--nk 8192,8192 ...]
                                  [--shapes M,N,K ...] [--paths] [--plot FILE.png]
    python -m tk_cute.bench nvfp4 --models [llama3-8b qwen2.5-7b ...] [--m ...]

Shapes: every M of `--m` times every (N, K) of `--nk`, plus the explicit `--shapes` (odd and
prime sizes, K not a multiple of 256; with no shape option, also `DEFAULT_SHAPES`: the issue
rows). `--models` instead: the linear layers of public model families (`MODEL_LAYERS`, with
their sources) at every M of `MODEL_M` (1 to 8192; every family at every M is about 700
shapes: run a few families per command). Variants per shape: tk_cute W4A16 and
W4A4 through the public `tk_cute.nvfp4.gemm` (its notes column prints the path the dispatch
took, `tk_cute.nvfp4.plan`), tk_cute W4A4 from bf16 activations (`gemm(..., quantize_a=True)`:
the quantize a W4A4 `Linear` pays included), cuBLAS bf16 on the dequantized weights
(`a @ w.t()`, the baseline), cuBLAS fp8 e4m3 (`torch._scaled_mm`, per-tensor scales) and,
optionally, the torch path a user would write (LUT dequantize to bf16, then cuBLAS), and
humming's NVFP4 W4A16 (the public peer, `humming_peer`: in every run where `humming` imports,
checked norm-wise at its first call; `--no-humming` leaves it out). Every tk_cute variant's
first call writes a NaN-poisoned D that is checked element by element against the exact
product (`harness.checked_call`, `tk_cute.testing`'s bound) before it is timed: one outside the
bound is reported and not timed; the run ends with the count of calls checked (exit status 1
where one failed). For M <= 128 also
`tk_cute.nvfp4.gemm(pdl=True)` (back-to-back calls overlap: a chain of decode GEMMs on static
weights) and "speed of light: read W": `kernels/stream_read.py` reading the same weight bytes
(codes and scales) and nothing else; its "vs base" is about the largest speedup over cuBLAS
bf16 a memory-bound NVFP4 kernel can reach in that run. `--paths` adds every other Hopper path
that can take the shape (`gemm(..., path=...)`), side by side. GB/s counts the NVFP4 weight
payload (0.5625 B/element) for every variant; the device-to-device copy bandwidth (read +
write) is measured in the same run. `--plot` draws speedup over cuBLAS bf16 against M, one
panel per (N, K) (`tk_cute.viz.speedup_plot`); `--json` keeps every number. A `--models` run
ends with the real-layer bars (`model_bars`); `--report` prints them, and writes `--plot` and
`--markdown`, from the `--json` files of a run's parts without a GPU.
`--tune` adds small-M tk_cute variants over the tiling (MT MMA row tiles per warp, WN warps
along N, U 128-K steps per trip, ahead: the next trip's weights in flight, cN: a register cap for
N CTAs per SM) and split-K (S warps along K), at 9-128 rows the register-A kernel's grids and
row counts (`_register_a_tuning_variants`), and for M > 128 the tiled register-A kernel's
schedules (`_tiled_tuning_variants`: whole tiles, stream-K, the split tile, few-tiles widths).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import torch

from tk_cute.bench import humming_peer
from tk_cute.bench.harness import (
    HEADER,
    bench,
    checked_call,
    environment,
    host_overhead,
    input_sets,
    row,
)

DEFAULT_M = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096]
DEFAULT_NK = ["8192,8192", "28672,8192", "8192,28672"]
# The odd rows a user meets first (issue 19's table): just above the register-A kernel's 128
# rows, ragged M, a partial weight band (gpt-oss's N = K = 2880), K % 32 != 0
DEFAULT_SHAPES = ["129,8192,8192", "200,8192,8192", "1000,8192,8192", "4000,8192,8192",
                  "100,8192,8192", "16,8192,8208", "200,4000,8192", "128,2880,2880"]
# The linear layers of public model families (W: N x K; q/k/v and gate/up fused as serving
# stacks run them), from each model's config.json on Hugging Face: hidden size, intermediate
# size, attention heads, KV heads, head dim (`python -m tk_cute.bench nvfp4 --models`).
MODEL_LAYERS = {
    # meta-llama/Meta-Llama-3-8B (hidden 4096, intermediate 14336, 32 heads, 8 KV, head 128);
    # mistralai/Mistral-7B-v0.1 has the same shapes
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                  ("down", 4096, 14336)],
    # meta-llama/Meta-Llama-3-70B (8192, 28672, 64 heads, 8 KV, head 128)
    "llama3-70b": [("qkv", 10240, 8192), ("o", 8192, 8192), ("gate_up", 57344, 8192),
                   ("down", 8192, 28672)],
    # Qwen/Qwen2.5-7B (3584, 18944, 28 heads, 4 KV, head 128)
    "qwen2.5-7b": [("qkv", 4608, 3584), ("o", 3584, 3584), ("gate_up", 37888, 3584),
                   ("down", 3584, 18944)],
    # Qwen/Qwen2.5-72B (8192, 29568, 64 heads, 8 KV, head 128)
    "qwen2.5-72b": [("qkv", 10240, 8192), ("o", 8192, 8192), ("gate_up", 59136, 8192),
                    ("down", 8192, 29568)],
    # openai/gpt-oss-20b and -120b (hidden 2880, 64 heads of 64, 8 KV; experts 2880 wide)
    "gpt-oss": [("qkv", 5120, 2880), ("o", 2880, 4096), ("expert gate_up", 5760, 2880),
                ("expert down", 2880, 2880)],
    # deepseek-ai/DeepSeek-V3 (hidden 7168; dense MLP 18432, experts 2048; MLA q_lora 1536,
    # kv_lora 512, 128 heads, nope 128 + rope 64, v 128)
    "deepseek-v3": [("q_a", 1536, 7168), ("q_b", 24576, 1536), ("kv_a", 576, 7168),
                    ("kv_b", 32768, 512), ("o", 7168, 16384), ("dense gate_up", 36864, 7168),
                    ("dense down", 7168, 18432), ("expert gate_up", 4096, 7168),
                    ("expert down", 7168, 2048)],
}
MODEL_M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
BASELINE = "cuBLAS bf16 (deq W)"
SPEED_OF_LIGHT = "speed of light: read W"
HUMMING = "humming NVFP4 w4a16"  # the public peer (`humming_peer`), where humming imports
# W4A4 as a bf16 model runs it: the activations' quantize included (in the GEMM kernel where
# `tuning.sm90.quantize_in_gemm` plans it, else its own launch first)
W4A4_FROM_BF16 = "tk_cute w4a4 from bf16"


def _dequant_torch(b) -> torch.Tensor:
    """What a user writes: E2M1 lookup, UE4M3 scales, one bf16 tensor (N, K)."""
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       device=b.data.device, dtype=torch.float32)
    codes = torch.stack((b.data & 15, b.data >> 4), dim=-1).reshape(b.M, b.K)
    sf = b.scales_logical().view(torch.float8_e4m3fn).float()
    w = lut[codes.long()] * sf.repeat_interleave(16, dim=-1) * b.global_scale
    return w.bfloat16()


def _make(M, N, K, humming: bool = False):
    """One input set: fresh weights b (NVFP4) and activations in every variant's form; with
    `humming`, humming's layer on the same weights (an exception where it cannot take them,
    raised by the variant's first call)."""
    from tk_cute.nvfp4 import quantize

    b = quantize(torch.randn(N, K, device="cuda") * 0.02)
    a = torch.randn(M, K, device="cuda").bfloat16()
    w = b.dequantize(torch.bfloat16)
    sw = (w.float().abs().amax() / 448).reshape(())
    sa = (a.float().abs().amax() / 448).reshape(())
    m16 = -(-M // 16) * 16  # cuBLASLt fp8 wants M % 16 == 0: pad (the rows cost no weight bytes)
    k16 = -(-K // 16) * 16
    a8 = torch.zeros(m16, k16, device="cuda", dtype=torch.float8_e4m3fn)
    a8[:M, :K] = (a.float() / sa).to(torch.float8_e4m3fn)
    n16 = -(-N // 16) * 16
    w8 = torch.zeros(n16, k16, device="cuda", dtype=torch.float8_e4m3fn)
    w8[:N, :K] = (w.float() / sw).to(torch.float8_e4m3fn)
    s = dict(a=a, aq=quantize(a), b=b, w=w, w8=w8, a8=a8, sa=sa.float(), sw=sw.float())
    if humming:
        try:
            s["humming"] = humming_peer.HummingNVFP4(b, M)
        except Exception as e:  # noqa: BLE001 - reported by the variant's first call
            s["humming"] = e
    return s


def _humming(s):
    peer = s["humming"]
    if isinstance(peer, Exception):
        raise peer
    return peer(s["a"])


def _activations(name: str) -> str:
    """The input set's key of the activations a tk_cute variant's D is checked against: NVFP4
    ("aq") for the W4A4 variants (from bf16 too: bit for bit its quantize's), else bf16."""
    return "aq" if "w4a4" in name else "a"


def _variants(M, N, K, paths: bool, tune: bool, sms: int, out=torch.bfloat16,
              humming: bool = False):
    """The timed variants of one shape and, for the tk_cute ones, (operand key, forced path) to
    name the path taken; `out`: tk_cute's output dtype (the peers write bfloat16); `humming`:
    the humming peer (input sets made with it)."""
    from tk_cute import nvfp4
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
    from tk_cute.tuning import sm90 as sm90_tuning

    v = {
        "tk_cute w4a16": lambda s, d=None: nvfp4.gemm(s["a"], s["b"], out, out=d),
        "tk_cute w4a4": lambda s, d=None: nvfp4.gemm(s["aq"], s["b"], out, out=d),
        W4A4_FROM_BF16: lambda s, d=None: nvfp4.gemm(s["a"], s["b"], out, out=d,
                                                     quantize_a=True),
        BASELINE: lambda s: s["a"] @ s["w"].t(),
        "cuBLAS fp8 _scaled_mm": lambda s: torch._scaled_mm(
            s["a8"], s["w8"].t(), scale_a=s["sa"], scale_b=s["sw"], out_dtype=torch.bfloat16),
        "torch deq + matmul": lambda s: s["a"] @ _dequant_torch(s["b"]).t(),
    }
    notes = {"tk_cute w4a16": ("a", None), "tk_cute w4a4": ("aq", None)}
    if humming:
        v[HUMMING] = _humming
    if M <= 128:  # the memory-bound regime
        from tk_cute.bench.stream_read import stream_read

        v["tk_cute w4a16 pdl"] = lambda s, d=None: nvfp4.gemm(s["a"], s["b"], out, out=d,
                                                             pdl=True)
        notes["tk_cute w4a16 pdl"] = ("a", None)
        v[SPEED_OF_LIGHT] = lambda s: stream_read(s["b"].data_padded, s["b"].scales)
    if paths:
        for path in sm90_tuning.PATHS:
            for kind, key in (("w4a16", "a"), ("w4a4", "aq")):
                name = f"tk_cute {kind} path={path}"
                v[name] = lambda s, d=None, p=path, k=key: nvfp4.gemm(s[k], s["b"], out,
                                                                      out=d, path=p)
                notes[name] = (key, path)
        if N % 8 == 0:  # W4A4 "dequantize" in two launches (not `tuning.sm90.DEQUANTIZE_PAIRED`)
            from tk_cute.nvfp4 import launch

            v["tk_cute w4a4 path=dequantize two launches"] = lambda s, d=None: launch.dequantize(
                s["aq"], s["b"], torch.empty(M, N, dtype=out, device="cuda") if d is None else d,
                paired=False)
    if tune and M <= 64:
        v.update(_tuning_variants(M, N, K, sms))
    if tune and sm90_tuning.RS_MIN_M <= M and rs.supports(M, N, K):
        v.update(_register_a_tuning_variants(M, N, K, sms))
    if tune and M >= sm90_tuning.SPLIT_TILE_MIN_M:
        v.update(_tiled_tuning_variants(M, N, K, sms))
    return v, notes


def _register_a_tuning_variants(M, N, K, sms):
    """The register-A kernel beside the dispatch's pick (docs/facts.md#rs-grid): its planned
    Config on one CTA per SM and on up to four grids whose shares line up with the row blocks
    (`rounds.aligned`, from a third of the SMs; the plan's own is `sm90_tuning.register_a_ctas`),
    with the cluster sum (`CLUSTER` CTAs per row block, 2, 4 or 8, where they fit the SMs), and
    with the other row count (128 / 256 weight rows per CTA) on its planned grid where N and
    the shared memory allow."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
    from tk_cute.nvfp4 import launch
    from tk_cute.ops.cluster import PORTABLE_SIZES
    from tk_cute.tuning import rounds
    from tk_cute.tuning import sm90 as sm90_tuning

    pick = sm90_tuning.register_a_config(M, N, K)
    units, stages = rs.stream_units(pick, N, K), rs.k_stages(pick, K)
    full = min(sms, units)
    grids = [full] + [c for c in range(full - 1, sms // 3, -1)
                      if rounds.aligned(units, stages, c)][:4]
    v = {f"tk_cute w4a16 register_a ROWS={pick.ROWS} ctas={c}": (
        lambda s, d=None, c=c: launch.gemm_rs(s["a"], s["b"], out=d, config=pick, ctas=c))
        for c in grids}
    for c in PORTABLE_SIZES[1:]:  # the cluster sum (`rs.Config.CLUSTER`) where its grid fits
        if rs.row_blocks(pick, N) * c <= sms and stages >= c:
            v[f"tk_cute w4a16 register_a CLUSTER={c}"] = (
                lambda s, d=None, c=c: launch.gemm_rs(s["a"], s["b"], out=d,
                                                      config=dataclasses.replace(pick, CLUSTER=c)))
    rows = 3 * rs.BAND - pick.ROWS  # 128 <-> 256
    if rows == rs.BAND or N % rows == 0:
        try:
            other = dataclasses.replace(pick, ROWS=rows, TILES=1, N_TAIL=N % rows != 0)
        except ValueError:  # (a ring of two stages does not fit)
            return v
        v[f"tk_cute w4a16 register_a ROWS={rows}"] = (
            lambda s, d=None: launch.gemm_rs(s["a"], s["b"], out=d, config=other))
    return v


def _tiled_tuning_variants(M, N, K, sms):
    """The tiled register-A kernel beside the dispatch's pick: whole tiles of 128 and 256 rows,
    stream-K shares at 192 and 256, up to 256 rows the split tile (one activation tile as wide
    as M split into K parts, `sm90_tuning.split_tile_width`), the few-tiles width (as many
    activation tiles per weight band as one round holds, `sm90_tuning.few_tiles_width`), and
    where the dispatch's schedule is stream-K, that schedule with one head adding the parts,
    with 16-byte partials (`rst.Config.PARTIAL_V4`) and as
    teams (`TEAMS`) where two parts per tile or more fit (`sm90_tuning.stream_k_team`), each way
    whatever the dispatch picked; on few weight bands (`sm90_tuning.few_bands`) 64-wide whole
    tiles and stream-K teams of 64- and 128-wide tiles."""
    from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst
    from tk_cute.nvfp4 import launch
    from tk_cute.tuning import sm90 as sm90_tuning

    tails = dict(K_TAIL=K % rst.STAGE_K != 0, N_TAIL=N % rst.ROWS != 0)
    configs = {"Nb=128": rst.Config(Nb=128, **tails),
               "Nb=256": rst.Config(Nb=256, **tails),
               "Nb=192 stream-K": rst.Config(Nb=192, STREAM_K=True, **tails),
               "Nb=256 stream-K": rst.Config(Nb=256, STREAM_K=True, **tails)}
    if M <= rst.NBS[-1]:
        nb = sm90_tuning.split_tile_width(M)
        configs[f"Nb={nb} stream-K"] = rst.Config(Nb=nb, STREAM_K=True, **tails)
    few = sm90_tuning.few_tiles_width(M, N, sms)
    if few is not None:
        two = few <= sm90_tuning.TILED_TWO_SETS_MAX_NB and K >= sm90_tuning.TILED_TWO_SETS_MIN_K
        configs[f"Nb={few} few tiles"] = rst.Config(Nb=few, A_SETS=2 if two else 1, **tails)
    if sm90_tuning.few_bands(M, N, sms):  # the few-bands candidates (docs/facts.md#few-bands)
        configs["Nb=64"] = rst.Config(Nb=64, **tails)
        for nb in (64, 128):
            c = rst.Config(Nb=nb, STREAM_K=True, TEAMS=True, PARTIAL_V4=True, **tails)
            if sm90_tuning.stream_k_team(M, N, K, c, sms) >= 2:
                configs[f"Nb={nb} stream-K teams v4"] = c
    pick = sm90_tuning.register_a_tiled_config(M, N, K, "bfloat16", sms)
    if pick.STREAM_K:  # the dispatch's schedule, its partials as 16-byte vectors, and teams
        team = sm90_tuning.stream_k_team(M, N, K, pick, sms)
        plain = dataclasses.replace(pick, TEAMS=False, PARTIAL_V4=False)
        if plain not in configs.values():
            configs[f"Nb={pick.Nb} stream-K head takes all"] = plain
        configs[f"Nb={pick.Nb} stream-K v4 partials"] = dataclasses.replace(plain, PARTIAL_V4=True)
        if team:
            configs[f"Nb={pick.Nb} stream-K teams of {team}"] = dataclasses.replace(
                plain, TEAMS=True)
            configs[f"Nb={pick.Nb} stream-K teams of {team} v4"] = dataclasses.replace(
                plain, TEAMS=True, PARTIAL_V4=True)
    first = {}  # each Config once, under its first name
    for name, cfg in configs.items():
        first.setdefault(cfg, name)
    return {f"tk_cute w4a16 tiled {name}": (
        lambda s, d=None, c=cfg: launch.gemm_rs_tiled(s["a"], s["b"], out=d, config=c))
        for cfg, name in first.items()}


def _tuning_variants(M, N, K, sms):
    from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv
    from tk_cute.nvfp4 import launch
    from tk_cute.tuning import sm90 as sm90_tuning

    base = sm90_tuning.small_m_config(M, N, K, clusters=False)  # one CTA per row block
    plain = dict(AHEAD=False, MIN_CTAS=0)
    tilings = [dict(UNROLL=2, **plain), dict(UNROLL=4, **plain),
               dict(UNROLL=2, AHEAD=True, MIN_CTAS=2), dict(WN=2, UNROLL=4, **plain),
               dict(MT=1, WN=2, UNROLL=4, **plain), dict(MT=4, UNROLL=1, **plain)]
    v = {}
    if sm90_tuning.small_m_config(M, N, K).CLUSTER > 1:  # the plan without its cluster split
        v["tk_cute w4a16 one CTA per row block"] = (
            lambda s, d=None: launch.gemm_small_m(s["a"], s["b"], out=d, config=base))
    for tiling in tilings:
        unroll = tiling["UNROLL"]  # (REST, K_TAIL and the L2 fetch follow the trip's steps)
        cfg = dataclasses.replace(base, S=1, **tiling, **sm90_tuning.small_m_k_fields(K, unroll),
                                  L2_FETCH=sm90_tuning.l2_fetch(base.NT, unroll, K))
        if N % cfg.rows or K % cfg.k_chunk not in (0, gv.TAIL_K if cfg.K_TAIL else 0):
            continue
        kind = f"MT{cfg.MT} WN{cfg.WN} U{cfg.UNROLL}" + (" ahead" if cfg.AHEAD else "") + (
            f" c{cfg.MIN_CTAS}" if cfg.MIN_CTAS else "")
        for S in sorted({sm90_tuning.small_m_splits(cfg, N, K, sms, per_sm)
                         for per_sm in (1, 2, 4)}):
            v[f"tk_cute w4a16 {kind} S{S}"] = (
                lambda s, d=None, c=dataclasses.replace(cfg, S=S): launch.gemm_small_m(
                    s["a"], s["b"], out=d, config=c))
    return v


def copy_bandwidth(nbytes: int = 1 << 30, rounds: int = 10) -> float:
    """Device-to-device copy, GB/s counting read + write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    r = bench({"copy": lambda _: dst.copy_(src)}, [None], rounds=rounds)["copy"]
    return 2 * nbytes / r.ms / 1e6


def model_shapes(families, ms) -> list[tuple[int, int, int]]:
    """Every layer of `families` (`MODEL_LAYERS` keys; empty: all) at every M of `ms`, each
    (N, K) once."""
    unknown = set(families) - set(MODEL_LAYERS)
    if unknown:
        raise SystemExit(f"--models takes {', '.join(MODEL_LAYERS)}; got {sorted(unknown)}")
    nks = dict.fromkeys((N, K) for f in (families or MODEL_LAYERS) for _, N, K in MODEL_LAYERS[f])
    return [(M, N, K) for N, K in nks for M in ms]


def shapes(ms, nks, extra) -> list[tuple[int, int, int]]:
    """The (M, N, K) list: every M x (N, K), then the explicit shapes."""
    out = [(M, *map(int, nk.split(","))) for nk in nks for M in ms]
    return out + [tuple(map(int, s.split(","))) for s in extra]


def extra_shapes(args) -> list[str]:
    """`--shapes`, or with no shape option given the issue rows (`DEFAULT_SHAPES`)."""
    if args.shapes is not None:
        return args.shapes
    return DEFAULT_SHAPES if (args.m, args.nk) == (DEFAULT_M, DEFAULT_NK) else []


def _parser():
    p = argparse.ArgumentParser(prog="python -m tk_cute.bench nvfp4",
                                description="NVFP4 GEMM against cuBLAS bf16 / fp8 on Hopper.")
    p.add_argument("--m", type=int, nargs="+", default=DEFAULT_M, help="rows of A")
    p.add_argument("--nk", nargs="+", default=DEFAULT_NK, help="N,K pairs")
    p.add_argument("--shapes", nargs="*", default=None,
                   help="extra M,N,K shapes (default: DEFAULT_SHAPES where --m and --nk are "
                        "left at theirs, else none)")
    p.add_argument("--models", nargs="*", default=None, metavar="FAMILY",
                   help=f"the linear layers of these model families ({', '.join(MODEL_LAYERS)}; "
                        f"none named: all) at every M of --m (default here: {MODEL_M}), in "
                        f"place of the --nk grid; --plot then writes one file per family")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--paths", action="store_true", help="every Hopper path that takes a shape")
    p.add_argument("--tune", action="store_true",
                   help="small-M tiling / split-K, register-A grids / rows, tiled schedules")
    p.add_argument("--torch-deq", action="store_true", help="add the (slow) torch LUT path")
    p.add_argument("--no-humming", action="store_true",
                   help="leave out the humming peer (default: in every run where it imports)")
    p.add_argument("--out-dtype", choices=("bfloat16", "float16", "float32"),
                   default="bfloat16", help="tk_cute's output dtype (the peers write bf16)")
    p.add_argument("--plot", help="write speedup-vs-M panels to this PNG/SVG file")
    p.add_argument("--json", help="write every result to this JSON file")
    p.add_argument("--markdown", help="write the results as docs/performance.md's table (with "
                                      "the command, environment and --commit) to this file")
    p.add_argument("--commit", default=None, help="the commit measured (default: git HEAD)")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="no GPU: read these --json files (one run's parts), print the real-layer "
                        "bars (`model_bars`) and write --plot / --markdown from them")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.report:
        return report(args, argv)
    from tk_cute import nvfp4
    from tk_cute.testing import exact

    env = environment()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(env)
    print(f"device-to-device copy: {copy_bandwidth():.0f} GB/s (read + write, 1 GiB)")
    print("timing: CUDA graph replay, cold L2 (rotating input sets); GB/s = 0.5625 B x N x K")
    why_not = "--no-humming" if args.no_humming else humming_peer.unavailable()
    print(f"humming peer: {'off (' + why_not + ')' if why_not else 'on'}")
    print(HEADER)
    results, out = [], getattr(torch, args.out_dtype)
    checked, wrong = [], []  # tk_cute variants whose D was checked; those outside the bound
    if args.models is not None:
        ms = MODEL_M if args.m == DEFAULT_M else args.m
        todo = model_shapes(args.models, ms) + shapes([], [], args.shapes or [])
    else:
        todo = shapes(args.m, args.nk, extra_shapes(args))
    for M, N, K in todo:
        sets = input_sets(lambda: _make(M, N, K, humming=not why_not),
                          N * K * 9 // 16 + M * K * 2)
        variants, notes = _variants(M, N, K, args.paths, args.tune, sms, out, not why_not)
        if not args.torch_deq:
            variants.pop("torch deq + matmul")
        path_of, s = {}, sets[0]
        # the operands decoded once for every variant's check (float64, exactly)
        ops = {key: exact(s[key]) for key in ("a", "aq", "b")}
        for name in list(variants):
            try:
                if name.startswith("tk_cute"):  # D checked element by element
                    checked_call(variants[name], s, (M, N), out, ops[_activations(name)],
                                 ops["b"], f"{name} {M}x{N}x{K}")
                    checked.append(name)
                else:
                    got = variants[name](s)
                    if name == HUMMING:
                        humming_peer.check(got, s["a"], s["b"])
                if name in notes:
                    key, forced = notes[name]
                    path_of[name] = str(nvfp4.plan(s[key], s["b"], out, path=forced))
            except Exception as e:  # noqa: BLE001 - report and keep the others
                if isinstance(e, AssertionError) and name.startswith("tk_cute"):
                    wrong.append(f"{name} {M}x{N}x{K}")
                if (not name.startswith("tk_cute w4") or "path=" not in name
                        or isinstance(e, AssertionError)):
                    print(f"| {name:<28} | {M}x{N}x{K} | failed: {type(e).__name__}: {e}")
                variants.pop(name)
        res = bench(variants, sets, rounds=args.rounds, graph=True)
        base = res.get(BASELINE)
        shape = f"{M}x{N}x{K}"
        for name, r in res.items():
            note = f"spread {r.spread:.0%}" + (f"; {path_of[name]}" if name in path_of else "")
            print(row(name, shape, r.ms, 2 * M * N * K, N * K * 0.5625,
                      base.ms if base else None, note), flush=True)
            results.append(dict(variant=name, M=M, N=N, K=K, us=r.ms * 1e3, spread=r.spread,
                                path=path_of.get(name), speedup=base.ms / r.ms if base else None,
                                checked=name.startswith("tk_cute")))
        del sets, s, ops
        torch.cuda.empty_cache()
        if args.json:  # after every shape: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"environment": env, "results": results}, f, indent=1)
    s = _make(16, 8192, 8192)
    us = host_overhead(lambda s: nvfp4.gemm(s["a"], s["b"]), s)
    print(f"host overhead per eager tk_cute.nvfp4.gemm call (16x8192x8192): {us:.1f} us")
    if args.models is not None:
        print("\n".join(model_bars(results)))
    print(f"tk_cute outputs checked element by element: {len(checked)} calls, "
          f"{len(wrong)} outside the bound" + (": " + ", ".join(wrong) if wrong else ""))
    _write(args, argv, results, env)
    return 1 if wrong else 0


def _write(args, argv, results: list[dict], env: str) -> None:
    """--plot and --markdown from a run's (or `report`'s) results."""
    if args.plot:
        _plot(results, args.plot, args.models)
    if args.markdown:
        command = "python -m tk_cute.bench nvfp4 " + " ".join(argv or sys.argv[1:])
        with open(args.markdown, "w") as f:
            f.write(markdown(results, env, command.strip(), args.commit or _git_head()))
        print(f"markdown: {args.markdown}")


def report(args, argv) -> int:
    """`--report`: the results of --json files (the parts of one run: the first one's
    environment is printed) as the bars, plots and table a run would give; no GPU."""
    results, envs = [], []
    for path in args.report:
        with open(path) as f:
            data = json.load(f)
        results += data["results"]
        envs.append(data["environment"])
    print(envs[0])
    print("\n".join(model_bars(results)))
    _write(args, argv, results, envs[0])
    return 0


def model_bars(results: list[dict]) -> list[str]:
    """The real-layer bars of a run's results (`--json`'s rows), one line each: W4A16 at M <=
    16 against the weight read's speed of light (the fraction of it reached, bar 0.85); W4A16
    and W4A4 against humming's W4A16 where it ran (bar: at or above); both at M <= 64 against
    cuBLAS bf16 (bar 1.0x); the geometric mean of their speedups at M >= 256 (bar 0.95x).
    Each line gives how many shapes miss the bar and the worst."""
    by: dict = {}
    for r in results:
        by.setdefault((r["M"], r["N"], r["K"]), {})[r["variant"]] = r
    tk = ("tk_cute w4a16", "tk_cute w4a4")

    def shape(key):
        return "x".join(map(str, key))

    def misses(title, pairs, bar):
        if not pairs:
            return f"{title}: no shapes"
        low = [(x, key) for x, key in pairs if x < bar]
        x, key = min(pairs)
        return (f"{title}: {len(low)} of {len(pairs)} below {bar}, worst {x:.3f} "
                f"({shape(key)})")

    lines = []
    sol = [(v[SPEED_OF_LIGHT]["us"] / v[tk[0]]["us"], key) for key, v in by.items()
           if key[0] <= 16 and SPEED_OF_LIGHT in v and tk[0] in v]
    lines.append(misses("W4A16 at M <= 16, fraction of the weight read's speed of light", sol,
                        0.85))
    for name in tk:
        hum = [(v[HUMMING]["us"] / v[name]["us"], key) for key, v in by.items()
               if HUMMING in v and name in v]
        lines.append(misses(f"{name[8:]} x humming W4A16", hum, 1.0))
    for name in tk:
        low = [(v[name]["speedup"], key) for key, v in by.items()
               if key[0] <= 64 and name in v and v[name]["speedup"]]
        lines.append(misses(f"{name[8:]} x cuBLAS bf16 at M <= 64", low, 1.0))
    for name in tk:
        big = [(v[name]["speedup"], key) for key, v in by.items()
               if key[0] >= 256 and name in v and v[name]["speedup"]]
        if big:
            mean = statistics.geometric_mean(x for x, _ in big)
            x, key = min(big)
            lines.append(f"{name[8:]} x cuBLAS bf16 at M >= 256: geometric mean {mean:.3f} over "
                         f"{len(big)} shapes (bar 0.95), worst {x:.3f} ({shape(key)})")
    return lines


def _git_head() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def markdown(results: list[dict], env: str, command: str, commit: str) -> str:
    """docs/performance.md's NVFP4 table from a run's results (`--json`'s "results"): per shape
    W4A16 and W4A4 time and speedup over cuBLAS bf16, cuBLAS bf16 time, the weight-read speed
    of light (M <= 128), humming's speedup where it ran, the path; `pdl=True` where it beat the
    plain call by 3% or more."""
    by: dict = {}
    for r in results:
        by.setdefault((r["M"], r["N"], r["K"]), {})[r["variant"]] = r
    lines = [f"`{command}`, commit {commit}. {env}", "",
             ("| M x N x K | W4A16 us | x | W4A4 us | x | cuBLAS bf16 us | read W | humming x "
              "| path |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for (M, N, K), v in by.items():
        a, b, c = v.get("tk_cute w4a16"), v.get("tk_cute w4a4"), v.get(BASELINE)
        if not (a and b and c):
            continue
        sol, pdl = v.get(SPEED_OF_LIGHT), v.get("tk_cute w4a16 pdl")
        path = a["path"] or "-"
        if pdl and pdl["speedup"] >= 1.03 * a["speedup"]:
            path += f" (pdl=True {pdl['speedup']:.3f}x)"
        read_w = f"{sol['speedup']:.3f}" if sol else "-"
        hm = f"{v[HUMMING]['speedup']:.3f}" if HUMMING in v else "-"
        lines.append(f"| {M}x{N}x{K} | {a['us']:.1f} | {a['speedup']:.3f} | {b['us']:.1f} | "
                     f"{b['speedup']:.3f} | {c['us']:.1f} | {read_w} | {hm} | {path} |")
    return "\n".join(lines) + "\n"


def _plot(results: list[dict], path: str, families) -> None:
    """Speedup panels (`viz.speedup_plot`): one file, or with `--models` one per family
    (`path` with the family's name before the suffix)."""
    from pathlib import Path

    from tk_cute import viz

    if families is None:
        viz.speedup_plot(results, baseline=BASELINE).savefig(path, dpi=120)
        print(f"plot: {path}")
        return
    for family in families or MODEL_LAYERS:
        nks = {(N, K) for _, N, K in MODEL_LAYERS[family]}
        rows = [r for r in results if (r["N"], r["K"]) in nks]
        if rows:
            out = Path(path).with_stem(f"{Path(path).stem}_{family}")
            viz.speedup_plot(rows, baseline=BASELINE).savefig(out, dpi=120)
            print(f"plot: {out}")
