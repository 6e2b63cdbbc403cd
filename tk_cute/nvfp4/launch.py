"""Torch-side launches of the NVFP4 kernels below the public calls: the Hopper (sm_90a) GEMM
paths under `tk_cute.nvfp4.gemm`, and the format kernels (quantize, block dequantize) that run
on every target.

Contract: the functions named after a path (`small_m`, `register_a`, `dequantize`)
take operands that `tk_cute.nvfp4.gemm` validated once (`validate`), a Config the Hopper rules
picked (`tk_cute.tuning.sm90`) and a preallocated contiguous output; they allocate workspaces, pack raw
pointers (each kernel's `signature`) and launch on the current stream. Nothing here syncs with
the host. `gemm_small_m` and `gemm_rs` are the tuning entries: they validate, then run one
kernel with a forced Config. `quantize` and `dequantize_blocks` are the format kernels' entries.

Global scales stay on the device: a path that needs gA * gB gets a 0-dim product computed on
the stream (`output_scale`), never a host value.
"""

from __future__ import annotations

import dataclasses
import math
import threading

import torch

from tk_cute import dense_gemm
from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv
from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst
from tk_cute.layouts import nvfp4_codes
from tk_cute.runtime import (aligned, device_index, dtype_name, kept_workspace, output,
                             raw_stream, resident_clusters, sm_count, stream_k_buffers,
                             workspace)
from tk_cute.launcher import OUT_ALIGN, KernelCache
from tk_cute.tuning import sm90 as sm90_tuning

from . import validate
from .tensor import NVFP4Tensor, codes_storage, has_row_pitch

_SMALL_M = KernelCache()  # (config, device index) -> Launcher
_REGISTER_A = KernelCache()
_REGISTER_A_TILED = KernelCache()
_DEQUANTIZE = KernelCache()


def output_scale(a, b: NVFP4Tensor) -> torch.Tensor:
    """The 0-dim fp32 scale of D: gB (W4A16) or gA * gB (W4A4), on the device."""
    return a.global_scale * b.global_scale if isinstance(a, NVFP4Tensor) else b.global_scale


def codes(q: NVFP4Tensor) -> int:
    """The address of q's codes as the kernels read them: rows `nvfp4_codes.row_pitch(K)`
    bytes apart (the layout every NVFP4Tensor keeps: `tensor.padded_codes`) from a 16-byte
    aligned start. ValueError otherwise: a copy here would be a silent per-call copy."""
    d = q.data
    if not has_row_pitch(d, q.K) or d.data_ptr() % OUT_ALIGN:
        raise ValueError(f"NVFP4 codes must start 16-byte aligned with rows "
                         f"{nvfp4_codes.row_pitch(q.K)} bytes apart (NVFP4Tensor's layout), "
                         f"got address {d.data_ptr():#x}, strides {d.stride()}")
    return d.data_ptr()


# ---------------------------------------------------------------- paths


def small_m(a, b: NVFP4Tensor, out: torch.Tensor, cfg: gv.Config, gsb=None) -> torch.Tensor:
    """The small-M kernel: a bf16 (M, K) (W4A16; W4A4 with `cfg.QUANTIZE_A`: quantized in the
    kernel) or NVFP4Tensor (W4A4, decoded in the kernel); `gsb` replaces gB as the output's
    scale (W4A4 on decoded bf16 activations: gA * gB)."""
    return SmallM(b, cfg, a.shape[-2], gsb)(a, out)


class SmallM:
    """The small-M kernel prepared for weights b, M rows and `cfg`: every argument the weights
    and the shape fix is bound once (`Launcher.bind`); a call passes the activations, D and
    the stream. Holds the weights' scales and decode scale (their addresses are bound), not
    the codes."""

    def __init__(self, b: NVFP4Tensor, cfg: gv.Config, M: int, gsb=None):
        K = b.K
        self.gsb = b.global_scale if gsb is None else gsb
        self.wsf = aligned(b.scales, 2)
        # NVFP4 activations (W4A4 but QUANTIZE_A, whose bf16 rows become NVFP4 in the kernel)
        self.w4a4, self.index = cfg.w4a4 and not cfg.QUANTIZE_A, device_index(b.device)
        fixed = dict(w=codes(b), wsf=self.wsf.data_ptr(), gsb=self.gsb.data_ptr(), M=M, N=b.M,
                     K=K)
        if not self.w4a4:  # (unread with bf16 activations)
            fixed.update(xsf=fixed["wsf"], gsa=fixed["gsb"])
        self.launch = _SMALL_M.get((cfg, self.index),
                                   lambda: gv.compile_launcher(cfg)).bind(**fixed)

    def __call__(self, a, out: torch.Tensor) -> torch.Tensor:
        # (every tensor whose address a launch takes stays referenced until it is queued: a
        # copy freed earlier could back the call's next allocation)
        if self.w4a4:
            xsf = aligned(a.scales, 2)
            self.launch(x=codes(a), xsf=xsf.data_ptr(), gsa=a.global_scale.data_ptr(),
                        out=out.data_ptr(), stream=raw_stream(self.index))
        else:
            x = aligned(a)
            self.launch(x=x.data_ptr(), out=out.data_ptr(), stream=raw_stream(self.index))
        return out


def register_a(a, b: NVFP4Tensor, out: torch.Tensor, cfg: rs.Config,
               ctas: int | None = None, gsb=None) -> torch.Tensor:
    """The register-A kernel (M <= 128) on bf16 activations a (M, K), or on NVFP4 ones (W4A4,
    `cfg.a_format` "nvfp4": decoded in the kernel's permute pass); `gsb` as in `small_m`."""
    return RegisterA(b, cfg, a.shape[0], ctas, gsb)(a, out)


class RegisterA:
    """The register-A kernel prepared for weights b, M rows, `cfg` and its grid (`ctas`;
    default `sm90_tuning.register_a_grid`; with `cfg.CLUSTER` no other count: ValueError), as
    `SmallM`. Workspaces per call
    (`runtime.workspace`, on the launch's stream): the fp32 partials (`rs.partial_bytes`; none with
    `cfg.DIRECT`, whose grid must give whole row blocks, or `cfg.CLUSTER`, whose grid is
    `rs.cluster_ctas`) and, with permute "call", the
    permuted activations (W4A4: and D's scale after them)."""

    def __init__(self, b: NVFP4Tensor, cfg: rs.Config, M: int, ctas: int | None = None,
                 gsb=None):
        N, K, dev = b.M, b.K, b.device
        rs.check_shape(cfg, M, N, K)  # (a K tail without cfg.K_TAIL would drop it silently)
        if ctas is None:
            ctas = sm90_tuning.register_a_grid(cfg, N, K, sm_count(dev))
        ctas = min(ctas, rs.stream_units(cfg, N, K))
        rs.check_grid(cfg, N, K, ctas)
        self.ws_bytes = rs.partial_bytes(cfg, N, ctas)
        self.cfg, self.K, self.device, self.index = cfg, K, dev, device_index(dev)
        self.gsb = b.global_scale if gsb is None else gsb
        self.wsf = aligned(b.scales)
        self.launch = _REGISTER_A.get((cfg, self.index), lambda: rs.compile_launcher(cfg)).bind(
            w=codes(b), wsf=self.wsf.data_ptr(), gsb=self.gsb.data_ptr(), M=M, N=N, K=K,
            ctas=ctas)

    def __call__(self, a, out: torch.Tensor) -> torch.Tensor:
        cfg, st = self.cfg, raw_stream(self.index)
        ws = workspace("planes", self.ws_bytes, self.device, st)
        if cfg.a_format == "nvfp4":
            args, _held = _decoded_activations(a, st, cfg.N_ACT)
            self.launch(**args, out=out.data_ptr(), ws=ws.data_ptr(), stream=st)
            return out
        x = aligned(a)
        xp = _permuted_buffer(cfg.N_ACT, self.K, self.device, st) if cfg.permute == "call" else x
        self.launch(x=x.data_ptr(), xp=xp.data_ptr(), out=out.data_ptr(), ws=ws.data_ptr(),
                    stream=st)
        return out


def _permuted_buffer(rows: int, K: int, device, stream: int, extra: int = 0) -> torch.Tensor:
    """The permute pass's output (a `runtime.workspace` of `stream`): `rows` (the register-A
    kernel's N_ACT, the tiled kernel's `padded_rows`: those past M zeros) rows of
    `rs.permuted_width(K)` bf16 (K rounded up to the permutation's 128: a K tail's columns are
    zeros there), then `extra` bf16 elements."""
    return workspace("permuted", 2 * (rows * rs.permuted_width(K) + extra), device, stream)


def _decoded_activations(a: NVFP4Tensor, stream: int, rows: int) -> tuple[dict, tuple]:
    """The launch arguments of NVFP4 activations that a register-A kernel's permute pass
    decodes: their codes, blocked scales and decode scale, and the buffer it decodes into
    (`_permuted_buffer` of `rows`, then D's scale: 16 bytes); and the tensors behind them, for
    the caller to hold until the launch is queued (`small_m`)."""
    K = a.shape[1]
    xp = _permuted_buffer(rows, K, a.device, stream, 8)
    xsf = a.scales.contiguous()
    return dict(x=codes(a), xsf=xsf.data_ptr(), gsa=a.global_scale.data_ptr(),
                xp=xp.data_ptr()), (xp, xsf)


def register_a_tiled(a, b: NVFP4Tensor, out: torch.Tensor, cfg: rst.Config,
                     gsb=None) -> torch.Tensor:
    """The tiled register-A kernel (large M) on bf16 activations a (M, K), or NVFP4 ones (W4A4,
    `cfg.a_format` "nvfp4": decoded in its permute pass); `gsb` as in `small_m`. Workspace:
    the permuted activations (`_permuted_buffer`; W4A4: + D's scale)."""
    p = out.data_ptr()  # (the NVFP4-output arguments are unused: any valid address)
    _launch_tiled(a, b, cfg, gsb, p, p, b.global_scale.data_ptr(), p)
    return out


def _launch_tiled(a, b: NVFP4Tensor, cfg: rst.Config, gsb, out: int, out_sf: int, out_gs: int,
                  flag: int) -> None:
    (M, K), N = a.shape, b.M
    dev = b.device
    sms = sm_count(dev)
    rst.check_shape(M, N, K, cfg)  # (a K tail without cfg.K_TAIL would drop it silently)
    index = device_index(dev)
    st = raw_stream(index)
    launch = _REGISTER_A_TILED.get((cfg, index), lambda: rst.compile_launcher(cfg, sms))
    # (every buffer stays referenced until the launch is queued: `small_m`)
    partials = flags = None
    ctas = sms
    if cfg.STREAM_K:
        ctas, partials, flags = stream_k_buffers(  # (K steps: its X tiles)
            "tiled_stream_k", rst.tiles(M, N, cfg), rs.k_blocks(cfg.K_TAIL, K),
            rst.partial_bytes(cfg), sms, dev, st, teams=cfg.TEAMS)
    wsf = aligned(b.scales)
    common = dict(w=codes(b), wsf=wsf.data_ptr(),
                  gs=(b.global_scale if gsb is None else gsb).data_ptr(), out=out,
                  out_sf=out_sf, out_gs=out_gs, flag=flag,
                  partials=out if partials is None else partials.data_ptr(),
                  flags=out if flags is None else flags.data_ptr(), M=M, N=N, K=K, ctas=ctas,
                  stream=st)
    rows = rst.padded_rows(cfg, M)  # whole tiles of the permuted copy (its rows past M zeros)
    if cfg.a_format == "nvfp4":
        args, _held = _decoded_activations(a, st, rows)
        launch(**args, **common)
    else:
        x, xp = aligned(a), _permuted_buffer(rows, K, dev, st)
        launch(x=x.data_ptr(), xp=xp.data_ptr(), **common)


def register_a_tiled_nvfp4(a, b: NVFP4Tensor, cfg: rst.Config, out: NVFP4Tensor,
                           gsb=None) -> NVFP4Tensor:
    """The tiled register-A kernel with its fused NVFP4 epilogue into `out` (M, N), an
    NVFP4Tensor from `validate.nvfp4_out` (its global scale is D's decode scale; its
    `saturated` flag, zeroed there, is set where a block scale saturated)."""
    cfg = dataclasses.replace(cfg, out_dtype="nvfp4")
    out.scales.zero_()  # padding rows and columns of the blocked layout are zeros
    _launch_tiled(a, b, cfg, gsb, out.data.data_ptr(), out.scales.data_ptr(),
                  out.global_scale.data_ptr(), out.saturated.data_ptr())
    return out


def dequantize(a, b: NVFP4Tensor, out: torch.Tensor, paired: bool | None = None) -> torch.Tensor:
    """Any shape: the FP4 operands expanded to exact bf16 e2m1 * ue4m3 in global memory (2 B
    per element of workspace), then the dense Hopper GEMM times gA * gB (gB for W4A16) in its
    epilogue. Output rows must be 16-byte aligned (the caller pads N otherwise). `paired`
    (default `sm90_tuning.DEQUANTIZE_PAIRED`): W4A4 operands of one scale format in one
    launch."""
    paired = sm90_tuning.DEQUANTIZE_PAIRED if paired is None else paired
    if isinstance(a, NVFP4Tensor) and paired and a.scale_format == b.scale_format:
        a16, b16, scale = dequantize_pair(a, b)
    else:
        a16 = dequantize_blocks(a) if isinstance(a, NVFP4Tensor) else aligned(a)
        b16, scale = dequantize_blocks(b), output_scale(a, b)
    dense_gemm.scaled(a16, b16, scale, out)
    return out


# ---------------------------------------------------------------- format kernels


def dequantize_blocks(q: NVFP4Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """e2m1 * sf of a 2-D CUDA NVFP4Tensor as a bf16 (M, K) tensor, sf its UE4M3 or UE5M3
    scale (global scale NOT applied: the product is exact in bf16, times the fp32 scale it
    would not be)."""
    from tk_cute.kernels import nvfp4_dequantize as dq

    M, K = q.shape
    _check_dequantize("dequantize_blocks", q.device, M, K, f"{M} x {K}")
    out = output(out, (M, K), torch.bfloat16, q.device, "dequantize_blocks")
    index = device_index(q.device)
    fmt = q.scale_format
    launch = _DEQUANTIZE.get((fmt, index), lambda: dq.compile_launcher(fmt))
    launch(data=codes(q), scales=q.scales.contiguous().data_ptr(),
           out=out.data_ptr(), words=M * K // 8, words_per_row=K // 8,
           stream=raw_stream(index))
    return out


def _check_dequantize(name: str, device, rows: int, K: int, shape: str) -> None:
    """The block dequantize's limits: a CUDA device, fewer than 2^31 elements (the kernel
    indexes them with 32-bit integers)."""
    if device.type != "cuda":
        raise ValueError(f"{name} runs on CUDA tensors, got {device}")
    if rows * K >= 2**31:
        raise ValueError(f"{name} takes fewer than 2^31 elements, got {shape}")


def dequantize_pair(a: NVFP4Tensor, b: NVFP4Tensor, out_a: torch.Tensor | None = None,
                    out_b: torch.Tensor | None = None) -> tuple:
    """(`dequantize_blocks(a)`, `dequantize_blocks(b)`, gA * gB as a 0-dim fp32 tensor) of two
    2-D CUDA NVFP4Tensors of one K and one scale format, in one launch (into `out_a` /
    `out_b` where given, checked as `dequantize_blocks`'s `out`)."""
    from tk_cute.kernels import nvfp4_dequantize as dq

    (M, K), (N, Kb) = a.shape, b.shape
    if K != Kb or a.scale_format != b.scale_format or a.device != b.device:
        raise ValueError(f"dequantize_pair takes operands of one K, scale format and device, "
                         f"got K {K} / {Kb}, {a.scale_format} / {b.scale_format}, "
                         f"{a.device} / {b.device}")
    _check_dequantize("dequantize_pair", a.device, M + N, K, f"({M} + {N}) x {K}")
    a16 = output(out_a, (M, K), torch.bfloat16, a.device, "dequantize_pair")
    b16 = output(out_b, (N, K), torch.bfloat16, a.device, "dequantize_pair")
    scale = torch.empty((), dtype=torch.float32, device=a.device)
    index = device_index(a.device)
    fmt = a.scale_format
    launch = _DEQUANTIZE.get((fmt, index, "pair"), lambda: dq.compile_launcher(fmt, pair=True))
    launch(data_a=codes(a), scales_a=a.scales.contiguous().data_ptr(), out_a=a16.data_ptr(),
           data_b=codes(b), scales_b=b.scales.contiguous().data_ptr(), out_b=b16.data_ptr(),
           gs_a=a.global_scale.data_ptr(), gs_b=b.global_scale.data_ptr(),
           gs_out=scale.data_ptr(), words_a=M * K // 8, words_b=N * K // 8,
           words_per_row=K // 8, stream=raw_stream(index))
    return a16, b16, scale


_QUANTIZE = KernelCache()
QUANTIZE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}  # nq
PARTIALS_WORD = 4  # the quantizer's workspace: the decode scale, then the amax partials here
# Quantize plans kept, one per (dtype, shape, device, layout, mode, config) (~1.3 KB each);
# past this the oldest is dropped (code that quantizes ever new shapes must not grow the dict).
QUANTIZE_PLAN_ENTRIES = 1024
_PLANS: dict = {}
_PLANS_LOCK = threading.Lock()


class _QuantizePlan:
    """Everything about one (dtype, shape, device, layout, mode, config) of the quantizer:
    compiled launchers with what the shape fixes bound, grids, output shapes. Its Config: the
    caller's, else `tuning.quantize.config` (one launch for small inputs with the computed
    scale)."""

    def __init__(self, x, given: bool, check: bool, config):
        from tk_cute.arch import device_target
        from tk_cute.kernels import nvfp4_quantize as nq
        from tk_cute.layouts.nvfp4_scales import blocked_shape
        from tk_cute.tuning import quantize as quantize_tuning

        dtype = QUANTIZE_DTYPES[x.dtype]
        x_bytes = x.numel() * x.element_size()
        target = device_target(x.device).name  # (first: it names an unsupported GPU)
        def of_call(c):  # the call's fields of a Config
            return dataclasses.replace(c, dtype=dtype, given_scale=given, check_finite=check,
                                       one_launch=c.one_launch and not given, arch=target)

        sms = sm_count(x.device)
        cfg = of_call(config or quantize_tuning.config(x.shape, x.element_size(), given, sms))
        *lead, M, K = x.shape
        self.M, self.K, self.L = M, K, (lead[0] if lead else 1)
        self.shape = x.shape
        self.scales_shape = blocked_shape(M, K, *lead)
        self.device = x.device
        self.device_index = device_index(x.device)
        grid = (quantize_tuning.one_launch_ctas(cfg, self.L * M * -(-K // cfg.cols), x_bytes)
                if cfg.one_launch else 0)
        if grid and resident_clusters(x.device, grid) < 1:  # (SMs restricted: two launches)
            cfg = of_call(quantize_tuning.pass_config(x.shape, x.element_size(), sms))
        self.cfg, self.one_launch = cfg, cfg.one_launch
        self.amax = None
        if cfg.one_launch:  # the decode scale is the only workspace: a 0-dim output
            self.grid = grid
            self.quant = _QUANTIZE.get(("one_launch", cfg), lambda: nq.compile_one_launch(
                cfg)).bind(M=M, K=K, L=self.L, ctas=self.grid)
            return
        n_vec = x_bytes // 16
        per_cta = cfg.amax_threads * cfg.amax_unroll
        self.grid = 0 if given else max(1, min(sms * cfg.amax_ctas_per_sm,
                                               -(-n_vec // per_cta)))
        # the decode scale (the result's global scale: a 0-dim view at offset 0, a tensor of
        # its own as an op output must be), then the amax partials from 16 bytes on
        self.ws_words = PARTIALS_WORD + self.grid
        if not given:
            acfg = cfg.amax_part
            self.amax = _QUANTIZE.get(("amax", acfg), lambda: nq.compile_amax(acfg)).bind(
                n_vec=n_vec, grid=self.grid)
        self.quant = _QUANTIZE.get(("quantize", cfg), lambda: nq.compile_quantize(cfg)).bind(
            M=M, K=K, L=self.L, n_partials=self.grid)

    def result(self, data: torch.Tensor, scales: torch.Tensor, gs: torch.Tensor) -> NVFP4Tensor:
        """The NVFP4Tensor of this call's parts (codes from `codes_storage`: not checked again)."""
        return NVFP4Tensor.trusted(data, scales, gs, self.shape, padded=True)


def _quantize_plan(x, given: bool, check: bool, config, check_input=None) -> _QuantizePlan:
    """The plan of x's (dtype, shape, device, layout) in this mode, made at its first call
    after `check_input(x)` (the caller's input validation: it runs once per kind of input;
    a nested tensor, which has no shape to key by, is always checked)."""
    if check_input is not None and x.is_nested:
        check_input(x)
    key = (x.dtype, x.shape, x.device, x.layout, given, check, config)
    plan = _PLANS.get(key)
    if plan is None:
        if check_input is not None:
            check_input(x)
        with _PLANS_LOCK:
            plan = _PLANS.get(key)
            if plan is None:
                while len(_PLANS) >= QUANTIZE_PLAN_ENTRIES:
                    del _PLANS[next(iter(_PLANS))]
                plan = _PLANS[key] = _QuantizePlan(x, given, check, config)
    return plan


def quantize(x: torch.Tensor, global_scale=None, *, check_finite: bool = True,
             config=None, out: NVFP4Tensor | None = None, check_input=None) -> NVFP4Tensor:
    """Quantize a CUDA tensor validated by `tk_cute.nvfp4.quantize` (its docstring has the
    arguments), or by `check_input(x)` (raising for an input `quantize` refuses), which runs
    once per (dtype, shape, device, layout): at its plan's first call. Per call: a dict lookup
    (the per-shape plan), 3 torch.empty (+1 zeros on the given-scale checked path) and 1-2
    launches (one for a small input with the computed scale: `tuning.quantize`); one host
    sync when check_finite.
    `out`: with a given scale, an NVFP4Tensor of x's shape checked by `validate.nvfp4_out`
    whose data and scales receive the bytes (it is returned).

    Returns:
        NVFP4Tensor on x's device (global_scale: a 0-dim tensor, or a view into a small
        workspace).
    """
    given = global_scale is not None
    plan = _quantize_plan(x, given, check_finite, config, check_input)
    x = aligned(x)  # 16-byte vector loads
    dev = plan.device
    if out is not None:
        data, scales = out.data, out.scales
    else:
        data = codes_storage(plan.shape, dev, zero_padding=False)  # the kernel writes it
        scales = torch.empty(plan.scales_shape, dtype=torch.uint8, device=dev)
    st = raw_stream(plan.device_index)
    if plan.one_launch:
        gs = torch.empty((), dtype=torch.float32, device=dev)
        _run_quantize(plan, x, data.data_ptr(), scales.data_ptr(), gs.data_ptr(), st)
        if check_finite and not math.isfinite(gs.item()):  # the one host sync
            raise ValueError(NON_FINITE)
        return out if out is not None else plan.result(data, scales, gs)
    ws = torch.empty(plan.ws_words, dtype=torch.float32, device=dev)
    gs_in = None
    if given:
        gs = global_scale
        if gs.dtype != torch.float32 or gs.device != dev:
            gs = gs.to(device=dev, dtype=torch.float32)
        gs_in = gs.data_ptr()
    flag = torch.zeros(1, dtype=torch.int32, device=dev) if plan.cfg.flag else None
    _run_quantize(plan, x, data.data_ptr(), scales.data_ptr(), ws.data_ptr(), st, gs_in,
                  None if flag is None else flag.data_ptr())
    if check_finite:  # the one host sync
        bad = bool(flag.item()) if flag is not None else not math.isfinite(ws[0].item())
        if bad:
            raise ValueError(NON_FINITE)
    return out if out is not None else plan.result(data, scales, ws[0])


NON_FINITE = ("quantize input must be finite: x contains NaN/Inf value(s) (found on the device; "
              "pass check_finite=False to skip this check)")


def _run_quantize(plan: _QuantizePlan, x: torch.Tensor, data: int, scales: int, ws: int,
                  stream: int, gs_in: int | None = None, flag: int | None = None) -> None:
    """The quantizer's launches of `plan` on aligned x into codes `data` and blocked `scales`:
    one launch writing the decode scale at `ws`, or (`plan.ws_words` fp32 at `ws`: the decode
    scale, the amax partials from PARTIALS_WORD on) the amax pass unless a scale is given
    (`gs_in`), then the quantize pass; `flag`: the checked path's non-finite flag."""
    if plan.one_launch:
        plan.quant(x=x.data_ptr(), data=data, scales=scales, gs_out=ws, stream=stream)
        return
    partials = ws + 4 * PARTIALS_WORD
    if gs_in is None:
        gs_in = ws
        plan.amax(x=x.data_ptr(), partials=partials, stream=stream)
    plan.quant(x=x.data_ptr(), data=data, scales=scales, partials=partials, gs_in=gs_in,
               gs_out=ws, flag=ws if flag is None else flag, stream=stream)


class QuantizeA:
    """``quantize(a, check_finite=False)`` of one activation shape, as a W4A4 `gemm` call with
    quantize_a runs it where the GEMM kernel does not quantize (`gemm.Call`): the plan found
    once (`tuning.quantize.pass_config`: two launches); per call only the quantizer's
    launches, into one workspace of the stream
    (`runtime.workspace` "quantize_a": the codes, the blocked scales, then the fp32 decode
    scale and amax partials) instead of three allocations, and the NVFP4Tensor over it
    carved again only when the kept buffer changes (per call where `workspace` allocates per
    call: a capture, the custom ops off the default stream, more than WORKSPACE_CACHE_BYTES).
    (H100: the W4A4 MLP block of `bench model` at 16 rows queued 168 us of host per forward
    against 259 through `quantize`, docs/facts.md#quantize-a-workspace.) The result is valid
    until the next call on the stream, which the GEMM behind it precedes (stream order, as the
    caching allocator's reuse of a freed block). Holds the last kept buffer it carved (at most
    WORKSPACE_CACHE_BYTES)."""

    def __init__(self, a: torch.Tensor):
        from tk_cute.tuning import quantize as quantize_tuning

        self.plan = p = _quantize_plan(a, False, False, quantize_tuning.pass_config(
            a.shape, a.element_size(), sm_count(a.device)))
        self.pitch = nvfp4_codes.row_pitch(p.K)
        self.scales_at = -(-p.M * self.pitch // 16) * 16
        self.ws_at = self.scales_at + -(-math.prod(p.scales_shape) // 16) * 16
        self.nbytes = self.ws_at + 4 * p.ws_words  # (two launches: `pass_config`)
        self._buf = self._q = None

    def __call__(self, a: torch.Tensor) -> NVFP4Tensor:
        p = self.plan
        st = raw_stream(p.device_index)
        buf = kept_workspace("quantize_a", self.nbytes, p.device, st)
        if buf is None or buf is not self._buf:
            q = self._carve(torch.empty(self.nbytes, dtype=torch.uint8, device=p.device)
                            if buf is None else buf)
            if buf is not None:
                self._buf, self._q = buf, q
        else:
            q = self._q
        _run_quantize(p, aligned(a), q.data.data_ptr(), q.scales.data_ptr(),
                      q.global_scale.data_ptr(), st)
        return q

    def _carve(self, buf: torch.Tensor) -> NVFP4Tensor:
        p = self.plan
        data = buf[:p.M * self.pitch].view(p.M, self.pitch)[:, :p.K // 2]
        scales = buf[self.scales_at:self.scales_at + math.prod(p.scales_shape)].view(
            p.scales_shape)
        gs = buf[self.ws_at:self.ws_at + 4].view(torch.float32).view(())
        return NVFP4Tensor.trusted(data, scales, gs, p.shape)


# ---------------------------------------------------------------- tuning entries


def gemm_small_m(a, b, out_dtype=None, *, out=None, config: gv.Config | None = None,
                 splits: int | None = None, pdl: bool = False):
    """D = a @ deq(b)^T with the small-M kernel and a chosen Config (tuning and tests; the
    public `tk_cute.nvfp4.gemm` picks kernels itself).

    Args:
        a: bf16 CUDA tensor (M, K) (W4A16) or NVFP4Tensor (M, K) (W4A4), 1 <= M <= 64.
        b: NVFP4Tensor (N, K), the weights.
        out_dtype, out: as `tk_cute.nvfp4.gemm`.
        config, splits: tuning overrides (`Config`; its S, the number of K-slices, at most
            K / config.k_chunk, slices one trip apart where S does not divide it); default
            `sm90_tuning.small_m_config`.
        pdl: programmatic dependent launch (`tk_cute.nvfp4.gemm`'s pdl).

    Raises:
        TypeError, ValueError: the operand rules of `tk_cute.nvfp4.gemm`, a non-CUDA device, or
            a shape the Config does not take (`nvfp4_small_m_sm90.check_shape`).
    """
    out_dtype = out.dtype if out_dtype is None and out is not None else (
        out_dtype or torch.bfloat16)
    op = validate.gemm_operands(a, b, out_dtype, out=out, pdl=pdl, cuda=True)
    if op.batched:
        raise ValueError(f"gemm_small_m takes 2-D operands, got a {tuple(a.shape)}")
    name = dtype_name(out_dtype)
    if config is None:
        config = sm90_tuning.small_m_config(op.M, op.N, op.K, op.w4a4, name, sm_count(b.device))
    cfg = sm90_tuning.complete("small_m", config, op.N, op.K, op.w4a4, name,
                               validate.one_scale_format(a, b, "gemm_small_m"), pdl)
    if splits is not None:
        cfg = dataclasses.replace(cfg, S=splits)
    gv.check_shape(cfg, op.M, op.N, op.K)
    out = output(out, (op.M, op.N), out_dtype, b.device, "gemm_small_m")
    return small_m(a, b, out, cfg)


def gemm_rs(a, b, out_dtype=None, *, out=None, config: rs.Config | None = None,
            ctas: int | None = None, pdl: bool = False):
    """D = a @ deq(b)^T (W4A16) with the register-A kernel and a chosen Config or grid
    (tuning and tests; the public `tk_cute.nvfp4.gemm` picks kernels itself).

    Args:
        a: bf16 CUDA tensor (M, K), 1 <= M <= 128.
        b: NVFP4Tensor (N, K), the weights.
        out_dtype, out: as `tk_cute.nvfp4.gemm`.
        config: tuning override (`Config`; default `sm90_tuning.register_a_config`).
        ctas: CTAs sharing the (N / ROWS) x (K / 256) stage units (default
            `sm90_tuning.register_a_grid`; with `config.CLUSTER` only that grid,
            `nvfp4_register_a_sm90.cluster_ctas`).
        pdl: programmatic dependent launch with the activations permuted per stage: a
            Config permuting "auto" does so with pdl up to N_ACT =
            `tuning.sm90.PDL_STAGE_MAX_N_ACT` (48); from 64 the per-call pass stays and pdl is
            ignored (with the pass between the calls it was 1-8% slower on the H200 at M =
            32-128; per stage with pdl lost to the pass at 64 rows, H100,
            docs/facts.md#rs-stage-pdl).

    Raises:
        TypeError, ValueError: the operand rules of `tk_cute.nvfp4.gemm`, NVFP4 activations, a
            non-CUDA device, a shape the Config does not take
            (`nvfp4_register_a_sm90.check_shape`), ctas < 1, or with `config.CLUSTER` a
            ctas other than its grid.
    """
    out_dtype = out.dtype if out_dtype is None and out is not None else (
        out_dtype or torch.bfloat16)
    op = validate.gemm_operands(a, b, out_dtype, out=out, pdl=pdl, cuda=True)
    if op.w4a4 or op.batched:
        raise TypeError(f"gemm_rs takes 2-D bf16 activations (W4A16), got "
                        f"{type(a).__name__} {tuple(a.shape)}")
    name = dtype_name(out_dtype)
    if config is None:
        config = sm90_tuning.register_a_config(op.M, op.N, op.K, name)
    config = sm90_tuning.complete("register_a", config, op.N, op.K, False, name,
                                  b.scale_format, pdl)
    rs.check_shape(config, op.M, op.N, op.K)
    if ctas is not None and ctas < 1:
        raise ValueError(f"gemm_rs needs ctas >= 1, got ctas={ctas}")
    out = output(out, (op.M, op.N), out_dtype, b.device, "gemm_rs")
    return register_a(a, b, out, config, ctas)


def gemm_rs_tiled(a, b, out_dtype=None, *, out=None, config: rst.Config | None = None):
    """D = a @ deq(b)^T (W4A16) with the tiled register-A kernel and a chosen Config (tuning
    and tests; default `sm90_tuning.register_a_tiled_config`).

    Raises:
        TypeError, ValueError: the operand rules of `tk_cute.nvfp4.gemm`, NVFP4 activations, a
            non-CUDA device, or a shape the kernel does not take
            (`nvfp4_register_a_tiled_sm90.check_shape`).
    """
    out_dtype = out.dtype if out_dtype is None and out is not None else (
        out_dtype or torch.bfloat16)
    op = validate.gemm_operands(a, b, out_dtype, out=out, cuda=True)
    if op.w4a4 or op.batched:
        raise TypeError(f"gemm_rs_tiled takes 2-D bf16 activations (W4A16), got "
                        f"{type(a).__name__} {tuple(a.shape)}")
    name = dtype_name(out_dtype)
    rst.check_shape(op.M, op.N, op.K)
    if config is None:
        config = sm90_tuning.register_a_tiled_config(op.M, op.N, op.K, name, sm_count(b.device))
    config = sm90_tuning.complete("register_a_tiled", config, op.N, op.K, False, name,
                                  b.scale_format, False)
    out = output(out, (op.M, op.N), out_dtype, b.device, "gemm_rs_tiled")
    return register_a_tiled(a, b, out, config)
