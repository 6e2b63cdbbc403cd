# SPDX-License-Identifier: MIT
"""Record the H200's output bytes of tk_cute's Hopper kernels on a few small deterministic
inputs, for tests/tk_cute/emulator/test_h200_fixtures.py to compare the emulator against.

Run on an H200 (sm_90a), from the repository root:

    python tests/tk_cute/emulator/data/make_h200_fixtures.py [--commit HASH] [--out PATH]

It writes one compressed file (default: h200_fixtures.npz beside this script) holding, per
case of `CASES`, the raw output bytes (bf16 D; NVFP4 codes, blocked scales and decode scale)
under ``<case>.<part>``, and a JSON header under ``header`` (the command, date, GPU, torch and
DSL versions, commit, and per case: the path, the kernel Config's fields, the launch values
that are not inputs (grid, CTAs), and a SHA-256 of every input's bytes).

Inputs are not stored: `make_inputs(case)` regenerates them bit-identically on any CPU (torch's
CPU generator from the case's seed, then the CPU quantizer, which is deterministic and
bit-exact with the CUDA one by contract); the GPU gets copies (`.cuda()`). The digests let the
test refuse inputs that regenerated differently. Two input kinds per kernel: "real" (normal
random values: the rounding of general data) and "exact" (small integers, E2M1 codes of
magnitude <= 2 with power-of-two scales: every product and float32 sum exact, whatever order
the tensor cores add in). The tensor-core paths fix neither the order nor the internal
precision of their sums (PTX ISA: wgmma.mma_async, mma), so a "real" case may legitimately
differ from the emulator's float64 sums; the test lists those it expects to differ.

This module imports without a GPU (the test uses `CASES`, `make_inputs`, `digest`,
`config_fields`); only `main` needs CUDA.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
FIXTURE = HERE / "h200_fixtures.npz"
FORMAT = 1

# name, kernel, shape, input kind, seed. kernel: "dense" (`tk_cute.gemm`, bf16 in and out),
# "register_a" / "small_m" (`tk_cute.nvfp4.gemm(..., path=...)`, W4A16 or W4A4, bf16 out),
# "quantize" (`tk_cute.nvfp4.quantize` of a bf16 matrix, computed global scale).
CASES = [
    dict(name="dense_128x64x64_exact", kernel="dense", M=128, N=64, K=64, inputs="exact",
         seed=1),
    dict(name="dense_130x40x48_exact", kernel="dense", M=130, N=40, K=48, inputs="exact",
         seed=2),
    dict(name="dense_64x48x64_real", kernel="dense", M=64, N=48, K=64, inputs="real", seed=3),
    dict(name="register_a_w4a16_16x128x512_real", kernel="register_a", w4a4=False, M=16, N=128,
         K=512, inputs="real", seed=4),
    dict(name="register_a_w4a16_16x128x512_exact", kernel="register_a", w4a4=False, M=16,
         N=128, K=512, inputs="exact", seed=5),
    dict(name="register_a_w4a4_16x128x256_real", kernel="register_a", w4a4=True, M=16, N=128,
         K=256, inputs="real", seed=6),
    dict(name="register_a_w4a4_16x128x256_exact", kernel="register_a", w4a4=True, M=16, N=128,
         K=256, inputs="exact", seed=7),
    dict(name="small_m_w4a16_4x256x512_real", kernel="small_m", w4a4=False, M=4, N=256, K=512,
         inputs="real", seed=8),
    dict(name="small_m_w4a16_4x256x512_exact", kernel="small_m", w4a4=False, M=4, N=256,
         K=512, inputs="exact", seed=9),
    dict(name="small_m_w4a16_1x128x256_real", kernel="small_m", w4a4=False, M=1, N=128, K=256,
         inputs="real", seed=10),
    dict(name="small_m_w4a4_2x128x256_real", kernel="small_m", w4a4=True, M=2, N=128, K=256,
         inputs="real", seed=11),
    dict(name="small_m_w4a4_2x128x256_exact", kernel="small_m", w4a4=True, M=2, N=128, K=256,
         inputs="exact", seed=12),
    dict(name="quantize_bf16_72x96_real", kernel="quantize", M=72, K=96, inputs="real",
         seed=13),
    dict(name="quantize_bf16_32x256_real", kernel="quantize", M=32, K=256, inputs="real",
         seed=14),
]


# ---------------------------------------------------------------- inputs (CPU, deterministic)


def _exact_nvfp4(g: torch.Generator, rows: int, k: int, gs: float):
    """An NVFP4Tensor whose values are small: E2M1 codes of magnitude <= 2, block scales in
    {0.5, 1, 2}, decode scale `gs` (a power of two)."""
    from tk_cute.layouts.nvfp4_scales import blocked_shape

    from tk_cute.nvfp4 import NVFP4Tensor
    from tk_cute.nvfp4.format import e4m3_encode_rne, pack_fp4

    codes = torch.tensor([0, 1, 2, 3, 4, 8, 9, 10, 11, 12], dtype=torch.uint8)[
        torch.randint(0, 10, (rows, k), generator=g)]
    pick = torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, blocked_shape(rows, k),
                                                       generator=g)]
    return NVFP4Tensor(pack_fp4(codes), e4m3_encode_rne(pick), torch.tensor(gs),
                       (rows, k), "ue4m3")


def make_inputs(case: dict) -> dict:
    """The case's inputs as CPU tensors (NVFP4Tensors for NVFP4 operands), bit-identical on
    every run: "a", "b" for the GEMMs (b: the weights), "x" for the quantizer."""
    from tk_cute import nvfp4

    g = torch.Generator().manual_seed(case["seed"])
    M, K = case["M"], case["K"]
    real = case["inputs"] == "real"
    if case["kernel"] == "quantize":
        return {"x": (torch.randn(M, K, generator=g) * 3).to(torch.bfloat16)}
    N = case["N"]
    if case["kernel"] == "dense":
        if real:
            return {"a": torch.randn(M, K, generator=g).to(torch.bfloat16),
                    "b": torch.randn(N, K, generator=g).to(torch.bfloat16)}
        return {"a": torch.randint(-4, 4, (M, K), generator=g).to(torch.bfloat16),
                "b": torch.randint(-4, 4, (N, K), generator=g).to(torch.bfloat16)}
    if real:
        b = nvfp4.quantize(torch.randn(N, K, generator=g).to(torch.bfloat16))
        a = torch.randn(M, K, generator=g).to(torch.bfloat16)
        if case["w4a4"]:
            a = nvfp4.quantize(a)
        return {"a": a, "b": b}
    b = _exact_nvfp4(g, N, K, 0.5)
    a = _exact_nvfp4(g, M, K, 2.0)
    return {"a": a if case["w4a4"] else a.dequantize(torch.bfloat16), "b": b}


def tensors(x) -> dict:
    """{part name: tensor} of a tensor or NVFP4Tensor (codes, blocked scales, decode scale)."""
    from tk_cute.nvfp4 import NVFP4Tensor

    if isinstance(x, NVFP4Tensor):
        return {"data": x.data, "scales": x.scales, "global_scale": x.global_scale}
    return {"": x}


def raw(t: torch.Tensor) -> np.ndarray:
    """A tensor's bytes (uint8, CPU, row-major)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def digest(inputs: dict) -> str:
    """SHA-256 over every input tensor's name, shape, dtype and bytes."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        for part, t in tensors(inputs[name]).items():
            h.update(f"{name}.{part} {tuple(t.shape)} {t.dtype}".encode())
            h.update(raw(t).tobytes())
    return h.hexdigest()


def config_fields(cfg) -> dict:
    """A kernel Config's constructor fields (JSON values)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}


def outputs(out) -> dict:
    """{"<part>": uint8 bytes} of a case's output (D, or the NVFP4 codes / scales / scale)."""
    return {part or "d": raw(t) for part, t in tensors(out).items()}


# ---------------------------------------------------------------- the GPU run


def _run_case(case: dict) -> tuple[dict, dict]:
    """(outputs, header entry) of one case on the current CUDA device."""

    from tk_cute import dense_gemm, nvfp4
    from tk_cute.nvfp4 import launch as nl
    from tk_cute.runtime import resident_clusters, sm_count
    from tk_cute.tuning import sm90 as sm90_tuning

    inputs = make_inputs(case)
    entry = {k: v for k, v in case.items()}
    entry["inputs_sha256"] = digest(inputs)
    cuda = {k: v.cuda() for k, v in inputs.items()}
    dev = torch.device("cuda")
    sms = sm_count(dev)
    entry["sms"] = sms
    kind = case["kernel"]
    if kind == "dense":
        a, b = cuda["a"], cuda["b"]
        cfg = dense_gemm.config_for(a, b, torch.bfloat16)
        size = cfg.CLUSTER_M * cfg.CLUSTER_N
        entry.update(config=config_fields(cfg), grid=sms if size == 1 else
                     size * resident_clusters(dev, size))
        out = dense_gemm.gemm(a, b, torch.bfloat16, config=cfg)
    elif kind in ("register_a", "small_m"):
        a, b = cuda["a"], cuda["b"]
        p = nvfp4.plan(a, b, torch.bfloat16, path=kind)
        if p.path != kind or p.pad_n:
            raise RuntimeError(f"{case['name']}: planned {p}, not one {kind} launch")
        entry["config"] = config_fields(p.config)
        if kind == "register_a":
            entry["ctas"] = sm90_tuning.register_a_grid(p.config, case["N"], case["K"], sms)
        out = nvfp4.gemm(a, b, torch.bfloat16, path=kind)
    elif kind == "quantize":
        x = cuda["x"]
        plan = nl._quantize_plan(x, False, True, None)
        entry.update(config=config_fields(plan.cfg), grid=plan.grid)
        out = nvfp4.quantize(x)
        ref = nvfp4.quantize(inputs["x"])  # the CPU reference: bit-exact by contract
        entry["equals_cpu_reference"] = all(
            np.array_equal(u, v) for u, v in zip(outputs(out).values(), outputs(ref).values()))
    else:
        raise ValueError(kind)
    torch.cuda.synchronize()
    return outputs(out), entry


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", help="the commit the kernels come from (default: git HEAD)")
    ap.add_argument("--out", type=Path, default=FIXTURE)
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    args = ap.parse_args(argv)

    import cutlass

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (an H200: sm_90a)")
    props = torch.cuda.get_device_properties(0)
    header = {
        "format": FORMAT,
        "command": "python tests/tk_cute/emulator/data/make_h200_fixtures.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props.name, "capability": f"sm_{props.major}{props.minor}",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cutlass_dsl": getattr(cutlass, "__version__", None),
        "commit": args.commit or _commit(), "cases": {},
    }
    arrays = {}
    failed = []
    for case in CASES:
        if args.only and case["name"] not in args.only:
            continue
        try:
            outs, entry = _run_case(case)
        except Exception as e:  # record, go on: one GPU run has to cover every case
            failed.append(case["name"])
            header["cases"][case["name"]] = {**case, "error": f"{type(e).__name__}: {e}"}
            print(f"{case['name']}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        header["cases"][case["name"]] = entry
        for part, b in outs.items():
            arrays[f"{case['name']}.{part}"] = b
        print(f"{case['name']}: {sum(b.size for b in outs.values())} bytes, config "
              f"{entry.get('config')}", flush=True)
    arrays["header"] = np.frombuffer(json.dumps(header, indent=1).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(buf.getvalue())
    print(f"wrote {args.out} ({len(buf.getvalue())} bytes, {len(header['cases'])} cases, "
          f"{len(failed)} failed: {failed})")
    return 1 if failed else 0


def load(path: Path = FIXTURE) -> tuple[dict, dict]:
    """(header, {"<case>.<part>": uint8 bytes}) of a fixture file."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays.pop("header").tobytes().decode())
    return header, arrays


if __name__ == "__main__":
    sys.exit(main())
