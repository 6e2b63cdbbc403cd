"""The pieces the Blackwell/Rubin NVFP4 GEMM shares with Hopper: the static supergroup tile walk
(`tk_cute.ops.schedule`, the scheduler `templates/lcf.py` also uses) and the device-side global
scale (`tk_cute.ops.epilogue.global_scale`). A small kernel walks every output tile with them and
atomically adds alpha = gA * gB to its cell: each cell must hold alpha exactly once (an atomic
add, so a tile walked twice cannot hide behind a lost update), and guard cells around the output
must be untouched (no tile outside the problem, e.g. the N padding of CUTLASS's swizzle). The
supergroup order itself is checked on the CPU. Compiled for sm_90a and sm_100a on the CPU; run
on the H200 (GPU tier)."""

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import make_fake_tensor, make_ptr

from tk_cute.compile import build
from tk_cute.launcher import placeholder_ptr
from tk_cute.ops import epilogue, schedule


@cute.kernel
def _walk(sched, ga, gb, out: cute.Tensor):
    tiles = schedule.Tiles.create(schedule.STATIC, sched)
    alpha = epilogue.global_scale(ga, gb)
    work = tiles.first()
    while work.is_valid_tile:
        if cute.arch.thread_idx()[0] == 0:
            cute.arch.atomic_add(out.iterator + cute.crd2idx(work.tile_idx, out.layout), alpha)
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
    ptr = placeholder_ptr(cutlass.Float32, 4)
    b = build(walk_tiles, ptr, ptr, out, 2, 66, cuda.CUstream(0), arch=arch)
    assert b.ptx_count(r"ld\.global\.(b32|f32)") >= 2 and b.ptx_count(r"mul\.(rn\.)?f32") == 1
    assert b.ptx_count(r"(red|atom)\.global\.add\.f32") == 1
    assert b.ptx_count("clusterlaunchcontrol") == 0


def _reference_order(mc, nc, lc, group):
    """TK's supergroup walk written out: per batch, groups of `group` rows, M fastest."""
    order = []
    for l in range(lc):
        for g0 in range(0, mc, group):
            rows = range(g0, min(g0 + group, mc))
            order += [(m, n, l) for n in range(nc) for m in rows]
    return order


@pytest.mark.parametrize("mc, nc, lc", [(9, 7, 2), (6, 5, 1), (3, 40, 3), (1, 1, 1), (17, 3, 2),
                                        (8, 8, 1), (16, 1, 1), (1, 9, 4)])
@pytest.mark.parametrize("group", [1, 2, 8])
def test_supergroup_order_is_tks_and_a_bijection(mc, nc, lc, group):
    got = [schedule.supergroup_coord(k, mc, nc, group) for k in range(mc * nc * lc)]
    assert got == _reference_order(mc, nc, lc, group)
    assert sorted(got) == sorted((m, n, l) for m in range(mc) for n in range(nc)
                                 for l in range(lc))


def test_supergroup_must_be_positive():
    with pytest.raises(ValueError):
        schedule.params(schedule.STATIC, (9, 7, 2), (1, 1, 1), 0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, cluster_m, max_clusters", [((9, 7, 2), 1, 132),
                                                            ((12, 5, 1), 2, 8),
                                                            ((3, 40, 3), 1, 16),
                                                            ((10, 3, 2), 2, 132)])
def test_walk_visits_every_tile_once_with_device_alpha(shape, cluster_m, max_clusters):
    from tk_cute.runtime import as_cute, stream

    ga = torch.tensor(0.375, device="cuda")
    gb = torch.tensor(-1.25, device="cuda")
    alpha = 0.375 * -1.25  # -0.46875, exact in fp32
    guard, poison, numel = 1024, 12345.0, shape[0] * shape[1] * shape[2]
    buf = torch.full((guard + numel + guard,), poison, device="cuda")
    buf[guard:guard + numel] = 0
    out = buf[guard:guard + numel].view(shape[::-1]).permute(2, 1, 0)  # m fastest
    ptr = lambda t: make_ptr(cutlass.Float32, t.data_ptr(), cute.AddressSpace.gmem,
                             assumed_align=4)
    walk_tiles(ptr(ga), ptr(gb), as_cute(out, leading_dim=0), cluster_m, max_clusters, stream())
    torch.cuda.synchronize()

    assert out.dtype == torch.float32 and out.shape == shape
    visits = (out / alpha).cpu()  # alpha per visit: 1.0 everywhere
    bad = (visits != 1).nonzero().tolist()
    assert not bad, (f"{len(bad)} of {numel} tiles not walked exactly once with alpha = "
                     f"{alpha}: " + ", ".join(f"{tuple(i)}: {visits[tuple(i)].item():g}x"
                                              for i in bad[:24]))
    spill = torch.cat([buf[:guard], buf[guard + numel:]]).cpu()
    hit = (spill != poison).nonzero().flatten().tolist()
    assert not hit, (f"{len(hit)} writes outside the output (tiles outside the problem), at "
                     "element offsets from its start: "
                     + ", ".join(str(o - guard if o < guard else o + numel) for o in hit[:24]))


@pytest.mark.parametrize("tiles, steps", [(1, 1), (2, 16), (64, 32), (224, 32), (64, 112),
                                          (7, 3)])
@pytest.mark.parametrize("ctas", [1, 3, 7, 64, 132])
def test_stream_k_shares(tiles, steps, ctas):
    """The CTAs' shares tile the units once, differ by at most one unit, `stream_k_owner`
    inverts them, and each (CTA, tile) pair of partial sums has its own slot c + t of
    `stream_k_slots` (the register-A kernel's workspace regions, `partial_vector`)."""
    units = tiles * steps
    ctas = min(ctas, units)
    shares = [schedule.stream_k_share(c, ctas, units) for c in range(ctas)]
    assert shares[0][0] == 0 and shares[-1][1] == units
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
    assert max(e - s for s, e in shares) - min(e - s for s, e in shares) <= 1
    assert min(e - s for s, e in shares) >= 1
    for c, (s, e) in enumerate(shares):
        assert all(schedule.stream_k_owner(u, ctas, units) == c for u in range(s, e))
    slots = [c + t for t in range(tiles)
             for c in range(schedule.stream_k_owner(t * steps, ctas, units),
                            schedule.stream_k_owner(t * steps + steps - 1, ctas, units) + 1)]
    assert len(set(slots)) == len(slots) and max(slots) < ctas + tiles - 1
    assert schedule.stream_k_slots(ctas, tiles) == ctas + tiles - 1


@pytest.mark.parametrize("tiles, k_steps, ctas", [
    (224, 64, 132), (132, 5, 132), (131, 1, 131), (64, 64, 128), (40, 23, 120), (44, 64, 132),
    (96, 64, 132), (16, 23, 128), (16, 3, 48), (1, 64, 64), (1, 300, 132), (3, 5, 15)])
def test_stream_k_grid(tiles, k_steps, ctas):
    """One CTA per SM from as many tiles on; fewer: the aligned split (min(132 // tiles,
    k_steps) CTAs per tile) where it fills 90% of the SMs, else one CTA per SM or per unit."""
    assert schedule.stream_k_grid(tiles, k_steps, 132) == ctas
    assert 1 <= ctas <= min(132, tiles * k_steps)
