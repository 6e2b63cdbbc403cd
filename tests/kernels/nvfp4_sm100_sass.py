# SPDX-License-Identifier: MIT
"""The instruction counts and resources of the tcgen05 NVFP4 GEMM, per representative config.

`python tests/kernels/nvfp4_sm100_sass.py` compiles every config of `configs()` (fixed
configs per target: the big-GEMM tile under CLC, static and fp16 out, the double-buffered
256 x 128 tile, the small-M form, Rubin's double-buffered 512 x 128) and writes what `measure`
reads to `data/nvfp4_sm100_sass_baseline.json`. The baseline was taken from the kernel as it
was before the vocabulary rewrite (issue 23), and taken again after the epilogue's TMEM hand-off
fix (`tensor_load_wait`, issue 44), whose whole difference was: one tcgen05.wait::ld (and on
sm_107a one more fence::before_thread_sync) per epilogue load site, ptxas no longer unrolling
the four-step epilogue loop at 512x1024x8192 (LDTM and UTMASTG 4 -> 1, BAR.SYNC 12 -> 6), and
registers -18 .. +1. Taken a third time after split K (a runtime split count: the K loop runs
[k0, k1) of the tile's run), the operand swap, tk_cute's own static and CLC walkers in place of
the wheel's deprecated schedulers, and the `early_release_a` switch's removal: SASS counts
unchanged on every config kept; PTX one more clusterlaunchcontrol.query_cancel.get_first_ctaid
site per coordinate (2 -> 3) under CLC; registers -2 (Rubin's static walks -16); the
small-M configs are new. `test_nvfp4_sm100_equivalence.py` rebuilds the same configs and
compares.

What is counted (static counts of the program text, per full mnemonic with its modifiers):
  sass: MMA (UTC*MMA, and the lines with .B_KEEP / .B_REUSE), TMA (UTMA*), barriers (SYNCS.*,
        UCGABAR*, BAR.*), tensor memory (UTCATOMSWS*, UTCBAR*, UTC*CP*, LDTM*, STTM*);
  ptx:  tcgen05.*, mbarrier.*, cp.async.bulk.*, clusterlaunchcontrol.*, griddepcontrol.*,
        barrier.cluster.*, fence.mbarrier_init*, bar.sync / barrier.sync;
  resources: registers, spill (local) and stack bytes, static shared bytes, the dynamic shared
        memory the kernel's layouts asked for (`traced["smem_bytes"]`) and the one the host code
        launches with (`launch_smem_bytes`), threads, TMEM columns.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import sys
from pathlib import Path

BASELINE = Path(__file__).parent / "data" / "nvfp4_sm100_sass_baseline.json"
ARCHS = ("sm_100a", "sm_103a", "sm_107a")
SHAPES = ((8192, 8192, 8192), (512, 1024, 8192), (16384, 16384, 256))

SASS_CLASSES = {
    "mma": r"^UTC\w*MMA",
    "tma": r"^UTMA",
    "barrier": r"^(SYNCS|UCGABAR|BAR)(\b|_)",
    "tmem": r"^(UTCATOMSWS|UTCBAR|UTC\w*CP|LDTM|STTM)",
}
PTX_CLASSES = {
    "tcgen05": r"^tcgen05\.",
    "mbarrier": r"^mbarrier\.",
    "tma": r"^cp\.async\.bulk\.",
    "clc": r"^clusterlaunchcontrol\.",
    "pdl": r"^griddepcontrol\.",
    "cluster_barrier": r"^(barrier\.cluster\.|fence\.mbarrier_init)",
    "named_barrier": r"^(bar|barrier)\.sync",
}
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*)$")
_PTX_LINE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)")
# cudaLaunchConfig_t: grid, block, dynamicSmemBytes, stream, attrs, numAttrs
_LAUNCH_CONFIG = "struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"


def configs() -> dict[str, object]:
    """name -> Config: fixed configs (not the cost model's picks, which may move): per target
    the big-GEMM tile (Rubin: Mb 512 with the B collector) under CLC, static and with fp16
    out, the double-buffered 256 x 128 tile, and the small-M form (operands swapped, K split
    in 4); Rubin's double-buffered 512 x 128 tile."""
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    out = {}
    for arch in ARCHS:
        mb = 512 if arch == "sm_107a" else 256
        big = K.Config(arch=arch, Mb=mb, Nb=256, ACC_PIPE_DEPTH=1, LOAD_PIPE_DEPTH=5,
                       CLUSTER_N=2, scheduler="clc")
        out[f"{arch}_8192x8192x8192"] = big
        out[f"{arch}_8192x8192x8192_static"] = dataclasses.replace(big, scheduler="static")
        out[f"{arch}_8192x8192x8192_fp16"] = dataclasses.replace(big, out="float16")
        mid = K.Config(arch=arch, Mb=256, Nb=128, ACC_PIPE_DEPTH=2,
                       LOAD_PIPE_DEPTH=8 if arch == "sm_107a" else 7)
        out[f"{arch}_512x1024x8192"] = mid
        out[f"{arch}_small_m_swapped_split"] = dataclasses.replace(
            mid, swap_ab=True, SPLIT_K=4, LOAD_PIPE_DEPTH=6, scheduler="clc")
    out["sm_107a_double_buffered"] = K.Config(arch="sm_107a", Mb=512, Nb=128, ACC_PIPE_DEPTH=2,
                                              LOAD_PIPE_DEPTH=6)
    return out


def _histogram(lines, pattern_line, classes) -> dict[str, dict[str, int]]:
    counts = {c: collections.Counter() for c in classes}
    for line in lines:
        m = pattern_line.match(line.split("//")[0])
        if not m:
            continue
        op = m.group(1).rstrip(".;")
        for c, rx in classes.items():
            if re.search(rx, op):
                counts[c][op] += 1
    return {c: dict(sorted(v.items())) for c, v in counts.items()}


def launch_smem_bytes(build) -> int:
    """The dynamic shared memory the host code launches the kernel with: the constant stored
    into field 2 (`dynamicSmemBytes`) of the `cudaLaunchConfig_t` (what the DSL's allocator
    pass placed, alignment padding included)."""
    lines = str(build.compiled.ir_module).splitlines()
    for i, line in enumerate(lines):
        if "llvm.getelementptr" in line and "[0, 2]" in line and _LAUNCH_CONFIG in line:
            value = re.match(r"\s*llvm\.store (%\w+),", lines[i + 1]).group(1)
            for prev in reversed(lines[:i]):
                m = re.match(rf"\s*{value} = llvm\.mlir\.constant\((\d+) : i64\)", prev)
                if m:
                    return int(m.group(1))
    raise ValueError("no launch configuration with a constant shared-memory size")


def measure(cfg) -> dict:
    """Compile `cfg` (fake pointers, no GPU) and read its counts and resources."""
    from tk_cute.kernels.gemm import nvfp4_sm100 as K
    from tk_cute.types.tt import alloc_columns

    b, kern = K.compile(cfg)
    sass = b.sass.splitlines()
    out = {
        "config": dataclasses.asdict(cfg),
        "sass": _histogram(sass, _SASS_LINE, SASS_CLASSES),
        "ptx": _histogram(b.ptx.splitlines(), _PTX_LINE, PTX_CLASSES),
    }
    out["sass"]["mma_b_keep"] = sum(1 for l in sass if "UTCOMMA" in l and ".B_KEEP" in l)
    out["sass"]["mma_b_reuse"] = sum(1 for l in sass if "UTCOMMA" in l and ".B_REUSE" in l)
    res = b.kernel
    threads = re.search(r"\.reqntid (\d+)", b.ptx)
    out["resources"] = {
        "registers": res.registers,
        "local_bytes": res.local_bytes,
        "stack_bytes": res.stack_bytes,
        "static_shared_bytes": res.static_shared_bytes,
        "dynamic_shared_bytes": kern.traced["smem_bytes"],
        "launch_shared_bytes": launch_smem_bytes(b),
        "threads": int(threads.group(1)),
        "tmem_columns_used": cfg.tmem_columns_used,
        "tmem_alloc_columns": alloc_columns(cfg.tmem_columns_used, cfg.arch),
        "tmem_exclusive": b.ptx_count(r"tcgen05\.alloc\.exclusive") > 0,
    }
    return out


def main(path: Path = BASELINE) -> dict:
    data = {}
    for name, cfg in configs().items():
        data[name] = measure(cfg)
        r = data[name]["resources"]
        print(f"{name}: {r['registers']} registers, {r['dynamic_shared_bytes']} B smem",
              file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else BASELINE)
