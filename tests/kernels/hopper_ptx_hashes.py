# SPDX-License-Identifier: MIT
"""SHA-256 of the PTX of every distinct Hopper config the planners pick: the dense GEMM's
`default_config` (plain and scaled), the tiled register-A kernel's and the register-A
kernel's plans, over a sweep of shapes. A refactor that should not change the kernels is checked by running this before and
after (about 4 minutes on a CPU) and comparing:

    python tests/kernels/hopper_ptx_hashes.py /tmp/before.json
    ... refactor ...
    python tests/kernels/hopper_ptx_hashes.py /tmp/after.json
    python tests/kernels/hopper_ptx_hashes.py --compare /tmp/before.json /tmp/after.json

Keys are the Config reprs; `--compare` ignores fields a refactor removed whose value was the
default (give them with --dropped NAME=VALUE, e.g. STREAM_K_DP=False). Used when stream-K after
whole waves and the tiled kernel's clusters were deleted (384 kernels byte-identical), and when
stream-K became a schedule object (420 kernels, the entry's name aside).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import re
from pathlib import Path

SMS = 132
MS = (1, 3, 64, 100, 113, 128, 129, 200, 256, 300, 1000, 2048, 4000, 8192)
NS = (8, 136, 1000, 2880, 4000, 8192, 28672)


def configs() -> dict[str, tuple[str, object]]:
    import torch

    from tk_cute.tuning import dense_sm90 as dense_tuning
    from tk_cute.nvfp4.gemm import _plan_hopper

    out = {}
    for m, n, dt, od, lines in itertools.product(MS, NS, (torch.bfloat16, torch.float8_e4m3fn),
                                                 (torch.bfloat16, torch.float32), (True, False)):
        c = dense_tuning.default_config(dt, od, m, n, SMS, lines=lines, quads=30)
        out[f"dense {c!r}"] = ("dense", c)
    for w4a4, m, n, k, od in itertools.product((False, True), (113, 129, 200, 256, 512, 1000, 4000),
                                               (136, 2880, 4000, 8192, 28672),
                                               (48, 2880, 8192, 8208), ("bfloat16", "float32")):
        p = _plan_hopper(w4a4, m, n, k, od, SMS, False, None, "ue4m3")
        if p.path == "register_a_tiled":
            out[f"tiled {p.config!r}"] = ("tiled", p.config)
    for w4a4, m, n, k in itertools.product((False, True), (9, 16, 48, 64, 100, 128),
                                           (136, 8192), (48, 8192, 8208)):
        p = _plan_hopper(w4a4, m, n, k, "bfloat16", SMS, False, None, "ue4m3")
        if p.path == "register_a":
            out[f"register_a {p.config!r}"] = ("register_a", p.config)
    return out


def _digest(ptx: str) -> str:
    """SHA-256 of the PTX with the entry's name (the DSL derives it from the kernel's class
    and method names) made anonymous: a renamed class is the same kernel."""
    return hashlib.sha256(re.sub(r"kernel_cutlass_kernel_\w+", "KERNEL", ptx).encode()).hexdigest()


def hashes() -> dict[str, str]:
    from tk_cute.kernels.gemm import gemm_sm90
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
    from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst

    from tk_cute.compile import build

    out = {}
    for key, (kind, c) in sorted(configs().items()):
        if kind == "dense":
            for scaled in (False, True):
                b = build(gemm_sm90.kernel_for(c, scaled).call_ptrs,
                          *gemm_sm90.signature(c, scaled).compile_args(SMS), arch="sm_90a")
                out[f"{key} scaled={scaled}"] = _digest(b.ptx)
        elif kind == "tiled":
            b = build(rst.launch_fn(c), *rst.signature(c).compile_args(SMS), arch="sm_90a")
            out[key] = _digest(b.ptx)
        else:
            b = build(rs.launch_fn(c), *rs.signature(c).compile_args(c), arch="sm_90a")
            out[key] = _digest(b.ptx)
    return out


def compare(before: dict, after: dict, dropped: list[str]) -> list[str]:
    def norm(key):
        for d in dropped:
            key = re.sub(rf", {re.escape(d)}(?=[,)])", "", key)
        return key

    b = {norm(k): v for k, v in before.items()}
    a = {norm(k): v for k, v in after.items()}
    return ([f"missing after: {k}" for k in b if k not in a]
            + [f"PTX differs: {k}" for k in b if k in a and a[k] != b[k]])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--dropped", nargs="*", default=[], help="NAME=VALUE fields removed")
    args = p.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(f).read_text()) for f in args.files)
        problems = compare(before, after, args.dropped)
        print("\n".join(problems) or f"{len(before)} kernels: PTX identical")
        return 1 if problems else 0
    out = hashes()
    Path(args.files[0]).write_text(json.dumps(out, indent=0))
    print(f"{len(out)} kernels hashed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
