"""`tk_cute.nvfp4.gemm`: the one dispatch of every NVFP4 GEMM path on every target.

``D = a @ b^T`` with b NVFP4 weights (N, K) and a either NVFP4 (W4A4) or bfloat16 (W4A16); the
semantics and the exact references are in `tk_cute.nvfp4.reference`.

A call validates once (`validate.gemm_operands`), makes a `Plan` (`plan`: which kernel, which
Config, from the shape and the device: `tk_cute.tuning`) and runs it through the kernels' torch
launches (`launch`, `dispatch_sm100`). On a CUDA tensor a call runs kernels or raises: it never
runs a reference. CPU tensors run the exact reference (`Plan.path == "reference"`), which is
what a CPU can do.

What runs where (`Plan.path`; the Hopper rules are `sm90_tuning.hopper_path`):
- Hopper (sm_90a): every shape the format allows: any M >= 1, any N >= 1, any K % 16 == 0, 2-D
  or batched, W4A16 and W4A4, bf16 / fp16 / fp32 out. "small_m", "register_a",
  "register_a_tiled" (M >= `sm90_tuning.SPLIT_TILE_MIN_M`) and "dequantize" (any shape: the
  operands expanded to exact bf16 in global memory, then the dense Hopper GEMM). Batched
  operands run one 2-D plan per batch ("batches"). W4A4 decodes its activations in the kernel
  on "small_m" (M <= `sm90_tuning.W4A4_NATIVE_MAX_M`, and 9-16 rows where `hopper_path` gives
  it the shape), "register_a" and "register_a_tiled" (their permute passes) and "dequantize".
  D's rows must be 16-byte aligned for the kernels' stores: where N * element size is not, D
  is computed N-padded and copied into place (`Plan.pad_n`).
- Blackwell / Rubin (sm_100a, sm_103a, sm_107a): any M and N, K % 16 == 0, 2-D or batched,
  bf16 / fp16 / fp32 out. W4A4 on block-scaled MMAs (`kernels/gemm/nvfp4_sm100.py`, path
  "sm100"; NVFP4 out with N % 16 == 0 quantized in its epilogue); W4A16 with the weights
  decoded to bf16 in shared memory for kind::f16 MMAs (`kernels/gemm/nvfp4_w4a16_sm100.py`,
  path "sm100_w4a16"). Both run in the emulator on a CPU (`tk_cute.emulator`).
Scale formats: UE4M3 (NVFP4) everywhere; UE5M3 operands (`NVFP4Tensor.scale_format`) on the
Hopper paths (every one decodes them; GPU-tested on the H200) and on sm_107a (compiled only)
(sm_100a / sm_103a raise ValueError); on CUDA both W4A4 operands must share one format (the
references on CPU take any mix).
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from dataclasses import dataclass

import torch

from tk_cute.runtime import dtype_name
from tk_cute.tuning import sm90 as sm90_tuning

from . import dispatch_sm100, launch, validate
from .tensor import NVFP4Tensor, normalize_parts



@dataclass(frozen=True)
class Plan:
    """What `gemm` runs for one call.

    Attributes:
        path: "small_m", "register_a", "register_a_tiled", "dequantize", "sm100",
            "sm100_w4a16" (one kernel), "batches" (`parts[0]` for each batch) or "reference"
            (CPU tensors only).
        config: the kernel's Config (one-kernel paths).
        parts: ((0, L, Plan),) for "batches" (the one plan every batch runs).
        pad_n: D computed with N rounded up to this (0: not padded), then copied into place.
    """

    path: str
    config: object = None
    parts: tuple = ()
    pad_n: int = 0

    def kernels(self) -> list[str]:
        """The one-kernel paths this plan runs, in order."""
        if self.path == "batches":
            return self.parts[0][2].kernels() * self.parts[0][1]
        return [self.path]

    def __str__(self) -> str:
        tail = f" (N padded to {self.pad_n})" if self.pad_n else ""
        if self.path == "batches":
            inner = ", ".join(f"{m0}:{m1} {p}" for m0, m1, p in self.parts)
            return f"{self.path}[{inner}]{tail}"
        if self.path == "register_a_tiled":
            return f"{self.path}({tiled_schedule(self.config)}){tail}"
        if self.path == "register_a" and self.config.DIRECT:  # (no reduction launch)
            return f"{self.path}(D direct){tail}"
        if self.path == "register_a" and self.config.CLUSTER > 1:  # (no reduction launch)
            return f"{self.path}(cluster sum of {self.config.CLUSTER}){tail}"
        if self.path in ("sm100", "sm100_w4a16"):
            from tk_cute.tuning import sm100 as sm100_tuning

            return f"{self.path}({sm100_tuning.describe(self.config)})"
        return f"{self.path}{tail}"


def tiled_schedule(cfg) -> str:
    """The tiled register-A kernel's schedule in words (what plans and pictures print): its tile
    width, and stream-K shares, as teams where they are (`sm90_tuning.register_a_tiled_config`)."""
    return (f"Nb={cfg.Nb}" + (", stream-K" if cfg.STREAM_K else "")
            + (" teams" if cfg.TEAMS else ""))


def plan(a, b: NVFP4Tensor, out_dtype: torch.dtype = torch.bfloat16, *, pdl: bool = False,
         path: str | None = None, target: str | None = None) -> Plan:
    """The `Plan` `gemm(a, b, out_dtype, pdl=pdl, path=path)` would run (validates like
    `gemm`; out_dtype "nvfp4": `gemm_nvfp4`'s plan); `target` (e.g. "sm_107a"): the plan on
    that GPU, whatever device the operands are on (what `tk_cute.emulator` runs)."""
    nvfp4_out = out_dtype == "nvfp4"  # D quantized in the kernel (`gemm_nvfp4`)
    out_dtype = torch.float32 if nvfp4_out else out_dtype
    op = validate.gemm_operands(a, b, out_dtype, pdl=pdl)
    sf = validate.one_scale_format(a, b, "gemm on a GPU") if target else _scale_format(a, b)
    return _plan(op, b.device, out_dtype, pdl, path, sf, nvfp4_out, target=target)


def _scale_format(a, b: NVFP4Tensor) -> str:
    """The call's block-scale format: b's, and a's too for W4A4. On CUDA the two must agree
    (one scale type per MMA, one decode per kernel); the CPU references take any mix."""
    if b.device.type == "cuda":
        return validate.one_scale_format(a, b, "gemm on CUDA")
    return b.scale_format


def _plan(op: validate.Operands, device: torch.device, out_dtype, pdl: bool,
          path: str | None = None, sf: str = "ue4m3", nvfp4_out: bool = False,
          target: str | None = None) -> Plan:
    """`nvfp4_out`: D quantized to NVFP4 (`gemm_nvfp4`): the Hopper paths compute it in
    `out_dtype` (fp32) first, the sm100 kernel in its epilogue. `target`: plan for that GPU
    (its SM count from `tk_cute.arch`) instead of the operands' device."""
    from tk_cute import arch

    if target is None and device.type != "cuda":
        if path is not None:
            raise ValueError(f"path={path!r} forces a GPU kernel; tensors on {device} run the "
                             f"exact reference (leave path=None)")
        return Plan("reference")
    target = arch.device_target(device) if target is None else arch.target(target)
    name = dtype_name(out_dtype)
    if target.wgmma:
        sms = launch.sm_count(device) if device.type == "cuda" else target.sm_count
        one = _plan_hopper(op.w4a4, op.M, op.N, op.K, name, sms, pdl, path, sf)
        if op.batched:  # one plan, run for each batch
            return Plan("batches", parts=((0, op.L, one),))
        return one
    if path not in (None, "sm100", "sm100_w4a16"):
        raise ValueError(f"path {path!r} is a Hopper path; {target.name} runs 'sm100' (W4A4) "
                         f"and 'sm100_w4a16'")
    return _plan_sm100(op, target.name, "nvfp4" if nvfp4_out else name, sf)


@functools.lru_cache(maxsize=4096)  # per call (Configs' __post_init__ search their stages)
def _plan_hopper(w4a4: bool, M: int, N: int, K: int, out: str, sms: int, pdl: bool,
                 force: str | None = None, sf: str = "ue4m3") -> Plan:
    if force is None:
        path = sm90_tuning.hopper_path(w4a4, M, N, K, sms)
    else:
        path = sm90_tuning.check_hopper_path(force, w4a4, M, N, K, out, sf)
    if path != "dequantize":
        cfg = sm90_tuning.default_config(path, M, N, K, w4a4, out, sms)
        return Plan(path, sm90_tuning.complete(path, cfg, N, K, w4a4, out, sf, pdl, sms))
    esize = {"bfloat16": 2, "float16": 2, "float32": 4}[out]
    per_row = validate.OUT_ALIGN // esize  # D rows must be 16-byte aligned for TMA stores
    return Plan(path, pad_n=-(-N // per_row) * per_row if N % per_row else 0)


def _plan_sm100(op: validate.Operands, target: str, out: str, sf: str = "ue4m3") -> Plan:
    from tk_cute.tuning import sm100 as sm100_tuning

    dispatch_sm100.scale_format(sf, target)
    if not op.w4a4:  # the weights decoded in the kernel (NVFP4 D: fp32, then the quantizer)
        if out == "nvfp4" and op.N % 16:
            raise NotImplementedError(f"NVFP4 output needs N % 16 == 0 (16-element scale blocks "
                                      f"along D's rows); got N={op.N}")
        dense = "float32" if out == "nvfp4" else out
        return Plan("sm100_w4a16", sm100_tuning.w4a16_config(target, op.M, op.N, op.K,
                                                             dense, sf, op.L or 1))
    if not dispatch_sm100.supports(op.M, op.N, op.K, out):
        raise NotImplementedError(
            f"the {target} NVFP4 GEMM needs K % 16 == 0 and bf16 / fp16 / fp32 output (or NVFP4 "
            f"output with N % 16 == 0); got M={op.M}, N={op.N}, K={op.K}, out_dtype={out}")
    return Plan("sm100", sm100_tuning.w4a4_config(target, op.M, op.N, op.K, out, sf, op.L or 1))


def gemm(a, b: NVFP4Tensor, out_dtype: torch.dtype | str | None = None, *,
         out: torch.Tensor | NVFP4Tensor | None = None, pdl: bool = False,
         path: str | None = None, out_global_scale=None,
         quantize_a: bool = False) -> torch.Tensor | NVFP4Tensor:
    """``D = a @ b^T`` for NVFP4 weights b (the public entry point; module docstring: paths).

    Args:
        a: NVFP4Tensor (M, K) or (L, M, K) (W4A4); or a bfloat16 tensor (..., K), or (L, M, K)
            with b batched (W4A16). A non-contiguous bf16 `a` is copied once (a small M x K
            tensor) before the kernels read it.
        b: NVFP4Tensor (N, K) or (L, N, K), K-major.
        out_dtype: torch.bfloat16, torch.float16 or torch.float32 (default: out's dtype, else
            bfloat16), or "nvfp4": D quantized to NVFP4 with the given decode scale
            `out_global_scale` (`gemm_nvfp4`).
        out: optional preallocated D: contiguous, 16-byte aligned, of D's shape and dtype, on
            the operands' device; or an NVFP4Tensor (M, N) whose global scale is D's decode
            scale (NVFP4 output).
        pdl: let the call read the weights b while the kernel before it on the stream is
            still running (programmatic dependent launch with early weight loads) where the
            path supports it (the Hopper kernels below `sm90_tuning.SPLIT_TILE_MIN_M` rows:
            register-A and small-M); others ignore it. It reads a and writes D only after
            that kernel has ended, so pass it only for weights that the kernels just before
            do not write, e.g. static weights in a chain of decode GEMMs (docs/facts.md#pdl:
            0.4-1.7 us per call). Without it the small-M kernel still launches as a
            programmatic dependent, reading nothing before the kernel before it has ended.
        path: force one kernel path (`sm90_tuning.PATHS`, for comparisons and tests); ValueError
            when that path cannot take the shape. Default: the heuristics' choice.
        quantize_a: W4A4 from dense activations: bit for bit ``gemm(quantize(a,
            check_finite=False), b, ...)`` (a bf16, fp16 or fp32 tensor: (..., K) with 2-D
            weights, its rows flattened as W4A16's are, or (L, M, K) with batched ones; on
            CUDA NaN/Inf in a give an unspecified D, as that quantize does; on a CPU quantize
            raises). A 2-D bf16
            `a` is quantized inside the small-M kernel where the plan allows (one launch:
            `sm90_tuning.quantize_in_gemm`, Hopper decode); otherwise on CUDA by the
            quantizer's launches into a kept workspace first (`launch.QuantizeA`), other
            forms by `quantize` first.

    Returns:
        D of out_dtype: (..., N) for W4A16, (M, N) or (L, M, N) for W4A4; `out` when given;
        an NVFP4Tensor for NVFP4 output (`gemm_nvfp4`). Activations without rows ((0, K),
        (B, 0, K)) give an empty D without a kernel, as ``torch.matmul`` does.

    Raises:
        TypeError, ValueError: see `validate.gemm_operands`.
        NotImplementedError: a combination no kernel of this GPU takes.
    """
    if torch.compiler.is_compiling():
        ue4m3 = lambda t: isinstance(t, NVFP4Tensor) and t.scale_format == "ue4m3"
        if (ue4m3(b) and out is None and path is None and out_dtype != "nvfp4"
                and out_global_scale is None and (ue4m3(a) or isinstance(a, torch.Tensor))):
            return _traced(a, b, out_dtype, pdl, quantize_a)
        return _untraced(a, b, out_dtype, out=out, pdl=pdl, path=path,
                         out_global_scale=out_global_scale, quantize_a=quantize_a)
    if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.numel() == 0:
        return _empty_batch(a, b, out_dtype, out, out_global_scale, quantize_a)
    if quantize_a is not False:
        validate.flag("quantize_a", quantize_a)
        if _flat_rows(a, b):
            rows = a.reshape(-1, a.shape[-1])
            flat = out.view(-1, out.shape[-1]) if (isinstance(out, torch.Tensor) and out.dim()
                                                  and out.is_contiguous()) else out
            d = gemm(rows, b, out_dtype, out=flat, pdl=pdl, path=path,
                     out_global_scale=out_global_scale, quantize_a=True)
            return out if out is not None else d.reshape(*a.shape[:-1], b.M)
        nvfp4_out = out_dtype == "nvfp4" or isinstance(out, NVFP4Tensor)
        if (not nvfp4_out and out_global_scale is None and isinstance(a, torch.Tensor)
                and a.dtype == torch.bfloat16 and a.dim() == 2 and isinstance(b, NVFP4Tensor)):
            if out_dtype is None:
                out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
            return prepared(a, b.data, b.scales, b.global_scale, b.shape, b.scale_format,
                            out_dtype, pdl, path, quantize_a=True)(a, out)
        from .quantize import quantize_parts

        a = quantize_parts(a, None, False)[0]  # (no saturation flag: nothing reads it)
    if out_dtype == "nvfp4" or isinstance(out, NVFP4Tensor):
        if out_dtype not in (None, "nvfp4"):
            raise TypeError(f"an NVFP4Tensor out takes out_dtype 'nvfp4' (or none), got "
                            f"{out_dtype}")
        return gemm_nvfp4(a, b, out_global_scale, out=out, pdl=pdl, path=path)
    if out_global_scale is not None:
        raise TypeError("out_global_scale is D's NVFP4 decode scale: only with out_dtype "
                        "'nvfp4'")
    if out_dtype is None:
        out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
    if not isinstance(b, NVFP4Tensor):
        validate.gemm_operands(a, b, out_dtype)  # raises, naming b
    return prepared(a, b.data, b.scales, b.global_scale, b.shape, b.scale_format, out_dtype,
                    pdl, path)(a, out)


def _flat_rows(a, b) -> bool:
    """Whether quantize_a's activations are (..., K) rows (not 2-D) of 2-D weights: flattened
    to (M, K), as W4A16 takes them, and D shaped (..., N) back."""
    return (isinstance(a, torch.Tensor) and a.dim() not in (0, 2) and isinstance(b, NVFP4Tensor)
            and b.ndim == 2)


def _traced(a, b: NVFP4Tensor, out_dtype, pdl, quantize_a):
    """`gemm` of UE4M3 operands, D in a torch dtype, no `out` or `path`, while torch.compile
    traces: the custom ops (`tk_cute.nvfp4.ops`, what `Linear` and `linear` run there), no
    graph break. (Other calls run `_untraced`.)"""
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if isinstance(a, NVFP4Tensor):
        parts = (a.data, a.scales, a.global_scale)
    elif quantize_a is not False and not (isinstance(a, torch.Tensor) and a.dim() == 2
                                          and a.dtype == torch.bfloat16):
        if _flat_rows(a, b):
            d = _traced(a.reshape(-1, a.shape[-1]), b, out_dtype, pdl, True)
            return d.reshape(*a.shape[:-1], b.M)
        parts, quantize_a = torch.ops.tk_cute.nvfp4_quantize(a, None, False), False
    else:
        parts = (a, None, None)
    return torch.ops.tk_cute.nvfp4_gemm(*parts, b.data, b.scales, b.global_scale, out_dtype,
                                        pdl, quantize_a)


# Anything else runs eagerly: a graph break, or under fullgraph=True an error naming why.
_untraced = torch.compiler.disable(
    gemm, reason="tk_cute.nvfp4.gemm traces (as the custom op tk_cute::nvfp4_gemm) only for "
    "UE4M3 NVFP4Tensor operands, D in a torch dtype and no out=, path= or NVFP4 output")


def _empty_batch(a: torch.Tensor, b, out_dtype, out, out_global_scale, quantize_a):
    """D of activations with no rows ((0, K), (B, 0, K)): an empty tensor (or `out`), checked
    as a call with rows would be, and no kernel (as `torch.matmul`)."""
    if quantize_a is not False:
        validate.flag("quantize_a", quantize_a)
        from .quantize import check_dtype

        check_dtype(a, "quantize_a's activations")
        a = a.to(torch.bfloat16)  # (no elements)
    if out_dtype == "nvfp4" or isinstance(out, NVFP4Tensor) or out_global_scale is not None:
        raise ValueError(f"NVFP4 output needs at least one row of activations (an NVFP4Tensor "
                         f"is never empty), got a of shape {tuple(a.shape)}")
    if out_dtype is None:
        out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
    op = validate.gemm_operands(a, b, out_dtype, out=out, empty=True)
    return out if out is not None else torch.empty(op.out_shape, dtype=out_dtype,
                                                   device=b.device)


# ---------------------------------------------------------------- prepared calls
# Calls kept per weight (keyed by its codes tensor, held weakly: dropping the weights drops
# their calls) and per activation shape, dtype and device, out dtype, pdl and path; past this
# many per weight the least recently used is dropped (a prefill of ever new lengths must not
# grow them); a call made for new scales of the same codes drops the calls of the old ones.
CALLS_PER_WEIGHT = 64
_CALLS: dict = {}  # id(codes) -> (weakref to the codes, {key: Call})
_CALLS_LOCK = threading.Lock()


class Call:
    """A `gemm` call prepared once per (weights, activation shape, dtype and device, out dtype,
    pdl, path): the validation, the `Plan` and every launch argument the weights and the
    shape fix (`launch.SmallM` / `launch.RegisterA`: the decode paths, whose GPU time is a
    few microseconds) are done once; a call checks only what may differ between two
    activations of one shape (its rows' addresses; `out` when given), allocates D and
    launches. Other paths run `run` on the kept plan. `prepared` finds or makes one.

    Holds the weights' scales and decode scale but not their codes (a weak reference), so the
    cache keyed by the codes lets the weights go."""

    def __init__(self, a, b: NVFP4Tensor, out_dtype, pdl: bool, path: str | None,
                 quantize_a: bool = False):
        self.op = op = validate.gemm_operands(a, b, out_dtype, pdl=pdl)
        if quantize_a:  # 2-D bf16 a (its callers check): quantized in the kernel, or (plan
            # None) by `quantize_parts` first
            cfg = _quantize_in_gemm(op, b, out_dtype, pdl, path)
            p = self.plan = None if cfg is None else Plan("small_m", cfg)
            self.pdl, self.path = pdl, path
            # (quantized by the quantizer's launches into a workspace on CUDA; then the W4A4
            # call of the quantized activations, found at the first call and kept)
            self._quantize = (launch.QuantizeA(a) if cfg is None and b.device.type == "cuda"
                              else None)
            self._inner = None
        else:
            self.plan = p = _plan(op, b.device, out_dtype, pdl, path, _scale_format(a, b))
        self.out_dtype, self.device = out_dtype, b.device
        self.scales, self.global_scale = b.scales, b.global_scale
        self.shape, self.scale_format = b.shape, b.scale_format
        self._codes = weakref.ref(b.data)
        self.held = None  # the codes, for a call that is not kept (`prepared`)
        self._rows = not op.w4a4 and not op.batched and a.dim() != 2  # W4A16 (..., K)
        self._launch = None
        if p is not None and p.path in BOUND and not p.pad_n:
            self._launch = BOUND[p.path](b, p.config, op.M)
            if self._launch.wsf is not b.scales:  # (a copy would miss in-place updates)
                self._launch = None

    def weights(self) -> NVFP4Tensor:
        codes = self._codes()
        if codes is None:
            raise RuntimeError("the weights of this prepared gemm call were freed")
        return NVFP4Tensor.trusted(codes, self.scales, self.global_scale, self.shape,
                                   self.scale_format)

    def __call__(self, a, out: torch.Tensor | None = None) -> torch.Tensor:
        op = self.op
        if self.plan is None:  # quantize_a without the in-kernel plan: quantize, then the GEMM
            if self._quantize is not None:
                q = self._quantize(a)
            else:  # (the CPU reference)
                from .quantize import quantize_parts

                q = quantize_parts(a, None, False)[0]  # (no saturation flag: nothing reads it)
            if self._inner is None:
                self._inner = prepared(q, self.weights().data, self.scales, self.global_scale,
                                       self.shape, self.scale_format, self.out_dtype, self.pdl,
                                       self.path)
            return self._inner(q, out)
        if out is not None:
            validate.check_out(out, op.out_shape, self.out_dtype, self.device, "gemm")
        if self.plan.path == "reference":
            from .reference import gemm_reference, w4a16_reference

            d = (gemm_reference if op.w4a4 else w4a16_reference)(a, self.weights(),
                                                                self.out_dtype)
            return d if out is None else out.copy_(d)
        d = torch.empty(op.out_shape, dtype=self.out_dtype, device=self.device) \
            if out is None else out
        a2, d2 = (a.reshape(op.M, op.K), d.view(op.M, op.N)) if self._rows else (a, d)
        if self._launch is not None:
            self._launch(a2, d2)
        else:
            run(self.plan, a2, self.weights(), d2)
        return d


def _quantize_in_gemm(op: validate.Operands, b: NVFP4Tensor, out_dtype, pdl: bool,
                      path: str | None):
    """The small-M Config quantizing a's bf16 rows in the kernel for this call (Hopper, UE4M3
    weights, a path the small-M kernel serves: `sm90_tuning.quantize_in_gemm`), else None."""
    from tk_cute import arch

    if (b.device.type != "cuda" or op.batched or path not in (None, "small_m")
            or b.scale_format != "ue4m3" or not arch.device_target(b.device).wgmma):
        return None
    name = dtype_name(out_dtype)
    cfg = sm90_tuning.quantize_in_gemm(op.M, op.N, op.K, name, launch.sm_count(b.device))
    if cfg is None:
        return None
    return sm90_tuning.complete("small_m", cfg, op.N, op.K, True, name, "ue4m3", pdl)


def prepared(a, data, scales, global_scale, shape, scale_format: str, out_dtype, pdl: bool,
             path: str | None, quantize_a: bool = False) -> Call:
    """The `Call` of `gemm(a, b, out_dtype, pdl=pdl, path=path, quantize_a=quantize_a)` (bf16
    `a` with quantize_a) for weights b given by their
    parts (an NVFP4Tensor's, `Linear`'s buffers or the custom op's arguments, in any form the
    NVFP4Tensor constructor accepts; their values trusted), kept per weight (`_CALLS`). A new
    key normalizes and checks the parts' forms (`normalize_parts`) and validates in full
    (`Call`); a kept one is found by the activations' type, shape, dtype, device and layout
    and the weights' parts, shape and format, so anything that differs is a new key, never a
    skipped check. Parts that normalizing changes (flat scales, unpadded codes) are not kept:
    each call pays the normalization, as before."""
    if pdl is not True and pdl is not False:
        validate.flag("pdl", pdl)
    call = calls = None
    try:
        if isinstance(a, NVFP4Tensor):
            desc = (NVFP4Tensor, a.shape, a.scale_format, a.data.device)
        else:
            desc = (type(a), a.shape, a.dtype, a.device, a.layout)
        # (the parts' addresses too: `.data =` or `set_` moves a tensor's storage, keeping it)
        weights = (id(scales), id(global_scale), shape, scale_format, data.data_ptr(),
                   scales.data_ptr(), global_scale.data_ptr())
        key = (desc, weights, out_dtype, pdl, path, quantize_a)
        entry = _CALLS.get(id(data))
        if entry is not None and entry[0]() is data:
            calls = entry[1]
            call = calls.get(key)
            if call is not None:
                calls.move_to_end(key)  # (least recently used dropped first)
    except Exception:  # noqa: BLE001 - no shape, an unhashable argument: validation says
        key = None
    if call is None:
        parts = normalize_parts(data, scales, global_scale, shape, scale_format)
        call = Call(a, NVFP4Tensor.trusted(*parts, scale_format), out_dtype, pdl, path,
                    quantize_a)
        if key is not None and all(x is y for x, y in zip(parts, (data, scales, global_scale))):
            with _CALLS_LOCK:
                calls = calls if calls is not None else _calls_of(data)
                for k in [k for k in calls if k[1] != key[1]]:  # other parts or storage:
                    del calls[k]  # stale (and they would keep replaced scales alive)
                while len(calls) >= CALLS_PER_WEIGHT:
                    calls.popitem(last=False)
                calls[key] = call
        else:  # parts in other forms, copied or viewed: a call of its own, not kept
            call.held = parts[0]
    return call


def _calls_of(data) -> collections.OrderedDict:
    """The kept calls of the weights whose codes are `data` (a new, empty dict: the entry is
    removed when `data` is freed)."""
    key = id(data)

    def forget(ref, kept=_CALLS):  # (bound now: weights freed at interpreter exit, after the
        e = kept.get(key)          # module's globals are gone, still find the dict)
        if e is not None and e[0] is ref:
            del kept[key]

    calls = collections.OrderedDict()
    _CALLS[key] = (weakref.ref(data, forget), calls)
    return calls


def gemm_nvfp4(a, b: NVFP4Tensor, global_scale=None, *, out: NVFP4Tensor | None = None,
               pdl: bool = False, path: str | None = None) -> NVFP4Tensor:
    """D = a @ b^T quantized to NVFP4 (UE4M3 scales) with decode scale `global_scale`: bit for
    bit ``quantize(D32, global_scale=global_scale)`` of the fp32 D32 the path computes. The
    tiled register-A path (Hopper, M >= sm90_tuning.SPLIT_TILE_MIN_M, N % 128 == 0) and the
    Blackwell / Rubin kernel (path "sm100", `dispatch_sm100.gemm_sm100_nvfp4`: D32 =
    fl(acc * gA gB) of its fp32 accumulators, never stored) quantize in their epilogues (D never
    exists in fp32: 0.5625 instead of 4 bytes per element written); every other Hopper path
    writes fp32 D = `gemm(a, b, torch.float32)`, then the quantizer runs.

    Args:
        a, b: as `gemm` (2-D).
        global_scale: D's decode scale (a real or one-element tensor, positive, finite, at
            least 2^-126); or None with `out`, whose global scale is used.
        out: optional NVFP4Tensor (M, N) to write (its data and scales are overwritten).
        pdl, path: as `gemm`.

    Returns:
        The NVFP4Tensor D, with attribute `saturated`: a 0-dim int32 tensor on D's device, 1
        where some block scale saturated at 448 (the global scale was too small for D's
        values; those blocks are clipped), else 0. Reading it is the caller's choice (a sync).

    Raises:
        TypeError, ValueError: `gemm`'s operand rules; batched operands; N % 16 != 0 (16-element
        scale blocks along D's rows); neither or both of global_scale and out; an out of
        another shape or device; a global scale that is not positive-finite.
    """
    from .quantize import check_global_scale, quantize, saturated

    op = validate.gemm_operands(a, b, torch.float32, pdl=pdl)
    if op.batched:
        raise ValueError(f"NVFP4 output takes 2-D operands, got b {tuple(b.shape)}")
    if (global_scale is None) == (out is None):
        raise TypeError("NVFP4 output takes exactly one of global_scale (D's decode scale) and "
                        "out (an NVFP4Tensor holding it)")
    gs = out.global_scale if out is not None else check_global_scale(global_scale, b.device)
    d = validate.nvfp4_out((op.M, op.N), b.device, out, gs)  # checks out, or allocates D
    a2 = a if op.w4a4 else a.reshape(op.M, op.K)
    p = _plan(op, b.device, torch.float32, pdl, path, _scale_format(a, b), nvfp4_out=True)
    if p.path == "sm100":
        return dispatch_sm100.gemm_sm100_nvfp4(a2, b, None, config=p.config, out=d,
                                               checked=True)
    if p.path == "register_a_tiled" and not p.config.N_TAIL:  # (its epilogue: whole bands)
        return launch.register_a_tiled_nvfp4(a2, b, p.config, d)
    if p.path == "reference":
        from .reference import gemm_reference, w4a16_reference

        d32 = (gemm_reference if op.w4a4 else w4a16_reference)(a2, b, torch.float32)
        q = quantize(d32, global_scale=gs)
        d.data.copy_(q.data)
        d.scales.copy_(q.scales)
    else:
        d32 = run(p, a2, b, torch.empty((op.M, op.N), dtype=torch.float32, device=b.device))
        launch.quantize(d32, gs, check_finite=False, out=d)  # gs checked above: no 2nd read
    d.saturated = saturated(d32, gs)
    return d


# One-kernel path -> its launch on validated operands (`run`; `gsb` replaces gB as D's scale).
RUNS = {
    "small_m": lambda p, a, b, out, gsb: launch.small_m(a, b, out, p.config, gsb),
    "register_a": lambda p, a, b, out, gsb: launch.register_a(a, b, out, p.config, gsb=gsb),
    "register_a_tiled": lambda p, a, b, out, gsb: launch.register_a_tiled(a, b, out, p.config,
                                                                          gsb),
    "dequantize": lambda p, a, b, out, gsb: launch.dequantize(a, b, out),
    "sm100": lambda p, a, b, out, gsb: dispatch_sm100.gemm_sm100(
        a, b, out.dtype, config=p.config, out=out, checked=True),
    "sm100_w4a16": lambda p, a, b, out, gsb: dispatch_sm100.gemm_sm100_w4a16(
        a, b, out.dtype, config=p.config, out=out, checked=True),
}
# The paths a `Call` launches with the weights' arguments bound (`launch.SmallM`, ...).
BOUND = {"small_m": launch.SmallM, "register_a": launch.RegisterA}


def run(p: Plan, a, b: NVFP4Tensor, out: torch.Tensor, gsb=None) -> torch.Tensor:
    """Run plan `p` on validated operands into the contiguous `out` (2-D, or 3-D for
    "batches"); `gsb` replaces gB as D's scale."""
    if p.pad_n:
        wide = torch.empty(out.shape[0], p.pad_n, dtype=out.dtype, device=out.device)
        run(Plan(p.path, p.config), a, b, wide, gsb)
        out.copy_(wide[:, :out.shape[1]])
    elif p.path == "batches":
        sub = p.parts[0][2]
        for l in range(out.shape[0]):
            run(sub, _batch(a, l), _batch(b, l), out[l], gsb)
    else:
        RUNS[p.path](p, a, b, out, gsb)
    return out


def _batch(t, l: int):
    """Batch l of an operand: a tensor row, or an NVFP4Tensor view (its parts are contiguous
    per batch; the global scale is shared)."""
    if isinstance(t, NVFP4Tensor):
        return NVFP4Tensor.trusted(t.data[l], t.scales[l], t.global_scale, t.shape[1:],
                                   t.scale_format)
    return t[l] if t.dim() == 3 else t
