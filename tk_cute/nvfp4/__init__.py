"""NVFP4: FP4 (E2M1) elements, UE4M3 scales per 16 K elements, a float32 per-tensor scale.

The host side of tk_cute's NVFP4 GEMMs: the format (`format`), the tensor container (`tensor`),
the bit-exact quantization recipe every kernel must reproduce (`quantize`, whose docstring is the
contract), the blocked scale layout (one definition, in ``tk_cute.layouts.nvfp4_scales``) and the
GEMM semantics with an exact reference (`gemm`). Everything here runs on CPU or CUDA tensors.
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
from .gemm import gemm, gemm_reference, w4a16_reference
from .quantize import quantize, quantize_reference
from .tensor import NVFP4Tensor, dequantize

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "E4M3_VALUES",
    "NVFP4Tensor",
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
    "quantize",
    "quantize_reference",
    "to_blocked",
    "unpack_fp4",
    "w4a16_reference",
]
