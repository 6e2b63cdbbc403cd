# SPDX-License-Identifier: MIT
"""`tk_cute.nvfp4.gemm` on a GPU you do not have: the kernel the public dispatch picks for a
target, run in the emulator on CPU tensors, checked against the exact reference.

`gemm(a, b, out_dtype, arch=...)` plans the call for `arch` (`nvfp4.plan(..., target=arch)`:
the same validation, heuristics and `NotImplementedError` for a call the target has no kernel
for), builds the kernel's arguments through the dispatch (`dispatch_sm100.prepare(...,
target=arch)`), captures the launch (`launch.HostProgram`, cached per kernel: later calls of
the same Config only rerun the host code), places every tensor of the call in the emulator's
global memory at its own address, poisons D (NaN, or 0xFF bytes for NVFP4 codes and scales),
runs the machine and returns a `Run`. `random_operands` makes operands whose products and sums
are exact in float32 (small E2M1 codes, power-of-two block and global scales), so `check`
compares every element of D with the exact reference bit for bit.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from tk_cute.emulator import launch as capture
from tk_cute.emulator import machine
from tk_cute.emulator.memory import GlobalMemory

ARCHS = ("sm_100a", "sm_103a", "sm_107a")
OUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
              "nvfp4": "nvfp4"}


@dataclass
class Run:
    """One emulated call: D, the plan's kernel, the machine (hazards, instruction counts)."""

    out: object  # torch.Tensor or NVFP4Tensor
    kernel: str  # the plan's path
    config: object
    machine: machine.Machine
    launch: object  # tk_cute.emulator.launch.Launch (the last, for a path of several)
    seconds: float
    call: object = None  # the dispatch's launch (dispatch_sm100.Launch: out, row-padded D)
    machines: list | None = None  # every launch's machine, for a path of several launches

    @property
    def all_machines(self) -> list:
        return self.machines or [self.machine]

    @property
    def hazards(self) -> list:
        return [h for m in self.all_machines for h in m.hazards]

    @property
    def executed(self) -> int:
        return sum(m.executed for m in self.all_machines)

    def instructions_by_warp(self) -> dict[int, int]:
        """Warp-instructions executed per warp index (summed over CTAs and launches)."""
        out: dict[int, int] = {}
        for m in self.all_machines:
            for w in m.finished_warps:
                out[w.index] = out.get(w.index, 0) + w.executed
        return out


class NoKernel(NotImplementedError):
    """The target has no kernel for this call (the dispatch would raise on that GPU)."""


def _tensors(*items) -> list[torch.Tensor]:
    from tk_cute.nvfp4 import NVFP4Tensor

    out = []
    for x in items:
        if isinstance(x, NVFP4Tensor):
            out += [x.data, x.scales, x.global_scale]
            if getattr(x, "saturated", None) is not None:
                out.append(x.saturated)
        elif isinstance(x, torch.Tensor):
            out.append(x)
    return out


def place(mem: GlobalMemory, *items):
    """Place every tensor of `items` (tensors, NVFP4Tensors: their codes, scales, global scale
    and flag) in `mem` at its own address (CPU tensors: their host memory is the device's)."""
    seen = set()
    for t in _tensors(*items):
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        if t.device.type != "cpu":
            raise ValueError(f"emulated tensors live on the CPU, got one on {t.device}")
        # the whole storage: a view (padded rows of codes, a slice) reads around its elements
        raw = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        mem.place(raw, f"{tuple(t.shape)} {t.dtype}", address=storage.data_ptr())


def _poison(out):
    from tk_cute.nvfp4 import NVFP4Tensor

    if isinstance(out, NVFP4Tensor):
        out.data.fill_(0xFF)
        out.scales.fill_(0xFF)
    else:
        out.fill_(float("nan"))


def gemm(a, b, out_dtype="bfloat16", *, arch: str, out_global_scale=None, config=None,
         clusters: int | None = None, adversarial: bool = False, seed: int = 0,
         resident: int = 2) -> Run:
    """Run `nvfp4.gemm(a, b, out_dtype)` as the `arch` GPU would, in the emulator.

    Args:
        a, b: CPU NVFP4Tensors (W4A4), or a bf16 tensor and an NVFP4Tensor (W4A16).
        out_dtype: "bfloat16", "float16", "float32" or "nvfp4" (then `out_global_scale`, a
            float32 0-dim tensor: D's decode scale).
        arch: "sm_100a", "sm_103a", "sm_107a", or "sm_90a" (the small-M and register-A
            paths, the tiled register-A path's whole tiles on bf16 activations).
        config: the kernel's Config instead of the plan's (`dispatch_sm100.prepare` checks it
            against the call).
        clusters: the persistent grid's cluster budget instead of the target's SMs / cluster
            size (fewer: several tiles per CTA, as on a busy GPU).
        adversarial, seed: the machine's adversarial schedule (`machine.Machine`).
        resident: clusters running at once.

    Raises:
        NoKernel: the target has no kernel for this call.
    """
    from tk_cute import nvfp4
    from tk_cute.kernels.gemm.nvfp4_sm100 import CLUSTERS
    from tk_cute.nvfp4 import dispatch_sm100

    dtype = OUT_DTYPES[out_dtype] if isinstance(out_dtype, str) else out_dtype
    try:
        p = nvfp4.plan(a, b, dtype, target=arch)
    except NotImplementedError as e:
        raise NoKernel(f"no kernel for this call on {arch}: {e}") from None
    if arch == "sm_90a":
        return _hopper(p, a, b, dtype, out_global_scale, adversarial=adversarial, seed=seed,
                       resident=resident)
    if p.path == "sm100_w4a16":  # NVFP4 D: fp32 D, then the quantizer (as `gemm_nvfp4`)
        dense = torch.float32 if dtype == "nvfp4" else dtype
        launch = dispatch_sm100.prepare_w4a16(a, b, dense, config or p.config, target=arch)
        ln = _host(launch, arch, launch.args).run(*launch.args)[0]
        run = _execute(ln, a, b, launch, p.path, adversarial=adversarial, seed=seed,
                       resident=resident)
        if dtype == "nvfp4":
            run.out = nvfp4.quantize(run.out, global_scale=out_global_scale)
        return run
    if p.path != "sm100":
        raise NoKernel(f"the emulator runs the tcgen05 kernels; {arch} plans {p.path!r}")
    launch = dispatch_sm100.prepare(a, b, dtype, config or p.config,
                                    out_global_scale=out_global_scale, target=arch)
    args = launch.args
    if clusters is not None:
        args = args[:CLUSTERS] + (clusters,) + args[CLUSTERS + 1:]
    ln = _host(launch, arch, args).run(*args)[0]
    return _execute(ln, a, b, launch, p.path, adversarial=adversarial, seed=seed,
                    resident=resident)


def _hopper(p, a, b, dtype, out_global_scale, **options) -> Run:
    """The Hopper plan's kernel on the CPU (`emulator.hopper`: the small-M and register-A
    paths and the tiled register-A path's whole tiles on bf16 activations, 2-D, bf16 D or
    NVFP4 D through the quantizer as `gemm_nvfp4` does on the first two; the tiled path's
    fused NVFP4 epilogue is not emulated: its fp32 D, then the quantizer, whose bytes it
    equals)."""
    from tk_cute import nvfp4
    from tk_cute.arch import target
    from tk_cute.emulator import hopper
    from tk_cute.tuning import sm90 as sm90_tuning

    tiled = p.path == "register_a_tiled" and not p.config.STREAM_K and not isinstance(
        a, nvfp4.NVFP4Tensor)
    if not (p.path in ("small_m", "register_a") or tiled) or b.ndim != 2 or len(a.shape) != 2:
        raise NoKernel(f"the emulator runs the Hopper paths small_m, register_a and "
                       f"register_a_tiled's whole tiles on bf16 activations (2-D); sm_90a "
                       f"plans {p} for this call")
    dense = torch.float32 if dtype == "nvfp4" else dtype
    if dense != torch.bfloat16 and p.path == "small_m":
        raise NoKernel(f"the emulated small-M path writes bf16 D, not {dense}")
    M = a.shape[-2]
    out = torch.full((M, b.M), float("nan"), dtype=dense)
    start = time.perf_counter()
    sms = target("sm_90a").sm_count  # (the plan's: `nvfp4.plan(..., target="sm_90a")`)
    if p.path == "small_m":
        machines = hopper.small_m(a, b, p.config, out, **options)
    elif tiled:  # (NVFP4 D: the plan's Config writes fp32)
        machines = hopper.register_a_tiled(a, b, p.config, out, sms, **options)
    else:
        machines = hopper.register_a(a, b, p.config, out, sm90_tuning.register_a_grid(
            p.config, b.M, b.K, sms), **options)
    seconds = time.perf_counter() - start
    if dtype == "nvfp4":
        out = nvfp4.quantize(out, global_scale=out_global_scale)
    return Run(out, p.path, p.config, machines[-1], machines[-1].launch, seconds,
               machines=machines)


def replay(run: Run, a, b, ptx: str | None = None, **options) -> Run:
    """`run`'s launch again on a poisoned D, its PTX replaced by `ptx` if given (what a kernel
    edited by hand, or a deliberately broken one, does); options as `gemm`'s."""
    ln = run.launch if ptx is None else dataclasses.replace(run.launch, ptx=ptx)
    return _execute(ln, a, b, run.call, run.kernel, **options)


def _execute(ln, a, b, call, kernel, **options) -> Run:
    """Run captured launch `ln` of the dispatch's `call` (its D poisoned first)."""
    for d in (call.out, call.wide):
        if d is not None:
            _poison(d)
    mem = GlobalMemory()
    place(mem, a, b, call.out, *([] if call.wide is None else [call.wide]))
    start = time.perf_counter()
    m = machine.run(ln, mem, **options)
    seconds = time.perf_counter() - start
    call.finish()
    return Run(call.out, kernel, call.config, m, ln, seconds, call)


_HOSTS: dict = {}


def _host(launch, arch: str, args) -> capture.HostProgram:
    """The captured host program of `launch`'s kernel (compiled once per config and cluster
    budget; reruns take new addresses)."""
    from tk_cute.kernels.gemm.nvfp4_sm100 import CLUSTERS

    key = (launch.config, arch, None if launch.w4a16 else args[CLUSTERS])
    prog = _HOSTS.get(key)
    if prog is None:
        if len(_HOSTS) >= 32:
            _HOSTS.pop(next(iter(_HOSTS))).close()
        prog = _HOSTS[key] = capture.HostProgram(launch.kernel(), *args, arch=arch)
    return prog


def random_operands(m: int, n: int, k: int, *, activations: str = "nvfp4", batch: int | None
                    = None, scale_format: str = "ue4m3", seed: int = 0):
    """(a, b) whose products and float32 sums are exact: E2M1 codes of magnitude <= 2, block
    scales in {0.5, 1, 2}, global scales 2 and 0.5; `activations` "bf16": a is bf16 (W4A16)
    holding the same exactly representable values."""
    from tk_cute.layouts.nvfp4_scales import blocked_shape
    from tk_cute.nvfp4 import NVFP4Tensor
    from tk_cute.nvfp4.format import e4m3_encode_rne, pack_fp4, ue5m3_encode_rne

    g = torch.Generator().manual_seed(seed)
    enc = ue5m3_encode_rne if scale_format == "ue5m3" else e4m3_encode_rne
    lead = () if batch is None else (batch,)

    def operand(rows, gs):
        codes = torch.tensor([0, 1, 2, 3, 4, 8, 9, 10, 11, 12], dtype=torch.uint8)[
            torch.randint(0, 10, (*lead, rows, k), generator=g)]
        pick = torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, (*lead, *blocked_shape(rows, k)),
                                                           generator=g)]
        return NVFP4Tensor(pack_fp4(codes), enc(pick), torch.tensor(gs), (*lead, rows, k),
                           scale_format)

    a, b = operand(m, 2.0), operand(n, 0.5)
    if activations in ("bf16", "bfloat16"):
        a = a.dequantize(torch.bfloat16)
    return a, b


def check(run: Run, a, b, out_dtype="bfloat16", out_global_scale=None) -> tuple[bool, str]:
    """(every element of D equals the exact reference, a one-line description)."""
    from tk_cute import nvfp4

    out = run.out
    if out_dtype == "nvfp4":
        exact = nvfp4.gemm(a, b, torch.float32)
        ref = nvfp4.quantize(exact, global_scale=out_global_scale)
        same = torch.equal(out.data, ref.data) and torch.equal(out.scales, ref.scales)
        bad = int((out.data != ref.data).sum()) + int((out.scales != ref.scales).sum())
        return same, ("NVFP4 codes and scales bit-exact" if same else
                      f"{bad} NVFP4 code / scale bytes differ from the quantizer's recipe")
    dtype = OUT_DTYPES[out_dtype] if isinstance(out_dtype, str) else out_dtype
    ref = nvfp4.gemm(a, b, torch.float32).double().to(dtype)
    nan = torch.isnan(out)
    same = bool(torch.equal(out, ref))
    if same:
        return True, f"all {out.numel()} elements equal the exact product"
    diff = (out.double() - ref.double()).abs()
    return False, (f"{int((out != ref).sum())} of {out.numel()} elements differ ({int(nan.sum())}"
                   f" never written), worst {float(np.nan_to_num(diff.max().item()))}")
