"""The torch launches (`tk_cute.nvfp4.launch`) pass every kernel exactly the arguments its
`signature` declares, by name: checked on the CPU with the compiled launchers replaced by
recorders (a wrong or missing name would only fail on a GPU otherwise)."""

import dataclasses

import pytest
import torch
from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst
from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv

from tk_cute.nvfp4 import launch, quantize, validate
from tk_cute.tuning import sm90 as sm90_tuning


class Recorder:
    """A launcher that records each call's arguments (the bound ones included)."""

    def __init__(self, signature, fixed=None, calls=None):
        self.signature, self.fixed = signature, fixed or {}
        self.calls = [] if calls is None else calls

    def bind(self, **fixed):
        return type(self)(self.signature, {**self.fixed, **fixed}, self.calls)

    def __call__(self, **values):
        values = {**self.fixed, **values}
        self.signature.pack(values)  # raises TypeError unless the names are the signature's
        self.calls.append(values)


@pytest.fixture
def recorded(monkeypatch):
    made = {}

    def cache_for(signature_of):
        def get(key, build):
            cfg = key[0]
            made[key] = Recorder(signature_of(cfg))
            return made[key]
        return get

    monkeypatch.setattr(launch, "device_index", lambda device: 0)
    monkeypatch.setattr(launch, "raw_stream", lambda index: 0)
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    monkeypatch.setattr(launch._SMALL_M, "get", cache_for(gv.signature))
    monkeypatch.setattr(launch._REGISTER_A, "get", cache_for(rs.signature))
    monkeypatch.setattr(launch._REGISTER_A_TILED, "get", cache_for(rst.signature))
    return made


def test_launch_arguments_match_the_signatures(recorded, seed):
    M, N, K = 300, 256, 512
    b = quantize(torch.randn(N, K))
    a = torch.randn(M, K).bfloat16()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    launch.small_m(a[:16], b, out[:16], sm90_tuning.small_m_config(16, N, K))
    launch.register_a(a[:64], b, out[:64], sm90_tuning.register_a_config(64, N, K))
    qa = quantize(a[:32].float())
    w4a4 = dataclasses.replace(sm90_tuning.register_a_config(32, N, K), a_format="nvfp4")
    launch.register_a(qa, b, out[:32], w4a4)
    qm = quantize(a.float())
    launch.register_a_tiled(qm, b, out, rst.Config(Nb=128, a_format="nvfp4"))
    launch.register_a_tiled(a, b, out, rst.Config(Nb=128))
    gs = torch.tensor(0.5)
    q = launch.register_a_tiled_nvfp4(a, b, rst.Config(Nb=128),
                                      validate.nvfp4_out((M, N), a.device, None, gs))
    stream_k = rst.Config(Nb=128, STREAM_K=True)
    launch.register_a_tiled(a, b, out, stream_k)
    calls = [c for r in recorded.values() for c in r.calls]
    assert len(calls) == 7
    # stream-K: 2 x 3 tiles of 4 stages on `schedule.stream_k_grid`'s 24 CTAs (one per unit)
    (sk,) = [c for key, r in recorded.items() if key[0] == stream_k for c in r.calls]
    assert sk["ctas"] == 24 and sk["partials"] != sk["out"] and sk["flags"] != sk["out"]
    tiled = [c for key, r in recorded.items() if isinstance(key[0], rst.Config)
             and not key[0].STREAM_K for c in r.calls]
    assert len(tiled) == 3 and all(c["ctas"] == 132 for c in tiled)  # (ignored there)
    (w4a4_call,) = [c for c in calls if "xsf" in c and "ws" in c]  # (small_m: no ws)
    assert w4a4_call["x"] == qa.data.data_ptr() and w4a4_call["xsf"] == qa.scales.data_ptr()
    assert w4a4_call["gsa"] == qa.global_scale.data_ptr() and w4a4_call["M"] == 32
    (tiled_w4a4,) = [c for c in calls if "xsf" in c and "out_sf" in c]
    assert tiled_w4a4["x"] == qm.data.data_ptr() and tiled_w4a4["gs"] == b.global_scale.data_ptr()
    (tiled_nvfp4,) = [c for c in calls if c.get("out") == q.data.data_ptr()]
    assert tiled_nvfp4["out_sf"] == q.scales.data_ptr() and tiled_nvfp4["out_gs"] == (
        gs.data_ptr()) and (
        tiled_nvfp4["flag"] == q.saturated.data_ptr())
    assert all(c["M"] in (16, 32, 64, M) and c["N"] == N and c["K"] == K for c in calls)


def test_quantize_a_launch_passes_the_bf16_rows(recorded, seed):
    """The in-kernel-quantize small-M plan (`sm90_tuning.quantize_in_gemm`) launches on the bf16
    activations themselves (no NVFP4 operand: xsf and gsa are the weights', unread)."""
    N, K = 256, 512
    b = quantize(torch.randn(N, K))
    x = torch.randn(1, K).bfloat16()
    out = torch.empty(1, N, dtype=torch.bfloat16)
    launch.small_m(x, b, out, sm90_tuning.quantize_in_gemm(1, N, K))
    ((key, r),) = recorded.items()
    (c,) = r.calls
    assert key[0].QUANTIZE_A and c["x"] == x.data_ptr() and c["out"] == out.data_ptr()
    assert c["xsf"] == c["wsf"] and c["gsa"] == c["gsb"] == b.global_scale.data_ptr()


def test_quantize_plans_are_bounded(monkeypatch):
    """One quantize plan per distinct shape is kept, at most QUANTIZE_PLAN_ENTRIES of them
    (the oldest dropped); a kept shape is a hit. The plans are recorded here (no GPU)."""
    import gc
    import weakref

    live = weakref.WeakSet()

    class Plan:
        def __init__(self, x, given, check, config):
            self.shape = x.shape
            live.add(self)

    monkeypatch.setattr(launch, "_QuantizePlan", Plan)
    monkeypatch.setattr(launch, "_PLANS", {})
    bound = launch.QUANTIZE_PLAN_ENTRIES
    shapes = [(1 + i % 7, 16 * (1 + i)) for i in range(bound + 100)]
    for shape in shapes:
        plan = launch._quantize_plan(torch.empty(shape, device="meta"), False, True, None)
        assert plan.shape == shape
    gc.collect()
    assert len(live) == bound
    last = torch.empty(shapes[-1], device="meta")
    assert launch._quantize_plan(last, False, True, None) is plan
    launch._quantize_plan(torch.empty(shapes[0], device="meta"), False, True, None)  # dropped
    gc.collect()
    assert len(live) == bound and plan in live


@pytest.fixture
def quantize_recorded(monkeypatch):
    """`launch.quantize` on CPU tensors with recorded launches on a stand-in sm_90a GPU of 132
    SMs: (the launches' arguments, the compile keys, {"clusters": the resident clusters})."""
    from tk_cute.kernels import nvfp4_quantize as nq

    import tk_cute.arch

    signatures = {"one_launch": nq.one_launch_signature, "amax": nq.amax_signature,
                  "quantize": nq.quantize_signature}
    calls, keys, resident = [], [], {"clusters": 30}
    monkeypatch.setattr(launch, "device_index", lambda device: 0)
    monkeypatch.setattr(launch, "raw_stream", lambda index: 0)
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    monkeypatch.setattr(launch, "resident_clusters", lambda device, size: resident["clusters"])
    monkeypatch.setattr(tk_cute.arch, "device_target",
                        lambda device: tk_cute.arch.TARGETS["sm_90a"])
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch._QUANTIZE, "get", lambda key, build: keys.append(key) or Named(
        signatures[key[0]](key[1]), {"kernel": key[0]}, calls))
    return calls, keys, resident


def test_quantize_launches_one_or_two_kernels(quantize_recorded, monkeypatch):
    """The plan (`tuning.quantize`): a small input with the computed scale is ONE launch whose
    gs_out is the result's global scale; a large one the amax then the quantize launch over
    one workspace; a given scale the quantize launch alone; the default two-launch Config where
    the GPU cannot hold the cluster. Names checked by the signatures."""
    from tk_cute.kernels import nvfp4_quantize as nq

    from tk_cute.tuning import quantize as quantize_tuning

    calls, keys, resident = quantize_recorded
    small = torch.randn(16, 8192).bfloat16()  # 256 KiB
    q = launch.quantize(small, check_finite=False)
    (c,) = calls
    assert c["kernel"] == "one_launch" and (c["M"], c["K"], c["L"]) == (16, 8192, 1)
    assert c["gs_out"] == q.global_scale.data_ptr() and q.global_scale.dim() == 0
    assert c["data"] == q.data.data_ptr() and c["scales"] == q.scales.data_ptr()
    assert c["ctas"] == quantize_tuning.one_launch_ctas(nq.Config(**quantize_tuning.ONE_LAUNCH),
                                                        16 * 32, small.numel() * 2)
    calls.clear()
    big = torch.randn(2, 64, 4096 + 16).bfloat16()  # over ONE_LAUNCH_MAX_BYTES
    q = launch.quantize(big, check_finite=False)
    amax, quant = calls
    assert (amax["kernel"], quant["kernel"]) == ("amax", "quantize")
    assert amax["partials"] == quant["partials"] == quant["gs_out"] + 16
    assert quant["n_partials"] == amax["grid"] and quant["L"] == 2
    assert quant["gs_out"] == q.global_scale.data_ptr()
    calls.clear()
    gs = torch.tensor(0.25)
    launch.quantize(small, gs, check_finite=False)
    (quant,) = calls
    assert quant["kernel"] == "quantize" and quant["gs_in"] == gs.data_ptr()
    calls.clear()
    resident["clusters"] = 0  # a GPU that cannot hold the cluster: the two launches
    monkeypatch.setattr(launch, "_PLANS", {})
    launch.quantize(small, check_finite=False)
    assert [c["kernel"] for c in calls] == ["amax", "quantize"]
    plan = launch._quantize_plan(small, False, False, None)
    assert plan.cfg == dataclasses.replace(quantize_tuning.pass_config(small.shape, 2, 132),
                                           arch="sm_90a")
    # the amax kernel compiled once whatever the quantize pass's CTAs: its fields only
    assert plan.cfg.row_split > 1 and keys[-2] == ("amax", plan.cfg.amax_part)
    assert keys[-2][1] == dataclasses.replace(nq.Config(), arch="sm_90a").amax_part


def test_quantize_checks_each_kind_of_input_once(quantize_recorded, seed):
    """`check_input` (what `tk_cute.nvfp4.quantize` validates a CUDA tensor with) runs at the
    first call of an input's dtype, shape, device and layout, before its plan is made, and
    not at the calls after it; another layout of the same shape (sparse) or a nested tensor
    (no shape to key by) is checked, and refused, at every call."""
    from tk_cute.nvfp4.quantize import _check_cuda_input

    calls, _, _ = quantize_recorded
    checked = []

    def check(x):
        checked.append(x.layout)
        _check_cuda_input(x)

    x = torch.randn(16, 256).bfloat16()
    for _ in range(3):
        q = launch.quantize(x, check_finite=False, check_input=check)
    assert checked == [torch.strided] and len(calls) == 3 and q.shape == x.shape
    launch.quantize(x.float(), check_finite=False, check_input=check)  # another dtype
    assert len(checked) == 2
    for bad, match in ((x.to_sparse(), "got layout torch.sparse_coo"),
                       (torch.nested.nested_tensor([x[:4], x[:2]]), "got a nested tensor")):
        for _ in range(2):
            with pytest.raises(TypeError, match=match):
                launch.quantize(bad, check_finite=False, check_input=check)
    assert len(checked) == 6 and len(calls) == 4


class Named(Recorder):
    """A `Recorder` whose calls also carry the kernel's name (fixed as "kernel")."""

    def __call__(self, **values):
        values = {**self.fixed, **values}
        self.signature.pack({k: v for k, v in values.items() if k != "kernel"})
        self.calls.append(values)


@pytest.mark.parametrize("K", [4096, 1040])
def test_quantize_a_carves_one_kept_workspace(K, monkeypatch):
    """`QuantizeA` (W4A4 quantize_a where the GEMM kernel does not quantize): the codes
    (`codes_storage`'s layout: K = 1040 pads each row to 528 bytes), blocked scales and decode
    scale and amax partials lie 16-byte aligned and disjoint in one workspace of its `nbytes`;
    the launches get those addresses; a kept buffer is carved once and reused while it stays
    the same object, a new one carved again, and a per-call buffer (None: a capture, the ops
    off the default stream) used for that call only."""
    import itertools
    import types

    from tk_cute.layouts.nvfp4_scales import blocked_shape

    from tk_cute.nvfp4.tensor import has_row_pitch
    from tk_cute.tuning import quantize as quantize_tuning

    M = 24
    plan = types.SimpleNamespace(M=M, K=K, shape=torch.Size((M, K)), device_index=0,
                                 scales_shape=blocked_shape(M, K), one_launch=False,
                                 ws_words=launch.PARTIALS_WORD + 7, device=torch.device("cpu"))
    planned = []
    monkeypatch.setattr(launch, "_quantize_plan",
                        lambda x, given, check, config: planned.append(config) or plan)
    monkeypatch.setattr(launch, "raw_stream", lambda index: 0)
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    ran, kept = [], []
    monkeypatch.setattr(launch, "_run_quantize", lambda p, x, *ptrs: ran.append(ptrs))
    monkeypatch.setattr(launch, "kept_workspace", lambda name, n, dev, st: kept[-1])
    x = torch.randn(M, K).bfloat16()
    qa = launch.QuantizeA(x)
    assert planned == [quantize_tuning.pass_config((M, K), 2, 132)]  # (two launches)
    words = plan.ws_words
    first = torch.empty(qa.nbytes + 64, dtype=torch.uint8)
    kept.append(first)
    q = qa(x)
    assert q.shape == (M, K) and has_row_pitch(q.data, K) and q.data.shape == (M, K // 2)
    assert q.scales.shape == plan.scales_shape and q.global_scale.shape == ()
    assert q.global_scale.dtype == torch.float32
    base = first.data_ptr()
    spans = sorted((t.data_ptr() - base, t.data_ptr() - base + n) for t, n in (
        (q.data, M * (q.data.stride(0))), (q.scales, q.scales.numel()),
        (q.global_scale, 4 * words)))
    assert spans[0][0] == 0 and spans[-1][1] <= qa.nbytes
    assert all(a[1] <= b[0] and b[0] % 16 == 0 for a, b in itertools.pairwise(spans))
    assert ran == [(q.data.data_ptr(), q.scales.data_ptr(), q.global_scale.data_ptr(), 0)]
    assert qa(x) is q  # the same kept buffer: not carved again
    kept.append(None)  # per call: a buffer of its own, not kept
    once = qa(x)
    assert once is not q and not (base <= once.data.data_ptr() < base + qa.nbytes)
    kept.append(first)
    assert qa(x) is q
    second = torch.empty(qa.nbytes, dtype=torch.uint8)
    kept.append(second)
    moved = qa(x)
    assert moved is not q and moved.data.data_ptr() == second.data_ptr()
