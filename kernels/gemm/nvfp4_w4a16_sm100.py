# SPDX-License-Identifier: MIT
"""W4A16 on Blackwell (sm_100a, sm_103a) and Rubin (sm_107a): bf16 activations times NVFP4
weights decoded in the kernel, TK's load-transform-compute-finish on tcgen05.

D (M, N, L) bf16|fp16|fp32 = gB X (M, K, L) W (N, K, L)^T: X bf16 (rows K apart), W NVFP4
codes (rows `nvfp4_codes.row_pitch(K)` bytes apart) and 128x4 blocked scales. One CTA per
x_rows x 128 tile of D (swapped: 128 weight rows x x_rows of D^T); pipeline contract (warps
0-3 transform, then epilogue; 4 MMA; 5 load):
  load:      per K stage (Kb = 64) `mma_done` finished -> TMA X's 128 x 64 tile -> `loaded`.
  transform: per stage `mma_done` finished (the decoded slot is free) -> thread t reads weight
             row t's 32 code bytes and 4 scale bytes from global memory (rows past N, K past
             the tensor: zeros), decodes them exactly to bf16 (e2m1 * scale * 2^-shift,
             `ops.nvfp4.e2m1x8_scaled_shifted`) into the swizzled B tile the MMA reads, proxy
             fence -> `decoded`.
  mma:       per stage `loaded` and `decoded` -> 4 kind::f16 MMAs (128 x 128 x 16, one CTA) ->
             `tensor_commit` `mma_done`; after the last, `acc_full`.
  finish:    `acc_full` -> tcgen05.ld EPI_N columns, `tensor_load_wait` -> * gB 2^shift -> out
             dtype -> smem -> `tma.store_async` (TMA clips the tails; D rows `d_pitch` apart).
Never a bf16 copy of the weights in global memory. Any M, N, L and K % 16. `SPLIT_K` > 1:
grid z covers L x splits; run s of K's stages (`schedule.k_split`) writes an fp32 partial D
as batch l * splits + s, which the caller sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

from tk_cute.arch import target
from tk_cute.kernels.gemm.nvfp4_sm100 import OUT_TYPES as _ALL_OUT
from tk_cute.kernels.gemm.nvfp4_sm100 import ConfigError, SmemBudgetError, d_pitch
from tk_cute.layouts import nvfp4_codes
from tk_cute.ops import epilogue, memory, schedule, tma, warp, warpgroup
from tk_cute.ops import nvfp4 as fp4
from tk_cute.ops import tcgen05 as tc
from tk_cute.types import coord, gl, st
from tk_cute.types import tt as tmem
from tk_cute.types.gl import col_major, row_major
from tk_cute.types.semaphore import NamedBarrier, init_fence, semaphore
from tk_cute.types.st import Shared

W_ROWS, Kb = 128, 64  # weight rows per tile (one per transform thread); Kb: one 64-K scale atom
X_ROWS = (16, 32, 64, 128)  # activation rows per tile: 128 in order, any of these swapped
OUT_TYPES = {k: v for k, v in _ALL_OUT.items() if k != "nvfp4"}
TRANSFORM_THREADS = 128


@dataclass(frozen=True)
class Config:
    """Stages and epilogue; `__post_init__` checks them against the target."""

    arch: str = "sm_100a"
    STAGES: int = 4
    EPI_N: int = 32
    EPI_PIPE_DEPTH: int = 2
    out: str = "bfloat16"
    sf: str = "ue4m3"
    SPLIT_K: int = 1  # > 1: K in runs (`k_splits`), partial D's in fp32, summed by the caller
    swap_ab: bool = False  # the decoded weights are the MMA's A (128 rows), X its B (`x_rows`
    # rows: small M); D^T computed, D stored transposed
    x_rows: int = 128  # activation rows per tile (the MMA's N when swapped; 128 in order)

    def __post_init__(self):
        t = target(self.arch)
        if self.SPLIT_K < 1:
            raise ConfigError(f"SPLIT_K={self.SPLIT_K} must be at least 1")
        if self.x_rows not in (X_ROWS if self.swap_ab else (128,)):
            raise ConfigError(f"x_rows={self.x_rows}: 128, or one of {X_ROWS} with swap_ab")
        if self.EPI_N % 16 or self.tile[1] % self.epi_n:
            raise ConfigError(f"EPI_N={self.EPI_N}: a multiple of 16 dividing the tile's "
                              f"{self.tile[1]} columns (or wider than them)")
        if t.tmem_columns == 0:
            raise ConfigError(f"{self.arch} has no tcgen05 MMA")
        if self.out not in OUT_TYPES:
            raise ConfigError(f"out={self.out!r} not in {list(OUT_TYPES)}")
        if self.sf not in fp4.DECODE_FORMATS or (self.sf == "ue5m3" and not t.ue5m3_scales):
            raise ConfigError(f"scale format {self.sf!r} on {self.arch}: ue4m3, or ue5m3 on "
                              f"sm_107a")
        if self.smem_bytes > t.smem_bytes:
            raise SmemBudgetError(f"{self.smem_bytes} B shared memory > {t.smem_bytes} on "
                              f"{self.arch}; fewer STAGES")

    @property
    def d_type(self) -> str:
        """What the kernel writes: `out`, or fp32 partial sums when K is split."""
        return "float32" if self.SPLIT_K > 1 else self.out

    @property
    def epi_n(self) -> int:
        """Accumulator columns per epilogue step (EPI_N, at most the swapped tile's x_rows)."""
        return min(self.EPI_N, self.x_rows)

    @property
    def tile(self) -> tuple[int, int]:
        """The MMA's (M, N): (x_rows, 128) in order, (128, x_rows) swapped."""
        return (W_ROWS, self.x_rows) if self.swap_ab else (self.x_rows, W_ROWS)

    @property
    def smem_bytes(self) -> int:
        """Barriers, then X and decoded-W stages, then D's staging buffers (1 KiB-aligned)."""
        stage = self.x_rows * Kb * 2 + W_ROWS * Kb * 2
        d = 128 * self.epi_n * OUT_TYPES[self.d_type].width // 8 * self.EPI_PIPE_DEPTH
        return 1024 + self.STAGES * stage + -(-d // 1024) * 1024


class GemmW4A16Sm100:
    """The kernel for one `Config`; `__call__` is the `@cute.jit` host launch."""

    TRANSFORM_WARPS, MMA_WARP, LOAD_WARP = (0, 1, 2, 3), 4, 5

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.out_dtype = OUT_TYPES[cfg.d_type]
        self.shift = fp4.decode_shift(cfg.sf)

    def _tiles(self):
        cfg = self.cfg
        self.x_tile = st(cutlass.BFloat16, cfg.x_rows, Kb)
        self.w_tile = st(cutlass.BFloat16, W_ROWS, Kb)
        self.d_tile = st(self.out_dtype, 128, cfg.epi_n, col_major=cfg.swap_ab)
        self.mma = tc.tiled_mma(tcgen05.MmaF16BF16Op(
            cutlass.BFloat16, cutlass.Float32, (*cfg.tile, 16), tcgen05.CtaGroup.ONE,
            tcgen05.OperandSource.SMEM, OperandMajorMode.K, OperandMajorMode.K))
        shape = self.mma.partition_shape_C(cfg.tile)
        self.acc_layout = self.mma.make_fragment_C(cute.append(shape, 1)).layout

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, w_ptr: cute.Pointer, wsf_ptr: cute.Pointer,
                 gb_ptr: cute.Pointer, d_ptr: cute.Pointer, m: cutlass.Int32,
                 n: cutlass.Int32, k: cutlass.Int32, l: cutlass.Int32, splits: cutlass.Int32,
                 stream: cuda.CUstream):
        """D (m, n, l) = gB X (m, k, l) W (n, k, l)^T; w_ptr the codes, wsf_ptr the blocked
        scales, gb_ptr a pointer to W's fp32 decode scale. `splits` > 1: run s of K's stages
        (`schedule.k_split`) of batch l writes its partial D as batch l * splits + s. Swapped:
        D^T (n, m) through a column-major view of D; the grid's x walks the weight tiles."""
        cfg = self.cfg
        self._tiles()
        k16 = cute.assume(k, 16)
        X = gl.load(row_major(x_ptr, m, k16, l), self.x_tile)
        pitch = cute.assume(d_pitch(n, cfg.d_type), 128 // self.out_dtype.width)
        if cutlass.const_expr(cfg.swap_ab):
            D = gl.store(col_major(d_ptr, n, m, l * splits, pitch), self.d_tile)
            grid = (cute.ceil_div(n, W_ROWS), cute.ceil_div(m, cfg.x_rows), l * splits)
        else:
            D = gl.store(row_major(d_ptr, m, n, l * splits, pitch), self.d_tile)
            grid = (cute.ceil_div(m, cfg.x_rows), cute.ceil_div(n, W_ROWS), l * splits)
        self.kernel(X, D, w_ptr, wsf_ptr, gb_ptr, n, k, splits).launch(
            grid=grid, block=[32 * 6, 1, 1], stream=stream, min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, X: gl, D: gl, w_ptr: cute.Pointer, wsf_ptr: cute.Pointer,
               gb_ptr: cute.Pointer, n: cutlass.Int32, k: cutlass.Int32,
               splits: cutlass.Int32):
        cfg, S = self.cfg, self.cfg.STAGES
        self._tiles()
        smem = Shared()
        loaded, decoded, mma_done = smem.barriers(S), smem.barriers(S), smem.barriers(S)
        acc_full = smem.barriers(1)
        holding = smem.alloc(st(cutlass.Int32, 8, 8, swizzle=False))
        sX, sW = smem.alloc(self.x_tile, S), smem.alloc(self.w_tile, S)
        sD = smem.alloc(self.d_tile, cfg.EPI_PIPE_DEPTH)
        w = warp.warpid()
        if w == self.LOAD_WARP:
            with warp.elect_leader():
                for s in cutlass.range_constexpr(S):
                    semaphore(loaded + s).init(1)
                    semaphore(decoded + s).init(TRANSFORM_THREADS)
                    semaphore(mma_done + s).init(1)  # one tensor_commit per stage
                semaphore(acc_full).init(1)
            X.prefetch()
        init_fence()
        cute.arch.sync_threads()
        alloc = tmem.tensor_allocator(holding.iterator,
                                      tmem.alloc_columns(cfg.tile[1], cfg.arch), cfg.arch,
                                      False, (NamedBarrier.TMEM_ALLOC, 32 * 5),
                                      self.TRANSFORM_WARPS[0])
        bx, by, ls = cute.arch.block_idx()
        i, j = (by, bx) if cfg.swap_ab else (bx, by)  # X tile i, weight tile j
        l, k0, k1 = schedule.k_split(ls, splits, cute.ceil_div(k, Kb))
        steps = (k0, k1)
        if w == self.LOAD_WARP:
            self.load(X, sX, loaded, mma_done, i, l, steps)
        if w == self.MMA_WARP:
            operands = (sW, sX) if cfg.swap_ab else (sX, sW)
            self.mma_issue(alloc, *operands, loaded, decoded, mma_done, acc_full, steps)
        if w < self.MMA_WARP:
            alloc.allocate()
            tm = alloc.wait()  # with the MMA warp, before either waits on the other's stages
            tid = cute.arch.thread_idx()[0]
            self.transform(w_ptr, wsf_ptr, sW, decoded, mma_done, j, l, n, k, steps, tid)
            self.finish(alloc, tm, D, sD, gb_ptr, acc_full, (bx, by), ls, tid)

    @cute.jit
    def load(self, X, sX, loaded, mma_done, i, l, steps):
        """Load warp: wait `mma_done` (the slot's MMAs read it), TMA X's tile onto `loaded`."""
        S = self.cfg.STAGES
        for kt in cutlass.range(steps[0], steps[1], unroll=1):
            s, p = (kt - steps[0]) % S, ((kt - steps[0]) // S) % 2
            semaphore(mma_done + s).wait(p ^ 1)
            with warp.elect_leader():
                semaphore(loaded + s).expect_bytes(self.x_tile.bytes)
            tma.load_async(sX[None, None, s], X, coord(i, kt, l), loaded + s)

    @cute.jit
    def transform(self, w_ptr, wsf_ptr, sW, decoded, mma_done, j, l, n, k, steps, tid):
        """Transform warps: wait `mma_done` (the decoded slot is free); thread t decodes weight
        row j * 128 + t of the stage into row t of the swizzled bf16 weight tile (the MMA's B,
        or its A swapped: one layout); fence, arrive `decoded`."""
        S = self.cfg.STAGES
        row = j * W_ROWS + tid
        pitch = nvfp4_codes.row_pitch(k)
        rk = cute.ceil_div(k, 64)  # scale atoms along K (the blocked layout's RK)
        rm = cute.ceil_div(n, 128)
        codes = w_ptr.toint() + cutlass.Int64(l * n + row) * pitch
        band = cutlass.Int64(l * rm + row // 128) * rk * 512 + (row % 32) * 16 + (row // 32 % 4) * 4
        scales = wsf_ptr.toint() + band
        live = cutlass.Uint32(row < n)
        for kt in cutlass.range(steps[0], steps[1], unroll=1):
            s, p = (kt - steps[0]) % S, ((kt - steps[0]) // S) % 2
            semaphore(mma_done + s).wait(p ^ 1)
            chunks = [memory.ld_v4_pred(codes + kt * 32 + 16 * c, live & cutlass.Uint32(
                kt * Kb + 32 * c < k)) for c in range(2)]
            sfw = memory.ld_u32_pred(scales + kt * 512, live)
            base = sW[None, None, s].iterator.toint() + tid * (Kb * 2)
            for b in cutlass.range_constexpr(4):  # one 16-element scale block: 2 code words
                sf = fp4.scale_to_bf16x2_prescaled((sfw >> (8 * b)) & 0xFF, self.cfg.sf)
                words = []
                for q in chunks[b // 2][2 * (b % 2):2 * (b % 2) + 2]:
                    words += fp4.e2m1x8_scaled_shifted(q, sf)
                for h in cutlass.range_constexpr(2):  # two 16-byte chunks of the B row
                    c = 2 * b + h
                    memory.st_shared_v4_u32(base + ((c ^ (tid % 8)) * 16), words[4 * h:4 * h + 4])
            cute.arch.fence_proxy("async.shared", space="cta")
            semaphore(decoded + s).arrive()

    @cute.jit
    def mma_issue(self, alloc, sA, sB, loaded, decoded, mma_done, acc_full, steps):
        """MMA warp: per stage `loaded` and `decoded` -> Kb / 16 MMAs -> commit `mma_done`; at
        the end commit `acc_full`."""
        S = self.cfg.STAGES
        tm = alloc.wait()
        acc = cute.make_tensor(tm.base, self.acc_layout)
        tCrA = self.mma.make_fragment_A(self.mma.get_slice(0).partition_A(sA))
        tCrB = self.mma.make_fragment_B(self.mma.get_slice(0).partition_B(sB))
        for kt in cutlass.range(steps[0], steps[1], unroll=1):
            s, p = (kt - steps[0]) % S, ((kt - steps[0]) // S) % 2
            semaphore(loaded + s).wait(p)
            semaphore(decoded + s).wait(p)
            tc.fence_after_thread_sync()
            for kb in cutlass.range_constexpr(Kb // 16):
                tc.mma_ABt(self.mma, acc[None, None, None, 0], tCrA[None, None, kb, s],
                           tCrB[None, None, kb, s], accumulate=(kt - steps[0] + kb) != 0)
            with warp.elect_leader():
                tc.tensor_commit(mma_done + s, pair=False)
        with warp.elect_leader():
            tc.tensor_commit(acc_full, pair=False)

    @cute.jit
    def finish(self, alloc, tm, D, sD, gb_ptr, acc_full, tile, l, tid):
        """Epilogue warps: `acc_full` -> tcgen05.ld, wait -> * gB 2^shift -> smem -> TMA
        store of the accumulator's tile (`tile`: its row and column tile in D's view, D^T
        swapped); free the columns."""
        cfg = self.cfg
        acc = cute.make_tensor(tm.base, self.acc_layout)
        semaphore(acc_full).wait(0)
        tc.fence_after_thread_sync()
        d = epilogue.tmem_store(acc, sD, self.d_tile, tid)
        epi = warpgroup.sync(NamedBarrier.EPILOGUE, 1)
        alpha = epilogue.global_scale(gb_ptr) * cutlass.Float32(2.0 ** self.shift)
        steps = cfg.tile[1] // cfg.epi_n
        buf = cutlass.Int32(0)
        for c in cutlass.range(steps, unroll=1):
            epilogue.load_async(d, 0, 0, c)
            tc.tensor_load_wait()
            epilogue.store_block(d, alpha, buf, D, coord(tile[0], tile[1] * steps + c, l), epi,
                                 self.TRANSFORM_WARPS[0], cfg.EPI_PIPE_DEPTH)
            buf = (buf + 1) % cfg.EPI_PIPE_DEPTH
        alloc.deallocate(tm, epi)
        tma.store_async_read_wait(0)


# --- launch arguments and fake-pointer compile (no GPU needed) ----------------------------
def k_splits(cfg: Config, k: int) -> int:
    """The split count a call of K = `k` runs (`schedule.k_split_count`: no run empty)."""
    return schedule.k_split_count(cfg.SPLIT_K, -(-k // Kb))


def signature(cfg: Config):
    """`GemmW4A16Sm100.__call__`'s runtime arguments as a `launcher.Signature`: x, w (codes),
    wsf (blocked scales), gb, d, then m, n, k, l, splits."""
    from tk_cute.launcher import Signature, i32, ptr
    from tk_cute.ops.tcgen05 import SCALE_TYPES

    return Signature(ptr("x", cutlass.BFloat16), ptr("w", cutlass.Uint8),
                     ptr("wsf", SCALE_TYPES[cfg.sf]), ptr("gb", cutlass.Float32, 4),
                     ptr("d", OUT_TYPES[cfg.d_type]), i32("m"), i32("n"), i32("k"), i32("l"),
                     i32("splits"))


def launch_values(cfg: Config, addr: dict, m: int, n: int, k: int, l: int = 1) -> dict:
    """The `signature` values of a call from device addresses (keys x, w, wsf, gb, d): split K
    (`cfg.SPLIT_K` > 1): d holds l * `k_splits(cfg, k)` fp32 partial D's."""
    return {**addr, "m": m, "n": n, "k": k, "l": l, "splits": k_splits(cfg, k)}


def launch_args(cfg: Config, addr: dict, m: int, n: int, k: int, l: int = 1,
                stream=None) -> tuple:
    """`GemmW4A16Sm100.__call__` arguments as DSL objects (`launch_values`' values; what
    `compile` and the emulator's host capture take), the stream last (default null)."""
    values = {**launch_values(cfg, addr, m, n, k, l), "stream": int(stream or 0)}
    return tuple(signature(cfg).dsl_values(values))


def compile(cfg: Config, m: int = 256, n: int = 256, k: int = 512):
    """Build the kernel for `cfg.arch` from fake pointers: (`tk_cute.compile.Build`, kernel)."""
    from tk_cute.compile import build

    kern = GemmW4A16Sm100(cfg)
    addr = dict.fromkeys(("x", "w", "wsf", "gb", "d"), 0)
    return build(kern, *launch_args(cfg, addr, m, n, k), arch=cfg.arch), kern
