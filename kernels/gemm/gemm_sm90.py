# SPDX-License-Identifier: MIT
"""Hopper GEMM, C = A @ B^T: bf16/fp16 or fp8 (e4m3/e5m2) inputs, fp32 accumulate, bf16 / fp16
/ fp32 out.

Pipeline (TK's H100 GEMM on the `lcf` template): a producer warp issues TMA loads of an
(Mb, Kb) A tile and an (Nb, Kb) B tile per stage into a LOAD_PIPE_DEPTH ring; Mb / 64
consumer warpgroups (two, one for 64-row tiles, three for 192) each run SS wgmma on a 64-row
slice of the (Mb, Nb) fp32 accumulator, one commit group per stage, releasing a stage
once the next one's MMAs are issued; finish converts the accumulator in (Mb, EPI_N) column
blocks, stmatrix-stores each into one of EPI_PIPE_DEPTH shared buffers and TMA-stores it while
the next is written. Persistent
CTAs walk tiles in supergroup order (stream-K shares lost to whole tiles at every shape timed
and were deleted: docs/facts.md#dense-stream-k).
`Config.SPLIT_K` (few tiles over a long K): each tile's K steps are cut into SPLIT_K ranges
(`templates.lcf.SplitK`), the (tile, range) units spread over the persistent CTAs, and each
unit's fp32 partial tile is TMA-stored into its plane of a workspace (SPLIT_K planes of the
output's shape, rows of the output's width); `_sum_planes_kernel`, launched behind the GEMM
with PDL (the GEMM's CTAs let it launch as they start, so it waits on the SMs the GEMM
leaves free), adds the planes in order (deterministic) into C, rounding once.
`Config.PDL`: the GEMM launches as a programmatic dependent of the kernel before it on the
stream (its launch, barrier setup and descriptor prefetch overlap that kernel's tail; every
thread waits for it, `griddepcontrol.wait`, before any global access) and lets the kernel after
it launch as its CTAs start (a chain of GEMMs: each one's start hides behind the one before).
Constraints: A (M, K) and B (N, K) K-major with 16-byte aligned rows; any M, N, K: the TMA
loads of edge tiles fill zeros past the tensors (they add nothing to the sums; a stage still
carries its whole box of bytes) and the TMA stores clip the edge tiles of C.
`Config.TRANSPOSE_C`: C is stored with M contiguous, i.e. the memory of an (N, M) row-major
C^T (the host's swap of A and B: out = a @ b^T computed as out^T = b @ a^T, so that a few
activation rows are wgmma's N, in steps of 16 rather than 64-row bands); each epilogue block
is stmatrix-transposed into an (EPI_N, Mb) row-major buffer and TMA-stored into C^T.
`Config.SHIFT_EDGES`: the last band and the last column of tiles, where they would reach past M
(N), start at M - Mb (N - Nb) instead, inside the tensor (where it has a whole tile): their load
boxes hold no rows past the operands (each such row costs about 2.3 rows in it,
docs/facts.md#tma-box-past-tensor), and the rows they share with the tile before are computed
and stored twice, identically (the same MMAs in the same K order).
Replaces CUTLASS's `examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode

from tk_cute.arch import target
from tk_cute.ops import cluster, memory, register, tma, warpgroup
from tk_cute.launcher import OUT_ALIGN, Signature, i32, i64, ptr
from tk_cute.templates.lcf import LCF, SplitK
from tk_cute.types import coord, gl, rt, st
from tk_cute.types.semaphore import NamedBarrier
from tk_cute.types.struct import DeviceStruct

INPUT_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16,
               "float8_e4m3fn": cutlass.Float8E4M3FN, "float8_e5m2": cutlass.Float8E5M2}
OUTPUT_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16,
                "float32": cutlass.Float32}
# Tile widths: multiples of 16 up to wgmma's N = 256 (a tile's epilogue blocks are 16 or 32
# columns); tile heights: one consumer warpgroup per 64 rows (256-row tiles were never picked:
# deleted, docs/history.md)
NBS = tuple(range(64, 257, 16))
MBS = (64, 128, 192)
# Split-K: at most this many K ranges per tile (`Config.SPLIT_K`); the sum adds SUM_AHEAD
# planes' loads at once
MAX_SPLIT_K = 32
SUM_THREADS = 256
SUM_AHEAD = 8
# Registers a consumer thread needs beside its fp32 accumulators: ptxas fits each wgmma and its
# Nb / 2 accumulators in the launch's per-thread registers (`entry_registers`), which
# setmaxnreg does not raise (192 x 208 asks for 136 of 128; 192 x 192 and 256 x 128 in four
# warpgroups compile), and in what setmaxnreg gives the consumers
WGMMA_SPARE_REGISTERS = 32


def consumers(mb: int) -> int:
    """Consumer warpgroups of an Mb-row tile: one per 64 rows."""
    return mb // 64


def entry_registers(mb: int) -> int:
    """The per-thread registers an Mb-row tile's block launches with (one producer and
    `consumers(mb)` consumer warpgroups, one block per SM)."""
    return warpgroup.entry_registers((1 + consumers(mb)) * warpgroup.WARPGROUP_THREADS)


def consumer_registers(mb: int) -> int:
    """What the producer warpgroup's drop leaves each consumer thread (232 for two consumer
    warpgroups, 152 for three)."""
    groups = consumers(mb)
    return warpgroup.consumer_registers((1 + groups) * warpgroup.WARPGROUP_THREADS,
                                        LCF.PRODUCER_REGISTERS, groups, LCF.CONSUMER_REGISTERS)


def max_width(mb: int) -> int:
    """The widest tile (of `NBS`) an Mb-row tile compiles at without spills
    (`WGMMA_SPARE_REGISTERS`): 256 for 64 and 128 rows, 192 for 192."""
    return max(nb for nb in NBS if nb // 2 + WGMMA_SPARE_REGISTERS <= entry_registers(mb)
               and nb // 2 + WGMMA_SPARE_REGISTERS <= consumer_registers(mb))


@dataclass(frozen=True)
class Config:
    """Tile and pipeline shape (TK config names). Kb = 0 picks 4 MMA K-steps (64 for 16-bit
    inputs, 128 for fp8); LOAD_PIPE_DEPTH = 0 fills the target's shared memory. Mb / 64
    consumer warpgroups (`MBS`), each holding a 64-row accumulator slice. The epilogue stages C in
    EPI_N-column blocks (16 or 32) through EPI_PIPE_DEPTH shared buffers; every tile starts
    on buffer 0, free once the last tile's stores have read the buffers after it: where a
    tile's blocks are not whole rounds of the buffers, `finish` first waits for all of the
    last tile's stores to have read theirs (issued a whole main loop before, long done)."""

    dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    Mb: int = 128
    Nb: int = 256
    Kb: int = 0
    LOAD_PIPE_DEPTH: int = 0
    EPI_N: int = 32
    EPI_PIPE_DEPTH: int = 4
    SUPERGROUP_SIZE: int = 8
    CLUSTER_M: int = 1
    CLUSTER_N: int = 1
    TRANSPOSE_C: bool = False  # C stored M-contiguous (as C^T, row-major): see the module
    SHIFT_EDGES: bool = False  # edge tiles moved inside the tensors: see the module
    SPLIT_K: int = 1  # K ranges per tile, summed by a second kernel: see the module
    # Launched as a programmatic dependent of the kernel before it (`LCF.PDL`), and letting the
    # kernel after it launch as its CTAs start: see the module
    PDL: bool = False
    arch: str = "sm_90a"

    def __post_init__(self):
        if self.dtype not in INPUT_TYPES:
            raise TypeError(f"input dtype must be one of {list(INPUT_TYPES)}, got {self.dtype!r}")
        if self.out_dtype not in OUTPUT_TYPES:
            raise TypeError(f"out_dtype must be one of {list(OUTPUT_TYPES)}, got "
                            f"{self.out_dtype!r}")
        if not target(self.arch).wgmma:
            raise ValueError(f"GemmSm90 needs wgmma (sm_90a); target is {self.arch}")
        if self.Mb not in MBS or self.Nb not in NBS:
            raise ValueError(f"tile must be one of {MBS} rows (one 64-row consumer warpgroup "
                             f"per 64) x one of {NBS}; got {self.Mb} x {self.Nb}")
        widest = max_width(self.Mb)
        if self.Nb > widest:
            raise ValueError(f"a {self.Mb}-row tile is at most {widest} wide (each wgmma's "
                             f"Nb / 2 accumulators fit the launch's {entry_registers(self.Mb)} "
                             f"registers and the consumers' {consumer_registers(self.Mb)}); got "
                             f"Nb={self.Nb}")
        if self.EPI_N not in (16, 32) or self.Nb % self.EPI_N:
            raise ValueError(f"EPI_N must be 16 or 32 columns dividing Nb={self.Nb}, got "
                             f"{self.EPI_N}")
        if not 1 <= self.EPI_PIPE_DEPTH <= self.Nb // self.EPI_N:
            raise ValueError(f"EPI_PIPE_DEPTH must be 1 to Nb / EPI_N = {self.Nb // self.EPI_N} "
                             f"buffers, got {self.EPI_PIPE_DEPTH}")
        if self.CLUSTER_M * self.CLUSTER_N > 4:
            raise ValueError(f"cluster {self.CLUSTER_M}x{self.CLUSTER_N} exceeds 4 CTAs")
        if not 1 <= self.SPLIT_K <= MAX_SPLIT_K:
            raise ValueError(f"SPLIT_K must be 1 to {MAX_SPLIT_K} K ranges per tile, got "
                             f"{self.SPLIT_K}")

    @property
    def in_type(self):
        return INPUT_TYPES[self.dtype]

    @property
    def k_block(self) -> int:
        return self.Kb or 4 * (256 // self.in_type.width)

    def k_steps(self, K: int) -> int:
        """The K steps of a call with inner dimension K (the last one partial)."""
        return -(-K // self.k_block)

    def check_k(self, K: int) -> None:
        """Raise ValueError where K has fewer K steps than SPLIT_K ranges (one would be
        empty)."""
        if self.SPLIT_K > self.k_steps(K):
            raise ValueError(f"SPLIT_K={self.SPLIT_K} needs at least that many K steps of "
                             f"{self.k_block}; K={K} has {self.k_steps(K)}")

    def workspace_bytes(self, M: int, N: int) -> int:
        """Bytes of the split-K workspace an M x N call needs: SPLIT_K fp32 planes (none
        without split-K)."""
        return 4 * self.SPLIT_K * M * N if self.SPLIT_K > 1 else 0


class GemmSm90(LCF):
    """C = A @ B^T on the lcf template (see the module docstring)."""

    SCALED = False  # alpha in the signature (`GemmScaledSm90`)

    def __init__(self, config: Config = Config()):
        self.config = c = config
        self.Mb, self.Nb, self.Kb = c.Mb, c.Nb, c.k_block
        self.NUM_CONSUMERS = consumers(c.Mb)
        self.CONSUMER_REGISTERS = consumer_registers(c.Mb)
        self.SUPERGROUP_SIZE, self.CLUSTER_M, self.CLUSTER_N = (
            c.SUPERGROUP_SIZE, c.CLUSTER_M, c.CLUSTER_N)
        self.PDL = c.PDL
        self.a_tile = st(c.in_type, c.Mb, self.Kb)
        self.b_tile = st(c.in_type, c.Nb, self.Kb)
        if c.SPLIT_K > 1:
            self.sched = SplitK(c.SPLIT_K)
        # what the epilogue stores: C, or with split-K a workspace plane of fp32 partials
        out_type = cutlass.Float32 if c.SPLIT_K > 1 else OUTPUT_TYPES[c.out_dtype]
        self.C_ALIGN = OUT_ALIGN * 8 // out_type.width  # C elements in 16 bytes (`origin`)
        self.c_tile = (st(out_type, c.EPI_N, c.Mb) if c.TRANSPOSE_C else
                       st(out_type, c.Mb, c.EPI_N))
        self.fit_ring(c.LOAD_PIPE_DEPTH, target(c.arch).smem_bytes)

    # --- globals ----------------------------------------------------------------------------
    def inputs(self):
        return {"a": self.a_tile, "b": self.b_tile}

    def finish_tiles(self):
        return {"c": (self.c_tile, self.config.EPI_PIPE_DEPTH)}

    def tiled_mma(self):
        return sm90_utils.make_trivial_tiled_mma(
            self.a_tile.dtype, self.b_tile.dtype, OperandMajorMode.K, OperandMajorMode.K,
            cutlass.Float32, (self.NUM_CONSUMERS, 1, 1), tiler_mn=(64, self.Nb))

    def prefetch(self, g):
        for d in (g.A, g.B, g.C):
            d.prefetch()
        if cutlass.const_expr(self.config.SPLIT_K > 1 or self.config.PDL):
            cluster.pdl_launch_dependents()  # the plane sum / next call may launch (and wait)

    def k_steps(self, g):
        return cute.size(g.A.tiles(), mode=[3])

    # --- producer ---------------------------------------------------------------------------
    def load(self, g, inputs, at, k, barrier, mcast):
        batch = 0 if cutlass.const_expr(self.config.SPLIT_K > 1) else at.b  # (split-K: its range)
        if cutlass.const_expr(self.config.SHIFT_EDGES):
            rows, cols = self.origin(g, at)
            tma.load_async(inputs["a"], g.A, coord(0, k, batch), barrier, mcast["a"], (rows, 0))
            tma.load_async(inputs["b"], g.B, coord(0, k, batch), barrier, mcast["b"], (cols, 0))
        else:
            tma.load_async(inputs["a"], g.A, coord(at.r, k, batch), barrier, mcast["a"])
            tma.load_async(inputs["b"], g.B, coord(at.c, k, batch), barrier, mcast["b"])

    def origin(self, g, at):
        """`SHIFT_EDGES`: the first element row of tile `at`'s A band and of its B columns,
        moved back to end at M (N) where the tile grid's would pass it (and the tensor holds a
        whole tile). The one along C's contiguous dimension (N, or M for `TRANSPOSE_C`) is
        rounded up to C_ALIGN elements, so that an edge box reaches up to C_ALIGN - 1
        elements past the tensor: a TMA store's box starts on 16 bytes of C (an fp16 C of
        N = 100 in rows of 104, stored from column 36, faulted with an illegal instruction;
        from column 40 it ran, H200, docs/facts.md#tma-store-origin)."""
        M, N = g.A.tensor.shape[0], g.B.tensor.shape[0]
        last_row, last_col = cutlass.max(M - self.Mb, 0), cutlass.max(N - self.Nb, 0)
        align = self.C_ALIGN  # (grid origins, multiples of Mb and Nb, are aligned already)
        if cutlass.const_expr(self.config.TRANSPOSE_C):
            last_row = (last_row + (align - 1)) // align * align
        else:
            last_col = (last_col + (align - 1)) // align * align
        return (cutlass.min(at.r * self.Mb, last_row), cutlass.min(at.c * self.Nb, last_col))

    # --- consumers --------------------------------------------------------------------------
    def setup(self, g, thread, smem):
        acc = rt.accumulator(self.tiled_mma(), thread, self.Mb, self.Nb)
        register.zero(acc)
        return acc

    def compute(self, g, acc, inputs, k):
        warpgroup.mma_ABt(acc, inputs["a"], inputs["b"])

    @cute.jit
    def finish(self, g, acc, at, smem, thread):
        c, depth, transposed = smem["c"], self.config.EPI_PIPE_DEPTH, self.config.TRANSPOSE_C
        blocks, epi_n = self.Nb // self.config.EPI_N, self.config.EPI_N
        consumers = warpgroup.sync(NamedBarrier.EPILOGUE, self.NUM_CONSUMERS)
        if cutlass.const_expr(blocks % depth):  # the last tile's stores may still read buffer 0
            if thread < 32:
                tma.store_async_read_wait(0)
            consumers()
        for i in cutlass.range_constexpr(blocks):
            warpgroup.store(c[None, None, i % depth], acc, thread, subtile=i,
                            transposed=transposed)
            consumers()
            if thread < 32:
                if cutlass.const_expr(self.config.SHIFT_EDGES):
                    rows, cols = self.origin(g, at)
                    origin = ((cols + i * epi_n, rows) if cutlass.const_expr(transposed) else
                              (rows, cols + i * epi_n))
                    tma.store_async(g.C, c[None, None, i % depth], coord(0, 0, at.b), origin)
                else:
                    block = (coord(at.c * blocks + i, at.r, at.b)
                             if cutlass.const_expr(transposed) else
                             coord(at.r, at.c * blocks + i, at.b))
                    tma.store_async(g.C, c[None, None, i % depth], block)
                tma.store_commit_group()
                tma.store_async_read_wait(depth - 1)
            consumers()
        register.zero(acc)

    # --- host -------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, max_ctas: cutlass.Constexpr,
                 stream):
        """a (M, K, L), b (N, K, L), c (M, N, L) (`TRANSPOSE_C`: C^T, (N, M, L)), each with
        its second mode contiguous (without split-K: its workspace comes with `call_ptrs`)."""
        self._no_split("__call__")
        self._launch(self._globals(a, b, c), c, max_ctas, stream)

    def _no_split(self, entry: str):
        if self.config.SPLIT_K > 1:
            raise ValueError(f"{type(self).__name__}.{entry} launches without a workspace: "
                             f"SPLIT_K={self.config.SPLIT_K} runs through call_ptrs")

    @cute.jit
    def call_ptrs(self, sms: cutlass.Constexpr, *args):
        """`__call__` on raw pointers: `signature(config, scaled)`'s arguments in its order,
        then the stream. a (M, K), b (N, K), c (M, N) (or C^T, (N, M)) with row strides lda,
        ldb, ldc elements; with split-K the GEMM writes the fp32 planes at ws (rows of the
        output's width, unpadded) and `_sum_planes_kernel` adds them into c."""
        v = dict(zip(signature(self.config, self.SCALED).names + ("stream",), args))
        c, ldc, split = v["c"], v["ldc"], self.config.SPLIT_K
        if cutlass.const_expr(split > 1):
            c, ldc = v["ws"], v["M"] if self.config.TRANSPOSE_C else v["N"]
        at, bt, ct = _matrices(v["a"], v["b"], c, v["M"], v["N"], v["K"], v["lda"], v["ldb"],
                               ldc, self.config.TRANSPOSE_C, split)
        alpha = v.get("alpha")
        if cutlass.const_expr(alpha is not None):
            alpha = cute.make_tensor(alpha, cute.make_layout(1))
        self._launch(self._globals(at, bt, ct, alpha), ct, sms, v["stream"])
        if cutlass.const_expr(split > 1):
            rows, cols = ct.shape[:2]
            _sum_planes_kernel(self.config, v["ws"], v["c"], rows, cols, v["ldc"]).launch(
                grid=[(rows * cols // 4 + SUM_THREADS - 1) // SUM_THREADS, 1, 1],
                block=[SUM_THREADS, 1, 1], stream=v["stream"], use_pdl=True)

    def _globals(self, a, b, c, alpha=None):
        """The kernel's globals: A, B, C and (`GemmScaledSm90`) alpha."""
        return Globals(gl.load(a, self.a_tile, self.CLUSTER_N),
                       gl.load(b, self.b_tile, self.CLUSTER_M), gl.store(c, self.c_tile), alpha)

    def _launch(self, g, c, max_ctas, stream):
        M, N = (c.shape[1], c.shape[0]) if self.config.TRANSPOSE_C else c.shape[:2]
        self.launch(g, cute.ceil_div(M, self.Mb), cute.ceil_div(N, self.Nb), c.shape[2],
                    max_ctas, stream)


def _matrices(a, b, c, M, N, K, lda, ldb, ldc, transpose_c=False, planes=1):
    """The (rows, cols, 1) global tensors at a, b, c with the given row strides (C as C^T, (N,
    M), where `transpose_c`; `planes` of it one after another: the split-K workspace)."""
    c_shape = (N, M) if transpose_c else (M, N)
    return [cute.make_tensor(p, cute.make_layout((rows, cols, n), stride=(ld, 1, rows * ld)))
            for p, (rows, cols), ld, n in ((a, (M, K), lda, 1), (b, (N, K), ldb, 1),
                                           (c, c_shape, ldc, planes))]


@cute.kernel
def _sum_planes_kernel(cfg: cutlass.Constexpr, ws: cute.Pointer, out: cute.Pointer,
                       rows: cutlass.Int32, cols: cutlass.Int32, ldc: cutlass.Int64):
    """C (rows x cols, row stride ldc) = the sum of the SPLIT_K fp32 planes at ws (rows x cols
    each, unpadded) in plane order, rounded once to C's type: 4 consecutive elements per
    thread (cols % 4 == 0: C's rows are 16 bytes), SUM_AHEAD planes' loads in flight."""
    cluster.pdl_wait()  # launched early (PDL): the planes are complete once this returns
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    i = (bid * SUM_THREADS + tid) * 4
    if i < rows * cols:
        plane = cutlass.Int64(rows * cols) * 4
        total = [cutlass.Float32(0.0)] * 4
        for p0 in cutlass.range_constexpr(0, cfg.SPLIT_K, SUM_AHEAD):
            parts = [memory.ld_v4_f32(ws.toint() + cutlass.Int64(i) * 4 + p * plane)
                     for p in range(p0, min(p0 + SUM_AHEAD, cfg.SPLIT_K))]
            for part in parts:
                total = [t + x for t, x in zip(total, part)]
        esize = OUTPUT_TYPES[cfg.out_dtype].width // 8
        at = out.toint() + (cutlass.Int64(i // cols) * ldc + i % cols) * esize
        for e in cutlass.range_constexpr(4):
            memory.st_cvt(at + e * esize, total[e], cfg.out_dtype)


def signature(config: Config, scaled: bool = False) -> Signature:
    """The raw-pointer launch's runtime arguments (`call_ptrs`): A, B, C (16-byte aligned, as
    TMA needs), alpha for `GemmScaledSm90` (one fp32), with split-K the workspace
    (`Config.workspace_bytes`), the shape and the row strides."""
    dtype = INPUT_TYPES[config.dtype]
    alpha = (ptr("alpha", cutlass.Float32, 4),) if scaled else ()
    ws = (ptr("ws", cutlass.Float32),) if config.SPLIT_K > 1 else ()
    return Signature(ptr("a", dtype), ptr("b", dtype), ptr("c", OUTPUT_TYPES[config.out_dtype]),
                     *alpha, *ws, i32("M"), i32("N"), i32("K"), i64("lda"), i64("ldb"),
                     i64("ldc"))


def compile_launcher(config: Config, sms: int, scaled: bool = False, options: str = ""):
    """`kernel_for(config, scaled)` for a GPU of `sms` SMs as a raw-pointer `Launcher`
    (`options`: e.g. "--gpu-arch sm_90a" to build without a GPU)."""
    return signature(config, scaled).compile(kernel_for(config, scaled).call_ptrs, sms,
                                             options=options)


class Globals(DeviceStruct):
    """The kernel's global layouts (TK `globals`), and where given alpha (`GemmScaledSm90`)."""

    def __init__(self, A: gl, B: gl, C: gl, alpha=None):
        self.A, self.B, self.C, self.alpha = A, B, C, alpha
        self._fields = ("A", "B", "C") + (() if alpha is None else ("alpha",))


class GemmScaledSm90(GemmSm90):
    """D = alpha * A @ B^T with alpha a device fp32 scalar, read once per consumer thread and
    applied to the fp32 accumulator before the output rounding (NVFP4: operands dequantized to
    e2m1 * ue4m3 in bf16, exact, and alpha = gA * gB); with split-K to each partial plane."""

    SCALED = True

    def setup(self, g, thread, smem):
        return Scaled(super().setup(g, thread, smem), g.alpha[0])

    def compute(self, g, s, inputs, k):
        super().compute(g, s.acc, inputs, k)

    def finish(self, g, s, at, smem, thread):
        register.mul(s.acc, s.acc, s.alpha)
        super().finish(g, s.acc, at, smem, thread)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, alpha: cute.Tensor,
                 max_ctas: cutlass.Constexpr, stream):
        """As `GemmSm90.__call__`, with alpha a 1-element fp32 tensor."""
        self._no_split("__call__")
        self._launch(self._globals(a, b, c, alpha=alpha), c, max_ctas, stream)


def kernel_for(config: Config, scaled: bool = False) -> GemmSm90:
    """The kernel `config` runs on: `GemmScaledSm90` if `scaled`, else `GemmSm90`."""
    return (GemmScaledSm90 if scaled else GemmSm90)(config)


class Scaled:
    """A consumer thread's state in `GemmScaledSm90`: accumulator and alpha."""

    def __init__(self, acc: rt, alpha):
        self.acc, self.alpha = acc, alpha
