"""The Blackwell/Rubin torch entry `gemm_sm100`: validation and argument conversion on the CPU
(the device query monkeypatched); the compile through the same path is in
tests/kernels/test_nvfp4_sm100_compile.py; a GPU run (sm_100a+) against the exact reference."""

import pytest
import torch

from tk_cute import arch
from tk_cute.layouts.nvfp4_scales import blocked_shape
from tk_cute.nvfp4 import NVFP4Tensor, gemm_reference, quantize
from tk_cute.nvfp4 import dispatch_sm100 as D
from tk_cute.nvfp4 import heuristics


def operand(rows, k, lead=(), gs=0.5):
    return NVFP4Tensor(torch.zeros(*lead, rows, k // 2, dtype=torch.uint8),
                       torch.zeros(blocked_shape(rows, k, *lead), dtype=torch.uint8),
                       torch.tensor(gs), (*lead, rows, k))


@pytest.fixture
def on_gpu(monkeypatch):
    """Pretend CPU tensors live on an sm_100a GPU with 148 SMs."""
    monkeypatch.setattr(D, "device_target", lambda device: "sm_100a")
    monkeypatch.setattr(D, "sm_count", lambda device: 148)


def test_cpu_tensors_rejected():
    with pytest.raises(ValueError, match="CUDA"):
        D.gemm_sm100(operand(256, 256), operand(256, 256))


@pytest.mark.parametrize("name, ok", [("sm_90a", False), ("sm_100a", True), ("sm_103a", True),
                                      ("sm_107a", True)])
def test_device_target(monkeypatch, name, ok):
    monkeypatch.setattr(arch, "device_target", lambda device: arch.target(name))
    if ok:
        assert D.device_target(torch.device("cuda", 0)) == name
    else:
        with pytest.raises(ValueError, match=f"sm_100a, sm_103a, sm_107a.*{name}"):
            D.device_target(torch.device("cuda", 0))


def test_k_must_be_a_multiple_of_kb(on_gpu):
    with pytest.raises(ValueError, match=r"K % 256 == 0.*K=320"):
        D.gemm_sm100(operand(256, 320), operand(256, 320))


def test_n_alignment(on_gpu):
    with pytest.raises(ValueError, match=r"N % 8 == 0.*N=100"):
        D.gemm_sm100(operand(256, 256), operand(100, 256))


@pytest.mark.parametrize(
    "a, b, kwargs, error, match",
    [
        (operand(256, 256), torch.zeros(256, 256), {}, TypeError, "NVFP4Tensor"),
        (operand(256, 256), operand(256, 256), {"out_dtype": torch.float32}, TypeError,
         "bfloat16 or torch.float16"),
        (operand(256, 256), operand(256, 512), {}, ValueError, "one K"),
        (operand(256, 256, (2,)), operand(256, 256), {}, ValueError, "one K"),
        (operand(256, 256, (2,)), operand(256, 256, (3,)), {}, ValueError, "one K"),
        (operand(256, 256), operand(256, 256), {"out": torch.empty(256, 128)}, ValueError,
         "contiguous"),
    ],
)
def test_rejections(on_gpu, a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        D.gemm_sm100(a, b, **kwargs)


def test_non_contiguous_data_rejected(on_gpu):
    a = operand(256, 256)
    a.data = torch.zeros(256, 256, dtype=torch.uint8)[:, ::2]
    with pytest.raises(ValueError, match="a.data must be contiguous"):
        D.gemm_sm100(a, operand(256, 256))


def test_supports_matches_the_checks():
    assert D.supports(300, 136, 512) and D.supports(1, 8, 256, torch.float16)
    assert not D.supports(256, 256, 320) and not D.supports(256, 100, 256)
    assert not D.supports(256, 256, 256, torch.float32)
    # every config select_config returns has the Kb `supports` assumes
    for arch_name in D.TARGETS:
        for m, n in ((128, 128), (16384, 16384)):
            assert heuristics.sm100_config(arch_name, m, n, 1024).Kb == 256


def test_config_for_another_target(on_gpu):

    with pytest.raises(ValueError, match="sm_107a"):
        D.prepare(operand(256, 256), operand(256, 256),
                  config=heuristics.sm100_config("sm_107a", 256, 256, 256))


@pytest.mark.parametrize("lead", [(), (3,)])
def test_arguments_point_at_the_tensors(on_gpu, lead):
    a, b = operand(300, 512, lead), operand(136, 512, lead, gs=2.0)
    launch = D.prepare(a, b, torch.float16)
    ptrs, sizes = launch.args[:7], launch.args[7:11]
    want = [a.data, b.data, a.scales, b.scales, launch.out, a.global_scale, b.global_scale]
    assert [p._pointer for p in ptrs] == [t.data_ptr() for t in want]
    assert [p.dtype.__name__ for p in ptrs] == ["Float4E2M1FN"] * 2 + ["Float8E4M3FN"] * 2 + [
        "Float16"] + ["Float32"] * 2
    assert [int(s) for s in sizes] == [300, 136, 512, lead[0] if lead else 1]
    assert launch.out.shape == (*lead, 300, 136) and launch.out.dtype == torch.float16
    assert launch.config.arch == "sm_100a" and launch.config.out == "float16"
    assert launch.args[11] == 148 // (launch.config.CLUSTER_M * launch.config.CLUSTER_N)
    assert len(launch.runtime_args(None)) == 12 and launch.key == (launch.config, launch.args[11])


def _sm100_gpu():
    if not torch.cuda.is_available():
        return False
    try:
        D.device_target(torch.device("cuda"))
    except ValueError:
        return False
    return True


@pytest.mark.gpu
@pytest.mark.skipif(not _sm100_gpu(), reason="needs an sm_100a / sm_103a / sm_107a GPU")
@pytest.mark.parametrize("m, n, k, lead", [(512, 512, 1024, ()), (300, 264, 512, ()),
                                           (256, 256, 256, (2,))])
def test_gemm_sm100_matches_reference(seed, m, n, k, lead):
    a = quantize(torch.randn(*lead, m, k, device="cuda"))
    b = quantize(torch.randn(*lead, n, k, device="cuda"))
    out = torch.full((*lead, m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = D.gemm_sm100(a, b, out=out)  # poisoned: every element must be written
    # Every element: the block-scaled MMA's products are exact and sum in fp32, then gA gB and
    # one bf16 rounding (tk_cute.testing derives the bound).
    from tk_cute.testing import assert_gemm_close

    if lead:
        for l in range(lead[0]):
            sub = lambda q: NVFP4Tensor.trusted(q.data[l], q.scales[l], q.global_scale,  # noqa
                                                q.shape[1:])
            assert_gemm_close(d[l], sub(a), sub(b), f"batch {l}")
    else:
        assert_gemm_close(d, a, b)
