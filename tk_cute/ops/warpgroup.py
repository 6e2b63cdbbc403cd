"""Warpgroup scope (4 consecutive warps, 128 threads): TK's `warpgroup::` namespace on Hopper.

MMAs are wgmma (`cute.nvgpu.warpgroup`): `mma_ABt(acc, a, b)` accumulates a @ b^T into the
register tile `acc` from shared tiles a (rows, K) and b (cols, K); `mm_ABt` overwrites instead of
accumulating. `mma_AB` takes b as (K, cols) with cols contiguous (MN-major B; 16-bit types
only: wgmma reads 8-bit operands K-major, so fp8 exists only as ABt). A may come from registers
(`rt` operand tile: RS form) or shared memory (SS form). MMAs are asynchronous: `mma_fence()`
before the first one that touches registers written by ordinary code, `mma_commit_group()` after
a batch, `mma_async_wait(n)` until at most `n` batches are in flight.

`tiled_mma(dtype, cols)` makes the wgmma tiled MMA an accumulator is laid out by; the MMA
functions derive its RS / MN-major-B variants themselves. wgmma exists only on sm_90a: building
any of these for another target raises at trace time, naming sm_90a.

Also: register reallocation (`increase_registers` / `decrease_registers`, setmaxnreg: needs
sm_90a, a block whose warpgroups each take one branch, and a launch with `min_blocks_per_mp`:
without it ptxas does not know the register count at entry and silently drops setmaxnreg;
`consumer_registers` says how far consumers may rise beside a producer warpgroup),
`load` of a shared tile into a register operand tile (ldmatrix), `store` of a register tile
into a shared tile (stmatrix; plain stores for fp32), `store_global` of a register tile into
global memory, and `sync` of a set of warpgroups on a named barrier.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode
from cutlass.cute.nvgpu import warpgroup as wg

from tk_cute.types.rt import WGMMA_M, rt, wgmma_variant

WARPGROUP_THREADS = 128
WGMMA_ARCH = "sm_90a"


def compile_arch() -> str:
    """The target the DSL is tracing for (the `--gpu-arch` compile option or CUTE_DSL_ARCH)."""
    from cutlass.cutlass_dsl import CuTeDSL

    return str(CuTeDSL._get_dsl().get_arch_enum())


def _require_wgmma(what: str):
    arch = compile_arch()
    if arch != WGMMA_ARCH:
        raise ValueError(
            f"warpgroup.{what}: wgmma (warpgroup MMA) exists only on {WGMMA_ARCH}; this build "
            f"targets {arch} (Blackwell and Rubin MMAs are tcgen05: tk_cute.ops.tcgen05)")


def tiled_mma(a_dtype, cols: int, warpgroups: int = 1, b_dtype=None, acc_dtype=cutlass.Float32):
    """The wgmma tiled MMA for a (64 * warpgroups, cols) accumulator: each warpgroup owns 64
    rows; A (rows, K) and B (cols, K) K-major in shared memory (the SS ABt form; `mma_AB` and
    register A operands derive their variants from it)."""
    _require_wgmma("tiled_mma")
    if cols % 8 or not 8 <= cols <= 256:
        raise ValueError(f"warpgroup.tiled_mma: N = {cols}: wgmma N is a multiple of 8 from 8 to "
                         "256 (wider accumulators: several MMAs over column blocks)")
    return sm90_utils.make_trivial_tiled_mma(
        a_dtype, b_dtype or a_dtype, OperandMajorMode.K, OperandMajorMode.K, acc_dtype,
        (warpgroups, 1, 1), tiler_mn=(WGMMA_M, cols))


REGISTER_FILE = 64 * 1024  # 32-bit registers per SM (sm_90a)
MAX_REGISTERS = 256  # per thread, setmaxnreg's ceiling


def entry_registers(threads: int) -> int:
    """Registers per thread a one-block-per-SM launch of `threads` starts with (multiples of 8):
    the block's whole allocation, fixed for its life."""
    per_thread = min(MAX_REGISTERS, REGISTER_FILE // threads)
    return per_thread - per_thread % 8


def consumer_registers(threads: int, producer: int, consumer_groups: int,
                       cap: int = MAX_REGISTERS) -> int:
    """The most registers `consumer_groups` warpgroups may `increase_registers` to once the
    block's other warpgroup dropped to `producer` (at most `cap`). setmaxnreg.inc only takes
    what the block's .dec gave back: asking for more waits forever (a hang, seen on the H200)."""
    entry = entry_registers(threads)
    regs = min(cap, entry + (entry - producer) // consumer_groups)
    return regs - regs % 8


def increase_registers(n: int):
    cute.arch.setmaxregister_increase(n)


def decrease_registers(n: int):
    cute.arch.setmaxregister_decrease(n)


def groupid():
    """Index of the calling thread's warpgroup in the block (warp-uniform)."""
    return cute.arch.make_warp_uniform(cute.arch.warp_idx() // 4)


def mma_fence():
    wg.fence()


def mma_commit_group():
    wg.commit_group()


def mma_async_wait(n: int = 0):
    wg.wait_group(n)


def _mma(acc: rt, a, b, accumulate, b_mn_major: bool = False):
    _require_wgmma("mma")
    from_registers = isinstance(a, rt)
    if from_registers and a.operand != "A":
        raise TypeError("warpgroup.mma: a register A must be an operand tile (rt.operand_A, "
                        "filled by warpgroup.load), not an accumulator-layout tile")
    tiled = wgmma_variant(acc.tiled_mma, a_from_registers=from_registers, b_mn_major=b_mn_major,
                          fresh=True)  # its accumulate field is set below: not the tile's own
    thr = tiled.get_slice(acc.thr_mma.thr_idx)
    tCrB = tiled.make_fragment_B(thr.partition_B(b))
    tCrA = a.frag if from_registers else tiled.make_fragment_A(thr.partition_A(a))
    tiled.set(wg.Field.ACCUMULATE, accumulate)
    for k in range(cute.size(tCrB, mode=[2])):
        cute.gemm(tiled, acc.frag, tCrA[None, None, k], tCrB[None, None, k], acc.frag)
        tiled.set(wg.Field.ACCUMULATE, True)


def _kn_as_nk(b):
    """A shared (K, N) tile viewed as the (N, K) B operand wgmma partitions (MN-major). The
    row-major swizzled `st(dtype, K, N)` is exactly CuTe's MN-major B layout, transposed: its
    atoms (8 K-rows x one swizzle width of N) are the MN-major atoms, stacked along K first."""
    return cute.make_tensor(b.iterator, cute.select(b.layout, mode=[1, 0]))


def _check_ab(acc: rt):
    if acc.tiled_mma.op.b_dtype.width == 8:
        raise TypeError(
            f"warpgroup.mma_AB with {acc.tiled_mma.op.b_dtype.__name__}: wgmma reads 8-bit "
            "operands K-major only (fp8 exists only as ABt); store B as (N, K) and use mma_ABt")


def mma_ABt(acc: rt, a, b, accumulate=True):
    """acc += a @ b^T (a: shared (M, K) tile or register operand tile; b: shared (N, K));
    `accumulate` False, or a run-time predicate that is false, makes it acc = a @ b^T."""
    _mma(acc, a, b, accumulate)


def mm_ABt(acc: rt, a, b):
    """acc = a @ b^T."""
    _mma(acc, a, b, False)


def mma_AB(acc: rt, a, b):
    """acc += a @ b with b a shared `st(dtype, K, N)` tile, N contiguous (16-bit types only)."""
    _check_ab(acc)
    _mma(acc, a, _kn_as_nk(b), True, b_mn_major=True)


def mm_AB(acc: rt, a, b):
    """acc = a @ b."""
    _check_ab(acc)
    _mma(acc, a, _kn_as_nk(b), False, b_mn_major=True)


def load(dst: rt, src):
    """Load the shared tile `src` (rows, K; a stage view of an `st`) into the register operand
    tile `dst` (`rt.operand_A`) with ldmatrix (TK `warpgroup::load`). Call `mma_fence()` before
    the MMAs that read it."""
    if dst.operand != "A":
        raise TypeError("warpgroup.load fills register operand tiles (rt.operand_A)")
    atom = cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(False, 4), dst.dtype)
    tiled = cute.make_tiled_copy_A(atom, dst.tiled_mma)
    thr = tiled.get_slice(dst.thr_mma.thr_idx)
    cute.copy(tiled, thr.partition_S(src), thr.retile(dst.frag))


def store_global(dst, src: rt):
    """Store the register tile `src` into the global (rows, cols) tensor `dst` (e.g. one tile of
    `cute.local_tile`), converted to dst's type; each thread writes its own elements (TK's
    `warpgroup::store(gl, rt, coord)`)."""
    if src.operand != "C":
        raise TypeError("warpgroup.store_global writes accumulator-layout tiles")
    out = cute.make_rmem_tensor(src.frag.layout, dst.element_type)
    out.store(src.frag.load().to(dst.element_type))
    cute.autovec_copy(out, src.thr_mma.partition_C(dst))


def store(dst, src: rt, thread_idx, subtile: int = 0, transposed: bool = False):
    """Store column block `subtile` of the register tile `src` into the shared tile `dst`
    (rows x dst-cols, converted to dst's type): stmatrix for 16-bit tiles, per-thread stores
    for 32-bit ones (no stmatrix exists for them); then fence so that TMA may read `dst` once
    the group has passed a barrier. With dst as wide as `src`, subtile 0 is all of it.
    `transposed`: `dst` is the block's transpose, a row-major (cols, rows) tile (for a C stored
    with its rows contiguous: the register tile's rows become the shared tile's columns),
    written by stmatrix's transposing form.

    The epilogue walks a wide accumulator in narrow blocks so that a few small shared buffers
    (not a whole output tile) stage the output: shared memory stays with the load ring."""
    if transposed:
        dst = cute.make_tensor(dst.iterator, cute.select(dst.layout, mode=[1, 0]))
    tiled = _smem_store_copy(dst.element_type, src, transposed)
    thr = tiled.get_slice(thread_idx)
    acc = tiled.retile(src.frag)
    block = cute.make_rmem_tensor(cute.shape(thr.partition_S(dst))[:3], src.frag.element_type)
    for b, a in block_elements(block.shape, cute.size(acc, mode=[0]), subtile):
        block[b] = acc[a]
    out = cute.make_rmem_tensor(block.shape, dst.element_type)
    out.store(block.load().to(dst.element_type))
    cute.copy(tiled, out, thr.partition_D(dst))
    cute.arch.fence_proxy("async.shared", space="cta")


def block_elements(block_shape, span: int, subtile: int) -> list[tuple[int, int]]:
    """(block index, register-tile index) pairs that `store` copies for column block
    `subtile`. `block_shape` is one thread's (values, row slices, column pieces) of the shared
    block; the retiled register tile holds, for each 64-row slice its warpgroup owns (two in a
    dense tile of `Config.TILES` = 2), `span` values running over the whole width piece after
    piece. So block slot (v, m, j) takes value v of piece `subtile * pieces + j` of slice m."""
    per, slices, pieces = (cute.size(block_shape, mode=[i]) for i in range(3))
    return [(v + per * (m + slices * j), v + per * (pieces * subtile + j) + span * m)
            for j in range(pieces) for m in range(slices) for v in range(per)]


def _smem_store_copy(dtype, src: rt, transposed: bool = False):
    """The register->shared tiled copy for `src`'s MMA layout: stmatrix (transposing where
    `transposed`) for 16-bit outputs, the universal (per-thread) copy for 32-bit ones, both over
    the stmatrix thread layout."""
    if dtype.width not in (16, 32):
        raise TypeError(f"warpgroup.store writes 16- or 32-bit shared tiles; got {dtype}")
    c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transposed, 4),
                                 dtype if dtype.width == 16 else cutlass.BFloat16)
    atom = c_atom if dtype.width == 16 else cute.make_copy_atom(
        cute.nvgpu.CopyUniversalOp(), dtype)
    return cute.make_tiled_copy_S(atom, cute.make_tiled_copy_C_atom(c_atom, src.tiled_mma))


class sync:
    """A named barrier over `n_warpgroups` warpgroups (TK `group<N>::sync(id)`); ids start at 1
    (0 is __syncthreads)."""

    def __init__(self, barrier_id: int, n_warpgroups: int):
        self.barrier = cutlass.pipeline.NamedBarrier(
            barrier_id=barrier_id, num_threads=n_warpgroups * WARPGROUP_THREADS
        )

    def __call__(self):
        self.barrier.arrive_and_wait()
