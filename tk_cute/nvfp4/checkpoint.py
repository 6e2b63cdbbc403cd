"""NVFP4 checkpoints as published: ModelOpt's Hugging Face format and compressed-tensors'
``nvfp4-pack-quantized`` format, loaded into `tk_cute.nvfp4.Linear` layers of a model built
from its config, and saved back to either.

Both formats store, per quantized ``nn.Linear`` (prefix ``p``), the same three things tk_cute
does, in other forms; the conversions move or view bytes and never requantize:

================  =======================================  =====================================
part              ModelOpt (``hf_quant_config.json``)       compressed-tensors (``config.json``)
================  =======================================  =====================================
codes             ``p.weight`` uint8 (N, K/2)              ``p.weight_packed`` uint8 (N, K/2)
block scales      ``p.weight_scale`` float8_e4m3fn          ``p.weight_scale`` float8_e4m3fn
                  (N, K/16), ROW order                      (N, K/16), ROW order
per-tensor scale  ``p.weight_scale_2`` float32 0-dim:       ``p.weight_global_scale`` float32
                  the DECODE scale ``amax / 2688``          (1,): the ENCODE scale ``2688 / amax``
activations       ``p.input_scale`` float32 0-dim, DECODE   ``p.input_global_scale`` (1,), ENCODE
                  (``amax / 2688``; NVFP4 W4A4 only)        (``NVFP4`` scheme only)
================  =======================================  =====================================

Codes: element 2i in the LOW nibble, 2i+1 in the high one, E2M1 code = sign bit 3 and
magnitude index 0..7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6: what tk_cute stores, so codes are copied.
Block scales: tk_cute keeps the 128x4 blocked layout the kernels read (`tk_cute.layouts.
nvfp4_scales`); both formats store the logical (N, K/16) matrix in row order, so loading runs
`to_blocked` and saving `from_blocked` (bytes unchanged). Decode scales: ModelOpt's is ours, bit
for bit. compressed-tensors' is the encode scale g: loading takes ``fl32(1 / g)`` (the correctly
rounded reciprocal, closest to the ``x / g`` compressed-tensors computes), saving writes
``fl32(1 / d)``. A float32 reciprocal does not always round-trip: about 17% of random scales
come back one ulp off after compressed-tensors -> tk_cute -> compressed-tensors (measured), which
changes every decoded value of that tensor by a relative 2^-23 or less; ModelOpt round trips are
bit-exact.

Where each fact comes from:

- compressed-tensors 0.20.1 (installed from PyPI; its code read and run by the tests, which
  write NVFP4 checkpoints with it and load them with ``transformers`` 5.25):
  ``compressors/nvfp4/helpers.py`` (``pack_fp4_to_uint8``: ``indices[:, 0] | indices[:, 1] << 4``,
  sign bit 3; ``unpack_fp4_from_uint8``), ``compressors/nvfp4/base.py`` (``weight_packed``,
  ``weight_scale`` cast to float8_e4m3fn, ``weight_global_scale``, ``input_global_scale`` for
  static activations), ``quantization/lifecycle/forward_helpers.py`` (``_dequantize``:
  ``x_q * (scale / global_scale)``: the global scale divides, so it is the encode scale) and
  ``quantization/utils/helpers.py`` (``generate_gparam``: ``448 * 6 / amax``).
- ModelOpt (NVIDIA Model-Optimizer; not installable here: its library was not run, its source
  was read): ``modelopt/torch/quantization/qtensor/nvfp4_tensor.py`` (``NVFP4QTensor``:
  ``weights_scaling_factor_2 = amax / (6 * 448)``; per-block ``weight_scale`` float8_e4m3fn of
  shape ``(*weight.shape[:-1], K / 16)``; packing ``q[..., 1::2] << 4 | q[..., 0::2]``;
  dequantize ``e2m1 * (scale * scale_2)``; ``input_scale = amax / (6 * 448)``),
  ``modelopt/torch/export/quant_utils.py`` (``quant_algo`` "NVFP4" / "W4A16_NVFP4",
  ``group_size``, ``exclude_modules``), and vLLM's ModelOpt loader
  (``vllm/model_executor/layers/quantization/modelopt.py``, ``ModelOptNvFp4LinearMethod``:
  weight uint8 [N, K/2], weight_scale FP8-E4M3 [N, K/16], weight_scale_2 and input_scale
  float32 scalars, ``alpha = input_scale * weight_scale_2``: both decode scales). The tests check
  tk_cute against a transcription of those formulas on synthetic state dicts.

Static activation scales are carried (`Linear`'s ``input_global_scale``, as a decode scale) so a
loaded checkpoint saves back whole; tk_cute's W4A4 forwards compute the activations' global scale
per call instead (so outputs differ from a runtime that uses the static scale, e.g. vLLM, by the
choice of global scale only).

Values: every weight is checked once as it is loaded (the `NVFP4Tensor` constructor: scale bytes
that decode to NaN or have the sign bit set, decode scales that are not finite, positive and at
least 2^-126; an encode scale of 0, inf or NaN is refused before it is inverted); ``trusted=True``
skips those checks (not the shape and dtype ones).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from tk_cute.layouts.nvfp4_scales import to_blocked

from .modules import Linear
from .tensor import SF_VEC, NVFP4Tensor, normalize_parts

__all__ = [
    "FORMATS",
    "LoadReport",
    "checkpoint_format",
    "checkpoint_state_dict",
    "from_compressed_tensors",
    "from_modelopt",
    "load_checkpoint",
    "save_checkpoint",
    "to_compressed_tensors",
    "to_modelopt",
]

MODELOPT, COMPRESSED_TENSORS = "modelopt", "compressed-tensors"
FORMATS = (MODELOPT, COMPRESSED_TENSORS)
CT_FORMAT = "nvfp4-pack-quantized"
# per format: (codes, block scales, weight global scale, input global scale) key suffixes
_KEYS = {
    MODELOPT: ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    COMPRESSED_TENSORS: ("weight_packed", "weight_scale", "weight_global_scale",
                         "input_global_scale"),
}
_MARKER = {MODELOPT: "weight_scale_2", COMPRESSED_TENSORS: "weight_packed"}
_EXACT_TO_F32 = (torch.float32, torch.bfloat16, torch.float16)  # widen to float32 exactly


# ---------------------------------------------------------------- one tensor


def _codes(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype == torch.float4_e2m1fn_x2 or t.dtype == torch.int8:
        t = t.view(torch.uint8)
    if t.dtype != torch.uint8 or t.dim() != 2:
        raise ValueError(f"{name} must be packed FP4 codes, uint8 (N, K / 2), got {t.dtype} "
                         f"{tuple(t.shape)}")
    return t


def _row_scales(t, N: int, K: int, name: str) -> torch.Tensor:
    """Row-order (N, K / 16) E4M3 scales as uint8 bytes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float8_e4m3fn, torch.uint8) or tuple(t.shape) != (N, K // SF_VEC):
        raise ValueError(f"{name} must be float8_e4m3fn block scales in row order, "
                         f"({N}, {K // SF_VEC}) for codes of {N} x {K}, got {t.dtype} "
                         f"{tuple(t.shape)}")
    return t.view(torch.uint8)


def _scalar(t, name: str) -> torch.Tensor:
    """A one-element scale as a float32 0-dim tensor (float32, bfloat16 or float16: exact)."""
    t = torch.as_tensor(t)
    if t.numel() != 1 or t.dtype not in _EXACT_TO_F32:
        raise ValueError(f"{name} must be one float32 value, got {t.dtype} {tuple(t.shape)}")
    return t.detach().reshape(()).to(torch.float32)


def _decode_from_encode(enc: torch.Tensor, name: str, trusted: bool) -> torch.Tensor:
    """compressed-tensors' encode scale g -> our decode scale fl32(1 / g), g checked first (its
    reciprocal would turn inf into 0 and hide the checkpoint's own value)."""
    if not trusted and enc.device.type != "meta":
        g = float(enc)
        if not (0.0 < g <= 2.0**126):  # also NaN; 1 / g must be >= 2^-126 (F32_MIN_NORMAL)
            raise ValueError(f"{name} (compressed-tensors' ENCODE scale, 448 * 6 / amax) must be "
                             f"positive, finite and at most 2**126, got {g!r}")
    return torch.div(torch.ones_like(enc), enc)


def _encode_from_decode(dec: torch.Tensor) -> torch.Tensor:
    return torch.div(torch.ones_like(dec), dec).reshape(1)


def _tensor(data, row_scales, gs, trusted: bool) -> NVFP4Tensor:
    N, K = data.shape[0], 2 * data.shape[1]
    parts = (data.contiguous(), to_blocked(row_scales.contiguous()), gs)
    if trusted:
        return NVFP4Tensor.trusted(*normalize_parts(*parts, (N, K)))
    return NVFP4Tensor(*parts, (N, K))


def from_modelopt(weight, weight_scale, weight_scale_2, *, trusted: bool = False) -> NVFP4Tensor:
    """A ModelOpt NVFP4 weight (module docstring) as an NVFP4Tensor: the codes copied, the
    row-order scales blocked, ``weight_scale_2`` taken as the decode scale it is.

    Raises:
        TypeError, ValueError: parts of the wrong type, dtype or shape; values the NVFP4Tensor
            constructor rejects (unless `trusted`).
    """
    data = _codes(weight, "weight")
    N, K = data.shape[0], 2 * data.shape[1]
    return _tensor(data, _row_scales(weight_scale, N, K, "weight_scale"),
                   _scalar(weight_scale_2, "weight_scale_2"), trusted)


def to_modelopt(q: NVFP4Tensor) -> dict[str, torch.Tensor]:
    """`q` (2-D, UE4M3) as ModelOpt's ``weight`` / ``weight_scale`` / ``weight_scale_2``."""
    _check_2d(q, "to_modelopt")
    return {"weight": q.data.contiguous(),
            "weight_scale": q.scales_logical().contiguous().view(torch.float8_e4m3fn),
            "weight_scale_2": q.global_scale.detach().clone()}


def from_compressed_tensors(weight_packed, weight_scale, weight_global_scale, *,
                            trusted: bool = False) -> NVFP4Tensor:
    """A compressed-tensors ``nvfp4-pack-quantized`` weight (module docstring) as an
    NVFP4Tensor: the codes copied, the row-order scales blocked, the decode scale
    ``fl32(1 / weight_global_scale)`` (the checkpoint stores the ENCODE scale).

    Raises:
        TypeError, ValueError: as `from_modelopt`; an encode scale that is not positive,
            finite and at most 2^126 (unless `trusted`).
    """
    data = _codes(weight_packed, "weight_packed")
    N, K = data.shape[0], 2 * data.shape[1]
    gs = _decode_from_encode(_scalar(weight_global_scale, "weight_global_scale"),
                             "weight_global_scale", trusted)
    return _tensor(data, _row_scales(weight_scale, N, K, "weight_scale"), gs, trusted)


def to_compressed_tensors(q: NVFP4Tensor) -> dict[str, torch.Tensor]:
    """`q` (2-D, UE4M3) as compressed-tensors' ``weight_packed`` / ``weight_scale`` /
    ``weight_global_scale`` (the encode scale ``fl32(1 / decode)``, shape (1,))."""
    _check_2d(q, "to_compressed_tensors")
    return {"weight_packed": q.data.contiguous(),
            "weight_scale": q.scales_logical().contiguous().view(torch.float8_e4m3fn),
            "weight_global_scale": _encode_from_decode(q.global_scale.detach())}


def _check_2d(q, who: str) -> None:
    if not isinstance(q, NVFP4Tensor) or q.ndim != 2 or q.scale_format != "ue4m3":
        raise TypeError(f"{who} takes a 2-D UE4M3 NVFP4Tensor (a Linear's weight), got "
                        f"{getattr(q, 'shape', type(q).__name__)}")


# ---------------------------------------------------------------- a model


@dataclass
class LoadReport:
    """What `load_checkpoint` did.

    Attributes:
        format: "modelopt" or "compressed-tensors" (None: the checkpoint had no NVFP4 weight).
        quantized: the modules now NVFP4 `Linear` layers, in checkpoint order.
        input_scales: those among them that carry a static activation scale.
        missing, unexpected: keys of the model the checkpoint lacked / keys of the checkpoint
            the model has no place for (empty unless ``strict=False``).
    """

    format: str | None
    quantized: list[str] = field(default_factory=list)
    input_scales: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def checkpoint_format(keys) -> str | None:
    """The NVFP4 format of a state dict's keys: "modelopt" (``*.weight_scale_2``),
    "compressed-tensors" (``*.weight_packed``) or None (no NVFP4 weight). ValueError for both."""
    found = {fmt for fmt, marker in _MARKER.items() for k in keys if k.endswith("." + marker)}
    if len(found) > 1:
        raise ValueError("the checkpoint has both ModelOpt (*.weight_scale_2) and "
                         "compressed-tensors (*.weight_packed) NVFP4 weights")
    return found.pop() if found else None


def _read(checkpoint) -> tuple[dict[str, torch.Tensor], dict | None]:
    """(state dict, the quantization config found beside it or None)."""
    if isinstance(checkpoint, Mapping):
        return dict(checkpoint), None
    path = os.fspath(checkpoint)
    from safetensors.torch import load_file

    if os.path.isfile(path):
        return load_file(path), None
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    sd = {}
    for f in files:
        sd.update(load_file(os.path.join(path, f)))
    qcfg = None
    cfg_file = os.path.join(path, "config.json")
    if os.path.exists(cfg_file):
        with open(cfg_file) as f:
            qcfg = json.load(f).get("quantization_config")
    hf_quant = os.path.join(path, "hf_quant_config.json")
    if qcfg is None and os.path.exists(hf_quant):
        with open(hf_quant) as f:
            qcfg = json.load(f)
    return sd, qcfg


def _check_config(qcfg: dict | None, fmt: str) -> None:
    """Refuse a config that says the NVFP4-looking tensors are something else."""
    if not qcfg:
        return
    if fmt == COMPRESSED_TENSORS:
        groups = qcfg.get("config_groups") or {}
        formats = {g.get("format") or qcfg.get("format") for g in groups.values()} or {
            qcfg.get("format")}
        if formats - {CT_FORMAT}:
            raise ValueError(f"compressed-tensors config formats {sorted(map(str, formats))}: "
                             f"tk_cute loads {CT_FORMAT!r} only")
        for name, g in groups.items():
            w = g.get("weights") or {}
            if (w.get("num_bits"), w.get("type"), w.get("group_size")) != (4, "float", 16):
                raise ValueError(f"compressed-tensors config group {name!r} is not NVFP4 "
                                 f"(num_bits 4, type float, group_size 16): {w}")
    else:
        algo = str((qcfg.get("quantization") or qcfg).get("quant_algo", "")).upper()
        if algo not in ("NVFP4", "W4A16_NVFP4"):
            raise ValueError(f"ModelOpt quant_algo {algo!r}: tk_cute loads NVFP4 and "
                             f"W4A16_NVFP4 checkpoints")


def load_checkpoint(model: nn.Module, checkpoint, *, format: str | None = None,
                    activations: str = "bf16", trusted: bool = False,
                    strict: bool = True) -> LoadReport:
    """Load an NVFP4 checkpoint into `model`, swapping each quantized ``nn.Linear`` for an
    NVFP4 `Linear` built from the checkpoint's tensors, and loading every other tensor (norms,
    embeddings, layers left in high precision) as ``load_state_dict`` does.

    Args:
        model: built from the checkpoint's config (e.g. ``AutoModelForCausalLM.from_config``),
            in the dtype to run (bfloat16 for W4A16 kernels; see `Linear` for others). Its
            modules at the checkpoint's quantized prefixes must be ``nn.Linear`` (or NVFP4
            `Linear`) of the checkpoint's shapes.
        checkpoint: a state dict, a ``.safetensors`` file, or a directory of them (its
            ``config.json`` / ``hf_quant_config.json`` quantization config, if any, is checked
            to say NVFP4).
        format: "modelopt" or "compressed-tensors"; default: from the keys
            (`checkpoint_format`).
        activations: the `Linear` mode, "bf16" (W4A16) or "nvfp4" (W4A4).
        trusted: skip the value checks of the NVFP4 tensors (module docstring).
        strict: raise if the model has keys the checkpoint lacks or the checkpoint has keys the
            model does not (tied weights, e.g. an lm_head sharing the embedding, count as
            loaded).

    Returns:
        A `LoadReport`.

    Raises:
        ValueError: a bad NVFP4 tensor (naming the module), a quantized prefix that is not an
            ``nn.Linear`` of the right shape, an unknown format.
        RuntimeError: ``strict`` and missing or unexpected keys.
    """
    sd, qcfg = _read(checkpoint)
    fmt = format if format is not None else checkpoint_format(sd)
    report = LoadReport(fmt)
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
        _check_config(qcfg, fmt)
        codes_key, scale_key, gs_key, in_key = _KEYS[fmt]
        marker = "." + _MARKER[fmt]
        prefixes = [k[:-len(marker)] for k in sd if k.endswith(marker)]
        swapped: dict[int, Linear] = {}
        for prefix in prefixes:
            parts = [sd.pop(f"{prefix}.{k}", None) for k in (codes_key, scale_key, gs_key)]
            if any(p is None for p in parts):
                raise ValueError(f"{prefix}: an NVFP4 {fmt} weight needs {prefix}.{codes_key}, "
                                 f".{scale_key} and .{gs_key}")
            in_scale = sd.pop(f"{prefix}.{in_key}", None)
            bias = sd.pop(f"{prefix}.bias", None)
            try:
                convert = from_modelopt if fmt == MODELOPT else from_compressed_tensors
                w = convert(*parts, trusted=trusted)
                if in_scale is not None:
                    in_scale = _scalar(in_scale, in_key)
                    if fmt == COMPRESSED_TENSORS:
                        in_scale = _decode_from_encode(in_scale, in_key, trusted)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{prefix}: {e}") from None
            old = model.get_submodule(prefix)
            if not isinstance(old, (nn.Linear, Linear)) or (
                    old.out_features, old.in_features) != tuple(w.shape):
                raise ValueError(f"{prefix}: the checkpoint holds an NVFP4 {tuple(w.shape)} "
                                 f"(N, K) weight; the model has {old}")
            has_bias = (old.bias is not None)
            if has_bias != (bias is not None):
                raise ValueError(f"{prefix}: the model's layer has {'a' if has_bias else 'no'} "
                                 f"bias, the checkpoint {'none' if has_bias else 'one'}")
            dev = _device_of(old)
            if bias is not None:
                bias = bias.to(device=dev, dtype=old.bias.dtype)
            new = swapped.get(id(old))
            if new is None:
                new = Linear.from_nvfp4(w.to(dev), bias, activations=activations,
                                        input_global_scale=None if in_scale is None
                                        else in_scale.to(dev), trusted=trusted)
                new.trusted = False  # later load_state_dict calls check again
                swapped[id(old)] = new
            parent_name, _, child = prefix.rpartition(".")
            setattr(model.get_submodule(parent_name), child, new)
            report.quantized.append(prefix)
            if in_scale is not None:
                report.input_scales.append(prefix)
    # everything else, as load_state_dict does (tied parameters count as loaded)
    own = set(report.quantized)
    result = model.load_state_dict(sd, strict=False)
    loaded_ids = {id(t) for k, t in model.state_dict(keep_vars=True).items() if k in sd}
    current = model.state_dict(keep_vars=True)
    report.missing = [k for k in result.missing_keys
                      if k.rpartition(".")[0] not in own and id(current[k]) not in loaded_ids]
    report.unexpected = list(result.unexpected_keys)
    if strict and (report.missing or report.unexpected):
        raise RuntimeError(f"load_checkpoint: missing keys {report.missing}, unexpected keys "
                           f"{report.unexpected} (strict=False to load anyway)")
    return report


def _device_of(module: nn.Module) -> torch.device:
    for t in list(module.parameters()) + list(module.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def checkpoint_state_dict(model: nn.Module, format: str) -> dict[str, torch.Tensor]:
    """`model`'s state dict with each NVFP4 `Linear` in `format`'s names and forms (module
    docstring) and everything else as ``state_dict()`` has it (tensors that share storage,
    e.g. tied embeddings, kept once, under their first name)."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    codes_key, in_key = _KEYS[format][0], _KEYS[format][3]
    linears = {name: m for name, m in model.named_modules(remove_duplicate=False)
               if isinstance(m, Linear)}
    ours = {f"{n}.{b}" if n else b for n, m in linears.items() for b, _ in
            m.named_buffers(recurse=False)}
    out, seen = {}, set()
    for k, v in model.state_dict().items():
        if k in ours:
            continue
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if v.device.type != "meta" and key in seen:
            continue
        seen.add(key)
        out[k] = v
    for name, m in linears.items():
        conv = to_modelopt(m.weight) if format == MODELOPT else to_compressed_tensors(m.weight)
        prefix = f"{name}." if name else ""
        out.update({prefix + {"weight": codes_key, "weight_packed": codes_key}.get(k, k): v
                    for k, v in conv.items()})
        if m.bias is not None:
            out[prefix + "bias"] = m.bias
        if m.input_global_scale is not None:
            gs = m.input_global_scale.detach()
            out[prefix + in_key] = gs.clone() if format == MODELOPT else _encode_from_decode(gs)
    return out


def _quantization_config(model: nn.Module, format: str) -> tuple[dict, dict | None]:
    """(config.json's quantization_config, hf_quant_config.json's content or None)."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if not linears:
        raise ValueError("the model has no NVFP4 Linear to save (quantize it first)")
    with_scale = sum(m.input_global_scale is not None for m in linears)
    if with_scale not in (0, len(linears)):
        raise ValueError(f"{with_scale} of {len(linears)} NVFP4 layers carry a static input "
                         f"scale: both formats describe one activation scheme for all layers")
    w4a4 = with_scale > 0
    dense = sorted(n for n, m in model.named_modules() if isinstance(m, nn.Linear))
    from tk_cute import __version__ as version

    producer = {"name": "tk_cute", "version": version}
    if format == MODELOPT:
        algo = "NVFP4" if w4a4 else "W4A16_NVFP4"
        hf_quant = {"producer": producer,
                    "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None,
                                     "group_size": SF_VEC, "exclude_modules": dense}}
        return ({"quant_method": "modelopt", "quant_algo": algo, "kv_cache_quant_algo": None,
                 "group_size": SF_VEC, "ignore": dense, "producer": producer}, hf_quant)
    args = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": SF_VEC,
            "strategy": "tensor_group", "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}
    group = {"targets": ["Linear"], "weights": args, "output_activations": None,
             "format": CT_FORMAT,
             "input_activations": dict(args, dynamic="local", observer="static_minmax")
             if w4a4 else None}
    return ({"quant_method": "compressed-tensors", "format": CT_FORMAT,
             "quantization_status": "compressed", "config_groups": {"group_0": group},
             "ignore": dense, "kv_cache_scheme": None, "sparsity_config": {},
             "transform_config": {}, "global_compression_ratio": None,
             "producer": producer}, None)


def save_checkpoint(model: nn.Module, path, format: str, *, config=None) -> None:
    """Write `model` (its NVFP4 `Linear` layers and everything else) as a Hugging Face style
    checkpoint directory in `format`: ``model.safetensors`` (one file, `checkpoint_state_dict`),
    ``config.json`` (`config`, default ``model.config``, a ``transformers`` config or a dict,
    with the format's ``quantization_config``; skipped when there is no config) and, for
    ModelOpt, ``hf_quant_config.json``. The dense ``nn.Linear`` layers left (e.g. lm_head) are
    listed as ignored / excluded. ``transformers`` (with ``compressed-tensors``) loads the
    compressed-tensors result; `load_checkpoint` loads both."""
    from safetensors.torch import save_file

    qcfg, hf_quant = _quantization_config(model, format)
    sd = {k: v.detach().contiguous().cpu() for k, v in checkpoint_state_dict(model, format).items()}
    os.makedirs(path, exist_ok=True)
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    config = config if config is not None else getattr(model, "config", None)
    if config is not None:
        cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
        cfg["quantization_config"] = qcfg
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True, default=str)
    if hf_quant is not None:
        with open(os.path.join(path, "hf_quant_config.json"), "w") as f:
            json.dump(hf_quant, f, indent=2)

