"""The one validator of NVFP4 GEMM arguments, shared by `gemm`, `plan`, the references and the
tuning entries: every rule a call can break, each raising with the constraint and the value.

Operand forms (D = a @ b^T):
- W4A4: a and b NVFP4Tensors, both (M, K) x (N, K) or both (L, M, K) x (L, N, K).
- W4A16: a a bfloat16 tensor and b an NVFP4Tensor: a (..., K) x b (N, K) (leading dims of a
  are rows, as in `F.linear`) or a (L, M, K) x b (L, N, K).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tk_cute.runtime import check_out
from tk_cute.launcher import OUT_ALIGN

from .tensor import NVFP4Tensor, check_dense, codes_storage, describe, has_row_pitch, is_torchao

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
__all__ = ["OUT_ALIGN", "OUT_DTYPES", "Operands", "check_out", "flag", "gemm_operands",
           "nvfp4_out", "one_scale_format", "out_dtype"]


class Operands(NamedTuple):
    """What a validated call is: rows M (all leading dims of a W4A16 a), N, K, the batch count
    L (None: unbatched), W4A4 or W4A16, and D's shape."""

    M: int
    N: int
    K: int
    L: int | None
    w4a4: bool
    out_shape: tuple

    @property
    def batched(self) -> bool:
        return self.L is not None


def flag(name: str, value) -> bool:
    """A boolean option: True or False, nothing else (`pdl="yes"` is an error, not True)."""
    if value is not True and value is not False:
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def out_dtype(dtype) -> torch.dtype:
    if dtype not in OUT_DTYPES:
        raise TypeError(f"gemm out_dtype must be torch.bfloat16, torch.float16 or torch.float32 "
                        f"(a torch.dtype; or 'nvfp4'), got {dtype!r}")
    return dtype


def gemm_operands(a, b, dtype, *, out=None, pdl: bool = False, cuda: bool = False,
                  empty: bool = False) -> Operands:
    """Validate a `gemm` call (`cuda`: the operands must be on a CUDA device; `empty`: bf16
    activations may have no rows, an empty batch whose D `gemm` returns without a kernel).

    Raises:
        TypeError: b is not an NVFP4Tensor; a is neither an NVFP4Tensor nor a dense bfloat16
            tensor; out_dtype is not bfloat16/float16/float32; pdl is not a bool.
        ValueError: ranks, K or L differ; the operands (or out) live on different devices, or
            not on CUDA where required; out is not a contiguous, 16-byte aligned tensor of D's
            shape and dtype.
    """
    out_dtype(dtype)
    flag("pdl", pdl)
    if not isinstance(b, NVFP4Tensor):
        raise TypeError(f"gemm operand b must be an NVFP4Tensor (the weights, N x K), got "
                        f"{describe(b)}")
    if isinstance(a, NVFP4Tensor):
        w4a4 = True
        if a.ndim != b.ndim:
            raise ValueError(f"gemm NVFP4 operands must both be 2-D (M, K) x (N, K) or both 3-D "
                             f"(L, M, K) x (L, N, K), got a {tuple(a.shape)} and b "
                             f"{tuple(b.shape)}")
        M, L = a.M, a.L
        out_shape = (M, b.M) if L is None else (L, M, b.M)
        K = a.K
    elif isinstance(a, torch.Tensor) and not is_torchao(a):
        w4a4 = False
        check_dense(a, "W4A16 activations")
        if a.dtype != torch.bfloat16:
            raise TypeError(f"W4A16 activations must be a torch.bfloat16 tensor, got {a.dtype}")
        if a.dim() < 1 or (a.numel() == 0 and not (empty and a.shape[-1] > 0)):
            raise ValueError(f"W4A16 activations must be a non-empty (..., K) tensor, got "
                             f"{tuple(a.shape)}")
        K = a.shape[-1]
        if b.ndim == 3:
            if a.dim() != 3 or a.shape[0] != b.L:
                raise ValueError(f"batched weights {tuple(b.shape)} need activations (L, M, K) "
                                 f"with L={b.L}, got {tuple(a.shape)}")
            L, M = b.L, a.shape[1]
            out_shape = (L, M, b.M)
        else:
            L, M = None, a.numel() // K
            out_shape = (*a.shape[:-1], b.M)
    else:
        raise TypeError(f"gemm operand a must be an NVFP4Tensor (W4A4) or a bfloat16 tensor "
                        f"(W4A16), got {describe(a)}")
    if K != b.K:
        raise ValueError(f"gemm K mismatch: a has K={K}, b has K={b.K} (D = a @ b^T)")
    if w4a4 and L is not None and L != b.L:
        raise ValueError(f"gemm batch mismatch: a has L={L}, b has L={b.L}")
    if a.device != b.device:
        raise ValueError(f"gemm operands must be on one device: a is on {a.device}, b on "
                         f"{b.device}")
    if cuda and b.device.type != "cuda":
        raise ValueError(f"this entry runs on a CUDA device; the operands are on {b.device}")
    if out is not None:
        check_out(out, out_shape, dtype, b.device, "gemm")
    return Operands(M, b.M, K, L, w4a4, out_shape)




def one_scale_format(a, b: NVFP4Tensor, who: str) -> str:
    """The kernels' block-scale format: b's, which a W4A4 `a` must share (one scale type per
    block-scaled MMA, one decode per kernel; the CPU references take any mix).

    Raises:
        ValueError: a and b are NVFP4Tensors of different scale formats.
    """
    if isinstance(a, NVFP4Tensor) and a.scale_format != b.scale_format:
        raise ValueError(f"{who} needs one scale format for both operands; a has "
                         f"{a.scale_format}, b {b.scale_format} scales (requantize one)")
    return b.scale_format


def nvfp4_out(shape: tuple, device, out, global_scale) -> NVFP4Tensor:
    """D of an NVFP4-output GEMM: a new UE4M3 NVFP4Tensor of `shape` with decode scale
    `global_scale` (a checked 0-dim fp32 tensor on `device`), or the caller's `out` once it is
    one the kernels can write (shape, device, UE4M3 scales, contiguous 16-byte aligned parts);
    either way with a zeroed `saturated` flag. N % 16 == 0 (16-column scale blocks).

    Raises:
        ValueError: N % 16 != 0, or `out` breaks one of the rules (each named).
    """
    from tk_cute.layouts.nvfp4_scales import blocked_shape

    *lead, M, N = shape
    if N % 16:
        raise ValueError(f"NVFP4 output needs N % 16 == 0 (16-element scale blocks along D's "
                         f"rows), got N={N}")
    if out is None:
        out = NVFP4Tensor.trusted(
            codes_storage(shape, device),
            torch.empty(blocked_shape(M, N, *lead), dtype=torch.uint8, device=device),
            global_scale, shape)
    elif not isinstance(out, NVFP4Tensor) or tuple(out.shape) != tuple(shape) or (
            out.device != torch.device(device)) or out.scale_format != "ue4m3":
        raise ValueError(f"out must be a UE4M3 NVFP4Tensor of shape {tuple(shape)} on {device}, "
                         f"got {out!r}")
    for name, part, ok in (("data", out.data, has_row_pitch(out.data, N)),
                           ("scales", out.scales, out.scales.is_contiguous())):
        if not ok or part.data_ptr() % OUT_ALIGN:
            raise ValueError(f"out.{name} must be {OUT_ALIGN}-byte aligned and laid out as "
                             f"NVFP4Tensor keeps it (contiguous; codes rows row_pitch(N) bytes "
                             f"apart), as the kernels write it by address; got stride "
                             f"{part.stride()}, address {part.data_ptr():#x}")
    out.saturated = torch.zeros((), dtype=torch.int32, device=device)
    return out
