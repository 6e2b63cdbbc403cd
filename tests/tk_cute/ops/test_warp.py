"""Warp-scope ops compile to the intended PTX (their GPU behaviour is exercised by the lcf
kernels and the register reductions in test_primitives_sm90.py)."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from tk_cute.compile import build
from tk_cute.ops import warp


@cute.kernel
def _warp_kernel(out: cute.Tensor):
    lane = warp.laneid()
    v = cutlass.Float32(lane) + warp.shuffle_xor(cutlass.Float32(lane), 1)
    warp.sync()
    with warp.elect_leader():
        out[warp.warpid()] = v


@cute.jit
def _warp_ops(out: cute.Tensor):
    _warp_kernel(out).launch(grid=(1, 1, 1), block=(64, 1, 1))


def test_warp_ops_compile_to_elect_shuffle_and_warp_sync():
    out = make_fake_tensor(cutlass.Float32, (2,), (1,), assumed_align=16)
    b = build(_warp_ops, out, arch="sm_90a")
    assert b.ptx_count(r"elect\.sync") == 1
    assert b.ptx_count(r"shfl\.sync\.bfly") == 1
    assert b.ptx_count(r"bar\.warp\.sync") == 1
