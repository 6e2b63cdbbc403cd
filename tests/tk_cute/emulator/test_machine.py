"""The machine's own checks on small hand-written PTX kernels: each hazard and the deadlock
report fire on a wrong kernel and stay quiet on its corrected form."""

from types import SimpleNamespace

import pytest

from tk_cute.emulator import machine, ptx
from tk_cute.emulator.memory import GlobalMemory

HEAD = ".version 9.4\n.target sm_100a\n.address_size 64\n"


def run(body: str, threads: int = 32):
    """Run a one-CTA kernel of `threads` threads around `body`; the Machine."""
    text = (HEAD + ".visible .entry k()\n{\n\t.reg .pred %p<8>;\n\t.reg .b32 %r<32>;\n"
            "\t.reg .b64 %rd<8>;\n\t.shared .align 8 .b8 bars[64];\n"
            f"{body}\n\tret;\n}}\n")
    fn = ptx.parse(text).kernels[0]
    launch = SimpleNamespace(grid=(1, 1, 1), block=(threads, 1, 1), cluster=(1, 1, 1),
                             smem_bytes=0, params=())
    return machine.Machine(fn, launch, GlobalMemory(), module_shared={}).run()


INIT = ("\tmov.u32 %r1, bars;\n\tmov.u32 %r2, 1;\n\tmbarrier.init.shared.b64 [%r1], %r2;\n"
        "\tbar.sync 0;\n")
WAIT = ("\t{{\n\t.reg .pred P1;\n\tLAB_WAIT:\n\tmbarrier.try_wait.parity.shared.b64 P1, [%r1], "
        "{parity};\n\t@P1 bra.uni DONE;\n\tbra.uni LAB_WAIT;\n\tDONE:\n\t}}\n")
ARRIVE = "\tmbarrier.arrive.shared.b64 %rd1, [%r1];\n"
ONE_LANE = "\tmov.u32 %r3, %laneid;\n\tsetp.ne.u32 %p1, %r3, 0;\n\t@%p1 bra $L__skip;\n"


def kinds(m) -> set[str]:
    return {h.kind for h in m.hazards}


def test_parity_lap():
    """Two phases complete between a warp's waits: its next parity wait cannot tell them
    apart."""
    body = INIT + ONE_LANE + ARRIVE + WAIT.format(parity=0) + ARRIVE + ARRIVE + \
        WAIT.format(parity=0) + "$L__skip:\n"
    assert "parity-lap" in kinds(run(body))
    steady = INIT + ONE_LANE + ARRIVE + WAIT.format(parity=0) + ARRIVE + \
        WAIT.format(parity=1) + "$L__skip:\n"
    assert kinds(run(steady)) == set()


def test_arrival_overflow():
    body = INIT + ARRIVE  # all 32 lanes arrive on a barrier that counts 1
    assert "arrival-overflow" in kinds(run(body))
    assert kinds(run(INIT + ONE_LANE + ARRIVE + "$L__skip:\n")) == set()


def test_deadlock_names_the_barrier_and_the_wait():
    body = INIT + WAIT.format(parity=0)  # nobody arrives
    with pytest.raises(machine.Deadlock, match=r"warp 0: PTX line \d+: mbarrier \(initialized "
                       r"at line \d+\) wait: phase 0, 1 of 1 arrivals"):
        run(body)


def test_named_barrier_deadlock_counts_threads():
    body = "\tmov.u32 %r3, %tid.x;\n\tsetp.lt.u32 %p1, %r3, 32;\n\t@%p1 bra $L__end;\n" \
           "\tbar.sync 1, 64;\n$L__end:\n"  # 64 threads expected, one warp of 32 comes
    with pytest.raises(machine.Deadlock, match=r"named barrier 1 \(32 of 64 threads arrived\)"):
        run(body, threads=64)


def test_diverged_aligned_instruction():
    """`.aligned` / `bar.sync`: every live lane of the warp executes it together."""
    body = ONE_LANE + "\tbar.sync 0;\n$L__skip:\n"  # lane 0 alone at a CTA barrier
    assert "diverged-aligned" in kinds(run(body))
    assert kinds(run("\tbar.sync 0;\n")) == set()


def test_uninitialized_shared_read():
    body = "\tmov.u32 %r1, bars;\n\tld.shared.b32 %r4, [%r1+16];\n"
    assert "uninitialized-shared" in kinds(run(body))
    written = "\tmov.u32 %r1, bars;\n\tst.shared.b32 [%r1+16], %r2;\n\tld.shared.b32 %r4, " \
              "[%r1+16];\n"
    assert kinds(run(written)) == set()


@pytest.mark.parametrize("op", ["shf.l.wrap.b32", "shf.r.wrap.b32", "shf.l.clamp.b32",
                                "shf.r.clamp.b32"])
def test_funnel_shift(op):
    """``shf``: the 64 bits b:a (a low) shifted by c (wrap: c mod 32; clamp: at most 32); .l
    keeps the high word, .r the low (PTX ISA, shf). Lane i shifts by 2i (0..62)."""
    import torch

    from tk_cute.emulator.gemm import place

    a, b = 0x89ABCDEF, 0x13579BDF
    out = torch.zeros(32, dtype=torch.int64)  # one 8-byte slot per lane (a b32 in its low half)
    body = (f"\tmov.u32 %r1, %laneid;\n\tshl.b32 %r2, %r1, 1;\n\tmov.u32 %r3, {a};\n"
            f"\tmov.u32 %r4, {b};\n\t{op} %r5, %r3, %r4, %r2;\n"
            f"\tmul.wide.u32 %rd1, %r1, 8;\n\tmov.u64 %rd2, {out.data_ptr()};\n"
            "\tadd.s64 %rd3, %rd2, %rd1;\n\tst.global.u32 [%rd3], %r5;\n")
    text = (HEAD + ".visible .entry k()\n{\n\t.reg .pred %p<8>;\n\t.reg .b32 %r<32>;\n"
            f"\t.reg .b64 %rd<8>;\n{body}\n\tret;\n}}\n")
    mem = GlobalMemory()
    place(mem, out)
    launch = SimpleNamespace(grid=(1, 1, 1), block=(32, 1, 1), cluster=(1, 1, 1),
                             smem_bytes=0, params=())
    machine.Machine(ptx.parse(text).kernels[0], launch, mem, module_shared={}).run()
    v = (b << 32) | a
    for lane in range(32):
        c = 2 * lane
        n = min(c, 32) if ".clamp" in op else c % 32
        want = ((v << n) >> 32) if ".l." in op else (v >> n)
        assert int(out[lane]) & 0xFFFFFFFF == want & 0xFFFFFFFF, (op, lane)
