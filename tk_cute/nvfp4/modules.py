"""NVFP4 inside torch models: `Linear`, `quantize_`, `linear` and the torch-function protocol of
`NVFP4Tensor`.

- `Linear`: an ``nn.Module`` holding NVFP4 weights as registered buffers (``weight_data`` uint8
  (N, K // 2), ``weight_scales`` uint8 blocked (RM, RK, 512), ``weight_global_scale`` float32
  0-dim, plus an optional ``bias`` in the model's dtype), so ``state_dict`` holds plain tensors
  (``torch.load(weights_only=True)`` reads it) and ``.to`` / ``.cpu`` / ``.cuda`` move every
  part. ``activations="bf16"`` runs W4A16 (bfloat16 activations as they come);
  ``activations="nvfp4"`` runs W4A4, quantizing the activations on every call (global scale
  from their amax). Under torch.compile its forward calls the custom ops of `tk_cute.nvfp4.ops`
  only, so ``torch.compile(fullgraph=True)`` traces it with no graph break; eager forwards call
  the functions the ops wrap directly (`_gemm`: the dispatcher costs more host time than a decode
  GEMM). A CUDA forward has no host sync either way (CUDA-graph capturable).
- `quantize_(model, filter_fn=None, activations=...)`: swaps matching ``nn.Linear`` children in
  place (torchao's ``quantize_`` convention: ``filter_fn(module, fqn) -> bool``); by default
  it skips what it cannot serve (`quantize_plan` says what it swaps and skips, and why).
- `linear(x, w, bias)`: the functional form, also what ``F.linear(x, w)`` runs for an
  NVFP4Tensor ``w`` (`torch_function`).

Why ``__torch_function__`` on the dataclass, not a tensor subclass: `NVFP4Tensor` is a plain
dataclass whose parts kernels take as they are; a ``torch.Tensor`` subclass would clash with
its ``data`` attribute (``torch.Tensor.data``), make every part access go through the
dispatcher, and tie the container to torch's subclass rules. torch honours
``__torch_function__`` on ANY object passed to a torch function, so ``F.linear(x, w)``,
``torch.matmul(x, w.t())`` and ``x @ w.t()`` reach `torch_function` with nothing else changed;
every other torch function raises a TypeError naming what is supported (a silent dequantize
would hide a 4x memory cost). In compiled code `linear` (and so ``F.linear``) calls the ops
on the NVFP4Tensor's parts, as `Linear`'s forward does on its buffers.

W4A4 forwards on bf16 activations run `gemm(x, w, quantize_a=True)`: at the few rows the Hopper
small-M kernel serves, the activations are quantized inside that GEMM kernel (one launch
instead of the quantizer's and the GEMM's, the same bytes; compiled: the ``nvfp4_gemm`` op's
quantize_a); elsewhere, and for fp16 / fp32 activations or with ``check_finite``, `quantize`
runs first.

Non-finite activations: W4A4 forwards quantize with ``check_finite=False`` (no host sync), so
on CUDA a NaN/Inf activation gives an unspecified output (not necessarily NaN: the global scale
from amax is non-finite); set ``Linear.check_finite = True`` to raise instead (one host sync per
call, not capturable in a CUDA graph). CPU forwards always raise ValueError. W4A16 forwards pass
NaN/Inf through the products as any GEMM does.

Validation: every NVFP4 weight is checked once where it is made or loaded: `quantize` and the
`NVFP4Tensor` constructor check their values, and ``Linear.load_state_dict`` checks the tensors
it is given BEFORE copying them in (scale bytes that decode to NaN or have the sign bit set; a
decode scale that is NaN, Inf, zero, negative or below 2^-126; dtypes and shapes), so a bad state
dict raises and leaves the module as it was. ``trusted=True`` (constructor, `Linear.from_nvfp4`,
`tk_cute.nvfp4.checkpoint`) skips the value checks (one host read per layer: a CUDA sync at load
time). In-place writes to the buffers (``layer.weight_scales[...] = ...``,
``layer.weight_global_scale.fill_(...)``, or through the parts of ``layer.weight``) are NOT
checked: they are the caller's responsibility; `Linear.validate` checks the current buffers.

dtypes: the module's floating tensors are the bias (the model's dtype) and the decode scale
(always float32). ``model.to(dtype)`` / ``.half()`` / ``.bfloat16()`` cast the bias only (the
uint8 codes and scale bytes are not floating; `Linear._apply` keeps the decode scale float32), so
an fp32 or fp16 model keeps working after `quantize_`: W4A16 forwards cast non-bfloat16
activations to bfloat16 for the kernel, which writes D in the input's dtype (one rounding of
its fp32 sums; float16: values beyond 65504 become inf), then add the bias (cast to D's dtype
if it differs); W4A4 forwards quantize float32 / bfloat16 / float16 activations as they are
and return that dtype. Other dtypes (float64, integers) raise TypeError. ``parameters()`` is empty
(nothing is trainable: an optimizer built on a quantized model gets no parameter of these
layers); the parts are buffers (``named_buffers()``, ``state_dict()``). An empty batch ((0, K),
(B, 0, K)) returns an empty output of the output's dtype without a kernel launch.

Autograd: inference only. A forward whose input requires grad while grad mode is on raises
RuntimeError (a graph silently cut at the layer would train the rest of a model wrongly); run
under ``torch.no_grad()`` / ``torch.inference_mode()`` or detach the input. The weights are
buffers (never trained) and quantize detaches its input, so no graph is kept alive through a
global scale.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tk_cute.layouts.nvfp4_scales import blocked_shape

from .format import F32_MIN_NORMAL
from .gemm import prepared
from .quantize import SUPPORTED_DTYPES, quantize, quantize_parts
from .tensor import (
    TORCH_FUNCTION,
    NVFP4Tensor,
    TransposedNVFP4,
    codes_storage,
    describe,
    normalize_parts,
    padded_codes,
)

_log = logging.getLogger("tk_cute.nvfp4")

ACTIVATIONS = ("bf16", "nvfp4")
_MATMULS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm)


def _check_activations(activations) -> str:
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be 'bf16' (W4A16) or 'nvfp4' (W4A4), got "
                         f"{activations!r}")
    return activations


def _no_grad_input(x, who: str) -> None:
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{who} is inference-only (no backward): its input requires grad. "
                           f"Run under torch.no_grad() or torch.inference_mode(), or detach it.")


class Linear(nn.Module):
    """``y = x @ W^T (+ bias)`` with NVFP4 weights W (N, K) (module docstring).

    Build one with `Linear.from_linear` (quantizes an ``nn.Linear``) or `Linear.from_nvfp4`; the
    constructor makes a zero-weight module of the right shapes to load a state dict into
    (`load_state_dict` checks what it loads, module docstring "Validation").

    Args:
        in_features: K, a multiple of 16.
        out_features: N.
        bias: whether the module has a bias.
        activations: "bf16" (W4A16: bfloat16 activations into the kernel; float32 / float16
            ones are cast to bfloat16 and D is written in their dtype) or "nvfp4" (W4A4: x
            float32 / bfloat16 / float16, quantized per call; output in x's dtype). Which to
            pick: on Hopper both run at about the same speed (the weights are decoded in the
            kernel either way; W4A4 also rounds the activations); on Blackwell / Rubin W4A4
            runs the block-scaled FP4 tensor cores and is the fast path, W4A16 the bf16 ones
            on weights decoded in shared memory (exact bf16 activations).
        device: where the buffers live.
        dtype: the bias dtype (the model's dtype; default bfloat16).
        input_scale: whether the module carries a static activation decode scale
            (``input_global_scale``, float32 0-dim), as NVFP4 checkpoints calibrated for W4A4
            ship one (ModelOpt's ``input_scale``, compressed-tensors' ``input_global_scale``).
            It is kept so that a loaded checkpoint saves back whole; forwards do not use it
            (W4A4 computes the activations' global scale from their amax on every call).
        trusted: skip the value checks when loading a state dict (module docstring).

    Attributes:
        check_finite: W4A4 only: quantize the activations with a NaN/Inf check (one host sync
            per call on CUDA). Default False.
        trusted: as the argument; may be set at any time.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 activations: str = "bf16", device=None, dtype: torch.dtype = torch.bfloat16,
                 input_scale: bool = False, trusted: bool = False):
        super().__init__()
        if in_features < 16 or in_features % 16 or out_features < 1:
            raise ValueError(f"NVFP4 Linear needs in_features a positive multiple of 16 and "
                             f"out_features >= 1, got {in_features}, {out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.activations = _check_activations(activations)
        self.check_finite = False
        self.trusted = bool(trusted)
        u8 = {"dtype": torch.uint8, "device": device}
        self.register_buffer("weight_data",
                             codes_storage((out_features, in_features), device).zero_())
        self.register_buffer("weight_scales",
                             torch.zeros(blocked_shape(out_features, in_features), **u8))
        self.register_buffer("weight_global_scale",
                             torch.ones((), dtype=torch.float32, device=device))
        bias_t = torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        self.register_buffer("bias", bias_t)
        gs_in = torch.ones((), dtype=torch.float32, device=device) if input_scale else None
        self.register_buffer("input_global_scale", gs_in)

    @classmethod
    def from_nvfp4(cls, weight: NVFP4Tensor, bias: torch.Tensor | None = None, *,
                   activations: str = "bf16", input_global_scale: torch.Tensor | None = None,
                   trusted: bool = False) -> Linear:
        """A module holding `weight` (a 2-D (N, K) NVFP4Tensor; its parts are used, not
        copied), an optional bias (N,) and an optional static activation decode scale
        (`input_global_scale`, see the class docstring). `weight` was checked when it was made
        (unless it came from `NVFP4Tensor.trusted`); the input scale is checked here unless
        `trusted`."""
        if not isinstance(weight, NVFP4Tensor) or weight.ndim != 2:
            raise TypeError(f"Linear.from_nvfp4 takes a 2-D NVFP4Tensor, got {describe(weight)} "
                            f"of shape {tuple(getattr(weight, 'shape', ()))}")
        _ue4m3_parts(weight, "Linear.from_nvfp4")
        N, K = weight.shape
        dtype = bias.dtype if bias is not None else torch.bfloat16
        mod = cls(K, N, bias is not None, activations=activations, device="meta", dtype=dtype,
                  input_scale=input_global_scale is not None, trusted=trusted)
        mod.weight_data, mod.weight_scales = weight.data, weight.scales
        mod.weight_global_scale = weight.global_scale
        if bias is not None:
            if bias.shape != (N,) or bias.device != weight.device:
                raise ValueError(f"bias must be ({N},) on {weight.device}, got "
                                 f"{tuple(bias.shape)} on {bias.device}")
            mod.bias = bias.detach()
        if input_global_scale is not None:
            gs = _scale_part(input_global_scale, "input_global_scale", weight.device)
            if not trusted:
                _check_decode_scale(gs, "input_global_scale")
            mod.input_global_scale = gs
        return mod

    @classmethod
    def from_linear(cls, linear: nn.Linear, activations: str = "bf16") -> Linear:
        """Quantize an ``nn.Linear`` (its weight with `quantize`, on its device: a one-time
        NaN/Inf check; the bias copied in its dtype)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Linear.from_linear takes an nn.Linear, got {type(linear).__name__}")
        K = linear.in_features
        if K % 16:
            raise ValueError(f"NVFP4 needs in_features % 16 == 0 (one scale per 16 K elements), "
                             f"got {linear}")
        _check_activations(activations)
        w = quantize(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls.from_nvfp4(w, bias, activations=activations)

    @property
    def weight(self) -> NVFP4Tensor:
        """The weights as an NVFP4Tensor viewing the buffers (``F.linear(x, m.weight,
        m.bias)`` equals ``m(x)`` for W4A16). Writing into its parts writes the buffers,
        unchecked (module docstring)."""
        return NVFP4Tensor.trusted(self.weight_data, self.weight_scales,
                                   self.weight_global_scale, (self.out_features, self.in_features))

    def validate(self) -> None:
        """Check the current buffers as loading does (values, dtypes, shapes): ValueError
        naming the first bad value. Reads them on the host (a CUDA sync); meta buffers pass."""
        self._check_parts(self.weight_data, self.weight_scales, self.weight_global_scale,
                          getattr(self, "input_global_scale", None), "")

    def _check_parts(self, data, scales, gs, gs_in, where: str) -> None:
        shape = (self.out_features, self.in_features)
        try:
            if gs.device.type == "meta":  # shapes only (the constructor skips values too)
                normalize_parts(data, scales, gs, shape)
            else:
                NVFP4Tensor(data, scales, gs, shape)  # the checking constructor
            if gs_in is not None:
                _check_decode_scale(gs_in, "input_global_scale")
        except (TypeError, ValueError) as e:
            raise ValueError(f"NVFP4 Linear{where} ({self.out_features} x {self.in_features}): "
                             f"{e}") from None

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # The codes' rows are 16 bytes apart in memory (`tensor.padded_codes`, K % 32 != 0): a
        # state dict holds them contiguous (N, K // 2), as the format is written and as
        # safetensors (which refuses strided views) saves them; loading pads them again.
        super()._save_to_state_dict(destination, prefix, keep_vars)
        key = prefix + "weight_data"
        if key in destination and not destination[key].is_contiguous():
            destination[key] = destination[key].contiguous()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Checked BEFORE anything is copied in: a bad state dict raises (load_state_dict turns
        # error_msgs into a RuntimeError) and leaves the module as it was. copy_ would cast
        # silently (float8 scale VALUES into uint8 bytes), so the dtypes must match exactly.
        want = {"weight_data": torch.uint8, "weight_scales": torch.uint8,
                "weight_global_scale": torch.float32, "input_global_scale": torch.float32}
        got = {}
        for name, dtype in want.items():
            t = state_dict.get(prefix + name)
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.dtype != dtype:
                error_msgs.append(f"{prefix}{name}: NVFP4 Linear needs a {dtype} tensor, got "
                                  f"{getattr(t, 'dtype', type(t).__name__)} (convert checkpoints "
                                  f"of other formats with tk_cute.nvfp4.checkpoint)")
                return
            got[name] = t
        if "input_global_scale" in got and getattr(self, "input_global_scale", None) is None:
            # a checkpoint with a static activation scale: carry it (class docstring)
            self.input_global_scale = torch.ones((), dtype=torch.float32,
                                                 device=self.weight_global_scale.device)
        if got and not getattr(self, "trusted", False):
            try:
                self._check_parts(got.get("weight_data", self.weight_data),
                                  got.get("weight_scales", self.weight_scales),
                                  got.get("weight_global_scale", self.weight_global_scale),
                                  got.get("input_global_scale"),
                                  f" {prefix[:-1]!r}" if prefix else "")
            except ValueError as e:
                error_msgs.append(str(e))
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # assign=True puts the state dict's own tensors in: give the codes their row pitch
        self.weight_data = padded_codes(self.weight_data, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _no_grad_input(x, "tk_cute.nvfp4.Linear")
        K, N = self.in_features, self.out_features
        if x.shape[-1] != K:
            raise ValueError(f"input's last dim is {x.shape[-1]}, this Linear takes "
                             f"in_features={K}")
        w = (self._part("weight_data"), self._part("weight_scales"),
             self._part("weight_global_scale"))
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"W4A4 Linear takes float32, bfloat16 or float16 activations, got "
                            f"{x.dtype}" if self.activations == "nvfp4" else
                            f"W4A16 Linear takes bfloat16 activations (float32 and float16 are "
                            f"cast to bfloat16, D written in their dtype), got {x.dtype}")
        if x.numel() == 0:
            y = x.new_zeros((*x.shape[:-1], N))
        elif self.activations == "nvfp4":
            x2 = x if x.dim() == 2 else x.reshape(-1, K)  # (a reshape costs ~1 us of host)
            if x.dtype == torch.bfloat16 and not self.check_finite:  # (in the GEMM if planned)
                y = _gemm(x2, w, (N, K), x.dtype, quantize_a=True)
            else:
                y = _gemm(_quantize(x2, self.check_finite), w, (N, K), x.dtype)
            if x.dim() != 2:
                y = y.reshape(*x.shape[:-1], N)
        else:
            xb, out_dtype = _w4a16_activations(x)
            y = _gemm(xb, w, (N, K), out_dtype)
        return _add_bias(y, self._part("bias"))

    def _part(self, name: str):
        """A buffer, read from `_buffers` (Module.__getattr__ costs ~0.3 us, this runs per
        call), or the attribute where it is no longer a buffer (e.g. a bias made a Parameter)."""
        bufs = self._buffers
        return bufs[name] if name in bufs else getattr(self, name)

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) / .half() cast every floating buffer: the decode scales must stay
        # float32 (the kernels read them so), so they only follow the device.
        # A move copies the codes contiguous, dropping the 16-byte row padding of K % 32 != 0
        # (`tensor.padded_codes`): pad them again here, once, not in every forward.
        scales = {n: getattr(self, n, None)
                  for n in ("weight_global_scale", "input_global_scale")}
        out = super()._apply(fn, recurse)
        for name, before in scales.items():
            moved = getattr(self, name, None)
            if moved is not None and moved.dtype != torch.float32:
                setattr(self, name, before.to(moved.device))
        self.weight_data = padded_codes(self.weight_data, self.in_features)
        return out

    def extra_repr(self) -> str:
        carried = getattr(self, "input_global_scale", None) is not None
        static = ", input_scale=True" if carried else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activations={self.activations!r}{static}")


def _scale_part(t, what: str, device) -> torch.Tensor:
    """A one-element float32 tensor (or Python number) as a float32 0-dim tensor on `device`."""
    t = torch.as_tensor(t)
    if t.numel() != 1 or not t.dtype.is_floating_point:
        raise ValueError(f"{what} must be one floating value, got {t.dtype} "
                         f"{tuple(t.shape)}")
    return t.detach().reshape(()).to(device=device, dtype=torch.float32)


def _check_decode_scale(gs: torch.Tensor, what: str) -> None:
    """A decode scale must be positive, finite and at least 2^-126 (as `quantize` requires of a
    given one): one host read (meta tensors pass)."""
    if gs.device.type == "meta":
        return
    value = float(gs)
    if not (value >= F32_MIN_NORMAL and value != float("inf")):  # also catches NaN
        raise ValueError(f"{what} (a decode scale) must be positive, finite and at least "
                         f"2**-126, got {value!r}")


# ---------------------------------------------------------------- quantize_


@dataclass
class QuantizePlan:
    """What `quantize_` swaps (`swap`, fully qualified names) and what it skips (`skip`:
    name -> reason), parents before children. A module shared by several parents is listed
    under each name it has."""

    swap: list[str] = field(default_factory=list)
    skip: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"NVFP4 quantize_: {len(self.swap)} nn.Linear swapped, {len(self.skip)} skipped"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skip.items()]
        return "\n".join(lines)


def _unservable(child: nn.Module, parent: nn.Module, holders: dict) -> str | None:
    """Why `quantize_` cannot serve this nn.Linear, or None. `holders`: id of each parameter
    of the model -> the (fqn, module) pairs holding it (built by `_plan`)."""
    tied = [fqn for fqn, m in holders.get(id(child.weight), ()) if m is not child]
    if tied:
        return (f"its weight is shared with {tied[0]!r} (tied, e.g. an output head and the "
                f"embedding): a swap would untie them and keep the dense copy as well")
    if isinstance(parent, nn.MultiheadAttention) or isinstance(
            child, nn.modules.linear.NonDynamicallyQuantizableLinear):
        return ("its parent reads .weight as a dense tensor (nn.MultiheadAttention's out_proj, "
                "multiplied by F.multi_head_attention_forward itself)")
    if child.in_features % 16:
        return (f"in_features={child.in_features} is not a multiple of 16 (one NVFP4 scale per "
                f"16 K elements)")
    return None


def quantize_plan(model: nn.Module,
                  filter_fn: Callable[[nn.Module, str], bool] | None = None) -> QuantizePlan:
    """What `quantize_(model, filter_fn)` would swap and skip, without changing anything.

    Raises:
        as `quantize_` does for a `filter_fn` that selects what cannot be swapped.
    """
    return _plan(model, filter_fn)[0]


def _plan(model, filter_fn):
    if not isinstance(model, nn.Module) or isinstance(model, nn.Linear):
        raise TypeError(f"quantize_ swaps the nn.Linear children of a model; got "
                        f"{type(model).__name__} (for one layer use Linear.from_linear)")
    plan, slots = QuantizePlan(), []
    holders: dict = {}  # parameter id -> [(fqn, module)]: tied weights
    for name, m in model.named_modules():
        for p in m._parameters.values():
            if p is not None:
                holders.setdefault(id(p), []).append((name, m))
    for name, parent in list(model.named_modules()):
        # _modules, not named_children: that skips a second slot holding a module already seen
        for child_name, child in list(parent._modules.items()):
            if child is None:
                continue
            fqn = f"{name}.{child_name}" if name else child_name
            if filter_fn is None:
                if not isinstance(child, nn.Linear):
                    continue
                why = _unservable(child, parent, holders)
                if why is not None:
                    plan.skip[fqn] = why
                    continue
            else:
                if not filter_fn(child, fqn):
                    continue
                if not isinstance(child, nn.Linear):
                    raise TypeError(f"quantize_: filter_fn selected {fqn!r}, a "
                                    f"{type(child).__name__}; only nn.Linear modules are swapped")
                why = _unservable(child, parent, holders)
                if why is not None:
                    raise ValueError(f"quantize_: filter_fn selected {fqn!r}, which NVFP4 cannot "
                                     f"serve: {why}; exclude it with filter_fn (or pass "
                                     f"filter_fn=None, which skips such layers)")
            plan.swap.append(fqn)
            slots.append((parent, child_name, child))
    return plan, slots


def quantize_(model: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None = None, *,
              activations: str = "bf16") -> nn.Module:
    """Swap every matching ``nn.Linear`` of `model` for an NVFP4 `Linear`, in place.

    Args:
        model: the model (not itself an ``nn.Linear``: use `Linear.from_linear`), in any
            floating dtype: bfloat16, float16 and float32 models all run after the swap (the
            module docstring's "dtypes": W4A16 casts non-bfloat16 activations to bfloat16 for
            the kernel and the result back).
        filter_fn: ``filter_fn(module, fqn) -> bool`` selects modules to swap. Default (None):
            every ``nn.Linear`` that NVFP4 can serve, skipping (as torchao's default filter
            does) ``nn.MultiheadAttention``'s ``out_proj``, whose parent reads ``.weight`` as a
            dense tensor, layers whose in_features is not a multiple of 16, and layers whose
            weight is tied to another module's (an output head sharing the embedding: the
            swap would keep both copies). A given
            filter_fn must select only ``nn.Linear`` modules NVFP4 can serve (anything else
            raises, naming the module). A module shared by several parents is quantized once
            and stays shared.
        activations: "bf16" (W4A16) or "nvfp4" (W4A4), see `Linear`.

    Returns:
        `model`. What was swapped and what was skipped (with the reason) is logged at INFO
        level on the ``tk_cute.nvfp4`` logger; `quantize_plan` returns it as a `QuantizePlan`
        without changing the model.

    Raises:
        TypeError: `model` is an ``nn.Linear`` or not a module, or `filter_fn` selected a
            module that is not an ``nn.Linear``.
        ValueError: `filter_fn` selected a Linear NVFP4 cannot serve (its name and the reason
            are in the message), or `activations` is unknown.
    """
    _check_activations(activations)
    plan, slots = _plan(model, filter_fn)
    done: dict[int, Linear] = {}
    for parent, child_name, child in slots:
        if id(child) not in done:
            done[id(child)] = Linear.from_linear(child, activations)
        setattr(parent, child_name, done[id(child)])
    _log.info("%s", plan)
    return model


def _ue4m3_parts(q: NVFP4Tensor, who: str) -> None:
    """The torch ops (`ops`) carry an NVFP4Tensor as its three parts, which say nothing of the
    scale format: only UE4M3 tensors may take that route."""
    if q.scale_format != "ue4m3":
        raise NotImplementedError(f"{who}: the torch custom ops carry UE4M3 NVFP4 tensors only; "
                                  f"this one has {q.scale_format} scales (call "
                                  f"tk_cute.nvfp4.gemm directly)")


# Each call goes through the custom ops while torch.compile traces (what makes the trace
# graph-break free) and straight to the functions the ops wrap in eager code: the dispatcher's
# custom-op path costs ~30 us of host time per call on the H200, more than a decode GEMM takes
# on the GPU (docs/facts.md#host-time). Same kernels, same bytes either way.
# Operands travel as parts (data, scales, global scale): torch 2.11's dynamo traces attribute
# reads of an NVFP4Tensor but not building one, so the compiled path never builds one.


def _quantize(x: torch.Tensor, check_finite: bool):
    """`quantize(x, check_finite=...)` without the `saturated` flag nobody reads here
    (`quantize_parts`): the NVFP4Tensor, or its three parts while compiling."""
    if torch.compiler.is_compiling():
        return torch.ops.tk_cute.nvfp4_quantize(x, None, check_finite)
    return quantize_parts(x, None, check_finite)[0]


def _gemm(a, w: tuple, shape: tuple, out_dtype: torch.dtype,
          quantize_a: bool = False) -> torch.Tensor:
    """`gemm(a, w, out_dtype, quantize_a=quantize_a)` for weight parts `w` of logical `shape`
    (UE4M3, valid values) and a bfloat16 `a` (W4A16; W4A4 with quantize_a) or NVFP4
    activations (W4A4: an NVFP4Tensor, or its three parts while compiling). Eager calls run the
    weights' prepared call (`gemm.prepared`)."""
    if torch.compiler.is_compiling():
        a_parts = a if isinstance(a, tuple) else (a, None, None)
        return torch.ops.tk_cute.nvfp4_gemm(*a_parts, *w, out_dtype, False, quantize_a)
    return prepared(a, *w, shape, "ue4m3", out_dtype, False, None, quantize_a)(a)


def linear(x, w: NVFP4Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w^T (+ bias)`` as ``F.linear``: W4A16 for a floating tensor x (..., K) (as
    `Linear`'s W4A16 forward: float32 / float16 x cast to bfloat16 for the kernel, D written
    in x's dtype), W4A4 for an NVFP4Tensor x (M, K) (D bfloat16). The bias is added in D's
    dtype. Runs the custom ops (`tk_cute.nvfp4.ops`) under torch.compile,
    `tk_cute.nvfp4.gemm` directly in eager code."""
    if not isinstance(w, NVFP4Tensor):
        raise TypeError(f"nvfp4 linear: the weight must be an NVFP4Tensor, got "
                        f"{type(w).__name__}")
    _no_grad_input(x, "F.linear with an NVFP4 weight")
    _ue4m3_parts(w, "nvfp4 linear")
    if isinstance(x, NVFP4Tensor):
        _ue4m3_parts(x, "nvfp4 linear")
    if not isinstance(x, (NVFP4Tensor, torch.Tensor)):
        raise TypeError(f"nvfp4 linear: x must be a bfloat16 tensor (W4A16) or an NVFP4Tensor "
                        f"(W4A4), got {type(x).__name__}")
    out_dtype = torch.bfloat16
    if isinstance(x, torch.Tensor):
        x, out_dtype = _w4a16_activations(x)
    if isinstance(x, torch.Tensor) and x.numel() == 0 and x.shape[-1:] == (w.K,):
        y = x.new_zeros((*x.shape[:-1], w.M), dtype=out_dtype)  # an empty batch
        return _add_bias(y, bias)
    if isinstance(x, NVFP4Tensor) and torch.compiler.is_compiling():
        x = (x.data, x.scales, x.global_scale)
    y = _gemm(x, (w.data, w.scales, w.global_scale), w.shape, out_dtype)
    return _add_bias(y, bias)


def _w4a16_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    """W4A16's kernel activations and D's dtype: bfloat16 x as is; float32 / float16 x cast to
    bfloat16 (the kernels read bfloat16), D written in x's dtype."""
    if x.dtype in (torch.float32, torch.float16):
        return x.to(torch.bfloat16), x.dtype
    return x, torch.bfloat16


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``y + bias`` in y's dtype (a bias of another dtype is cast, as D's dtype is the
    contract: type promotion would silently widen D)."""
    if bias is None:
        return y
    return y + (bias if bias.dtype == y.dtype else bias.to(y.dtype))


def torch_function(func, args, kwargs):
    """`NVFP4Tensor.__torch_function__`: ``F.linear(x, w, bias)`` and ``torch.matmul(x,
    w.t())`` / ``x @ w.t()`` (also ``torch.mm``) run `linear`; anything else raises TypeError."""
    if func is F.linear:
        names = ("input", "weight", "bias")
        bound = dict(zip(names, args), **kwargs)
        if isinstance(bound.get("input"), NVFP4Tensor) and not isinstance(
                bound.get("weight"), NVFP4Tensor):
            raise TypeError("F.linear with NVFP4 activations needs an NVFP4Tensor weight too")
        return linear(bound["input"], bound["weight"], bound.get("bias"))
    if func in _MATMULS and len(args) == 2 and not kwargs:
        x, wt = args
        if isinstance(wt, TransposedNVFP4) and not isinstance(x, TransposedNVFP4):
            if func in (torch.mm, torch.Tensor.mm) and getattr(x, "ndim", 2) != 2:
                raise ValueError(f"torch.mm takes a 2-D input, got {tuple(x.shape)}")
            return linear(x, wt.base)
        raise TypeError("an NVFP4 matmul is x @ w.t() with w the (N, K) NVFP4 weight (x a "
                        "bfloat16 tensor or an NVFP4Tensor); w @ x and x @ w are not supported")
    name = torch.overrides.resolve_name(func) or repr(func)
    raise TypeError(f"NVFP4Tensor supports F.linear(x, w), torch.matmul(x, w.t()) and "
                    f"x @ w.t() among torch functions, not {name}: call .dequantize(dtype) for a "
                    f"dense tensor, or pass its parts (.data, .scales, .global_scale)")


TORCH_FUNCTION[0] = torch_function
