"""The 128x4 "blocked" layout of NVFP4 block scales in global memory, as pure functions.

An NVFP4 operand of logical shape (M, K) carries one UE4M3 scale per 16 consecutive K elements:
a logical (M, K/16) byte matrix. Block-scaled tensor cores (tcgen05 ``scale_vec::4X``, cuBLASLt
``VEC16_UE4M3``, torch ``_scaled_mm``) do not read that matrix row-major; they read 512-byte atoms
covering 128 rows x 4 scale columns, with rows interleaved in four groups of 32 so that one
``tcgen05.cp 32x128b.warpx4`` copy lands each row's four scales in the right TMEM lane. With
``kb = k // 16``, ``RM = ceil(M / 128)``, ``RK = ceil(ceil(K / 16) / 4)`` and batch ``l``::

    offset(l, m, kb) = l*RM*RK*512 + (m // 128)*RK*512 + (kb // 4)*512
                       + (m % 32)*16 + ((m // 32) % 4)*4 + (kb % 4)

so a stored operand is a (RM, RK, 512) (or (L, RM, RK, 512)) byte tensor whose 512-byte inner
dimension is (32, 4, 4) indexed ``[m % 32, (m // 32) % 4, kb % 4]``. Rows past M and scale columns
past K/16 are padding; this library writes them as zero.

This module is the one definition of that layout (``tk_cute.nvfp4`` re-exports it). It also
exposes the CuTe DSL's own description of it, ``tile_atom_to_shape_SF`` over the atom
``((32,4),(16,4)):((16,4),(0,1))``, evaluated on the host, so tests can prove that the formula,
the torch rearrangement and the layout a kernel builds are one and the same. CuTe layouts in
nvidia-cutlass-dsl 4.8.1 can only be built while a ``@cute.jit`` function is being traced (calling
``cute.make_layout`` from plain Python raises ``CALL_OUTSIDE_JIT``), and a layout object must not
outlive that trace (touching it afterwards can crash the process), so ``eval_cute_layout`` builds
and evaluates inside one trace and returns plain integers; no GPU is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:  # (the layouts work on torch tensors by their methods: no torch import)
    import torch

ATOM_ROWS = 128  # rows per 512-byte atom
ATOM_SF_COLS = 4  # scale columns (of 16 K elements each) per atom
ATOM_BYTES = ATOM_ROWS * ATOM_SF_COLS  # 512
SF_VEC = 16  # K elements per scale
ATOM_K = ATOM_SF_COLS * SF_VEC  # 64 K elements per atom


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def blocked_dims(M: int, K: int) -> tuple[int, int]:
    """(RM, RK): the number of 128-row bands and of 4-scale-column atoms per band.

    Args:
        M: logical rows of the operand.
        K: logical K extent in ELEMENTS (not scale columns); ``ceil(K / 16)`` scale columns.
    """
    if M < 1 or K < 1:
        raise ValueError(f"M and K must be positive, got M={M}, K={K}")
    return _ceil_div(M, ATOM_ROWS), _ceil_div(_ceil_div(K, SF_VEC), ATOM_SF_COLS)


def blocked_shape(M: int, K: int, L: int | None = None) -> tuple[int, ...]:
    """Shape of the stored scale tensor: (RM, RK, 512), or (L, RM, RK, 512) when L is given.

    Args:
        M: logical rows.
        K: logical K extent in elements.
        L: batch count, or None for an unbatched operand.
    """
    rm, rk = blocked_dims(M, K)
    return (rm, rk, ATOM_BYTES) if L is None else (L, rm, rk, ATOM_BYTES)


def blocked_offset(m: Any, kb: Any, M: int, K: int, l: Any = 0) -> Any:
    """Byte offset of scale (l, m, kb) in the blocked layout (the formula in the module docstring).

    Works elementwise on Python ints, integer torch tensors or numpy arrays (anything with
    ``//``, ``%``, ``*`` and ``+``). Coordinates in the padding (``m < 128*RM``,
    ``kb < 4*RK``) are valid and address padding bytes.

    Args:
        m: row index.
        kb: scale column index (``k // 16``).
        M: logical rows of the operand.
        K: logical K extent in elements.
        l: batch index (default 0).

    Returns:
        The offset, of the same kind as the inputs.
    """
    rm, rk = blocked_dims(M, K)
    return l * (rm * rk * ATOM_BYTES) + band_offset(m, kb, rk)


def band_offset(m: Any, kb: Any, rk: Any) -> Any:
    """Byte offset of scale (m, kb) in one batch of the blocked layout with `rk` atoms per
    128-row band (``ceil(K / 64)``). Plain integer arithmetic, so kernels call it on device
    integers as well (every kernel that addresses scales uses this one formula)."""
    return ((m // ATOM_ROWS) * rk + kb // ATOM_SF_COLS) * ATOM_BYTES + atom_offset(m, kb)


def atom_offset(m: Any, kb: Any) -> Any:
    """Byte of scale (m, kb) inside its 512-byte atom (32x4x4: rows m % 32 at 16 B, row groups
    (m // 32) % 4 at 4 B, scale column kb % 4)."""
    return (m % 32) * 16 + ((m // 32) % 4) * 4 + kb % ATOM_SF_COLS


def to_blocked(sf: torch.Tensor) -> torch.Tensor:
    """Rearrange logical scales (..., M, KB) into the blocked layout (..., RM, RK, 512).

    KB is the number of scale columns (``K // 16``). Padding rows/columns are zero-filled.
    Any dtype is moved as is (the library uses torch.uint8 UE4M3 bytes).

    Args:
        sf: a 2-D (M, KB) or 3-D (L, M, KB) tensor.

    Returns:
        A new contiguous tensor of shape (RM, RK, 512) or (L, RM, RK, 512).
    """
    if sf.dim() not in (2, 3):
        raise ValueError(f"to_blocked expects (M, K//16) or (L, M, K//16) scales, got {sf.dim()}-D")
    M, KB = sf.shape[-2:]
    rm, rk = blocked_dims(M, KB * SF_VEC)
    lead = sf.shape[:-2]
    padded = sf.new_zeros((*lead, rm * ATOM_ROWS, rk * ATOM_SF_COLS))
    padded[..., :M, :KB] = sf
    # m = rm*128 + a*32 + b, kb = rk*4 + c  ->  [rm, rk, b, a, c]
    v = padded.reshape(*lead, rm, 4, 32, rk, 4)
    n = len(lead)
    perm = list(range(n)) + [n + 0, n + 3, n + 2, n + 1, n + 4]
    return v.permute(perm).reshape(*lead, rm, rk, ATOM_BYTES).contiguous()


def from_blocked(blocked: torch.Tensor, M: int, K: int) -> torch.Tensor:
    """Inverse of `to_blocked`: the logical (..., M, ceil(K/16)) scales, padding dropped.

    Args:
        blocked: a (RM, RK, 512) or (L, RM, RK, 512) tensor.
        M: logical rows.
        K: logical K extent in ELEMENTS.

    Returns:
        A new contiguous tensor of shape (M, ceil(K/16)) or (L, M, ceil(K/16)).
    """
    rm, rk = blocked_dims(M, K)
    if blocked.dim() not in (3, 4) or tuple(blocked.shape[-3:]) != (rm, rk, ATOM_BYTES):
        raise ValueError(
            f"blocked scales for M={M}, K={K} must have shape (..., {rm}, {rk}, {ATOM_BYTES}) "
            f"with 0 or 1 batch dims, got {tuple(blocked.shape)}"
        )
    lead = blocked.shape[:-3]
    n = len(lead)
    v = blocked.reshape(*lead, rm, rk, 32, 4, 4)  # [rm, rk, b, a, c]
    perm = list(range(n)) + [n + 0, n + 3, n + 2, n + 1, n + 4]  # -> [rm, a, b, rk, c]
    full = v.permute(perm).reshape(*lead, rm * ATOM_ROWS, rk * ATOM_SF_COLS)
    return full[..., :M, : _ceil_div(K, SF_VEC)].contiguous()


# --------------------------------------------------------------------------------------------
# The same layout as the CuTe DSL builds it.


@dataclass(frozen=True)
class HostLayout:
    """A CuTe layout's (shape, stride) as plain nested tuples, evaluable without the DSL.

    ``__call__`` follows CuTe's coordinate convention: a coordinate is congruent with the shape,
    or an integer for a (sub)mode, unpacked colexicographically (leftmost fastest).
    """

    shape: Any
    stride: Any

    def __call__(self, coord: Any) -> int:
        return _crd2idx(coord, self.shape, self.stride)

    @property
    def size(self) -> int:
        return _product(self.shape)

    @property
    def cosize(self) -> int:
        """One past the largest offset the layout reaches."""
        return _max_offset(self.shape, self.stride) + 1

    def __str__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"


def _product(shape: Any) -> int:
    if isinstance(shape, tuple):
        out = 1
        for s in shape:
            out *= _product(s)
        return out
    return int(shape)


def _max_offset(shape: Any, stride: Any) -> int:
    if isinstance(shape, tuple):
        return sum(_max_offset(s, d) for s, d in zip(shape, stride))
    return (int(shape) - 1) * int(stride)


def _crd2idx(coord: Any, shape: Any, stride: Any) -> int:
    if isinstance(shape, tuple):
        if isinstance(coord, tuple):
            if len(coord) != len(shape):
                raise ValueError(f"coordinate {coord} is not congruent with shape {shape}")
            return sum(_crd2idx(c, s, d) for c, s, d in zip(coord, shape, stride))
        total, rest = 0, int(coord)  # integer into a tuple mode: colexicographic unpacking
        for i, (s, d) in enumerate(zip(shape, stride)):
            last = i == len(shape) - 1
            size = _product(s)
            total += _crd2idx(rest if last else rest % size, s, d)
            rest //= size
        return total
    return int(coord) * int(stride)


def _fmt(t: Any) -> str:
    return "(" + ",".join(_fmt(x) for x in t) + ")" if isinstance(t, tuple) else str(t)


def eval_cute_layout(
    make_layout: Callable[[], Any], coords: Iterable[Any] = ()
) -> tuple[HostLayout, list[int]]:
    """Build a CuTe DSL layout on the host and evaluate it with CuTe itself at many coordinates.

    ``make_layout`` is called while a ``@cute.jit`` function is traced (the only place the DSL
    lets layouts exist); each coordinate is evaluated with the layout's own ``__call__``, so
    the offsets come from CuTe's algebra, not from this module. Needs no GPU. Costs roughly
    0.1 ms per coordinate plus ~0.1 s per call.

    The trace holds `tk_cute.compile.COMPILE_LOCK` (the DSL's tracing state is global: two
    threads tracing at once raise or crash), so any thread may call it.

    Args:
        make_layout: zero-argument callable returning a static ``cute.Layout``.
        coords: coordinates (ints or nested tuples) to evaluate.

    Returns:
        (HostLayout with the layout's static shape and stride, list of int offsets).
    """
    import cutlass.cute as cute

    from tk_cute.compile import COMPILE_LOCK

    coords = list(coords)
    result: dict[str, Any] = {}

    @cute.jit
    def _trace():
        _evaluate_in_trace(make_layout(), coords, result)

    with COMPILE_LOCK:
        _trace()
    if "offsets" not in result:  # pragma: no cover - the DSL skipped tracing
        raise RuntimeError("the CuTe DSL did not trace the layout function")
    return result["layout"], result["offsets"]


def _evaluate_in_trace(layout: Any, coords: Sequence[Any], out: dict) -> None:
    # A plain function (not rewritten by the DSL's AST preprocessor), run during the trace.
    out["layout"] = HostLayout(_as_ints(layout.shape), _as_ints(layout.stride))
    out["offsets"] = [int(layout(c)) for c in coords]


def _as_ints(t: Any) -> Any:
    return tuple(_as_ints(x) for x in t) if isinstance(t, tuple) else int(t)


def scale_layout_cute(M: int, K: int, L: int = 1) -> HostLayout:
    """The CuTe DSL's scale-factor layout for an (M, K, L) NVFP4 operand, read off on the host.

    This is ``cutlass.utils.blockscaled_layout.tile_atom_to_shape_SF((M, K, L), 16)``, the
    layout CUTLASS's block-scaled GEMMs give their SFA/SFB tensors. Its coordinates are
    ``(m, k, l)`` with ``k`` in ELEMENTS (the stride along the 16 elements of one scale is 0);
    for the shapes here its shape is ``(((32,4),RM),((16,4),RK),(1,L))``.

    Args:
        M: rows.
        K: K extent in elements.
        L: batch count.

    Returns:
        A HostLayout whose ``__call__((m, k, l))`` equals ``blocked_offset(m, k // 16, M, K, l)``.
    """
    from cutlass.utils.blockscaled_layout import tile_atom_to_shape_SF

    layout, _ = eval_cute_layout(lambda: tile_atom_to_shape_SF((M, K, L), SF_VEC))
    return layout


def scale_offsets_cute(M: int, K: int, L: int = 1, coords: Iterable[Any] | None = None):
    """Offsets of ``tile_atom_to_shape_SF((M, K, L), 16)`` evaluated by CuTe at (m, k, l) coords.

    Args:
        M: rows.
        K: K extent in elements.
        L: batch count.
        coords: (m, k, l) element coordinates; default every (m, 16*kb, l) of the logical
            scale matrix, in (l, m, kb) row-major order.

    Returns:
        List of int offsets, one per coordinate.
    """
    from cutlass.utils.blockscaled_layout import tile_atom_to_shape_SF

    if coords is None:
        kbs = _ceil_div(K, SF_VEC)
        coords = [(m, SF_VEC * kb, l) for l in range(L) for m in range(M) for kb in range(kbs)]
    _, offsets = eval_cute_layout(lambda: tile_atom_to_shape_SF((M, K, L), SF_VEC), coords)
    return offsets
