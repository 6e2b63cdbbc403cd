# %% [markdown]
# # Ladder 08 - The same GEMM on tcgen05 (Blackwell sm_100a, Rubin sm_107a)
#
# Level 06's ring and roles, moved to Blackwell's tensor cores. What changes:
# - one thread issues the MMAs (`tcgen05.mma`, `tk_cute.ops.tcgen05.mma_ABt`) for the whole
#   128 x 256 tile: no consumer warpgroups, no register split;
# - the accumulator lives in tensor memory (TK's `tt`): 256 of the SM's 512 (Rubin: 576) 32-bit
#   columns, allocated by `tensor_allocator` and read back with `tcgen05.ld`;
# - a slot is released by `tensor_commit` (`tcgen05.commit`: arrive once the MMAs issued so far
#   have read it) instead of consumer arrivals, and the tile's end by one more commit;
# - the tiles, TMA loads and semaphores are level 06's unchanged (the UMMA operand layout is the
#   same swizzled `st`).
# Compiled on a CPU for sm_100a and sm_107a; no H200 can run it (the GPU check needs sm_100+),
# but the emulator runs it on a CPU (`test_runs_in_the_emulator`).

# %%
import functools
import time

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

import ladder_common as common
from tk_cute.arch import target
from tk_cute.ops import tcgen05 as tc
from tk_cute.ops import tma, warp
from tk_cute.types import coord, gl, st
from tk_cute.types import tt as tmem
from tk_cute.types.semaphore import init_fence, semaphore
from tk_cute.types.st import Shared

Mb, Nb, Kb = 128, 256, 64
STAGES, EPI_N = 4, 32
TILE = (Mb, Nb, Kb)
LOADER, MMA_WARP = 0, 1  # warps; all four run the epilogue
a_tile, b_tile = st(cutlass.BFloat16, Mb, Kb), st(cutlass.BFloat16, Nb, Kb)


def tiled_mma():
    """One 128 x 256 x 16 bf16 MMA of one CTA, A and B K-major from shared memory."""
    return tc.tiled_mma(tcgen05.MmaF16BF16Op(
        cutlass.BFloat16, cutlass.Float32, (Mb, Nb, 16), tcgen05.CtaGroup.ONE,
        tcgen05.OperandSource.SMEM, OperandMajorMode.K, OperandMajorMode.K))


# %% [markdown]
# The loader is level 06's producer; the MMA warp replaces the consumers.

# %%
@cute.jit
def loader(A: gl, B: gl, sA, sB, arrived, finished, i, j, k_steps):
    """Loader warp: wait `finished[s]`, expect the slot's bytes on `arrived[s]`, TMA A and B."""
    for k in cutlass.range(k_steps, unroll=1):
        s, p = k % STAGES, (k // STAGES) % 2
        semaphore(finished + s).wait(p ^ 1)
        with warp.elect_leader():
            semaphore(arrived + s).expect_bytes(a_tile.bytes + b_tile.bytes)
        tma.load_async(sA[None, None, s], A, coord(i, k), arrived + s)
        tma.load_async(sB[None, None, s], B, coord(j, k), arrived + s)


@cute.jit
def mma_issue(mma, acc, sA, sB, arrived, finished, acc_full, k_steps):
    """MMA warp: wait `arrived[s]`, 4 MMAs of K = 16, commit `finished[s]`; at the end commit
    `acc_full`."""
    tCrA = mma.make_fragment_A(mma.get_slice(0).partition_A(sA))
    tCrB = mma.make_fragment_B(mma.get_slice(0).partition_B(sB))
    for k in cutlass.range(k_steps, unroll=1):
        s = k % STAGES
        semaphore(arrived + s).wait((k // STAGES) % 2)
        for kb in cutlass.range_constexpr(Kb // 16):
            tc.mma_ABt(mma, acc, tCrA[None, None, kb, s], tCrB[None, None, kb, s],
                       accumulate=(k + kb) != 0)
        with warp.elect_leader():
            tc.tensor_commit(finished + s, pair=False)
    with warp.elect_leader():
        tc.tensor_commit(acc_full, pair=False)


@cute.jit
def epilogue(acc, gC, tid):
    """All 128 threads: thread t owns row t of the tile: `tcgen05.ld` EPI_N columns at a time,
    convert to bf16, store. `acc` and `gC` are (Mb, Nb) views (the MMA's C partition)."""
    blocks = lambda t: cute.flat_divide(t, (Mb, EPI_N))  # (Mb, EPI_N, 1, Nb / EPI_N)
    copy = tcgen05.make_tmem_copy(tc.tmem_load_atom(EPI_N), blocks(acc)[None, None, 0, 0])
    thr = copy.get_slice(tid)
    src, dst = thr.partition_S(blocks(acc)), thr.partition_D(blocks(gC))
    regs = cute.make_rmem_tensor(dst[None, None, None, 0, 0].shape, cutlass.Float32)
    out = cute.make_rmem_tensor(regs.shape, gC.element_type)
    for e in cutlass.range_constexpr(Nb // EPI_N):
        cute.copy(copy, src[None, None, None, 0, e], regs)
        out.store(regs.load().to(gC.element_type))
        cute.autovec_copy(out, dst[None, None, None, 0, e])


@cute.kernel
def kernel(A: gl, B: gl, mC: cute.Tensor, arch: cutlass.Constexpr):
    tid, _, _ = cute.arch.thread_idx()
    i, j, _ = cute.arch.block_idx()
    smem = Shared()
    arrived, finished, acc_full = smem.barriers(STAGES), smem.barriers(STAGES), smem.barriers(1)
    holding = smem.alloc(tmem_address)
    sA, sB = smem.alloc(a_tile, STAGES), smem.alloc(b_tile, STAGES)
    if warp.warpid() == 0:
        with warp.elect_leader():
            for s in cutlass.range_constexpr(STAGES):
                semaphore(arrived + s).init(1)
                semaphore(finished + s).init(1)  # one tensor_commit per release
            semaphore(acc_full).init(1)
    init_fence()
    cute.arch.sync_threads()

    mma = tiled_mma()
    columns = tmem.alloc_columns(Nb, arch)
    alloc = tmem.tensor_allocator(holding.iterator, columns, arch, False,
                                  cutlass.pipeline.NamedBarrier(1, 128), LOADER)
    if warp.warpid() == LOADER:
        alloc.allocate(columns)
    alloc.wait_for_alloc()
    base = alloc.retrieve_ptr(cutlass.Float32)
    acc = cute.make_tensor(base, mma.make_fragment_C(mma.partition_shape_C((Mb, Nb))).layout)
    # C's partition before the MMAs: they change `mma`'s state inside the loop
    tCgC = mma.get_slice(0).partition_C(cute.local_tile(mC[None, None, 0], (Mb, Nb), (i, j)))

    k_steps = cute.size(A.tiles(), mode=[3])
    if warp.warpid() == LOADER:
        loader(A, B, sA, sB, arrived, finished, i, j, k_steps)
    if warp.warpid() == MMA_WARP:
        mma_issue(mma, acc, sA, sB, arrived, finished, acc_full, k_steps)
    semaphore(acc_full).wait(0)
    tc.fence_after_thread_sync()
    epilogue(acc[(None, None), 0, 0], tCgC[(None, None), 0, 0], tid)
    tc.tensor_load_wait()  # wait::ld + fence: every tcgen05.ld done before the columns are freed
    cute.arch.sync_threads()
    if warp.warpid() == LOADER:
        alloc.relinquish_alloc_permit()
        alloc.free(base, columns)


tmem_address = st(cutlass.Int32, 8, 8, swizzle=False)  # tcgen05.alloc writes the base here


@functools.cache
def gemm_for(arch: str):
    """The host launch for `arch` (sm_100a, sm_103a, sm_107a): the TMEM allocation's mode
    follows the target."""
    if target(arch).tmem_columns == 0:
        raise ValueError(f"tcgen05 needs tensor memory; {arch} has none (see level 07)")

    @cute.jit
    def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        grid = (c.shape[0] // Mb, c.shape[1] // Nb, 1)
        kernel(gl.load(a, a_tile), gl.load(b, b_tile), c, arch).launch(
            grid=grid, block=(128, 1, 1), stream=stream)

    return gemm


@functools.cache
def compiled(arch: str = "sm_100a"):
    return common.compile_level(gemm_for(arch), TILE, arch=arch)


compiled("sm_100a")

# %% [markdown]
# The swizzled `st` tile of levels 03-06 is exactly the operand layout the Blackwell helpers
# build for UMMA (`make_smem_layout_a/b`): same swizzle, same offset for every element and stage.
# That is why the loader did not change.

# %%
def umma_layouts_match_st():
    """Offsets of every (row, k, stage) under `st.layout` and under CuTe's UMMA smem layouts."""
    import cutlass.utils.blackwell_helpers as sm100_utils

    found = {}

    def offsets(name, layout, coords):
        found[name] = (str(layout.inner), [int(layout.outer(c)) for c in coords])

    @cute.jit
    def trace():
        mma = tiled_mma()
        for name, tile, make, rows in (("A", a_tile, sm100_utils.make_smem_layout_a, Mb),
                                       ("B", b_tile, sm100_utils.make_smem_layout_b, Nb)):
            pts = [(r, k, s) for r in range(rows) for k in range(0, Kb, 8) for s in range(STAGES)]
            offsets(f"st {name}", tile.layout(STAGES), pts)
            offsets(f"umma {name}", make(mma, TILE, cutlass.BFloat16, STAGES),
                    [((r, k % 16), 0, k // 16, s) for r, k, s in pts])

    trace()
    return found


def test_st_tile_is_the_umma_operand_layout():
    found = umma_layouts_match_st()
    assert found["st A"] == found["umma A"] and found["st B"] == found["umma B"]
    assert found["st A"][0] == "S<3,4,3>"  # 128-byte swizzle


# %% [markdown]
# What the compiler made of it, per target: `tcgen05.mma` (4 per stage, SASS `UTCHMMA`),
# TMEM allocation and `tcgen05.ld`, commits instead of consumer arrivals; no wgmma, no
# setmaxnreg. Rubin (sm_107a) compiles the same source.

# %%
@pytest.mark.parametrize("arch", ["sm_100a", "sm_107a"])
def test_compiles_to_tcgen05(arch):
    b = compiled(arch)
    assert b.ptx_count(r"tcgen05\.mma\.cta_group::1\.kind::f16") == Kb // 16
    assert b.sass_count(r"UTCHMMA") == Kb // 16
    assert b.ptx_count(r"tcgen05\.alloc") == 1 and b.ptx_count(r"tcgen05\.dealloc") == 1
    assert b.ptx_count(r"tcgen05\.commit") == 2  # a slot released, the accumulator done
    assert b.ptx_count(r"tcgen05\.ld\.sync\.aligned\.32x32b\.x32") == Nb // EPI_N
    assert b.ptx_count(r"cp\.async\.bulk\.tensor") == 2
    assert b.ptx_count(r"wgmma|setmaxnreg") == 0 and b.kernel.local_bytes == 0
    assert b.sync_findings == []  # the ISA's ordering rules (tk_cute.emulator.lint)


def what_changed():
    """Instruction mix of level 06 (wgmma, sm_90a) beside this level on sm_100a and sm_107a."""
    import importlib

    from tk_cute import compare

    level_06 = importlib.import_module("06_warp_specialized").compiled()
    return compare.mix_table({"06 wgmma sm_90a": level_06, "08 tcgen05 sm_100a":
                              compiled("sm_100a"), "08 tcgen05 sm_107a": compiled("sm_107a")})


if __name__ == "__main__":  # SASS of sm_100a / sm_107a needs nvdisasm 13.5 (the dev extra)
    print(what_changed())

# %% [markdown]
# Without a tcgen05 GPU the level runs in the emulator (`tk_cute.emulator`, notebook
# `examples/07_emulator`): the host code's launch captured with CPU tensors, its PTX executed
# warp by warp on the CPU (TMA, mbarriers, tensor memory, the kind::f16 MMAs). Small integers
# make every fp32 sum exact, so C must equal the exact product rounded once to bf16; K = 384 is
# 6 K steps, so the 4-stage ring wraps. No hazard may be reported.

# %%
def run_in_the_emulator(M: int = 256, N: int = 256, K: int = 384, arch: str = "sm_100a",
                        **options):
    """(a, b, c, machine): the sm_100a launch on CPU tensors, run by `tk_cute.emulator`."""
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import from_dlpack

    from tk_cute.emulator import launch, machine
    from tk_cute.emulator.gemm import place
    from tk_cute.emulator.memory import GlobalMemory

    common.check_shape(M, N, K, TILE)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-4, 5, (M, K, 1), generator=g).to(torch.bfloat16)
    b = torch.randint(-4, 5, (N, K, 1), generator=g).to(torch.bfloat16)
    c = torch.full((M, N, 1), float("nan"), dtype=torch.bfloat16)
    args = [from_dlpack(t, assumed_align=16) for t in (a, b, c)]
    ln = launch.capture(gemm_for(arch), *args, cuda.CUstream(0), arch=arch)
    mem = GlobalMemory()
    place(mem, a, b, c)  # the tensors at their own addresses, as the launch's tensor maps say
    return a, b, c, machine.run(ln, mem, **options)


def exact(a, b):
    """A @ B^T in float64, rounded once to bf16."""
    return (a[:, :, 0].double() @ b[:, :, 0].double().T).to(torch.bfloat16)


def test_runs_in_the_emulator():
    a, b, c, m = run_in_the_emulator()
    assert m.hazards == [], [str(h) for h in m.hazards]
    assert torch.equal(c[:, :, 0], exact(a, b))


# %% [markdown]
# On Blackwell or Rubin: every element within the fp32-sum bound. An H200 skips it.

# %%
def _tcgen05_gpu() -> bool:
    from tk_cute.arch import current

    t = current()
    return t is not None and t.tmem_columns > 0


@pytest.mark.gpu
@pytest.mark.skipif(not _tcgen05_gpu(), reason="needs a tcgen05 GPU (sm_100a, sm_103a, sm_107a)")
def test_matches_the_exact_product():
    from tk_cute.arch import current

    common.check(gemm_for(current().name), TILE)


def bench():
    from tk_cute.arch import current

    return common.bench(gemm_for(current().name), TILE, name="ladder 08 tcgen05")


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    test_st_tile_is_the_umma_operand_layout()
    for arch in ("sm_100a", "sm_107a"):
        test_compiles_to_tcgen05(arch)
    if _tcgen05_gpu():
        test_matches_the_exact_product()
        bench()
    else:
        print("GPU cells skipped: no tcgen05 GPU (sm_100a, sm_103a, sm_107a); run in the "
              "emulator instead:")
        t0 = time.perf_counter()
        a, b, c, m = run_in_the_emulator()
        print(f"  {tuple(c.shape[:2])} x K = {a.shape[1]} on the CPU in "
              f"{time.perf_counter() - t0:.1f} s ({m.executed} warp-instructions): C == exact "
              f"product: {torch.equal(c[:, :, 0], exact(a, b))}, hazards: {m.hazards}")
