# %% [markdown]
# # 07 - A tcgen05 kernel on a CPU: the emulator
#
# You will learn:
# - how a small Blackwell kernel reads in tk_cute's vocabulary: a `tt` accumulator in tensor
#   memory (`tensor_allocator`), `st` tiles loaded by TMA onto a `semaphore`, one thread's
#   `tcgen05.mma` (kind::f16, bf16 in, fp32 sums), `tensor_commit`, a `tcgen05.ld` epilogue;
# - how to run it without a Blackwell GPU: `tk_cute.emulator` captures the launch the host code
#   makes (`launch.capture`), places CPU tensors in its global memory at their own addresses
#   (`gemm.place`) and executes the PTX warp by warp (`machine.run`), exactly;
# - what the synchronization lint (`Build.sync_findings`) and the emulator's hazards say about a
#   deliberately broken variant (its `tcgen05.wait::ld` removed from the PTX);
# - how tk_cute's NVFP4 GEMM for a Rubin GPU (sm_107a) runs on a CPU through the public dispatch
#   (`emulator.gemm.gemm`), checked bit for bit against the exact product.
# Runs on a CPU in a few seconds (two compiles of about a second each; an emulated run is a
# fraction of a second).

# %%
import dataclasses
import functools
import re
import time

import cutlass
import cutlass.cute as cute
import torch
from cuda.bindings import driver as cuda
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05
from cutlass.cute.runtime import from_dlpack

from tk_cute.compile import build
from tk_cute.emulator import gemm as emulated
from tk_cute.emulator import launch, machine
from tk_cute.emulator.lint import lint
from tk_cute.emulator.memory import GlobalMemory
from tk_cute.ops import tcgen05 as tc
from tk_cute.ops import tma, warp
from tk_cute.types import coord, gl, st
from tk_cute.types import tt as tmem
from tk_cute.types.semaphore import init_fence, semaphore
from tk_cute.types.st import Shared

ARCH = "sm_100a"
M, N, K = 128, 64, 64  # one tile: C (128 x 64) = A (128 x 64) @ B (64 x 64)^T
a_tile, b_tile = st(cutlass.BFloat16, M, K), st(cutlass.BFloat16, N, K)  # 128B-swizzled
tmem_address = st(cutlass.Int32, 8, 8, swizzle=False)  # tcgen05.alloc writes the base here
COLUMNS = tmem.alloc_columns(N, ARCH)  # fp32 accumulator: N columns of 128 lanes

# %% [markdown]
# The kernel: one CTA of four warps. Warp 0 allocates the accumulator's tensor memory and
# loads both tiles with TMA; warp 1 waits for them and issues K / 16 = 4 MMAs of
# 128 x 64 x 16 from one thread, then `tensor_commit`s a semaphore; every thread waits for
# it and reads its row of the accumulator (`tcgen05.ld.32x32b.x64`: thread t, lane t). The
# columns go back (`tcgen05.dealloc`) only after `tensor_load_wait` (the loads are done) and a
# CTA barrier; the bf16 stores come after.

# %%
def tiled_mma():
    """One 128 x 64 x 16 bf16 MMA of one CTA (cta_group::1), A and B K-major in shared memory."""
    return tc.tiled_mma(tcgen05.MmaF16BF16Op(
        cutlass.BFloat16, cutlass.Float32, (M, N, 16), tcgen05.CtaGroup.ONE,
        tcgen05.OperandSource.SMEM, OperandMajorMode.K, OperandMajorMode.K))


@cute.kernel
def kernel(A: gl, B: gl, mC: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    smem = Shared()
    loaded, done = smem.barriers(1), smem.barriers(1)
    holding = smem.alloc(tmem_address)
    sA, sB = smem.alloc(a_tile), smem.alloc(b_tile)
    if warp.warpid() == 0:
        with warp.elect_leader():
            semaphore(loaded).init(1)  # the TMA bytes land
            semaphore(done).init(1)  # the MMAs are done (tensor_commit)
    init_fence()
    cute.arch.sync_threads()

    mma = tiled_mma()
    alloc = tmem.tensor_allocator(holding.iterator, COLUMNS, ARCH, False, (1, 128), 0)
    if warp.warpid() == 0:
        alloc.allocate()
    alloc.wait_for_alloc()
    base = alloc.retrieve_ptr(cutlass.Float32)
    acc = cute.make_tensor(base, mma.make_fragment_C(mma.partition_shape_C((M, N))).layout)
    gC = mma.get_slice(0).partition_C(mC[None, None, 0])  # before the MMAs change `mma`

    if warp.warpid() == 0:  # loads
        with warp.elect_leader():
            semaphore(loaded).expect_bytes(a_tile.bytes + b_tile.bytes)
        tma.load_async(sA[None, None, 0], A, coord(0, 0), loaded)
        tma.load_async(sB[None, None, 0], B, coord(0, 0), loaded)
    if warp.warpid() == 1:  # MMAs: one thread issues, the tensor core runs them in order
        semaphore(loaded).wait(0)
        tA = mma.make_fragment_A(mma.get_slice(0).partition_A(sA))
        tB = mma.make_fragment_B(mma.get_slice(0).partition_B(sB))
        for kb in cutlass.range_constexpr(K // 16):
            tc.mma_ABt(mma, acc, tA[None, None, kb, 0], tB[None, None, kb, 0],
                       accumulate=kb != 0)
        with warp.elect_leader():
            tc.tensor_commit(done, pair=False)

    semaphore(done).wait(0)  # epilogue: all 128 threads
    tc.fence_after_thread_sync()
    acc, gC = acc[(None, None), 0, 0], gC[(None, None), 0, 0]
    copy = tcgen05.make_tmem_copy(tc.tmem_load_atom(N), acc)
    thr = copy.get_slice(tid)
    src, dst = thr.partition_S(acc), thr.partition_D(gC)
    regs = cute.make_rmem_tensor(dst.shape, cutlass.Float32)
    cute.copy(copy, src, regs)  # tcgen05.ld
    tc.tensor_load_wait()  # tcgen05.wait::ld + fence: the loads are done
    cute.arch.sync_threads()
    if warp.warpid() == 0:
        alloc.relinquish_alloc_permit()
        alloc.free(base, COLUMNS)
    out = cute.make_rmem_tensor(regs.shape, mC.element_type)
    out.store(regs.load().to(mC.element_type))
    cute.autovec_copy(out, dst)


@cute.jit
def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
    """Host: TMA descriptors for the two tiles, one CTA of 128 threads."""
    kernel(gl.load(a, a_tile), gl.load(b, b_tile), c).launch(
        grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


# %% [markdown]
# Operands are small integers in bf16: every product and fp32 sum is exact, so C must equal
# the float64 product rounded once to bf16, element for element. CuTe tensors over CPU
# tensors (`from_dlpack`) compile like GPU ones; the compile needs no GPU.

# %%
def operands(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-3, 4, (M, K, 1), generator=g).to(torch.bfloat16)
    b = torch.randint(-3, 4, (N, K, 1), generator=g).to(torch.bfloat16)
    c = torch.full((M, N, 1), float("nan"), dtype=torch.bfloat16)  # unwritten: NaN
    return a, b, c


def exact(a, b):
    return (a[:, :, 0].double() @ b[:, :, 0].double().T).to(torch.bfloat16)


def cute_args(*tensors):
    return [from_dlpack(t, assumed_align=16) for t in tensors] + [cuda.CUstream(0)]


@functools.cache
def compiled():
    """The kernel compiled for sm_100a: a `Build` (PTX, SASS, resources, lint)."""
    return build(gemm, *cute_args(*operands()), arch=ARCH)


def test_compiles_to_tcgen05():
    b = compiled()
    assert b.ptx_count(r"tcgen05\.mma\.cta_group::1\.kind::f16") == K // 16
    assert b.ptx_count(r"tcgen05\.ld\.sync\.aligned\.32x32b\.x64") == 1
    assert b.ptx_count(r"tcgen05\.wait::ld") == 1
    assert b.sync_findings == []  # the ISA's ordering rules hold on every path


if __name__ == "__main__":
    print("synchronization lint:", compiled().sync_findings or "no findings")
compiled()

# %% [markdown]
# Now run it. `launch.capture` runs the host code of `gemm` against a stand-in for the CUDA
# runtime and records the launch (grid, block, shared memory, the tensor maps' bytes, the
# PTX); `machine.run` executes that PTX on the CPU over a `GlobalMemory` holding the tensors
# at their own addresses. TMA, mbarriers, tensor memory and the MMAs are emulated as the PTX
# ISA describes them; a broken rule is a hazard, a wait that can never finish a deadlock
# naming each blocked warp. `adversarial=True` runs warps in a random (seeded) order and
# completes asynchronous operations as late as possible.

# %%
@functools.cache
def captured():
    """(the launch, a, b, c): the tensors it was captured with (their addresses are in it)."""
    a, b, c = operands()
    return launch.capture(gemm, *cute_args(a, b, c), arch=ARCH), a, b, c


def run_on_cpu(ptx: str | None = None, **options):
    """(a, b, c, machine): the captured launch (its PTX replaced by `ptx`) on a NaN C."""
    ln, a, b, c = captured()
    if ptx is not None:
        ln = dataclasses.replace(ln, ptx=ptx)
    c.fill_(float("nan"))
    mem = GlobalMemory()
    emulated.place(mem, a, b, c)
    return a, b, c, machine.run(ln, mem, **options)


def test_runs_on_the_cpu_exactly():
    for options in ({}, {"adversarial": True, "seed": 1}, {"adversarial": True, "seed": 2}):
        a, b, c, m = run_on_cpu(**options)
        assert m.hazards == [], [str(h) for h in m.hazards]
        assert torch.equal(c[:, :, 0], exact(a, b)), options


if __name__ == "__main__":
    ln = captured()[0]
    print(f"captured: grid {ln.grid}, block {ln.block}, {ln.smem_bytes} B of dynamic shared "
          f"memory, {len(ln.params)} parameters")
    t0 = time.perf_counter()
    a, b, c, m = run_on_cpu()
    print(f"emulated in {time.perf_counter() - t0:.2f} s: {m.executed} warp-instructions, "
          f"hazards {m.hazards}")
    print("C == exact product:", torch.equal(c[:, :, 0], exact(a, b)))
    print(c[:4, :8, 0])

# %% [markdown]
# A broken variant: drop the `tcgen05.wait::ld` from the PTX text. The loads may then still be
# in flight when warp 0 frees their columns. The lint finds it statically (a path from the
# `tcgen05.ld` to the `tcgen05.dealloc` without a wait); the emulator, replaying the edited
# PTX, reports each warp's load still in flight at the dealloc. Here the values happen to come
# out right: the emulator completes a load when its registers are first read, which a GPU
# does not promise.

# %%
def without_wait_ld(ptx: str) -> str:
    new, n = re.subn(r"^\s*tcgen05\.wait::ld\.sync\.aligned;\n", "", ptx, flags=re.M)
    assert n == 1
    return new


def test_broken_variant_is_reported():
    broken = without_wait_ld(captured()[0].ptx)
    assert {f.rule for f in lint(broken)} == {"tmem-ld-wait"}
    *_, m = run_on_cpu(broken)
    assert m.hazards and {h.kind for h in m.hazards} == {"tmem-read-after-release"}


if __name__ == "__main__":
    broken = without_wait_ld(captured()[0].ptx)
    for f in lint(broken):
        print(f"lint: {f.rule} (PTX line {f.line}): {f.message}")
    *_, m = run_on_cpu(broken)
    for h in sorted({str(h) for h in m.hazards}):
        print(f"emulator ({len(m.hazards)} loads): {h}")

# %% [markdown]
# The same machinery runs tk_cute's production kernels. `emulator.gemm.gemm` plans
# `nvfp4.gemm(a, b)` for a GPU you do not have (here Rubin, sm_107a: K = 128 per MMA, a CTA
# pair, the B operand collector), captures the kernel the dispatch picks and runs it on CPU
# tensors; `random_operands` makes NVFP4 operands whose products and sums are exact, so `check`
# compares every element with the exact reference.

# %%
def rubin_nvfp4(m=256, n=256, k=512):
    a, b = emulated.random_operands(m, n, k)
    run = emulated.gemm(a, b, "bfloat16", arch="sm_107a")
    return run, emulated.check(run, a, b)


def test_rubin_nvfp4_gemm_on_the_cpu():
    run, (ok, what) = rubin_nvfp4()
    assert ok, what
    assert run.hazards == []


if __name__ == "__main__":
    run, (ok, what) = rubin_nvfp4()
    c = run.config
    print(f"sm_107a {run.kernel} kernel, tile {c.Mb}x{c.Nb}x{c.Kb}, cluster "
          f"{c.CLUSTER_M}x{c.CLUSTER_N}: {what}; {run.machine.executed} warp-instructions in "
          f"{run.seconds:.2f} s, hazards {run.hazards}")
