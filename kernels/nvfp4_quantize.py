# SPDX-License-Identifier: MIT
"""NVFP4 quantizer: bf16/fp16/fp32 (L, M, K) -> packed E2M1, blocked UE4M3 scales, fp32 scale.

Two kernels, bit-exact with ``tk_cute.nvfp4.quantize_reference`` (its docstring is the contract):

* `amax` (skipped when a global scale is given): grid-stride 16-byte loads, |bits| max (integer
  max keeps NaN/Inf above every finite value), warp ``redux.sync``, one ``red.max`` per warp.
* `quantize`: one CTA per 128-row x 64-column tile = one 512-byte scale atom. Thread t owns
  16-element blocks (row t//4 + 32*i, K-block t%4): two to four 16-byte loads, block amax,
  UE4M3 scale, E2M1 codes, one 8-byte data store and one scale byte. Rows past M and K-blocks
  past K/16 load zeros, so their scale bytes come out 0 (the padding) and their data is skipped.
  Each CTA derives the global scales from the amax word itself (no extra launch), CTA 0 writes
  the decode scale, and a warp vote sets the non-finite flag (word 1 of the workspace).
Both read each input byte once; when x fits in L2 (H200: 50 MB) the second pass hits L2.
Peers: CUTLASS ``cute/ampere/kernel/elementwise`` (copy structure), TK ``nvfp4_b200/quantize``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from tk_cute.ops import nvfp4 as fp4

ATOM_ROWS, ATOM_KBLOCKS, ATOM_BYTES, SF_VEC = 128, 4, 512, 16
DTYPES = {"bf16": 2, "f16": 2, "f32": 4}  # element bytes


@dataclass(frozen=True)
class Config:
    """dtype: "bf16" | "f16" | "f32"; given_scale: skip amax, read the decode scale;
    blocks_per_thread: 16-element blocks each thread owns (threads = 512 / it);
    arch: compile target (native FP4 cvt on sm_100a+)."""

    dtype: str = "bf16"
    given_scale: bool = False
    blocks_per_thread: int = 4
    arch: str = "sm_90a"
    amax_ctas_per_sm: int = 4

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.blocks_per_thread not in (1, 2, 4, 8):
            raise ValueError(f"blocks_per_thread must be 1, 2, 4 or 8, got {self.blocks_per_thread}")

    @property
    def threads(self) -> int:
        return ATOM_ROWS * ATOM_KBLOCKS // self.blocks_per_thread

    @property
    def esize(self) -> int:
        return DTYPES[self.dtype]


AMAX_THREADS, AMAX_UNROLL = 256, 4


def _to_f32(words, dtype: str) -> list:
    """Input words (16-bit pairs or float32 bits) -> float32 values, exact."""
    if dtype == "f32":
        return [fp4.from_bits(w) for w in words]
    out = []
    for w in words:
        if dtype == "bf16":
            out += [fp4.from_bits(w << 16), fp4.from_bits(w & 0xFFFF0000)]
        else:
            out += [_f16_to_f32(w, 0), _f16_to_f32(w, 1)]
    return out


def _f16_to_f32(w, half: int):
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    text = "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, %s; }" % ("lo", "hi")[half]
    return Float32(
        llvm.inline_asm(T.f32(), [Uint32(w).ir_value()], text, "=f,r",
                        has_side_effects=False, is_align_stack=False,
                        asm_dialect=llvm.AsmDialect.AD_ATT)
    )


def _abs_max_bits(words, dtype: str) -> Uint32:
    """float32 bit pattern of max |x| over the words (NaN/Inf compare above every finite)."""
    if dtype == "f32":
        m = words[0] & 0x7FFFFFFF
        for w in words[1:]:
            m = Uint32(cutlass.max(m, w & 0x7FFFFFFF))
        return Uint32(m)
    m = words[0] & 0x7FFF7FFF
    for w in words[1:]:
        m = fp4.max_u16x2(m, w & 0x7FFF7FFF)
    m = Uint32(cutlass.max(m & 0xFFFF, m >> 16))
    if dtype == "bf16":
        return Uint32(m << 16)
    return fp4.bits(_f16_to_f32(m, 0))


def _global_scales(cfg: Config, ws, gs_in):
    """(s_dec_g, s_enc_g): from the amax word (recipe step 2-3) or the given decode scale."""
    if cutlass.const_expr(cfg.given_scale):
        s_dec = gs_in[0]
    else:
        amax = fp4.from_bits(Uint32(ws[0]))
        s_dec = fp4.div_rn(fp4.max_f32(amax, fp4.from_bits(Uint32(fp4.F32_1E_12))),
                           Float32(2688.0))
    return s_dec, fp4.div_rn(Float32(1.0), s_dec)


@cute.kernel
def _amax_kernel(cfg: cutlass.Constexpr, x: cute.Tensor, ws: cute.Tensor, n_vec: Int64):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    base = x.iterator.toint()
    stride = Int64(gdim) * (AMAX_THREADS * AMAX_UNROLL)
    first = Int64(bidx) * (AMAX_THREADS * AMAX_UNROLL) + Int64(tidx)
    iters = (n_vec - first + stride - 1) // stride
    m = Uint32(0)
    for it in cutlass.range(Int32(iters)):
        for u in cutlass.range_constexpr(AMAX_UNROLL):
            v = first + Int64(it) * stride + u * AMAX_THREADS
            words = fp4.ld_v4_pred(base + v * 16, Uint32(v < n_vec))
            blk = _abs_max_bits(words, cfg.dtype)
            m = Uint32(cutlass.max(m, blk))
    m = cute.arch.warp_redux_sync(m, "umax")
    if cute.arch.lane_idx() == 0:
        cute.arch.atomic_max(ws.iterator, Int32(m))


@cute.kernel
def _quantize_kernel(
    cfg: cutlass.Constexpr,
    x: cute.Tensor,
    data: cute.Tensor,
    scales: cute.Tensor,
    ws: cute.Tensor,
    gs_in: cute.Tensor,
    gs_out: cute.Tensor,
    M: Int32,
    K: Int32,
):
    tidx, _, _ = cute.arch.thread_idx()
    kt, mt, l = cute.arch.block_idx()
    ntk, ntm, _ = cute.arch.grid_dim()
    s_dec_g, s_enc_g = _global_scales(cfg, ws, gs_in)
    if cutlass.const_expr(not cfg.given_scale):
        if (kt + mt + l + tidx) == 0:
            gs_out[0] = s_dec_g

    kblocks = K // SF_VEC
    row0 = Int64(l) * Int64(M)
    x_base, d_base = x.iterator.toint(), data.iterator.toint()
    sf_base = scales.iterator.toint() + ((Int64(l) * ntm + mt) * ntk + kt) * ATOM_BYTES
    words_per_block = SF_VEC * cfg.esize // 4
    bad = Uint32(0)
    # All loads first: they are independent, and issuing them together keeps
    # blocks_per_thread x 32-64 bytes in flight per thread.
    blocks = []
    for i in cutlass.range_constexpr(cfg.blocks_per_thread):
        r_local = tidx // ATOM_KBLOCKS + (cfg.threads // ATOM_KBLOCKS) * i
        kb_local = tidx % ATOM_KBLOCKS
        row = mt * ATOM_ROWS + r_local
        kb = kt * ATOM_KBLOCKS + kb_local
        valid = Uint32((row < M) & (kb < kblocks))
        elem = (row0 + Int64(row)) * Int64(K) + Int64(kb) * SF_VEC
        words = []
        for v in cutlass.range_constexpr(words_per_block // 4):
            words += fp4.ld_v4_pred(x_base + elem * cfg.esize + 16 * v, valid)
        sf_off = (r_local % 32) * 16 + (r_local // 32) * 4 + kb_local
        blocks.append((words, valid, elem, sf_off))

    for words, valid, elem, sf_off in blocks:
        amax_bits = _abs_max_bits(words, cfg.dtype)
        bad = bad | Uint32(amax_bits >= 0x7F800000)
        t = fp4.div_rn(fp4.from_bits(amax_bits), Float32(6.0))
        sf = fp4.ue4m3_encode_hw(fp4.mul_rn(t, s_enc_g))
        d = fp4.max_f32(fp4.mul_rn(fp4.ue4m3_decode(sf), s_dec_g),
                        fp4.from_bits(Uint32(fp4.F32_1E_12)))
        s_enc = fp4.div_rn(Float32(1.0), d)
        xf = _to_f32(words, cfg.dtype)
        packed = []
        for h in cutlass.range_constexpr(2):
            signs = None
            if cutlass.const_expr(cfg.dtype != "f32" and not fp4.has_native_fp4(cfg.arch)):
                signs = fp4.sign_nibbles_16bit(*words[4 * h: 4 * h + 4])
            packed.append(fp4.e2m1x8_quantize(xf[8 * h: 8 * h + 8], s_enc, cfg.arch, signs))
        fp4.st_v2_pred(d_base + elem // 2, packed[0], packed[1], valid)
        fp4.st_u8(sf_base + Int64(sf_off), sf)

    if cute.arch.vote_any_sync(bad != 0):
        if cute.arch.lane_idx() == 0:
            cute.arch.atomic_or(ws.iterator + 1, Int32(1))


@cute.jit
def _amax(cfg: cutlass.Constexpr, x: cute.Tensor, ws: cute.Tensor, n_vec: Int64,
          grid: Int32, stream):
    _amax_kernel(cfg, x, ws, n_vec).launch(grid=[grid, 1, 1], block=[AMAX_THREADS, 1, 1],
                                            stream=stream)


@cute.jit
def _quantize(cfg: cutlass.Constexpr, x: cute.Tensor, data: cute.Tensor, scales: cute.Tensor,
              ws: cute.Tensor, gs_in: cute.Tensor, gs_out: cute.Tensor, M: Int32, K: Int32,
              L: Int32, stream):
    ntm = (M + ATOM_ROWS - 1) // ATOM_ROWS
    ntk = (K // SF_VEC + ATOM_KBLOCKS - 1) // ATOM_KBLOCKS
    _quantize_kernel(cfg, x, data, scales, ws, gs_in, gs_out, M, K).launch(
        grid=[ntk, ntm, L], block=[cfg.threads, 1, 1], stream=stream)


# ---------------------------------------------------------------- host: compile once, launch

_CACHE = None


def _cache():
    global _CACHE
    if _CACHE is None:
        from tk_cute.runtime import KernelCache

        _CACHE = KernelCache()
    return _CACHE


def _flat(t, align: int = 16):
    from tk_cute.runtime import as_cute

    return as_cute(t.reshape(-1), align=align)


def quantize_cuda(x, global_scale=None, *, check_finite: bool = True, config: Config | None = None):
    """Quantize a CUDA tensor with the kernels above (arguments as `tk_cute.nvfp4.quantize`).

    Args:
        x: (M, K) or (L, M, K) bf16/fp16/fp32 CUDA tensor, K % 16 == 0 (validated by the caller).
        global_scale: None (amax pass) or a float32 0-dim CUDA tensor, the DECODE scale.
        check_finite: True (default): a flag reduced on the device is read back (one host sync)
            and NaN/Inf raises ValueError. False: no sync and no error; blocks holding NaN/Inf
            get unspecified scale and data bytes, and with the amax pass a NaN/Inf also spoils
            the global scale and so every block; finite inputs give the same bytes either way.
        config: kernel configuration override (tuning); dtype/arch/given_scale are filled in.

    Returns:
        NVFP4Tensor on x's device.
    """
    import dataclasses

    import torch

    from tk_cute.arch import device_target
    from tk_cute.layouts.nvfp4_scales import blocked_shape
    from tk_cute.nvfp4.tensor import NVFP4Tensor
    from tk_cute.runtime import stream

    dtype = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[x.dtype]
    arch = device_target(x.device).name
    cfg = dataclasses.replace(config or Config(), dtype=dtype, arch=arch,
                              given_scale=global_scale is not None)
    if dtype == "f32" and config is None:
        cfg = dataclasses.replace(cfg, blocks_per_thread=2)
    x = x.contiguous()
    if x.data_ptr() % 16:  # 16-byte vector loads
        x = x.clone()
    *lead, M, K = x.shape
    L = lead[0] if lead else 1
    dev = x.device
    data = torch.empty((*lead, M, K // 2), dtype=torch.uint8, device=dev)
    scales = torch.empty(blocked_shape(M, K, *lead), dtype=torch.uint8, device=dev)
    ws = torch.zeros(4, dtype=torch.int32, device=dev)  # [amax bits, non-finite flag, pad]
    if global_scale is None:
        gs_in = gs_out = torch.empty(1, dtype=torch.float32, device=dev)
    else:
        gs_in = global_scale.reshape(1).to(device=dev, dtype=torch.float32)
        gs_out = gs_in
    xs, ds, ss, wss = (_flat(t) for t in (x, data, scales, ws))
    gis, gos = _flat(gs_in, 4), _flat(gs_out, 4)
    st = stream()
    cache = _cache()
    if global_scale is None:
        n_vec = x.numel() * cfg.esize // 16
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        per_cta = AMAX_THREADS * AMAX_UNROLL
        grid = max(1, min(sms * cfg.amax_ctas_per_sm, -(-n_vec // per_cta)))
        amax = cache.get(("amax", cfg), lambda: cute.compile(
            _amax, cfg, xs, wss, Int64(n_vec), Int32(grid), st))
        amax(xs, wss, Int64(n_vec), Int32(grid), st)
    quant = cache.get(("quantize", cfg), lambda: cute.compile(
        _quantize, cfg, xs, ds, ss, wss, gis, gos, Int32(M), Int32(K), Int32(L), st))
    quant(xs, ds, ss, wss, gis, gos, Int32(M), Int32(K), Int32(L), st)
    if check_finite and int(ws[1]) != 0:
        raise ValueError("quantize input must be finite: x contains NaN/Inf value(s) "
                         "(found on the device; pass check_finite=False to skip this check)")
    gs = gs_out.reshape(()) if global_scale is None else gs_in.reshape(()).clone()
    return NVFP4Tensor(data=data, scales=scales, global_scale=gs, shape=torch.Size(x.shape))
