"""NVFP4: FP4 (E2M1) elements, UE4M3 scales per 16 K elements (UE5M3 on Rubin: `SCALE_FORMATS`),
a float32 per-tensor scale.

The public layer of tk_cute's NVFP4 GEMMs: the format (`format`), the tensor container
(`tensor`), the bit-exact quantization recipe every kernel must reproduce (`quantize`, whose
docstring is the contract), the blocked scale layout (one definition, in
``tk_cute.layouts.nvfp4_scales``), the exact references (`reference`) and the one GEMM dispatch
(`gemm`, `plan`; its rules in `tk_cute.tuning`, its argument checks in `validate`, the kernels'
torch launches in `launch` and `dispatch_sm100`). Kernels live in ``tk_cute.kernels`` and never
import this package.

In torch models (docs/torch.md): `Linear` and `quantize_` (`modules`), the custom ops
``torch.ops.tk_cute.{nvfp4_quantize, nvfp4_gemm, gemm}`` that `torch.compile` traces (`ops`,
registered on import), conversions to and from torchao and FlashInfer (`interop`), and NVFP4
checkpoints in ModelOpt's and compressed-tensors' formats (`checkpoint`).
"""

from tk_cute.layouts.nvfp4_scales import (
    blocked_offset,
    blocked_shape,
    from_blocked,
    to_blocked,
)

from . import ops  # noqa: F401 - registers torch.ops.tk_cute.* (the custom ops)
from .checkpoint import (
    LoadReport,
    checkpoint_state_dict,
    from_compressed_tensors,
    from_modelopt,
    load_checkpoint,
    save_checkpoint,
    to_compressed_tensors,
    to_modelopt,
)
from .format import (
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    E4M3_VALUES,
    SCALE_FORMATS,
    UE5M3_MAX,
    UE5M3_VALUES,
    e2m1_decode,
    e2m1_encode_rne,
    e4m3_decode,
    e4m3_encode_rne,
    pack_fp4,
    ue5m3_decode,
    ue5m3_encode_rne,
    unpack_fp4,
)
from .gemm import Plan, gemm, plan
from .interop import FlashInferNVFP4, from_flashinfer, from_torchao, to_flashinfer, to_torchao
from .modules import Linear, QuantizePlan, linear, quantize_, quantize_plan
from .quantize import quantize, quantize_reference
from .reference import gemm_reference, w4a16_reference
from .shard import shard, unshard
from .tensor import NVFP4Tensor, TransposedNVFP4, dequantize

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "E4M3_VALUES",
    "FlashInferNVFP4",
    "Linear",
    "LoadReport",
    "NVFP4Tensor",
    "Plan",
    "QuantizePlan",
    "SCALE_FORMATS",
    "TransposedNVFP4",
    "UE5M3_MAX",
    "UE5M3_VALUES",
    "blocked_offset",
    "blocked_shape",
    "checkpoint_state_dict",
    "dequantize",
    "e2m1_decode",
    "e2m1_encode_rne",
    "e4m3_decode",
    "e4m3_encode_rne",
    "from_blocked",
    "from_compressed_tensors",
    "from_flashinfer",
    "from_modelopt",
    "from_torchao",
    "gemm",
    "gemm_reference",
    "linear",
    "load_checkpoint",
    "pack_fp4",
    "plan",
    "quantize",
    "quantize_",
    "quantize_plan",
    "quantize_reference",
    "save_checkpoint",
    "shard",
    "to_blocked",
    "to_compressed_tensors",
    "to_flashinfer",
    "to_modelopt",
    "to_torchao",
    "ue5m3_decode",
    "ue5m3_encode_rne",
    "unpack_fp4",
    "unshard",
    "w4a16_reference",
]
