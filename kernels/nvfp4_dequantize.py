# SPDX-License-Identifier: MIT
"""NVFP4 block dequantization on the GPU: D[m, k] = e2m1(q[m, k]) * sf[m, k // 16], bf16.

The global scale is left out on purpose: e2m1 * ue4m3 is exact in bf16 (<= 6 significant
bits, 2^-10 .. 2688), times an fp32 global scale it would not be. A GEMM on two such matrices,
accumulating in fp32 and multiplying by gA * gB in its epilogue, computes what FP4 tensor cores
compute (`kernels/gemm/nvfp4_sm90.py`, path "dequantize").
The matrices are walked as flat arrays of 4-byte code words: each thread decodes
WORDS_PER_THREAD words THREADS apart (so every warp instruction reads 128 and writes 512
contiguous bytes, and 4 loads per thread are in flight), each with its scale byte at the
blocked-layout offset (`tk_cute.layouts.nvfp4_scales.band_offset`) and the register decode
of `tk_cute.ops.nvfp4` (docs/facts.md#dequantize-pass has the access patterns measured before
this one). Memory-bound: 0.5625 B read + 2 B written per element. Any K % 16 == 0: the walk is
over the output's flat array of 8-element pieces, each read from its row of codes
(`nvfp4_codes.row_pitch` bytes apart: 16-byte padded rows where K % 32 != 0). Scale format
`sf_format` (compile time): "ue4m3" (default) or "ue5m3", decoded exactly to bf16 by
`ops.nvfp4.scale_to_bf16x2` (e2m1 * ue5m3 has <= 6 significant bits in 2^-18 .. 688128: exact
in bf16 too). UE5M3 is GPU-tested (tests/kernels/test_nvfp4_ue5m3_sm90.py).
Launched by raw pointers (`signature`; DLPack views cost ~20 us per tensor per call, more
than the kernel at small M). Torch entry: `tk_cute.nvfp4.launch.dequantize_blocks`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Uint32

from tk_cute.layouts import nvfp4_codes, nvfp4_scales
from tk_cute.ops import nvfp4 as fp4
from tk_cute.launcher import Signature, i32, ptr

THREADS = 256
WORDS_PER_THREAD = 4  # loads in flight per thread: enough bytes in flight to cover DRAM latency


def _kernel_for(sf_format: str):
    """The kernel decoding `sf_format` scales. One function per format rather than a Constexpr
    argument: the DSL derives the kernel's symbol from its arguments, and the UE4M3 kernel keeps
    the symbol (and PTX) it had before UE5M3 existed."""

    @cute.kernel
    def _dequantize_kernel(data: cute.Tensor, scales: cute.Tensor, out: cute.Tensor,
                           words_per_row: cutlass.Int32):
        total = cute.size(out) // 8  # words of codes (8 elements each)
        pitch = nvfp4_codes.row_pitch(words_per_row * 8) // 4  # words from row to row
        first = cute.arch.block_idx()[0] * THREADS * WORDS_PER_THREAD + cute.arch.thread_idx()[0]
        rk = (words_per_row // 2 + 3) // 4  # scale atoms per 128-row band (ceil(K / 64))
        for i in cutlass.range_constexpr(WORDS_PER_THREAD):
            c = first + i * THREADS  # each round of a block covers THREADS consecutive words
            if c < total:
                _decode_word(sf_format, data, scales, out, words_per_row, pitch, rk, c)

    return _dequantize_kernel


@cute.jit
def _decode_word(sf_format: cutlass.Constexpr, data, scales, out, words_per_row, pitch, rk, c):
    """Word c of the flat walk (rows `pitch` words apart, `rk` scale atoms per 128-row band):
    its 8 codes times their scale, one 16-byte store."""
    row, w = c // words_per_row, c % words_per_row
    kb = w // 2  # two words per 16-element scale block
    sf = fp4.scale_to_bf16x2(Uint32(scales[nvfp4_scales.band_offset(row, kb, rk)]), sf_format)
    decoded = fp4.e2m1x8_scaled(data[row * pitch + w], sf, "bf16")
    words = cute.make_rmem_tensor((4,), Uint32)
    for t in cutlass.range_constexpr(4):
        words[t] = decoded[t]
    values = cute.recast_tensor(words, out.element_type)
    cute.autovec_copy(values, cute.local_tile(out, (8,), (c,)))


def _pair_kernel_for(sf_format: str):
    """Both operands of a W4A4 GEMM (the same K) in one walk: words 0 .. words_a - 1 are A's,
    the rest B's; and the first thread writes D's scale gA * gB (one fp32 multiply, as
    torch's). One launch where two and a torch multiply took three."""

    @cute.kernel
    def _dequantize_pair_kernel(data_a: cute.Tensor, scales_a: cute.Tensor, out_a: cute.Tensor,
                                data_b: cute.Tensor, scales_b: cute.Tensor, out_b: cute.Tensor,
                                gs_a: cute.Tensor, gs_b: cute.Tensor, gs_out: cute.Tensor,
                                words_per_row: cutlass.Int32):
        words_a = cute.size(out_a) // 8
        total = words_a + cute.size(out_b) // 8
        pitch = nvfp4_codes.row_pitch(words_per_row * 8) // 4
        first = cute.arch.block_idx()[0] * THREADS * WORDS_PER_THREAD + cute.arch.thread_idx()[0]
        rk = (words_per_row // 2 + 3) // 4
        if first == 0:
            gs_out[0] = gs_a[0] * gs_b[0]
        for i in cutlass.range_constexpr(WORDS_PER_THREAD):
            c = first + i * THREADS
            if c < words_a:
                _decode_word(sf_format, data_a, scales_a, out_a, words_per_row, pitch, rk, c)
            elif c < total:
                _decode_word(sf_format, data_b, scales_b, out_b, words_per_row, pitch, rk,
                             c - words_a)

    return _dequantize_pair_kernel


_KERNELS = {f: _kernel_for(f) for f in fp4.DECODE_FORMATS}
_PAIR_KERNELS = {f: _pair_kernel_for(f) for f in fp4.DECODE_FORMATS}


def signature() -> Signature:
    """`_dequantize`'s runtime arguments: the codes as 4-byte words (rows `row_pitch(K)` bytes
    apart), the blocked scale bytes, the bf16 output (16-byte stores), the number of code
    words (M K / 8) and the words per row (K / 8)."""
    return Signature(ptr("data", cutlass.Int32, 4), ptr("scales", cutlass.Uint8, 1),
                     ptr("out", cutlass.BFloat16, 16), i32("words"), i32("words_per_row"))


def _views(data_ptr, scales_ptr, out_ptr, words, words_per_row):
    """The flat tensors of one operand: its codes' words (rows `row_pitch` apart), its blocked
    scale bytes and its bf16 output."""
    rows = words // words_per_row
    sf_bytes = (rows + 127) // 128 * ((words_per_row // 2 + 3) // 4) * 512  # the blocked layout
    data = cute.make_tensor(data_ptr, cute.make_layout(
        rows * (nvfp4_codes.row_pitch(words_per_row * 8) // 4)))
    scales = cute.make_tensor(scales_ptr, cute.make_layout(sf_bytes))
    return data, scales, cute.make_tensor(out_ptr, cute.make_layout(words * 8))


@cute.jit
def _dequantize(sf_format: cutlass.Constexpr, data_ptr: cute.Pointer, scales_ptr: cute.Pointer,
                out_ptr: cute.Pointer, words: cutlass.Int32, words_per_row: cutlass.Int32,
                stream):
    per_block = THREADS * WORDS_PER_THREAD
    _KERNELS[sf_format](*_views(data_ptr, scales_ptr, out_ptr, words, words_per_row),
                        words_per_row).launch(
        grid=((words + per_block - 1) // per_block, 1, 1), block=(THREADS, 1, 1), stream=stream)


def pair_signature() -> Signature:
    """`_dequantize_pair`'s runtime arguments: A's and B's codes, scales and bf16 outputs as in
    `signature`, their fp32 global scales and D's (written), the code words of each and the
    words per row (K / 8, shared)."""
    return Signature(ptr("data_a", cutlass.Int32, 4), ptr("scales_a", cutlass.Uint8, 1),
                     ptr("out_a", cutlass.BFloat16, 16), ptr("data_b", cutlass.Int32, 4),
                     ptr("scales_b", cutlass.Uint8, 1), ptr("out_b", cutlass.BFloat16, 16),
                     ptr("gs_a", cutlass.Float32, 4), ptr("gs_b", cutlass.Float32, 4),
                     ptr("gs_out", cutlass.Float32, 4), i32("words_a"), i32("words_b"),
                     i32("words_per_row"))


@cute.jit
def _dequantize_pair(sf_format: cutlass.Constexpr, data_a: cute.Pointer, scales_a: cute.Pointer,
                     out_a: cute.Pointer, data_b: cute.Pointer, scales_b: cute.Pointer,
                     out_b: cute.Pointer, gs_a: cute.Pointer, gs_b: cute.Pointer,
                     gs_out: cute.Pointer, words_a: cutlass.Int32, words_b: cutlass.Int32,
                     words_per_row: cutlass.Int32, stream):
    one = cute.make_layout(1)
    per_block = THREADS * WORDS_PER_THREAD
    _PAIR_KERNELS[sf_format](
        *_views(data_a, scales_a, out_a, words_a, words_per_row),
        *_views(data_b, scales_b, out_b, words_b, words_per_row),
        cute.make_tensor(gs_a, one), cute.make_tensor(gs_b, one), cute.make_tensor(gs_out, one),
        words_per_row).launch(grid=((words_a + words_b + per_block - 1) // per_block, 1, 1),
                              block=(THREADS, 1, 1), stream=stream)


def compile_launcher(sf_format: str = "ue4m3", options: str = "", pair: bool = False):
    """The kernel for `sf_format` scales (`pair`: both W4A4 operands and D's scale) as a
    `launcher.Launcher`."""
    if sf_format not in _KERNELS:
        raise ValueError(f"sf_format must be one of {sorted(_KERNELS)}, got {sf_format!r}")
    if pair:
        return pair_signature().compile(_dequantize_pair, sf_format, options=options)
    return signature().compile(_dequantize, sf_format, options=options)
