"""The pieces the Blackwell/Rubin NVFP4 GEMM shares with Hopper: the static supergroup tile walk
(`tk_cute.ops.schedule`, the scheduler `templates/lcf.py` also uses) and the device-side global
scale (`tk_cute.ops.epilogue.global_scale`). A small kernel walks every output tile with them and
adds alpha = gA * gB to its cell: each cell must hold alpha exactly once. Compiled for sm_90a and
sm_100a on the CPU; run on the H200 (GPU tier)."""

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import make_fake_tensor, make_ptr

from tk_cute.compile import build
from tk_cute.ops import epilogue, schedule


@cute.kernel
def _walk(sched, ga, gb, out: cute.Tensor):
    tiles = schedule.Tiles.create(schedule.STATIC, sched)
    alpha = epilogue.global_scale(ga, gb)
    work = tiles.first()
    while work.is_valid_tile:
        if cute.arch.thread_idx()[0] == 0:
            m, n, l = work.tile_idx
            out[m, n, l] = out[m, n, l] + alpha
        work = tiles.next()


@cute.jit
def walk_tiles(ga: cute.Pointer, gb: cute.Pointer, out: cute.Tensor,
               cluster_m: cutlass.Constexpr, max_clusters: cutlass.Constexpr, stream):
    """Every (m, n, l) cell of `out` is one output tile."""
    cluster = (cluster_m, 1, 1)
    sched = schedule.params(schedule.STATIC, out.shape, cluster, 8)
    _walk(sched, ga, gb, out).launch(grid=schedule.grid(schedule.STATIC, sched, max_clusters),
                                     block=[32, 1, 1], cluster=cluster, stream=stream)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_walk_compiles(arch):
    import cuda.bindings.driver as cuda

    out = make_fake_tensor(cutlass.Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
                           (1, cute.sym_int(), cute.sym_int()))
    ptr = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=4)
    b = build(walk_tiles, ptr, ptr, out, 2, 66, cuda.CUstream(0), arch=arch)
    assert b.ptx_count(r"ld\.global\.(b32|f32)") >= 2 and b.ptx_count(r"mul\.(rn\.)?f32") == 1
    assert b.ptx_count("clusterlaunchcontrol") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("shape, cluster_m, max_clusters", [((9, 7, 2), 1, 132),
                                                            ((12, 5, 1), 2, 8),
                                                            ((3, 40, 3), 1, 16)])
def test_walk_visits_every_tile_once_with_device_alpha(shape, cluster_m, max_clusters):
    from tk_cute.runtime import as_cute, stream

    ga = torch.tensor(0.375, device="cuda")
    gb = torch.tensor(-1.25, device="cuda")
    out = torch.zeros(shape[::-1], device="cuda").permute(2, 1, 0)  # m fastest
    ptr = lambda t: make_ptr(cutlass.Float32, t.data_ptr(), cute.AddressSpace.gmem,
                             assumed_align=4)
    walk_tiles(ptr(ga), ptr(gb), as_cute(out, leading_dim=0), cluster_m, max_clusters, stream())
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full(shape, 0.375 * -1.25, device="cuda"))
