# SPDX-License-Identifier: MIT
"""Memory ops, thread scope: global vector loads and stores with the cache hints the streaming
kernels need, predicated forms for ragged edges, and shared-memory vectors.

Each op is one inline-PTX instruction (or a predicated one) on a 64-bit global (32-bit shared)
address, so a kernel computes its own addresses (plain integer arithmetic on
`tensor.iterator.toint()`) and the compiled code is exactly the access it names; the compile
tests count these instructions.

- Streaming reads: `ld_v4(addr, stream=True)` (``ld.global.nc.L1::no_allocate``: weights read
  once; `l2_fetch`: ``.L2::128B`` / ``.L2::256B`` prefetch sizes), `ld_v4_pred` (evict-first,
  zeros when off), `ld_u16`, `ld_u32_pred`, `ld_f32` (a scalar such as a global scale), and
  `ld_u32` / `ld_u8` / `ld_v4_f32` (coherent, in program order: data the previous kernel, or
  another CTA behind a flag, wrote).
- Stores: `st_u32`, `st_v4_u32`, `st_v4_f32`, `st_cvt` (fp32 -> bf16 / fp16 / fp32 element)
  and predicated
  `st_u8_pred`, `st_u16_pred`, `st_u32_pred`, `st_v2_u32_pred`.
- Flags between the CTAs of one grid (gpu scope): `ld_acquire_u32` (later reads see what the
  flag's writer wrote before its release), `st_release_u32` (earlier writes become visible to
  whoever acquires the flag); the thread's other accesses stay in program order around them.
- Global -> shared without registers: `cp_async_16`, `cp_async_wait_all`.
- Shared memory: `ld_shared_v4` (float32 or 32-bit words), `ld_shared_u16`, `st_shared_v2_f32`,
  `st_shared_v4_u32`, `st_shared_v4_f32` on a 32-bit shared address.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from tk_cute.ops.ptx import asm, unpack


# 16-byte vectors of 4 x 32 bits: (LLVM type, PTX type, asm constraint) per element type
_V4 = {Float32: (T.f32, "f32", "f"), Uint32: (T.i32, "u32", "r")}


# ---------------------------------------------------------------- loads


@dsl_user_op
def ld_v4(addr: Int64, stream: bool, l2_fetch: int = 0, coherent: bool = False, *, loc=None,
          ip=None) -> list:
    """16 bytes at `addr` as 4 Uint32 (read-only path); `stream`: no L1 allocation (data read
    once); `l2_fetch` (128 or 256): L2 fetches that many bytes around it (a prefetch hint).
    `coherent`: a plain load kept in program order instead (data an earlier kernel of the
    stream wrote, read after the PDL wait: ptxas moves read-only loads above
    `griddepcontrol.wait`)."""
    hint = (".L1::no_allocate" if stream else "") + (f".L2::{l2_fetch}B" if l2_fetch else "")
    ret = llvm.StructType.get_literal([T.i32()] * 4)
    text = f"ld.global{'' if coherent else '.nc'}{hint}.v4.u32 {{$0, $1, $2, $3}}, [$4];"
    res = asm(ret, [Int64(addr)], text, "=r,=r,=r,=r,l", loc, ip, coherent)
    return unpack(res, T.i32(), 4, Uint32, loc, ip)


@dsl_user_op
def ld_v4_pred(addr: Int64, pred: Uint32, *, loc=None, ip=None) -> list:
    """16 bytes at `addr` as 4 Uint32 when pred != 0, else zeros (streaming, L1 evict-first)."""
    ret = llvm.StructType.get_literal([T.i32()] * 4)
    text = (
        "{ .reg .pred p; setp.ne.b32 p, $5, 0; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; "
        "mov.b32 $3, 0; @p ld.global.L1::evict_first.v4.b32 {$0, $1, $2, $3}, [$4]; }"
    )
    res = asm(ret, [Int64(addr), Uint32(pred)], text, "=&r,=&r,=&r,=&r,l,r", loc, ip, True)
    return unpack(res, T.i32(), 4, Uint32, loc, ip)


@dsl_user_op
def ld_u16(addr: Int64, coherent: bool = False, *, loc=None, ip=None) -> Uint32:
    """The 2 bytes at `addr` (read-only path; `coherent`: as `ld_v4`), zero-extended."""
    text = f"ld.global{'' if coherent else '.nc'}.u16 $0, [$1];"
    return Uint32(asm(T.i32(), [Int64(addr)], text, "=r,l", loc, ip, coherent))


@dsl_user_op
def ld_f32(addr: Int64, *, loc=None, ip=None) -> Float32:
    """The float32 at `addr` (a plain coherent load, kept in program order: e.g. a global scale
    that an earlier kernel of the stream wrote, read after the PDL wait)."""
    return Float32(asm(T.f32(), [Int64(addr)], "ld.global.b32 $0, [$1];", "=f,l", loc, ip,
                       True))


@dsl_user_op
def ld_v4_f32(addr: Int64, *, loc=None, ip=None) -> list:
    """16 bytes at `addr` (16-byte aligned) as 4 Float32: a plain coherent load kept in program
    order, as `ld_f32` (data another CTA released, read after the acquire)."""
    ret = llvm.StructType.get_literal([T.f32()] * 4)
    text = "ld.global.v4.f32 {$0, $1, $2, $3}, [$4];"
    res = asm(ret, [Int64(addr)], text, "=f,=f,=f,=f,l", loc, ip, True)
    return unpack(res, T.f32(), 4, Float32, loc, ip)


@dsl_user_op
def ld_u32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """The 4 bytes at `addr` (a plain coherent load kept in program order, as `ld_f32`: data an
    earlier kernel of the stream wrote, read after the PDL wait)."""
    return Uint32(asm(T.i32(), [Int64(addr)], "ld.global.b32 $0, [$1];", "=r,l", loc, ip, True))


@dsl_user_op
def ld_u8(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """The byte at `addr`, zero-extended (coherent, in program order, as `ld_u32`)."""
    return Uint32(asm(T.i32(), [Int64(addr)], "ld.global.u8 $0, [$1];", "=r,l", loc, ip, True))


@dsl_user_op
def ld_u32_pred(addr: Int64, pred: Uint32, *, loc=None, ip=None) -> Uint32:
    """The 4 bytes at `addr` when pred != 0, else 0 (a plain coherent load: data written by an
    earlier kernel of the stream)."""
    text = "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, 0; @p ld.global.b32 $0, [$1]; }"
    return Uint32(asm(T.i32(), [Int64(addr), Uint32(pred)], text, "=&r,l,r", loc, ip, True))


@dsl_user_op
def ld_acquire_u32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """The 4 bytes at `addr`, an acquire at gpu scope (a flag another CTA releases)."""
    return Uint32(asm(T.i32(), [Int64(addr)], "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                      loc, ip, True))


@dsl_user_op
def st_release_u32(addr: Int64, v: Uint32, *, loc=None, ip=None) -> None:
    """Store `v` at `addr`, a release at gpu scope (cumulative: writes this thread observed,
    e.g. its CTA's before a barrier, are visible to the flag's acquirer)."""
    asm(None, [Int64(addr), Uint32(v)], "st.release.gpu.global.b32 [$0], $1;", "l,r", loc, ip,
        True)


@dsl_user_op
def st_u32(addr: Int64, v: Uint32, *, loc=None, ip=None) -> None:
    asm(None, [Int64(addr), Uint32(v)], "st.global.b32 [$0], $1;", "l,r", loc, ip, True)


def _st_v4(addr, values: list, dtype, loc, ip) -> None:
    """4 `dtype` values (Float32 or Uint32, `_V4`) to global `addr` (16-byte aligned)."""
    _, ptx, c = _V4[dtype]
    asm(None, [Int64(addr)] + [dtype(v) for v in values],
        f"st.global.v4.{ptx} [$0], {{$1, $2, $3, $4}};", f"l,{c},{c},{c},{c}", loc, ip, True)


@dsl_user_op
def st_v4_u32(addr: Int64, words: list, *, loc=None, ip=None) -> None:
    """4 32-bit words to global `addr` (16-byte aligned)."""
    _st_v4(addr, words, Uint32, loc, ip)


@dsl_user_op
def st_v4_f32(addr: Int64, xs: list, *, loc=None, ip=None) -> None:
    """4 float32 to global `addr` (16-byte aligned)."""
    _st_v4(addr, xs, Float32, loc, ip)


@dsl_user_op
def st_cvt(addr: Int64, x: Float32, dtype: str, *, loc=None, ip=None) -> None:
    """Store `x` as one `dtype` element ("bfloat16" / "float16": round to nearest even)."""
    if dtype == "float32":
        text = "st.global.f32 [$0], $1;"
    else:
        cvt = "cvt.rn.bf16.f32" if dtype == "bfloat16" else "cvt.rn.f16.f32"
        text = f"{{ .reg .b16 h; {cvt} h, $1; st.global.b16 [$0], h; }}"
    asm(None, [Int64(addr), Float32(x)], text, "l,f", loc, ip, True)


@dsl_user_op
def st_cvt_v4(addr: Int64, xs: list, dtype: str, *, loc=None, ip=None) -> None:
    """Store 4 float32 as 4 consecutive `dtype` elements (`st_cvt`'s rounding) at global
    `addr`, aligned to the 4 elements (8 bytes; 16 for float32)."""
    if dtype == "float32":
        _st_v4(addr, xs, Float32, loc, ip)
        return
    cvt = "cvt.rn.bf16x2.f32" if dtype == "bfloat16" else "cvt.rn.f16x2.f32"
    text = (f"{{ .reg .b32 w0, w1; {cvt} w0, $2, $1; {cvt} w1, $4, $3; "
            "st.global.v2.b32 [$0], {w0, w1}; }")
    asm(None, [Int64(addr)] + [Float32(x) for x in xs], text, "l,f,f,f,f", loc, ip, True)


@dsl_user_op
def st_u8_pred(addr: Int64, v: Uint32, pred: Uint32, *, loc=None, ip=None) -> None:
    text = "{ .reg .pred p; .reg .b16 h; setp.ne.b32 p, $2, 0; cvt.u16.u32 h, $1; " \
        "@p st.global.u8 [$0], h; }"
    asm(None, [Int64(addr), Uint32(v), Uint32(pred)], text, "l,r,r", loc, ip, True)


@dsl_user_op
def st_u16_pred(addr: Int64, v: Uint32, pred: Uint32, *, loc=None, ip=None) -> None:
    text = "{ .reg .pred p; .reg .b16 h; setp.ne.b32 p, $2, 0; cvt.u16.u32 h, $1; " \
        "@p st.global.b16 [$0], h; }"
    asm(None, [Int64(addr), Uint32(v), Uint32(pred)], text, "l,r,r", loc, ip, True)


@dsl_user_op
def st_u32_pred(addr: Int64, v: Uint32, pred: Uint32, *, loc=None, ip=None) -> None:
    text = "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p st.global.b32 [$0], $1; }"
    asm(None, [Int64(addr), Uint32(v), Uint32(pred)], text, "l,r,r", loc, ip, True)


@dsl_user_op
def st_v2_u32_pred(addr: Int64, w0: Uint32, w1: Uint32, pred: Uint32, *, loc=None,
                   ip=None) -> None:
    """Two 32-bit words to global `addr` (8-byte aligned) where `pred` != 0."""
    text = "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.v2.b32 [$0], {$1, $2}; }"
    asm(None, [Int64(addr), Uint32(w0), Uint32(w1), Uint32(pred)], text, "l,r,r,r", loc, ip,
        True)


# ---------------------------------------------------------------- global -> shared, asynchronous
# ``cp.async`` (sm_80+): no register is held while the copy is in flight. Completion is per
# thread and commit group; other threads may read the data after `cp_async_wait` and a barrier.


@dsl_user_op
def cp_async_16(smem: Int32, gmem: Int64, *, loc=None, ip=None) -> None:
    """Copy 16 bytes from global `gmem` to shared `smem` (both 16-byte aligned), via L2 only."""
    asm(None, [Int32(smem), Int64(gmem)], "cp.async.cg.shared.global [$0], [$1], 16;", "r,l",
        loc, ip, True)


def cp_async_wait_all() -> None:
    """Commit this thread's outstanding `cp_async_16` copies and wait until they have landed."""
    cute.arch.cp_async_commit_group()
    cute.arch.cp_async_wait_group(0)


# ---------------------------------------------------------------- shared memory


@dsl_user_op
def ld_shared_v4(addr: Int32, dtype=Float32, *, loc=None, ip=None) -> list:
    """16 bytes at 32-bit shared address `addr` (16-byte aligned) as 4 `dtype` (Float32 or
    Uint32)."""
    ty, ptx, c = _V4[dtype]
    ret = llvm.StructType.get_literal([ty()] * 4)
    text = f"ld.shared.v4.{ptx} {{$0, $1, $2, $3}}, [$4];"
    res = asm(ret, [Int32(addr)], text, f"={c},={c},={c},={c},r", loc, ip, True)
    return unpack(res, ty(), 4, dtype, loc, ip)


@dsl_user_op
def ld_shared_u16(addr: Int32, *, loc=None, ip=None) -> Uint32:
    """The 2 bytes at 32-bit shared address `addr`, zero-extended."""
    return Uint32(asm(T.i32(), [Int32(addr)], "ld.shared.u16 $0, [$1];", "=r,r", loc, ip, True))


@dsl_user_op
def st_shared_v2_f32(addr: Int32, x: Float32, y: Float32, *, loc=None, ip=None) -> None:
    """x, y to 32-bit shared address `addr` (8-byte aligned)."""
    asm(None, [Int32(addr), Float32(x), Float32(y)], "st.shared.v2.f32 [$0], {$1, $2};",
        "r,f,f", loc, ip, True)


@dsl_user_op
def st_shared_v4_u32(addr: Int32, words: list, *, loc=None, ip=None) -> None:
    """4 32-bit words to 32-bit shared address `addr` (16-byte aligned)."""
    asm(None, [Int32(addr)] + [Uint32(w) for w in words],
        "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", loc, ip, True)


@dsl_user_op
def st_shared_v4_f32(addr: Int32, xs: list, *, loc=None, ip=None) -> None:
    """4 float32 to 32-bit shared address `addr` (16-byte aligned)."""
    asm(None, [Int32(addr)] + [Float32(x) for x in xs],
        "st.shared.v4.f32 [$0], {$1, $2, $3, $4};", "r,f,f,f,f", loc, ip, True)
