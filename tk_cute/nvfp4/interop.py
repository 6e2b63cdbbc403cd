"""Converting NVFP4 tensors to and from torchao and FlashInfer, byte for byte.

Every library here stores the same three things (E2M1 codes two per byte, even element in the
LOW nibble; one UE4M3 scale per 16 K elements; one float32 per-tensor scale) and the same 128x4
scale layout, so the conversions move or view bytes and never requantize: round trips are
bit-exact. What differs, and what each function states, is the form of the scales and the
direction of the per-tensor scale.

torchao (``torchao.prototype.mx_formats.nvfp4_tensor.NVFP4Tensor``, read in torchao 0.18.0):
a tensor subclass with ``qdata`` (uint8 (..., M, K // 2), packed by ``pack_uint4`` as
``even | odd << 4``), ``scale`` (float8_e4m3fn: (..., M, K // 16) row-major, or with
``is_swizzled_scales`` the blocked bytes viewed as (..., 32 * RM, 16 * RK), made by its
``to_blocked``, the cuBLAS 128x4 layout, over all L * M rows), ``per_tensor_scale`` (float32
0-dim DECODE scale, ``amax / (448 * 6)`` by its ``per_tensor_amax_to_scale``, the same
convention as ours; None means 1.0), ``block_size`` 16 and ``orig_dtype``. Its dequantize is
``e2m1 * (per_tensor_scale * scale)``.

FlashInfer (``flashinfer.fp4_quantize`` and the TensorRT-LLM kernels it wraps): fp4 data uint8
(M, K // 2) (torch dtype float4_e2m1fn_x2 in newer releases), the same packing
(``cvt.rn.satfinite.e2m1x2.f32`` puts the first element in the low nibble); scale factors,
with ``is_sf_swizzled_layout=True`` (its default), a flat uint8 buffer at
``get_sf_out_offset_128x4``'s offsets: ``[numMTiles, numKTiles, 32, 4, 4]`` with rows padded
to 128 and scale columns to 4, batch-major for (L, M, K), i.e. exactly our blocked bytes;
with False, row-major (M, K // 16). Its ``global_scale`` argument is the ENCODE scale
``448 * 6 / amax`` (the kernels compute ``sf = e4m3(global_scale * blk_amax / 6)``), the
reciprocal of our decode scale. ``1 / (1 / g)`` need not round back to g in float32, so the
conversions take the convention in the argument's name (exactly one of
``global_scale_encode`` / ``global_scale_decode``) and `to_flashinfer` returns both.

Sources: torchao 0.18.0 ``prototype/mx_formats/nvfp4_tensor.py`` and ``utils.py``
(``to_blocked``, ``hp_data_dims_to_swizzled_scale_dims_nvfp4``); FlashInfer's
``flashinfer/fp4_quantization.py`` (``fp4_quantize``), its API docs for
``flashinfer.quantization.fp4_quantize`` (global_scale: shape [1] float32) and
``block_scale_interleave`` (a flat swizzled buffer that kernels consume as is),
``include/flashinfer/comm/trtllm_allreduce_fusion.cuh`` (``get_sf_out_offset_128x4``,
``cvt_warp_fp16_to_fp4``), and TensorRT-LLM's ``thop/fp4Quantize.cpp`` ("globalScale: [1]
float, = (448 * 6) / self.abs().max()").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from tk_cute.layouts.nvfp4_scales import blocked_dims, blocked_shape, to_blocked

from .tensor import SF_VEC, NVFP4Tensor, describe, is_torchao

__all__ = ["FlashInferNVFP4", "from_flashinfer", "from_torchao", "to_flashinfer", "to_torchao"]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 and t.element_size() == 1 else t


# ---------------------------------------------------------------- torchao


def from_torchao(t) -> NVFP4Tensor:
    """A torchao NVFP4Tensor as ours (the same bytes; the parts are views where the layouts
    agree, copies where torchao's scales are row-major).

    Only the weight's three parts are carried; torchao's activation settings
    (``act_quant_kwargs``, ``act_per_tensor_scale``) have no place in an NVFP4Tensor: choose
    W4A16 or W4A4 with `tk_cute.nvfp4.Linear`.

    Raises:
        TypeError: `t` is not a torchao NVFP4Tensor.
        ValueError: block size not 16, a transposed view (pass the (N, K) weight itself), a
            per-expert (3-D) per_tensor_scale, or a 3-D swizzled tensor with M % 128 != 0
            (torchao's ``to_nvfp4`` cannot make one; its layout would be ambiguous).
    """
    if not is_torchao(t):
        raise TypeError(f"from_torchao takes a torchao NVFP4Tensor, got {describe(t)}")
    if t.block_size != SF_VEC:
        raise ValueError(f"NVFP4 uses 16-element blocks, got block_size={t.block_size}")
    data = _u8(t.qdata)
    if data.dim() not in (2, 3) or data.stride(-2) < data.stride(-1):
        raise ValueError(f"from_torchao needs a K-major (..., M, K) tensor (pass w, not w.t()); "
                         f"got qdata {tuple(data.shape)} with stride {data.stride()}")
    *lead, M, half = data.shape
    K = 2 * half
    pts = t.per_tensor_scale
    if pts is None:  # torchao's single-level scaling: the block scales alone
        gs = torch.ones((), dtype=torch.float32, device=data.device)
    elif pts.dim() == 0 or pts.numel() == 1:
        gs = pts.detach().reshape(()).to(torch.float32)
    else:
        raise ValueError(f"per-expert per_tensor_scale {tuple(pts.shape)} has no NVFP4Tensor "
                         f"form (one global scale per tensor): convert each expert")
    sf = _u8(t.scale)
    if t.is_swizzled_scales:
        if lead and M % 128:
            raise ValueError(f"3-D swizzled torchao scales need M % 128 == 0, got M={M}")
        # torchao blocks all L * M rows as one matrix; with M % 128 == 0 (always for 2-D) its
        # bytes are our per-batch blocking in the same order, so this is a reshape.
        scales = sf.reshape(blocked_shape(M, K, *lead))
    else:
        scales = to_blocked(sf.reshape(*lead, M, K // SF_VEC))
    return NVFP4Tensor(data.contiguous(), scales.contiguous(), gs, (*lead, M, K))


def to_torchao(q: NVFP4Tensor, *, orig_dtype: torch.dtype = torch.bfloat16,
               swizzled: bool = True):
    """Our NVFP4Tensor as a torchao NVFP4Tensor (weight-only: no activation settings).

    Args:
        q: the tensor.
        orig_dtype: torchao's ``orig_dtype`` (its dequantize and matmul output dtype).
        swizzled: keep the blocked scales (``is_swizzled_scales=True``, views of q's bytes);
            False gives row-major (..., M, K // 16) scales (a copy). A 3-D q with
            M % 128 != 0 needs False (torchao blocks all L * M rows as one matrix).

    Raises:
        ImportError: torchao is not installed.
        ValueError: a 3-D swizzled request with M % 128 != 0.
    """
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor as TorchaoNVFP4

    if not isinstance(q, NVFP4Tensor):
        raise TypeError(f"to_torchao takes an NVFP4Tensor, got {type(q).__name__}")
    _ue4m3_only(q, "torchao")
    lead = q.shape[:-2]
    if swizzled:
        if lead and q.M % 128:
            raise ValueError(f"torchao's 3-D swizzled scales need M % 128 == 0, got M={q.M}: "
                             f"pass swizzled=False")
        rm, rk = blocked_dims(q.M, q.K)
        scale = q.scales_e4m3.reshape(*lead, 32 * rm, 16 * rk)
    else:
        scale = q.scales_logical().view(torch.float8_e4m3fn)
    # (contiguous codes: rows K / 2 bytes apart, without our 16-byte row padding)
    return TorchaoNVFP4(q.data.contiguous(), scale, SF_VEC, orig_dtype,
                        per_tensor_scale=q.global_scale, is_swizzled_scales=swizzled)


def _ue4m3_only(q: NVFP4Tensor, who: str) -> None:
    if q.scale_format != "ue4m3":
        raise ValueError(f"{who}'s NVFP4 form has UE4M3 scales; this tensor's are "
                         f"{q.scale_format}")


# ---------------------------------------------------------------- FlashInfer


class FlashInferNVFP4(NamedTuple):
    """An NVFP4 tensor in FlashInfer's form (`to_flashinfer`).

    Attributes:
        data: uint8 (..., M, K // 2), FlashInfer's fp4 tensor (``.view(torch.float4_e2m1fn_x2)``
            where a release wants that dtype).
        scales: uint8, flat 1-D: the 128x4 swizzled scale factors
            (``is_sf_swizzled_layout=True``), or row-major (..., M, K // 16) when requested.
        global_scale_encode: float32 (1,), ``1 / decode``: FlashInfer's ``global_scale``
            (what ``fp4_quantize`` takes).
        global_scale_decode: float32 (1,), our decode scale (e.g. a GEMM's alpha is the
            product of the operands' decode scales).
    """

    data: torch.Tensor
    scales: torch.Tensor
    global_scale_encode: torch.Tensor
    global_scale_decode: torch.Tensor


def to_flashinfer(q: NVFP4Tensor, *, is_sf_swizzled_layout: bool = True) -> FlashInferNVFP4:
    """Our NVFP4Tensor in FlashInfer's form (module docstring): views of q's data and blocked
    scales, the encode scale computed as ``1 / decode`` in float32 (a division, on q's
    device)."""
    if not isinstance(q, NVFP4Tensor):
        raise TypeError(f"to_flashinfer takes an NVFP4Tensor, got {type(q).__name__}")
    _ue4m3_only(q, "FlashInfer")
    scales = q.scales.reshape(-1) if is_sf_swizzled_layout else q.scales_logical()
    dec = q.global_scale.reshape(1)
    enc = torch.div(torch.ones_like(dec), dec)
    return FlashInferNVFP4(q.data.contiguous(), scales, enc, dec.clone())


def from_flashinfer(data: torch.Tensor, scales: torch.Tensor, *,
                    global_scale_encode: torch.Tensor | float | None = None,
                    global_scale_decode: torch.Tensor | float | None = None,
                    shape: Sequence[int] | None = None,
                    is_sf_swizzled_layout: bool = True) -> NVFP4Tensor:
    """An NVFP4Tensor from FlashInfer's fp4 data, scale factors and global scale.

    Args:
        data: uint8 or float4_e2m1fn_x2 (..., M, K // 2) packed codes (or any tensor of those
            bytes when `shape` is given).
        scales: uint8 or float8_e4m3fn scale factors: the flat 128x4 swizzled buffer (any
            shape holding exactly those bytes in order, e.g. ``fp4_quantize``'s 2-D view), or
            with ``is_sf_swizzled_layout=False`` row-major (..., M, K // 16).
        global_scale_encode: FlashInfer's ``global_scale`` (``448 * 6 / amax``); our decode
            scale is ``1 / global_scale_encode`` (a float32 division).
        global_scale_decode: the decode scale itself (``amax / (448 * 6)``). Give exactly one.
        shape: the logical (M, K) or (L, M, K); default (..., M, 2 * data.shape[-1]).
        is_sf_swizzled_layout: how `scales` is laid out, as FlashInfer's flag.

    Returns:
        The NVFP4Tensor (checked: scale bytes and the global scale are read, a CUDA sync).

    Raises:
        TypeError: neither or both global scales given.
        ValueError: shapes that do not match, or values the NVFP4Tensor constructor rejects.
    """
    if (global_scale_encode is None) == (global_scale_decode is None):
        raise TypeError("from_flashinfer needs exactly one of global_scale_encode (FlashInfer's "
                        "global_scale, 448 * 6 / amax) and global_scale_decode (amax / 2688): "
                        "the direction is never guessed")
    data = _u8(data)
    shape = tuple(shape) if shape is not None else (*data.shape[:-1], 2 * data.shape[-1])
    if len(shape) not in (2, 3) or shape[-1] % SF_VEC:
        raise ValueError(f"NVFP4 shape must be (M, K) or (L, M, K) with K % 16 == 0, got {shape}")
    *lead, M, K = shape
    if data.numel() != math.prod(shape) // 2:
        raise ValueError(f"fp4 data for shape {shape} holds {math.prod(shape) // 2} bytes, got "
                         f"{tuple(data.shape)}")
    data = data.reshape(*lead, M, K // 2)
    sf = _u8(scales)
    if is_sf_swizzled_layout:
        want = blocked_shape(M, K, *lead)
        n = math.prod(want)
        if sf.numel() != n:
            raise ValueError(f"swizzled scale factors for shape {shape} hold {n} bytes (rows "
                             f"padded to 128, scale columns to 4), got {sf.numel()}")
        sf = sf.reshape(want)
    else:
        if sf.numel() != math.prod(shape) // SF_VEC:
            raise ValueError(f"row-major scale factors for shape {shape} are "
                             f"{(*lead, M, K // SF_VEC)}, got {tuple(sf.shape)}")
        sf = to_blocked(sf.reshape(*lead, M, K // SF_VEC))
    if global_scale_decode is not None:
        gs = torch.as_tensor(global_scale_decode, dtype=torch.float32, device=data.device)
    else:
        enc = torch.as_tensor(global_scale_encode, dtype=torch.float32, device=data.device)
        gs = torch.div(torch.ones_like(enc), enc)
    if gs.numel() != 1:
        raise ValueError(f"the global scale must have one element, got shape {tuple(gs.shape)}")
    return NVFP4Tensor(data.contiguous(), sf.contiguous(), gs.reshape(()).clone(), shape)

