"""Targets tk_cute builds for, and detection of the GPU this process runs on.

A `Target` is what a kernel config needs to know about an architecture before it picks tiles:
shared-memory capacity per block, tensor-memory columns, whether it has FP4 tensor cores and which
MMA K an NVFP4 instruction takes. Figures come from the CuTe DSL's own capacity table
(`cutlass.cutlass_dsl.SMEM_CAPACITY_MAP`, pinned 4.8.1) and `../shared/reference/rubin.md`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One compile target (`CUTE_DSL_ARCH` value) and the facts kernels plan against. Every
    architecture test in the code asks one of these fields, never the name."""

    name: str  # e.g. "sm_90a"
    family: str  # "hopper" | "blackwell" | "rubin"
    smem_bytes: int  # dynamic shared memory one block may use (opt-in maximum)
    tmem_columns: int  # 0 where there is no tensor memory (the most one allocation may take)
    sm_count: int | None  # None where the product spans SKUs with different counts
    fp4_tensor_cores: bool  # block-scaled tcgen05 MMAs (kind::mxf4nvf4)
    nvfp4_mma_k: int  # elements of K per block-scaled MMA instruction (0: none)
    wgmma: bool = False  # Hopper warpgroup MMAs (and setmaxnreg): sm_90a only
    native_fp4_cvt: bool = False  # cvt.rn.satfinite.e2m1x2.f32 (else integer decode/encode)
    exclusive_tmem_columns: int = 0  # columns that need tcgen05.alloc.exclusive (Rubin: 576)
    b_collector: bool = False  # tcgen05.mma .collector::b::{fill,use,lastuse} (B reuse)
    early_a_release: bool = False  # tcgen05.commit ... sync_restrict (A stage freed early)
    ue5m3_scales: bool = False  # UE5M3 (FloatNV8E5M3FNU) block scales in the MMA
    tmem_load_reduce: bool = False  # tcgen05.ld.red (max/min, .abs) over a lane's loaded columns

    @property
    def compute_capability(self) -> tuple[int, int]:
        digits = self.name[3:].rstrip("af")
        return int(digits[:-1]), int(digits[-1])

    @property
    def dsl_arch(self) -> str:
        """The arch key the DSL's helpers take ("sm_107" for sm_107a): the TMEM allocator's
        exclusive mode follows it."""
        return self.name.rstrip("af")


_BLACKWELL = dict(fp4_tensor_cores=True, nvfp4_mma_k=64, native_fp4_cvt=True)
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_90a", "hopper", 227 * 1024, 0, 132, False, 0, wgmma=True),
        Target("sm_100a", "blackwell", 227 * 1024, 512, 148, **_BLACKWELL),
        # B300: the reducing TMEM load (libNVVM rejects `tcgen05.ld.red` for sm_100a, builds it
        # for sm_103a and sm_107a: checked with DSL 4.8.1).
        Target("sm_103a", "blackwell", 227 * 1024, 512, None, **_BLACKWELL,
               tmem_load_reduce=True),
        # Rubin: 576 TMEM columns only through an exclusive allocation; 328 KiB shared memory
        # opt-in; block-scaled MMAs take 64 bytes of K (128 FP4 elements); B collector, early
        # release of A and UE5M3 scales are Rubin ISA (../shared/reference/rubin.md).
        Target("sm_107a", "rubin", 327 * 1024, 576, 224, True, 128, native_fp4_cvt=True,
               exclusive_tmem_columns=576, b_collector=True, early_a_release=True,
               ue5m3_scales=True, tmem_load_reduce=True),
    )
}


def target(name: str) -> Target:
    """The `Target` called `name` (``sm_90a``, ``sm_100a``, ``sm_103a``, ``sm_107a``)."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unsupported target {name!r}: tk_cute builds for {', '.join(TARGETS)}"
        ) from None


def current() -> Target | None:
    """The target of CUDA device 0 as torch sees it, or None without a (supported) GPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return next((t for t in TARGETS.values() if t.compute_capability == (major, minor)), None)


def device_target(device) -> Target:
    """The target of a CUDA `device`; ValueError naming the device's capability, the supported
    targets and the CPU reference when it has none (sm_80, sm_89, sm_120, ...). Looked up once
    per device (dispatch asks on every call)."""
    import torch

    index = torch.device(device).index if not isinstance(device, int) else device
    return _device_target(torch.cuda.current_device() if index is None else index)


@functools.cache
def _device_target(index: int) -> Target:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    for t in TARGETS.values():
        if t.compute_capability == (major, minor):
            return t
    raise ValueError(
        f"unsupported GPU: {torch.cuda.get_device_name(index)} is sm_{major}{minor}; tk_cute "
        f"has kernels for {', '.join(TARGETS)} only. The exact reference runs on the CPU: "
        f"pass CPU tensors (x.cpu(); tk_cute.nvfp4.quantize and gemm run it there), or run "
        f"`python -m tk_cute` with CUDA_VISIBLE_DEVICES= (no GPU)"
    )


def compile_target() -> Target:
    """The target `CUTE_DSL_ARCH` selects for compilation (the current GPU when unset)."""
    name = os.environ.get("CUTE_DSL_ARCH")
    if name:
        return target(name)
    t = current()
    if t is None:
        raise ValueError("no supported GPU and CUTE_DSL_ARCH is unset: name a target to compile "
                         "for")
    return t
