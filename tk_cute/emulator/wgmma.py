# SPDX-License-Identifier: MIT
"""The sm_90a warpgroup engine: `wgmma.mma_async` with its fence / commit / wait groups (PTX
ISA 9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"), and the
warp-level matrix moves `ldmatrix` / `stmatrix` (9.7.14.5.15 / 9.7.14.5.16).

Emulated: dense `wgmma.mma_async.sync.aligned.m64nNkK` with .f32 or .f16 accumulators of
.f16 / .bf16 (k16), .tf32 (k8), .e4m3 / .e5m2 (k32) inputs, A from a descriptor or from
registers, scale-d (a predicate or an immediate), imm-scale-a/b = +-1, imm-trans-a/b; not
emulated (an `EmulatorError` when the kernel is loaded): `.sp`, integer and b1 MMAs, a
descriptor's non-zero base offset. Conventions, and where each comes from:

- A warpgroup is warps 4g .. 4g+3 of a CTA (ISA 9.7.15.1 "Warpgroup"). `.aligned` makes the
  four warps run the same instruction, but a warp does not wait for the others: each warp's
  n-th `wgmma.mma_async` is the warpgroup's n-th MMA (different PTX lines: a
  `wgmma-divergent` hazard; different opcodes: an error). A warp arriving records its
  operands (descriptors, scale-d, the A registers of the register form, as it executes) and
  goes on; the fourth to arrive issues the MMA as one `AsyncOp` (`Machine.issue`). Its
  completion reads the accumulators from the four warps' registers, A and B from shared
  memory (`tma.check_async_read`: bytes written by generic stores with no `fence.proxy.async`
  since, or never written, are hazards), and writes the new accumulators back. A
  warpgroup's MMAs complete in issue order (an MMA chained on the accumulator of the one
  before sees its result: the ISA's same-shape accumulator exception, wgmma.mma_async).
- Groups are per warp (wgmma.commit_group, wgmma.wait_group): a commit closes the warp's MMAs
  since its last commit into a group; `wait_group N` completes every group but the newest N,
  blocking (`Block`) while one of their MMAs waits for a warp of the warpgroup to arrive.
- Accessing an accumulator register of an MMA before a wait_group covering it is undefined
  (wgmma.mma_async): a read of one (the warp's scoreboard holds them until the wait) is a
  `wgmma-register` hazard, after which the MMA completes. A warp's first wgmma.mma_async with
  no wgmma.fence before it is a `wgmma-fence` hazard (the fence's other duty, between register
  writes and the MMA reading them, is not tracked).
- Arithmetic: A and B decoded exactly to float64, negated by imm-scale = -1, the products and
  their sum over the instruction's K in float64 (numpy's matmul, its BLAS order), plus the
  accumulator (none where scale-d is false), rounded once to the accumulator type. The ISA
  fixes neither the order nor the internal precision: for data whose sums are exact in
  float64 (small integers) every order gives the same result, which is what tests rely on.
- Register fragments (ISA 9.7.15.5.1.1 "Register Fragments", the figures "WGMMA .m64nNk16 /
  .m64nNk32 / .m64nNk8 register fragment layout for matrix A" and "... for accumulator
  matrix D"; CUTLASS `cute/atom/mma_traits_sm90_gmma.hpp` `CLayout_64xN`, `ALayout_64x16`,
  `ALayout_64x32`, `ALayout_64x8`): for lane l of warp w of the warpgroup, accumulator
  element i (i < N/2) is at row 16w + l/4 + 8((i/2)%2), column 2(l%4) + i%2 + 8(i/4); fp32
  accumulators take a register each, fp16 ones two per register (low half first). A, 16-bit:
  element i < 8 where D's element i is (two per register); 8-bit: element i < 16 at row
  16w + l/4 + 8((i/4)%2), column 4(l%4) + i%4 + 16(i/8) (four per register, low byte
  first); tf32: element i < 4 at row 16w + l/4 + 8(i%2), column l%4 + 4(i/2).
- Shared-memory matrix descriptor (ISA 9.7.15.5.1.2 "Shared Memory Matrix Layout", its
  "Matrix Descriptor Format"; CUTLASS `cute/arch/mma_sm90_desc.hpp` `GmmaDescriptor`): start
  address bits 0-13, leading byte offset (LBO) 16-29, stride byte offset (SBO) 32-45, each in
  16-byte units; base offset 49-51 (only 0: CUTLASS always writes 0); swizzle 62-63 (0 none /
  interleave, 1 128B, 2 64B, 3 32B). Canonical layouts, from CUTLASS's `make_gmma_desc` (units
  of 16 bytes; T elements per 16 bytes, W = swizzle bytes / 16):
  K-major, none: ((8,m),(T,2)):((1T,SBO),(1,LBO)): 8x16-byte core matrices (rows 16 B
  apart), 8-row groups SBO apart, the second 16 bytes of K LBO on; swizzled:
  ((8,m),(T,2)):((WT,SBO),(1,T)): rows W * 16 B apart, 8-row groups SBO apart, the
  instruction's 32 bytes of K contiguous (LBO unused). MN-major, none:
  ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)): 16 bytes of M / N contiguous, the next 16 SBO on, K
  rows 16 B apart, the next 8 K LBO on; swizzled: ((T,W,m),(8,k)):((1,T,LBO),(WT,SBO)):
  W * 16 contiguous bytes of M / N, the next such block LBO on, K rows W * 16 B apart, the
  next 8 K SBO on. The swizzle XORs address bits 4-6 (128B), 4-5 (64B) or 4 (32B) with bits
  7-9 / 7-8 / 7 of the absolute shared address, as TMA's does (`tma.swizzled`; tiles aligned
  to their pattern, as base offset 0 says). imm-trans-a/b = 1 selects M- / N-major (16-bit
  inputs only; 0: both K-major).
- ldmatrix / stmatrix .m8n8.x{1,2,4}[.trans].b16, in .shared or at generic addresses: lanes
  8i .. 8i+7 give the addresses of rows 0-7 of matrix i (16 bytes each); register i of lane l
  holds matrix i's (row l/4, columns 2(l%4), 2(l%4)+1), low half first; with `.trans`
  (rows 2(l%4), 2(l%4)+1, column l/4): the matrix in memory is the transpose.
"""

from __future__ import annotations

import re

import numpy as np

from tk_cute.emulator import isa
from tk_cute.emulator import values as V
from tk_cute.emulator.machine import AsyncOp, Block
from tk_cute.emulator.memory import EmulatorError, MemoryFault
from tk_cute.emulator.tma import check_async_read

WARPS = 4  # warps in a warpgroup
SWIZZLE_BYTES = {0: 0, 1: 128, 2: 64, 3: 32}  # descriptor bits 62-63 -> swizzle span
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1}
_SHAPE = re.compile(r"m64n(\d+)k(\d+)$")


# --- descriptors and layouts -----------------------------------------------------------
def decode_descriptor(desc: int) -> dict:
    """The fields of a 64-bit wgmma shared-memory matrix descriptor (byte units)."""
    desc = int(desc)
    return {"start": (desc & 0x3FFF) << 4, "lbo": (desc >> 16 & 0x3FFF) << 4,
            "sbo": (desc >> 32 & 0x3FFF) << 4, "base_offset": desc >> 49 & 7,
            "swizzle": SWIZZLE_BYTES[desc >> 62 & 3]}


def operand_offsets(desc: int, rows: int, esize: int, mn_major: bool) -> np.ndarray:
    """Shared byte offsets (rows, K, esize) of a (rows x K) operand, K = 32 / esize elements
    (one instruction's K), described by `desc` in the canonical layout (module docstring)."""
    d = decode_descriptor(desc)
    if d["base_offset"]:
        raise EmulatorError(f"wgmma descriptor {desc:#x}: base offset {d['base_offset']} is not "
                            f"emulated (CUTLASS writes 0 and aligns tiles to their swizzle)")
    s, lbo, sbo = d["swizzle"], d["lbo"], d["sbo"]
    k = 32 // esize
    r = np.arange(rows, dtype=np.int64)[:, None, None]
    kk = np.arange(k, dtype=np.int64)[None, :, None]
    b = np.arange(esize, dtype=np.int64)[None, None, :]
    if not mn_major:
        kb = kk * esize + b  # byte along K, < 32
        if s:
            off = (r % 8) * s + (r // 8) * sbo + kb
        else:
            off = (r % 8) * 16 + (r // 8) * sbo + (kb // 16) * lbo + kb % 16
    else:
        mb = r * esize + b  # byte along M / N
        if s:
            off = mb % s + (mb // s) * lbo + (kk % 8) * s + (kk // 8) * sbo
        else:
            off = mb % 16 + (mb // 16) * sbo + (kk % 8) * 16 + (kk // 8) * lbo
    a = d["start"] + off
    if s:
        a = a ^ (((a >> 7) & (s // 16 - 1)) << 4)
    return a


def _decode(raw: np.ndarray, t: str) -> np.ndarray:
    """Elements (bytes, last axis esize) of type `t` as float64."""
    raw = np.ascontiguousarray(raw)
    if t == "bf16":
        return V.bf16_to_f32(raw.view(np.uint16)[..., 0]).astype(np.float64)
    if t == "f16":
        return raw.view(np.float16)[..., 0].astype(np.float64)
    if t == "tf32":
        bits = raw.view(np.uint32)[..., 0] & np.uint32(0xFFFFE000)
        return bits.view(np.float32).astype(np.float64)
    if t == "e4m3":
        return V.e4m3_decode(raw[..., 0])
    if t == "e5m2":
        return V.e5m2_decode(raw[..., 0])
    raise EmulatorError(f"wgmma input type .{t} is not emulated")


# --- register fragment maps --------------------------------------------------------------
def d_fragment(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns), each (4 warps, N/2 elements, 32 lanes), of the accumulator elements."""
    w = np.arange(WARPS)[:, None, None]
    i = np.arange(n // 2)[None, :, None]
    lane = np.arange(32)[None, None, :]
    rows = 16 * w + lane // 4 + 8 * ((i // 2) % 2)
    cols = 2 * (lane % 4) + i % 2 + 8 * (i // 4)
    shape = np.broadcast_shapes(rows.shape, cols.shape)
    return np.broadcast_to(rows, shape), np.broadcast_to(cols, shape)


def a_fragment(t: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns), each (4 warps, elements per thread, 32 lanes), of the register-A
    elements of input type `t`."""
    w = np.arange(WARPS)[:, None, None]
    lane = np.arange(32)[None, None, :]
    esize = ELEMENT_BYTES[t]
    i = np.arange(16 // esize)[None, :, None]
    if esize == 2:
        rows = 16 * w + lane // 4 + 8 * ((i // 2) % 2)
        cols = 2 * (lane % 4) + i % 2 + 8 * (i // 4)
    elif esize == 1:
        rows = 16 * w + lane // 4 + 8 * ((i // 4) % 2)
        cols = 4 * (lane % 4) + i % 4 + 16 * (i // 8)
    else:
        rows = 16 * w + lane // 4 + 8 * (i % 2)
        cols = lane % 4 + 4 * (i // 2)
    shape = np.broadcast_shapes(rows.shape, cols.shape)
    return np.broadcast_to(rows, shape), np.broadcast_to(cols, shape)


def _unpack(regs: np.ndarray, esize: int) -> np.ndarray:
    """(..., registers, 32) uint32 -> (..., elements, 32, esize) bytes, low bytes first."""
    b = np.ascontiguousarray(regs.astype(np.uint32)).view(np.uint8)
    b = b.reshape(regs.shape + (4,))  # (..., reg, lane, 4)
    per = 4 // esize
    b = b.reshape(regs.shape + (per, esize))  # (..., reg, lane, per, esize)
    b = np.moveaxis(b, -2, -3)  # (..., reg, per, lane, esize)
    return b.reshape(regs.shape[:-2] + (regs.shape[-2] * per, regs.shape[-1], esize))


# --- the warpgroup's state ----------------------------------------------------------------
class _Group:
    """A warpgroup's MMAs: arrivals by MMA number, and those issued."""

    def __init__(self, cta, index: int):
        self.cta, self.index = cta, index
        self.arrivals: dict[int, dict] = {}  # mma number -> {warp in group: arrival}
        self.ops: dict[int, AsyncOp] = {}  # mma number -> its op, issued and not complete
        self.issued = 0  # MMAs numbered below this one are issued (in number order)
        self.last_done = -1  # MMAs numbered up to this one are complete
        ws = cta.warps[WARPS * index:WARPS * index + WARPS]
        if len(ws) != WARPS or any(not w.live.all() for w in ws):
            raise EmulatorError(f"wgmma in warpgroup {index} of a {cta.threads}-thread CTA: a "
                                f"warpgroup is 4 whole warps")


def _group(w) -> _Group:
    groups = w.cta.machine.extra.setdefault("wgmma", {})
    key = (id(w.cta), w.index // WARPS)
    g = groups.get(key)
    if g is None or g.cta is not w.cta:
        g = groups[key] = _Group(w.cta, w.index // WARPS)
    return g


class _Guard(AsyncOp):
    """A warp's scoreboard entry for the accumulator registers of one of its MMAs until a
    `wgmma.wait_group` covers it: completed by a register read before that, a hazard."""

    def __init__(self, g: _Group, number: int, line: int, warp):
        super().__init__(f"wgmma.mma_async (line {line}) accumulator registers", self._read,
                         warp)
        self.g, self.number, self.line = g, number, line
        self.waited = False

    def _read(self):
        if self.waited:
            return
        m, g = self.g.cta.machine, self.g
        m.hazard("wgmma-register", self.line, f"{self.warp.where} accesses an accumulator "
                 f"register of the wgmma.mma_async at line {self.line} before a "
                 f"wgmma.wait_group covering it" + ("" if self.number < g.issued else
                                                    " (before the whole warpgroup issued it)"))
        op = g.ops.get(self.number)
        if op is not None:
            m.complete(op)


# --- wgmma.mma_async ------------------------------------------------------------------------
def _mma(ins, m):
    parts = ins.op.split(".")
    shape = next((p for p in parts if _SHAPE.match(p)), None)
    if shape is None or "sp" in parts:
        raise EmulatorError(f"`{ins.op}`: only dense m64nNkK wgmma is emulated")
    n, k = (int(x) for x in _SHAPE.match(shape).groups())
    dtype, atype, btype = parts[parts.index(shape) + 1:parts.index(shape) + 4]
    if dtype not in ("f32", "f16") or atype not in ELEMENT_BYTES or btype not in ELEMENT_BYTES:
        raise EmulatorError(f"`{ins.op}`: only .f32 / .f16 accumulation of f16, bf16, tf32, "
                            f"e4m3 and e5m2 inputs is emulated")
    esize = ELEMENT_BYTES[atype]
    if k * esize != 32 or ELEMENT_BYTES[btype] != esize:
        raise EmulatorError(f"`{ins.op}`: K = {k} does not match .{atype} / .{btype}")
    dregs = isa.vec(ins.args[0])
    per_reg = 2 if dtype == "f16" else 1
    if len(dregs) * per_reg != n // 2:
        raise EmulatorError(f"`{ins.op}`: {len(dregs)} accumulator registers, expected "
                            f"{n // 2 // per_reg}")
    rs = ins.args[1].strip().startswith("{")
    aregs = isa.vec(ins.args[1]) if rs else None
    if rs and len(aregs) != 4:
        raise EmulatorError(f"`{ins.op}`: {len(aregs)} A registers, expected 4")
    rest = list(ins.args[3:])
    sixteen = esize == 2
    want = (3 if rs else 4) if sixteen else 2
    if len(rest) != 1 + want:
        raise EmulatorError(f"`{ins.op}`: {len(ins.args)} operands")
    imms = [int(x, 0) for x in rest[1:]]
    scale_a, scale_b = imms[0], imms[1]
    trans_a = bool(imms[2]) if sixteen and not rs else False
    trans_b = bool(imms[-1]) if sixteen else False
    if {scale_a, scale_b} - {1, -1}:
        raise EmulatorError(f"`{ins.op}`: imm-scale-a/b must be 1 or -1")
    drows, dcols = d_fragment(n)
    arows, acols = a_fragment(atype) if rs else (None, None)
    def offsets(desc, rows, mn_major):
        layouts = m.extra.setdefault("wgmma_layouts", {})
        key = (desc, rows, esize, mn_major)
        pos = layouts.get(key)
        if pos is None:
            pos = layouts[key] = operand_offsets(desc, rows, esize, mn_major)
        return pos

    def operand(cta, desc, rows, t, mn_major, line):
        pos = offsets(desc, rows, mn_major)
        if pos.min() < 0 or pos.max() >= cta.smem.size:
            raise MemoryFault(f"wgmma operand (descriptor {desc:#x}) reaches outside the CTA's "
                              f"{cta.smem.size} B of shared memory")
        check_async_read(m, cta, pos.reshape(-1), line, "wgmma.mma_async")
        return _decode(cta.smem.data[pos], t)

    def uniform(w, mask, text, t, what):
        v = isa.read(w, text, t)[mask]
        if (v != v[0]).any():
            m.hazard("wgmma-operand", ins.line, f"{w.where}: {what} differs between lanes")
        return v[0]

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        g = _group(w)
        if not w.state.get("wgmma_fenced"):
            m.hazard("wgmma-fence", ins.line, f"{w.where}: wgmma.mma_async with no wgmma.fence "
                     f"before it")
            w.state["wgmma_fenced"] = True
        number = w.state.get("wgmma_count", 0)
        w.state["wgmma_count"] = number + 1
        sd = rest[0]
        if sd.lstrip("!") in m.reg_types or "#" in sd:
            scale_d = bool(uniform(w, mask, sd.lstrip("!"), "pred", "scale-d")) ^ sd.startswith("!")
        else:
            scale_d = bool(int(sd, 0))
        arrival = {"warp": w, "mask": mask.copy(), "line": ins.line, "op": ins.op,
                   "dregs": dregs, "scale_d": scale_d,
                   "b": int(uniform(w, mask, ins.args[2], "u64", "B descriptor"))}
        if rs:
            arrival["a"] = np.stack([isa.read(w, r, "b32") for r in aregs])
        else:
            arrival["a"] = int(uniform(w, mask, ins.args[1], "u64", "A descriptor"))
        guard = _Guard(g, number, ins.line, w)
        for r in dregs:
            w.scoreboard[r] = guard
        w.state.setdefault("wgmma_open", []).append((g, number))
        here = g.arrivals.setdefault(number, {})
        here[w.index % WARPS] = arrival
        if len(here) == WARPS:
            _issue(g, number, g.arrivals.pop(number))

    def _issue(g, number, arrivals):
        first = arrivals[0]
        for a in arrivals.values():
            if a["op"] != first["op"]:
                raise EmulatorError(f"warpgroup {g.index} of CTA {g.cta.ctaid}: its wgmma number "
                                    f"{number} is `{first['op']}` (line {first['line']}) in one "
                                    f"warp and `{a['op']}` (line {a['line']}) in another")
            if a["line"] != first["line"]:
                m.hazard("wgmma-divergent", a["line"], f"warpgroup {g.index}: its wgmma number "
                         f"{number} is at lines {first['line']} and {a['line']}")
            if a["b"] != first["b"] or a["scale_d"] != first["scale_d"] or (
                    not rs and a["a"] != first["a"]):
                m.hazard("wgmma-operand", a["line"], f"warpgroup {g.index}: the warps of wgmma "
                         f"number {number} give different descriptors or scale-d")
        line = first["line"]

        def complete():
            for j in range(g.last_done + 1, number):  # the warpgroup's MMAs in issue order
                if j in g.ops:
                    m.complete(g.ops[j])
            cta = g.cta
            if rs:
                regs = np.stack([arrivals[i]["a"] for i in range(WARPS)])  # (4, 4, 32)
                raw = _unpack(regs, esize)  # (4, elements, 32, esize)
                a = np.zeros((64, k))
                a[arows, acols] = _decode(raw, atype)
            else:
                a = operand(cta, first["a"], 64, atype, trans_a, line)
            b = operand(cta, first["b"], n, btype, trans_b, line)
            a, b = a * scale_a, b * scale_b
            d = np.zeros((64, n))
            if first["scale_d"]:
                d[drows, dcols] = _read_acc(arrivals, dtype)
            d = d + a @ b.T
            _write_acc(arrivals, dtype, d[drows, dcols])
            g.last_done = number
            del g.ops[number]

        op = AsyncOp(f"wgmma.mma_async (line {line}, warpgroup {g.index} of CTA {g.cta.ctaid})",
                     complete, first["warp"])
        g.ops[number] = op
        g.issued = number + 1
        m.issue(op)

    return run


def _read_acc(arrivals, dtype) -> np.ndarray:
    """The accumulators (4 warps, N/2, 32) as float64."""
    regs = np.stack([np.stack([arrivals[i]["warp"].storage(r).view(np.uint32)
                               for r in arrivals[i]["dregs"]]) for i in range(WARPS)])
    if dtype == "f32":
        return regs.view(np.float32).astype(np.float64)
    halves = np.stack([regs & np.uint32(0xFFFF), regs >> np.uint32(16)], axis=2)
    return halves.astype(np.uint16).view(np.float16).reshape(
        regs.shape[0], -1, 32).astype(np.float64)


def _write_acc(arrivals, dtype, vals: np.ndarray):
    """Round (4 warps, N/2, 32) float64 to the accumulator type into the lanes that ran."""
    if dtype == "f32":
        bits = vals.astype(np.float32).view(np.uint32)
    else:
        h = vals.astype(np.float16).view(np.uint16).astype(np.uint32)
        h = h.reshape(h.shape[0], -1, 2, 32)
        bits = h[:, :, 0] | (h[:, :, 1] << np.uint32(16))
    for i in range(WARPS):
        a = arrivals[i]
        w, mask = a["warp"], a["mask"]
        for j, r in enumerate(a["dregs"]):
            reg = w.storage(r).view(np.uint32)
            reg[mask] = bits[i, j][mask]


# --- fence, commit, wait ------------------------------------------------------------------
def _fence(ins, m):
    def run(w, mask):
        if mask.any():
            isa.aligned_check(w, mask, ins)
            w.state["wgmma_fenced"] = True
    return run


def _commit(ins, m):
    def run(w, mask):
        if mask.any():
            isa.aligned_check(w, mask, ins)
            w.state.setdefault("wgmma_groups", []).append(w.state.pop("wgmma_open", []))
    return run


def _wait(ins, m):
    keep = int(ins.args[0], 0) if ins.args else 0

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        groups = w.state.setdefault("wgmma_groups", [])
        due = [x for grp in groups[:max(len(groups) - keep, 0)] for x in grp]
        missing = [(g, n) for g, n in due if n >= g.issued]
        if missing:
            g, n = missing[0]
            here = g.arrivals.get(n, {})
            absent = [WARPS * g.index + i for i in range(WARPS) if i not in here]
            raise Block(lambda: all(n < g.issued for g, n in missing),
                        f"wgmma.wait_group {keep}: the warpgroup's wgmma number {n} waits for "
                        f"warps {absent} to issue it")
        for g, n in due:
            if n in g.ops:
                m.complete(g.ops[n])
        del groups[:max(len(groups) - keep, 0)]
        waited = {(id(g), n) for g, n in due}
        for r, op in list(w.scoreboard.items()):
            if isinstance(op, _Guard) and (id(op.g), op.number) in waited:
                del w.scoreboard[r]
                op.waited = True
                m.complete(op)  # moves deferred on the registers (alu.deferred) happen now
    return run


# --- ldmatrix / stmatrix -------------------------------------------------------------------
def _matrix_shape(ins, regs_arg: int):
    """(registers, (row, column) of each lane's halves, lanes that name a matrix row) of an
    ldmatrix / stmatrix whose register vector is argument `regs_arg`."""
    parts = ins.op.split(".")
    if "m8n8" not in parts or "b16" not in parts:
        raise EmulatorError(f"`{ins.op}`: only .m8n8 .b16 matrices are emulated")
    count = next((int(p[1:]) for p in parts if p in ("x1", "x2", "x4")), None)
    if count is None:
        raise EmulatorError(f"`{ins.op}`: no .x1 / .x2 / .x4")
    regs = isa.vec(ins.args[regs_arg])
    if len(regs) != count:
        raise EmulatorError(f"`{ins.op}`: {len(regs)} registers for .x{count}")
    use = np.zeros(32, bool)
    use[:8 * count] = True
    return regs, fragment_positions("trans" in parts), use


def fragment_positions(trans: bool) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) in the 8x8 matrix in memory of each lane's two halves: arrays (32, 2)."""
    lane = np.arange(32)[:, None]
    h = np.arange(2)[None, :]
    r, c = lane // 4 + 0 * h, 2 * (lane % 4) + h
    return (c, r) if trans else (r, c)


def _stmatrix(ins, m):
    regs, (rows, cols), use = _matrix_shape(ins, 1)
    space = isa.space_of(ins)  # .shared{::cta}, or generic addresses

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        data = np.zeros((32, 8), np.uint16)  # lane 8i + j: row j of matrix i
        for i, r in enumerate(regs):
            v = isa.read(w, r, "b32")
            halves = np.stack([v & np.uint32(0xFFFF), v >> np.uint32(16)], axis=1)
            data[8 * i + rows, cols] = halves.astype(np.uint16)
        isa.store(w, space, isa.address(w, ins.args[0]), data.view(np.uint8), use)
    return run


def _ldmatrix(ins, m):
    regs, (rows, cols), use = _matrix_shape(ins, 0)
    space = isa.space_of(ins)

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        data = isa.load(w, space, isa.address(w, ins.args[1]), 16, use).view(np.uint16)
        for i, r in enumerate(regs):
            h = data[8 * i + rows, cols].astype(np.uint32)  # (32 lanes, 2)
            isa.write(w, r, h[:, 0] | (h[:, 1] << np.uint32(16)), mask)
    return run


# --- mma.sync (warp-level MMA) ---------------------------------------------------------------
def _mma_sync(ins, m):
    """`mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c` (PTX ISA
    9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating point type"): for lane l,
    group g = l / 4, t = l % 4: A element i < 8 (two per register, low half first) at row
    g + 8 ((i / 2) % 2), column 2t + i % 2 + 8 (i / 4); B element i < 4 at row (K)
    2t + i % 2 + 8 (i / 2), column (N) g; C / D element i < 4 at row g + 8 (i / 2), column
    2t + i % 2. Arithmetic as wgmma's: exact products summed with the accumulator in
    float64, rounded once to float32."""
    parts = ins.op.split(".")
    shape = next((p for p in parts if p.startswith("m") and p[1:2].isdigit()), "")
    types = [p for p in parts if p in ("f32", "bf16", "f16")]
    if (shape != "m16n8k16" or "row" not in parts or "col" not in parts or len(types) != 4
            or types[0] != "f32" or types[3] != "f32" or types[1] != types[2]):
        raise EmulatorError(f"PTX line {ins.line}: `{ins.op}` is not emulated (only "
                            f"m16n8k16.row.col f32 += bf16 / f16 x bf16 / f16)")
    t = types[1]
    d, a, b, c = (isa.vec(x) for x in ins.args)
    lane = np.arange(32)
    g, q = lane // 4, lane % 4
    i8, i4 = np.arange(8)[:, None], np.arange(4)[:, None]
    a_row, a_col = g + 8 * ((i8 // 2) % 2), 2 * q + i8 % 2 + 8 * (i8 // 4)  # (8, 32)
    b_k, b_n = 2 * q + i4 % 2 + 8 * (i4 // 2), np.broadcast_to(g, (4, 32))
    c_row, c_col = g + 8 * (i4 // 2), 2 * q + i4 % 2

    def halves(w, regs):  # (2 len(regs), 32) 16-bit elements, low half first
        r = np.stack([isa.read(w, x, "b32") for x in regs])
        return np.stack([r & np.uint32(0xFFFF), r >> np.uint32(16)], axis=1).reshape(
            -1, 32).astype(np.uint16)

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        ea, eb = halves(w, a), halves(w, b)
        A, B = np.zeros((16, 16)), np.zeros((16, 8))
        A[a_row, a_col] = _decode(ea[..., None].view(np.uint8), t)
        B[b_k, b_n] = _decode(eb[..., None].view(np.uint8), t)
        C = np.zeros((16, 8))
        C[c_row, c_col] = np.stack([isa.read(w, x, "f32") for x in c]).astype(np.float64)
        D = (A @ B + C).astype(np.float32)
        for i, x in enumerate(d):
            isa.write(w, x, D[c_row[i], c_col[i]].view(np.uint32), mask)
    return run


isa.ENGINES.update({"wgmma.fence": _fence, "wgmma.commit_group": _commit,
                    "wgmma.wait_group": _wait, "wgmma.mma_async": _mma})
isa.ENGINES["mma.sync."] = _mma_sync
isa.ENGINES["stmatrix."] = _stmatrix
isa.ENGINES["ldmatrix."] = _ldmatrix
