"""The Blackwell/Rubin torch entry `gemm_sm100`: validation and argument conversion on the CPU
(the device query monkeypatched); the compile through the same path is in
tests/kernels/test_nvfp4_sm100_compile.py; a GPU run (sm_100a+) against the exact reference."""

import dataclasses

import pytest
import torch

from tk_cute import arch
from tk_cute.kernels.gemm import nvfp4_sm100 as K
from tk_cute.layouts.nvfp4_scales import blocked_shape
from tk_cute.nvfp4 import NVFP4Tensor, gemm_reference, quantize
from tk_cute.nvfp4 import dispatch_sm100 as D
from tk_cute.tuning import sm100 as sm100_tuning


def operand(rows, k, lead=(), gs=0.5, fmt="ue4m3"):
    return NVFP4Tensor(torch.zeros(*lead, rows, k // 2, dtype=torch.uint8),
                       torch.zeros(blocked_shape(rows, k, *lead), dtype=torch.uint8),
                       torch.tensor(gs), (*lead, rows, k), fmt)


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


def test_any_k_and_n(on_gpu):
    """K % 16 (the last K stage partly out of bounds) and any N: D rows off 16 bytes are
    written `d_pitch` apart into a padded buffer, then `finish` copies them in place."""
    launch = D.prepare(operand(256, 320), operand(100, 320))
    assert launch.out.shape == (256, 100) and launch.wide.shape == (256, 104)
    assert launch.args[K.SIZES][2] == 320  # k goes to the kernel as it is
    launch.wide.copy_(torch.arange(256 * 104).reshape(256, 104).to(torch.bfloat16))
    assert torch.equal(launch.finish(), launch.wide[:, :100])
    assert D.prepare(operand(256, 320), operand(96, 320)).wide is None  # 192-byte rows
    assert D.prepare(operand(8, 48), operand(3, 48), torch.float32).wide.shape == (8, 4)


@pytest.mark.parametrize(
    "a, b, kwargs, error, match",
    [
        (operand(256, 256), torch.zeros(256, 256), {}, TypeError, "NVFP4Tensor"),
        (operand(256, 256), operand(256, 256), {"out_dtype": torch.int8}, TypeError,
         "torch.bfloat16, torch.float16 or torch.float32"),
        (operand(256, 256), operand(256, 512), {}, ValueError, "one K"),
        (operand(256, 256, (2,)), operand(256, 256), {}, ValueError, "one K"),
        (operand(256, 256, (2,)), operand(256, 256, (3,)), {}, ValueError, "one K"),
        (operand(256, 256), operand(256, 256), {"out": torch.empty(256, 128)}, ValueError,
         r"out has shape \(256, 128\) \(needs \(256, 256\)\), dtype torch.float32"),
    ],
)
def test_rejections(on_gpu, a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        D.gemm_sm100(a, b, **kwargs)


def test_non_contiguous_data_rejected(on_gpu):
    a = operand(256, 256)
    a.data = torch.zeros(256, 256, dtype=torch.uint8)[:, ::2]
    with pytest.raises(ValueError, match="a.data must be laid out as NVFP4Tensor makes it"):
        D.gemm_sm100(a, operand(256, 256))


def test_supports_matches_the_checks():
    assert D.supports(300, 136, 512) and D.supports(1, 8, 256, torch.float16)
    assert D.supports(256, 256, 320) and D.supports(256, 100, 256) and D.supports(1, 1, 16)
    assert D.supports(256, 256, 256, torch.float32) and D.supports(256, 256, 48, "nvfp4")
    assert not D.supports(256, 256, 24) and not D.supports(0, 8, 256)
    assert not D.supports(256, 100, 256, "nvfp4") and not D.supports(8, 8, 256, torch.int8)


def test_config_for_another_target(on_gpu):

    with pytest.raises(ValueError, match="sm_107a"):
        D.prepare(operand(256, 256), operand(256, 256),
                  config=sm100_tuning.w4a4_config("sm_107a", 256, 256, 256))


@pytest.mark.parametrize("lead, swap, split", [((), False, 1), ((3,), False, 1),
                                               ((), True, 1), ((3,), True, 2)])
def test_arguments_point_at_the_tensors(on_gpu, lead, swap, split):
    """Swapped: b's tensors (the weights) are the kernel's A, M and N trade places. Split K:
    the kernel writes fp32 partial D's (L * splits of them) into a buffer of its own."""
    a, b = operand(300, 512, lead), operand(136, 512, lead, gs=2.0)
    cfg = dataclasses.replace(sm100_tuning.w4a4_config("sm_100a", 300, 136, 512, "float16"),
                              swap_ab=swap, SPLIT_K=split, LOAD_PIPE_DEPTH=4)
    launch = D.prepare(a, b, torch.float16, config=cfg)
    ptrs, sizes = launch.args[K.POINTERS], launch.args[K.SIZES]
    d = launch.out if split == 1 else launch.wide
    # a dense D leaves the NVFP4-output pointers (d_sf, d_gs, flag) at D's address, unused
    ops = [a.data, b.data, a.scales, b.scales] if not swap else [b.data, a.data, b.scales,
                                                                  a.scales]
    gs = [a.global_scale, b.global_scale][::-1 if swap else 1]
    want = [*ops, d, *gs] + [d] * 3
    assert [p._pointer for p in ptrs] == [t.data_ptr() for t in want]
    assert [p.dtype.__name__ for p in ptrs] == ["Float4E2M1FN"] * 2 + ["Float8E4M3FN"] * 2 + [
        "Float16" if split == 1 else "Float32"] + ["Float32"] * 2 + ["Uint8", "Float32", "Int32"]
    mn = [136, 300] if swap else [300, 136]
    assert [int(s) for s in sizes] == [*mn, 512, lead[0] if lead else 1, split]
    if split > 1:
        assert launch.wide.shape == ((lead[0] if lead else 1) * split, 300, 136)
        assert launch.wide.dtype == torch.float32
    assert launch.out.shape == (*lead, 300, 136) and launch.out.dtype == torch.float16
    assert launch.config.arch == "sm_100a" and launch.config.out == "float16"
    clusters = launch.args[K.CLUSTERS]
    assert clusters == 148 // (launch.config.CLUSTER_M * launch.config.CLUSTER_N)
    assert set(launch.values) == set(K.signature(launch.config).names)  # what a launch packs
    assert launch.key == (launch.config, clusters)


def test_nvfp4_out_arguments_point_at_the_parts(on_gpu):
    """NVFP4 D: codes, blocked scales, its decode scale and the zeroed saturation flag."""
    a, b = operand(300, 512), operand(144, 512, gs=2.0)
    gs = torch.tensor(0.25)
    launch = D.prepare(a, b, "nvfp4", out_global_scale=gs)
    d = launch.out
    assert isinstance(d, NVFP4Tensor) and d.shape == (300, 144) and d.global_scale is gs
    assert d.data.shape == (300, 72) and d.scales.shape == blocked_shape(300, 144)
    assert d.saturated.dtype == torch.int32 and int(d.saturated) == 0
    ptrs = launch.args[K.POINTERS]
    want = [a.data, b.data, a.scales, b.scales, d.data, a.global_scale, b.global_scale,
            d.scales, gs, d.saturated]
    assert [p._pointer for p in ptrs] == [t.data_ptr() for t in want]
    assert [p.dtype.__name__ for p in ptrs[4:5] + ptrs[7:]] == ["Uint8", "Uint8", "Float32",
                                                                "Int32"]
    assert launch.config.out == "nvfp4"


@pytest.mark.parametrize("n", [136, 100])
def test_nvfp4_out_needs_n_multiple_of_16(on_gpu, n):
    with pytest.raises(ValueError, match=rf"N % (16|8) == 0.*N={n}"):
        D.prepare(operand(256, 256), operand(n, 256), "nvfp4", out_global_scale=torch.tensor(1.))


@pytest.mark.parametrize("name, ok", [("sm_100a", False), ("sm_103a", False), ("sm_107a", True)])
def test_ue5m3_operands_need_rubin(monkeypatch, name, ok):
    monkeypatch.setattr(D, "device_target", lambda device: name)
    monkeypatch.setattr(D, "sm_count", lambda device: 148)
    a, b = operand(256, 256, fmt="ue5m3"), operand(256, 256, fmt="ue5m3")
    if ok:
        assert D.prepare(a, b).config.sf == "ue5m3"
    else:
        with pytest.raises(ValueError, match=rf"UE5M3 .*sm_107a.*{name}"):
            D.prepare(a, b)


def test_mixed_scale_formats_rejected(on_gpu):
    with pytest.raises(ValueError, match="gemm_sm100 needs one scale format.*a has ue4m3, b ue5m3"):
        D.prepare(operand(256, 256), operand(256, 256, fmt="ue5m3"))


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


# --- the dispatch (`tk_cute.nvfp4.gemm`) on a pretended GPU: NVFP4 output and UE5M3 -----------

def _pretend(monkeypatch, name):
    from tk_cute.nvfp4 import launch

    monkeypatch.setattr(arch, "device_target", lambda device: arch.target(name))
    monkeypatch.setattr(launch, "sm_count", lambda device: arch.target(name).sm_count or 148)


def _plan(a, b, out=torch.bfloat16, path=None, nvfp4_out=False):
    from tk_cute.nvfp4 import validate
    from tk_cute.nvfp4.gemm import _plan as plan_call

    op = validate.gemm_operands(a, b, out)
    return plan_call(op, torch.device("cuda", 0), out, False, path, b.scale_format, nvfp4_out)


@pytest.mark.parametrize("name", D.TARGETS)
def test_nvfp4_output_plans_the_fused_sm100_epilogue(monkeypatch, name):
    _pretend(monkeypatch, name)
    p = _plan(operand(4096, 1024), operand(4096, 1024), torch.float32, nvfp4_out=True)
    assert p.path == "sm100" and p.config.out == "nvfp4" and p.config.arch == name
    assert p.config == sm100_tuning.w4a4_config(name, 4096, 4096, 1024, out="nvfp4")
    with pytest.raises(NotImplementedError, match="N % 16"):  # D's scale blocks
        _plan(operand(256, 320), operand(100, 320), torch.float32, nvfp4_out=True)


def test_nvfp4_output_on_hopper_keeps_its_paths(monkeypatch):
    _pretend(monkeypatch, "sm_90a")
    assert _plan(operand(1024, 4096), operand(4096, 4096), torch.float32,
                 nvfp4_out=True).path == "register_a_tiled"


@pytest.mark.parametrize("name, ok", [("sm_100a", False), ("sm_103a", False), ("sm_107a", True)])
def test_ue5m3_plans_on_sm100_targets(monkeypatch, name, ok):
    _pretend(monkeypatch, name)
    a, b = operand(4096, 1024, fmt="ue5m3"), operand(4096, 1024, fmt="ue5m3")
    if ok:
        assert _plan(a, b).config.sf == "ue5m3"
    else:
        with pytest.raises(ValueError, match=f"UE5M3 .*sm_107a.*{name}"):
            _plan(a, b)


@pytest.mark.parametrize("w4a4, m, path", [(False, 1, "small_m"), (True, 4, "small_m"),
                                           (False, 64, "register_a"),
                                           (True, 150, "register_a_tiled"),
                                           (True, 1000, "register_a_tiled")])
def test_ue5m3_hopper_plans_carry_the_format(monkeypatch, w4a4, m, path):
    _pretend(monkeypatch, "sm_90a")
    b = operand(1024, 4096, fmt="ue5m3")
    a = operand(m, 4096, fmt="ue5m3") if w4a4 else torch.zeros(m, 4096, dtype=torch.bfloat16)
    p = _plan(a, b)
    assert p.path == path
    configs = [sub.config for _, _, sub in p.parts] if p.parts else [p.config]
    assert configs and all(c.sf == "ue5m3" for c in configs)


def _exact_operand(rows, k, device="cuda"):
    """Random E2M1 codes, every block scale 1.0 (0x38), global scale 1: every product is a
    multiple of 1/4 below 36 and every partial sum below 36 K = 2^14 * 1.125 (K = 512), so
    fp32 holds every partial sum exactly and any summation order gives the exact D."""
    from tk_cute.nvfp4 import to_blocked

    data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8)
    sf = to_blocked(torch.full((rows, k // 16), 0x38, dtype=torch.uint8))
    return NVFP4Tensor(data, sf, torch.tensor(1.0), (rows, k)).to(device)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm100_gpu(), reason="needs an sm_100a / sm_103a / sm_107a GPU")
@pytest.mark.parametrize("m, n", [(512, 512), (300, 272), (1, 144)])
@pytest.mark.parametrize("g", [1.0, 2.0**-6, 2.0**-12])  # the last one saturates blocks
def test_gemm_sm100_nvfp4_is_the_quantized_exact_product(seed, m, n, g):
    """On operands whose fp32 accumulation is exact, the fused epilogue's bytes equal
    `quantize(exact D, global_scale=g)` bit for bit, padding included (outputs poisoned with
    0xFF first: every byte must be written), and `saturated` says whether a scale hit 448.
    (Not yet run: no sm_100+ GPU so far.)"""
    from tk_cute.nvfp4 import quantize

    k = 512
    a, b = _exact_operand(m, k), _exact_operand(n, k)
    d32 = gemm_reference(a.cpu(), b.cpu(), torch.float32)
    want = quantize(d32, global_scale=g)
    out = quantize(torch.zeros(m, n), global_scale=g).to("cuda")
    out.data.fill_(0xFF)
    out.scales.fill_(0xFF)
    got = D.gemm_sm100_nvfp4(a, b, None, out=out)
    assert got is out and torch.equal(got.data.cpu(), want.data)
    assert torch.equal(got.scales.cpu(), want.scales)  # padding rows / columns are 0 too
    t = torch.div(torch.div(d32.abs().amax(), 6.0), torch.tensor(g))
    assert int(got.saturated) == int(t > 448.0)
    # the public entry takes the same kernel
    pub = __import__("tk_cute.nvfp4", fromlist=["gemm"]).gemm(a, b, "nvfp4", out_global_scale=g)
    assert torch.equal(pub.data, got.data) and torch.equal(pub.scales, got.scales)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm100_gpu(), reason="needs an sm_100a / sm_103a / sm_107a GPU")
def test_gemm_sm100_nvfp4_random_operands(seed):
    """Random operands: the kernel's fp32 D differs from the exact one by at most
    slack = (K + 16) 2^-24 |a||b| per element (`tk_cute.testing`), so only values that close
    to a rounding boundary of the recipe may take the neighbouring code or scale (all but a
    few agree with quantizing the exact fp32 D), and every decoded element is within the
    E2M1 rounding of its block (at most the block's decode scale: the largest half gap is 1;
    3 * 2^-9 * g for subnormal or zero scales, `test_dequantize_error_bound`) plus slack."""
    from tk_cute.nvfp4 import quantize, unpack_fp4
    from tk_cute.nvfp4.format import e4m3_decode

    m, n, k = 1024, 768, 2048
    a, b = quantize(torch.randn(m, k, device="cuda")), quantize(torch.randn(n, k, device="cuda"))
    A, B = a.cpu().dequantize(torch.float64), b.cpu().dequantize(torch.float64)
    d32 = gemm_reference(a.cpu(), b.cpu(), torch.float32)
    g = 1.01 * float(d32.abs().max()) / 2688  # (1.01: no block at the rounding edge of 448)
    out = quantize(torch.zeros(m, n), global_scale=g).to("cuda")  # D's scale g, then poison
    out.data.fill_(0xFF)
    out.scales.fill_(0xFF)
    q = D.gemm_sm100_nvfp4(a, b, None, out=out)
    assert q is out
    got = q.cpu()  # (a copy: `saturated` stays on q)
    want = quantize(d32, global_scale=g)
    assert (unpack_fp4(got.data) == unpack_fp4(want.data)).double().mean() > 0.999
    assert (got.scales_logical() == want.scales_logical()).double().mean() > 0.999
    assert int(q.saturated) == 0
    scale = e4m3_decode(got.scales_logical()).double().repeat_interleave(16, -1) * g
    bound = torch.clamp(scale, min=3 * 2.0**-9 * g) * (1 + 2.0**-20) + (
        (k + 16) * 2.0**-24 * (A.abs() @ B.abs().T))
    assert bool(((got.dequantize(torch.float64) - (A @ B.T)).abs() <= bound).all())


def _rubin_gpu():
    return _sm100_gpu() and D.device_target(torch.device("cuda")) == "sm_107a"


@pytest.mark.gpu
@pytest.mark.skipif(not _rubin_gpu(), reason="needs an sm_107a (Rubin) GPU")
def test_gemm_sm107_ue5m3_matches_reference(seed):
    """UE5M3 operands (quantized on the CPU: the CUDA quantizer writes UE4M3) through the
    public gemm on Rubin, every element within `assert_gemm_close`'s bound; block amaxes span
    2^30 (UE4M3 would flush most of them to zero scales)."""
    from tk_cute import nvfp4
    from tk_cute.testing import assert_gemm_close

    spread = torch.exp2(torch.rand(1, 1024 // 16) * 30 - 15).repeat_interleave(16, -1)
    a = quantize(torch.randn(512, 1024) * spread, scale_dtype="ue5m3").to("cuda")
    b = quantize(torch.randn(256, 1024), scale_dtype="ue5m3").to("cuda")
    assert nvfp4.plan(a, b).config.sf == "ue5m3"
    out = torch.full((512, 256), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    d = nvfp4.gemm(a, b, out=out)
    assert d.data_ptr() == out.data_ptr()
    assert_gemm_close(d, a, b)


def test_first_call_of_a_kernel_on_the_gpu_warns_once(on_gpu, monkeypatch):
    """On a real sm_100a+ GPU the first call of each kernel says it was verified only by
    compiling and in the emulator (the compile and the launch are stand-ins here)."""
    import warnings

    from tk_cute import launcher

    launched = []
    monkeypatch.setattr(D, "_CACHE", launcher.KernelCache())
    monkeypatch.setattr(D, "compile_launch", lambda launch: lambda **v: launched.append(v))
    monkeypatch.setattr(D, "device_index", lambda device: 0)
    monkeypatch.setattr(D, "raw_stream", lambda index: 0)
    a, b = operand(256, 256), operand(128, 256)
    with pytest.warns(D.UnverifiedKernelWarning, match=r"sm_100a NVFP4 GEMM .* first time.*"
                      r"PTX emulator.*never on sm_100a hardware.*filterwarnings"):
        D.gemm_sm100(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        D.gemm_sm100(a, b)  # the same kernel: no second warning
    assert len(launched) == 2


@pytest.mark.parametrize("name", D.TARGETS)
def test_w4a16_plans_the_decoding_kernel(monkeypatch, name):
    """bf16 activations on these GPUs: the weights decoded in the kernel (path
    "sm100_w4a16"); NVFP4 D: its fp32 D, then the quantizer."""
    _pretend(monkeypatch, name)
    x = torch.zeros(16, 256, dtype=torch.bfloat16)
    p = _plan(x, operand(100, 256))
    assert p.path == "sm100_w4a16" and p.config.arch == name and p.config.out == "bfloat16"
    assert p.config == sm100_tuning.w4a16_config(name, 16, 100, 256)
    assert _plan(x, operand(128, 256), torch.float32, nvfp4_out=True).config.out == "float32"


def test_prepare_w4a16(on_gpu):
    x, b = torch.zeros(3, 16, 48, dtype=torch.bfloat16), operand(20, 48, (3,))
    launch = D.prepare_w4a16(x, b)  # bf16 rows of 20: written 24 apart, then copied
    assert launch.w4a16 and launch.out.shape == (3, 16, 20) and launch.wide.shape == (3, 16, 24)
    assert D.prepare_w4a16(x, b, torch.float32).wide is None  # 80-byte rows
    assert launch.key == (launch.config, None) and len(launch.values) == 10
    with pytest.raises(TypeError, match="bfloat16 tensor, got torch.float32"):
        D.prepare_w4a16(x.float(), b)
    with pytest.raises(ValueError, match="one K and L"):
        D.prepare_w4a16(x[..., :32], b)
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :48]
    with pytest.raises(ValueError, match="contiguous and 16-byte aligned"):
        D.prepare_w4a16(strided, b)
    with pytest.raises(ValueError, match="contiguous and 16-byte aligned"):
        D.prepare_w4a16(strided, b, checked=True)  # (gemm validated: the layout still checked)
    out = torch.full((3, 16, 20), float("nan"), dtype=torch.bfloat16)
    assert D.prepare_w4a16(x, b, out=out, checked=True).out is out
