"""`NVFP4Tensor`: an (M, K) or (L, M, K) matrix stored as NVFP4, in the bytes kernels consume.

Three parts, each already in its global-memory layout so a kernel can take the tensors as is:

* ``data``: torch.uint8 (..., M, K // 2), two E2M1 codes per byte, element 2i in the LOW nibble;
  rows `nvfp4_codes.row_pitch(K)` bytes apart (16-byte aligned, as the TMA needs), batches
  M * row_pitch(K) apart. For K % 32 == 0 that is plainly contiguous; otherwise (K = 8208, 48
  ...) ``data`` is a view of rows padded by 8 bytes of zeros, made once when the tensor is made
  (`padded_codes`): ``data.is_contiguous()`` is then False, and ``data.contiguous()`` is the
  codes without the padding (what other libraries take).
* ``scales``: torch.uint8 block-scale bytes in the 128x4 blocked layout, (RM, RK, 512) or
  (L, RM, RK, 512) (see ``tk_cute.layouts.nvfp4_scales``); padding bytes are zero.
* ``global_scale``: float32 0-dim tensor, the per-tensor DECODE scale (one for all L batches).
* ``scale_format``: what the scale bytes are (`format.SCALE_FORMATS`): "ue4m3" (NVFP4, the
  default) or "ue5m3" (Rubin's 5-exponent-bit scales, same blocked layout).

The value represented is ``e2m1(data) * sf(scale of its 16-element block) * global_scale``.
The public constructor checks shapes, dtypes and devices, and the VALUES that would decode to NaN
or to a sign-flipped scale: a global scale that is not finite or below 2^-126 (float32's smallest
normal, the bound `quantize` puts on a given scale), and scale bytes above the format's largest
finite byte (UE4M3: above 0x7E: 0x7F is NaN, 0x80 and up have the sign bit of an unsigned format
set; UE5M3: 0xFF, its only NaN), padding included (a tensor core multiplies padding scales into
zero data, and NaN * 0 is NaN). Reading the values syncs a CUDA device once; kernels and views,
whose parts are valid by construction, use `NVFP4Tensor.trusted`. The check runs once, when the
tensor is made: writing into its parts afterwards (``q.scales[...] = ...``) is not checked.

Other forms of the parts the constructor accepts (normalized once, `normalize_parts`; the stored
parts are always the forms above): ``torch.float4_e2m1fn_x2`` data and ``torch.float8_e4m3fn``
scales are viewed as uint8 (same bytes); a flat 1-D scale tensor of the blocked layout's size
(FlashInfer's form) is reshaped to (RM, RK, 512) or (L, RM, RK, 512) (only 1-D: a 2-D
row-major (M, K // 16) matrix is rejected, as it can have the blocked size too; `to_blocked`
converts it); a (1,) global scale is reshaped to 0-dim. `data_fp4x2` and `scales_e4m3` view
the stored parts in those torch dtypes.

In torch code: an NVFP4Tensor is a plain dataclass, not a ``torch.Tensor`` subclass (its
``data`` attribute would clash with ``torch.Tensor.data``, and kernels take its parts as they
are). It takes part in torch calls through the ``__torch_function__`` protocol, which torch
honours for any object passed to a torch function: ``F.linear(x, w)`` (W4A16 for a bf16 x, W4A4
for an NVFP4Tensor x), ``torch.matmul(x, w.t())`` and ``x @ w.t()`` (``w.t()`` / ``w.T`` /
``w.mT`` is a `TransposedNVFP4` marker, not a copy) run `tk_cute.nvfp4.gemm` through the
custom ops of `tk_cute.nvfp4.ops`; every other torch function raises TypeError (see
`tk_cute.nvfp4.modules`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tk_cute.layouts import nvfp4_codes
from tk_cute.layouts.nvfp4_scales import blocked_shape, from_blocked

from .format import (
    F32_MIN_NORMAL,
    e2m1_decode,
    round_float64,
    scale_format,
    unpack_fp4,
)


# The handler of torch functions on NVFP4 tensors, `modules.torch_function`, which installs
# itself when `tk_cute.nvfp4` (whose package import runs first) imports it: a one-slot list, so
# that this low module never imports the modules above it.
TORCH_FUNCTION = [None]

SF_VEC = 16


@dataclass
class NVFP4Tensor:
    """An NVFP4-quantized matrix (or batch of matrices).

    Attributes:
        data: torch.uint8, (..., M, K // 2) packed E2M1 codes (low nibble = even element).
        scales: torch.uint8, (RM, RK, 512) or (L, RM, RK, 512), blocked block scales.
        global_scale: torch.float32 0-dim tensor, the per-tensor decode scale.
        shape: torch.Size, the logical (M, K) or (L, M, K).
        scale_format: "ue4m3" (default) or "ue5m3": how the scale bytes decode.
    """

    data: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    shape: torch.Size
    scale_format: str = "ue4m3"

    def __post_init__(self) -> None:
        self.scale_format = scale_format(self.scale_format).name
        self.data, self.scales, self.global_scale, self.shape = normalize_parts(
            self.data, self.scales, self.global_scale, self.shape, self.scale_format)
        if self.global_scale.device.type != "meta":  # meta tensors (shape-only planning)
            self._check_values()

    def __eq__(self, other) -> bool:
        """Whether `other` is an NVFP4Tensor of the same shape and scale format, on the same
        device, with the same bytes: codes, blocked scales (their padding too) and decode
        scale (reads both: a CUDA sync). Tensors on different devices are unequal."""
        if not isinstance(other, NVFP4Tensor):
            return NotImplemented
        if other is self:
            return True
        if (self.shape, self.scale_format, self.device) != (
                other.shape, other.scale_format, other.device):
            return False
        return all(torch.equal(a, b) for a, b in ((self.data, other.data),
                                                  (self.scales, other.scales),
                                                  (self.global_scale, other.global_scale)))

    def _check_values(self) -> None:
        """Reject a global scale or scale bytes that decode to NaN or to garbage (one host read
        of each part: a CUDA sync, paid once by a user assembling a tensor from parts)."""
        value = float(self.global_scale)
        if not (value >= F32_MIN_NORMAL and value != float("inf")):  # also catches NaN
            raise ValueError(
                f"NVFP4Tensor.global_scale (the decode scale) must be positive, finite and at "
                f"least 2**-126 (float32's smallest normal, as quantize requires), got {value!r}"
            )
        fmt = scale_format(self.scale_format)
        bad = self.scales > fmt.max_byte
        if not bool(bad.any()):
            return
        what = ("UE4M3 bytes 0x00..0x7E (0x7F is NaN; bytes >= 0x80 set the sign bit)"
                if fmt.name == "ue4m3" else "UE5M3 bytes 0x00..0xFE (0xFF is its NaN)")
        logical = from_blocked(bad, self.M, self.K)  # (..., M, K // 16), padding dropped
        if bool(logical.any()):
            pos = tuple(int(i) for i in logical.nonzero()[0])
            byte = int(self.scales_logical()[pos])
            *l, row, col = pos
            where = (f"batch {l[0]}, " if l else "") + (
                f"row {row}, scale column {col} (K elements {16 * col}..{16 * col + 15})"
            )
        else:
            flat = int(bad.reshape(-1).nonzero()[0])
            byte = int(self.scales.reshape(-1)[flat])
            where = f"padding byte {flat} of the blocked scale tensor"
        raise ValueError(f"NVFP4Tensor.scales must hold {what}, got 0x{byte:02X} at {where}")

    @classmethod
    def trusted(cls, data, scales, global_scale, shape, scale_format: str = "ue4m3",
                padded: bool = False) -> "NVFP4Tensor":
        """A tensor from parts a kernel or a view of a valid tensor produced (no value checks:
        they cost ~13 us of host time, and reading a CUDA global scale would sync). Codes whose
        rows are not `row_pitch` apart (a torch op that made them contiguous: ``.to``,
        ``torch.cat``, a reshape) are copied once into padded rows (`padded_codes`); `padded`:
        the caller made them with `codes_storage`'s layout (not checked again)."""
        shape = torch.Size(shape)
        out = cls.__new__(cls)
        out.__dict__.update(data=data if padded else padded_codes(data, shape[-1]),
                            scales=scales, global_scale=global_scale, shape=shape,
                            scale_format=scale_format)
        return out

    @property
    def device(self) -> torch.device:
        """The device all three parts live on."""
        return self.data.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def M(self) -> int:
        return self.shape[-2]

    @property
    def K(self) -> int:
        return self.shape[-1]

    @property
    def L(self) -> int | None:
        """Batch count, or None for an unbatched (M, K) tensor."""
        return self.shape[0] if self.ndim == 3 else None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "NVFP4Tensor":
        """A copy on `device` (the same object if already there). Moves only: the codes and
        scales keep their format (a dense tensor of a dtype: `dequantize(dtype)`)."""
        if isinstance(device, torch.dtype):
            raise TypeError(f"NVFP4Tensor.to moves the tensor between devices only, got the "
                            f"dtype {device}: call .dequantize({device}) for a dense tensor")
        device = torch.device(device)
        if device == self.device:
            return self
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        # The parts were checked (or trusted) already: moving them changes no value. The codes
        # move with their padded rows (a move of the view would drop the padding).
        data = move(self.data_padded)[..., :self.K // 2]
        return NVFP4Tensor.trusted(data, move(self.scales), move(self.global_scale),
                                   self.shape, self.scale_format)

    def cpu(self) -> NVFP4Tensor:
        """A copy in host memory (the same object if already there)."""
        return self.to("cpu")

    def cuda(self, device: torch.device | str | int | None = None,
             non_blocking: bool = False) -> NVFP4Tensor:
        """A copy on a CUDA device (default: the current one), as ``torch.Tensor.cuda``."""
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return self.to(device, non_blocking=non_blocking)

    @property
    def data_padded(self) -> torch.Tensor:
        """The codes as stored: a contiguous uint8 (..., M, row_pitch(K)) view, each row's
        padding (K % 32 != 0: 8 bytes of zeros) included; `data` itself for K % 32 == 0."""
        d = self.data
        return d.as_strided((*d.shape[:-1], nvfp4_codes.row_pitch(self.K)), d.stride())

    @property
    def data_fp4x2(self) -> torch.Tensor:
        """`data` viewed as ``torch.float4_e2m1fn_x2`` (the same bytes, shape (..., M, K // 2))."""
        return self.data.view(torch.float4_e2m1fn_x2)

    @property
    def scales_e4m3(self) -> torch.Tensor:
        """`scales` viewed as ``torch.float8_e4m3fn`` (the same blocked bytes and shape); UE4M3
        tensors only (torch has no UE5M3 dtype: TypeError)."""
        if self.scale_format != "ue4m3":
            raise TypeError(f"scales_e4m3 views UE4M3 scales; this tensor's are "
                            f"{self.scale_format} (use .scales, uint8)")
        return self.scales.view(torch.float8_e4m3fn)

    def t(self) -> TransposedNVFP4:
        """The transposed matrix as a marker for ``x @ w.t()`` (no copy; 2-D only)."""
        if self.ndim != 2:
            raise ValueError(f"NVFP4Tensor.t() needs a 2-D (N, K) tensor, got {tuple(self.shape)}")
        return TransposedNVFP4(self)

    @property
    def T(self) -> TransposedNVFP4:
        return self.t()

    @property
    def mT(self) -> TransposedNVFP4:
        return self.t()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # torch calls this for any torch function one of whose arguments is an NVFP4Tensor
        # (or a TransposedNVFP4): the handled functions and the TypeError live in `modules`,
        # which installs its handler here on import (`TORCH_FUNCTION`).
        return TORCH_FUNCTION[0](func, args, kwargs or {})

    def __rmatmul__(self, other):
        # `x @ w` lands here once torch.Tensor.__matmul__ gives up: torch.matmul explains why
        # it is not supported (it would be x @ w, not x @ w^T).
        return torch.matmul(other, self)

    def scales_logical(self) -> torch.Tensor:
        """The block scales as a row-major (..., M, K // 16) uint8 matrix (padding dropped)."""
        return from_blocked(self.scales, self.M, self.K)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """See `dequantize`."""
        return dequantize(self, dtype)

    def __repr__(self) -> str:
        fmt = "" if self.scale_format == "ue4m3" else f", scale_format={self.scale_format!r}"
        return (
            f"NVFP4Tensor(shape={tuple(self.shape)}, device={self.device}, "
            f"global_scale={float(self.global_scale):.9g}{fmt})"
        )


class TransposedNVFP4:
    """``w.t()`` of a 2-D NVFP4Tensor ``w`` (N, K): a (K, N) marker for ``x @ w.t()`` and
    ``torch.matmul(x, w.t())``, which compute ``x @ w^T`` as ``F.linear(x, w)`` does. Holds
    ``w``; ``.t()`` gives it back, `dequantize` the transposed dense matrix."""

    __slots__ = ("base",)

    def __init__(self, base: NVFP4Tensor) -> None:
        self.base = base

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.base.K, self.base.M))

    @property
    def device(self) -> torch.device:
        return self.base.device

    def t(self) -> NVFP4Tensor:
        return self.base

    T = property(t)
    mT = property(t)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.base.dequantize(dtype).t()

    def __rmatmul__(self, other):
        return torch.matmul(other, self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return TORCH_FUNCTION[0](func, args, kwargs or {})

    def __repr__(self) -> str:
        return f"{self.base!r}.t()"


def _bytes(t, name: str, alt: torch.dtype) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"NVFP4Tensor.{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(t, f"NVFP4Tensor.{name}")
    return t.view(torch.uint8) if t.dtype == alt else t  # the same bytes, element size 1


def check_dense(t: torch.Tensor, what: str, *, values: bool = False) -> None:
    """Raise unless the tensor `t` is dense (strided, not nested), as every part, input and
    output of the NVFP4 format is: TypeError naming its layout. `values`: `t`'s values are
    read, so a meta tensor (a shape without values) raises ValueError too."""
    if t.is_nested:
        raise TypeError(f"{what} must be a dense (strided) tensor, got a nested tensor (pass "
                        f"its tensors one at a time)")
    if t.layout != torch.strided:
        raise TypeError(f"{what} must be a dense (strided) tensor, got layout {t.layout} "
                        f"(convert it with .to_dense())")
    if values and t.device.type == "meta":
        raise ValueError(f"{what} is a meta tensor: it has a shape but no values to read (make "
                         f"it on a real device, e.g. load the weights of a model built on meta)")


def is_torchao(x) -> bool:
    """Whether `x` is a torchao NVFP4Tensor (its parts by name: torchao is not imported)."""
    return all(hasattr(x, a) for a in ("qdata", "scale", "per_tensor_scale", "block_size"))


def describe(x) -> str:
    """`x`'s class for a "got ..." message: its plain name for Python's, torch's and numpy's
    types, else with its module (another library's NVFP4Tensor is not ours); a torchao
    NVFP4Tensor is pointed to `from_torchao`."""
    cls = type(x)
    if is_torchao(x):
        return (f"{cls.__module__}.{cls.__qualname__} (torchao's: convert it with "
                f"tk_cute.nvfp4.from_torchao, the same bytes)")
    if cls.__module__.split(".")[0] in ("builtins", "torch", "numpy"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def codes_storage(shape, device, zero_padding: bool = True) -> torch.Tensor:
    """Codes of a logical (..., M, K) operand, uninitialized: a uint8 (..., M, K // 2) view whose
    rows are `nvfp4_codes.row_pitch(K)` bytes apart (module docstring), its padding zeroed
    unless `zero_padding` is False (for a kernel that writes the padding itself)."""
    *lead, M, K = shape
    pitch = nvfp4_codes.row_pitch(K)
    if pitch == K // 2:
        return torch.empty((*lead, M, pitch), dtype=torch.uint8, device=device)
    alloc = torch.zeros if zero_padding else torch.empty
    return alloc((*lead, M, pitch), dtype=torch.uint8, device=device)[..., :K // 2]


def has_row_pitch(data: torch.Tensor, K: int) -> bool:
    """Whether `data` (..., M, K // 2) is laid out as `codes_storage` lays codes out: rows
    `row_pitch(K)` apart, batches M rows apart, bytes contiguous. (Its address is not read:
    tracing runs this on fake tensors; the launches check the alignment.)"""
    want = nvfp4_codes.strides(data.shape[-2], K, data.dim() == 3)
    got = data.stride()
    if got == want:
        return True
    # Strides of size-1 dimensions are arbitrary (and never used) where rows have no padding;
    # padded rows must be there, even the last one's (`NVFP4Tensor.data_padded` views them).
    return not nvfp4_codes.padded(K) and all(
        g == w or n == 1 for g, w, n in zip(got, want, data.shape))


def padded_codes(data: torch.Tensor, K: int) -> torch.Tensor:
    """`data` if it has the row pitch (`has_row_pitch`), else a copy into `codes_storage`."""
    if has_row_pitch(data, K):
        return data
    out = codes_storage((*data.shape[:-1], K), data.device)
    return out.copy_(data)


def normalize_parts(data, scales, global_scale, shape, scale_format: str = "ue4m3"):
    """The parts in their stored forms (module docstring: the accepted alternatives are viewed
    or reshaped, never converted; codes without the row pitch are copied into padded rows,
    `padded_codes`, and non-contiguous scales into contiguous ones, once, so that no kernel
    launch copies them), checked for dtype, shape and device; values are not read.
    float8_e4m3fn scales are accepted for the "ue4m3" format only.

    Returns:
        (data, scales, global_scale, shape) with ``shape`` a torch.Size.

    Raises:
        TypeError: a part is not a tensor.
        ValueError: the logical shape is not (M, K) / (L, M, K) with K % 16 == 0, or a part has
            the wrong dtype or shape, or the parts live on different devices.
    """
    shape = torch.Size(shape)
    if len(shape) not in (2, 3):
        raise ValueError(f"NVFP4Tensor shape must be (M, K) or (L, M, K), got {shape}")
    *lead, M, K = shape
    if M < 1 or K < 1 or K % SF_VEC:
        raise ValueError(f"NVFP4Tensor needs M >= 1 and K a multiple of 16, got {shape}")
    data = _bytes(data, "data", torch.float4_e2m1fn_x2)
    if scale_format != "ue4m3" and isinstance(scales, torch.Tensor) and (
            scales.dtype == torch.float8_e4m3fn):
        raise ValueError(f"NVFP4Tensor.scales of format {scale_format} must be uint8 bytes, got "
                         f"float8_e4m3fn (UE4M3)")
    scales = _bytes(scales, "scales", torch.float8_e4m3fn)
    if not isinstance(global_scale, torch.Tensor):
        raise TypeError(f"NVFP4Tensor.global_scale must be a torch.Tensor, got "
                        f"{type(global_scale).__name__}")
    check_dense(global_scale, "NVFP4Tensor.global_scale")
    sf_shape = torch.Size(blocked_shape(M, K, *lead))
    if scales.dim() == 1 and scales.numel() == math.prod(sf_shape):
        scales = scales.reshape(sf_shape)  # a flat blocked buffer (FlashInfer's form)
    if global_scale.shape == (1,):
        global_scale = global_scale.reshape(())
    want = {"data": (torch.Size((*lead, M, K // 2)), data), "scales": (sf_shape, scales)}
    for name, (want_shape, t) in want.items():
        if t.dtype != torch.uint8 or t.shape != want_shape:
            raise ValueError(
                f"NVFP4Tensor.{name} must be uint8 of shape {tuple(want_shape)} for logical shape "
                f"{tuple(shape)}, got {t.dtype} {tuple(t.shape)}"
            )
    gs = global_scale
    if gs.dtype != torch.float32 or gs.dim() != 0:
        raise ValueError(
            f"NVFP4Tensor.global_scale must be a float32 0-dim tensor, got {gs.dtype} "
            f"{tuple(gs.shape)}"
        )
    devices = {t.device for t in (data, scales, gs)}
    if len(devices) != 1:
        raise ValueError(
            f"NVFP4Tensor parts must share one device, got {sorted(map(str, devices))}"
        )
    return padded_codes(data, K), scales.contiguous(), gs, shape


def dequantize(q: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode an NVFP4Tensor: ``e2m1(code) * sf(block scale) * global_scale``, sf its format's
    value (UE4M3 or UE5M3).

    The product is formed exactly in float64 (e2m1 * sf has at most 6 significant bits, times
    a float32 global scale at most 30 bits) and rounded once to `dtype` by
    `format.round_float64` (not torch's float64 -> bfloat16/float16 cast, which rounds twice).
    float32 results are the correctly rounded fp32 product ``fl32(e2m1 * sf * g)``, identical to
    computing ``(e2m1 * sf) * g`` in float32 since ``e2m1 * sf`` is exact. Code 8 decodes to
    -0.0.

    Overflow: every decoded magnitude is at most ``6 * 448 * g = 2688 * g``. For
    ``g <= F32_MAX / 2688`` (= 798915 * 2^97 ~ 1.2660e35, itself a float32) every byte pattern
    decodes to a finite float32, and every global scale `quantize` computes meets that bound
    (``fl(amax / 2688) <= fl(F32_MAX / 2688)``). A larger global scale, only possible when given
    to `quantize` or to the constructor, can decode finite inputs to +-inf in float32 (codes
    +-6 with scale 448 already do at the next float32 above the bound). bfloat16 and float16
    results are +-inf wherever the value rounds past their largest finite value. UE5M3: the
    same with 6 * 114688 = 688128 in place of 2688 (bound F32_MAX / 688128).

    Args:
        q: the tensor to decode.
        dtype: a floating result dtype (default float32).

    Returns:
        A (..., M, K) tensor of `dtype` on q's device.
    """
    if not isinstance(q, NVFP4Tensor):
        raise TypeError(f"dequantize expects an NVFP4Tensor, got {describe(q)}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dequantize dtype must be a floating torch.dtype (e.g. torch.float32), "
                        f"got {dtype!r}")
    vals = e2m1_decode(unpack_fp4(q.data)).to(torch.float64)
    sf = scale_format(q.scale_format).decode(q.scales_logical()).to(torch.float64)
    block_scale = sf.repeat_interleave(SF_VEC, dim=-1) * q.global_scale.to(torch.float64)
    return round_float64(vals * block_scale, dtype)
