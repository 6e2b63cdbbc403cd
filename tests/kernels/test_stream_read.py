"""Speed-of-light read (`kernels/stream_read.py`): CPU compile checks, host validation, and on
the GPU (marker gpu) that every byte is read exactly once: the XOR of the warps' folds equals the
XOR of every 32-bit word of the inputs, computed on the host (exact integer arithmetic, so the
check is equality; a word read twice or missed would flip its bits out of the result).
"""

import numpy as np
import pytest
import torch

from tk_cute.bench.stream_read import ctas, stream_read
from tk_cute.compile import build
from tk_cute.kernels import stream_read as sr


@pytest.fixture(scope="module")
def built():
    return build(sr._launch, *sr.SIGNATURE.compile_args(), arch="sm_90a")


def test_compiles_to_streaming_ldg128_within_a_full_sm_of_registers(built):
    b = built
    # Per buffer: LOADS streaming 16-byte loads in the main loop, LOADS predicated for the rest.
    assert b.ptx_count(r"ld\.global\.nc\.L1::no_allocate\.v4\.u32") == 2 * sr.LOADS
    assert b.sass_count(r"LDG\.E\.NA\.128") == 2 * sr.LOADS
    assert b.sass_count(r"\bLDG\b") == 4 * sr.LOADS
    # CTAS_PER_SM x THREADS threads on one SM share its 64 K registers.
    assert b.kernel.registers <= 65536 // (sr.CTAS_PER_SM * sr.THREADS)
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0
    assert b.sass_count(r"\bSTL\b") == 0 and b.sass_count(r"\bLDL\b") == 0
    assert b.sass_count(r"\bSTG\b") == 1  # one fold per warp


def test_fast_argument_packing_matches_dsl():
    sr.compile_launcher(options="--gpu-arch sm_90a")  # raises on a mismatch


def test_rejects_bad_input_before_any_gpu_work():
    with pytest.raises(ValueError, match="must be CUDA tensors, got cpu"):
        stream_read(torch.zeros(16, dtype=torch.uint8))


def _xor_words(*tensors) -> int:
    return int(np.bitwise_xor.reduce(
        np.concatenate([t.contiguous().view(torch.int32).cpu().numpy().ravel()
                        for t in tensors])))


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes_a, nbytes_b", [(16, 0), (4096 * 16 + 48, 0),
                                                (37748736, 4718592), (3 * 2**20 + 16, 16 * 77)])
def test_every_byte_read_once(seed, nbytes_a, nbytes_b):
    a = torch.randint(-2**31, 2**31, (nbytes_a // 4,), dtype=torch.int32, device="cuda")
    b = (torch.randint(-2**31, 2**31, (nbytes_b // 4,), dtype=torch.int32, device="cuda")
         if nbytes_b else None)
    out = torch.randint(-2**31, 2**31, (ctas(0) * sr.WARPS,), dtype=torch.int32,
                        device="cuda")  # poison: every warp must write its fold
    stream_read(a.view(torch.uint8), None if b is None else b.view(torch.uint8), out=out)
    assert _xor_words(out) == _xor_words(a, *([] if b is None else [b]))


@pytest.mark.gpu
def test_rejects_misaligned_and_ragged_tensors():
    x = torch.zeros(64, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned .* address % 16 = 4"):
        stream_read(x[4:20])
    with pytest.raises(ValueError, match="multiple of 16 bytes, got \\(20,\\)"):
        stream_read(x[:20])
    with pytest.raises(ValueError, match=r"out has shape \(3,\)"):
        stream_read(x, out=torch.empty(3, dtype=torch.int32, device="cuda"))
