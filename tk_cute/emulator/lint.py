# SPDX-License-Identifier: MIT
"""A static synchronization lint over a kernel's PTX: the ordering rules of the PTX ISA's memory
consistency sections that a compile test cannot see.

`lint(ptx_text) -> list[Finding]` checks every `.entry` of the text. Each path rule is a forward
may-analysis over the instruction-level control-flow graph (`ptx.Function.successors`): an
instruction *opens* a fact (say "a tcgen05.ld is in flight"), another *closes* it, and a third
*checks* that no open fact reaches it along any path. The analysis reads the kernel as one
thread walking the whole CFG, so a write in one warp role followed, through a barrier, by a read
in another is a path too; a fact is closed only by an unpredicated instruction. The price of
that reading: two branches on one test (`warp == 0` around a TMA store's commit, and again
around the final wait) are independent paths to it, so such a kernel shows a path that skips
the wait; the tcgen05 kernels keep each role's opening and closing instructions in one branch
(the test suite holds every tcgen05 kernel it builds to the lint, tests/conftest.py).

Rules (name: what opens -> what closes, checked at; the ISA section):
- `tmem-ld-wait`: `tcgen05.ld` -> `tcgen05.wait::ld`; at a release of tensor memory to another
  thread (`mbarrier.arrive*`, `barrier.cluster.arrive*`) and at `tcgen05.dealloc`. The ISA's
  pattern for handing TMEM that was read to another thread is ld -> wait::ld ->
  fence::before_thread_sync -> arrive (9.7.16.6.4.4; anti-dependencies: 9.7.16.6.4.5).
  Stricter than the hardware, whose register scoreboard also orders a release after the loaded
  values were used; the ISA names wait::ld.
- `tmem-st-wait`: the same for `tcgen05.st` -> `tcgen05.wait::st`.
- `tmem-fence-before-sync`: `tcgen05.ld` / `tcgen05.st` -> `tcgen05.fence::before_thread_sync`;
  at an `mbarrier.arrive*` / `barrier.cluster.arrive*` and at `tcgen05.dealloc` (9.7.16.6.4.4).
- `proxy-fence`: a generic-proxy shared store (`st.shared*`, `stmatrix`, `atom.shared`,
  `red.shared`) -> `fence.proxy.async`; at an async-proxy read of shared memory (a TMA or bulk
  store from shared::cta, `tcgen05.mma`, `tcgen05.cp`, `wgmma.mma_async`) (memory consistency
  model, proxies: 8.6 / 9.7.13.4.17).
- `mbarrier-init-fence`: `mbarrier.init` -> `fence.mbarrier_init`; at `barrier.cluster.arrive*`
  (an initialized barrier is made visible to the cluster before the cluster syncs, 9.7.13.4.18).
- `mbarrier-init-sync`: `mbarrier.init` -> a CTA or cluster barrier (`bar.sync`,
  `barrier.sync`, `barrier.cluster.wait`); at any use of an mbarrier (arrive, wait, a TMA / bulk
  copy or `tcgen05.commit` signalling one, `clusterlaunchcontrol.try_cancel`) (9.7.13.15.11).
- `bulk-commit`: a bulk-group copy (`cp.async.bulk* ... .bulk_group`) -> `cp.async.bulk.
  commit_group`; at `cp.async.bulk.wait_group*` and the end of the kernel (a copy outside any
  group is never waited, 9.7.9.25.4).
- `bulk-wait`: `cp.async.bulk.commit_group` -> `cp.async.bulk.wait_group[.read] 0`; at the end
  of the kernel (shared memory must outlive the reads of the stores, 9.7.9.25.4).
And one kernel-wide rule, `tmem-alloc`: a `tcgen05.alloc` needs a `tcgen05.dealloc` and a
`tcgen05.relinquish_alloc_permit` of the same `cta_group` (9.7.16.7.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from tk_cute.emulator.ptx import Function, Instr, parse


@dataclass(frozen=True)
class Finding:
    """A rule broken: the check instruction, the instruction that opened the fact."""

    rule: str
    kernel: str
    line: int  # line of the check (the release, the read, the end) in the PTX text
    origin_line: int  # line of the instruction that opened the fact
    message: str

    def __str__(self) -> str:
        return f"{self.rule} (line {self.line}): {self.message}"


def _arrive(i: Instr) -> bool:
    return (i.op.startswith("mbarrier.arrive") or i.op.startswith("barrier.cluster.arrive")
            or i.op.startswith("mbarrier.arrive_drop"))


def _dealloc(i: Instr) -> bool:
    return i.op.startswith("tcgen05.dealloc")


def _tmem_ld(i: Instr) -> bool:
    return i.op.startswith("tcgen05.ld.")


def _tmem_st(i: Instr) -> bool:
    return i.op.startswith("tcgen05.st.")


def _generic_smem_store(i: Instr) -> bool:
    if i.base in ("st", "atom", "red"):
        return "shared" in i.op.split(".") or any(p.startswith("shared::") for p in
                                                   i.op.split("."))
    return i.base == "stmatrix"


def _async_smem_read(i: Instr) -> bool:
    if i.op.startswith(("cp.async.bulk", "cp.reduce.async.bulk")):
        parts = i.op.split(".")
        # destination first: global.shared::cta (a store) reads shared memory
        return "global" in parts and any(p.startswith("shared") for p in
                                         parts[parts.index("global") + 1:])
    return i.op.startswith(("tcgen05.mma", "tcgen05.cp", "wgmma.mma_async"))


def _mbarrier_use(i: Instr) -> bool:
    if i.op.startswith("mbarrier.") and not i.op.startswith("mbarrier.init"):
        return True
    return ("mbarrier::" in i.op and i.base in ("cp", "tcgen05", "clusterlaunchcontrol")) or (
        i.op.startswith("tcgen05.commit"))


def _cta_sync(i: Instr) -> bool:
    return i.op.startswith(("bar.sync", "barrier.sync", "barrier.cluster.wait")) or (
        i.op == "bar.red" or i.op.startswith("barrier.cta.sync"))


def _bulk_group_copy(i: Instr) -> bool:
    return i.op.startswith(("cp.async.bulk", "cp.reduce.async.bulk")) and i.has("bulk_group")


def _wait_all(i: Instr) -> bool:
    return i.op.startswith("cp.async.bulk.wait_group") and i.args[:1] == ("0",)


def _end(fn: Function, i: int) -> bool:
    return fn.body[i].base in ("ret", "exit") and not fn.body[i].pred


@dataclass(frozen=True)
class Rule:
    name: str
    opens: Callable[[Instr], bool]
    closes: Callable[[Instr], bool]
    checks: Callable[[Instr], bool]
    at_end: bool  # also checked where the kernel ends (ret / exit / falling off the body)
    message: str  # format fields: what, origin, check


RULES = (
    Rule("tmem-ld-wait", _tmem_ld, lambda i: i.op.startswith("tcgen05.wait::ld"),
         lambda i: _arrive(i) or _dealloc(i), False,
         "{what} at line {origin} may still be in flight at `{check}`: add tcgen05.wait::ld "
         "(then tcgen05.fence::before_thread_sync) before tensor memory is released (PTX ISA "
         "9.7.16.6.4.4)"),
    Rule("tmem-st-wait", _tmem_st, lambda i: i.op.startswith("tcgen05.wait::st"),
         lambda i: _arrive(i) or _dealloc(i), False,
         "{what} at line {origin} may still be in flight at `{check}`: add tcgen05.wait::st "
         "before the release (PTX ISA 9.7.16.6.4.4)"),
    Rule("tmem-fence-before-sync", lambda i: _tmem_ld(i) or _tmem_st(i),
         lambda i: i.op == "tcgen05.fence::before_thread_sync",
         lambda i: _arrive(i) or _dealloc(i), False,
         "{what} at line {origin} is not ordered before `{check}`: add "
         "tcgen05.fence::before_thread_sync between them (PTX ISA 9.7.16.6.4.4)"),
    Rule("proxy-fence", _generic_smem_store, lambda i: i.op.startswith("fence.proxy.async"),
         _async_smem_read, False,
         "shared memory written by `{what}` at line {origin} reaches the async-proxy read "
         "`{check}` with no fence.proxy.async between them"),
    Rule("mbarrier-init-fence", lambda i: i.op.startswith("mbarrier.init"),
         lambda i: i.op.startswith("fence.mbarrier_init"),
         lambda i: i.op.startswith("barrier.cluster.arrive"), False,
         "`{what}` at line {origin} reaches the cluster barrier `{check}` with no "
         "fence.mbarrier_init.release.cluster: the cluster may see it uninitialized"),
    Rule("mbarrier-init-sync", lambda i: i.op.startswith("mbarrier.init"), _cta_sync,
         _mbarrier_use, False,
         "`{what}` at line {origin} reaches `{check}` with no CTA or cluster barrier between "
         "them: other threads may use the barrier before it is initialized"),
    Rule("bulk-commit", _bulk_group_copy, lambda i: i.op.startswith("cp.async.bulk.commit_group"),
         lambda i: i.op.startswith("cp.async.bulk.wait_group"), True,
         "the bulk copy `{what}` at line {origin} is in no committed bulk group at `{check}`: "
         "no wait covers it"),
    Rule("bulk-wait", lambda i: i.op.startswith("cp.async.bulk.commit_group"), _wait_all,
         lambda i: False, True,
         "the bulk group committed at line {origin} may still read shared memory at `{check}`: "
         "add cp.async.bulk.wait_group.read 0 before the CTA exits"),
)


def _short(i: Instr) -> str:
    return i.op if not i.args or len(i.args[0]) > 24 else f"{i.op} {i.args[0]}"


def check_paths(fn: Function, rule: Rule) -> list[Finding]:
    """`rule` on every path of `fn` (a forward may-analysis to a fixed point)."""
    n = len(fn.body)
    preds: list[list[int]] = [[] for _ in range(n + 1)]
    for i in range(n):
        for s in fn.successors(i):
            preds[s].append(i)
    out: list[frozenset] = [frozenset()] * n
    work = list(range(n))
    queued = set(work)
    while work:
        i = work.pop(0)
        queued.discard(i)
        facts = frozenset().union(*(out[p] for p in preds[i])) if preds[i] else frozenset()
        ins = fn.body[i]
        if rule.closes(ins) and not ins.pred:
            facts = frozenset()
        if rule.opens(ins):
            facts = facts | {i}
        if facts != out[i]:
            out[i] = facts
            for s in fn.successors(i):
                if s < n and s not in queued:
                    work.append(s)
                    queued.add(s)
    found = {}
    for i in range(n + 1):
        at_end = i == n or _end(fn, i)
        if i < n and not rule.checks(fn.body[i]) and not (rule.at_end and at_end):
            continue
        if i == n and not rule.at_end:
            continue
        live = frozenset().union(*(out[p] for p in preds[i])) if preds[i] else frozenset()
        for o in sorted(live):
            check = "the end of the kernel" if i == n else _short(fn.body[i])
            line = fn.body[i].line if i < n else fn.body[-1].line
            key = (line, fn.body[o].line)
            found.setdefault(key, Finding(rule.name, fn.name, line, fn.body[o].line,
                                          rule.message.format(what=_short(fn.body[o]),
                                                              origin=fn.body[o].line,
                                                              check=check)))
    return list(found.values())


def check_alloc(fn: Function) -> list[Finding]:
    """`tmem-alloc`: each `tcgen05.alloc` group has a dealloc and a relinquish of its group."""
    group = lambda i: (re.search(r"cta_group::(\d)", i.op) or [None, "1"])[1]
    out = []
    for a in (i for i in fn.body if i.op.startswith("tcgen05.alloc")):
        for what in ("tcgen05.dealloc", "tcgen05.relinquish_alloc_permit"):
            if not any(i.op.startswith(what) and group(i) == group(a) for i in fn.body):
                out.append(Finding("tmem-alloc", fn.name, a.line, a.line,
                                   f"`{a.op}` at line {a.line} has no {what} of cta_group::"
                                   f"{group(a)}: the columns or the allocation permit leak"))
    return out


def lint(ptx_text: str, rules=RULES) -> list[Finding]:
    """Every finding of every rule in every kernel of `ptx_text`, in line order."""
    out = []
    for fn in parse(ptx_text).kernels:
        for rule in rules:
            out += check_paths(fn, rule)
        out += check_alloc(fn)
    return sorted(out, key=lambda f: (f.kernel, f.line, f.rule, f.origin_line))
