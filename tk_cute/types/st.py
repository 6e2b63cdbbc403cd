"""Shared tiles (TK `st`, `sv`): typed, swizzled shared-memory tiles and their allocation.

`st(dtype, rows, cols)` is a tile *type*: rows x cols elements, row-major (the column index
contiguous), stored in the widest swizzle (32/64/128 B) the row width allows, which is the layout
TMA writes and wgmma/UMMA read (CuTe's `warpgroup.make_smem_layout_atom`). `Shared.alloc(tile,
stages)` places `stages` copies in shared memory and returns the staged CuTe tensor
(rows, cols, stages); `[None, None, i]` is stage i. `sv(dtype, n)` is a shared vector.
`Shared` counts what it places and raises at trace time once a kernel asks for more shared
memory than the compile target has (`check_smem`).

As the B operand of `warpgroup.mma_AB`, an `st(dtype, K, N)` (N contiguous) is read MN-major:
its layout is CuTe's MN-major wgmma layout transposed, so no second tile kind is needed.

TK names its K-major operand tiles the same way: an A tile is (Mb, Kb), a B tile of an ABt
product is (Nb, Kb).

`st_mma` is an `st` as a tcgen05 (UMMA) MMA of a CTA pair reads it (Blackwell / Rubin): this
CTA's `rows` (M or N) x `cols` (K elements, or scale bytes) of one stage, stored in the layout
the MMA's partition gives it: ((MMA atom), MMA_M|N, MMA_K, stage) with the UMMA swizzle for FP4
data (`make_smem_layout_a/b`), the blocked 512-byte scale atoms for scale tiles
(`layouts.scales_sm100`). The type also names how its `gl` partitions global memory (the
MMA op and tile the TMA descriptor follows), so `gl` / `tma.load_async` move it.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from tk_cute.arch import TARGETS, target
from tk_cute.layouts import scales_sm100

# mbarriers and other small objects are 8-byte aligned; swizzled tiles need 1024-byte alignment
# (the swizzle pattern repeats every 1024 bytes and TMA/wgmma address it from the tile base).
TILE_ALIGN = 1024


class _Matrix:
    """What every shared tile type of `rows` x `cols` elements of `dtype` answers."""

    @property
    def bytes(self) -> int:
        return self.rows * self.cols * self.dtype.width // 8

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)


@dataclass(frozen=True)
class st(_Matrix):
    """Shared tile type: `rows` x `cols` of `dtype`, row-major (`col_major`: the row index
    contiguous), automatically swizzled."""

    dtype: type
    rows: int
    cols: int
    swizzle: bool = True  # False: plain row-major (tiles only threads read, e.g. FP4 bytes)
    col_major: bool = False  # the row index contiguous (a transposed D: `gl.col_major`)

    def __post_init__(self):
        row_bytes = (self.rows if self.col_major else self.cols) * self.dtype.width // 8
        if self.col_major and not self.swizzle:
            raise ValueError("a column-major st is swizzled")
        if not self.swizzle:
            if row_bytes % 16:
                raise ValueError(f"st row of {row_bytes} bytes: TMA rows are multiples of 16 B")
            return
        if self.rows % 8 or self.cols <= 0:
            raise ValueError(f"st rows must be a positive multiple of 8 (seen {self.rows})")
        if row_bytes % 32:
            raise ValueError(
                f"st row of {self.cols} x {self.dtype.__name__} is {row_bytes} bytes: a swizzled "
                "tile row must be a multiple of 32 bytes"
            )

    def layout(self, stages: int = 1):
        """The staged layout (rows, cols, stages): a CuTe ComposedLayout when swizzled."""
        if not self.swizzle:
            return cute.make_layout((self.rows, self.cols, stages),
                                    stride=(self.cols, 1, self.rows * self.cols))
        major, contiguous = ((LayoutEnum.COL_MAJOR, self.rows) if self.col_major else
                             (LayoutEnum.ROW_MAJOR, self.cols))
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(major, self.dtype, contiguous), self.dtype)
        return cute.tile_to_shape(atom, (self.rows, self.cols, stages),
                                  order=(1, 0, 2) if self.col_major else (0, 1, 2))


@dataclass(frozen=True, eq=False)
class st_mma(_Matrix):
    """Shared operand tile of a tcgen05 MMA: this CTA's `rows` x `cols` of one stage.

    `operand` "A" (rows along M) or "B" (along N); `scales`: a scale tile (cols = K / 16 bytes,
    blocked atoms) instead of FP4 data. `op` / `tiler` (the pair's M, N, K) give the shared
    layout; `tma_op` / `tma_tiler` the global partition its `gl` loads by (default the same;
    SFB: one CTA over N rounded to 128, multicast to the pair), `tma_type` the TMA element
    (scales: 16-bit). Build it with `A`, `B`, `SFA`, `SFB`; the layout exists only while a
    kernel is traced (it is built from the MMA op each time).
    """

    dtype: type
    operand: str
    rows: int
    cols: int
    op: object
    tiler: tuple
    scales: bool = False
    tma_op: object = None
    tma_tiler: tuple | None = None
    tma_type: type | None = None
    swizzle = True  # aligned like a swizzled `st` (the UMMA / blocked layouts repeat per 1 KiB)

    @classmethod
    def A(cls, dtype, op, tiler) -> "st_mma":
        return cls(dtype, "A", tiler[0] // _ctas(op), tiler[2], op, tiler)

    @classmethod
    def B(cls, dtype, op, tiler) -> "st_mma":
        return cls(dtype, "B", tiler[1] // _ctas(op), tiler[2], op, tiler)

    @classmethod
    def SFA(cls, dtype, tiler) -> "st_mma":
        """A's scales: the K = 64 atom structure of a pair (`scales_sm100.layout_ops`)."""
        op, _ = scales_sm100.layout_ops(tiler[1])
        return cls(dtype, "A", tiler[0] // _ctas(op), tiler[2] // scales_sm100.SF_VEC, op,
                   tiler, True, tma_type=cutlass.Int16)

    @classmethod
    def SFB(cls, dtype, tiler) -> "st_mma":
        """B's scales: every CTA of the pair holds all N (rounded up to 128 rows); one CTA's
        TMA partition, multicast to the pair."""
        op, one = scales_sm100.layout_ops(tiler[1])
        n = -(-tiler[1] // scales_sm100.ATOM_ROWS) * scales_sm100.ATOM_ROWS
        return cls(dtype, "B", n, tiler[2] // scales_sm100.SF_VEC, op, tiler, True, one,
                   (scales_sm100.ATOM_ROWS, n, tiler[2]), cutlass.Int16)

    @property
    def mma(self):
        """The tiled MMA that shapes the shared layout."""
        return cute.make_tiled_mma(cute.make_mma_atom(self.op))

    @property
    def tma_mma(self):
        """The tiled MMA whose partition the `gl` (TMA) follows."""
        return cute.make_tiled_mma(cute.make_mma_atom(self.tma_op or self.op))

    def layout(self, stages: int = 1):
        """The staged layout ((MMA atom), MMA_M|N, MMA_K, stages): a ComposedLayout for data."""
        if self.scales:
            return scales_sm100.smem_layout(self.operand, self.mma, self.tiler, stages)
        make = (sm100_utils.make_smem_layout_a if self.operand == "A" else
                sm100_utils.make_smem_layout_b)
        return make(self.mma, self.tiler, self.dtype, stages)

    def layout_bytes(self, stages: int = 1) -> int:
        """Bytes the traced layout of `stages` stages spans (== `bytes * stages`; checked by
        `Shared.alloc`)."""
        lay = self.layout(stages)
        return cute.cosize(getattr(lay, "outer", lay)) * self.dtype.width // 8

    def tmem_layout(self):
        """A scale tile's layout in tensor memory once `tcgen05.cp` moved one stage there."""
        stage = cute.slice_(self.layout(1), (None, None, None, 0))
        return scales_sm100.tmem_layout(self.operand, self.mma, self.tiler, stage)


def _ctas(op) -> int:
    """CTAs one MMA instruction spans (cta_group::2: the pair)."""
    return 2 if op.cta_group == cute.nvgpu.tcgen05.CtaGroup.TWO else 1


@dataclass(frozen=True)
class sv:
    """Shared vector type: `n` elements of `dtype`."""

    dtype: type
    n: int

    @property
    def bytes(self) -> int:
        return self.n * self.dtype.width // 8


class Shared:
    """Shared-memory allocation inside a kernel (TK's `shared_allocator`)."""

    def __init__(self):
        self._alloc = SmemAllocator()
        self.bytes = 0  # an upper bound of what is placed so far (smem_bytes' rule)

    def _count(self, nbytes: int, align: int):
        self.bytes = -(-self.bytes // align) * align + nbytes
        from cutlass.cutlass_dsl import CuTeDSL

        arch = str(CuTeDSL._get_dsl().get_arch_enum())
        if arch in TARGETS:
            check_smem(self.bytes, arch)

    def alloc(self, tile: st | st_mma | sv, stages: int = 1):
        """`stages` copies of a tile (a (rows, cols, stages) tensor; an `st_mma`: its MMA
        layout with stages last) or a vector (n, stages)."""
        nbytes = tile.bytes * stages
        if isinstance(tile, st_mma) and tile.layout_bytes(stages) != nbytes:
            raise ValueError(f"{tile.operand} tile: its layout spans {tile.layout_bytes(stages)} "
                             f"bytes, {tile.rows} x {tile.cols} x {stages} stages give {nbytes}")
        self._count(nbytes, 16 if isinstance(tile, sv) else TILE_ALIGN if tile.swizzle else 128)
        if isinstance(tile, sv):
            return self._alloc.allocate_tensor(
                tile.dtype, cute.make_layout((tile.n, stages)), byte_alignment=16
            )
        layout = tile.layout(stages)
        if not tile.swizzle:
            return self._alloc.allocate_tensor(tile.dtype, layout, byte_alignment=128)
        if not isinstance(layout, cute.ComposedLayout):  # scale atoms: blocked, unswizzled
            return self._alloc.allocate_tensor(tile.dtype, layout, byte_alignment=TILE_ALIGN)
        return self._alloc.allocate_tensor(
            tile.dtype, layout.outer, byte_alignment=TILE_ALIGN, swizzle=layout.inner
        )

    def barriers(self, n: int):
        """Storage for `n` mbarriers (Int64 each); see `tk_cute.types.semaphore`."""
        self._count(8 * n, 8)
        return self._alloc.allocate_array(cutlass.Int64, n)


def smem_bytes(*tiles: tuple[st | st_mma | sv, int], barriers: int = 0) -> int:
    """Shared memory a kernel uses for (tile, stages) pairs and `barriers` mbarriers, counting
    the 1024-byte alignment of every swizzled tile (an upper bound of the allocator's layout)."""
    total = 8 * barriers
    for tile, stages in tiles:
        if isinstance(tile, (st, st_mma)):
            align = TILE_ALIGN if tile.swizzle else 128
            total = -(-total // align) * align
        total += tile.bytes * stages
    return total


def check_smem(nbytes: int, arch: str) -> int:
    """Raise ValueError when `nbytes` of shared memory exceed what one block may use on `arch`
    (`tk_cute.arch.Target.smem_bytes`); returns `nbytes` otherwise."""
    capacity = target(arch).smem_bytes
    if nbytes > capacity:
        raise ValueError(f"shared memory budget exceeded: {nbytes} bytes requested, {arch} gives a "
                         f"block at most {capacity} bytes")
    return nbytes
