# SPDX-License-Identifier: MIT
"""Kernel report: what a tcgen05 NVFP4 GEMM config costs on a target, from a real compile.

`report(cfg, m, n, k)` builds the kernel for `cfg.arch` (no GPU needed) and returns the tile
config, stages, shared / tensor memory, registers, spills, MMA instructions per tile, and a
ROOFLINE MODEL of the expected time (an upper bound on speed from vendor peak figures, not a
measurement). `python -m tk_cute report --arch sm_107a --mnk 16384,16384,16384` prints it.
"""

from __future__ import annotations

import argparse
import dataclasses

# Vendor peak figures (dense NVFP4 FLOP/s, HBM bytes/s); ../shared/reference/rubin.md.
PEAKS = {
    "sm_107a": (35e15, 22e12, "Rubin (VR200): 35 PF NVFP4, 22 TB/s"),
    "sm_100a": (9e15, 8e12, "B200: 9 PF NVFP4, 8 TB/s"),
    "sm_103a": (9e15, 8e12, "B300 modelled with B200 figures: 9 PF NVFP4, 8 TB/s"),
}


def roofline(arch: str, m: int, n: int, k: int) -> dict:
    """MODEL: time = max(2MNK / peak FLOP/s, bytes / peak bandwidth), each operand read once."""
    flops_peak, bw, label = PEAKS[arch]
    flops = 2 * m * n * k
    nbytes = (m + n) * k // 2 + (m + n) * k // 16 + m * n * 2  # FP4 data, UE4M3 scales, bf16 D
    t = max(flops / flops_peak, nbytes / bw)
    return {"model": "roofline (not measured)", "peaks": label, "flops": flops, "bytes": nbytes,
            "intensity_flop_per_byte": flops / nbytes, "bound": "compute"
            if flops / flops_peak >= nbytes / bw else "memory", "time_us": t * 1e6,
            "pflops_at_model_time": flops / t / 1e15}


def report(cfg, m: int, n: int, k: int, build=None) -> dict:
    """Compile `cfg` (a `kernels.gemm.nvfp4_sm100.Config`) and describe it for an (m, n, k) GEMM."""
    from tk_cute.arch import target
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    b, kern = build or K.compile(cfg, m, n, k)
    mma = r"tcgen05\.mma\.cta_group::2\.kind::mxf4nvf4"
    k_tiles = -(-k // cfg.Kb)
    per_stage = b.ptx_count(mma)
    t = target(cfg.arch)
    return {
        "arch": cfg.arch,
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
        "roofline": roofline(cfg.arch, m, n, k),
    }


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
    rf = r["roofline"]
    lines.append(f"  ROOFLINE MODEL ({rf['model']}; {rf['peaks']}): {rf['time_us']:.1f} us, "
                 f"{rf['bound']}-bound, {rf['intensity_flop_per_byte']:.0f} FLOP/B")
    return "\n".join(lines)


def main(argv=None) -> int:
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    p = argparse.ArgumentParser(prog="python -m tk_cute report", description=__doc__)
    p.add_argument("--arch", default="sm_107a", choices=sorted(PEAKS))
    p.add_argument("--mnk", default="16384,16384,16384", help="M,N,K")
    for f in ("Mb", "Nb", "LOAD_PIPE_DEPTH", "ACC_PIPE_DEPTH", "CLUSTER_M", "CLUSTER_N"):
        p.add_argument(f"--{f}", type=int, help="override the heuristic's choice")
    a = p.parse_args(argv)
    m, n, k = (int(x) for x in a.mnk.split(","))
    from tk_cute.nvfp4.dispatch_sm100 import select_config

    cfg = select_config(a.arch, m, n, k)
    over = {f: getattr(a, f) for f in ("Mb", "Nb", "LOAD_PIPE_DEPTH", "ACC_PIPE_DEPTH",
                                       "CLUSTER_M", "CLUSTER_N") if getattr(a, f) is not None}
    if over:
        cfg = dataclasses.replace(cfg, **over)
    print(format_report(report(cfg, m, n, k)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def peer(path: str, arch: str = "sm_100a", m: int = 8192, n: int = 8192, k: int = 8192,
         mma_tiler_mn=(256, 256), cluster_shape_mn=(2, 2)) -> dict:
    """Compile CUTLASS's `dense_blockscaled_gemm_persistent.py` (path given, never vendored).

    Same problem, NVFP4 with UE4M3 scales, bf16 out; returns the numbers the side-by-side
    table in docs/rubin.md records.
    """
    import importlib.util
    import re

    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import OperandMajorMode
    from cutlass.cute.runtime import make_ptr
    from cutlass.tensor_utils import LayoutEnum

    from tk_cute.arch import target
    from tk_cute.compile import build

    spec = importlib.util.spec_from_file_location("tk_cute_peer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kern = mod.Sm100BlockScaledPersistentDenseGemmKernel(16, mma_tiler_mn, cluster_shape_mn)
    ptr = lambda dt, al: make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=al)
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
            "tmem_columns": kern.num_tmem_alloc_cols, "compile_seconds": b.compile_seconds}
