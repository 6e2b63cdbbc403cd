"""Host-side launch machinery (`tk_cute.runtime`) checked without a GPU: the raw-pointer
`Launcher`'s direct call of the DSL executor, and the per-stream workspaces."""

import ctypes

import pytest
import torch

from tk_cute import launcher, runtime
from tk_cute.launcher import Signature, i32, i64, ptr

import cutlass

SIG = Signature(ptr("a", cutlass.Float32), i32("M"), i64("lda"), ptr("out", cutlass.BFloat16))


class FakeExecutor:
    """What the DSL's JitExecutor offers the direct path: a compiled host function taking the
    packed argument array (our slot addresses, then the executor's own extras), its result."""

    EXTRA = 0xABC0

    def __init__(self):
        self.cuda_result = ctypes.c_int32(0)
        self._has_cuda_result = True
        self.calls = []
        self.fail_next = False

    def _get_invoke_packed_args(self, addrs):
        return (ctypes.c_void_p * (len(addrs) + 1))(*[a.value for a in addrs], self.EXTRA)

    def capi_func(self, packed):
        n = len(SIG._slots)
        self.calls.append(([ctypes.string_at(packed[i], ctypes.sizeof(c))
                            for i, c in enumerate(SIG._slots)], packed[n]))
        self.cuda_result.value = 700 if self.fail_next else 0


class FakeCompiled:
    """A compiled function whose first `run_compiled_program` builds its executor (as the
    DSL's does) and runs it."""

    def __init__(self):
        self._default_executor = None
        self.slow_calls = 0

    def run_compiled_program(self, addrs):
        self.slow_calls += 1
        if self._default_executor is None:
            self._default_executor = FakeExecutor()
        ex = self._default_executor
        ex.capi_func(ex._get_invoke_packed_args(addrs))


def _values(seed: int) -> dict:
    return dict(a=4096 * (seed + 1), M=-3 - seed, lda=2**40 + seed, out=2**33 + 16 * seed,
                stream=128 + seed)


def test_launcher_calls_the_executor_directly_with_the_packed_bytes():
    compiled = FakeCompiled()
    launch = launcher.Launcher(compiled, SIG)
    for seed in range(4):
        launch(**_values(seed))
    assert compiled.slow_calls == 1  # only the first call goes through the DSL's wrapper
    calls = compiled._default_executor.calls
    assert len(calls) == 4
    for seed, (seen, extra) in enumerate(calls):
        _, ours = SIG.pack(_values(seed))  # the bytes of each argument, as ctypes packs them
        assert seen == [ctypes.string_at(p, ctypes.sizeof(c)) for p, c in zip(ours, SIG._slots)]
        assert extra == FakeExecutor.EXTRA  # the executor's own arguments follow ours
    with pytest.raises(TypeError, match="launch arguments are"):
        launch(**dict(_values(0), lda_=1))


def test_launcher_raises_the_executors_cuda_error():
    compiled = FakeCompiled()
    launch = launcher.Launcher(compiled, SIG)
    launch(**_values(0))
    compiled._default_executor.fail_next = True
    with pytest.raises(Exception, match="700|ILLEGAL"):
        launch(**_values(1))


def test_launcher_without_an_executor_keeps_run_compiled_program():
    class Plain:
        def __init__(self):
            self.seen = []

        def run_compiled_program(self, addrs):
            self.seen.append([ctypes.string_at(p.value, ctypes.sizeof(c))
                              for p, c in zip(addrs, SIG._slots)])

    plain = Plain()
    launch = launcher.Launcher(plain, SIG)
    for seed in range(3):
        launch(**_values(seed))
    assert len(plain.seen) == 3
    for seed, seen in enumerate(plain.seen):
        _, ours = SIG.pack(_values(seed))
        assert seen == [ctypes.string_at(p, ctypes.sizeof(c)) for p, c in zip(ours, SIG._slots)]


@pytest.fixture
def fake_cuda(monkeypatch):
    """`runtime.workspace` / `zeroed_flags` on a pretend CUDA device: torch.empty and
    torch.zeros make CPU tensors."""
    made = []
    real_empty, real_zeros = torch.empty, torch.zeros

    def empty(n, dtype, device):
        made.append(n)
        return real_empty(n, dtype=dtype)

    def zeros(n, dtype, device):
        made.append(n)
        return real_zeros(n, dtype=dtype)

    monkeypatch.setattr(runtime.torch, "empty", empty)
    monkeypatch.setattr(runtime.torch, "zeros", zeros)
    monkeypatch.setattr(runtime.torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(runtime.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(runtime, "_WORKSPACES", {})
    return made


def test_workspaces_are_reused_per_device_stream_and_name(fake_cuda, monkeypatch):
    dev0, dev1 = torch.device("cuda", 0), torch.device("cuda", 1)
    w = runtime.workspace("planes", 1000, dev0, 7)
    assert w.numel() >= 1000
    assert runtime.workspace("planes", 900, dev0, 7) is w  # fits: handed out again
    assert runtime.workspace("planes", 1000, dev0, 8) is not w  # another stream
    assert runtime.workspace("planes", 1000, dev1, 7) is not w  # another device, same handle
    assert runtime.workspace("permuted", 1000, dev0, 7) is not w  # another buffer of the call
    big = runtime.workspace("planes", 1 << 17, dev0, 7)  # grows: replaces the smaller one
    assert big.numel() >= 1 << 17 and big is not w
    assert runtime.workspace("planes", 1000, dev0, 7) is big
    n = len(fake_cuda)
    huge = runtime.WORKSPACE_CACHE_BYTES + 1  # past the cache: allocated per call
    assert runtime.workspace("planes", huge, dev0, 7) is not runtime.workspace(
        "planes", huge, dev0, 7)
    assert len(fake_cuda) == n + 2
    # inside the custom ops on a stream other than the default one (torch's graph trees warm
    # up on their own stream, the thread's allocations routed to a graph pool) and while
    # capturing (a graph keeps its own memory): per call
    assert runtime.fresh_buffers(runtime.workspace, "planes", 1000, dev0, 7) is not big
    assert runtime.fresh_buffers(runtime.zeroed_flags, "f", 10, dev0, 7) is not \
        runtime.zeroed_flags("f", 10, dev0, 7)
    assert runtime.workspace("planes", 1000, dev0, 7) is big  # (outside again: kept)
    # ... but on the default stream (a compiled graph in default mode) kept, as eager calls
    kept0, flags0 = runtime.workspace("planes", 1000, dev0, 0), runtime.zeroed_flags("f", 10,
                                                                                  dev0, 0)
    assert runtime.fresh_buffers(runtime.workspace, "planes", 1000, dev0, 0) is kept0
    assert runtime.fresh_buffers(runtime.zeroed_flags, "f", 10, dev0, 0) is flags0
    # a device stands for its current stream, looked up only inside the custom ops
    looked = []
    monkeypatch.setattr(runtime, "raw_stream", lambda index: looked.append(index) or 7)
    assert not runtime.per_call_buffers(dev1) and looked == []
    assert runtime.fresh_buffers(runtime.per_call_buffers, dev1) and looked == [1]
    monkeypatch.setattr(runtime, "raw_stream", lambda index: 0)
    assert not runtime.fresh_buffers(runtime.per_call_buffers, dev1)
    monkeypatch.setattr(runtime.torch.cuda, "is_current_stream_capturing", lambda: True)
    assert runtime.per_call_buffers(dev1)
    assert runtime.workspace("planes", 1000, dev0, 7) is not big
    assert runtime.workspace("planes", 1000, dev0, 0) is not kept0


def test_workspace_cache_keeps_a_bounded_number_of_buffers(fake_cuda, monkeypatch):
    monkeypatch.setattr(runtime, "WORKSPACE_CACHE_ENTRIES", 4)
    dev = torch.device("cuda", 0)
    first = runtime.workspace("planes", 100, dev, 0)
    for stream in range(1, 10):  # a new stream per call
        runtime.workspace("planes", 100, dev, stream)
        assert len(runtime._WORKSPACES) <= 4
    assert runtime.workspace("planes", 100, dev, 9) is runtime._WORKSPACES[(0, 9, "planes")]
    assert runtime.workspace("planes", 100, dev, 0) is not first  # dropped, then made again


def test_workspaces_on_cpu_are_fresh():
    cpu = torch.device("cpu")
    a = runtime.workspace("planes", 64, cpu, 0)
    assert a.numel() == 64 and runtime.workspace("planes", 64, cpu, 0) is not a


def test_stream_k_buffers_hold_one_slot_and_one_zero_flag_per_cta(fake_cuda):
    """The grid is `schedule.stream_k_grid`'s (64 tiles of 64 steps on 132 SMs: 128 CTAs, each
    tile in two; 200 tiles: one CTA per SM); a slot of partial sums and a zero flag per CTA,
    kept per (device, stream, name) like the other workspaces."""
    dev = torch.device("cuda", 0)
    ctas, partials, flags = runtime.stream_k_buffers("tiled_stream_k", 64, 64, 4096, 132, dev, 3)
    assert ctas == 128 and partials.numel() >= 128 * 4096 and flags.numel() >= 128
    assert flags.dtype == torch.int32 and not flags.any()
    again = runtime.stream_k_buffers("tiled_stream_k", 200, 64, 4096, 132, dev, 3)
    assert again[0] == 132 and again[2] is flags  # (the kept flags fit: handed out again)
    assert runtime.stream_k_buffers("dense_stream_k", 64, 64, 4096, 132, dev, 3)[2] is not flags


def test_bound_launcher_packs_fixed_and_free_arguments():
    compiled = FakeCompiled()
    base = launcher.Launcher(compiled, SIG)
    v0 = _values(0)
    bound = base.bind(a=v0["a"], lda=v0["lda"])
    for seed in range(3):
        v = _values(seed)
        bound(M=v["M"], out=v["out"], stream=v["stream"])
        _, ours = SIG.pack({**v, "a": v0["a"], "lda": v0["lda"]})
        seen, _ = compiled._default_executor.calls[-1]
        assert seen == [ctypes.string_at(p, ctypes.sizeof(c)) for p, c in zip(ours, SIG._slots)]
    with pytest.raises(TypeError, match="launch arguments are"):
        bound(**v0)  # the bound ones may not be passed again
    with pytest.raises(TypeError, match="not free"):
        bound.bind(a=1)
    with pytest.raises(TypeError, match="bound"):
        launcher.Launcher(compiled, SIG, {"nope": 1})


def test_binding_the_same_values_again_gives_the_same_launcher(monkeypatch):
    compiled = FakeCompiled()
    base = launcher.Launcher(compiled, SIG)
    one = base.bind(a=4096, lda=8)
    assert base.bind(lda=8, a=4096) is one and base.bind(a=8192, lda=8) is not one
    one(M=1, out=16, stream=0)
    one(M=2, out=32, stream=0)
    assert compiled.slow_calls == 1  # (its executor was made once)
    with pytest.raises(ValueError, match=r"outside its slot's range \[-2147483648, 2147483647\]"):
        base.bind(M=2**31)
    assert base.bind(M=-2**31) is not None
    monkeypatch.setattr(launcher, "BOUND_KEPT", 2)
    for a in range(3):
        base.bind(a=16 * a)
    assert len(base._bound) <= 2
