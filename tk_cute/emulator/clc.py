# SPDX-License-Identifier: MIT
"""Cluster launch control (PTX ISA 9.7.9.x `clusterlaunchcontrol`): work stealing.

`try_cancel` asynchronously takes the next cluster of the grid that has not launched yet
(`Machine.cancel_next`: that cluster then never launches) and writes a 16-byte response to
shared memory (in every CTA of the cluster with `.multicast::cluster::all`), completing 16
bytes of transaction on the mbarrier at the same offset. The response is opaque in the ISA;
here bytes 0-3 hold 1 if a cluster was cancelled, bytes 4-15 its first CTA's x, y, z.
`query_cancel` reads a response from a 128-bit register.
"""

from __future__ import annotations

import numpy as np

from tk_cute.emulator import isa
from tk_cute.emulator.machine import AsyncOp
from tk_cute.emulator.memory import OFFSET_MASK, EmulatorError

RESPONSE_BYTES = 16


def _try_cancel(ins, m):
    everyone = "multicast::cluster::all" in ins.op

    def run(w, mask):
        lane = isa.first_lane(mask)
        if lane is None:
            return
        resp = int(isa.address(w, ins.args[0])[lane]) & OFFSET_MASK
        bar = int(isa.address(w, ins.args[1])[lane]) & OFFSET_MASK
        targets = w.cta.cluster.ctas if everyone else [w.cta]

        def complete():
            cid = m.cancel_next()
            words = np.zeros(4, np.uint32)
            if cid is not None:
                words[0] = 1
                words[1:] = [c * n for c, n in zip(cid, m.launch.cluster)]
            for cta in targets:
                cta.smem.span(resp, RESPONSE_BYTES, "clusterlaunchcontrol response")
                cta.smem.data[resp:resp + RESPONSE_BYTES] = words.view(np.uint8)
                cta.smem.written[resp:resp + RESPONSE_BYTES] = True
                cta.smem.writer[resp:resp + RESPONSE_BYTES] = -1
                b = cta.mbarriers.get(bar)
                if b is None:
                    raise EmulatorError(f"try_cancel signals an mbarrier at offset {bar:#x} "
                                        f"that was never initialized")
                b.tx -= RESPONSE_BYTES
                isa.check_tx(m, b, ins.line)
                b.complete_if_due()

        m.issue(AsyncOp(f"clusterlaunchcontrol.try_cancel (line {ins.line})", complete, w))
    return run


def _query(ins, m):
    what = ins.op.split(".")[2]

    def run(w, mask):
        h = isa.read(w, ins.args[1], "b128").reshape(32, 2).view(np.uint32)  # (32, 4) words
        if what == "is_canceled":
            isa.write(w, ins.args[0], h[:, 0] == 1, mask)
            return
        if what.startswith("get_first_ctaid"):
            axis = what.partition("::")[2]
            if axis:
                isa.write(w, ins.args[0], h[:, 1 + "xyz".index(axis)], mask)
            else:
                for i, r in enumerate(isa.vec(ins.args[0])[:3]):
                    isa.write(w, r, h[:, 1 + i], mask)
            return
        raise EmulatorError(f"`{ins.op}` is not emulated")
    return run


isa.ENGINES.update({"clusterlaunchcontrol.try_cancel": _try_cancel,
                    "clusterlaunchcontrol.query_cancel": _query})
