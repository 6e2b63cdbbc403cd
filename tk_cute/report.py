# SPDX-License-Identifier: MIT
"""Kernel report: what a tcgen05 NVFP4 GEMM config costs on a target, from a real compile.

`report(cfg, m, n, k)` builds the kernel for `cfg.arch` (no GPU needed) and returns the tile
config, stages, shared / tensor memory, registers, spills, MMA instructions per tile, and a
ROOFLINE MODEL of the expected time (an upper bound on speed from vendor peak figures, not a
measurement). `python -m tk_cute report --arch sm_107a --mnk 16384,16384,16384` prints it, with the config the
dispatch picks for that shape (`tk_cute.tuning.sm100.w4a4_config`) and the cost MODEL's
estimate behind the pick (`tuning.sm100.estimate`);
`--out nvfp4` reports the kernel with its fused NVFP4-output epilogue (D written as 0.5625 bytes
per element: codes and UE4M3 scales).
The result is a `Report` (a dict): its repr is one line, its `_repr_html_` a table, and
`tk_cute.viz.roofline_plot` draws it against the roof `attainable(arch, intensity)`.
"""

from __future__ import annotations

import argparse
import dataclasses

from tk_cute.tuning import sm100 as sm100_tuning

# Vendor peak figures (dense NVFP4 FLOP/s, HBM bytes/s, label): `tuning.sm100.PEAKS`' own.
PEAKS = {arch: (fp4, hbm, label) for arch, (fp4, _, hbm, label) in sm100_tuning.PEAKS.items()}


def attainable(arch: str, intensity):
    """MODEL: the roof, min(peak FLOP/s, intensity x peak bytes/s), at FLOP/byte `intensity`
    (a number or a numpy array)."""
    import numpy as np

    flops_peak, bw, _ = PEAKS[arch]
    return np.minimum(flops_peak, np.asarray(intensity, dtype=float) * bw)


def ridge(arch: str) -> float:
    """FLOP per byte where the roof turns: peak FLOP/s / peak bytes/s."""
    flops_peak, bw, _ = PEAKS[arch]
    return flops_peak / bw


# Bytes written per element of D: 16-bit outputs, or NVFP4 (half a byte of code plus one UE4M3
# scale byte per 16 elements)
D_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "nvfp4": 0.5 + 1 / 16}


def roofline(arch: str, m: int, n: int, k: int, out: str = "bfloat16") -> dict:
    """MODEL: time = max(2MNK / peak FLOP/s, bytes / peak bandwidth), each operand read once,
    D written once as `out` (`D_BYTES`: 2 B per element for bf16 / fp16, 4 for fp32, 0.5625
    for NVFP4)."""
    if out not in D_BYTES:
        raise ValueError(f"out must be one of {list(D_BYTES)}, got {out!r}")
    flops_peak, bw, label = PEAKS[arch]
    flops = 2 * m * n * k
    d_bytes = m * n * D_BYTES[out]
    nbytes = (m + n) * k // 2 + (m + n) * k // 16 + d_bytes  # FP4 data, UE4M3 scales, D
    t = max(flops / flops_peak, nbytes / bw)
    return {"model": "roofline (not measured)", "peaks": label, "flops": flops, "bytes": nbytes,
            "intensity_flop_per_byte": flops / nbytes, "bound": "compute"
            if flops / flops_peak >= nbytes / bw else "memory", "time_us": t * 1e6,
            "pflops_at_model_time": flops / t / 1e15}


def check_shape(m: int, n: int, k: int, out: str = "bfloat16") -> None:
    """Raise ValueError unless the NVFP4 GEMM runs an (m, n, k) problem with D of type `out`
    (`dispatch_sm100.supports`: what `tk_cute.nvfp4.gemm` takes on these targets)."""
    from tk_cute.nvfp4 import dispatch_sm100

    if not dispatch_sm100.supports(m, n, k, out):
        raise ValueError(f"the NVFP4 GEMM needs M, N >= 1 and K % 16 == 0 (N % 16 == 0 for "
                         f"out nvfp4); got M={m}, N={n}, K={k}, out {out}")


def report(cfg, m: int, n: int, k: int, build=None) -> dict:
    """Compile `cfg` (a `kernels.gemm.nvfp4_sm100.Config`) and describe it for an (m, n, k) GEMM.

    Raises:
        ValueError: a shape the NVFP4 GEMM does not run (`check_shape`), before compiling.
    """
    from tk_cute.arch import target
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    check_shape(m, n, k, cfg.out)
    b, kern = build or K.compile(cfg, m, n, k)
    mma = r"tcgen05\.mma\.cta_group::2\.kind::mxf4nvf4"
    k_tiles = -(-k // cfg.Kb)
    per_stage = b.ptx_count(mma)
    t = target(cfg.arch)
    epilogue = {"out": cfg.out,
                "tmem_loads": b.ptx_count(r"tcgen05\.ld\.sync"),
                "reducing_tmem_loads": b.ptx_count(r"tcgen05\.ld\.red"),
                "tma_stores": b.ptx_count(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared")}
    if cfg.nvfp4_out:
        epilogue.update(e2m1_cvt=b.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2\.f32"),
                        code_stores=b.ptx_count(r"st\.global\.v2\.b32"),
                        scale_stores=b.ptx_count(r"st\.global\.u8"))
    return Report({
        "arch": cfg.arch,
        "mnk": (m, n, k),
        "config": dataclasses.asdict(cfg),
        "tile_per_pair": f"{cfg.Mb}x{cfg.Nb}x{cfg.Kb}",
        "mma_instruction": f"256x{cfg.Nb}x{cfg.mma_k} cta_group::2 kind::mxf4nvf4 block16",
        "mma_instructions_per_stage": per_stage,
        "mma_instructions_per_tile": per_stage * k_tiles,
        "smem_bytes": kern.traced["smem_bytes"],
        "smem_capacity": t.smem_bytes,
        "tmem_columns": cfg.tmem_columns_used,
        "tmem_capacity": t.tmem_columns,
        "tmem_exclusive": b.ptx_count(r"tcgen05\.alloc\.exclusive") > 0,
        "registers": b.kernel.registers,
        "spill_bytes": b.kernel.local_bytes,
        "compile_seconds": round(b.compile_seconds, 2),
        "epilogue": epilogue,
        "roofline": roofline(cfg.arch, m, n, k, cfg.out),
        "pick": sm100_tuning.describe(cfg),
        "estimate": sm100_tuning.estimate(cfg, m, n, k),
    })


class Report(dict):
    """What `report` returns: a plain dict of the figures, shown briefly (one line; a table in
    a notebook). `format_report` gives the full text."""

    def __repr__(self) -> str:
        rf = self["roofline"]
        return (f"<Report NVFP4 GEMM {'x'.join(map(str, self['mnk']))} on {self['arch']}: tile "
                f"{self['tile_per_pair']}, {self['registers']} registers, {self['spill_bytes']} "
                f"spill bytes, smem {self['smem_bytes']:,}/{self['smem_capacity']:,} B, TMEM "
                f"{self['tmem_columns']}/{self['tmem_capacity']} columns; roofline MODEL "
                f"{rf['time_us']:.1f} us ({rf['bound']}-bound)>")

    def _repr_html_(self) -> str:
        from tk_cute.compile import _html_table

        c, rf = self["config"], self["roofline"]
        rows = [["target", self["arch"]], ["problem M x N x K", "x".join(map(str, self["mnk"]))],
                ["tile per CTA pair", self["tile_per_pair"]],
                ["MMA instruction", self["mma_instruction"]],
                ["MMAs per stage / per tile", f"{self['mma_instructions_per_stage']} / "
                                              f"{self['mma_instructions_per_tile']}"],
                ["stages (load / acc / epilogue)", f"{c['LOAD_PIPE_DEPTH']} / "
                 f"{c['ACC_PIPE_DEPTH']} / {c['EPI_PIPE_DEPTH']}"],
                ["cluster, scheduler", f"{c['CLUSTER_M']}x{c['CLUSTER_N']}, {c['scheduler']}"],
                ["registers, spill bytes", f"{self['registers']}, {self['spill_bytes']}"],
                ["shared memory (bytes)", f"{self['smem_bytes']:,} / {self['smem_capacity']:,}"],
                ["tensor memory (columns)", f"{self['tmem_columns']} / {self['tmem_capacity']}"
                 + (" exclusive" if self["tmem_exclusive"] else "")],
                ["roofline MODEL (not measured)", f"{rf['time_us']:.1f} us, {rf['bound']}-bound, "
                 f"{rf['intensity_flop_per_byte']:.0f} FLOP/B, {rf['peaks']}"],
                ["compile seconds", self["compile_seconds"]]]
        return _html_table(["kernel report", ""], rows)


def format_report(r: dict) -> str:
    lines = [f"tk_cute kernel report: NVFP4 GEMM on {r['arch']}"]
    for key in ("tile_per_pair", "mma_instruction", "mma_instructions_per_stage",
                "mma_instructions_per_tile", "registers", "spill_bytes", "compile_seconds"):
        lines.append(f"  {key:28s} {r[key]}")
    c = r["config"]
    lines.append(f"  {'stages (LOAD/ACC/EPI)':28s} {c['LOAD_PIPE_DEPTH']}/{c['ACC_PIPE_DEPTH']}/"
                 f"{c['EPI_PIPE_DEPTH']}  cluster {c['CLUSTER_M']}x{c['CLUSTER_N']}  "
                 f"scheduler {c['scheduler']}  out {c['out']}")
    lines.append(f"  {'shared memory':28s} {r['smem_bytes']} / {r['smem_capacity']} bytes")
    lines.append(f"  {'tensor memory':28s} {r['tmem_columns']} / {r['tmem_capacity']} columns"
                 f"{' (exclusive)' if r['tmem_exclusive'] else ''}")
    epi = r.get("epilogue")
    if epi:
        what = ", ".join(f"{k} {v}" for k, v in epi.items() if k != "out")
        lines.append(f"  {'epilogue (' + epi['out'] + ')':28s} {what} (PTX lines)")
    rf = r["roofline"]
    lines.append(f"  ROOFLINE MODEL ({rf['model']}; {rf['peaks']}): {rf['time_us']:.1f} us, "
                 f"{rf['bound']}-bound, {rf['intensity_flop_per_byte']:.0f} FLOP/B")
    est = r.get("estimate")
    if est:
        terms = ", ".join(f"{t} {est[t + '_us']:.1f}" for t in ("compute", "dram", "load",
                                                                "smem", "fixed"))
        lines.append(f"  config {r['pick']}")
        lines.append(f"  COST MODEL of this config (not measured): {est['time_us']:.1f} us, "
                     f"{est['bound']}-bound ({terms} us; {est['waves']} waves of "
                     f"{est['units']} units, split K {est['splits']})")
    return "\n".join(lines)


def _mnk(text: str) -> tuple[int, int, int]:
    """argparse type of --mnk: three positive integers M,N,K."""
    parts = text.split(",")
    try:
        values = tuple(int(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected M,N,K (three integers), got {text!r}") from None
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected M,N,K of three positive integers, got "
                                         f"{text!r}")
    return values


OVERRIDES = ("Mb", "Nb", "LOAD_PIPE_DEPTH", "ACC_PIPE_DEPTH", "CLUSTER_M", "CLUSTER_N",
             "SPLIT_K")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tk_cute report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="sm_107a", choices=sorted(PEAKS))
    p.add_argument("--mnk", default=(16384, 16384, 16384), type=_mnk, help="M,N,K")
    p.add_argument("--out", default="bfloat16", choices=sorted(D_BYTES),
                   help="D's type (nvfp4: the fused NVFP4-output epilogue)")
    for f in OVERRIDES:
        p.add_argument(f"--{f}", type=int, help="override the heuristic's choice")
    a = p.parse_args(argv)
    m, n, k = a.mnk
    from tk_cute.kernels.gemm.nvfp4_sm100 import ConfigError

    try:
        check_shape(m, n, k, a.out)
    except ValueError as e:
        p.error(str(e))
    try:
        cfg = sm100_tuning.w4a4_config(a.arch, m, n, k, out=a.out)
        over = {f: getattr(a, f) for f in OVERRIDES if getattr(a, f) is not None}
        if over:
            cfg = dataclasses.replace(cfg, **over)
    except (ConfigError, ValueError) as e:
        p.error(f"no kernel config for this request: {e}")
    print(format_report(report(cfg, m, n, k)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def peer(path: str, arch: str = "sm_100a", m: int = 8192, n: int = 8192, k: int = 8192,
         mma_tiler_mn=(256, 256), cluster_shape_mn=(2, 2)) -> dict:
    """Compile CUTLASS's `dense_blockscaled_gemm_persistent.py` (path given, never vendored).

    Same problem, NVFP4 with UE4M3 scales, bf16 out; returns the numbers the side-by-side
    table in docs/rubin.md records, and under "build" the `tk_cute.compile.Build` they were
    read from (not JSON: drop it before dumping the dict).
    """
    import importlib.util
    import re

    import cuda.bindings.driver as cuda
    import cutlass
    from cutlass.cute.nvgpu import OperandMajorMode
    from cutlass.tensor_utils import LayoutEnum

    from tk_cute.arch import target
    from tk_cute.compile import build
    from tk_cute.launcher import placeholder_ptr as ptr

    spec = importlib.util.spec_from_file_location("tk_cute_peer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kern = mod.Sm100BlockScaledPersistentDenseGemmKernel(16, mma_tiler_mn, cluster_shape_mn)
    fp4, sf = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    clusters = (target(arch).sm_count or 148) // (cluster_shape_mn[0] * cluster_shape_mn[1])
    b = build(kern, ptr(fp4, 32), ptr(fp4, 32), ptr(sf, 16), ptr(sf, 16),
              ptr(cutlass.BFloat16, 16), (OperandMajorMode.K, OperandMajorMode.K,
                                          LayoutEnum.ROW_MAJOR),
              (cutlass.Int32(m), cutlass.Int32(n), cutlass.Int32(k), cutlass.Int32(1)),
              clusters, cuda.CUstream(0), arch=arch)
    smem = kern.shared_storage.size_in_bytes()
    src = open(path).read().splitlines()
    code = [l for l in src if l.strip() and not l.strip().startswith("#")]
    shapes = sorted(set(re.findall(r"tcgen05\.mma\S*", b.ptx)))
    return {"source_lines": len(src), "code_lines": len(code), "registers": b.kernel.registers,
            "spill_bytes": b.kernel.local_bytes, "smem_bytes": smem,
            "stages": kern.num_ab_stage, "mma_forms": shapes,
            "mma_per_stage": b.ptx_count(r"tcgen05\.mma"),
            "sass_mma": sorted(set(re.findall(r"UTC\w*MMA\S*", b.sass))),
            "tmem_columns": kern.num_tmem_alloc_cols, "compile_seconds": b.compile_seconds,
            "build": b}


def _load_module(name: str, path: str):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# What FlashInfer's sm107 file imports from outside CuTe DSL: its parent class (the CUTLASS
# Blackwell example, which FlashInfer takes from a wheel that ships the examples), its epilogue
# helpers (pure CuTe DSL) and `flashinfer.utils` (only `next_positive_power_of_2`, for utils.py).
_FI_PARENT = ("nvidia_cutlass_dsl.examples.CuTeDSL.cute.blackwell.kernel.blockscaled_gemm."
              "dense_blockscaled_gemm_persistent")
_FI_EPILOGUE = "flashinfer.gemm.kernels.epilogue_utils"
_FI_UTILS = "flashinfer.gemm.kernels.utils"


def _flashinfer_modules(path: str, parent: str | None, epilogue: str | None):
    """Load FlashInfer's `dense_blockscaled_gemm_sm107.py` from `path` without the flashinfer
    package.

    The parent (CUTLASS `dense_blockscaled_gemm_persistent.py`) and `epilogue_utils.py` are looked
    for next to `path`, then one directory up, unless given. Shim packages live in `sys.modules`
    only while loading; the loaded modules keep their references.
    """
    import os
    import sys
    import types

    def near(fname, given):
        if given:
            return given
        d = os.path.dirname(os.path.abspath(path))
        for cand in (os.path.join(d, fname), os.path.join(os.path.dirname(d), fname)):
            if os.path.exists(cand):
                return cand
        raise FileNotFoundError(f"{fname} (needed by {path}) not found next to it; pass it in")

    parent, epilogue = near("dense_blockscaled_gemm_persistent.py", parent), near(
        "epilogue_utils.py", epilogue)
    names = [_FI_PARENT.rsplit(".", 1)[0].split(".")[:i] for i in range(1, 8)]
    pkgs = [".".join(p) for p in names] + ["flashinfer", "flashinfer.gemm",
                                           "flashinfer.gemm.kernels", "flashinfer.utils"]
    saved = {p: sys.modules.get(p) for p in pkgs + [_FI_PARENT, _FI_EPILOGUE, _FI_UTILS]}
    try:
        for p in pkgs:
            sys.modules[p] = types.ModuleType(p)
            sys.modules[p].__path__ = []
        sys.modules["flashinfer.utils"].next_positive_power_of_2 = (
            lambda x: 1 if x < 1 else 1 << (x - 1).bit_length())
        par = _load_module(_FI_PARENT, parent)
        setattr(sys.modules[_FI_PARENT.rsplit(".", 1)[0]], _FI_PARENT.rsplit(".", 1)[1], par)
        _load_module(_FI_EPILOGUE, epilogue)
        mod = _load_module("tk_cute_peer_flashinfer_sm107", path)
        util_path = os.path.join(os.path.dirname(os.path.abspath(path)), "utils.py")
        utils = (_load_module(_FI_UTILS, util_path)
                 if os.path.exists(util_path) else None)
    finally:
        for p, old in saved.items():
            if old is None:
                sys.modules.pop(p, None)
            else:
                sys.modules[p] = old
    return mod, utils


def flashinfer_untuned_tactic(kernel_cls, utils, m: int, n: int, k: int, sm_count: int):
    """FlashInfer's untuned mm_fp4 choice among its sm107 tactics (`_compute_sm107_tactic_for_m`,
    sm107 half): its own candidate lists, scorer and M bucket, NVFP4 (UE4M3, 16), bf16 out.
    Returns (mma_tiler_mnk, mma_inst_shape, cluster_shape_mn, swap_ab)."""
    import cutlass

    rep_m = min(utils.next_positive_power_of_2(m), utils._M_BUCKETS[-1])
    best, best_score = None, -1.0
    for tile in utils._SM107_MMA_TILER_MN_CANDIDATES:
        inst = (tile[0], tile[1], utils._SM107_MMA_INST_SHAPE_K)
        for cl in utils._SM100_CLUSTER_SHAPE_MN_CANDIDATES:
            if tile[0] == 256 and cl[0] < 2:
                continue
            for swap in ((False, True) if n % 8 == 0 and rep_m % 8 == 0 else (False,)):
                score = utils._score_sm100_mm_fp4_tactic(rep_m, n, k, sm_count, tile, cl, swap)
                km, kn = (n, rep_m) if swap else (rep_m, n)
                if score > best_score and kernel_cls.can_implement(
                        cutlass.Float4E2M1FN, cutlass.Float8E4M3FN, 16, cutlass.BFloat16, tile,
                        inst, cl, km, kn, k, 1, "k", "k", "m" if swap else "n"):
                    best_score = score
                    best = ((*tile, utils._SM107_MMA_TILER_K), inst, cl, swap)
    return best


def peer_flashinfer(path: str, arch: str = "sm_107a", m: int = 8192, n: int = 8192,
                    k: int = 8192, mma_tiler=None, mma_inst_shape=None, cluster_shape_mn=None,
                    prefetch_dist: int | None = 0, parent: str | None = None,
                    epilogue: str | None = None) -> dict:
    """Compile FlashInfer's `flashinfer/gemm/kernels/dense_blockscaled_gemm_sm107.py` (path given,
    never vendored) for the same NVFP4 problem as `peer`; numbers for docs/rubin.md.

    The config defaults to FlashInfer's own untuned choice (`flashinfer_untuned_tactic`, needs its
    `utils.py` next to `path`), prefetch off as in its untuned path; alpha is a fake fp32 tensor.
    """
    import ast
    import re

    import cuda.bindings.driver as cuda
    import cutlass
    from cutlass.cute.nvgpu import OperandMajorMode
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.tensor_utils import LayoutEnum

    from tk_cute.arch import target
    from tk_cute.compile import build
    from tk_cute.launcher import placeholder_ptr as ptr

    mod, utils = _flashinfer_modules(path, parent, epilogue)
    K = mod.Sm107BlockScaledPersistentDenseGemmKernel
    sms = target(arch).sm_count or 148
    chosen = None
    if mma_tiler is None or mma_inst_shape is None or cluster_shape_mn is None:
        if utils is None:
            raise ValueError("pass mma_tiler, mma_inst_shape and cluster_shape_mn (no utils.py)")
        chosen = flashinfer_untuned_tactic(K, utils, m, n, k, sms)
        mma_tiler = mma_tiler or chosen[0]
        mma_inst_shape = mma_inst_shape or chosen[1]
        cluster_shape_mn = cluster_shape_mn or chosen[2]
    kern = K(16, tuple(mma_inst_shape), tuple(mma_tiler), tuple(cluster_shape_mn),
             prefetch_dist=prefetch_dist)
    fp4, sf = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    alpha = make_fake_tensor(cutlass.Float32, (1,), stride=(1,), assumed_align=4)
    b = build(kern, ptr(fp4, 32), ptr(fp4, 32), ptr(sf, 16), ptr(sf, 16),
              ptr(cutlass.BFloat16, 16), alpha,
              (OperandMajorMode.K, OperandMajorMode.K, LayoutEnum.ROW_MAJOR),
              (cutlass.Int32(m), cutlass.Int32(n), cutlass.Int32(k), 1),
              sms // (cluster_shape_mn[0] * cluster_shape_mn[1]), cuda.CUstream(0), arch=arch)
    src_text = open(path).read()
    src = src_text.splitlines()
    code = [l for l in src if l.strip() and not l.strip().startswith("#")]
    (cls,) = [c for c in ast.parse(src_text).body if isinstance(c, ast.ClassDef)
              and c.name == "Sm107BlockScaledPersistentDenseGemmKernel"]
    per_stage = b.ptx_count(r"tcgen05\.mma\.")
    return {"config": {"mma_tiler": tuple(mma_tiler), "mma_inst_shape": tuple(mma_inst_shape),
                       "cluster_shape_mn": tuple(cluster_shape_mn),
                       "prefetch_dist": prefetch_dist, "untuned_choice": chosen},
            "source_lines": len(src), "code_lines": len(code),
            "kernel_class_lines": (cls.lineno, cls.end_lineno),
            "registers": b.kernel.registers, "spill_bytes": b.kernel.local_bytes,
            "smem_bytes": kern.shared_storage.size_in_bytes(),
            "stages": (kern.num_ab_stage, kern.num_acc_stage, kern.num_c_stage),
            "tmem_columns": kern.num_tmem_alloc_cols,
            "tmem_exclusive": b.ptx_count(r"tcgen05\.alloc\.exclusive") > 0,
            "mma_forms": sorted(set(re.findall(r"tcgen05\.mma\S*", b.ptx))),
            "mma_per_stage": per_stage, "mma_per_tile": per_stage * -(-k // mma_tiler[2]),
            "sass_mma": sorted(set(re.findall(r"UTC\w*MMA[\w.]*", b.sass))),
            "sass_b_collector": sorted(set(re.findall(r"\.B_(?:KEEP|REUSE)", b.sass))),
            "early_a_release": b.ptx_count(r"sync_restrict::shared::read::mma::a") > 0,
            "pdl": b.ptx_count(r"griddepcontrol") > 0,
            "clc": b.ptx_count(r"clusterlaunchcontrol") > 0,
            "compile_seconds": b.compile_seconds}
