# %% [markdown]
# # Ladder 06 - Warp specialization: a producer and two consumers
#
# You will learn:
# - roles: warpgroup 0 only loads (one warp issues the TMA), warpgroups 1 and 2 only compute,
#   each on 64 rows of a 128 x 256 tile (TK's H100 GEMM tile);
# - the ring's second semaphore per slot (TK's `inputs_finished`): consumers arrive on it when
#   their MMAs have read the slot, the producer waits on it before refilling; its first wait
#   passes (it waits for the phase before the first);
# - `warpgroup.decrease_registers` / `increase_registers` (setmaxnreg): the producer gives its
#   registers to the consumers' larger accumulators.
# What that compiles to: `setmaxnreg`, and mbarrier arrivals from the consumers.

# %%
import functools

import cutlass
import cutlass.cute as cute
import pytest

import ladder_common as common
from tk_cute.ops import register, tma, warp, warpgroup
from tk_cute.types import coord, gl, rt, st
from tk_cute.types.semaphore import init_fence, semaphore
from tk_cute.types.st import Shared

Mb, Nb, Kb = 128, 256, 64
STAGES, CONSUMERS = 4, 2
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232
TILE = (Mb, Nb, Kb)
a_tile, b_tile = st(cutlass.BFloat16, Mb, Kb), st(cutlass.BFloat16, Nb, Kb)
THREADS = (1 + CONSUMERS) * warpgroup.WARPGROUP_THREADS

# %% [markdown]
# K step k uses slot s = k % STAGES in phase p = (k // STAGES) % 2: the producer waits for
# `finished[s]` phase p ^ 1 (the previous round's release), the consumers for `arrived[s]`
# phase p.

# %%
@cute.jit
def producer(A: gl, B: gl, sA, sB, arrived, finished, i, j, k_steps):
    """Warp 0: wait `finished[s]`, expect the slot's bytes on `arrived[s]`, TMA A and B."""
    for k in cutlass.range(k_steps, unroll=1):
        s, p = k % STAGES, (k // STAGES) % 2
        semaphore(finished + s).wait(p ^ 1)
        with warp.elect_leader():
            semaphore(arrived + s).expect_bytes(a_tile.bytes + b_tile.bytes)
        tma.load_async(sA[None, None, s], A, coord(i, k), arrived + s)
        tma.load_async(sB[None, None, s], B, coord(j, k), arrived + s)


@cute.jit
def consumer(acc, sA, sB, arrived, finished, k_steps):
    """Consumer warpgroups: wait `arrived[s]`, wgmma; once step k - 1's MMAs are done, every
    warp arrives on `finished` of its slot."""
    warpgroup.mma_fence()
    for k in cutlass.range(k_steps, unroll=1):
        s = k % STAGES
        semaphore(arrived + s).wait((k // STAGES) % 2)
        warpgroup.mma_ABt(acc, sA[None, None, s], sB[None, None, s])
        warpgroup.mma_commit_group()
        warpgroup.mma_async_wait(1)
        if k > 0:
            with warp.elect_leader():
                semaphore(finished + (k - 1) % STAGES).arrive()
    warpgroup.mma_async_wait(0)


@cute.kernel
def kernel(A: gl, B: gl, mC: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    i, j, _ = cute.arch.block_idx()
    smem = Shared()
    arrived, finished = smem.barriers(STAGES), smem.barriers(STAGES)
    sA, sB = smem.alloc(a_tile, STAGES), smem.alloc(b_tile, STAGES)
    if warp.warpid() == 0:
        with warp.elect_leader():
            for s in cutlass.range_constexpr(STAGES):
                semaphore(arrived + s).init(1)
                semaphore(finished + s).init(4 * CONSUMERS)  # one arrival per consumer warp
    init_fence()
    cute.arch.sync_threads()

    k_steps = cute.size(A.tiles(), mode=[3])
    if warpgroup.groupid() == 0:
        warpgroup.decrease_registers(PRODUCER_REGISTERS)
        if warp.warpid() == 0:
            producer(A, B, sA, sB, arrived, finished, i, j, k_steps)
    else:
        warpgroup.increase_registers(CONSUMER_REGISTERS)
        thread = tid - warpgroup.WARPGROUP_THREADS  # 0..255 over both consumers
        mma = warpgroup.tiled_mma(cutlass.BFloat16, Nb, warpgroups=CONSUMERS)
        acc = rt.accumulator(mma, thread, Mb, Nb)
        register.zero(acc)
        consumer(acc, sA, sB, arrived, finished, k_steps)
        epi = warpgroup.tiled_mma(cutlass.BFloat16, Nb, warpgroups=CONSUMERS)  # level 04
        warpgroup.store_global(cute.local_tile(mC[None, None, 0], (Mb, Nb), (i, j)),
                               rt(acc.frag, epi, epi.get_slice(thread), Mb, Nb))


@cute.jit
def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
    grid = (c.shape[0] // Mb, c.shape[1] // Nb, 1)
    # min_blocks_per_mp: ptxas must know the block's register budget for setmaxnreg
    kernel(gl.load(a, a_tile), gl.load(b, b_tile), c).launch(
        grid=grid, block=(THREADS, 1, 1), min_blocks_per_mp=1, stream=stream)


@functools.cache
def compiled(arch: str = common.ARCH):
    return common.compile_level(gemm, TILE, arch=arch)


compiled()  # in a notebook: registers, spills, instruction mix (`.ptx` has the text)

# %% [markdown]
# New in the PTX: the register split (`setmaxnreg.dec 40`, `setmaxnreg.inc 232`), twice as many
# mbarriers, and consumer arrivals; 256-wide wgmma for each consumer's 64 rows.

# %%
def test_compiles_to_producer_and_consumers():
    b = compiled()
    assert b.ptx_count(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{PRODUCER_REGISTERS}") == 1
    assert b.ptx_count(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{CONSUMER_REGISTERS}") == 1
    assert b.ptx_count(r"mbarrier\.init") == 2 * STAGES
    assert b.ptx_count(r"mbarrier\.arrive\.shared") >= 1  # consumers release slots
    assert b.ptx_count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16") == 4
    assert b.kernel.local_bytes == 0


@pytest.mark.gpu
def test_matches_the_exact_product():
    common.check(gemm, TILE)
    common.check(gemm, TILE, mnk=(256, 512, 2048))  # many rounds of the ring


def bench():
    return common.bench(gemm, TILE, name="ladder 06 warp specialized")


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    common.run_cells(test_compiles_to_producer_and_consumers, test_matches_the_exact_product, bench)
