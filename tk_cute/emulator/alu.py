# SPDX-License-Identifier: MIT
"""Arithmetic, comparisons, conversions and moves: the decoders of `tk_cute.emulator.isa`'s
integer, float and predicate opcodes (`cvt` with the ISA's rounding, bf16 / fp16 / FP8 / FP4
packing through `tk_cute.emulator.values`). A move of a register a tcgen05.ld has not written
yet is deferred with it (register renaming: `deferred`)."""

from __future__ import annotations

import numpy as np

from tk_cute.emulator import values as V
from tk_cute.emulator.core import as_bytes, cast, read, type_of, types_of, vec, write
from tk_cute.emulator.memory import (
    OFFSET_MASK,
    PARAM_WINDOW,
    RANK_SHIFT,
    SHARED_WINDOW,
    EmulatorError,
)


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


def binary(ins, m):
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


def lop3(ins, m):
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


def unary(ins, m):
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


def setp(ins, m):
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


def selp(ins, m):
    t = type_of(ins)

    def run(w, mask):
        c = read(w, ins.args[3], "pred")
        write(w, ins.args[0], np.where(c, read(w, ins.args[1], t), read(w, ins.args[2], t)),
              mask)
    return run


def logic_pred(ins, m):
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


def deferred(w, srcs, dsts, run, mask) -> bool:
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


def mov(ins, m):
    plain = _mov_now(ins, m)
    srcs = vec(ins.args[1])
    dsts = vec(ins.args[0])

    def run(w, mask):
        if w.scoreboard and deferred(w, srcs, dsts, plain, mask):
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


def cvt(ins, m):
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


def cvta(ins, m):
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


def mapa(ins, m):
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


def shf(ins, m):
    """Funnel shift ``shf.{l,r}.{wrap,clamp}.b32 d, a, b, c``: the 64 bits b:a (a the low word)
    shifted by c (wrap: c mod 32; clamp: at most 32); l keeps the high word, r the low."""
    left, clamp = ".l." in ins.op, ".clamp" in ins.op

    def run(w, mask):
        a, b = (read(w, x, "b32").astype(np.uint64) for x in ins.args[1:3])
        c = read(w, ins.args[3], "u32").astype(np.uint64)
        n = np.minimum(c, 32) if clamp else c & np.uint64(31)
        v = (b << np.uint64(32)) | a
        out = ((v << n) >> np.uint64(32)) if left else (v >> n)
        write(w, ins.args[0], (out & np.uint64(0xFFFFFFFF)).astype(np.uint32), mask)
    return run


def bfe(ins, m):
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


def bfi(ins, m):
    t = type_of(ins)

    def run(w, mask):
        f, b = read(w, ins.args[1], t).astype(np.uint64), read(w, ins.args[2], t).astype(np.uint64)
        pos = read(w, ins.args[3], "u32").astype(np.uint64) & np.uint64(0xFF)
        ln = read(w, ins.args[4], "u32").astype(np.uint64) & np.uint64(0xFF)
        msk = ((np.uint64(1) << ln) - np.uint64(1)) << pos
        r = (b & ~msk) | ((f << pos) & msk)
        write(w, ins.args[0], r.astype(V.DTYPES[t]), mask)
    return run


def prmt(ins, m):
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
