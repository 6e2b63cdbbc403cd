"""torch custom ops (``torch.library``) for the NVFP4 quantizer and GEMM and for the dense GEMM,
so ``torch.compile(model, fullgraph=True)`` traces a model built from `tk_cute.nvfp4.Linear`
without a graph break, and a forward on CUDA can be captured in a CUDA graph.

Registered when ``tk_cute.nvfp4`` is imported (namespace ``tk_cute``):

- ``torch.ops.tk_cute.nvfp4_quantize(x, global_scale=None, check_finite=False)
  -> (data, scales, global_scale)``: `tk_cute.nvfp4.quantize` (its docstring is the contract),
  the NVFP4Tensor returned as its three parts.
- ``torch.ops.tk_cute.nvfp4_gemm(a, a_scales, a_global_scale, b_data, b_scales,
  b_global_scale, out_dtype, pdl=False, quantize_a=False) -> D``: `tk_cute.nvfp4.gemm`,
  ``D = a @ b^T``. W4A4 when `a_scales` is given (then `a` is the activations' packed data and
  `a_global_scale` their decode scale); W4A16 when it is None (`a` is a bfloat16 (..., K)
  tensor), or with `quantize_a` W4A4 on that bf16 (M, K) `a` quantized (`gemm`'s quantize_a:
  in the kernel where planned).
- ``torch.ops.tk_cute.gemm(a, b, out_dtype) -> C``: `tk_cute.gemm` (Hopper CUDA tensors).

The ops take the NVFP4 parts as tensors; every logical shape follows from the data's shape
(``K = 2 * data.shape[-1]``), so no shape ints are passed. The parts carry no scale format:
the ops take UE4M3 NVFP4 tensors only (`modules` refuses UE5M3 ones before calling them). The
parts are checked for dtype, shape and device (no value is read: reading a CUDA tensor would
sync the host), so the ops trust the VALUES of their parts (as `NVFP4Tensor.trusted` does):
pass parts of an NVFP4Tensor built by `quantize` or by the checking constructor. Accepted part
forms are those of the NVFP4Tensor constructor (float4_e2m1fn_x2 data, float8_e4m3fn scales,
flat 1-D blocked scales, a (1,) global scale).

Host syncs: none in `nvfp4_quantize` with ``check_finite=False`` (the default here, unlike
`quantize`) and no given global scale, nor in `nvfp4_gemm` or `gemm` (kernels are compiled and
cached at a shape's first call: run one eager call before capturing a graph). With
check_finite=False, NaN/Inf inputs on CUDA are not detected: the blocks holding them get
unspecified bytes and, as the global scale is computed from amax, so does every block (the
GEMM's output is then unspecified, not necessarily NaN). CPU tensors always check (ValueError).

Devices: CUDA tensors run the kernels; CPU tensors run what `tk_cute.nvfp4.gemm` runs there,
the exact references. `tk_cute.gemm` has no CPU kernel: on CPU the ``tk_cute::gemm`` op
computes ``(a.float() @ b.float().T).to(out_dtype)`` with torch (products exact in float32, sums
in float32, one rounding: within `tk_cute.testing.assert_gemm_close`'s bound), so compiled CPU
models stay testable; it is a stand-in, not the kernel.

Autograd: none; the ops are for inference: the Autograd key falls through, and an input that
requires grad while grad mode is on raises RuntimeError (as `tk_cute.nvfp4.Linear` does), so
no gradient is ever dropped silently; their outputs never require grad. Each op
has a fake (meta) implementation that checks the same shapes and returns empty outputs of the
right shape, dtype and device.

Registration: a `torch.library.Library` with hand-written schemas and one Python kernel per op
for CPU and CUDA, not `torch.library.custom_op`, whose Python layers (autograd wrapper, device
dispatch) cost ~18 us of host time per call (measured on the CPU host: `tk_cute::gemm` 40.9 us
as a custom_op, 22.7 us this way, around a 16.0 us body), which a compiled model pays at every
layer.
"""

from __future__ import annotations

import torch

from tk_cute.layouts.nvfp4_scales import blocked_shape
from tk_cute.runtime import fresh_buffers

from . import validate
from .quantize import check_dtype, quantize_parts
from .tensor import SF_VEC, NVFP4Tensor, codes_storage, normalize_parts

__all__ = ["gemm", "logical_shape", "nvfp4_gemm", "nvfp4_quantize", "parts"]

_LIB = torch.library.Library("tk_cute", "DEF")  # the namespace's ops (kept for the process)


def _define(schema: str, kernel, fake):
    """Define ``tk_cute::<schema>`` with `kernel` for CPU and CUDA, no autograd (the Autograd
    key falls through; an input that requires grad with grad mode on raises) and `fake` for
    tracing; returns ``torch.ops.tk_cute.<name>``."""
    name = schema.split("(", 1)[0]

    def run(*args):
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in args):
            raise RuntimeError(f"tk_cute::{name} has no autograd formula (inference only): an "
                               f"input requires grad; call it under torch.no_grad() or "
                               f"torch.inference_mode(), or detach the input")
        return kernel(*args)

    _LIB.define(schema, tags=(torch.Tag.pt2_compliant_tag,))  # (as custom_op tags its ops)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, run, key)
    _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(f"tk_cute::{name}", fake, lib=_LIB)
    return getattr(torch.ops.tk_cute, name)


def parts(data: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> NVFP4Tensor:
    """An NVFP4Tensor from op arguments: the logical shape from the data's, parts normalized and
    shape-checked, values trusted (module docstring)."""
    return NVFP4Tensor.trusted(*normalize_parts(data, scales, global_scale, logical_shape(data)))


def logical_shape(data: torch.Tensor) -> tuple:
    """(..., M, K) of NVFP4 data (..., M, K // 2) passed to an op."""
    if not isinstance(data, torch.Tensor) or data.dim() not in (2, 3):
        raise ValueError(f"NVFP4 data must be a 2-D (M, K // 2) or 3-D (L, M, K // 2) tensor, "
                         f"got {getattr(data, 'shape', type(data).__name__)}")
    return (*data.shape[:-1], 2 * data.shape[-1])


# ---------------------------------------------------------------- quantize


def _quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None,
              check_finite: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`tk_cute.nvfp4.quantize(x, global_scale=..., check_finite=...)` as (data, scales,
    global_scale): uint8 (..., M, K // 2) (rows `row_pitch(K)` bytes apart: a view of padded
    rows where K % 32 != 0), uint8 blocked (..., RM, RK, 512), float32 0-dim."""
    q, _ = fresh_buffers(quantize_parts, x.detach(), global_scale, check_finite)
    # An op output must be a tensor of its own, aligned as the fake promises (inductor asserts
    # it), and must not alias an input: the two-launch CUDA quantizer's global scale is a 0-dim
    # view of its workspace (at offset 0, the amax partials after it): one 4-byte copy. (The
    # one-launch quantizer's and the CPU reference's are tensors of their own.)
    gs = q.global_scale
    return q.data, q.scales, gs.clone() if gs._is_view() or gs is global_scale else gs


def _quantize_fake(x, global_scale=None, check_finite=False):
    check_dtype(x)
    if x.dim() not in (2, 3) or x.shape[-1] % SF_VEC:
        raise ValueError(f"quantize input must be (M, K) or (L, M, K) with K % 16 == 0, got "
                         f"{tuple(x.shape)}")
    *lead, M, K = x.shape
    return (codes_storage(x.shape, x.device, zero_padding=False),  # the real one's strides
            x.new_empty(blocked_shape(M, K, *lead), dtype=torch.uint8),
            x.new_empty((), dtype=torch.float32))


nvfp4_quantize = _define("nvfp4_quantize(Tensor x, Tensor? global_scale=None, "
                         "bool check_finite=False) -> (Tensor, Tensor, Tensor)",
                         _quantize, _quantize_fake)


# ---------------------------------------------------------------- NVFP4 GEMM


def _activations(a, a_scales, a_global_scale, quantize_a=False):
    """The op's `a`: a bf16 tensor (W4A16, or W4A4 with quantize_a: no scales) or NVFP4
    activations from three parts."""
    if quantize_a and (a_scales is not None or a.dim() != 2 or a.dtype != torch.bfloat16):
        raise ValueError(f"nvfp4_gemm: quantize_a takes bfloat16 (M, K) activations and no "
                         f"a_scales (it quantizes them), got {a.dtype} {tuple(a.shape)}"
                         f"{' with a_scales' if a_scales is not None else ''}")
    if a_scales is None:
        if a_global_scale is not None:
            raise ValueError("nvfp4_gemm: a_global_scale without a_scales (W4A16 takes bf16 a "
                             "and neither; W4A4 takes the activations' three parts)")
        return a
    if a_global_scale is None:
        raise ValueError("nvfp4_gemm: W4A4 (a_scales given) needs a_global_scale too")
    return parts(a, a_scales, a_global_scale)


def _nvfp4_gemm(a: torch.Tensor, a_scales: torch.Tensor | None,
                a_global_scale: torch.Tensor | None, b_data: torch.Tensor, b_scales: torch.Tensor,
                b_global_scale: torch.Tensor, out_dtype: torch.dtype,
                pdl: bool = False, quantize_a: bool = False) -> torch.Tensor:
    """`tk_cute.nvfp4.gemm(a, b, out_dtype, pdl=pdl, quantize_a=quantize_a)` on NVFP4 parts
    (module docstring), through the weights' prepared call (`gemm.prepared`)."""
    from .gemm import prepared

    A = _activations(a, a_scales, a_global_scale, quantize_a)
    call = prepared(A, b_data, b_scales, b_global_scale, logical_shape(b_data), "ue4m3",
                    out_dtype, pdl, None, quantize_a)
    return fresh_buffers(call, A)


def _nvfp4_gemm_fake(a, a_scales, a_global_scale, b_data, b_scales, b_global_scale, out_dtype,
                     pdl=False, quantize_a=False):
    A = _activations(a, a_scales, a_global_scale, quantize_a)
    B = parts(b_data, b_scales, b_global_scale)
    op = validate.gemm_operands(A, B, out_dtype, pdl=pdl)
    return b_data.new_empty(op.out_shape, dtype=out_dtype)


nvfp4_gemm = _define("nvfp4_gemm(Tensor a, Tensor? a_scales, Tensor? a_global_scale, "
                     "Tensor b_data, Tensor b_scales, Tensor b_global_scale, "
                     "ScalarType out_dtype, bool pdl=False, bool quantize_a=False) -> Tensor",
                     _nvfp4_gemm, _nvfp4_gemm_fake)


# ---------------------------------------------------------------- dense GEMM


def _dense_shape(a, b, out_dtype):
    from tk_cute.dense_gemm import _DTYPES, OUT_DTYPES

    for name, t in (("a", a), ("b", b)):
        if t.dtype not in _DTYPES or t.dim() != 2:
            raise ValueError(f"tk_cute::gemm {name} must be a 2-D tensor of {_DTYPES}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if a.dtype != b.dtype or a.shape[1] != b.shape[1] or a.device != b.device:
        raise ValueError(f"tk_cute::gemm needs a (M, K) and b (N, K) of one dtype on one device, "
                         f"got {a.dtype} {tuple(a.shape)} on {a.device}, {b.dtype} "
                         f"{tuple(b.shape)} on {b.device}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"tk_cute::gemm out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    return a.shape[0], b.shape[0]


def _gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``C = a @ b^T``: `tk_cute.gemm` on CUDA; torch's float32 matmul on CPU (module
    docstring)."""
    if a.is_cuda:
        from tk_cute.dense_gemm import gemm as dense

        return fresh_buffers(dense, a, b, out_dtype)
    _dense_shape(a, b, out_dtype)
    return (a.float() @ b.float().t()).to(out_dtype)


def _gemm_fake(a, b, out_dtype):
    M, N = _dense_shape(a, b, out_dtype)
    return a.new_empty((M, N), dtype=out_dtype)


gemm = _define("gemm(Tensor a, Tensor b, ScalarType out_dtype) -> Tensor", _gemm, _gemm_fake)
