"""Prepared gemm calls (`tk_cute.nvfp4.gemm.prepared`): what a kept call skips, and that it
never skips a check a different argument needs. On CPU tensors the calls run the exact
references; the GPU tests run the same calls through the kernels' bound launches."""

import gc
import importlib

import pytest
import torch

from tk_cute.nvfp4 import NVFP4Tensor, quantize
from tk_cute.nvfp4.gemm import gemm

gemm_mod = importlib.import_module("tk_cute.nvfp4.gemm")  # (the package's `gemm` is the function)
from tk_cute.nvfp4.reference import w4a16_reference


def _calls(b: NVFP4Tensor) -> dict:
    entry = gemm_mod._CALLS.get(id(b.data))
    return {} if entry is None or entry[0]() is not b.data else entry[1]


def test_a_call_is_prepared_once_per_shape(seed, monkeypatch):
    b = quantize(torch.randn(48, 64))
    made = []
    real = gemm_mod.Call.__init__

    def counting(self, *args):
        made.append(args[0].shape)
        real(self, *args)

    monkeypatch.setattr(gemm_mod.Call, "__init__", counting)
    for M in (3, 3, 5, 3, 5):
        a = torch.randn(M, 64).bfloat16()  # fresh activations each call
        d = gemm(a, b)
        assert torch.equal(d, w4a16_reference(a, b, torch.bfloat16))
    assert made == [(3, 64), (5, 64)] and len(_calls(b)) == 2


def test_quantize_a_call_keeps_its_quantized_call(seed, monkeypatch):
    """A quantize_a call that quantizes first (no in-kernel plan: every CPU call) makes the W4A4
    call of its quantized activations once and keeps it: later calls on fresh activations make
    no Call, and each D is bit for bit `gemm(quantize(x, check_finite=False), b)`, written
    into a poisoned `out` where one is given."""
    from tk_cute.nvfp4.reference import gemm_reference

    b = quantize(torch.randn(48, 64))
    made = []
    real = gemm_mod.Call.__init__

    def counting(self, *args):
        made.append(type(args[0]).__name__)
        real(self, *args)

    monkeypatch.setattr(gemm_mod.Call, "__init__", counting)
    for step in range(3):
        x = torch.randn(5, 64).bfloat16()
        out = torch.full((5, 48), float("nan"), dtype=torch.bfloat16) if step else None
        got = gemm(x, b, quantize_a=True, out=out)
        want = gemm_reference(quantize(x, check_finite=False), b, torch.bfloat16)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), step
        assert out is None or got is out
    assert made == ["Tensor", "NVFP4Tensor"]


def test_kept_calls_still_check_what_differs(seed):
    b = quantize(torch.randn(32, 64))
    a = torch.randn(4, 64).bfloat16()
    gemm(a, b)
    with pytest.raises(TypeError, match="bfloat16"):
        gemm(a.float(), b)  # same shape, another dtype: a new key, validated
    with pytest.raises(TypeError, match="pdl must be True or False"):
        gemm(a, b, pdl=1)  # 1 == True as a dict key: checked before the lookup
    with pytest.raises(ValueError, match="shape"):
        gemm(a, b, out=torch.empty(4, 31, dtype=torch.bfloat16))
    out = torch.full((4, 32), float("nan"), dtype=torch.bfloat16)
    assert gemm(a, b, out=out) is out and torch.equal(out, w4a16_reference(a, b, torch.bfloat16))
    with pytest.raises(ValueError, match="K mismatch"):
        gemm(torch.randn(4, 48).bfloat16(), b)


def test_kept_calls_read_the_weights_in_place(seed):
    """A kept call holds the weights' parts, not a copy: in-place writes are seen."""
    b = quantize(torch.randn(32, 64))
    a = torch.randn(2, 64).bfloat16()
    gemm(a, b)
    b.global_scale.mul_(2)
    b.scales.copy_(quantize(torch.randn(32, 64)).scales)
    b.data.copy_(quantize(torch.randn(32, 64)).data)
    fresh = NVFP4Tensor(b.data.clone(), b.scales.clone(), b.global_scale.clone(), b.shape)
    assert torch.equal(gemm(a, b), w4a16_reference(a, fresh, torch.bfloat16))


def test_replaced_parts_and_freed_weights_leave_no_stale_call(seed):
    b = quantize(torch.randn(32, 64))
    a = torch.randn(2, 64).bfloat16()
    gemm(a, b)
    other = quantize(torch.randn(32, 64))
    b.scales, b.global_scale = other.scales, other.global_scale  # same codes, other scales
    assert torch.equal(gemm(a, b), w4a16_reference(a, b, torch.bfloat16))
    key = id(b.data)
    del b, other
    gc.collect()
    assert key not in gemm_mod._CALLS  # the weights went, and their calls with them


def test_parts_in_other_forms_are_not_kept(seed):
    """The custom op's accepted forms (flat scales, a (1,) global scale) run, normalized per
    call as before, and are not kept (their normalized parts are new tensors)."""
    q = quantize(torch.randn(32, 64))
    a = torch.randn(3, 64).bfloat16()
    d = torch.ops.tk_cute.nvfp4_gemm(a, None, None, q.data, q.scales.flatten(),
                                     q.global_scale.reshape(1), torch.bfloat16)
    assert torch.equal(d, w4a16_reference(a, q, torch.bfloat16))
    assert len(_calls(q)) == 0
    torch.ops.tk_cute.nvfp4_gemm(a, None, None, q.data, q.scales, q.global_scale,
                                 torch.bfloat16)
    assert len(_calls(q)) == 1


def test_calls_per_weight_are_bounded(seed, monkeypatch):
    monkeypatch.setattr(gemm_mod, "CALLS_PER_WEIGHT", 3)
    b = quantize(torch.randn(16, 32))
    for M in range(1, 8):
        gemm(torch.randn(M, 32).bfloat16(), b)
    assert [k[0][1][0] for k in _calls(b)] == [5, 6, 7]  # the newest three shapes


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 100])  # small-M, register-A (both bound), register-A
def test_gpu_kept_calls_run_the_kernels_on_fresh_inputs(M, seed):
    """On CUDA a kept call launches with the weights' arguments bound: fresh activations and
    in-place weight updates give D within the arithmetic's bound, on a poisoned `out` too."""
    from tk_cute.testing import assert_gemm_close

    N, K = 384, 1024
    b = quantize(torch.randn(N, K, device="cuda"))
    for w4a4 in (False, True):
        for step in range(3):
            if step == 2:  # in place: the kept call must read the new values
                b.data.copy_(quantize(torch.randn(N, K, device="cuda")).data)
            x = torch.randn(M, K, device="cuda")
            a = quantize(x) if w4a4 else x.bfloat16()
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            assert gemm(a, b, out=out) is out
            assert_gemm_close(out, a, b, f"M={M} w4a4={w4a4} step={step}")
        assert len(_calls(b)) == 1 + w4a4  # one kept call per activation kind


def test_custom_ops_run_with_per_call_buffers(seed, monkeypatch):
    """Inside the custom ops every kept buffer of a launch on a non-default stream is allocated
    per call (`runtime.fresh_buffers`): torch's CUDA graph trees run compiled graphs on their
    own stream with the thread's allocations routed to their pool, where a buffer kept past the
    call would be an untracked pool allocation. (Stream 1: any non-default handle.)"""
    from tk_cute import runtime

    seen = []
    real = gemm_mod.Call.__call__

    def recording(self, a, out=None):
        seen.append(runtime.per_call_buffers(1))
        return real(self, a, out)

    monkeypatch.setattr(gemm_mod.Call, "__call__", recording)
    q = quantize(torch.randn(32, 64))
    a = torch.randn(3, 64).bfloat16()
    torch.ops.tk_cute.nvfp4_gemm(a, None, None, q.data, q.scales, q.global_scale, torch.bfloat16)
    gemm(a, q)
    assert seen == [True, False] and not runtime.per_call_buffers(1)


def test_moved_storage_and_new_scales_make_new_calls(seed):
    """A part whose storage moved under the same tensor object (`.data =`, `set_`) is a new
    key; a call made for new scales of the same codes drops the calls holding the old ones
    (they would keep those scales alive); the least recently used call is dropped first."""
    b = quantize(torch.randn(32, 64))
    a = torch.randn(2, 64).bfloat16()
    gemm(a, b)
    (old,) = _calls(b).values()
    fresh = quantize(torch.randn(32, 64))
    b.scales.data = fresh.scales.clone()  # same object, new storage and values
    b.global_scale.data = fresh.global_scale.clone()
    assert torch.equal(gemm(a, b), w4a16_reference(a, b, torch.bfloat16))
    assert old not in _calls(b).values() and len(_calls(b)) == 1
    b.scales = fresh.scales  # another scales tensor: the old calls go
    gemm(a, b)
    assert [c.scales for c in _calls(b).values()] == [fresh.scales]


def test_kept_calls_are_least_recently_used_first(seed, monkeypatch):
    monkeypatch.setattr(gemm_mod, "CALLS_PER_WEIGHT", 2)
    b = quantize(torch.randn(16, 32))
    x = {M: torch.randn(M, 32).bfloat16() for M in (1, 2, 3)}
    gemm(x[1], b)
    gemm(x[2], b)
    gemm(x[1], b)  # M = 1 used again: M = 2 is the least recently used
    gemm(x[3], b)
    assert sorted(k[0][1][0] for k in _calls(b)) == [1, 3]


def test_unhashable_arguments_still_get_the_validators_message(seed):
    b = quantize(torch.randn(16, 32))
    a = torch.randn(2, 32).bfloat16()
    gemm(a, b)
    with pytest.raises(TypeError, match="out_dtype must be"):
        gemm(a, b, [1])


def test_quantize_a_is_quantize_then_gemm(seed):
    """`gemm(x, b, quantize_a=True)` = `gemm(quantize(x, check_finite=False), b)` bit for bit
    on fresh operands, for every activation dtype the quantizer takes, 2-D and (..., K) (rows
    flattened, as W4A16's), bf16
    and fp32 D, into `out`; a kept call per shape like any other; the flag must be a bool."""
    b = quantize(torch.randn(40, 96))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.randn(3, 96).to(dtype)
        want = gemm(quantize(x, check_finite=False), b)
        assert torch.equal(gemm(x, b, quantize_a=True), want), dtype
    x = torch.randn(5, 96).bfloat16()
    want = gemm(quantize(x, check_finite=False), b, torch.float32)
    out = torch.full((5, 40), float("nan"))
    assert gemm(x, b, quantize_a=True, out=out) is out and torch.equal(out, want)
    assert any(key[-1] is True for key in _calls(b))  # (the 2-D bf16 call is a prepared one)
    for x3 in (torch.randn(2, 4, 96).bfloat16(), torch.randn(3, 1, 2, 96)):  # rows flattened
        want = gemm(quantize(x3.reshape(-1, 96), check_finite=False), b)
        assert torch.equal(gemm(x3, b, quantize_a=True), want.reshape(*x3.shape[:-1], 40))
    with pytest.raises(ValueError, match="K mismatch"):
        gemm(torch.randn(2, 4, 80), b, quantize_a=True)
    with pytest.raises(TypeError, match="quantize_a"):
        gemm(x, b, quantize_a=1)
    with pytest.raises(TypeError, match="out_global_scale"):
        gemm(x, b, quantize_a=True, out_global_scale=torch.tensor(1.0))
    from tk_cute.nvfp4 import ops

    for bad in (x3, x.half()):  # the op's real and fake kernels refuse alike
        with pytest.raises(ValueError, match="quantize_a takes bfloat16"):
            ops.nvfp4_gemm(bad, None, None, b.data, b.scales, b.global_scale, torch.bfloat16,
                           False, True)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(1, 4096, 4096), (1, 2880, 2880), (4, 8192, 2048),
                                     (8, 1024, 1024), (16, 4096, 4096), (1, 4000, 8192)])
def test_gpu_quantize_a_is_quantize_then_gemm(M, N, K, seed):
    """On the GPU: one launch where the plan quantizes in the kernel (W4A4 on the small-M kernel,
    rows fitting staged), the two launches elsewhere; D bit for bit the two calls'; the `Linear` W4A4 forward on bf16 input
    gives the same."""
    from tk_cute.nvfp4 import Linear
    from tk_cute.testing import random_weights

    b = random_weights(N, K)
    x = torch.randn(M, K, device="cuda").bfloat16()
    want = gemm(quantize(x, check_finite=False), b)
    got = gemm(x, b, quantize_a=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    (call,) = [c for k, c in _calls(b).items() if k[-1] is True]
    fused = call.plan is not None
    assert fused == (M <= 8)  # (16 rows: the register-A kernel's W4A4, quantized first)
    lin = Linear.from_nvfp4(b, activations="nvfp4")
    assert torch.equal(lin(x).view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_gpu_quantize_a_workspace_serves_every_call(seed):
    """Where the GEMM kernel does not quantize (`launch.QuantizeA`: the quantizer's launches
    into one kept workspace per stream, the carved NVFP4Tensor reused): every call on fresh
    inputs, D poisoned first, is bit for bit `gemm(quantize(x, check_finite=False), b)`,
    with calls of other shapes between them growing and sharing the workspace. Shapes: the
    two-launch quantizer (16 x 28672 bf16 inputs), code rows padded (K = 1040), the register-A
    kernel writing D directly, the tiled kernel (300 rows)."""
    from tk_cute.nvfp4 import launch
    from tk_cute.testing import random_weights

    shapes = [(16, 8192, 28672), (16, 1024, 1040), (16, 4096, 1040), (300, 4096, 4096)]
    weights = {s: random_weights(s[1], s[2]) for s in shapes}
    for step in range(3):
        for M, N, K in shapes[step % 2:] + shapes[:step % 2]:
            b = weights[M, N, K]
            x = torch.randn(M, K, device="cuda").bfloat16()
            want = gemm(quantize(x, check_finite=False), b)
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            got = gemm(x, b, quantize_a=True, out=out)
            assert got is out
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (M, N, K, step)
            (call,) = [c for k, c in _calls(b).items() if k[-1] is True]
            assert isinstance(call._quantize, launch.QuantizeA), (M, N, K)


def test_quantize_a_call_runs_the_planned_kernel(seed, monkeypatch):
    """The prepared call of `gemm(x, b, quantize_a=True)` where the plan quantizes in the kernel
    binds the small-M launch to the weights and gives it the bf16 rows and a fresh D: run here
    with the emulator standing in for the GPU (the plan forced, as on a Hopper device)."""
    from tk_cute.emulator import hopper
    from tk_cute.testing import assert_gemm_close
    from tk_cute.tuning import sm90 as sm90_tuning

    N, K = 64, 512
    cfg = sm90_tuning.complete("small_m", sm90_tuning.quantize_in_gemm(1, N, K), N, K, True,
                               "bfloat16", "ue4m3", False)
    ran = []

    class Emulated:  # stands in for `launch.SmallM`: the kernel in the emulator
        def __init__(self, b, c, M):
            self.b, self.cfg, self.wsf = b, c, b.scales

        def __call__(self, a, out):
            ran.append((a.dtype, tuple(a.shape), self.cfg))
            hopper.small_m(a, self.b, self.cfg, out)
            return out

    monkeypatch.setattr(gemm_mod, "_quantize_in_gemm", lambda *args: cfg)
    monkeypatch.setitem(gemm_mod.BOUND, "small_m", Emulated)
    b = quantize(torch.randn(N, K))
    x = torch.randn(1, K).bfloat16()
    got = gemm(x, b, quantize_a=True)
    assert ran == [(torch.bfloat16, (1, K), cfg)]
    assert_gemm_close(got, quantize(x, check_finite=False), b)


def test_empty_batches_give_empty_d_without_a_kernel(seed):
    """Activations without rows give an empty D of the asked dtype (or `out`), as
    torch.matmul does, after the same checks as a call with rows."""
    b = quantize(torch.randn(40, 96))
    for shape in [(0, 96), (2, 0, 96)]:
        for kw in ({}, {"quantize_a": True}):
            d = gemm(torch.empty(shape, dtype=torch.bfloat16), b, torch.float32, **kw)
            assert d.shape == (*shape[:-1], 40) and d.dtype == torch.float32
    out = torch.empty(0, 40, dtype=torch.float16)
    assert gemm(torch.empty(0, 96, dtype=torch.bfloat16), b, out=out) is out
    with pytest.raises(ValueError, match="K mismatch"):
        gemm(torch.empty(0, 80, dtype=torch.bfloat16), b)
    with pytest.raises(TypeError, match="bfloat16"):
        gemm(torch.empty(0, 96), b)
    with pytest.raises(ValueError, match="NVFP4 output needs at least one row"):
        gemm(torch.empty(0, 96, dtype=torch.bfloat16), b, "nvfp4", out_global_scale=1.0)
