# SPDX-License-Identifier: MIT
"""tk_cute's Hopper NVFP4 kernels on the CPU: the launches `tk_cute.nvfp4.launch` makes on an H200
for the small-M (`nvfp4_small_m_sm90`), register-A (`nvfp4_register_a_sm90`) and tiled register-A
(`nvfp4_register_a_tiled_sm90`, whole tiles) paths, captured for sm_90a from CPU tensors and run
in the emulator over one global memory, in launch order.

`small_m(a, b, cfg, out)`, `register_a(a, b, cfg, out, ctas)` and `register_a_tiled(a, b, cfg,
out, sms)` take the same operands as the launch functions (a: bf16 (M, K) or NVFP4Tensor for
W4A4; b: NVFP4Tensor weights), write D into `out` and return the machines that ran their
launches (`Machine.hazards`). The workspaces the GPU path takes from `runtime.workspace` are CPU
tensors here.
"""

from __future__ import annotations

import torch

from tk_cute.emulator import machine
from tk_cute.emulator.launch import capture_all
from tk_cute.emulator.memory import GlobalMemory


def run(launches, *items, **options) -> list:
    """Run `launches` in order over one global memory holding every tensor of `items`
    (tensors, NVFP4Tensors) at its own address; the machines, in launch order."""
    from tk_cute.emulator.gemm import place

    mem = GlobalMemory()
    place(mem, *items)
    return [machine.run(ln, mem, **options) for ln in launches]


def _capture(fn, *lead, signature, values):
    return capture_all(fn, *lead, *signature.dsl_values({**values, "stream": 0}),
                       arch="sm_90a")


def small_m(a, b, cfg, out: torch.Tensor, **options) -> list:
    """The small-M kernel (`launch.small_m`) on CPU tensors (a: bf16, or an NVFP4Tensor for
    W4A4; bf16 with `cfg.QUANTIZE_A`); its machines."""
    from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv

    M, K = a.shape[-2], a.shape[-1]
    values = dict(w=b.data.data_ptr(), wsf=b.scales.data_ptr(), gsb=b.global_scale.data_ptr(),
                  out=out.data_ptr(), M=M, N=b.M, K=K)
    if cfg.w4a4 and not cfg.QUANTIZE_A:
        values.update(x=a.data.data_ptr(), xsf=a.scales.data_ptr(),
                      gsa=a.global_scale.data_ptr())
    else:  # bf16 a (xsf, gsa unused: launch.small_m passes the weights' scales and gB)
        values.update(x=a.data_ptr(), xsf=b.scales.data_ptr(), gsa=b.global_scale.data_ptr())
    launches = _capture(gv._launch, cfg, signature=gv.signature(cfg), values=values)
    return run(launches, a, b, out, **options)


def register_a(a, b, cfg, out: torch.Tensor, ctas: int, **options) -> list:
    """The register-A kernel (`launch.register_a`, permute pass included) on CPU tensors, on
    `ctas` CTAs (checked as the launch checks them, `check_grid`); its machines."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs

    (M, K), N = a.shape, b.M
    rs.check_shape(cfg, M, N, K)
    ctas = min(ctas, rs.stream_units(cfg, N, K))
    rs.check_grid(cfg, N, K, ctas)
    ws = torch.full((max(1, rs.partial_bytes(cfg, N, ctas) // 4),), float("nan"))  # poisoned
    values = dict(w=b.data.data_ptr(), wsf=b.scales.data_ptr(),
                  gsb=b.global_scale.data_ptr(), out=out.data_ptr(), ws=ws.data_ptr(), M=M,
                  N=N, K=K, ctas=ctas)
    held = [a, b, out, ws]
    if cfg.a_format == "nvfp4":  # launch._decoded_activations: + D's scale (16 bytes)
        xp = torch.zeros(cfg.N_ACT * rs.permuted_width(K) + 8, dtype=torch.bfloat16)
        values.update(x=a.data.data_ptr(), xsf=a.scales.data_ptr(),
                      gsa=a.global_scale.data_ptr(), xp=xp.data_ptr())
    else:
        xp = (torch.zeros(cfg.N_ACT * rs.permuted_width(K), dtype=torch.bfloat16)
              if cfg.permute == "call" else a)
        values.update(x=a.data_ptr(), xp=xp.data_ptr())
    held.append(xp)
    launches = _capture(rs.launch_fn(cfg), cfg, signature=rs.signature(cfg), values=values)
    return run(launches, *held, **options)


def register_a_tiled(a, b, cfg, out: torch.Tensor, sms: int, **options) -> list:
    """The tiled register-A kernel (`launch.register_a_tiled`, permute pass included) on CPU
    tensors (a: bf16), whole tiles on a persistent grid of at most `sms` CTAs; its machines."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
    from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst

    if cfg.STREAM_K or cfg.a_format != "bf16" or cfg.out_dtype == "nvfp4":
        raise ValueError(f"the emulator runs the tiled kernel's whole tiles on bf16 activations "
                         f"into a dense D, got {cfg}")
    (M, K), N = a.shape, b.M
    xp = torch.full((rst.padded_rows(cfg, M) * rs.permuted_width(K, cfg.K_TAIL),), float("nan"),
                    dtype=torch.bfloat16)  # (poisoned: the permute pass writes every row)
    p = out.data_ptr()  # (the NVFP4-output and stream-K arguments are unused)
    gs = b.global_scale.data_ptr()
    values = {"w": b.data.data_ptr(), "wsf": b.scales.data_ptr(), "x": a.data_ptr(),
              "xp": xp.data_ptr(), "gs": gs, "out": p, "out_sf": p, "out_gs": gs, "flag": p,
              "partials": p, "flags": p, "M": M, "N": N, "K": K, "ctas": sms}
    launches = _capture(rst.launch_fn(cfg), sms, signature=rst.signature(cfg), values=values)
    return run(launches, a, b, out, xp, **options)


def quantize(x: torch.Tensor, cfg, grid: int, **options) -> tuple:
    """The computed-scale quantizer (`launch.quantize`) on a CPU tensor x (L, M, K) or (M, K):
    ONE launch of a `grid`-CTA cluster (`cfg.one_launch`), else the amax pass on `grid` CTAs
    then the quantize pass; every output byte poisoned first (0xFF, a NaN global scale).
    Returns (the NVFP4Tensor, its machines)."""
    from tk_cute.kernels import nvfp4_quantize as nq
    from tk_cute.layouts.nvfp4_scales import blocked_shape
    from tk_cute.nvfp4 import NVFP4Tensor, launch
    from tk_cute.nvfp4.tensor import codes_storage

    *lead, M, K = x.shape
    L = lead[0] if lead else 1
    data = codes_storage(x.shape, "cpu", zero_padding=False)
    torch.empty(0, dtype=torch.uint8).set_(data.untyped_storage()).fill_(0xFF)
    scales = torch.full(blocked_shape(M, K, *lead), 0xFF, dtype=torch.uint8)
    # the workspace as `launch.quantize` lays it out: the decode scale, then the partials
    ws = torch.full((launch.PARTIALS_WORD + (0 if cfg.one_launch else grid),), float("nan"))
    wp = ws.data_ptr()
    out = dict(x=x.data_ptr(), data=data.data_ptr(), scales=scales.data_ptr())
    if cfg.one_launch:
        launches = _capture(nq._quantize_one_launch, cfg, signature=nq.one_launch_signature(cfg),
                            values=dict(out, gs_out=wp, M=M, K=K, L=L, ctas=grid))
    else:
        partials = wp + 4 * launch.PARTIALS_WORD
        launches = _capture(nq._amax, cfg, signature=nq.amax_signature(cfg), values=dict(
            x=x.data_ptr(), partials=partials, n_vec=x.numel() * cfg.esize // 16, grid=grid))
        launches += _capture(nq._quantize, cfg, signature=nq.quantize_signature(cfg),
                             values=dict(out, partials=partials, gs_in=wp, gs_out=wp, flag=wp,
                                         M=M, K=K, L=L, n_partials=grid))
    machines = run(launches, x, data, scales, ws, **options)
    return NVFP4Tensor.trusted(data, scales, ws[0], x.shape), machines
