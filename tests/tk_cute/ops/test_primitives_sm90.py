"""Hopper primitives, one small kernel each, written with the tk_cute vocabulary.

Every kernel is built once per process for sm_90a (a module-level cache): the CPU tier asserts on
the instruction it must produce; the GPU tier (marker `gpu`) runs the same build on fresh random
inputs with poisoned outputs and checks values against torch. Also here: the trace-time misuse
errors (a tile off the base tile, fp8 mma_AB, a shared-memory budget over the target's, a target
without wgmma), each with the rule in its message.

Kernels: TMA round trip (load_async + semaphore expect_bytes/wait + store_async, a semaphore
phase per tile); semaphore ping-pong over several phases; warpgroup mm/mma ABt (bf16, fp16, fp8
e4m3) and AB (bf16, fp16; B (K, N) N-contiguous) from shared memory, and with A in registers
(ldmatrix); register-tile math and reductions on a wgmma accumulator; stmatrix store + TMA
store; named barrier between two warpgroups with setmaxnreg.

TMA is issued as in the GEMM, by whole warps (ISSUE_RULE below; a CPU test checks every kernel's
SASS for it). A GPU kernel still running after HANG_SECONDS ends the session at once, naming it.
"""

import math
import os
import sys
import time

import pytest
import torch

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr

from tk_cute.compile import build
from tk_cute.ops import register, tma, warp, warpgroup
from tk_cute.types import Shared, coord, gl, rt, semaphore, st, sv
from tk_cute.types.semaphore import init_fence
from tk_cute.types.st import check_smem, smem_bytes

ARCH = "sm_90a"
BF16, F16, E4M3, F32, I32 = (cutlass.BFloat16, cutlass.Float16, cutlass.Float8E4M3FN,
                             cutlass.Float32, cutlass.Int32)
TORCH = {BF16: torch.bfloat16, F16: torch.float16, E4M3: torch.float8_e4m3fn,
         F32: torch.float32, I32: torch.int32}


def _gmem(ptr, rows, cols):
    """A (rows, cols, 1) row-major global tensor at `ptr` (the form `gl` takes)."""
    return cute.make_tensor(ptr, cute.make_layout((rows, cols, 1), stride=(cols, 1, rows * cols)))


def _sync_threads():
    cute.arch.barrier()


# ISSUE_RULE (the GEMM's producer, lcf + PipelineTmaAsync.producer_acquire): TMA loads are issued
# by a whole, converged warp: `cute.copy` of a TMA load atom elects its issuing lane itself with
# `elect.sync` over the full warp, so one elected lane arrives with the bytes (`with
# warp.elect_leader(): sem.expect_bytes(n)`) and the whole warp calls `tma.load_async`. Called from
# an `if tid == 0` branch, that elect.sync waits for the 31 other lanes, which wait at the branch's
# reconvergence point (BSYNC) for lane 0: a deadlock (the first GPU run hung so in _mma_kernel;
# _tma_kernel survived only because its other lanes had exited). TMA stores likewise come from a
# whole warp (the GEMM's finish). test_warp_collectives_run_on_converged_warps pins this on the
# SASS.

# --- TMA round trip: global -> st (load_async, expect_bytes, wait) -> global (store_async) ---
TMA_TILE = st(BF16, 64, 64)
TMA_ROWS, TMA_COLS = 128, 256  # 2 CTAs x 4 tiles each, one semaphore phase per tile


@cute.kernel
def _tma_kernel(src: gl, dst: gl, tiles: cutlass.Constexpr):
    smem = Shared()
    buf = smem.alloc(TMA_TILE)[None, None, 0]
    sem = semaphore(smem.barriers(1))
    tid = cute.arch.thread_idx()[0]
    if tid == 0:
        sem.init(1)
        init_fence()
    _sync_threads()
    # The block is one warp and all of it issues (ISSUE_RULE): no single-thread branch.
    row = cute.arch.block_idx()[0]
    for c in range(tiles):  # a runtime loop: the phase bit is c % 2
        with warp.elect_leader():
            sem.expect_bytes(TMA_TILE.bytes)
        tma.load_async(buf, src, coord(row, c), sem.ptr)
        sem.wait(c % 2)
        tma.store_async(dst, buf, coord(row, c))
        tma.store_commit_group()
        tma.store_async_read_wait(0)  # the store has read buf: the next load may overwrite
    tma.store_async_wait(0)


@cute.jit
def _tma_host(src: cute.Pointer, dst: cute.Pointer, stream):
    s = gl.load(_gmem(src, TMA_ROWS, TMA_COLS), TMA_TILE)
    d = gl.store(_gmem(dst, TMA_ROWS, TMA_COLS), TMA_TILE)
    _tma_kernel(s, d, TMA_COLS // TMA_TILE.cols).launch(
        grid=(TMA_ROWS // TMA_TILE.rows, 1, 1), block=(32, 1, 1), stream=stream)


# --- semaphores: a producer warp and a consumer warp ping-pong through one slot --------------
PHASES = 6


@cute.kernel
def _sem_kernel(out: cute.Tensor):
    smem = Shared()
    slot = smem.alloc(sv(I32, 32))
    bars = smem.barriers(2)
    full, empty = semaphore(bars), semaphore(bars + 1)
    tid = cute.arch.thread_idx()[0]
    warp_id = warp.warpid()
    lane = cute.arch.lane_idx()
    if tid == 0:
        full.init(32)
        empty.init(32)
        init_fence()
    _sync_threads()
    if warp_id == 0:
        for i in range(PHASES):
            if i > 0:
                empty.wait((i - 1) % 2)  # the consumer has read use i - 1 of the slot
            slot[lane, 0] = I32(i * 1000 + lane * 7 + 1)
            full.arrive()
    else:
        for i in range(PHASES):
            full.wait(i % 2)
            out[i * 32 + lane] = slot[lane, 0]
            empty.arrive()


@cute.jit
def _sem_host(out: cute.Pointer, stream):
    _sem_kernel(cute.make_tensor(out, cute.make_layout(PHASES * 32))).launch(
        grid=(1, 1, 1), block=(64, 1, 1), stream=stream)


# --- warpgroup MMAs: C (64, N) fp32 = A (64, 2 Kb) @ B over two K blocks ---------------------
MMA_M, MMA_N = 64, 128


def _kb(dtype):
    return 128 if dtype.width == 8 else 64  # 4 wgmma K-steps per block (K = 16 or 32)


def _mma_tiles(dtype, form):
    kb = _kb(dtype)
    b = st(dtype, MMA_N, kb) if form == "ABt" else st(dtype, kb, MMA_N)
    return st(dtype, MMA_M, kb), b


@cute.kernel
def _mma_kernel(A: gl, B: gl, C: cute.Tensor, form: cutlass.Constexpr, a_regs: cutlass.Constexpr):
    a_t, b_t = A.tile, B.tile
    smem = Shared()
    sa, sb = smem.alloc(a_t, 2), smem.alloc(b_t, 2)
    sem = semaphore(smem.barriers(1))
    tid = cute.arch.thread_idx()[0]
    _load_stages(A, B, sa, sb, sem, tid, 2, form == "AB")

    tiled = warpgroup.tiled_mma(a_t.dtype, MMA_N)
    acc = rt.accumulator(tiled, tid, MMA_M, MMA_N)
    acc.frag.fill(math.nan)  # mm_* must overwrite, not accumulate
    mm = warpgroup.mm_ABt if cutlass.const_expr(form == "ABt") else warpgroup.mm_AB
    mma = warpgroup.mma_ABt if cutlass.const_expr(form == "ABt") else warpgroup.mma_AB
    a0, a1 = sa[None, None, 0], sa[None, None, 1]
    if cutlass.const_expr(a_regs):  # RS form: A from registers, loaded with ldmatrix
        r0 = rt.operand_A(tiled, tid, MMA_M, a_t.cols)
        r1 = rt.operand_A(tiled, tid, MMA_M, a_t.cols)
        warpgroup.load(r0, a0)
        warpgroup.load(r1, a1)
        a0, a1 = r0, r1
    warpgroup.mma_fence()
    mm(acc, a0, sb[None, None, 0])
    mma(acc, a1, sb[None, None, 1])
    warpgroup.mma_commit_group()
    warpgroup.mma_async_wait(0)
    warpgroup.store_global(C, acc)


@cute.kernel
def _loop_kernel(A: gl, B: gl, C: cute.Tensor, steps: cutlass.Int32):
    """MMAs in a runtime K loop, then an epilogue through the accumulator's own MMA: the
    regression of the accumulate field escaping the loop ("operand does not dominate")."""
    a_t, b_t = A.tile, B.tile
    smem = Shared()
    sa, sb = smem.alloc(a_t, 2), smem.alloc(b_t, 2)
    sem = semaphore(smem.barriers(1))
    tid = cute.arch.thread_idx()[0]
    _load_stages(A, B, sa, sb, sem, tid, 2, False)
    acc = rt.accumulator(warpgroup.tiled_mma(a_t.dtype, MMA_N), tid, MMA_M, MMA_N)
    register.zero(acc)
    warpgroup.mma_fence()
    for k in cutlass.range(steps, unroll=1):
        warpgroup.mma_ABt(acc, sa[None, None, 0], sb[None, None, 0], accumulate=k > 0)
        warpgroup.mma_commit_group()
        warpgroup.mma_async_wait(0)
    warpgroup.store_global(C, acc)


@cute.jit
def _loop_host(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer, steps: cutlass.Int32,
               stream):
    a_t, b_t = _mma_tiles(a.dtype, "ABt")
    kb = a_t.cols
    _loop_kernel(gl.load(_gmem(a, MMA_M, 2 * kb), a_t), gl.load(_gmem(b, MMA_N, 2 * kb), b_t),
                 cute.make_tensor(c, cute.make_layout((MMA_M, MMA_N), stride=(MMA_N, 1))),
                 steps).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


@cute.jit
def _mma_host(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer, stream,
              form: cutlass.Constexpr, a_regs: cutlass.Constexpr):
    a_t, b_t = _mma_tiles(a.dtype, form)
    kb = a_t.cols
    gb = (_gmem(b, MMA_N, 2 * kb) if cutlass.const_expr(form == "ABt")
          else _gmem(b, 2 * kb, MMA_N))
    _mma_kernel(gl.load(_gmem(a, MMA_M, 2 * kb), a_t), gl.load(gb, b_t),
                cute.make_tensor(c, cute.make_layout((MMA_M, MMA_N), stride=(MMA_N, 1))),
                form, a_regs).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


# --- register-tile math on a wgmma accumulator (64 x 64, one warpgroup) ---------------------
RM, RN, RK = 64, 64, 64
REG_OUTS = ("acc", "mul", "add_tile", "add_scalar", "mul_row", "mul_col", "zero", "copy_back")


def _store_vec(out, t: rt, v, axis: int, warp_id=None):
    """out[row] (axis 0) or out[warp_id, col] (axis 1) = v at that row/col: every thread holding
    an element writes its slot (threads that share a row hold the same reduced value)."""
    coords = t.coords()
    for i in range(cute.size(t.frag)):  # a plain helper: Python loops unroll at trace time
        if axis == 0:
            out[coords[i][0]] = v.frag[v.index[i]]
        else:
            out[warp_id, coords[i][1]] = v.frag[v.index[i]]


@cute.jit
def _load_stages(A: gl, B: gl, sa, sb, sem, tid, stages: cutlass.Constexpr = 1,
                 b_k_rows: cutlass.Constexpr = False):
    """Stages k < `stages` of `sa` / `sb` <- K tile k of A / B (B's K along its rows if
    `b_k_rows`: the AB form) through one semaphore phase: thread 0 initialises it, warp 0
    issues the TMA loads, every thread waits."""
    if tid == 0:
        sem.init(1)
        init_fence()
    _sync_threads()
    if warp.warpid() == 0:  # a whole warp issues TMA loads (see ISSUE_RULE)
        with warp.elect_leader():
            sem.expect_bytes(stages * (A.tile.bytes + B.tile.bytes))
        for k in cutlass.range_constexpr(stages):
            tma.load_async(sa[None, None, k], A, coord(0, k), sem.ptr)
            tma.load_async(sb[None, None, k], B, coord(k, 0) if b_k_rows else coord(0, k),
                           sem.ptr)
    sem.wait(0)


def _product_ABt(sa, sb, tid):
    """The warpgroup's RM x RN fp32 accumulator of A @ B^T (one wgmma batch, waited for)."""
    acc = rt.accumulator(warpgroup.tiled_mma(BF16, RN), tid, RM, RN)
    warpgroup.mma_fence()
    warpgroup.mm_ABt(acc, sa[None, None, 0], sb[None, None, 0])
    warpgroup.mma_commit_group()
    warpgroup.mma_async_wait(0)
    return acc


@cute.kernel
def _reg_kernel(A: gl, B: gl, T: cute.Tensor, Cb: cute.Tensor, V: cute.Tensor, W: cute.Tensor):
    smem = Shared()
    sa, sb = smem.alloc(A.tile), smem.alloc(B.tile)
    sem = semaphore(smem.barriers(1))
    tid = cute.arch.thread_idx()[0]
    _load_stages(A, B, sa, sb, sem, tid)
    acc = _product_ABt(sa, sb, tid)
    warp_id = warp.warpid()

    t, u = acc.like(), acc.like()
    warpgroup.store_global(T[0, None, None], acc)
    register.mul(t, acc, -0.75)
    warpgroup.store_global(T[1, None, None], t)
    low = acc.like(BF16)
    register.copy(low, acc)  # fp32 -> bf16 (round to nearest even)
    warpgroup.store_global(Cb, low)
    register.copy(t, low)  # bf16 -> fp32 (exact)
    warpgroup.store_global(T[7, None, None], t)
    register.add(u, acc, t)  # tile + tile (no product nearby for the compiler to fuse into an FMA)
    warpgroup.store_global(T[2, None, None], u)
    register.add(u, acc, 2.5)
    warpgroup.store_global(T[3, None, None], u)
    rmax, rsum = register.row_max(acc), register.row_sum(acc)
    cmax, csum = register.col_max(acc), register.col_sum(acc)
    register.mul_row(u, acc, rmax)
    warpgroup.store_global(T[4, None, None], u)
    register.mul_col(u, acc, csum)
    warpgroup.store_global(T[5, None, None], u)
    register.zero(u)
    warpgroup.store_global(T[6, None, None], u)
    _store_vec(V[0, None], acc, rmax, 0)
    _store_vec(V[1, None], acc, rsum, 0)
    _store_vec(W[0, None, None], acc, cmax, 1, warp_id)
    _store_vec(W[1, None, None], acc, csum, 1, warp_id)


@cute.jit
def _reg_host(a: cute.Pointer, b: cute.Pointer, t: cute.Pointer, cb: cute.Pointer,
              v: cute.Pointer, w: cute.Pointer, stream):
    tile = st(BF16, RM, RK)
    n = len(REG_OUTS)
    _reg_kernel(
        gl.load(_gmem(a, RM, RK), tile), gl.load(_gmem(b, RN, RK), st(BF16, RN, RK)),
        cute.make_tensor(t, cute.make_layout((n, RM, RN), stride=(RM * RN, RN, 1))),
        cute.make_tensor(cb, cute.make_layout((RM, RN), stride=(RN, 1))),
        cute.make_tensor(v, cute.make_layout((2, RM), stride=(RM, 1))),
        cute.make_tensor(w, cute.make_layout((2, 4, RN), stride=(4 * RN, RN, 1))),
    ).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


# --- warpgroup.store (stmatrix) of an accumulator in two column blocks, then TMA stores ------
EPI = st(BF16, RM, 32)


@cute.kernel
def _epi_kernel(A: gl, B: gl, Cg: gl, Cf: cute.Tensor):
    smem = Shared()
    sa, sb = smem.alloc(A.tile), smem.alloc(B.tile)
    sc = smem.alloc(EPI, 2)
    sem = semaphore(smem.barriers(1))
    tid = cute.arch.thread_idx()[0]
    _load_stages(A, B, sa, sb, sem, tid)
    acc = _product_ABt(sa, sb, tid)
    warp_id = warp.warpid()
    warpgroup.store_global(Cf, acc)
    group = warpgroup.sync(1, 1)
    for i in cutlass.range_constexpr(RN // EPI.cols):
        warpgroup.store(sc[None, None, i], acc, tid, subtile=i)
        group()  # every thread's stmatrix has landed before warp 0 issues the TMA store
        if warp_id == 0:  # as the GEMM's finish (`thread < 32`): a whole warp, no lone thread
            tma.store_async(Cg, sc[None, None, i], coord(0, i))
            tma.store_commit_group()
    if warp_id == 0:
        tma.store_async_wait(0)


@cute.jit
def _epi_host(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer, cf: cute.Pointer, stream):
    _epi_kernel(
        gl.load(_gmem(a, RM, RK), st(BF16, RM, RK)), gl.load(_gmem(b, RN, RK), st(BF16, RN, RK)),
        gl.store(_gmem(c, RM, RN), EPI),
        cute.make_tensor(cf, cute.make_layout((RM, RN), stride=(RN, 1))),
    ).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


# --- named barrier between two warpgroups, with setmaxnreg --------------------------------
@cute.kernel
def _bar_kernel(out: cute.Tensor, spin: cutlass.Int64):
    smem = Shared()
    buf = smem.alloc(sv(I32, 128))
    tid = cute.arch.thread_idx()[0]
    both = warpgroup.sync(1, 2)
    if warpgroup.groupid() == 0:
        warpgroup.decrease_registers(40)
        start = cute.arch.clock64()
        while cute.arch.clock64() - start < spin:  # a late writer: a broken barrier shows
            pass
        cute.arch.sync_warp()  # reconverged before the .aligned bar.sync, whatever the clocks did
        buf[tid, 0] = I32(tid * 3 + 1)
        both()
    else:
        warpgroup.increase_registers(232)
        both()
        out[tid - 128] = buf[tid - 128, 0]


@cute.jit
def _bar_host(out: cute.Pointer, spin: cutlass.Int64, stream):
    _bar_kernel(cute.make_tensor(out, cute.make_layout(128)), spin).launch(
        grid=(1, 1, 1), block=(256, 1, 1), min_blocks_per_mp=1, stream=stream)


# --- build cache ---------------------------------------------------------------------------
def _ptr(dtype, t=None):
    return make_ptr(dtype, 0 if t is None else t.data_ptr(), cute.AddressSpace.gmem,
                    assumed_align=16)


def _stream(gpu=False):
    from cuda.bindings import driver as cuda

    if gpu:
        from tk_cute.runtime import stream

        return stream()
    return cuda.CUstream(0)


MMA_CASES = {  # name -> (dtype, form, A in registers)
    "ss_abt_bf16": (BF16, "ABt", False),
    "ss_abt_fp16": (F16, "ABt", False),
    "ss_abt_e4m3": (E4M3, "ABt", False),
    "ss_ab_bf16": (BF16, "AB", False),
    "ss_ab_fp16": (F16, "AB", False),
    "rs_abt_bf16": (BF16, "ABt", True),
    "rs_ab_fp16": (F16, "AB", True),
}


def _args(name):
    s = _stream()
    if name == "tma":
        return _tma_host, (_ptr(BF16), _ptr(BF16), s)
    if name == "sem":
        return _sem_host, (_ptr(I32), s)
    if name in MMA_CASES:
        dtype, form, regs = MMA_CASES[name]
        return _mma_host, (_ptr(dtype), _ptr(dtype), _ptr(F32), s, form, regs)
    if name == "reg":
        return _reg_host, (_ptr(BF16), _ptr(BF16), _ptr(F32), _ptr(BF16), _ptr(F32),
                           _ptr(F32), s)
    if name == "epi":
        return _epi_host, (_ptr(BF16), _ptr(BF16), _ptr(BF16), _ptr(F32), s)
    if name == "bar":
        return _bar_host, (_ptr(I32), cutlass.Int64(0), s)
    if name == "loop":
        return _loop_host, (_ptr(BF16), _ptr(BF16), _ptr(F32), cutlass.Int32(3), s)
    raise KeyError(name)


_BUILDS = {}


def built(name):
    """The sm_90a build of kernel `name`, compiled once per process."""
    if name not in _BUILDS:
        fn, args = _args(name)
        _BUILDS[name] = build(fn, *args, arch=ARCH)
    return _BUILDS[name]


# --- CPU: each kernel produces its instruction ---------------------------------------------
TMA_LOAD = r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global\.tile\.mbarrier::complete_tx::bytes"
TMA_STORE = r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group"


def test_mma_in_a_runtime_loop_then_an_epilogue_builds():
    b = built("loop")  # failed to build while the MMA call set the tile's own MMA's state
    assert b.sass_count("HGMMA") == 4 and b.kernel.local_bytes == 0


def test_tma_round_trip_compiles_to_bulk_tensor_copies_and_mbarrier_waits():
    b = built("tma")
    # (the compiler may peel the tile loop: at least one of each)
    for pattern in (TMA_LOAD, TMA_STORE, r"mbarrier\.arrive\.expect_tx",
                    r"mbarrier\.try_wait\.parity", r"cp\.async\.bulk\.wait_group\.read"):
        assert b.ptx_count(pattern) >= 1, pattern
    assert b.sass_count(r"\bUTMALDG\b") >= 1 and b.sass_count(r"\bUTMASTG\b") >= 1


def test_semaphore_compiles_to_mbarrier_init_arrive_try_wait():
    b = built("sem")
    assert b.ptx_count(r"mbarrier\.init\.shared") == 2
    assert b.ptx_count(r"mbarrier\.arrive\.shared\.b64") >= 2  # full and empty
    assert b.ptx_count(r"mbarrier\.try_wait\.parity") >= 2


def _wgmma(dtype, n):
    k = 32 if dtype.width == 8 else 16
    t = {BF16: "bf16", F16: "f16", E4M3: "e4m3"}[dtype]
    return rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k{k}\.f32\.{t}\.{t}"


@pytest.mark.parametrize("name", list(MMA_CASES))
def test_mma_compiles_to_the_wgmma_form(name):
    dtype, form, regs = MMA_CASES[name]
    b = built(name)
    inst = _wgmma(dtype, MMA_N)
    # 2 K blocks x 4 K-steps, each one wgmma; A from shared memory is a 64-bit descriptor (SS),
    # from registers a brace list of 4 32-bit registers (RS).
    a_operand = r"\{%r\d+, %r\d+, %r\d+, %r\d+\}" if regs else r"%rd\d+"
    assert b.ptx_count(inst) == 8
    assert b.ptx_count(inst + r"\s*\{[^}]*\},\s*" + a_operand + r",\s*%rd\d+") == 8
    # the transpose immediates (16-bit types): tnspA = 0 (K-major A), tnspB = 1 for AB (B MN-major)
    if dtype.width == 16:
        tnsp_b = "1" if form == "AB" else "0"
        tnsp = (r"0,\s*" if not regs else "") + tnsp_b  # RS has no tnspA immediate
        tail = r",\s*1,\s*1,\s*" + tnsp + ";"
        assert b.ptx_count(inst + r".*" + tail) == 8
    assert b.sass_count("QGMMA" if dtype.width == 8 else "HGMMA") == 8
    assert b.ptx_count(r"wgmma\.fence") >= 1 and b.ptx_count(r"wgmma\.commit_group") == 1
    assert b.ptx_count(r"wgmma\.wait_group\.sync\.aligned\s+0") == 1
    if regs:
        assert b.ptx_count(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16") > 0
    assert b.kernel.local_bytes == 0


def test_register_ops_compile_to_shuffles_and_no_local_memory():
    b = built("reg")
    # row reductions: 2 rows x 2 lanes (xor 1, 2) x {max, sum}; columns: 16 cols x 3 lanes x 2
    assert b.ptx_count(r"shfl\.sync\.bfly\.b32") == 2 * 2 * 2 + 16 * 3 * 2
    assert b.ptx_count(r"max\.f32") > 0
    assert b.ptx_count(r"cvt\.rn\.bf16x2\.f32|cvt\.rn\.bf16\.f32") > 0
    assert b.kernel.local_bytes == 0


def test_store_compiles_to_stmatrix_named_barrier_and_tma_store():
    b = built("epi")
    assert b.ptx_count(r"stmatrix\.sync\.aligned\.(m8n8\.)?x4") > 0
    assert b.ptx_count(r"(bar|barrier)\.sync(\.aligned)?\s+1,\s*128") == 2
    assert b.ptx_count(TMA_STORE) == 2
    assert b.ptx_count(r"fence\.proxy\.async\.shared::cta") >= 2


def test_named_barrier_and_setmaxnreg():
    b = built("bar")
    assert b.ptx_count(r"(bar|barrier)\.sync(\.aligned)?\s+1,\s*256") == 2
    assert b.ptx_count(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40") == 1
    assert b.ptx_count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232") == 1
    # ptxas keeps setmaxnreg only when it knows the register count at entry: the launch must
    # carry min_blocks_per_mp (.minnctapersm); without it both are silently dropped.
    assert b.sass_count(r"USETMAXREG\.DEALLOC") == 1 and b.sass_count(r"USETMAXREG\.TRY_ALLOC") == 1


def test_consumer_registers_fit_what_the_producer_gives_back():
    """setmaxnreg.inc spins until the block's pool holds the registers (USETMAXREG.TRY_ALLOC in
    a loop), and only the block's own .dec refills it: the templates' splits must fit."""
    from tk_cute.templates.lcf import LCF

    assert [warpgroup.entry_registers(t) for t in (128, 384, 640, 1024)] == [256, 168, 96, 64]
    assert warpgroup.consumer_registers(384, 40, 2) == 232
    assert warpgroup.consumer_registers(640, 40, 4) == 104  # 96 + 56 // 4 = 110, down to 8s
    assert warpgroup.consumer_registers(640, 48, 4, cap=100) == 96
    for t in (LCF,):
        threads = (1 + t.NUM_CONSUMERS) * warpgroup.WARPGROUP_THREADS
        assert t.CONSUMER_REGISTERS <= warpgroup.consumer_registers(
            threads, t.PRODUCER_REGISTERS, t.NUM_CONSUMERS), t.__name__


_LAYOUTS = []


@cute.jit
def _mn_major_layouts(dtype: cutlass.Constexpr, k: cutlass.Constexpr, n: cutlass.Constexpr):
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.tensor_utils import LayoutEnum

    mine = st(dtype, k, n).layout(2)
    ref = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (64, n, k), dtype, 2)
    _LAYOUTS.append((str(mine.inner), str(cute.select(mine.outer, mode=[1, 0, 2])),
                     str(ref.inner), str(ref.outer)))


@pytest.mark.parametrize("rows, groups, cols, epi, transposed", [
    (128, 2, 160, 16, False), (64, 1, 128, 32, True), (192, 3, 176, 16, False),
    (256, 2, 160, 16, False),  # two 64-row slices per warpgroup
    (256, 2, 192, 32, False), (256, 2, 128, 32, True)])
def test_store_blocks_take_every_accumulator_element_to_its_place(rows, groups, cols, epi,
                                                                  transposed):
    """`warpgroup.block_elements`, evaluated on identity tensors while tracing: for every
    column block of a (rows, cols) accumulator of `groups` warpgroups (rows / 64 / groups
    slices each), the register element each block slot takes is the one the copy puts at that
    slot's place of the (rows, epi) shared block (or its transpose), shifted by the block's
    columns; every accumulator element of the thread is taken once."""
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import OperandMajorMode

    from tk_cute.compile import COMPILE_LOCK

    found = []

    @cute.jit
    def trace():
        mma = sm90_utils.make_trivial_tiled_mma(BF16, BF16, OperandMajorMode.K,
                                                OperandMajorMode.K, F32, (groups, 1, 1),
                                                tiler_mn=(64, cols))
        for thread in cutlass.range_constexpr(0, groups * 128, 19):
            acc = rt.accumulator(mma, thread, rows, cols)
            copy = warpgroup._smem_store_copy(BF16, acc, transposed)
            thr = copy.get_slice(thread)
            have = copy.retile(acc.thr_mma.partition_C(cute.make_identity_tensor((rows, cols))))
            block = cute.make_identity_tensor((epi, rows) if transposed else (rows, epi))
            if cutlass.const_expr(transposed):
                block = cute.make_tensor(block.iterator, cute.select(block.layout, mode=[1, 0]))
            want = thr.partition_S(block)
            taken = []
            for sub in cutlass.range_constexpr(cols // epi):
                for b, a in warpgroup.block_elements(cute.shape(want)[:3],
                                                     cute.size(have, mode=[0]), sub):
                    r, c = (want[b][1], want[b][0]) if transposed else tuple(want[b])
                    found.append((tuple(have[a]), (r, c + sub * epi)))
                    taken.append(a)
            found.append(("taken", sorted(taken) == list(range(cute.size(have)))))

    with COMPILE_LOCK:  # host-only: the layouts are evaluated while tracing
        cute.compile(trace, options=f"--gpu-arch {ARCH}")
    pairs = [f for f in found if f[0] != "taken"]
    taken = [f[1] for f in found if f[0] == "taken"]
    assert len(taken) == len(range(0, groups * 128, 19)) and all(taken)  # every thread traced
    assert len(pairs) == len(taken) * rows * cols // (groups * 128)
    assert all(have == want for have, want in pairs)


@pytest.mark.parametrize("dtype, k, n", [(BF16, 64, 128), (F16, 64, 32), (BF16, 32, 256)])
def test_st_k_by_n_is_cutlass_mn_major_b_transposed(dtype, k, n):
    """mma_AB reads a plain st(dtype, K, N) as an MN-major B: pin that its layout, modes
    swapped, is the one CUTLASS makes for an MN-major (N, K) B (swizzle, shape and strides)."""
    _LAYOUTS.clear()
    _mn_major_layouts(dtype, k, n)
    (inner, outer_t, ref_inner, ref_outer), = _LAYOUTS
    assert (inner, outer_t) == (ref_inner, ref_outer)


KERNELS = ["tma", "sem", *MMA_CASES, "reg", "epi", "bar"]


@pytest.mark.parametrize("name", KERNELS)
def test_warp_collectives_run_on_converged_warps(name):
    """ISSUE_RULE, checked on the SASS. At a warp collective (the elect.sync inside a TMA load,
    shuffles, ...) that ptxas cannot prove converged it emits a divergent fallback (`BRA.DIV` to
    a `WARPSYNC.COLLECTIVE` path); a TMA load issued from an `if tid == 0` branch compiles to
    one, and that path deadlocks (the hung first GPU run: 4 in _mma_kernel, 2 in _epi_kernel).
    The GEMM has none, and neither may these kernels."""
    b = built(name)
    assert b.sass_count(r"\bBRA\.DIV\b") == 0, "a warp collective in possibly divergent code"
    assert b.sass_count(r"WARPSYNC\.COLLECTIVE") == 0


# --- CPU: misuse fails at trace time, naming the rule ---------------------------------------
def test_st_rows_must_be_a_multiple_of_the_base_tile():
    with pytest.raises(ValueError, match="multiple of 8"):
        st(BF16, 60, 64)
    with pytest.raises(ValueError, match="multiple of 32 bytes"):
        st(BF16, 64, 8)


@cute.kernel
def _misuse_kernel(case: cutlass.Constexpr):
    tid = cute.arch.thread_idx()[0]
    dtype = E4M3 if cutlass.const_expr(case == "fp8_ab") else BF16
    tiled = warpgroup.tiled_mma(dtype, 64)
    if cutlass.const_expr(case == "acc_rows"):
        rt.accumulator(tiled, tid, 48, 64)
    if cutlass.const_expr(case == "acc_cols"):
        rt.accumulator(tiled, tid, 64, 60)
    if cutlass.const_expr(case == "mma_cols"):
        warpgroup.tiled_mma(BF16, 264)
    if cutlass.const_expr(case == "operand_k"):
        rt.operand_A(tiled, tid, 64, 24)
    smem = Shared()
    if cutlass.const_expr(case == "smem"):
        smem.alloc(st(BF16, 256, 128), 4)  # 256 KiB
    a = smem.alloc(st(dtype, 64, 128))[None, None, 0]
    b = smem.alloc(st(dtype, 128, 64))[None, None, 0]
    acc = rt.accumulator(tiled, tid, 64, 64)
    warpgroup.mma_AB(acc, a, b)


@cute.jit
def _misuse_host(case: cutlass.Constexpr):
    _misuse_kernel(case).launch(grid=(1, 1, 1), block=(128, 1, 1))


@pytest.mark.parametrize("case, error, match", [
    ("acc_rows", ValueError, r"rows=48 must be a positive multiple of 64 .*wgmma M = 64"),
    ("acc_cols", ValueError, r"cols=60 must be a positive multiple of 64 .*wgmma N is a multiple "
                             r"of 8"),
    ("mma_cols", ValueError, r"N = 264: wgmma N is a multiple of 8 from 8 to 256"),
    ("operand_k", ValueError, r"cols=24 must be a positive multiple of 16"),
    ("fp8_ab", TypeError, r"wgmma reads 8-bit operands K-major only"),
    ("smem", ValueError, r"262\d+ bytes requested, sm_90a gives a block at most 232448 bytes"),
])
def test_misuse_fails_at_trace_time(case, error, match):
    with pytest.raises(error, match=match):
        build(_misuse_host, case, arch=ARCH)


def test_wgmma_on_a_target_without_it_names_sm90a():
    with pytest.raises(ValueError, match=r"wgmma .* exists only on sm_90a; this build targets "
                                         r"sm_100a"):
        build(_misuse_host, "none", arch="sm_100a")


def test_check_smem_names_both_numbers():
    tiles = [(st(BF16, 128, 64), 4), (st(BF16, 256, 64), 4)]
    need = smem_bytes(*tiles, barriers=8)
    assert check_smem(need, ARCH) == need  # 192 KiB + barriers fits 227 KiB
    over = smem_bytes((st(BF16, 128, 64), 6), (st(BF16, 256, 64), 6))  # 288 KiB
    with pytest.raises(ValueError, match=rf"{over} bytes requested, sm_90a gives a block at most "
                                         rf"{227 * 1024} bytes"):
        check_smem(over, ARCH)
    assert check_smem(over, "sm_107a") == over  # Rubin's 327 KiB holds it


# --- GPU: values against torch --------------------------------------------------------------
HANG_SECONDS = 20  # every kernel here runs for well under a millisecond


def _run(name, *args):
    """Launch build `name` on torch's stream and wait for it, at most HANG_SECONDS. A kernel
    still running by then is hung, and it keeps the GPU busy: every later test in this process
    would hang behind it until its own timeout. So name the kernel and end the process at once
    (as pytest-timeout does: os._exit, no teardown that could wait on the GPU)."""
    built(name).compiled(*args, _stream(gpu=True))
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + HANG_SECONDS
    while not done.query():  # raises on a launch error
        if time.monotonic() > deadline:
            sys.stdout.flush()
            sys.stderr.write(f"\nHUNG: kernel {name!r} did not finish within {HANG_SECONDS} s; "
                             "the GPU is stuck, stopping the session (exit code 3)\n")
            sys.stderr.flush()
            os._exit(3)
        time.sleep(1e-3)
    torch.cuda.synchronize()


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.gpu
def test_tma_round_trip_is_bit_exact(seed):
    src = torch.randn(TMA_ROWS, TMA_COLS, device="cuda").bfloat16()
    dst = torch.full_like(src, float("nan"))
    _run("tma", _ptr(BF16, src), _ptr(BF16, dst))
    assert torch.equal(_bits(dst), _bits(src))


@pytest.mark.gpu
def test_semaphore_phases_hand_over_every_value():
    out = torch.full((PHASES * 32,), -1, dtype=torch.int32, device="cuda")
    _run("sem", _ptr(I32, out))
    i, lane = torch.arange(PHASES).view(-1, 1), torch.arange(32).view(1, -1)
    assert torch.equal(out.cpu().view(PHASES, 32), (i * 1000 + lane * 7 + 1).int())


def _operand(dtype, *shape):
    x = torch.randn(*shape, device="cuda")
    return x.to(TORCH[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MMA_CASES))
def test_mma_matches_torch(seed, name):
    dtype, form, regs = MMA_CASES[name]
    k = 2 * _kb(dtype)
    a = _operand(dtype, MMA_M, k)
    b = _operand(dtype, MMA_N, k) if form == "ABt" else _operand(dtype, k, MMA_N)
    c = torch.full((MMA_M, MMA_N), float("nan"), device="cuda")
    _run(name, _ptr(dtype, a), _ptr(dtype, b), _ptr(F32, c))
    bt = b.double().t() if form == "ABt" else b.double()
    ref = a.double() @ bt
    assert not c.isnan().any(), "unwritten outputs, or mm_ accumulated into the NaN poison"
    # Products of 16-bit/fp8 values are exact in fp32. K = 128 additions into an fp32
    # accumulator, even truncating (2^-23 each), stay within K * 2^-23 = 2^-16 of sum|a*b|:
    # bound 2^-14. wgmma's fp8 accumulator keeps about 14 bits (DeepSeek-V3 §3.3.2): over
    # K = 256 random-sign terms ~2^-10 of sum|a*b|: bound 2^-7. A misplaced fragment is O(1).
    scale = a.double().abs() @ bt.abs()
    tol = (2**-7 if dtype.width == 8 else 2**-14) * scale
    assert ((c.double() - ref).abs() <= tol).all(), f"max error {(c.double() - ref).abs().max()}"


@pytest.mark.gpu
def test_register_ops_match_torch(seed):
    a, b = _operand(BF16, RM, RK), _operand(BF16, RN, RK)
    t = torch.full((len(REG_OUTS), RM, RN), float("nan"), device="cuda")
    cb = torch.full((RM, RN), float("nan"), device="cuda", dtype=torch.bfloat16)
    v = torch.full((2, RM), float("nan"), device="cuda")
    w = torch.full((2, 4, RN), float("nan"), device="cuda")
    _run("reg", *(_ptr(d, x) for d, x in ((BF16, a), (BF16, b), (F32, t), (BF16, cb), (F32, v),
                                         (F32, w))))
    assert not any(x.isnan().any() for x in (t, cb, v, w)), "unwritten outputs"
    out = dict(zip(REG_OUTS, t))
    acc = out["acc"]
    ref = a.double() @ b.double().t()
    scale = a.double().abs() @ b.double().abs().t()
    assert ((acc.double() - ref).abs() <= 2**-14 * scale).all()  # K = 64: see test_mma
    # Element-wise ops on the kernel's own accumulator are single fp32 roundings: exact
    # against the same fp32 operations in torch.
    assert torch.equal(out["mul"], acc * -0.75)
    assert torch.equal(out["add_tile"], acc + acc.bfloat16().float())
    assert torch.equal(out["add_scalar"], acc + 2.5)
    assert torch.equal(out["zero"], torch.zeros_like(acc))
    assert torch.equal(_bits(cb), _bits(acc.bfloat16()))  # copy: round to nearest even
    assert torch.equal(out["copy_back"], acc.bfloat16().float())
    # Reductions: max is exact; sums of 64 (rows) or 16 (a warp's column) fp32 values in another
    # order differ by at most n * 2^-24 of sum|x|.
    rmax = acc.amax(1)
    assert torch.equal(v[0], rmax)
    assert ((v[1] - acc.sum(1)).abs() <= 64 * 2**-24 * acc.abs().sum(1)).all()
    per_warp = acc.view(4, 16, RN)  # col_* reduce over each warp's 16 rows of the 64
    assert torch.equal(w[0], per_warp.amax(1))
    assert ((w[1] - per_warp.sum(1)).abs() <= 16 * 2**-24 * per_warp.abs().sum(1)).all()
    assert torch.equal(out["mul_row"], acc * v[0].view(-1, 1))
    warp_of_row = torch.arange(RM, device="cuda") // 16
    assert torch.equal(out["mul_col"], acc * w[1][warp_of_row])


@pytest.mark.gpu
def test_stmatrix_store_then_tma_store_matches_the_accumulator(seed):
    a, b = _operand(BF16, RM, RK), _operand(BF16, RN, RK)
    c = torch.full((RM, RN), float("nan"), device="cuda", dtype=torch.bfloat16)
    cf = torch.full((RM, RN), float("nan"), device="cuda")
    _run("epi", _ptr(BF16, a), _ptr(BF16, b), _ptr(BF16, c), _ptr(F32, cf))
    ref = a.double() @ b.double().t()
    assert ((cf.double() - ref).abs() <= 2**-14 * (a.double().abs() @ b.double().abs().t())).all()
    assert torch.equal(_bits(c), _bits(cf.bfloat16()))  # stmatrix + TMA move bits exactly


@pytest.mark.gpu
def test_named_barrier_orders_two_warpgroups():
    out = torch.full((128,), -1, dtype=torch.int32, device="cuda")
    _run("bar", _ptr(I32, out), cutlass.Int64(200_000))  # ~0.1 ms late writer
    assert torch.equal(out.cpu(), torch.arange(128, dtype=torch.int32) * 3 + 1)
