"""Register-tile math (TK's `zero`, `copy`, `mul`, `add`, `mul_row`, `mul_col`, `row_max`, ...).

Each op runs on the calling thread's fragment of an `rt`; the scope is that of the tile (a
warpgroup accumulator is operated on by all its threads together). Reductions over rows or
columns first reduce the thread's own elements, then combine across the lanes that share a row
(column) with butterfly shuffles: in the MMA C layout the 4 lanes of a quad share each row
(lane xor 1, 2) and the 8 quads of a warp share each column (lane xor 4, 8, 16).
"""

from __future__ import annotations

import operator


import cutlass.cute as cute

from tk_cute.ops import warp
from tk_cute.types.rt import rt, rv

# Lane-xor distances between threads that share a row / a column of an MMA C fragment.
ROW_LANES = (1, 2)
COL_LANES = (4, 8, 16)


def zero(t: rt):
    t.frag.fill(0.0)


def copy(dst: rt, src: rt):
    """dst = src converted to dst's element type (round to nearest even)."""
    dst.frag.store(src.frag.load().to(dst.dtype))


def mul(dst: rt, src: rt, scalar):
    dst.frag.store(src.frag.load() * scalar)


def add(dst: rt, a: rt, b):
    """dst = a + b, with b a tile of the same layout or a scalar."""
    rhs = b.frag.load() if isinstance(b, rt) else b
    dst.frag.store(a.frag.load() + rhs)


def _slots(t: rt, axis: int) -> list[int]:
    """For every element of t's fragment, the slot of its row (axis 0) or column (axis 1) in
    an `rv`: distinct rows a thread holds, numbered in fragment order. The thread-dependent
    part of a coordinate is common to all its elements, so the static part decides."""
    layout = t.coords().layout
    keys = []
    for i in range(cute.size(layout)):
        off = layout(i)
        keys.append(off[axis] if isinstance(off, tuple) else off)
    order = {k: n for n, k in enumerate(dict.fromkeys(keys))}
    return [order[k] for k in keys]


def _vector(t: rt, axis: int, lanes) -> rv:
    index = _slots(t, axis)
    return rv(cute.make_rmem_tensor((max(index) + 1,), t.dtype), index, lanes)


def _reduce(t: rt, axis: int, op, lanes) -> rv:
    out = _vector(t, axis, lanes)
    seen = set()
    for i, slot in enumerate(out.index):
        if slot in seen:
            out.frag[slot] = op(out.frag[slot], t.frag[i])
        else:
            out.frag[slot] = t.frag[i]
            seen.add(slot)
    for slot in range(cute.size(out.frag)):
        for lane in lanes:
            other = warp.shuffle_xor(out.frag[slot], lane)
            out.frag[slot] = op(out.frag[slot], other)
    return out


def row_max(t: rt) -> rv:
    return _reduce(t, 0, cute.arch.fmax, ROW_LANES)


def row_sum(t: rt) -> rv:
    return _reduce(t, 0, operator.add, ROW_LANES)


def col_max(t: rt) -> rv:
    """Column maxima over the rows of one warp's part of the tile (16 rows per 64-row slab);
    combine across warps through shared memory when a column spans several warps."""
    return _reduce(t, 1, cute.arch.fmax, COL_LANES)


def col_sum(t: rt) -> rv:
    return _reduce(t, 1, operator.add, COL_LANES)


def _broadcast(dst: rt, src: rt, v: rv, op):
    for i, slot in enumerate(v.index):
        dst.frag[i] = op(src.frag[i], v.frag[slot])


def mul_row(dst: rt, src: rt, v: rv):
    """dst[r, c] = src[r, c] * v[r] (v from `row_max`/`row_sum` or built per row)."""
    _broadcast(dst, src, v, operator.mul)


def mul_col(dst: rt, src: rt, v: rv):
    """dst[r, c] = src[r, c] * v[c]."""
    _broadcast(dst, src, v, operator.mul)


def row_vec(t: rt) -> rv:
    """An uninitialised per-row vector of `t` (fill it, then `mul_row`)."""
    return _vector(t, 0, ROW_LANES)


def col_vec(t: rt) -> rv:
    return _vector(t, 1, COL_LANES)


