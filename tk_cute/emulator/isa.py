# SPDX-License-Identifier: MIT
"""Instruction semantics: `decode(ins, machine)` -> a handler `(warp, mask, ins)`.

Handlers act on the lanes of `mask` (the lanes at this instruction, narrowed by its guard
predicate) with numpy arrays of 32 lanes. This module holds the decode table and the loads,
stores, atomics and non-bulk `cp.async`; operands and memory are `core`'s, arithmetic,
conversions and moves `alu`'s, collectives, branches, barriers and mbarriers `sync`'s; the
asynchronous engines (TMA, tcgen05, wgmma, cluster launch control) register their decoders in
`ENGINES` (`tk_cute.emulator.engines`). An opcode nobody decodes is an `EmulatorError` naming
it, when the kernel is loaded.
"""

from __future__ import annotations

import numpy as np

from tk_cute.emulator import alu, sync
from tk_cute.emulator import values as V
from tk_cute.emulator.core import (  # noqa: F401  (re-exported: the engines' helpers)
    address,
    aligned_check,
    as_bytes,
    cast,
    check_tx,
    first_lane,
    load,
    read,
    space_of,
    special,
    split_map,
    store,
    type_of,
    types_of,
    vec,
    write,
)
from tk_cute.emulator.memory import EmulatorError
from tk_cute.emulator.sync import mbarrier_at  # noqa: F401

# opcode prefix -> decoder(ins, machine) -> handler, registered by the async engines; the
# longest prefix an opcode starts with decodes it
ENGINES: dict = {}


NOOP = ("fence.", "membar.", "prefetch.", "prefetchu.", "griddepcontrol.", "nanosleep",
        "setmaxnreg.", "pmevent", ".pragma", "discard.")


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


# --- non-bulk cp.async --------------------------------------------------------------------
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


DECODERS = {
    "ld": _ld, "ldu": _ld, "st": _st, "atom": _atom, "red": _atom, "add": alu.binary,
    "sub": alu.binary, "mul": alu.binary, "mad": alu.binary, "fma": alu.binary, "div": alu.binary,
    "rem": alu.binary, "min": alu.binary, "max": alu.binary, "shl": alu.binary, "and": alu.binary,
    "or": alu.binary, "xor": alu.binary, "shr": alu.binary, "not": alu.unary, "cnot": alu.unary,
    "neg": alu.unary, "abs": alu.unary, "popc": alu.unary, "clz": alu.unary, "brev": alu.unary,
    "bfind": alu.unary, "rcp": alu.unary, "sqrt": alu.unary, "rsqrt": alu.unary, "ex2": alu.unary,
    "lg2": alu.unary, "sin": alu.unary, "cos": alu.unary, "tanh": alu.unary, "setp": alu.setp,
    "selp": alu.selp, "mov": alu.mov, "cvt": alu.cvt, "cvta": alu.cvta, "mapa": alu.mapa,
    "bfe": alu.bfe, "bfi": alu.bfi, "shf": alu.shf, "prmt": alu.prmt, "shfl": sync.shfl,
    "vote": sync.vote,
    "redux": sync.redux, "elect": sync.elect, "activemask": sync.activemask, "bra": sync.bra,
    "ret": sync.ret, "lop3": alu.lop3, "exit": sync.ret, "trap": sync.trap, "bar": sync.bar,
    "barrier": sync.bar, "mbarrier": sync.mbarrier,
}


def decode(ins, m):
    """The handler of `ins`: its guard applied, then its semantics (raises on an unknown op)."""
    if ins.base in ("and", "or", "xor") and type_of(ins) == "pred":
        inner = alu.logic_pred(ins, m)
    elif ins.base == "not" and type_of(ins) == "pred":
        inner = alu.logic_pred(ins, m)
    elif ins.op.startswith("barrier.cluster"):
        inner = sync.cluster_barrier(ins, m)
    elif ins.op.startswith(NOOP):
        inner = sync.noop(ins, m)
    elif ins.op.startswith(CP_ASYNC):
        inner = _cp_async(ins, m)
    else:
        prefix = max((p for p in ENGINES if ins.op.startswith(p)), key=len, default=None)
        eng = ENGINES.get(prefix)
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
