# SPDX-License-Identifier: MIT
"""The SIMT core's operands and memory: what every instruction's handler reads and writes.

Registers hold raw bits; `read` gives an operand (register, special register, immediate,
symbol) as 32 lanes of a PTX type, `write` sets the lanes of a mask. `address` evaluates
`[base+offset]`; `load` / `store` move bytes in every state space (generic addresses resolved
through the shared and parameter windows of `tk_cute.emulator.memory`), bounds-checked, with
shared memory's initialization and generic-writer tracking. `aligned_check` reports a
`.sync.aligned` instruction in a diverged warp; `check_tx` an mbarrier tx-count out of range.
"""

from __future__ import annotations

import re

import numpy as np

from tk_cute.emulator import values as V
from tk_cute.emulator.machine import MBarrier
from tk_cute.emulator.memory import (
    OFFSET_MASK,
    PARAM_WINDOW,
    RANK_SHIFT,
    SHARED_WINDOW,
    EmulatorError,
    MemoryFault,
)
from tk_cute.emulator.ptx import operand


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


def _shared_parts(w, space: str, a: np.ndarray, mask: np.ndarray, size: int, what: str):
    """(CTA, lanes, offsets) of the shared addresses `a` of the lanes of `mask`, by the CTA
    whose window each names (shared::cta: this CTA's), bounds-checked."""
    ctas = w.cta.cluster.ctas
    ranks = (a >> np.uint64(RANK_SHIFT)).astype(np.int64)
    if space == "shared":
        ranks[:] = w.cta.rank
    rows = np.nonzero(mask)[0]
    for r in np.unique(ranks):
        if r >= len(ctas):
            raise MemoryFault(f"shared::cluster address {int(a[ranks == r][0]):#x} names CTA "
                              f"rank {int(r)}; the cluster has {len(ctas)}")
        cta, sel = ctas[int(r)], ranks == r
        offs = (a[sel] & np.uint64(OFFSET_MASK)).astype(np.int64)
        cta.smem.offsets(offs | (cta.rank << RANK_SHIFT), size, what)
        yield cta, rows[sel], offs


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
        for cta, rows, offs in _shared_parts(w, space, a, mask, size, "ld"):
            data, ok = cta.smem.read(offs, size)
            if not ok:
                m.hazard("uninitialized-shared", 0, f"{w.where} reads shared bytes at offset "
                         f"{int(offs[0]):#x} (CTA rank {cta.rank}) that nothing wrote")
            out[rows] = data
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
        for cta, rows, offs in _shared_parts(w, space, a, mask, size, "st"):
            cta.smem.write(offs, data[rows], writer=(w.cta.rank, w.index))
    else:
        raise EmulatorError(f"stores to .{space} are not emulated")


def as_bytes(v: np.ndarray, size: int) -> np.ndarray:
    return np.ascontiguousarray(v).view(np.uint8).reshape(32, -1)[:, :size]


def first_lane(mask: np.ndarray):
    """The lowest active lane of `mask` (the issuing thread of a one-thread instruction), or
    None when no lane is active."""
    lanes = np.nonzero(mask)[0]
    return int(lanes[0]) if lanes.size else None


def aligned_check(w, mask, ins):
    live = ~w.exited
    if ".aligned" in ins.op or ins.base in ("bar", "barrier") and ".sync" in ins.op:
        if not (mask == live).all() and ins.pred is None:
            w.cta.machine.hazard("diverged-aligned", ins.line, f"{w.where} executes `{ins.op}` "
                                 f"with lanes {np.nonzero(live & ~mask)[0].tolist()} elsewhere")


TX_LIMIT = (1 << 20) - 1


def check_tx(m, b: MBarrier, line: int):
    if abs(b.tx) > TX_LIMIT:
        m.hazard("tx-count", line, f"mbarrier initialized at line {b.line}: tx-count {b.tx} "
                 f"beyond +-(2^20 - 1)")
