"""The static synchronization lint (`tk_cute.emulator.lint`): each rule on a deliberately wrong
PTX snippet and its corrected form, and on a deliberately wrong variant of the sm100 kernel
(an op of the vocabulary replaced while the kernel is traced), which the clean kernel passes.

Every tcgen05 kernel the rest of the suite compiles is linted too (tests/conftest.py).
"""

import dataclasses

import pytest

from tk_cute import compile as compile_
from tk_cute.emulator import lint, ptx
from tk_cute.kernels.gemm import nvfp4_sm100 as K
from tk_cute.ops import schedule

HEAD = ".version 9.4\n.target sm_100a\n.address_size 64\n"


def kernel(body: str) -> str:
    """A one-kernel PTX text around `body` (registers declared)."""
    return (HEAD + ".visible .entry k(\n\t.param .u64 k_param_0\n)\n.reqntid 128, 1, 1\n{\n"
            "\t.reg .pred %p<8>;\n\t.reg .b32 %r<64>;\n\t.reg .b64 %rd<8>;\n"
            f"{body}\n\tret;\n}}\n")


def rules(text: str) -> set[str]:
    return {f.rule for f in lint.lint(text)}


LD = "tcgen05.ld.sync.aligned.32x32b.x2.b32 {%r1, %r2}, [%r3];"
ST = "tcgen05.st.sync.aligned.32x32b.x2.b32 [%r3], {%r1, %r2};"
ARRIVE = "mbarrier.arrive.shared::cluster.b64 _, [%r4], %r5;"
FENCE = "tcgen05.fence::before_thread_sync;"
LOOP = """$L__BB0_1:
\t{}
\tadd.s32 %r6, %r6, 1;
\tsetp.lt.s32 %p1, %r6, 4;
\t@%p1 bra $L__BB0_1;
"""

# rule -> (wrong body, corrected body)
SNIPPETS = {
    "tmem-ld-wait": (f"{LD}\n{FENCE}\n{ARRIVE}",
                     f"{LD}\ntcgen05.wait::ld.sync.aligned;\n{FENCE}\n{ARRIVE}"),
    "tmem-st-wait": (f"{ST}\n{FENCE}\n{ARRIVE}",
                     f"{ST}\ntcgen05.wait::st.sync.aligned;\n{FENCE}\n{ARRIVE}"),
    "tmem-fence-before-sync": (f"{LD}\ntcgen05.wait::ld.sync.aligned;\n{ARRIVE}",
                               f"{LD}\ntcgen05.wait::ld.sync.aligned;\n{FENCE}\n{ARRIVE}"),
    "proxy-fence": (
        "st.shared.v4.b32 [%r7], {%r1, %r2, %r3, %r4};\nbar.sync 1, 128;\n"
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd1, {%r1, %r2}], [%r7];\n"
        "cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;",
        "st.shared.v4.b32 [%r7], {%r1, %r2, %r3, %r4};\nfence.proxy.async.shared::cta;\n"
        "bar.sync 1, 128;\n"
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd1, {%r1, %r2}], [%r7];\n"
        "cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;"),
    "mbarrier-init-fence": (
        "mbarrier.init.shared.b64 [%r4], %r5;\nbarrier.cluster.arrive.relaxed;\n"
        "barrier.cluster.wait;",
        "mbarrier.init.shared.b64 [%r4], %r5;\nfence.mbarrier_init.release.cluster;\n"
        "barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait;"),
    "mbarrier-init-sync": (
        "mbarrier.init.shared.b64 [%r4], %r5;\nmbarrier.try_wait.parity.shared.b64 %p2, [%r4], 0;",
        "mbarrier.init.shared.b64 [%r4], %r5;\nbar.sync 0;\n"
        "mbarrier.try_wait.parity.shared.b64 %p2, [%r4], 0;"),
    "bulk-commit": (
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd1, {%r1, %r2}], [%r7];\n"
        "cp.async.bulk.wait_group.read 0;",
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd1, {%r1, %r2}], [%r7];\n"
        "cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;"),
    "bulk-wait": (
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd1, {%r1, %r2}], [%r7];\n"
        "cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 1;",
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd1, {%r1, %r2}], [%r7];\n"
        "cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;"),
    "tmem-alloc": (
        "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r4], 32;\n"
        "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;",
        "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r4], 32;\n"
        "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n"
        "tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r8, 32;"),
}


def test_every_rule_has_a_snippet():
    assert set(SNIPPETS) == {r.name for r in lint.RULES} | {"tmem-alloc"}


@pytest.mark.parametrize("rule", sorted(SNIPPETS))
def test_rule_on_snippet(rule):
    wrong, right = SNIPPETS[rule]
    assert rule in rules(kernel(wrong))
    assert rules(kernel(right)) == set()


def test_paths_through_loops_and_predicates():
    """A wait inside one branch does not cover the other path; a predicated wait may not run;
    the findings name the lines of the load and of the release."""
    only_one_path = (f"{LD}\nsetp.eq.s32 %p3, %r9, 0;\n@%p3 bra $L__BB0_2;\n"
                     f"tcgen05.wait::ld.sync.aligned;\n$L__BB0_2:\n{FENCE}\n{ARRIVE}")
    assert "tmem-ld-wait" in rules(kernel(only_one_path))
    predicated = f"{LD}\n@%p3 tcgen05.wait::ld.sync.aligned;\n{FENCE}\n{ARRIVE}"
    assert "tmem-ld-wait" in rules(kernel(predicated))
    # a load at the bottom of a loop reaches the release at its top on the next trip
    looped = LOOP.format(f"{ARRIVE}\n\t{LD}")
    found = [f for f in lint.lint(kernel(looped)) if f.rule == "tmem-ld-wait"]
    text = kernel(looped).splitlines()
    assert found and all(LD in text[f.origin_line - 1] and ARRIVE in text[f.line - 1]
                         for f in found)
    waited = LOOP.format(f"{ARRIVE}\n\t{LD}\n\ttcgen05.wait::ld.sync.aligned;\n\t{FENCE}")
    assert rules(kernel(waited)) == set()


def test_inline_asm_scopes_are_renamed():
    """The DSL's wait loops repeat the labels LAB_WAIT / DONE and the register P1 in every
    copy: each `{ }` scope gets its own names, and branches stay inside their scope."""
    wait = ("{\n.reg .pred P1;\nLAB_WAIT:\nmbarrier.try_wait.parity.shared.b64 P1, [%r4], 0;\n"
            "@P1 bra.uni DONE;\nbra.uni LAB_WAIT;\nDONE:\n}")
    fn = ptx.parse(kernel(f"bar.sync 0;\n{wait}\n{wait}")).kernels[0]
    assert {"LAB_WAIT#1", "DONE#1", "LAB_WAIT#2", "DONE#2"} <= set(fn.labels)
    waits = [i for i in fn.body if i.base == "mbarrier"]
    assert [w.args[0] for w in waits] == ["P1#1", "P1#2"]
    back = [i for i, ins in enumerate(fn.body) if ins.op == "bra.uni" and not ins.pred]
    assert [fn.successors(i) for i in back] == [[fn.labels["LAB_WAIT#1"]],
                                                [fn.labels["LAB_WAIT#2"]]]


def test_unknown_label_is_an_error():
    with pytest.raises(ptx.PtxError, match="unknown label"):
        ptx.parse(kernel("bra $L__nowhere;"))


# --- the sm100 kernel, clean and with one op of the vocabulary broken -----------------------
CFG = K.Config(arch="sm_100a", Mb=256, Nb=128, Kb=256, LOAD_PIPE_DEPTH=2,
               scheduler=schedule.STATIC)


def lint_variant(cfg, monkeypatch, **patches) -> set[str]:
    """Rules broken by the kernel compiled for `cfg` with `patches` ("module:attr" -> value)."""
    import importlib

    monkeypatch.setattr(compile_, "BUILD_CHECKS", [])
    for where, value in patches.items():
        path, attr = where.rsplit(":", 1)
        mod, _, cls = path.partition(":")
        owner = importlib.import_module(mod)
        monkeypatch.setattr(getattr(owner, cls) if cls else owner, attr, value)
    b, _ = K.compile(cfg, 256, 256, 512)
    return {f.rule for f in b.sync_findings}


@pytest.mark.parametrize("arch, out, sched", [
    ("sm_100a", "bfloat16", schedule.STATIC), ("sm_100a", "nvfp4", schedule.CLC),
    ("sm_103a", "nvfp4", schedule.STATIC), ("sm_107a", "bfloat16", schedule.CLC)])
def test_sm100_kernel_is_clean(arch, out, sched, monkeypatch):
    cfg = dataclasses.replace(CFG, arch=arch, out=out, scheduler=sched)
    assert lint_variant(cfg, monkeypatch) == set()


def _nvvm_only(kind):
    """A `tensor_load_wait` that emits only the wait (kind "wait") or only the fence."""
    from cutlass._mlir.dialects import nvvm
    from cutlass.cutlass_dsl import dsl_user_op

    @dsl_user_op
    def op(*, loc=None, ip=None):
        if kind == "wait":
            nvvm.tcgen05_wait(nvvm.Tcgen05WaitKind.LOAD, loc=loc, ip=ip)
        else:
            nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC, loc=loc, ip=ip)

    return op


def _noop(*args, **kwargs):
    return None


MUTATIONS = {
    # the defect found by reading the PTX (2026-12-04): the release without tcgen05.wait::ld
    "tmem-ld-wait": ("bfloat16", {"tk_cute.ops.tcgen05:tensor_load_wait": _nvvm_only("fence")}),
    "tmem-fence-before-sync": ("nvfp4",
                               {"tk_cute.ops.tcgen05:tensor_load_wait": _nvvm_only("wait")}),
    "proxy-fence": ("bfloat16", {"cutlass.cute.arch:fence_proxy": _noop}),
    "mbarrier-init-fence": ("bfloat16", {"cutlass.cute.arch:mbarrier_init_fence": _noop}),
    "mbarrier-init-sync": ("bfloat16", {"tk_cute.ops.cluster:cluster_wait": _noop}),
    "bulk-commit": ("bfloat16", {"tk_cute.ops.tma:store_commit_group": _noop}),
    "bulk-wait": ("bfloat16", {"tk_cute.ops.tma:store_async_read_wait": _noop}),
    "tmem-alloc": ("bfloat16", {"cutlass.memory:TmemAllocator:free": _noop}),
}


@pytest.mark.parametrize("rule", sorted(MUTATIONS))
def test_rule_on_broken_kernel(rule, monkeypatch):
    out, patches = MUTATIONS[rule]
    assert rule in lint_variant(dataclasses.replace(CFG, out=out), monkeypatch, **patches)


def st_kernel(wait: bool):
    """A one-CTA kernel that writes registers to tensor memory (`tcgen05.st`, inline PTX: no
    tk_cute GEMM writes TMEM), then frees the columns; `wait`: tcgen05.wait::st before."""
    import cutlass
    import cutlass.cute as cute
    from cutlass._mlir.dialects import nvvm

    from tk_cute.ops import tcgen05 as tc
    from tk_cute.ops import warp
    from tk_cute.ops.ptx import asm
    from tk_cute.types import tt as tmem
    from tk_cute.types.semaphore import NamedBarrier
    from tk_cute.types.st import Shared, st

    @cute.kernel
    def kernel():
        holding = Shared().alloc(st(cutlass.Int32, 8, 8, swizzle=False))
        alloc = tmem.tensor_allocator(holding.iterator, 32, "sm_100a", False,
                                      (NamedBarrier.TMEM_ALLOC, 128), 0)
        if warp.warpid() == 0:
            alloc.allocate()
        tm = alloc.wait()
        asm(None, [holding[0], cutlass.Int32(7)],
            "tcgen05.st.sync.aligned.32x32b.x1.b32 [$0], {$1};", "r,r", side_effects=True)
        if cutlass.const_expr(wait):
            nvvm.tcgen05_wait(nvvm.Tcgen05WaitKind.STORE)
        tc.fence_before_thread_sync()
        alloc.relinquish_alloc_permit()
        cute.arch.barrier(barrier_id=1, number_of_threads=128)
        if warp.warpid() == 0:
            alloc.free(tm.base, 32)

    @cute.jit
    def launch():
        kernel().launch(grid=(1, 1, 1), block=(128, 1, 1))

    return compile_.build(launch, arch="sm_100a")


def test_tmem_st_wait_on_a_kernel(monkeypatch):
    monkeypatch.setattr(compile_, "BUILD_CHECKS", [])
    assert {f.rule for f in st_kernel(wait=False).sync_findings} == {"tmem-st-wait"}
    assert st_kernel(wait=True).sync_findings == []
