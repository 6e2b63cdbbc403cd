"""`tcgen05.mma.kind::f16` in the emulator: a one-CTA kernel (TMA-loaded `st` tiles, one
thread's MMAs, a `tcgen05.ld` epilogue) for bf16 and f16 inputs, A and B K-major or MN-major
(the instruction descriptor's transpose bits), over the 32B / 64B / 128B swizzles the tiles'
widths give; and a CTA pair's cta_group::2 MMA (M = 256). Small integers: every fp32 sum is
exact, so C must equal the exact product rounded once to C's type, element for element, with
no hazard and no lint finding. The instruction descriptor the DSL emitted is decoded and
checked against Table 42's fields (`tcgen05.idesc_fields`).
"""

import functools

import pytest
import torch

from tk_cute.emulator import tcgen05 as T
from tk_cute.emulator.lint import lint

M = 128
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}


def _tmem_to_registers(acc, gC, tid, n: int):
    """`tcgen05.ld` of the (128, n) accumulator `acc` into fp32 registers (thread t: row t),
    waited (`wait::ld`); -> (registers, this thread's part of the C tile `gC`)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import tcgen05

    from tk_cute.ops import tcgen05 as tc

    acc, gC = acc[(None, None), 0, 0], gC[(None, None), 0, 0]
    copy = tcgen05.make_tmem_copy(tc.tmem_load_atom(n), acc)
    thr = copy.get_slice(tid)
    src, dst = thr.partition_S(acc), thr.partition_D(gC)
    regs = cute.make_rmem_tensor(dst.shape, cutlass.Float32)
    cute.copy(copy, src, regs)
    tc.tensor_load_wait()
    return regs, dst


def _store(regs, dst):
    """fp32 registers -> C's type -> global."""
    import cutlass.cute as cute

    out = cute.make_rmem_tensor(regs.shape, dst.element_type)
    out.store(regs.load().to(dst.element_type))
    cute.autovec_copy(out, dst)



@functools.cache
def _gemm(dtype: str, a_mn: bool, b_mn: bool, n: int, k: int):
    """Host function C (M, n) = A (M, k) @ B (n, k)^T; an MN-major operand is given transposed
    in global memory ((k, M) / (k, n), M / N contiguous) and loaded as an `st` of (k, rows)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

    from tk_cute.ops import tcgen05 as tc
    from tk_cute.ops import tma, warp
    from tk_cute.types import coord, gl, st
    from tk_cute.types import tt as tmem
    from tk_cute.types.semaphore import init_fence, semaphore
    from tk_cute.types.st import Shared

    dt = {"bf16": cutlass.BFloat16, "f16": cutlass.Float16}[dtype]
    a_tile = st(dt, k, M) if a_mn else st(dt, M, k)
    b_tile = st(dt, k, n) if b_mn else st(dt, n, k)
    major = lambda mn: OperandMajorMode.MN if mn else OperandMajorMode.K
    holding_tile = st(cutlass.Int32, 8, 8, swizzle=False)
    columns = tmem.alloc_columns(n, "sm_100a")

    def as_mk(t, mn: bool):  # an MN-major (k, rows, stage) tile viewed as (rows, k, stage)
        return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0, 2])) if mn else t

    @cute.kernel
    def kernel(A: gl, B: gl, mC: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        smem = Shared()
        loaded, done = smem.barriers(1), smem.barriers(1)
        holding = smem.alloc(holding_tile)
        sA, sB = smem.alloc(a_tile), smem.alloc(b_tile)
        if warp.warpid() == 0:
            with warp.elect_leader():
                semaphore(loaded).init(1)
                semaphore(done).init(1)
        init_fence()
        cute.arch.sync_threads()
        mma = tc.tiled_mma(tcgen05.MmaF16BF16Op(
            dt, cutlass.Float32, (M, n, 16), tcgen05.CtaGroup.ONE, tcgen05.OperandSource.SMEM,
            major(a_mn), major(b_mn)))
        alloc = tmem.tensor_allocator(holding.iterator, columns, "sm_100a", False, (1, 128), 0)
        if warp.warpid() == 0:
            alloc.allocate()
        alloc.wait_for_alloc()
        base = alloc.retrieve_ptr(cutlass.Float32)
        acc = cute.make_tensor(base, mma.make_fragment_C(mma.partition_shape_C((M, n))).layout)
        gC = mma.get_slice(0).partition_C(mC[None, None, 0])
        if warp.warpid() == 0:
            with warp.elect_leader():
                semaphore(loaded).expect_bytes(a_tile.bytes + b_tile.bytes)
            tma.load_async(sA[None, None, 0], A, coord(0, 0), loaded)
            tma.load_async(sB[None, None, 0], B, coord(0, 0), loaded)
        if warp.warpid() == 1:
            semaphore(loaded).wait(0)
            tA = mma.make_fragment_A(mma.get_slice(0).partition_A(as_mk(sA, a_mn)))
            tB = mma.make_fragment_B(mma.get_slice(0).partition_B(as_mk(sB, b_mn)))
            for kb in cutlass.range_constexpr(k // 16):
                tc.mma_ABt(mma, acc, tA[None, None, kb, 0], tB[None, None, kb, 0],
                           accumulate=kb != 0)
            with warp.elect_leader():
                tc.tensor_commit(done, pair=False)
        semaphore(done).wait(0)
        tc.fence_after_thread_sync()
        regs, dst = _tmem_to_registers(acc, gC, tid, n)
        cute.arch.sync_threads()
        if warp.warpid() == 0:
            alloc.relinquish_alloc_permit()
            alloc.free(base, columns)
        _store(regs, dst)

    @cute.jit
    def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        kernel(gl.load(a, a_tile), gl.load(b, b_tile), c).launch(
            grid=(1, 1, 1), block=(128, 1, 1), stream=stream)

    return gemm


CASES = [  # dtype, A MN-major, B MN-major, N, K: the swizzles (A / B) in the comment
    ("bf16", False, False, 64, 64),  # 128B / 128B
    ("f16", False, False, 64, 32),  # 64B / 64B
    ("bf16", False, False, 32, 16),  # 32B / 32B, one MMA
    ("bf16", True, True, 64, 64),  # MN-major 128B / 128B
    ("f16", False, True, 32, 32),  # K-major 64B / MN-major 64B
    ("bf16", True, True, 16, 32),  # MN-major 128B / 32B
]


@pytest.mark.parametrize("dtype, a_mn, b_mn, n, k", CASES)
def test_f16_mma_matches_the_exact_product(dtype, a_mn, b_mn, n, k, monkeypatch):
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import from_dlpack

    from tk_cute.emulator import launch, machine
    from tk_cute.emulator.gemm import place
    from tk_cute.emulator.memory import GlobalMemory

    g = torch.Generator().manual_seed(n + k)
    t = TORCH[dtype]
    a = torch.randint(-4, 5, (M, k), generator=g).to(t)
    b = torch.randint(-4, 5, (n, k), generator=g).to(t)
    ga = (a.T if a_mn else a).contiguous()[:, :, None]
    gb = (b.T if b_mn else b).contiguous()[:, :, None]
    c = torch.full((M, n, 1), float("nan"), dtype=t)
    args = [from_dlpack(x, assumed_align=16) for x in (ga, gb, c)]
    ln = launch.capture(_gemm(dtype, a_mn, b_mn, n, k), *args, cuda.CUstream(0), arch="sm_100a")
    assert lint(ln.ptx) == []
    mem = GlobalMemory()
    place(mem, ga, gb, c)
    seen, real = [], T.idesc_fields  # the instruction descriptors the MMAs pass
    monkeypatch.setattr(T, "idesc_fields", lambda i, kind: seen.append(i) or real(i, kind))
    m = machine.run(ln, mem)
    monkeypatch.undo()
    assert m.hazards == [], [str(h) for h in m.hazards]
    assert torch.equal(c[:, :, 0], (a.double() @ b.double().T).to(t))
    f = T.idesc_fields(seen[0], "f16")  # what the DSL encoded, read with Table 42's fields
    assert (f["dtype"], f["atype"], f["btype"]) == (1, *[{"f16": 0, "bf16": 1}[dtype]] * 2)
    assert (f["trans_a"], f["trans_b"], f["m"], f["n"]) == (a_mn, b_mn, M, n)
    assert len(seen) == k // 16 and len(set(seen)) == 1


@functools.cache
def _pair_gemm(n: int, k: int):
    """C (256, n) = A (256, k) @ B (n, k)^T by one CTA pair (cluster 2 x 1): cta_group::2 MMAs
    of M = 256 issued by the leader, each CTA holding its 128 rows of A and n / 2 rows of B
    (`st_mma` tiles, 2-CTA TMA onto the leader's barrier), its 128 rows of D in its own TMEM."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

    from tk_cute.ops import cluster, tma, warp
    from tk_cute.ops import tcgen05 as tc
    from tk_cute.types import coord, st, st_mma, stage_ring
    from tk_cute.types import tt as tmem
    from tk_cute.types.st import Shared

    dt, tiler, cs = cutlass.BFloat16, (2 * M, n, k), (2, 1)
    op = lambda: tcgen05.MmaF16BF16Op(dt, cutlass.Float32, (2 * M, n, 16), tcgen05.CtaGroup.TWO,
                                      tcgen05.OperandSource.SMEM, OperandMajorMode.K,
                                      OperandMajorMode.K)
    tiles = lambda: (st_mma.A(dt, op(), tiler), st_mma.B(dt, op(), tiler))
    columns = tmem.alloc_columns(n, "sm_100a")

    @cute.kernel
    def kernel(A, B, mC: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        a_tile, b_tile = tiles()
        mma = tc.tiled_mma(op())
        vmnk = A.cluster_layout()
        smem = Shared()
        stage_bytes = 2 * (a_tile.layout_bytes() + b_tile.layout_bytes())  # on the leader
        inputs = stage_ring.tma_to_mma(smem.barriers(2), 1, stage_bytes, 1, vmnk, (1, 1))
        accs = stage_ring.mma_to_threads(smem.barriers(2), 1, 128, vmnk)
        dealloc, holding = smem.barriers(1), smem.alloc(st(cutlass.Int32, 8, 8, swizzle=False))
        sA, sB = smem.alloc(a_tile, 1), smem.alloc(b_tile, 1)
        alloc = tmem.tensor_allocator(holding.iterator, columns, "sm_100a", True, (1, 128), 0,
                                      dealloc)
        cluster.cluster_arrive(cs)
        cluster.cluster_wait(cs)
        if warp.warpid() == 0:
            alloc.allocate()
        tm = alloc.wait()
        acc = cute.make_tensor(tm.base, mma.make_fragment_C(
            mma.partition_shape_C(tiler[:2])).layout)
        gC = mma.get_slice(cluster.cta_rank_in_pair()).partition_C(mC[None, None, 0])
        if warp.warpid() == 0:
            at = inputs.producer()
            inputs.wait_finished(at)
            tma.load_async(sA[None, None, None, 0], tma.source(A), coord(0, 0, 0),
                           inputs.arrived(at))
            tma.load_async(sB[None, None, None, 0], tma.source(B), coord(0, 0, 0),
                           inputs.arrived(at))
        if warp.warpid() == 1:
            if cluster.is_leader_cta():
                at, out = inputs.consumer(), accs.producer()
                accs.wait_finished(out)
                inputs.wait_arrived(at)
                tA, tB = mma.make_fragment_A(sA), mma.make_fragment_B(sB)
                for kb in cutlass.range_constexpr(k // 16):
                    tc.mma2_ABt(mma, acc[None, 0, 0], tA[None, 0, kb, 0], tB[None, 0, kb, 0],
                                accumulate=kb != 0)
                inputs.finish(at)
                accs.arrive(out)
        full = accs.consumer()
        accs.wait_arrived(full)
        regs, dst = _tmem_to_registers(acc, gC, tid, n)
        accs.finish(full)
        _store(regs, dst)
        cute.arch.sync_threads()
        if warp.warpid() == 0:
            alloc.relinquish_alloc_permit()
            alloc.free(tm.base, columns)

    @cute.jit
    def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        a_tile, b_tile = tiles()
        kernel(tma.pair_gl(a, a_tile, cs), tma.pair_gl(b, b_tile, cs), c).launch(
            grid=(2, 1, 1), block=(128, 1, 1), cluster=(2, 1, 1), stream=stream)

    return gemm


def test_f16_pair_mma_matches_the_exact_product():
    """cta_group::2, M = 256: the leader's MMAs read both CTAs' shared memory, D lands in both
    CTAs' tensor memory."""
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import from_dlpack

    from tk_cute.emulator import launch, machine
    from tk_cute.emulator.gemm import place
    from tk_cute.emulator.memory import GlobalMemory

    n, k = 64, 64
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-4, 5, (2 * M, k, 1), generator=g).to(torch.bfloat16)
    b = torch.randint(-4, 5, (n, k, 1), generator=g).to(torch.bfloat16)
    c = torch.full((2 * M, n, 1), float("nan"), dtype=torch.bfloat16)
    args = [from_dlpack(x, assumed_align=16) for x in (a, b, c)]
    ln = launch.capture(_pair_gemm(n, k), *args, cuda.CUstream(0), arch="sm_100a")
    assert "tcgen05.mma.cta_group::2.kind::f16" in ln.ptx and lint(ln.ptx) == []
    mem = GlobalMemory()
    place(mem, a, b, c)
    m = machine.run(ln, mem)
    assert m.hazards == [], [str(h) for h in m.hazards]
    assert torch.equal(c[:, :, 0], (a[:, :, 0].double() @ b[:, :, 0].double().T).to(
        torch.bfloat16))
