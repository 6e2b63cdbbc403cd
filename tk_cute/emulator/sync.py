# SPDX-License-Identifier: MIT
"""Warp collectives, control flow and synchronization: shuffles, votes, `redux`, `elect`,
branches and exits, named and cluster barriers, mbarriers (init, arrive, expect_tx, parity and
token waits, the parity-lap check) and the fences the emulator treats as no-ops (the proxy
fence ends a warp's pending generic writes). A wait that cannot pass raises
`machine.Block`."""

from __future__ import annotations

import numpy as np

from tk_cute.emulator.core import address, aligned_check, check_tx, read, type_of, write
from tk_cute.emulator.machine import Block, MBarrier
from tk_cute.emulator.memory import OFFSET_MASK, SHARED_WINDOW, EmulatorError


def shfl(ins, m):
    parts = ins.op.split(".")
    mode = next(p for p in parts if p in ("idx", "up", "down", "bfly"))
    dsts = ins.args[0].split("|")

    def run(w, mask):
        aligned_check(w, mask, ins)
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


def vote(ins, m):
    mode = ins.op.split(".")[2] if ins.op.split(".")[1] == "sync" else ins.op.split(".")[1]

    def run(w, mask):
        aligned_check(w, mask, ins)
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


def redux(ins, m):
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


def elect(ins, m):
    dsts = ins.args[0].split("|")

    def run(w, mask):
        members = mask & ((read(w, ins.args[1], "u32")[0] >> w.lane) & 1).astype(bool)
        leader = int(np.nonzero(members)[0][0]) if members.any() else 0
        write(w, dsts[0].strip(), np.full(32, leader, np.uint32), mask)
        if len(dsts) > 1:
            write(w, dsts[1].strip(), w.lane == leader, mask)
    return run


def activemask(ins, m):
    def run(w, mask):
        v = int(np.sum(mask.astype(np.uint64) << w.lane.astype(np.uint64)))
        write(w, ins.args[0], np.full(32, v, np.uint32), mask)
    return run


# --- control and barriers ---------------------------------------------------------------


def bra(ins, m):
    target = m.fn.labels[ins.args[0]]

    def run(w, mask):
        w.pc[mask] = target
    return run


def ret(ins, m):
    def run(w, mask):
        w.exited |= mask
    return run


def trap(ins, m):
    def run(w, mask):
        if mask.any():
            raise EmulatorError("trap executed")
    return run


def bar(ins, m):
    """bar.sync / barrier.sync / bar.arrive id[, count]: warps count 32 threads each.
    bar.warp.sync membermask: the warp's lanes of the mask converge (a warp runs in lockstep
    here: a mask lane that is live but elsewhere is a `diverged-aligned` hazard)."""
    if ins.op.startswith("bar.warp.sync"):
        return _warp_sync(ins)
    arrive_only = ".arrive" in ins.op

    def run(w, mask):
        if not mask.any():
            return
        aligned_check(w, mask, ins)
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


def cluster_barrier(ins, m):
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


def mbarrier(ins, m):
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


def noop(ins, m):
    proxy = ins.op.startswith("fence.proxy.async")

    def run(w, mask):
        if proxy and mask.any():  # this warp's generic shared writes are visible to the async proxy
            for cta in w.cta.cluster.ctas:
                cta.smem.fence_proxy((w.cta.rank, w.index))
    return run
