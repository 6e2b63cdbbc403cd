# SPDX-License-Identifier: MIT
"""Instruction semantics: `decode(ins, machine)` -> a handler `(warp, mask, ins)`.

Handlers act on the lanes of `mask` (the lanes at this instruction, narrowed by its guard
predicate) with numpy arrays of 32 lanes. This module holds the SIMT core: integer, float and
predicate arithmetic, conversions, moves, loads and stores in every state space (and the
non-bulk `cp.async`), atomics, shuffles, votes, `redux`, `elect`, special registers, branches,
named and cluster barriers, mbarriers and the no-op fences; the asynchronous engines (TMA,
tcgen05, wgmma, cluster launch control) register their decoders in `ENGINES`
(`tk_cute.emulator.engines`). An opcode nobody decodes is an `EmulatorError` naming it, when
the kernel is loaded.
"""

from __future__ import annotations

import re

import numpy as np

from tk_cute.emulator import values as V
from tk_cute.emulator.machine import Block, MBarrier
from tk_cute.emulator.memory import (
    OFFSET_MASK, PARAM_WINDOW, RANK_SHIFT, SHARED_WINDOW, EmulatorError, MemoryFault)
from tk_cute.emulator.ptx import operand

ENGINES: dict = {}  # opcode prefix -> decoder(ins, machine) -> handler (the async engines)
NOOP = ("fence.", "membar.", "prefetch.", "prefetchu.", "griddepcontrol.", "nanosleep",
        "setmaxnreg.", "pmevent", ".pragma", "discard.")


def type_of(ins, default="b32") -> str:
    """The instruction's last type qualifier (".s32" -> "s32")."""
    for part in reversed(ins.op.split(".")):
        if part in V.TYPES:
            return part
    return default


def types_of(ins) -> list[str]:
    return [p for p in ins.op.split(".") if p in V.TYPES]


# --- operands ---------------------------------------------------------------------------
_IMM_F = re.compile(r"0[fF]([0-9a-fA-F]{8})$")
_IMM_D = re.compile(r"0[dD]([0-9a-fA-F]{16})$")


def special(w, name: str):
    """A special register (%tid.x, %ctaid.y, %laneid, %cluster_ctarank, ...) per lane."""
    m, cta = w.cta.machine, w.cta
    xyz = "xyz"
    base, _, comp = name.lstrip("%").partition(".")
    i = xyz.index(comp) if comp in ("x", "y", "z") else 0
    full = lambda v: np.full(32, v, np.uint32)
    cl = m.launch.cluster
    if base == "tid":
        return w.tid[i].astype(np.uint32)
    if base == "ntid":
        return full(m.launch.block[i])
    if base == "ctaid":
        return full(cta.ctaid[i])
    if base == "nctaid":
        return full(m.launch.grid[i])
    if base == "laneid":
        return w.lane.copy()
    if base == "warpid":
        return full(w.index)
    if base == "nwarpid":
        return full(len(cta.warps))
    if base == "cluster_ctarank":
        return full(cta.rank)
    if base == "cluster_nctarank":
        return full(len(cta.cluster.ctas))
    if base == "cluster_ctaid":
        return full(cta.ctaid[i] % cl[i])
    if base == "cluster_nctaid":
        return full(cl[i])
    if base == "clusterid":
        return full(cta.ctaid[i] // cl[i])
    if base == "nclusterid":
        return full(m.launch.grid[i] // cl[i])
    if base == "is_explicit_cluster":
        return full(int(any(c > 1 for c in cl)))
    if base in ("dynamic_smem_size",):
        return full(m.launch.smem_bytes)
    if base in ("total_smem_size",):
        return full(cta.smem.size)
    if base in ("smid",):
        return full(cta.sm)
    if base in ("clock", "clock64", "globaltimer", "globaltimer_lo"):
        return np.full(32, m.executed, np.uint64 if base != "clock" else np.uint32)
    if base.startswith("lanemask_"):
        lane, rel = w.lane.astype(np.int64), base[9:]
        bitsv = {"eq": 1 << lane, "lt": (1 << lane) - 1, "le": (2 << lane) - 1,
                 "gt": ~((2 << lane) - 1) & 0xFFFFFFFF, "ge": ~((1 << lane) - 1) & 0xFFFFFFFF}
        return bitsv[rel].astype(np.uint32)
    raise EmulatorError(f"special register {name} is not emulated")


def cast(v: np.ndarray, dt) -> np.ndarray:
    dt = np.dtype(dt)
    if v.dtype == dt:
        return v
    if v.dtype.itemsize == dt.itemsize and v.dtype != np.bool_ and dt != np.bool_:
        return v.view(dt)
    return v.astype(dt)


def symbol(w, name: str) -> int:
    m = w.cta.machine
    if name in m.symbols:
        return (w.cta.rank << RANK_SHIFT) | m.symbols[name]
    if name in m.param_offsets:
        return m.param_offsets[name]
    raise EmulatorError(f"unknown symbol {name!r}")


def read(w, text: str, t: str) -> np.ndarray:
    """Operand `text` as 32 lanes of PTX type `t`."""
    dt = V.DTYPES[t]
    if text.startswith("%") or "#" in text:
        if text in w.cta.machine.reg_types or "#" in text:
            if w.scoreboard:
                w.wait_scoreboard(text)
            return cast(w.storage(text), dt)
        return cast(special(w, text), dt)
    m = _IMM_F.match(text)
    if m:
        b = np.uint32(int(m.group(1), 16))
        return cast(np.full(32, b, np.uint32), dt) if np.dtype(dt).itemsize == 4 else np.full(
            32, np.float32(b.view(np.float32)), dt)
    m = _IMM_D.match(text)
    if m:
        b = np.uint64(int(m.group(1), 16))
        return cast(np.full(32, b, np.uint64), dt) if np.dtype(dt).itemsize == 8 else np.full(
            32, b.view(np.float64), dt)
    try:
        v = int(text.rstrip("U"), 0)
        return np.array([v] * 32, np.int64 if v < 2 ** 63 else np.uint64).astype(dt)
    except ValueError:
        pass
    try:
        return np.full(32, float(text), dt)
    except ValueError:
        return np.full(32, symbol(w, text), np.int64).astype(dt)


def write(w, name: str, v: np.ndarray, mask: np.ndarray):
    if name == "_":
        return
    reg = w.storage(name)
    v = cast(np.asarray(v), reg.dtype)
    if v.shape != reg.shape:
        v = np.broadcast_to(v, reg.shape)
    reg[mask] = v[mask]
    if w.scoreboard:
        w.scoreboard.pop(name, None)


def split_map(inner: str) -> tuple[str, list[str]]:
    """`map, {c0, c1}` (inside a TMA operand's brackets) -> ("map", ["c0", "c1"])."""
    mp, _, rest = inner.partition(",")
    return mp.strip(), vec(rest)


def vec(text: str) -> list[str]:
    """`{a, b}` -> ["a", "b"]; a single operand -> [it]."""
    t = text.strip()
    return [x.strip() for x in t[1:-1].split(",")] if t.startswith("{") else [t]


# --- memory -----------------------------------------------------------------------------
def space_of(ins) -> str:
    parts = ins.op.split(".")
    for p in parts[1:]:
        if p in ("param", "global", "local", "const"):
            return p
        if p.startswith("shared"):
            return "shared::cluster" if p == "shared::cluster" else "shared"
    return "generic"


def address(w, text: str) -> np.ndarray:
    """The 64-bit address of `[base+off]` per lane."""
    kind = operand(text)
    if kind[0] != "addr":
        raise EmulatorError(f"expected an address, got {text!r}")
    _, base, off = kind
    if base is None:
        return np.full(32, off, np.uint64)
    if base in w.cta.machine.reg_types or "#" in base:
        v = w.storage(base)
        v = v.astype(np.uint64) if v.dtype.itemsize < 8 else v.view(np.uint64)
    elif base.startswith("%"):
        v = special(w, base).astype(np.uint64)
    else:
        v = np.full(32, symbol(w, base), np.uint64)
    return v + np.uint64(off % (1 << 64))


def _split_generic(addrs: np.ndarray):
    sh = (addrs >= np.uint64(SHARED_WINDOW)) & (addrs < np.uint64(SHARED_WINDOW + (1 << 32)))
    pa = (addrs >= np.uint64(PARAM_WINDOW)) & (addrs < np.uint64(PARAM_WINDOW + (1 << 32)))
    return sh, pa


def load(w, space: str, addrs: np.ndarray, size: int, mask: np.ndarray) -> np.ndarray:
    """Bytes (32, size) read by the lanes of `mask` (others zero)."""
    out = np.zeros((32, size), np.uint8)
    if not mask.any():
        return out
    m = w.cta.machine
    if space == "generic":
        sh, pa = _split_generic(addrs)
        for sel, sp, base in ((sh, "shared::cluster", SHARED_WINDOW), (pa, "param", PARAM_WINDOW),
                              (~sh & ~pa, "global", 0)):
            if (sel & mask).any():
                part = load(w, sp, addrs - np.uint64(base), size, mask & sel)
                out[mask & sel] = part[mask & sel]
        return out
    a = addrs[mask]
    if space == "global":
        out[mask] = m.memory.read(a, size)
    elif space == "param":
        off = a.astype(np.int64)
        if off.min() < 0 or off.max() + size > m.params.size:
            raise MemoryFault(f"parameter read of {size} B at {int(off.max()):#x} is outside the "
                              f"{m.params.size} B of parameters")
        out[mask] = m.params[off[:, None] + np.arange(size)]
    elif space in ("shared", "shared::cluster"):
        ranks = (a >> np.uint64(RANK_SHIFT)).astype(np.int64)
        if space == "shared":
            ranks[:] = w.cta.rank
        rows = np.nonzero(mask)[0]
        for r in np.unique(ranks):
            cta = w.cta.cluster.ctas[int(r)] if r < len(w.cta.cluster.ctas) else None
            if cta is None:
                raise MemoryFault(f"shared::cluster address {int(a[ranks == r][0]):#x} names "
                                  f"CTA rank {int(r)}")
            sel = ranks == r
            offs = (a[sel] & np.uint64(OFFSET_MASK)).astype(np.int64)
            cta.smem.offsets(offs | (cta.rank << RANK_SHIFT), size, "ld")
            data, ok = cta.smem.read(offs, size)
            if not ok:
                m.hazard("uninitialized-shared", 0, f"{w.where} reads shared bytes at offset "
                         f"{int(offs[0]):#x} (CTA rank {int(r)}) that nothing wrote")
            out[rows[sel]] = data
    else:
        raise EmulatorError(f"loads from .{space} are not emulated")
    return out


def store(w, space: str, addrs: np.ndarray, data: np.ndarray, mask: np.ndarray):
    if not mask.any():
        return
    m, size = w.cta.machine, data.shape[1]
    if space == "generic":
        sh, pa = _split_generic(addrs)
        if (pa & mask).any():
            raise MemoryFault("store to the kernel parameters")
        if (sh & mask).any():
            store(w, "shared::cluster", addrs - np.uint64(SHARED_WINDOW), data, mask & sh)
        if (~sh & mask).any():
            store(w, "global", addrs, data, mask & ~sh)
        return
    a = addrs[mask]
    if space == "global":
        m.memory.write(a, data[mask])
    elif space in ("shared", "shared::cluster"):
        ranks = (a >> np.uint64(RANK_SHIFT)).astype(np.int64)
        if space == "shared":
            ranks[:] = w.cta.rank
        rows = np.nonzero(mask)[0]
        for r in np.unique(ranks):
            cta = w.cta.cluster.ctas[int(r)]
            sel = ranks == r
            offs = (a[sel] & np.uint64(OFFSET_MASK)).astype(np.int64)
            cta.smem.offsets(offs | (cta.rank << RANK_SHIFT), size, "st")
            cta.smem.write(offs, data[rows[sel]], writer=(w.cta.rank, w.index))
    else:
        raise EmulatorError(f"stores to .{space} are not emulated")


def as_bytes(v: np.ndarray, size: int) -> np.ndarray:
    return np.ascontiguousarray(v).view(np.uint8).reshape(32, -1)[:, :size]


def _ld(ins, m):
    t, space = type_of(ins), space_of(ins)
    dsts = vec(ins.args[0])
    el = V.bits(t) // 8
    size = el * len(dsts)

    def run(w, mask):
        raw = load(w, space, address(w, ins.args[1]), size, mask)
        for i, d in enumerate(dsts):
            if d != "_":
                write(w, d, raw[:, i * el:(i + 1) * el].copy().view(V.DTYPES[t])[:, 0], mask)
    return run


def _st(ins, m):
    t, space = type_of(ins), space_of(ins)
    srcs = vec(ins.args[1])
    el = V.bits(t) // 8

    def run(w, mask):
        data = np.concatenate([as_bytes(read(w, s, t), el) for s in srcs], axis=1)
        store(w, space, address(w, ins.args[0]), data, mask)
    return run


def _atom(ins, m):
    t, space = type_of(ins), space_of(ins)
    opname = next(p for p in ins.op.split(".")[1:] if p in (
        "add", "or", "and", "xor", "max", "min", "exch", "cas", "inc", "dec"))
    has_dst = ins.base == "atom"
    args = ins.args if has_dst else ("_",) + ins.args
    el, dt = V.bits(t) // 8, V.DTYPES[t]

    def run(w, mask):
        addrs = address(w, args[1])
        b = read(w, args[2], t)
        c = read(w, args[3], t) if len(args) > 3 else None
        old = np.zeros(32, dt)
        for lane in np.nonzero(mask)[0]:  # one lane at a time, in lane order
            one = np.zeros(32, bool)
            one[lane] = True
            cur = load(w, space, addrs, el, one)[lane].view(dt)[0]
            x = b[lane]
            new = {"add": cur + x, "or": cur | x, "and": cur & x, "xor": cur ^ x,
                   "max": max(cur, x), "min": min(cur, x), "exch": x,
                   "cas": c[lane] if c is not None and cur == x else cur,
                   "inc": 0 if cur >= x else cur + 1,
                   "dec": x if cur == 0 or cur > x else cur - 1}[opname]
            old[lane] = cur
            row = np.zeros((32, el), np.uint8)
            row[lane] = np.array([new], dt).view(np.uint8)
            store(w, space, addrs, row, one)
        write(w, args[0], old, mask)
    return run


# --- arithmetic ---------------------------------------------------------------------------
def _shift(a, s, t, left):
    w = V.bits(t)
    s = s.astype(np.int64)
    big = s >= w
    s2 = np.minimum(s, w - 1).astype(a.dtype if a.dtype.kind == "u" else np.int64)
    if left:
        r = np.left_shift(a, s2.astype(a.dtype))
        return np.where(big, np.zeros_like(a), r)
    r = np.right_shift(a, s2.astype(a.dtype))
    fill = np.where(a < 0, -1, 0).astype(a.dtype) if V.signed(t) else np.zeros_like(a)
    return np.where(big, fill, r)


def _ftz(x):
    tiny = np.finfo(np.float32).tiny
    return np.where(np.abs(x) < tiny, np.copysign(np.float32(0), x), x).astype(x.dtype)


def _binary(ins, m):
    op, t = ins.base, type_of(ins)
    parts = ins.op.split(".")
    if t == "f32x2":
        return _packed_f32(ins, op)
    if op in ("min", "max") and ("u16x2" in parts or "s16x2" in parts):
        return _packed_16(ins, op, np.uint16 if "u16x2" in parts else np.int16)
    if t in ("bf16x2", "f16x2", "bf16") and op in ("mul", "add", "sub", "fma", "min", "max"):
        return _half_float(ins, op, t)
    dt = V.DTYPES[t]
    wide, hi = "wide" in parts, "hi" in parts
    ftz = "ftz" in parts

    def f(a, b, c=None):
        if op in ("add", "sub", "mul", "mad", "fma") and V.is_float(t):
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            r = {"add": lambda: a64 + b64, "sub": lambda: a64 - b64, "mul": lambda: a64 * b64,
                 "mad": lambda: a64 * b64 + c.astype(np.float64),
                 "fma": lambda: a64 * b64 + c.astype(np.float64)}[op]().astype(dt)
            return _ftz(r) if ftz else r
        if op in ("mul", "mad"):
            if wide:
                w2 = {"s16": np.int32, "u16": np.uint32, "s32": np.int64, "u32": np.uint64}[t]
                r = a.astype(w2) * b.astype(w2)
                return r + c.astype(w2) if c is not None else r
            if hi:
                big = np.int64 if V.signed(t) and V.bits(t) < 64 else np.uint64
                if V.bits(t) == 64:
                    r = np.array([(int(x) * int(y)) >> 64 for x, y in zip(a, b)], dtype=object)
                    r = np.array([int(v) % (1 << 64) for v in r], np.uint64).astype(dt)
                else:
                    r = ((a.astype(big) * b.astype(big)) >> V.bits(t)).astype(dt)
                return r + c if c is not None else r
            r = a * b
            return r + c if c is not None else r
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "div":
            if V.is_float(t):
                return (a.astype(np.float64) / b.astype(np.float64)).astype(dt) if t == "f64" \
                    else (a / b).astype(dt)
            safe = np.where(b == 0, 1, b)
            q = np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64)) if V.signed(t) else \
                a // safe
            if V.signed(t):
                q = np.where((a < 0) ^ (b < 0), -q, q)
            return np.where(b == 0, np.full_like(a, 0 if V.signed(t) else np.iinfo(dt).max),
                            q).astype(dt)
        if op == "rem":
            safe = np.where(b == 0, 1, b)
            r = np.fmod(a, safe) if V.signed(t) else a % safe
            return r.astype(dt)
        if op in ("min", "max") and V.is_float(t) and "NaN" in parts:  # NaN if either is
            return (np.minimum if op == "min" else np.maximum)(a, b)
        if op == "min":
            return np.fmin(a, b) if V.is_float(t) else np.minimum(a, b)
        if op == "max":
            return np.fmax(a, b) if V.is_float(t) else np.maximum(a, b)
        if op == "and":
            return a & b
        if op == "or":
            return a | b
        if op == "xor":
            return a ^ b
        if op == "shl":
            return _shift(a, b, t, True)
        if op == "shr":
            return _shift(a, b, t, False)
        raise EmulatorError(f"{ins.op} is not emulated")

    nsrc = 3 if op in ("mad", "fma") else 2
    out_t = {"s16": "s32", "u16": "u32", "s32": "s64", "u32": "u64"}.get(t) if wide else t
    src_t = "u32" if op in ("shl", "shr") else t

    def run(w, mask):
        a = read(w, ins.args[1], t)
        b = read(w, ins.args[2], src_t if op in ("shl", "shr") else t)
        c = read(w, ins.args[3], out_t) if nsrc == 3 else None
        with np.errstate(all="ignore"):
            write(w, ins.args[0], f(a, b, c), mask)
    return run


def _packed_16(ins, op, dt):
    """min / max .u16x2 / .s16x2: each 16-bit half on its own."""
    f = np.minimum if op == "min" else np.maximum

    def run(w, mask):
        a, b = (read(w, x, "b32").view(dt).reshape(32, 2) for x in ins.args[1:3])
        write(w, ins.args[0], f(a, b).astype(dt).reshape(-1).view(np.uint32), mask)
    return run


def _half_float(ins, op, t):
    """mul / min / max of .bf16 and of .bf16x2 / .f16x2 pairs (one per 16-bit half, low
    first): a product of two 16-bit floats is exact in float32, then rounded once to nearest
    even (the ISA's .rn, the default). add / sub / fma, .ftz and .sat raise when executed (a
    float64 sum rounded to 16 bits through float32 could round twice)."""
    if op not in ("mul", "min", "max") or "ftz" in ins.op.split(".") or "sat" in ins.op:
        def unsupported(w, mask):
            if mask.any():
                raise EmulatorError(f"PTX line {ins.line}: `{ins.op}` is not emulated")
        return unsupported
    bf = t.startswith("bf")
    pair = t.endswith("x2")
    nan = "NaN" in ins.op.split(".")

    def to_f32(r):  # (32,) raw -> (32, halves) float32
        h = (r.view(np.uint32).reshape(32, 1) >> np.array([0, 16], np.uint32)) & 0xFFFF if pair \
            else r.astype(np.uint32).reshape(32, 1)
        h = h.astype(np.uint16)
        return V.bf16_to_f32(h) if bf else h.view(np.float16).astype(np.float32)

    def run(w, mask):
        a, b = (to_f32(read(w, x, "b32" if pair else "b16")) for x in ins.args[1:3])
        if op == "mul":
            r = a * b  # exact in float32 (8 + 8 or 11 + 11 significant bits)
        elif nan:
            r = (np.minimum if op == "min" else np.maximum)(a, b)
        else:
            r = (np.fmin if op == "min" else np.fmax)(a, b)
        h = V.f32_to_bf16(r) if bf else r.astype(np.float16).view(np.uint16)
        h = h.astype(np.uint32)
        v = (h[:, 0] | (h[:, 1] << np.uint32(16))) if pair else h[:, 0]
        write(w, ins.args[0], v.astype(np.uint32 if pair else np.uint16), mask)
    return run


def _lop3(ins, m):
    """lop3.b32 d, a, b, c, immLut: bit i of d is bit (a_i << 2 | b_i << 1 | c_i) of immLut
    (the table of F(0xF0, 0xCC, 0xAA))."""
    if "|" in ins.args[0] or len(ins.args) != 5:
        raise EmulatorError(f"PTX line {ins.line}: `{ins.op}` with a predicate is not emulated")

    def run(w, mask):
        a, b, c = (read(w, x, "b32").astype(np.uint64) for x in ins.args[1:4])
        lut = int(read(w, ins.args[4], "b32")[0]) & 0xFF
        r = np.zeros(32, np.uint64)
        for i in range(8):
            if lut >> i & 1:
                r |= ((a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c))
        write(w, ins.args[0], (r & np.uint64(0xFFFFFFFF)).astype(np.uint32), mask)
    return run


CP_ASYNC = ("cp.async.ca.", "cp.async.cg.", "cp.async.commit_group", "cp.async.wait_group",
            "cp.async.wait_all")


def _cp_async(ins, m):
    """The non-bulk `cp.async.{ca,cg}.shared{::cta}.global [dst], [src], cp-size{, src-size}
    {, cache-policy}` (bytes past src-size are zeros) and its commit / wait groups. The copy
    lands when the instruction runs (the order a correct kernel waits for); a read before its
    wait_group is not detected. The ignore-src predicate and `.mbarrier` completion are not
    emulated (an error when the kernel is loaded)."""
    if not ins.op.startswith(("cp.async.ca.", "cp.async.cg.")):
        return lambda w, mask: None  # commit_group / wait_group / wait_all
    extra = list(ins.args[3:])
    if "cache_hint" in ins.op and extra:
        extra.pop()  # the cache policy
    if len(extra) > 1 or any(m.reg_types.get(x) == "pred" for x in extra):
        raise EmulatorError(f"PTX line {ins.line}: `{ins.op}` with ignore-src is not emulated")
    size = int(ins.args[2], 0)

    def run(w, mask):
        if not mask.any():
            return
        src_size = (read(w, extra[0], "u32").astype(np.int64) if extra
                    else np.full(32, size, np.int64))
        data = load(w, "global", address(w, ins.args[1]), size, mask & (src_size > 0))
        data[np.arange(size)[None, :] >= src_size[:, None]] = 0
        store(w, "shared", address(w, ins.args[0]), data, mask)
    return run


def _packed_f32(ins, op):
    def run(w, mask):
        srcs = [read(w, a, "b64").view(np.float32).reshape(32, 2).astype(np.float64)
                for a in ins.args[1:]]
        if op == "add":
            r = srcs[0] + srcs[1]
        elif op == "sub":
            r = srcs[0] - srcs[1]
        elif op == "mul":
            r = srcs[0] * srcs[1]
        elif op == "fma":
            r = srcs[0] * srcs[1] + srcs[2]
        else:
            raise EmulatorError(f"{ins.op} is not emulated")
        write(w, ins.args[0], r.astype(np.float32).reshape(-1).view(np.uint64), mask)
    return run


def _unary(ins, m):
    op, t = ins.base, type_of(ins)
    dt = V.DTYPES[t]
    approx = "approx" in ins.op.split(".")

    def f(a):
        if op == "not":
            return ~a
        if op == "cnot":
            return (a == 0).astype(dt)
        if op == "neg":
            return -a
        if op == "abs":
            return np.abs(a)
        if op == "popc":
            return np.array([bin(int(x)).count("1") for x in a.view(
                np.uint64 if V.bits(t) == 64 else np.uint32)], np.uint32)
        if op == "clz":
            n = V.bits(t)
            return np.array([n - int(x).bit_length() for x in a.view(
                np.uint64 if n == 64 else np.uint32)], np.uint32)
        if op == "brev":
            n = V.bits(t)
            return np.array([int(f"{int(x):0{n}b}"[::-1], 2) for x in a], dt)
        if op == "bfind":
            u = a.astype(np.int64)
            return np.array([int(x).bit_length() - 1 if x > 0 else 0xFFFFFFFF for x in u],
                            np.int64).astype(np.uint32)
        x64 = a.astype(np.float64)
        r = {"rcp": lambda: 1.0 / x64, "sqrt": lambda: np.sqrt(x64),
             "rsqrt": lambda: 1.0 / np.sqrt(x64), "ex2": lambda: np.exp2(x64),
             "lg2": lambda: np.log2(x64), "sin": lambda: np.sin(x64),
             "cos": lambda: np.cos(x64), "tanh": lambda: np.tanh(x64)}.get(op)
        if r is None:
            raise EmulatorError(f"{ins.op} is not emulated")
        return r().astype(dt)

    out_t = "u32" if op in ("popc", "clz", "bfind") else t
    if approx:
        m.extra.setdefault("approximate", set()).add(ins.op)

    def run(w, mask):
        with np.errstate(all="ignore"):
            write(w, ins.args[0], cast(f(read(w, ins.args[1], t)), V.DTYPES[out_t]), mask)
    return run


_CMP = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal,
    "hi": np.greater, "hs": np.greater_equal,
}


def _compare(cmp: str, a, b):
    if cmp in _CMP:
        r = _CMP[cmp](a, b)
        return r if cmp != "ne" or a.dtype.kind != "f" else r  # ne is unordered-false for NaN
    base = cmp[:-1] if cmp.endswith("u") else None
    if base in _CMP:
        return _CMP[base](a, b) | np.isnan(a) | np.isnan(b)
    if cmp == "num":
        return ~(np.isnan(a) | np.isnan(b))
    if cmp == "nan":
        return np.isnan(a) | np.isnan(b)
    raise EmulatorError(f"comparison {cmp} is not emulated")


def _setp(ins, m):
    parts = ins.op.split(".")
    cmp, t = parts[1], type_of(ins)
    if t[0] == "b" and cmp in ("lo", "ls", "hi", "hs", "lt", "le", "gt", "ge"):
        t = "u" + t[1:]
    combine = next((p for p in parts[2:] if p in ("and", "or", "xor")), None)
    dsts = ins.args[0].split("|")

    def run(w, mask):
        a, b = read(w, ins.args[1], t), read(w, ins.args[2], t)
        with np.errstate(invalid="ignore"):
            r = _compare(cmp, a, b)
        if cmp == "ne" and a.dtype.kind == "f":
            r = r & ~(np.isnan(a) | np.isnan(b))
        if combine:
            c = read(w, ins.args[3].lstrip("!"), "pred")
            c = ~c if ins.args[3].startswith("!") else c
            r = {"and": r & c, "or": r | c, "xor": r ^ c}[combine]
            q = {"and": ~r & c, "or": ~r | c, "xor": ~r ^ c}[combine]
        else:
            q = ~r
        write(w, dsts[0].strip(), r, mask)
        if len(dsts) > 1:
            write(w, dsts[1].strip(), q, mask)
    return run


def _selp(ins, m):
    t = type_of(ins)

    def run(w, mask):
        c = read(w, ins.args[3], "pred")
        write(w, ins.args[0], np.where(c, read(w, ins.args[1], t), read(w, ins.args[2], t)),
              mask)
    return run


def _logic_pred(ins, m):
    op = ins.base

    def run(w, mask):
        srcs = []
        for a in ins.args[1:]:
            v = read(w, a.lstrip("!"), "pred")
            srcs.append(~v if a.startswith("!") else v)
        r = {"and": lambda: srcs[0] & srcs[1], "or": lambda: srcs[0] | srcs[1],
             "xor": lambda: srcs[0] ^ srcs[1], "not": lambda: ~srcs[0]}[op]()
        write(w, ins.args[0], r, mask)
    return run


def _deferred(w, srcs, dsts, run, mask) -> bool:
    """A move whose source an asynchronous load has not written yet (a tcgen05.ld in flight)
    is done when that load completes, its destinations in flight with it: register renaming,
    which needs no wait (ptxas folds these moves away), unlike a use of the value."""
    ops = {id(w.scoreboard[s]): w.scoreboard[s] for s in srcs if s in w.scoreboard}
    if not ops:
        return False
    op = max(ops.values(), key=lambda o: w.cta.machine.pending.index(o)
             if o in w.cta.machine.pending else -1)
    m = mask.copy()
    op.after.append(lambda: run(w, m))
    for d in dsts:
        if d != "_":
            w.scoreboard[d] = op
    return True


def _mov(ins, m):
    plain = _mov_now(ins, m)
    srcs = vec(ins.args[1])
    dsts = vec(ins.args[0])

    def run(w, mask):
        if w.scoreboard and _deferred(w, srcs, dsts, plain, mask):
            return
        plain(w, mask)
    return run


def _mov_now(ins, m):
    t = type_of(ins)
    dst, src = ins.args[0], ins.args[1]
    if dst.startswith("{"):  # unpack: mov.b64 {%r1, %r2}, %rd
        parts = vec(dst)
        el = V.bits(t) // 8 // len(parts)
        sub = {1: "b8", 2: "b16", 4: "b32", 8: "b64"}[el]

        def run(w, mask):
            raw = as_bytes(read(w, src, t), V.bits(t) // 8)
            for i, d in enumerate(parts):
                write(w, d, raw[:, i * el:(i + 1) * el].copy().view(V.DTYPES[sub])[:, 0], mask)
        return run
    if src.startswith("{"):  # pack: mov.b64 %rd, {%r1, %r2}
        parts = vec(src)
        el = V.bits(t) // 8 // len(parts)
        sub = {1: "b8", 2: "b16", 4: "b32", 8: "b64"}[el]

        def run(w, mask):
            raw = np.concatenate([as_bytes(read(w, s, sub), el) for s in parts], axis=1)
            v = raw.copy().view(np.uint64 if t == "b128" else V.DTYPES[t])
            write(w, dst, v if t == "b128" else v[:, 0], mask)
        return run

    def run(w, mask):
        write(w, dst, read(w, src, t), mask)
    return run


def _cvt(ins, m):
    ts = types_of(ins)
    dt_, st_ = ts[-2], ts[-1]
    parts = ins.op.split(".")
    sat = "sat" in parts or "satfinite" in parts
    rnd = next((p for p in parts if p in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")),
               None)
    nsrc = len(ins.args) - 1

    def to_float(a):
        if st_ == "bf16":
            return V.bf16_to_f32(a).astype(np.float64)
        return a.astype(np.float64)

    def run(w, mask):
        if dt_ in ("bf16x2", "f16x2", "e4m3x2", "e5m2x2", "e2m1x2") and nsrc == 2:
            hi = read(w, ins.args[1], st_).astype(np.float64)
            lo = read(w, ins.args[2], st_).astype(np.float64)
            enc = {"bf16x2": (lambda x: V.f32_to_bf16(x.astype(np.float32)), 16),
                   "f16x2": (lambda x: x.astype(np.float16).view(np.uint16), 16),
                   "e4m3x2": (V.e4m3_encode, 8), "e2m1x2": (V.e2m1_encode, 4)}[dt_]
            f, nb = enc
            r = (f(hi).astype(np.uint64) << np.uint64(nb)) | f(lo).astype(np.uint64)
            write(w, ins.args[0], r.astype(V.DTYPES[dt_]), mask)
            return
        if st_ in ("e4m3x2", "e2m1x2", "e5m2x2") and dt_ in ("f16x2", "bf16x2"):
            a = read(w, ins.args[1], st_).astype(np.int64)
            nb = 4 if st_ == "e2m1x2" else 8
            dec = {"e4m3x2": V.e4m3_decode, "e2m1x2": V.e2m1_decode, "e5m2x2": V.e5m2_decode}[st_]
            lo, hi = dec(a & ((1 << nb) - 1)), dec(a >> nb & ((1 << nb) - 1))
            h = lambda x: (x.astype(np.float16).view(np.uint16) if dt_ == "f16x2" else
                           V.f32_to_bf16(x.astype(np.float32))).astype(np.uint32)
            write(w, ins.args[0], (h(hi) << np.uint32(16)) | h(lo), mask)
            return
        a = read(w, ins.args[1], st_)
        if V.is_float(dt_):
            x = to_float(a) if V.is_float(st_) else a.astype(np.float64)
            if dt_ == "bf16":
                r = V.f32_to_bf16(x.astype(np.float32))
            else:
                r = x.astype(V.DTYPES[dt_])
            if sat and dt_ != "bf16":
                r = np.clip(r, 0, 1)
            write(w, ins.args[0], r, mask)
            return
        info = np.iinfo(V.DTYPES[dt_]) if dt_ not in ("pred",) else None
        if V.is_float(st_):
            x = to_float(a)
            x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil,
                 None: np.trunc, "rn": np.rint, "rz": np.trunc}.get(rnd, np.trunc)(x)
            x = np.nan_to_num(np.clip(x, info.min, info.max), nan=0.0)
            write(w, ins.args[0], x.astype(V.DTYPES[dt_]), mask)
            return
        if sat:
            a = np.clip(a.astype(np.float64), info.min, info.max).astype(np.int64)
        write(w, ins.args[0], np.asarray(a).astype(V.DTYPES[dt_]), mask)
    return run


def _cvta(ins, m):
    to = ".to." in ins.op or ins.op.startswith("cvta.to")
    space = "param" if ".param" in ins.op else ("shared" if ".shared" in ins.op else "global")
    window = {"shared": SHARED_WINDOW, "param": PARAM_WINDOW, "global": 0}[space]
    t = type_of(ins, "u64")

    def run(w, mask):
        a = read(w, ins.args[1], "u64")
        if not to and space == "shared":
            a = a & np.uint64(0xFFFFFFFF)
            a = np.where(a >> np.uint64(RANK_SHIFT) == 0, a | np.uint64(w.cta.rank << RANK_SHIFT),
                         a)
        r = a - np.uint64(window) if to else a + np.uint64(window)
        write(w, ins.args[0], r.astype(V.DTYPES[t]), mask)
    return run


def _mapa(ins, m):
    generic = "shared" not in ins.op

    def run(w, mask):
        a = read(w, ins.args[1], "u64")
        if generic:
            a = a - np.uint64(SHARED_WINDOW)
        rank = read(w, ins.args[2], "u64")
        r = (rank << np.uint64(RANK_SHIFT)) | (a & np.uint64(OFFSET_MASK))
        if generic:
            r = r + np.uint64(SHARED_WINDOW)
        write(w, ins.args[0], r, mask)
    return run


def _bfe(ins, m):
    t = type_of(ins)

    def run(w, mask):
        a = read(w, ins.args[1], t).astype(np.int64 if V.signed(t) else np.uint64)
        pos = read(w, ins.args[2], "u32").astype(np.int64) & 0xFF
        ln = read(w, ins.args[3], "u32").astype(np.int64) & 0xFF
        n = V.bits(t)
        out = []
        for x, p, l in zip(a, pos, ln):
            x = int(x) % (1 << n)
            v = (x >> min(p, n - 1)) & ((1 << l) - 1) if l else 0
            if V.signed(t) and l and (v >> (l - 1)) & 1 and p + l <= n:
                v -= 1 << l
            elif V.signed(t) and l and p + l > n and (x >> (n - 1)) & 1:
                v |= -1 << max(n - p, 0)
            out.append(v % (1 << n))
        write(w, ins.args[0], np.array(out, np.uint64).astype(V.DTYPES[t]), mask)
    return run


def _bfi(ins, m):
    t = type_of(ins)

    def run(w, mask):
        f, b = read(w, ins.args[1], t).astype(np.uint64), read(w, ins.args[2], t).astype(np.uint64)
        pos = read(w, ins.args[3], "u32").astype(np.uint64) & np.uint64(0xFF)
        ln = read(w, ins.args[4], "u32").astype(np.uint64) & np.uint64(0xFF)
        msk = ((np.uint64(1) << ln) - np.uint64(1)) << pos
        r = (b & ~msk) | ((f << pos) & msk)
        write(w, ins.args[0], r.astype(V.DTYPES[t]), mask)
    return run


def _prmt(ins, m):
    if len(ins.op.split(".")) > 2 and ins.op.split(".")[2] not in ("b32",):
        raise EmulatorError(f"{ins.op}: only the default prmt mode is emulated")

    def run(w, mask):
        a, b = read(w, ins.args[1], "u32"), read(w, ins.args[2], "u32")
        c = read(w, ins.args[3], "u32")
        src = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
        out = np.zeros(32, np.uint32)
        for i in range(4):
            sel = (c >> np.uint32(4 * i)) & np.uint32(0xF)
            byte = (src >> (np.uint64(8) * (sel & np.uint32(7)).astype(np.uint64))) & np.uint64(
                0xFF)
            sign = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
            byte = np.where(sel & np.uint32(8), sign, byte).astype(np.uint32)
            out |= byte << np.uint32(8 * i)
        write(w, ins.args[0], out, mask)
    return run


# --- warp-collective ----------------------------------------------------------------------
def _aligned_check(w, mask, ins):
    live = ~w.exited
    if ".aligned" in ins.op or ins.base in ("bar", "barrier") and ".sync" in ins.op:
        if not (mask == live).all() and ins.pred is None:
            w.cta.machine.hazard("diverged-aligned", ins.line, f"{w.where} executes `{ins.op}` "
                                 f"with lanes {np.nonzero(live & ~mask)[0].tolist()} elsewhere")


def _shfl(ins, m):
    parts = ins.op.split(".")
    mode = next(p for p in parts if p in ("idx", "up", "down", "bfly"))
    dsts = ins.args[0].split("|")

    def run(w, mask):
        _aligned_check(w, mask, ins)
        a = read(w, ins.args[1], "b32")
        b = read(w, ins.args[2], "u32").astype(np.int64)
        c = read(w, ins.args[3], "u32").astype(np.int64)
        lane = w.lane.astype(np.int64)
        seg = (c >> 8) & 0x1F
        clamp = c & 0x1F
        lo = lane & seg
        hi = lo | (clamp & ~seg)
        j = {"idx": lo | (b & ~seg), "up": lane - b, "down": lane + b, "bfly": lane ^ b}[mode]
        ok = (j >= hi) if mode == "up" else (j <= hi)
        j = np.where(ok, j, lane) & 31
        write(w, dsts[0].strip(), a[j], mask)
        if len(dsts) > 1:
            write(w, dsts[1].strip(), ok, mask)
    return run


def _vote(ins, m):
    mode = ins.op.split(".")[2] if ins.op.split(".")[1] == "sync" else ins.op.split(".")[1]

    def run(w, mask):
        _aligned_check(w, mask, ins)
        src = ins.args[1]
        p = read(w, src.lstrip("!"), "pred")
        p = ~p if src.startswith("!") else p
        members = mask & ((read(w, ins.args[2], "u32")[0] >> w.lane) & 1).astype(bool) if len(
            ins.args) > 2 else mask
        if mode == "ballot":
            r = np.full(32, int(np.sum((p & members).astype(np.uint64) << w.lane.astype(
                np.uint64))), np.uint32)
        else:
            v = {"any": (p & members).any(), "all": (p | ~members).all(),
                 "uni": (p[members].all() or not p[members].any())}[mode]
            r = np.full(32, v, bool)
        write(w, ins.args[0], r, mask)
    return run


def _redux(ins, m):
    """redux.sync.{add,min,max}.{u32,s32} / .{and,or,xor}.b32 d, a, membermask: every lane of
    the mask (those executing it) gets the reduction over them (sum mod 2^32)."""
    op = ins.op.split(".")[2]
    t = type_of(ins)

    def run(w, mask):
        members = mask & ((read(w, ins.args[2], "u32")[0] >> w.lane) & 1).astype(bool)
        if not members.any():
            return
        a = read(w, ins.args[1], t)[members]
        if op == "add":
            v = int(a.astype(np.int64).sum()) & 0xFFFFFFFF
        elif op in ("min", "max"):
            v = int(a.min() if op == "min" else a.max()) & 0xFFFFFFFF
        else:
            v = int({"and": np.bitwise_and, "or": np.bitwise_or,
                     "xor": np.bitwise_xor}[op].reduce(a.astype(np.uint32)))
        write(w, ins.args[0], np.full(32, v, np.uint32), members)
    return run


def _elect(ins, m):
    dsts = ins.args[0].split("|")

    def run(w, mask):
        members = mask & ((read(w, ins.args[1], "u32")[0] >> w.lane) & 1).astype(bool)
        leader = int(np.nonzero(members)[0][0]) if members.any() else 0
        write(w, dsts[0].strip(), np.full(32, leader, np.uint32), mask)
        if len(dsts) > 1:
            write(w, dsts[1].strip(), w.lane == leader, mask)
    return run


def _activemask(ins, m):
    def run(w, mask):
        v = int(np.sum(mask.astype(np.uint64) << w.lane.astype(np.uint64)))
        write(w, ins.args[0], np.full(32, v, np.uint32), mask)
    return run


# --- control and barriers ---------------------------------------------------------------
def _bra(ins, m):
    target = m.fn.labels[ins.args[0]]

    def run(w, mask):
        w.pc[mask] = target
    return run


def _ret(ins, m):
    def run(w, mask):
        w.exited |= mask
    return run


def _trap(ins, m):
    def run(w, mask):
        if mask.any():
            raise EmulatorError("trap executed")
    return run


def _bar(ins, m):
    """bar.sync / barrier.sync / bar.arrive id[, count]: warps count 32 threads each.
    bar.warp.sync membermask: the warp's lanes of the mask converge (a warp runs in lockstep
    here: a mask lane that is live but elsewhere is a `diverged-aligned` hazard)."""
    if ins.op.startswith("bar.warp.sync"):
        return _warp_sync(ins)
    arrive_only = ".arrive" in ins.op

    def run(w, mask):
        if not mask.any():
            return
        _aligned_check(w, mask, ins)
        bid = int(read(w, ins.args[0], "u32")[mask][0]) if ins.args else 0
        count = int(read(w, ins.args[1], "u32")[mask][0]) if len(ins.args) > 1 else \
            32 * len(w.cta.warps)
        b = w.cta.named.setdefault(bid, {"arrived": 0, "gen": 0, "count": count})
        key = ("bar", bid)
        if key not in w.state:
            if b["arrived"] and b["count"] != count:
                w.cta.machine.hazard("barrier-count", ins.line, f"named barrier {bid}: "
                                     f"{count} threads here, {b['count']} at its first arrival")
            b["count"] = count
            b["arrived"] += 32
            gen = b["gen"]
            if b["arrived"] >= b["count"]:
                b["arrived"], b["gen"] = 0, b["gen"] + 1
            if arrive_only:
                return
            w.state[key] = gen
        gen = w.state[key]
        if b["gen"] == gen:
            raise Block(lambda: b["gen"] != gen,
                        f"named barrier {bid} ({b['arrived']} of {b['count']} threads arrived)")
        del w.state[key]
    return run


def _warp_sync(ins):
    def run(w, mask):
        if not mask.any():
            return
        members = ((read(w, ins.args[0], "u32")[mask][0] >> w.lane.astype(np.uint32)) & 1
                   ).astype(bool)
        stray = members & ~w.exited & ~mask
        if stray.any():
            w.cta.machine.hazard("diverged-aligned", ins.line, f"{w.where} executes "
                                 f"`{ins.op}` with lanes {np.nonzero(stray)[0].tolist()} of its "
                                 f"mask elsewhere")
    return run


def _cluster_barrier(ins, m):
    wait = ".wait" in ins.op

    def run(w, mask):
        if not mask.any():
            return
        cl = w.cta.cluster
        b = cl.barrier
        total = sum(c.threads for c in cl.ctas)
        if not wait:
            b["arrived"] += int(mask.sum()) + int((w.live & ~mask & ~w.exited).sum())
            w.state["cluster"] = b["gen"]
            if b["arrived"] >= total:
                b["arrived"], b["gen"] = 0, b["gen"] + 1
            return
        gen = w.state.get("cluster")
        if gen is None:
            raise EmulatorError("barrier.cluster.wait without a barrier.cluster.arrive")
        if b["gen"] == gen:
            raise Block(lambda: b["gen"] != gen, f"cluster barrier ({b['arrived']} of {total} "
                        f"threads arrived)")
        del w.state["cluster"]
    return run


def mbarrier_at(w, addr: int, line: int, remote: bool):
    """The mbarrier at a shared (::cta or ::cluster) address."""
    if remote:
        cta, off = w.cta.machine.shared_target(w.cta, addr)
    else:
        cta, off = w.cta, addr & OFFSET_MASK
    b = cta.mbarriers.get(off)
    if b is None:
        raise EmulatorError(f"mbarrier at shared offset {off:#x} of CTA rank {cta.rank} was "
                            f"never initialized")
    return b


def _mbarrier(ins, m):
    """mbarrier.init / arrive[.expect_tx] / arrive_drop / expect_tx / try_wait / test_wait
    (parity or token) / inval; each lane names its barrier (remote lanes may differ)."""
    parts = ins.op.split(".")
    kind = parts[1]
    remote = "shared::cluster" in parts
    generic = not any(p.startswith("shared") for p in parts)
    has_state = not ins.args[0].startswith("[")  # a destination (state / predicate) first
    where = ins.args[1] if has_state else ins.args[0]
    rest = ins.args[2:] if has_state else ins.args[1:]

    def groups(w, mask):
        """(barrier address, lanes) for each distinct address of the lanes of `mask`."""
        a = address(w, where)
        if generic:
            a = a - np.uint64(SHARED_WINDOW)
        out = {}
        for lane in np.nonzero(mask)[0]:
            out.setdefault(int(a[lane]), []).append(lane)
        return out.items()

    def barrier(w, addr):
        return mbarrier_at(w, addr, ins.line, remote or generic)

    def run(w, mask):
        if not mask.any():
            return
        if kind == "init":
            count = read(w, rest[0], "u32")
            for a, lanes in groups(w, mask):
                n = int(count[lanes[0]])
                w.cta.mbarriers[a & OFFSET_MASK] = MBarrier(n, n, line=ins.line)
            return
        if kind == "expect_tx":
            tx = read(w, rest[0], "u32")
            for a, lanes in groups(w, mask):
                b = barrier(w, a)
                b.tx += int(tx[lanes].astype(np.int64).sum())
                check_tx(w.cta.machine, b, ins.line)
            return
        if kind in ("arrive", "arrive_drop"):
            tx = read(w, rest[0], "u32") if "expect_tx" in parts else None
            more = rest[1:] if tx is not None else rest
            count = read(w, more[0], "u32") if more else np.ones(32, np.uint32)
            token = np.zeros(32, np.uint64)
            for a, lanes in groups(w, mask):
                b = barrier(w, a)
                token[lanes] = b.phase
                if tx is not None:
                    b.tx += int(tx[lanes].astype(np.int64).sum())
                n = int(count[lanes].astype(np.int64).sum())
                if kind == "arrive_drop":
                    b.expected -= n
                b.pending -= n
                if b.pending < 0:
                    w.cta.machine.hazard("arrival-overflow", ins.line, f"mbarrier initialized "
                                         f"at line {b.line}: {-b.pending} more arrivals than its "
                                         f"count {b.expected} in phase {b.phase}")
                    b.pending = 0
                check_tx(w.cta.machine, b, ins.line)
                b.complete_if_due()
            w.cta.machine.released(w, ins)
            if has_state:
                write(w, ins.args[0], token, mask)
            return
        if kind in ("try_wait", "test_wait"):
            arg = read(w, rest[0], "u64")
            ok = np.zeros(32, bool)
            waits = []
            for a, lanes in groups(w, mask):
                b = barrier(w, a)
                if "parity" in parts:
                    parity = int(arg[lanes[0]]) & 1
                    done = (lambda b, p: lambda: (b.phase & 1) != p)(b, parity)
                else:
                    done = (lambda b, t: lambda: b.phase != t)(b, int(arg[lanes[0]]))
                ok[lanes] = done()
                waits.append((b, done))
            if kind == "try_wait" and not ok[mask].all():
                b = next(b for b, d in waits if not d())
                raise Block(lambda: all(d() for _, d in waits),
                            f"mbarrier (initialized at line {b.line}) wait: phase {b.phase}, "
                            f"{b.pending} of {b.expected} arrivals and tx-count {b.tx} pending")
            if "parity" in parts:
                for b, d in waits:
                    if d():
                        _check_lap(w, b, ins)
            write(w, ins.args[0], ok, mask)
            return
        if kind == "inval":
            for a, _ in groups(w, mask):
                w.cta.mbarriers.pop(a & OFFSET_MASK, None)
            return
        raise EmulatorError(f"{ins.op} is not emulated")
    return run


def _check_lap(w, b: MBarrier, ins):
    """A parity wait tells phases apart only from the one before (PTX ISA 9.7.13.15.16): a warp
    whose successful waits on one barrier see it two or more phases on has lapped it, and its
    wait may have been answered by an older phase than it meant (`parity-lap`)."""
    key = ("phase", id(b))
    last = w.state.get(key)
    if last is not None and b.phase - last >= 2:
        w.cta.machine.hazard("parity-lap", ins.line, f"{w.where} waits on the mbarrier "
                             f"initialized at line {b.line} at phase {b.phase}; its previous "
                             f"wait there saw phase {last}: a parity wait more than one phase "
                             f"old")
    w.state[key] = b.phase


TX_LIMIT = (1 << 20) - 1


def check_tx(m, b: MBarrier, line: int):
    if abs(b.tx) > TX_LIMIT:
        m.hazard("tx-count", line, f"mbarrier initialized at line {b.line}: tx-count {b.tx} "
                 f"beyond +-(2^20 - 1)")


def _noop(ins, m):
    proxy = ins.op.startswith("fence.proxy.async")

    def run(w, mask):
        if proxy and mask.any():  # this warp's generic shared writes are visible to the async proxy
            for cta in w.cta.cluster.ctas:
                cta.smem.fence_proxy((w.cta.rank, w.index))
    return run


DECODERS = {
    "ld": _ld, "ldu": _ld, "st": _st, "atom": _atom, "red": _atom,
    "add": _binary, "sub": _binary, "mul": _binary, "mad": _binary, "fma": _binary,
    "div": _binary, "rem": _binary, "min": _binary, "max": _binary, "shl": _binary,
    "and": _binary, "or": _binary, "xor": _binary,
    "shr": _binary, "not": _unary, "cnot": _unary, "neg": _unary, "abs": _unary,
    "popc": _unary, "clz": _unary, "brev": _unary, "bfind": _unary, "rcp": _unary,
    "sqrt": _unary, "rsqrt": _unary, "ex2": _unary, "lg2": _unary, "sin": _unary,
    "cos": _unary, "tanh": _unary, "setp": _setp, "selp": _selp, "mov": _mov, "cvt": _cvt,
    "cvta": _cvta, "mapa": _mapa, "bfe": _bfe, "bfi": _bfi, "prmt": _prmt, "shfl": _shfl,
    "vote": _vote, "redux": _redux, "elect": _elect, "activemask": _activemask, "bra": _bra,
    "ret": _ret, "lop3": _lop3,
    "exit": _ret, "trap": _trap, "bar": _bar, "barrier": _bar, "mbarrier": _mbarrier,
}


def decode(ins, m):
    """The handler of `ins`: its guard applied, then its semantics (raises on an unknown op)."""
    if ins.base in ("and", "or", "xor") and type_of(ins) == "pred":
        inner = _logic_pred(ins, m)
    elif ins.base == "not" and type_of(ins) == "pred":
        inner = _logic_pred(ins, m)
    elif ins.op.startswith("barrier.cluster"):
        inner = _cluster_barrier(ins, m)
    elif ins.op.startswith(NOOP):
        inner = _noop(ins, m)
    elif ins.op.startswith(CP_ASYNC):
        inner = _cp_async(ins, m)
    else:
        eng = next((d for p, d in ENGINES.items() if ins.op.startswith(p)), None)
        dec = eng or DECODERS.get(ins.base)
        if dec is None:
            raise EmulatorError(f"PTX line {ins.line}: opcode `{ins.op}` is not emulated")
        inner = dec(ins, m)
    if ins.pred is None:
        return lambda w, mask, i: inner(w, mask)
    pred, neg = ins.pred, ins.neg

    def guarded(w, mask, i):
        p = read(w, pred, "pred")
        inner(w, mask & (~p if neg else p))
    return guarded
