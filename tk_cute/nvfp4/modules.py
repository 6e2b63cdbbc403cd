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
  place (torchao's ``quantize_`` convention: ``filter_fn(module, fqn) -> bool``).
- `linear(x, w, bias)`: the functional form, also what ``F.linear(x, w)`` runs for an
  NVFP4Tensor ``w`` (`torch_function`).

Why ``__torch_function__`` on the dataclass, not a tensor subclass: `NVFP4Tensor` is a plain
dataclass whose parts kernels take as they are; a ``torch.Tensor`` subclass would clash with
its ``data`` attribute (``torch.Tensor.data``), make every part access go through the
dispatcher, and tie the container to torch's subclass rules. torch honours
``__torch_function__`` on ANY object passed to a torch function, so ``F.linear(x, w)``,
``torch.matmul(x, w.t())`` and ``x @ w.t()`` reach `torch_function` with nothing else changed;
every other torch function raises a TypeError naming what is supported (a silent dequantize
would hide a 4x memory cost). In compiled code use `Linear` (its forward calls the ops on the
buffers); the protocol is for eager code holding NVFP4Tensors.

Non-finite activations: W4A4 forwards quantize with ``check_finite=False`` (no host sync), so
on CUDA a NaN/Inf activation gives an unspecified output (not necessarily NaN: the global scale
from amax is non-finite); set ``Linear.check_finite = True`` to raise instead (one host sync per
call, not capturable in a CUDA graph). CPU forwards always raise ValueError. W4A16 forwards pass
NaN/Inf through the products as any GEMM does.

Autograd: inference only. A forward whose input requires grad while grad mode is on raises
RuntimeError (a graph silently cut at the layer would train the rest of a model wrongly); run
under ``torch.no_grad()`` / ``torch.inference_mode()`` or detach the input. The weights are
buffers (never trained) and quantize detaches its input, so no graph is kept alive through a
global scale.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tk_cute.layouts.nvfp4_scales import blocked_shape

from .quantize import quantize
from .tensor import NVFP4Tensor, TransposedNVFP4, codes_storage, describe, padded_codes

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
    constructor makes a zero-weight module of the right shapes to load a state dict into.

    Args:
        in_features: K, a multiple of 16.
        out_features: N.
        bias: whether the module has a bias.
        activations: "bf16" (W4A16: x must be bfloat16; output bfloat16) or "nvfp4" (W4A4: x
            float32 / bfloat16 / float16, quantized per call; output in x's dtype).
        device: where the buffers live.
        dtype: the bias dtype (the model's dtype; default bfloat16).

    Attributes:
        check_finite: W4A4 only: quantize the activations with a NaN/Inf check (one host sync
            per call on CUDA). Default False.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 activations: str = "bf16", device=None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if in_features < 16 or in_features % 16 or out_features < 1:
            raise ValueError(f"NVFP4 Linear needs in_features a positive multiple of 16 and "
                             f"out_features >= 1, got {in_features}, {out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.activations = _check_activations(activations)
        self.check_finite = False
        u8 = {"dtype": torch.uint8, "device": device}
        self.register_buffer("weight_data",
                             codes_storage((out_features, in_features), device).zero_())
        self.register_buffer("weight_scales",
                             torch.zeros(blocked_shape(out_features, in_features), **u8))
        self.register_buffer("weight_global_scale",
                             torch.ones((), dtype=torch.float32, device=device))
        bias_t = torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        self.register_buffer("bias", bias_t)

    @classmethod
    def from_nvfp4(cls, weight: NVFP4Tensor, bias: torch.Tensor | None = None, *,
                   activations: str = "bf16") -> Linear:
        """A module holding `weight` (a 2-D (N, K) NVFP4Tensor; its parts are used, not
        copied) and an optional bias (N,)."""
        if not isinstance(weight, NVFP4Tensor) or weight.ndim != 2:
            raise TypeError(f"Linear.from_nvfp4 takes a 2-D NVFP4Tensor, got {describe(weight)} "
                            f"of shape {tuple(getattr(weight, 'shape', ()))}")
        _ue4m3_parts(weight, "Linear.from_nvfp4")
        N, K = weight.shape
        dtype = bias.dtype if bias is not None else torch.bfloat16
        mod = cls(K, N, bias is not None, activations=activations, device="meta", dtype=dtype)
        mod.weight_data, mod.weight_scales = weight.data, weight.scales
        mod.weight_global_scale = weight.global_scale
        if bias is not None:
            if bias.shape != (N,) or bias.device != weight.device:
                raise ValueError(f"bias must be ({N},) on {weight.device}, got "
                                 f"{tuple(bias.shape)} on {bias.device}")
            mod.bias = bias.detach()
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
        m.bias)`` equals ``m(x)`` for W4A16)."""
        return NVFP4Tensor.trusted(self.weight_data, self.weight_scales,
                                   self.weight_global_scale, (self.out_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _no_grad_input(x, "tk_cute.nvfp4.Linear")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input's last dim is {x.shape[-1]}, this Linear takes "
                             f"in_features={self.in_features}")
        w = (self.weight_data, self.weight_scales, self.weight_global_scale)
        if self.activations == "nvfp4":
            a = _quantize(x.reshape(-1, self.in_features), self.check_finite)
            y = _gemm(a, w, x.dtype).reshape(*x.shape[:-1], self.out_features)
        else:
            if x.dtype != torch.bfloat16:
                raise TypeError(f"W4A16 Linear takes bfloat16 activations, got {x.dtype} (cast "
                                f"the model with .to(torch.bfloat16), or use activations='nvfp4')")
            y = _gemm(x, w, torch.bfloat16)
        return y if self.bias is None else y + self.bias

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) / .half() cast every floating buffer: the decode scale must stay
        # float32 (the kernels read it so), so it only follows the device.
        # A move copies the codes contiguous, dropping the 16-byte row padding of K % 32 != 0
        # (`tensor.padded_codes`): pad them again here, once, not in every forward.
        gs = self.weight_global_scale
        out = super()._apply(fn, recurse)
        moved = self.weight_global_scale
        if moved.dtype != torch.float32:
            self.weight_global_scale = gs.to(moved.device)
        self.weight_data = padded_codes(self.weight_data, self.in_features)
        return out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activations={self.activations!r}")


def quantize_(model: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None = None, *,
              activations: str = "bf16") -> nn.Module:
    """Swap every matching ``nn.Linear`` of `model` for an NVFP4 `Linear`, in place.

    Args:
        model: the model (not itself an ``nn.Linear``: use `Linear.from_linear`).
        filter_fn: ``filter_fn(module, fqn) -> bool`` selects modules to swap (default: every
            ``nn.Linear``); it must select only ``nn.Linear`` modules. A module shared by
            several parents is quantized once and stays shared. Exclude layers whose parent
            reads ``.weight`` as a dense tensor (``nn.MultiheadAttention.out_proj``).
        activations: "bf16" (W4A16) or "nvfp4" (W4A4), see `Linear`.

    Returns:
        `model`.

    Raises:
        TypeError: `model` is an ``nn.Linear`` or not a module, or `filter_fn` selected a
            module that is not an ``nn.Linear``.
        ValueError: a selected Linear's in_features is not a multiple of 16 (its name is in the
            message: exclude it with `filter_fn`), or `activations` is unknown.
    """
    if not isinstance(model, nn.Module) or isinstance(model, nn.Linear):
        raise TypeError(f"quantize_ swaps the nn.Linear children of a model; got "
                        f"{type(model).__name__} (for one layer use Linear.from_linear)")
    _check_activations(activations)
    done: dict[int, Linear] = {}
    for name, parent in list(model.named_modules()):
        # _modules, not named_children: that skips a second slot holding a module already seen
        for child_name, child in list(parent._modules.items()):
            if child is None:
                continue
            fqn = f"{name}.{child_name}" if name else child_name
            chosen = isinstance(child, nn.Linear) if filter_fn is None else filter_fn(child, fqn)
            if not chosen:
                continue
            if id(child) not in done:
                if not isinstance(child, nn.Linear):
                    raise TypeError(f"quantize_: filter_fn selected {fqn!r}, a "
                                    f"{type(child).__name__}; only nn.Linear modules are swapped")
                if child.in_features % 16:
                    raise ValueError(f"quantize_: {fqn!r} has in_features={child.in_features}, "
                                     f"not a multiple of 16; exclude it with filter_fn")
                done[id(child)] = Linear.from_linear(child, activations)
            setattr(parent, child_name, done[id(child)])
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


def _quantize(x: torch.Tensor, check_finite: bool) -> tuple:
    """`quantize(x, check_finite=...)` as its three parts."""
    if torch.compiler.is_compiling():
        return torch.ops.tk_cute.nvfp4_quantize(x, None, check_finite)
    q = quantize(x, check_finite=check_finite)
    return q.data, q.scales, q.global_scale


def _gemm(a, w: tuple, out_dtype: torch.dtype) -> torch.Tensor:
    """`gemm(a, w, out_dtype)` for weight parts `w` and a bfloat16 `a` (W4A16) or the three
    parts of NVFP4 activations (W4A4)."""
    a_parts = a if isinstance(a, tuple) else (a, None, None)
    if torch.compiler.is_compiling():
        return torch.ops.tk_cute.nvfp4_gemm(*a_parts, *w, out_dtype)
    from .gemm import gemm

    def tensor(data, scales, gs):  # parts of a valid UE4M3 tensor (the op's contract too)
        return NVFP4Tensor.trusted(data, scales, gs, (*data.shape[:-1], 2 * data.shape[-1]))

    return gemm(tensor(*a) if isinstance(a, tuple) else a, tensor(*w), out_dtype)


def linear(x, w: NVFP4Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w^T (+ bias)`` as ``F.linear``: W4A16 for a bfloat16 tensor x (..., K), W4A4 for
    an NVFP4Tensor x (M, K) (output bfloat16). Runs the custom ops (`tk_cute.nvfp4.ops`) under
    torch.compile, `tk_cute.nvfp4.gemm` directly in eager code."""
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
    a = (x.data, x.scales, x.global_scale) if isinstance(x, NVFP4Tensor) else x
    y = _gemm(a, (w.data, w.scales, w.global_scale), torch.bfloat16)
    return y if bias is None else y + bias


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
