"""NVFP4 quantization: the recipe, bit for bit, as the contract every quantize kernel must meet.

``quantize_reference`` is written with vectorised torch ops and runs on CPU or CUDA tensors; a GPU
kernel must produce the SAME BYTES (data, scales) and the same float32 global scale. All
arithmetic is IEEE float32 with round-to-nearest-even, no fused multiply-add, no reassociation,
no reciprocal-multiply in place of a division, no flush-to-zero of subnormals:

1. ``xf = float32(x)`` (exact for bf16/fp16).
2. Global decode scale (one per tensor, over all L batches), unless given:
   ``amax = max |xf|``; ``s_dec_g = max(amax, AMAX_FLOOR) / 2688`` (a division), so
   ``s_dec_g >= 2^-116``. A user-given ``global_scale`` IS ``s_dec_g`` (converted to float32 by
   RNE first; it must be finite and at least 2^-126).
3. ``s_enc_g = 1 / s_dec_g`` (a correctly rounded division, not ``rcp.approx``).
4. Per row and 16-element block along K: ``blk_amax = max |xf[block]|``;
   ``t = blk_amax / 6`` (division, rounded), then ``t = t * s_enc_g`` (multiplication, rounded);
   ``sf = E4M3_RNE_satfinite(t)`` (the UE4M3 byte; sign bit always 0 as t >= 0).
   With the computed global scale t <= 448 up to rounding; with a user-given global scale t can
   exceed 448 (or overflow to +Inf) and saturates to 448 (byte 0x7E). t below 2^-6 gives a
   subnormal scale k * 2^-9; t <= 2^-10 gives sf = 0 (2^-10 itself is a tie, to even = 0).
5. ``d = float(sf) * s_dec_g`` (rounded); ``d = max(d, 2^-126)``; ``s_enc = 1 / d``
   (division); then ``s_enc = 0`` where ``sf == 0`` (a select, no arithmetic). The ROUNDED scale
   sf is used. A zero-scale block (all zeros, or t <= 2^-10) thus gets data ``xf * 0``: +0
   (code 0) or -0 (code 8) by the sign bit of xf, and decodes to zeros either way. The floor
   2^-126 keeps ``1 / d`` finite; with the computed global scale it never binds (a nonzero sf
   is >= 2^-9, so d >= 2^-125). It binds only for a given scale below 2^-117, where blocks whose
   d would be subnormal are encoded with s_enc = 2^126 (too small: they lose magnitude).
6. ``q = E2M1_RNE_satfinite(xf * s_enc)`` (multiplication, rounded, then convert): ties to even
   mantissa, |y| > 6 saturates to 6, and the sign bit follows the product's sign bit, so a
   negative element that rounds to zero is code 8 (-0) and -0.0 inputs give code 8 as well.
   This is what ``cvt.rn.satfinite.e2m1x2.f32`` does; a kernel decoding by comparison must
   reproduce the -0 codes.

``AMAX_FLOOR = 2688 * 2^-116 = 21 * 2^-109`` (float32 bits 0x0B280000, ~3.2356e-32). Constants 6,
2688, 2^-126 (0x00800000) and AMAX_FLOOR are exact float32 values.

UE5M3 scales (``scale_dtype="ue5m3"``; the format: `format` module docstring, range 2^-17 ..
114688 in steps of 2^-17 below 2^-14, RNE satfinite). The same recipe with the format's numbers
in place of UE4M3's: 448 -> 114688, so the global denominator is 6 * 114688 = 688128 (= 21 *
2^15) and the largest block scale lands at the top of the wider range; step 4's zero threshold
is t <= 2^-18 (half the quantum 2^-17); the amax floor is 688128 * 2^-108 (= 21 * 2^-93), so
``s_dec_g >= 2^-108``. Every step of the scale-invariance argument below carries over with these
numbers: a nonzero sf is >= 2^-17, so d >= 2^-17 * 2^-108 = 2^-125 (normal; the 2^-126 floor on
d binds only for a given scale below 2^-109), and a block whose ``blk_amax / 6`` is subnormal
has ``t <= fl(2^-126 * 2^108) = 2^-18``, the zero tie. Finite decodes hold for
``s_dec_g <= F32_MAX / 688128``. Is the fp32 global scale still needed? Yes, as for UE4M3: the
block scales span 2^-17 .. 2^16.8 (2^34 instead of 2^18 for UE4M3), far less than float32's
range, so the per-tensor scale still places a tensor's amax at the top of the block scales; what
UE5M3 buys is 16 more octaves of block amaxes below the tensor's amax that keep a nonzero scale
(blocks down to about amax * 2^-34 instead of amax * 2^-18), and tensors whose block amaxes lie
in [6 * 2^-17, 688128] can use a global scale of 1.0. The CUDA quantizer does UE4M3 only (a
UE5M3 quantize of a CUDA tensor raises NotImplementedError); CPU tensors run this reference.

Scale invariance (computed global scale). If ``x' = 2^j * x`` holds exactly element by element
and both ``amax(x)`` and ``amax(x')`` lie in ``[AMAX_FLOOR, F32_MAX]``, then x and x' get the same
data and scale bytes and ``s_dec_g' = 2^j * s_dec_g`` exactly. Every rounded quantity is either a
product or quotient whose exact value is the same for x and x' (t, ``xf * s_enc``), or one that
scales by 2^+-j and stays a normal float32 in both (RN commutes with a power-of-two scaling
there): ``amax / 2688`` and ``s_dec_g`` in ``[2^-116, F32_MAX / 2688]``, ``s_enc_g`` above
``2688 / F32_MAX > 2^-117``, a nonzero block's ``d`` in ``[2^-125, F32_MAX / 6]`` and ``1 / d``
above ``6 / F32_MAX > 2^-126``, and ``blk_amax / 6`` whenever it is normal. A block whose
``blk_amax / 6`` is subnormal (below 2^-126) in either copy has ``t <= fl(2^-126 * 2^116) =
2^-10`` in both (as ``s_enc_g <= 2^116`` in both), so sf = 0 in both. That last step is why the
floor is 2^-116 and not 2^-117 (the smallest that keeps d normal): with ``s_enc_g = 2^117`` a
subnormal ``blk_amax / 6`` can reach t > 2^-10 and round differently from its scaled copy.
Below the floor (amax < AMAX_FLOOR, including the all-zero tensor) ``s_dec_g = 2^-116`` is fixed
and ``s_enc_g = 2^116``: the encoding stays valid (same per-block error bound) but bytes are no
longer scale-invariant and the largest block scale, about ``448 * amax / AMAX_FLOOR``, uses less
and less of the E4M3 range; at ``amax <= 6 * 2^-126`` (~7.05e-38) every t is <= 2^-10, every
scale is 0 and the tensor decodes to zeros (its codes keep only the signs). bfloat16 inputs
reach that range; float16 ones cannot (their smallest nonzero magnitude is 2^-24).

Finite decodes: a decoded value is at most ``2688 * s_dec_g`` in magnitude, which is finite in
float32 for every byte pattern iff ``s_dec_g <= F32_MAX / 2688`` (exactly a float32). Computed
global scales always meet it (``fl(amax / 2688) <= fl(F32_MAX / 2688)``), so finite inputs
decode finitely; a given global scale above it can decode finite inputs to +-inf.

NaN or Inf in x is rejected (ValueError); an all-zero block or tensor is valid (scales 0, data
0/8). Inputs that require grad are detached: the result is never part of an autograd graph.
"""

from __future__ import annotations

import numbers

import torch

from tk_cute.layouts.nvfp4_scales import to_blocked

from .format import F32_MIN_NORMAL, ScaleFormat, e2m1_encode_rne, pack_fp4, scale_format
from .tensor import SF_VEC, NVFP4Tensor, check_dense, describe

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GLOBAL_DENOM = 2688.0  # 448 (E4M3 max) * 6 (E2M1 max)
AMAX_FLOOR = GLOBAL_DENOM * 2.0**-116  # s_dec_g >= 2^-116: see the scale-invariance proof
# UE5M3: format.SCALE_FORMATS["ue5m3"].global_denom (688128) and .amax_floor (688128 * 2^-108)
_FLT_MIN = F32_MIN_NORMAL  # the floor of a block's decode scale, and of a given global scale


def check_dtype(x: torch.Tensor, who: str = "quantize input") -> None:
    """TypeError unless x's dtype is one the quantizer takes (`SUPPORTED_DTYPES`)."""
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{who} dtype must be float32, bfloat16 or float16, got {x.dtype}")


def _check_quantize_input(x, global_scale, *, finite: bool = True) -> torch.Tensor | None:
    """Validate `quantize` arguments; shared by the reference and kernel paths.

    Args:
        x: the tensor to quantize.
        global_scale: None, a Python real, or a one-element floating tensor (the DECODE scale).

    Returns:
        None, or the global scale as a float32 0-dim tensor on x's device.

    Raises:
        TypeError: x is not a dense tensor (sparse, nested), x.dtype is not
            float32/bfloat16/float16, or global_scale has an unsupported type.
        ValueError: x is a meta tensor (no values), is not 2-D/3-D, has an empty dimension, K
            is not a multiple of 16, x holds NaN/Inf, or global_scale is not positive, finite
            and at least 2**-126 after conversion to float32 (so that 1/global_scale is
            finite).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize expects a torch.Tensor, got {describe(x)}")
    check_dense(x, "quantize input", values=True)
    check_dtype(x)
    if x.dim() not in (2, 3):
        raise ValueError(
            f"quantize input must be 2-D (M, K) or 3-D (L, M, K), got {x.dim()}-D shape "
            f"{tuple(x.shape)}"
        )
    if min(x.shape) < 1:
        raise ValueError(f"quantize input must not be empty, got shape {tuple(x.shape)}")
    K = x.shape[-1]
    if K % SF_VEC:
        raise ValueError(f"K (last dim) must be a multiple of 16, got K={K}")
    if finite:  # the CUDA kernel path checks on the device instead (finite=False here)
        ok = torch.isfinite(x)
        if not bool(ok.all()):
            bad = int((~ok).sum())
            raise ValueError(f"quantize input must be finite: x contains {bad} NaN/Inf value(s)")
    if global_scale is None:
        return None
    return check_global_scale(global_scale, x.device)


def _check_cuda_input(x) -> None:
    """`_check_quantize_input` of a CUDA x (no host read: the kernels check finiteness)."""
    _check_quantize_input(x, None, finite=False)


def check_global_scale(global_scale, device) -> torch.Tensor:
    """A given DECODE scale as a float32 0-dim tensor on `device` (a device tensor's value is
    read once on the host: a sync; a Python number is checked on the host and filled in).

    Raises:
        TypeError: not a real number or a one-element dense floating tensor.
        ValueError: a meta tensor; not positive, finite and at least 2**-126 after conversion
            to float32 (so that 1/global_scale is finite).
    """
    if isinstance(global_scale, torch.Tensor):
        check_dense(global_scale, "global_scale", values=True)
        if global_scale.numel() != 1 or not global_scale.dtype.is_floating_point:
            raise TypeError(
                f"global_scale tensor must be a one-element floating tensor, got "
                f"{global_scale.dtype} of shape {tuple(global_scale.shape)}"
            )
        gs = global_scale.detach().reshape(()).to(device=device, dtype=torch.float32)
        value = float(gs)
    elif isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        value = float(torch.tensor(float(global_scale), dtype=torch.float32))  # as float32
        gs = torch.full((), value, dtype=torch.float32, device=device)
    else:
        raise TypeError(
            f"global_scale must be None, a real number or a tensor, got "
            f"{type(global_scale).__name__}"
        )
    if not (value >= _FLT_MIN and value != float("inf")):  # also catches NaN
        raise ValueError(
            f"global_scale (the decode scale) must be positive, finite and at least 2**-126 as "
            f"float32, got {value!r}"
        )
    return gs


def saturated(x: torch.Tensor, s_dec_g: torch.Tensor | None,
              fmt: ScaleFormat | None = None) -> torch.Tensor:
    """Whether quantizing `x` with the given decode scale `s_dec_g` clips it: 1 where some
    block's scale t (step 4, ``fl(fl(blk_amax / 6) * fl(1 / s_dec_g))``) exceeds the format's
    largest scale (UE4M3 448), which then saturates there and the block's elements beyond
    ``6 * 448 * s_dec_g`` are clipped to it; else 0. t grows with the block amax, so x's amax
    decides: one pass over x (torch.aminmax), no host sync. A computed global scale (None)
    puts the largest block at the top of the format (up to rounding): 0.

    Returns:
        A 0-dim int32 tensor on x's device (for a computed scale one zero kept per device and
        shared, as a per-call allocation costs a quantize call's host time; read it only).
    """
    dev = x.device
    if s_dec_g is None:
        return _zero_flag(dev)
    fmt = fmt or scale_format("ue4m3")
    lo, hi = torch.aminmax(x)
    amax = torch.maximum(hi, -lo).to(torch.float32)
    one, six = (torch.full((), v, dtype=torch.float32, device=dev) for v in (1.0, 6.0))
    t = torch.mul(torch.div(amax, six), torch.div(one, s_dec_g.to(dev, torch.float32)))
    return (t > fmt.max).to(torch.int32)


_ZERO_FLAGS: dict = {}  # device -> the shared 0 `saturated` flag of computed-scale results


def _zero_flag(device: torch.device) -> torch.Tensor:
    from tk_cute.runtime import per_call_buffers

    if device.type == "cuda" and per_call_buffers(device):  # (its stream: only if needed)
        return torch.zeros((), dtype=torch.int32, device=device)  # (a graph keeps its memory)
    flag = _ZERO_FLAGS.get(device)
    if flag is None:
        flag = _ZERO_FLAGS[device] = torch.zeros((), dtype=torch.int32, device=device)
    return flag


def _quantize_reference(x: torch.Tensor, s_dec_g: torch.Tensor | None,
                        fmt: ScaleFormat | None = None) -> NVFP4Tensor:
    """The recipe of the module docstring on validated input (`s_dec_g`: 0-dim float32 or None;
    `fmt`: the block-scale format, default UE4M3)."""
    fmt = fmt or scale_format("ue4m3")
    dev = x.device

    def f32(v: float) -> torch.Tensor:
        # Constants as 0-dim tensors ON x's DEVICE: torch's CUDA division by a CPU scalar is
        # computed as a multiplication by its reciprocal, which is not correctly rounded.
        return torch.tensor(v, dtype=torch.float32, device=dev)

    xf = x.to(torch.float32)
    if s_dec_g is None:
        amax = xf.abs().amax()
        s_dec_g = torch.div(torch.maximum(amax, f32(fmt.amax_floor)), f32(fmt.global_denom))
    s_enc_g = torch.div(f32(1.0), s_dec_g)

    *lead, M, K = x.shape
    blocks = xf.reshape(*lead, M, K // SF_VEC, SF_VEC)
    blk_amax = blocks.abs().amax(dim=-1)
    t = torch.div(blk_amax, f32(6.0))
    t = torch.mul(t, s_enc_g)
    sf = fmt.encode(t)  # uint8 (..., M, K // 16)

    d = torch.mul(fmt.decode(sf), s_dec_g)
    d = torch.maximum(d, f32(_FLT_MIN))
    s_enc = torch.where(sf == 0, f32(0.0), torch.div(f32(1.0), d))
    y = torch.mul(blocks, s_enc.unsqueeze(-1))
    codes = e2m1_encode_rne(y).reshape(*lead, M, K)

    # Valid by construction (shapes from x, sf <= the format's largest byte, s_dec_g checked
    # or computed): the constructor's value checks would read CUDA tensors back.
    return NVFP4Tensor.trusted(pack_fp4(codes), to_blocked(sf), s_dec_g.reshape(()).clone(),
                               x.shape, fmt.name)


def quantize_reference(x: torch.Tensor, *, global_scale=None,
                       scale_dtype: str = "ue4m3") -> NVFP4Tensor:
    """Quantize with the reference recipe (vectorised torch; CPU or CUDA).

    Args:
        x: (M, K) or (L, M, K) float32/bfloat16/float16 tensor, K a multiple of 16, finite.
        global_scale: optional per-tensor DECODE scale (float or one-element tensor); default
            ``max(amax, AMAX_FLOOR) / 2688`` (UE5M3: the module docstring's numbers).
        scale_dtype: the block-scale format, "ue4m3" (NVFP4) or "ue5m3".

    Returns:
        The NVFP4Tensor, on x's device.

    Raises:
        TypeError, ValueError: see `_check_quantize_input`; an unknown scale_dtype.
    """
    fmt = scale_format(scale_dtype)
    if isinstance(x, torch.Tensor):
        x = x.detach()  # the result must not keep x's autograd graph (nor a copy of |x|) alive
    return _quantize_reference(x, _check_quantize_input(x, global_scale), fmt)


def quantize(x: torch.Tensor, *, global_scale=None, check_finite: bool = True,
             scale_dtype: str = "ue4m3") -> NVFP4Tensor:
    """Quantize x to NVFP4 (the public entry point; kernels plug in here).

    Bit-exact with `quantize_reference` on every device (the module docstring is the contract).

    Args:
        x: (M, K) or (L, M, K) float32/bfloat16/float16 tensor on CPU or CUDA; K a multiple of
            16; no NaN/Inf.
        global_scale: optional per-tensor DECODE scale; default ``max(amax, AMAX_FLOOR) / 2688``
            (UE5M3: ``max(amax, 688128 * 2^-108) / 688128``).
        check_finite: CUDA tensors run the kernels of ``tk_cute.kernels.nvfp4_quantize``
            (launched by `tk_cute.nvfp4.launch.quantize`), which
            detect NaN/Inf on the device (a non-finite global scale from the amax pass, or a
            flag with a given scale); True (default) reads it back (one host sync) and raises
            ValueError. (A CUDA-tensor `global_scale` is also range-checked on the host, which
            reads it: one more sync.) False skips the sync and never raises: finite inputs give
            the same bytes, blocks holding NaN/Inf get unspecified bytes and, without a given
            global scale, so does every block (amax is non-finite). CPU tensors always check.
        scale_dtype: the block-scale format: "ue4m3" (NVFP4, default) or "ue5m3" (Rubin's
            5-exponent-bit scales; the tensor's `scale_format`). CPU tensors only for now.

    Returns:
        An NVFP4Tensor on x's device, with attribute `saturated` (`saturated`): a 0-dim int32
        tensor, 1 where a given global scale is too small for x, so that some block scale
        saturates at the format's largest value and the elements beyond it are clipped (e.g.
        ``global_scale=1e-9`` for values around 1: every block); else 0, as always with the
        computed global scale. Computing it costs one pass over x with a given scale, and no
        host sync; reading it is the caller's choice.

        Tiny tensors: with the computed global scale, x whose amax is at most ``6 * 2^-126``
        (~7.05e-38; bfloat16 and float32 subnormals such as 1e-40) gets zero block scales
        everywhere and decodes to zeros (its codes keep only the signs; the module docstring
        derives the floor). Scale such a tensor up by a power of two before quantizing.

    Raises:
        TypeError, ValueError: see `_check_quantize_input`; an unknown scale_dtype.
        NotImplementedError: scale_dtype "ue5m3" on a CUDA tensor (the CUDA quantizer encodes
            UE4M3 only; quantize on the CPU and move the tensor, `NVFP4Tensor.to`).
    """
    fmt = scale_format(scale_dtype)
    if torch.compiler.is_compiling():
        if check_finite is False and fmt.name == "ue4m3" and global_scale is None:
            return _traced(x)
        return _untraced(x, global_scale=global_scale, check_finite=check_finite,
                         scale_dtype=scale_dtype)
    if isinstance(x, torch.Tensor):
        x = x.detach()  # the result must not keep x's autograd graph (nor a copy of |x|) alive
    q, gs = quantize_parts(x, global_scale, check_finite, fmt)
    q.saturated = saturated(x, gs, fmt)
    return q


def _traced(x) -> NVFP4Tensor:
    """`quantize(x, check_finite=False)` (UE4M3, the computed global scale) while torch.compile
    traces: the custom op ``tk_cute::nvfp4_quantize``, no graph break."""
    data, scales, gs = torch.ops.tk_cute.nvfp4_quantize(x, None, False)
    q = NVFP4Tensor.trusted(data, scales, gs, x.shape)
    q.saturated = saturated(x, None)
    return q


# Anything else runs eagerly: a graph break, or under fullgraph=True an error naming why.
_untraced = torch.compiler.disable(
    quantize, reason="tk_cute.nvfp4.quantize traces (as the custom op tk_cute::nvfp4_quantize) "
    "only with check_finite=False (its check is a host sync), UE4M3 scales and the computed "
    "global scale (a given one is checked on the host)")


def quantize_parts(x, global_scale=None, check_finite: bool = True,
                   fmt: ScaleFormat | None = None) -> tuple:
    """`quantize` without its `saturated` flag (what the custom op and `Linear`'s W4A4
    forwards need: no flag pass, no flag tensor): (the NVFP4Tensor, the checked global scale or
    None). `fmt` default: UE4M3."""
    fmt = fmt or scale_format("ue4m3")
    if isinstance(x, torch.Tensor) and x.is_cuda:
        if fmt.name != "ue4m3":
            raise NotImplementedError(
                f"quantize(scale_dtype={fmt.name!r}) has no CUDA kernel yet (the CUDA quantizer "
                f"writes UE4M3 scales): quantize x.cpu() and move the result with .to(device)")
        from .launch import quantize as quantize_cuda

        # x is checked at the first call of its dtype, shape, device and layout
        # (`launch.quantize`: validation once per kind of input, not per call)
        gs = None
        if global_scale is not None:
            try:
                gs = check_global_scale(global_scale, x.device)
            except (TypeError, ValueError):
                _check_cuda_input(x)  # (a bad x is named first, as on the CPU)
                raise
        return quantize_cuda(x, gs, check_finite=check_finite, check_input=_check_cuda_input), gs
    gs = _check_quantize_input(x, global_scale)
    return _quantize_reference(x, gs, fmt), gs
