"""NVFP4: FP4 (E2M1) elements, UE4M3 scales per 16 K elements, a float32 per-tensor scale.

The public layer of tk_cute's NVFP4 GEMMs: the format (`format`), the tensor container
(`tensor`), the bit-exact quantization recipe every kernel must reproduce (`quantize`, whose
docstring is the contract), the blocked scale layout (one definition, in
``tk_cute.layouts.nvfp4_scales``), the exact references (`reference`) and the one GEMM dispatch
(`gemm`, `plan`; its rules in `heuristics`, its argument checks in `validate`, the kernels'
torch launches in `launch` and `dispatch_sm100`). Kernels live in ``tk_cute.kernels`` and never
import this package.
"""

from tk_cute.layouts.nvfp4_scales import (
    blocked_offset,
    blocked_shape,
    from_blocked,
    to_blocked,
)

from .format import (
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    E4M3_VALUES,
    e2m1_decode,
    e2m1_encode_rne,
    e4m3_decode,
    e4m3_encode_rne,
    pack_fp4,
    unpack_fp4,
)
from .gemm import Plan, gemm, plan
from .reference import gemm_reference, w4a16_reference
from .quantize import quantize, quantize_reference
from .tensor import NVFP4Tensor, dequantize

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "E4M3_VALUES",
    "NVFP4Tensor",
    "Plan",
    "blocked_offset",
    "blocked_shape",
    "dequantize",
    "e2m1_decode",
    "e2m1_encode_rne",
    "e4m3_decode",
    "e4m3_encode_rne",
    "from_blocked",
    "gemm",
    "gemm_reference",
    "pack_fp4",
    "plan",
    "quantize",
    "quantize_reference",
    "to_blocked",
    "unpack_fp4",
    "w4a16_reference",
]
