# SPDX-License-Identifier: MIT
"""The TMA engine: `cp.async.bulk.tensor` tile loads and stores, bulk groups (PTX ISA 9.7.9.25;
tiles, bounding boxes, fills and swizzles: 5.5).

A load reads the box at the coordinates (innermost first, signed: parts outside the tensor are
filled with zeros, or NaN for a map asking NaN fill of a float format) and writes it to shared
memory dense, innermost dimension first, each 16-byte chunk moved by the map's swizzle:
chunk ^= (shared address >> 7) & (span / 16 - 1) within each span (32, 64 or 128 bytes) of a
row, on absolute shared addresses (CUTLASS's model, so a 128-byte swizzle wants 1024-byte
aligned tiles). It then completes that many bytes of transaction on the mbarrier
(`complete_tx`). Multicast writes the same box at the same offset in every CTA of the mask and
signals each one's barrier at the barrier's offset; with `.cta_group::2` the barrier signalled
for a destination CTA is the one in the CTA of its pair whose rank parity is the barrier
address's (the pair's leader collects both CTAs' bytes). 4-bit formats count elements in
pairs (bytes). A store reads the box from shared memory (swizzled the same way) and writes the
elements inside the tensor; it belongs to the issuing thread's bulk group once committed
(`cp.async.bulk.commit_group`), and `cp.async.bulk.wait_group[.read] N` completes all but the
newest N groups.
"""

from __future__ import annotations

import numpy as np

from tk_cute.emulator import isa
from tk_cute.emulator.machine import AsyncOp
from tk_cute.emulator.memory import OFFSET_MASK, RANK_SHIFT, EmulatorError
from tk_cute.emulator.tensormap import decode

_SWIZZLE = {"none": 0, "32B": 32, "64B": 64, "128B": 128}


def swizzled(offsets: np.ndarray, base: int, span: int) -> np.ndarray:
    """Byte offsets (relative to shared address `base`) after a `span`-byte TMA swizzle."""
    if not span:
        return offsets
    a = offsets + base
    a = a ^ (((a >> 7) & (span // 16 - 1)) << 4)
    return a - base


def _box_geometry(tm, coords):
    """(byte offsets in global memory of each box element relative to the tensor, valid mask,
    element bytes) in box order (innermost first), for 4-bit formats in byte units."""
    ebits = tm.element_bits
    dims, box, coords = list(tm.dims), list(tm.box), list(coords)
    if ebits == 4:  # pairs of FP4 values: one byte
        if coords[0] % 2 or box[0] % 2:
            raise EmulatorError(f"4-bit TMA box at odd element {coords[0]} / width {box[0]}")
        dims[0], box[0], coords[0] = -(-dims[0] // 2), box[0] // 2, coords[0] // 2
        esize = 1
    elif ebits % 8 == 0:
        esize = ebits // 8
    else:
        raise EmulatorError(f"TMA element format {tm.dtype} is not emulated")
    if any(s != 1 for s in tm.element_strides) or tm.interleave != "none":
        raise EmulatorError("TMA element strides / interleave are not emulated")
    grids = np.meshgrid(*[np.arange(b) for b in reversed(box)], indexing="ij")
    idx = [g.reshape(-1) for g in reversed(grids)]  # idx[0] innermost, box order
    valid = np.ones(idx[0].size, bool)
    offs = np.zeros(idx[0].size, np.int64)
    strides = [esize] + list(tm.strides)
    for k in range(tm.rank):
        c = coords[k] + idx[k]
        valid &= (c >= 0) & (c < dims[k])
        offs += c * strides[k]
    return offs, valid, esize, box


def _extent(tm) -> int:
    """Bytes from the tensor's address to the end of its last element."""
    ebytes = max(tm.element_bits // 8, 1)
    d0 = tm.dims[0] * tm.element_bits // 8
    return d0 + sum((d - 1) * s for d, s in zip(tm.dims[1:], tm.strides)) or ebytes


def _map(w, text) -> object:
    """The tensor map a `[map, {coords}]` operand names (a generic address of 128 bytes)."""
    inner = text.strip()[1:-1]
    mp, coords = isa.split_map(inner)
    addr = isa.read(w, mp, "u64")
    return addr, coords


def read_box(m, tm, coords):
    """The box's bytes in box order and the valid mask (OOB elements filled)."""
    offs, valid, esize, box = _box_geometry(tm, coords)
    buf, base = m.memory.region(tm.address, _extent(tm))
    out = np.zeros((offs.size, esize), np.uint8)
    if valid.any():
        out[valid] = buf[base + offs[valid, None] + np.arange(esize)]
    if tm.oob_fill != "zero" and (~valid).any() and tm.dtype in ("F16", "BF16", "F32"):
        nan = {"F16": np.float16(np.nan), "BF16": np.uint16(0x7FC0),
               "F32": np.float32(np.nan)}[tm.dtype]
        out[~valid] = np.frombuffer(np.array([nan]).tobytes(), np.uint8)[:esize]
    return out.reshape(-1), valid, esize


def _tma_load(ins, m):
    parts = ins.op.split(".")
    multicast = "multicast::cluster" in parts
    pair = "cta_group::2" in parts

    def run(w, mask):
        for lane in np.nonzero(mask)[0]:
            one = np.zeros(32, bool)
            one[lane] = True
            dst = int(isa.address(w, ins.args[0])[lane])
            maddr, coords = _map(w, ins.args[1])
            raw = isa.load(w, "generic", maddr, 128, one)[lane].tobytes()
            tm = decode(raw)
            c = [int(isa.read(w, x, "s32")[lane]) for x in coords]
            if len(c) != tm.rank:
                raise EmulatorError(f"{len(c)} coordinates for a rank-{tm.rank} tensor map")
            bar = int(isa.address(w, ins.args[2])[lane])
            mask_v = int(isa.read(w, ins.args[3], "u16")[lane]) if multicast else None
            _issue_load(w, ins, tm, c, dst, bar, mask_v, pair)
    return run


def _issue_load(w, ins, tm, coords, dst, bar, cta_mask, pair):
    m, cta = w.cta.machine, w.cta
    cl = cta.cluster
    dst_rank = dst >> RANK_SHIFT if ".shared::cluster" in ins.op else cta.rank
    dst_off = dst & OFFSET_MASK
    bar_rank = bar >> RANK_SHIFT if ".shared::cluster" in ins.op else cta.rank
    bar_off = bar & OFFSET_MASK
    if cta_mask is None:
        targets = [(dst_rank, bar_rank)]
    else:
        ranks = [r for r in range(len(cl.ctas)) if cta_mask >> r & 1]
        targets = [(r, (r & ~1) | (bar_rank & 1) if pair else r) for r in ranks]
    span = _SWIZZLE[tm.swizzle]

    def complete():
        data, _, esize = read_box(m, tm, coords)
        row = tm.box[0] * tm.element_bits // 8
        if span and row > span:
            raise EmulatorError(f"TMA box rows of {row} B exceed the {span} B swizzle span")
        offs = swizzled(np.arange(data.size), dst_off, span)
        for r, br in targets:
            smem = cl.ctas[r].smem
            smem.span(dst_off, data.size, "TMA load")
            smem.data[dst_off + offs] = data
            smem.written[dst_off + offs] = True
            smem.writer[dst_off + offs] = -1
            b = cl.ctas[br].mbarriers.get(bar_off)
            if b is None:
                raise EmulatorError(f"TMA load signals an mbarrier at offset {bar_off:#x} of CTA "
                                    f"rank {br} that was never initialized")
            b.tx -= data.size
            isa.check_tx(m, b, ins.line)
            b.complete_if_due()

    m.issue(AsyncOp(f"TMA load (line {ins.line})", complete, w))


def _tma_store(ins, m):
    def run(w, mask):
        for lane in np.nonzero(mask)[0]:
            one = np.zeros(32, bool)
            one[lane] = True
            maddr, coords = _map(w, ins.args[0])
            raw = isa.load(w, "generic", maddr, 128, one)[lane].tobytes()
            tm = decode(raw)
            c = [int(isa.read(w, x, "s32")[lane]) for x in coords]
            src = int(isa.address(w, ins.args[1])[lane]) & OFFSET_MASK
            _issue_store(w, ins, tm, c, src)
    return run


def _issue_store(w, ins, tm, coords, src):
    m, smem = w.cta.machine, w.cta.smem
    span = _SWIZZLE[tm.swizzle]

    def complete():
        offs, valid, esize, box = _box_geometry(tm, coords)
        n = offs.size * esize
        smem.span(src, n, "TMA store")
        pos = src + swizzled(np.arange(n), src, span)
        check_async_read(m, w.cta, pos, ins.line, "TMA store")
        data = smem.data[pos].reshape(-1, esize)
        buf, base = m.memory.region(tm.address, _extent(tm))
        if valid.any():
            buf[base + offs[valid, None] + np.arange(esize)] = data[valid]

    op = AsyncOp(f"TMA store (line {ins.line})", complete, w)
    w.state.setdefault("bulk_open", []).append(op)
    m.issue(op)


def check_async_read(m, cta, pos: np.ndarray, line: int, what: str):
    """Hazards of an async-proxy read of shared bytes `pos`: written by generic stores with
    no fence.proxy.async since, or never written."""
    smem = cta.smem
    if (smem.writer[pos] >= 0).any():
        warps = sorted(set(smem.writer[pos][smem.writer[pos] >= 0].tolist()))
        m.hazard("proxy-fence", line, f"{what} reads shared memory that warps {warps} of CTA "
                 f"{cta.ctaid} wrote with generic stores and no fence.proxy.async since")
    if not smem.written[pos].all():
        m.hazard("uninitialized-shared", line, f"{what} reads {int((~smem.written[pos]).sum())}"
                 f" shared bytes of CTA {cta.ctaid} that nothing wrote")


def _commit(ins, m):
    def run(w, mask):
        if mask.any():
            w.state.setdefault("bulk_groups", []).append(w.state.pop("bulk_open", []))
    return run


def _wait_group(ins, m):
    def run(w, mask):
        if not mask.any():
            return
        n = int(ins.args[0], 0)
        groups = w.state.setdefault("bulk_groups", [])
        while len(groups) > n:
            for op in groups.pop(0):
                m.complete(op)
    return run


def _prefetch(ins, m):
    return lambda w, mask: None


def _tensor(ins, m):
    parts = ins.op.split(".")
    if "tile" not in parts:
        raise EmulatorError(f"`{ins.op}`: only tile-mode TMA is emulated")
    if parts[5].startswith("shared"):
        return _tma_load(ins, m)
    if parts[5] == "global":
        return _tma_store(ins, m)
    raise EmulatorError(f"opcode `{ins.op}` is not emulated")


isa.ENGINES.update({
    "cp.async.bulk.commit_group": _commit, "cp.async.bulk.wait_group": _wait_group,
    "cp.async.bulk.prefetch": _prefetch, "cp.async.bulk.tensor": _tensor})
