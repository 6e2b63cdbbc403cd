# SPDX-License-Identifier: MIT
"""The emulator's machine: warps of 32 lanes, CTAs in clusters, and the scheduler.

A `Machine` runs one kernel launch (`tk_cute.emulator.launch.Launch`: grid, block, cluster,
dynamic shared memory, each parameter's bytes) of a PTX function over `GlobalMemory`. Each
instruction is decoded once into a handler (`tk_cute.emulator.isa.decode`); a warp executes the
lanes whose program counter is the lowest among its live lanes (min-PC reconvergence: right for
the structured, reducible control flow the DSL emits). A handler that cannot proceed (a parity
wait on a phase not yet complete, a barrier not yet full, an allocation not yet possible) raises
`Block`; the warp stays at that instruction until the block's condition holds, then executes it
again. The scheduler runs warps until they block; when none can run it completes a pending
asynchronous operation (`Machine.pending`), and when there is none either it raises `Deadlock`
listing every blocked warp: its CTA, warp, PTX line and what it waits for.

Clusters are resident `resident` at a time (the rest wait to launch, as on a GPU whose SMs are
full; cluster launch control cancels them from that queue). `adversarial=True` (seeded) picks
the next warp at random and leaves asynchronous operations pending as long as possible:
a hazard that a friendly order hides shows as a wrong result, a hazard report or a deadlock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tk_cute.emulator import ptx as P
from tk_cute.emulator.memory import (
    RANK_SHIFT, RESERVED_SHARED, EmulatorError, GlobalMemory, SharedMemory)
from tk_cute.emulator.values import DTYPES


class Block(Exception):
    """Raised by a handler: the warp waits until `ready()`; `what` says for what."""

    def __init__(self, ready: Callable[[], bool], what: str):
        super().__init__(what)
        self.ready, self.what = ready, what


class Deadlock(EmulatorError):
    """No warp can run and nothing is pending: `blocked` lists (cta, warp, line, what)."""

    def __init__(self, blocked: list[tuple]):
        self.blocked = blocked
        lines = [f"  CTA {c} warp {w}: PTX line {line}: {what}" for c, w, line, what in blocked]
        super().__init__("deadlock: no warp can run and no asynchronous operation is pending\n"
                         + "\n".join(lines))


RELEASE_CHECKS: list = []  # (machine, warp, ins) -> None, registered by the async engines


@dataclass
class Hazard:
    """A rule of the ISA broken while running (the run continues; `Machine.hazards`)."""

    kind: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.kind} (PTX line {self.line}): {self.message}"


@dataclass
class AsyncOp:
    """An issued asynchronous operation: `complete()` makes its effects visible."""

    what: str
    complete: Callable[[], None]
    warp: "Warp | None" = None
    done: bool = False
    late: bool = False  # completes only when waited for (`Machine.issue`)
    after: list = field(default_factory=list)  # deferred register moves of its results


class Warp:
    """32 lanes: registers (raw bits, `.reg` declarations), program counters, live mask."""

    def __init__(self, cta: "CTA", index: int, tids: np.ndarray):
        self.cta, self.index = cta, index
        self.live = np.zeros(32, bool)
        self.live[: len(tids)] = True
        tid = np.zeros(32, np.int64)
        tid[: len(tids)] = tids
        bx, by, _ = cta.machine.launch.block
        self.tid = (tid % bx, tid // bx % by, tid // (bx * by))
        self.lane = np.arange(32, dtype=np.uint32)
        self.pc = np.zeros(32, np.int64)
        self.exited = ~self.live
        self.regs: dict[str, np.ndarray] = {}
        self.blocked: Block | None = None
        self.executed = 0  # warp-instructions
        self.scoreboard: dict[str, AsyncOp] = {}  # register -> op that will write it
        self.state: dict = {}  # per-warp state of multi-step instructions (barriers)

    @property
    def done(self) -> bool:
        return bool(self.exited.all())

    def storage(self, name: str) -> np.ndarray:
        reg = self.regs.get(name)
        if reg is None:
            decl = self.cta.machine.reg_types.get(name)
            if decl is None:
                raise EmulatorError(f"register {name} is not declared")
            shape = (32, 2) if decl == "b128" else (32,)
            reg = self.regs[name] = np.zeros(shape, DTYPES[decl])
        return reg

    def wait_scoreboard(self, name: str):
        op = self.scoreboard.pop(name, None)
        if op is not None and not op.done:
            self.cta.machine.complete(op)

    @property
    def where(self) -> str:
        return f"CTA {self.cta.ctaid} warp {self.index}"


class CTA:
    """A CTA: its warps, shared memory, named barriers and mbarriers."""

    def __init__(self, machine: "Machine", cluster: "Cluster", ctaid, rank: int):
        self.machine, self.cluster, self.ctaid, self.rank = machine, cluster, ctaid, rank
        self.smem = SharedMemory(machine.shared_size, rank)
        self.named: dict[int, dict] = {}  # barrier id -> {"warps": set, "gen": int}
        self.mbarriers: dict[int, "MBarrier"] = {}  # shared offset -> barrier
        bx, by, bz = machine.launch.block
        n = bx * by * bz
        self.threads = n
        self.warps = [Warp(self, w, np.arange(32 * w, min(32 * w + 32, n)))
                      for w in range(-(-n // 32))]
        self.sm = machine.sm_for(self)

    @property
    def done(self) -> bool:
        return all(w.done for w in self.warps)


class Cluster:
    def __init__(self, machine: "Machine", cluster_id, first_ctaid):
        cx, cy, cz = machine.launch.cluster
        self.machine, self.id = machine, cluster_id
        self.ctas = []
        for r in range(cx * cy * cz):
            off = (r % cx, r // cx % cy, r // (cx * cy))
            ctaid = tuple(f + o for f, o in zip(first_ctaid, off))
            self.ctas.append(CTA(machine, self, ctaid, r))
        self.barrier = {"arrived": 0, "gen": 0}  # barrier.cluster

    @property
    def done(self) -> bool:
        return all(c.done for c in self.ctas)


@dataclass
class MBarrier:
    """An mbarrier object (PTX ISA 9.7.13.15): phase, pending arrivals, tx-count."""

    expected: int
    pending: int
    tx: int = 0
    phase: int = 0
    line: int = 0  # where it was initialized

    def complete_if_due(self):
        if self.pending <= 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.expected


@dataclass
class Machine:
    """One launch of `fn` (a `ptx.Function`) over `memory`."""

    fn: P.Function
    launch: object  # tk_cute.emulator.launch.Launch (grid, block, cluster, smem_bytes, params)
    memory: GlobalMemory
    arch: str = "sm_100a"
    resident: int = 2  # clusters running at once
    adversarial: bool = False
    seed: int = 0
    module_shared: dict = field(default_factory=dict)
    hazards: list = field(default_factory=list)
    max_instructions: int = 50_000_000
    # adversarial schedule: per instruction, the chance that a random pending asynchronous
    # operation completes, and that the warp yields to another
    COMPLETE_P = 0.05
    SWITCH_P = 0.2
    SWITCH_RELEASE_P = 0.8  # after an mbarrier arrive: where a released resource is raced

    def __post_init__(self):
        from tk_cute.emulator import clc, isa, tcgen05, tma, wgmma  # noqa: F401  (engines)

        self.rng = random.Random(self.seed)
        self.reg_types = {}
        for name, (t, count) in self.fn.regs.items():
            t = t.lstrip(".")
            if count:
                for i in range(count):
                    self.reg_types[f"{name}{i}"] = t
            else:
                self.reg_types[name] = t
        self.symbols, static = {}, RESERVED_SHARED
        for name, (_, align, size) in {**self.module_shared, **self.fn.shared}.items():
            if size == 0:  # the dynamic shared memory: after the static variables
                continue
            static = -(-static // align) * align
            self.symbols[name] = static
            static += size
        self.dynamic_offset = -(-static // 1024) * 1024
        for name, (_, _, size) in {**self.module_shared, **self.fn.shared}.items():
            if size == 0:
                self.symbols[name] = self.dynamic_offset
        self.shared_size = self.dynamic_offset + self.launch.smem_bytes
        self.param_offsets, off = {}, 0
        for p in self.fn.params:
            off = -(-off // p.align) * p.align
            self.param_offsets[p.name] = off
            off += p.size
        given = list(self.launch.params)
        if len(given) != len(self.fn.params):
            raise EmulatorError(f"{len(given)} parameters given; the kernel declares "
                                f"{len(self.fn.params)}")
        self.params = np.zeros(off, np.uint8)
        for p, g in zip(self.fn.params, given):
            if len(g.data) != p.size:
                raise EmulatorError(f"parameter {p.name}: {len(g.data)} B given, {p.size} B "
                                    f"declared")
            at = self.param_offsets[p.name]
            self.params[at:at + p.size] = np.frombuffer(g.data, np.uint8)
        self.handlers = [isa.decode(ins, self) for ins in self.fn.body]
        self.pending: list[AsyncOp] = []
        self.clusters_waiting = self._cluster_queue()
        self.running: list[Cluster] = []
        self.finished_warps: list[Warp] = []
        self.executed = 0
        self.tmem = {}  # sm -> tensor memory state (tk_cute.emulator.tcgen05)
        self.extra = {}  # state of the async engines (tma, tcgen05), by engine

    # --- launch ------------------------------------------------------------------------
    def _cluster_queue(self) -> list:
        g, c = self.launch.grid, self.launch.cluster
        if any(gi % ci for gi, ci in zip(g, c)):
            raise EmulatorError(f"grid {g} is not a multiple of the cluster {c}")
        out = []
        for z in range(0, g[2], c[2]):
            for y in range(0, g[1], c[1]):
                for x in range(0, g[0], c[0]):
                    out.append((x // c[0], y // c[1], z // c[2]))
        return out

    def sm_for(self, cta: CTA) -> int:
        return len(self.running) * 1000 + cta.rank  # distinct per resident CTA

    def launch_next(self) -> bool:
        if not self.clusters_waiting:
            return False
        cid = self.clusters_waiting.pop(0)
        c = self.launch.cluster
        self.running.append(Cluster(self, cid, tuple(i * n for i, n in zip(cid, c))))
        return True

    def _end_cluster(self, cl: Cluster):
        """Checks when a cluster's CTAs have all exited: TMEM still allocated is a leak."""
        for c in cl.ctas:
            held = getattr(c, "extra_tmem", None)
            if held is not None:
                self.hazard("tmem-leak", 0, f"CTA {c.ctaid} exited holding TMEM columns "
                            f"{held[0]}..{held[0] + held[1] - 1} (no tcgen05.dealloc)")

    def cancel_next(self):
        """Cluster launch control: take the next cluster that has not launched (or None)."""
        return self.clusters_waiting.pop(0) if self.clusters_waiting else None

    # --- asynchronous operations --------------------------------------------------------
    def issue(self, op: AsyncOp, late: bool = False):
        """An asynchronous operation: done now, or (adversarial) left pending; `late`: left
        pending in every mode until something waits for it (a register read, a wait, or no
        warp able to run), as a tcgen05.ld is."""
        if self.adversarial or late:
            op.late = late
            self.pending.append(op)
        else:
            self.complete(op)

    def complete(self, op: AsyncOp):
        if not op.done:
            op.done = True
            if op in self.pending:
                self.pending.remove(op)
            op.complete()
            for move in op.after:
                move()

    def complete_all(self, pred=lambda op: True):
        for op in [o for o in self.pending if pred(o)]:
            self.complete(op)

    def released(self, w: Warp, ins):
        """Warp `w` arrived on an mbarrier (a release to other threads): the engines' checks
        of what it may still have in flight (`RELEASE_CHECKS`)."""
        for check in RELEASE_CHECKS:
            check(self, w, ins)

    def hazard(self, kind: str, line: int, message: str):
        self.hazards.append(Hazard(kind, line, message))

    # --- running ------------------------------------------------------------------------
    def run(self) -> "Machine":
        """Run every CTA of the grid to its end (raises `Deadlock`, `EmulatorError`)."""
        while self.running or self.clusters_waiting:
            while len(self.running) < self.resident and self.launch_next():
                pass
            warps = [w for cl in self.running for c in cl.ctas for w in c.warps if not w.done]
            if self.adversarial:
                self.rng.shuffle(warps)
            progressed = False
            for w in warps:
                if w.blocked is not None:
                    if not w.blocked.ready():
                        continue
                    w.blocked = None
                progressed |= self._run_warp(w)
            for cl in [cl for cl in self.running if cl.done]:
                self.finished_warps += [w for c in cl.ctas for w in c.warps]
                self._end_cluster(cl)
            self.running = [cl for cl in self.running if not cl.done]
            if progressed:
                continue
            if self.pending:
                early = [op for op in self.pending if not op.late] or self.pending
                op = self.rng.choice(early) if self.adversarial else early[0]
                self.complete(op)
                continue
            if self.running:
                raise Deadlock([(w.cta.ctaid, w.index, self.fn.body[int(w.pc[~w.exited].min())]
                                 .line, w.blocked.what if w.blocked else "nothing")
                                for cl in self.running for c in cl.ctas for w in c.warps
                                if not w.done])
        if self.pending:
            self.complete_all()
        return self

    def _run_warp(self, w: Warp, budget: int = 4096) -> bool:
        """Run `w` until it blocks, ends or spends `budget`; whether it executed anything."""
        ran = 0
        body, handlers = self.fn.body, self.handlers
        while ran < budget:
            live = ~w.exited
            if not live.any():
                break
            pc = int(w.pc[live].min())
            if pc >= len(body):
                raise EmulatorError(f"{w.where} ran past the end of the kernel")
            mask = live & (w.pc == pc)
            ins = body[pc]
            try:
                handlers[pc](w, mask, ins)
            except Block as b:
                w.blocked = b
                break
            except EmulatorError as e:
                if not getattr(e, "located", False):
                    e.args = (f"{w.where}, PTX line {ins.line} `{ins}`: {e.args[0]}",)
                    e.located = True
                raise
            w.pc[mask & (w.pc == pc)] = pc + 1
            ran += 1
            if self.adversarial:  # other warps may run between any two instructions
                early = [op for op in self.pending if not op.late]
                if early and self.rng.random() < self.COMPLETE_P:
                    self.complete(self.rng.choice(early))
                if self.rng.random() < (self.SWITCH_RELEASE_P if ins.base == "mbarrier" and
                                        ".arrive" in ins.op else self.SWITCH_P):
                    break
        w.executed += ran
        self.executed += ran
        if self.executed > self.max_instructions:
            raise EmulatorError(f"more than {self.max_instructions} warp-instructions: a "
                                f"livelock, or raise Machine.max_instructions")
        return ran > 0

    # --- addresses ----------------------------------------------------------------------
    def shared_target(self, cta: CTA, addr: int):
        """(CTA, offset) a shared::cluster address names."""
        rank = addr >> RANK_SHIFT
        if rank >= len(cta.cluster.ctas):
            raise EmulatorError(f"shared::cluster address {addr:#x} names CTA rank {rank}; the "
                                f"cluster has {len(cta.cluster.ctas)}")
        return cta.cluster.ctas[rank], addr & ((1 << RANK_SHIFT) - 1)


def run(launch, memory: GlobalMemory, **options) -> Machine:
    """Run a captured launch (`tk_cute.emulator.launch.capture`) over `memory`; options as
    `Machine`'s (resident, adversarial, seed)."""
    mod = P.parse(launch.ptx)
    fn = mod.functions.get(launch.kernel)
    if fn is None:
        raise EmulatorError(f"kernel {launch.kernel!r} is not in the launch's PTX "
                            f"({list(mod.functions)})")
    return Machine(fn, launch, memory, arch=launch.arch, module_shared=mod.shared,
                   **options).run()
