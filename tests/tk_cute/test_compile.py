"""`tk_cute.compile.build`: one process builds for every target without a GPU."""

import pytest

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from tk_cute.compile import build


@cute.kernel
def _scale_kernel(x: cute.Tensor, y: cute.Tensor):
    i = cute.arch.block_idx()[0] * 128 + cute.arch.thread_idx()[0]
    y[i] = x[i] * 3.0


@cute.jit
def _scale(x: cute.Tensor, y: cute.Tensor):
    _scale_kernel(x, y).launch(grid=(x.shape[0] // 128, 1, 1), block=(128, 1, 1))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_103a", "sm_107a"])
def test_build_reports_target_ptx_sass_and_resources(arch):
    x = make_fake_tensor(cutlass.Float32, (cute.sym_int64(divisibility=128),), (1,),
                         assumed_align=16)
    b = build(_scale, x, x, arch=arch)
    assert f".target {arch}" in b.ptx
    assert b.ptx_count(r"mul\.f32") == 1
    assert b.sass_count(r"\bFMUL\b") == 1
    assert b.kernel.registers > 0 and b.kernel.local_bytes == 0
    assert b.compile_seconds > 0


def test_build_rejects_unknown_target():
    with pytest.raises(ValueError, match="unsupported target 'sm_120a'"):
        build(_scale, None, None, arch="sm_120a")


def test_a_tool_that_cannot_read_the_cubin_raises_naming_the_fix(monkeypatch, tmp_path):
    """An older CUDA's nvdisasm on PATH (the GPU machine's 12.x) exits non-zero on an sm_107a
    cubin: the SASS request says which tool failed and which package reads every target."""
    from tk_cute import compile as tk_compile

    old = tmp_path / "nvdisasm"
    old.write_text("#!/bin/sh\necho 'nvdisasm fatal : unsupported arch' >&2\nexit 1\n")
    old.chmod(0o755)
    monkeypatch.setattr(tk_compile, "cuda_tool", lambda name: str(old))
    x = make_fake_tensor(cutlass.Float32, (cute.sym_int64(divisibility=128),), (1,),
                         assumed_align=16)
    b = build(_scale, x, x, arch="sm_107a")
    with pytest.raises(RuntimeError, match=r"could not read the cubin.*unsupported arch.*"
                                           r"nvidia-cuda-nvdisasm==13\.5"):
        b.sass


def test_local_in_loops_finds_spills_between_a_label_and_its_backward_branch():
    """`Build.local_in_loops`: the STL / LDL inside a loop (a label, then a branch back to it),
    not those before it or in a forward branch's skipped block."""
    import types

    from tk_cute.compile import Build

    sass = """
        .section  .text.k,"ax",@progbits
.text.k:
        /*0000*/                   STL.64 [R1], R24 (*"SpillRefill"*);
        /*0010*/              @P0 BRA `(.L_x_0) ;
        /*0020*/                   LDL R3, [R1] ;
.L_x_0:
        /*0030*/                   HMMA.16816.F32.BF16 R4, R12, R2, R4 ;
.L_x_1:
        /*0040*/                   STL [R1+0xc], R26 (*"SpillRefill"*);
        /*0050*/                   LDL.LU R88, [R1+0x28] (*"SpillRefill"*);
        /*0060*/              @P3 BRA `(.L_x_1) ;
        /*0070*/                   LDL.LU.64 R2, [R1+0x8] ;
        /*0080*/                   EXIT ;
"""
    found = Build.local_in_loops(types.SimpleNamespace(sass=sass))
    assert [f.split()[1] for f in found] == ["STL", "LDL.LU"]
