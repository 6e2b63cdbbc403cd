"""NVFP4 quantizer: CPU compile checks for every target, GPU byte-for-byte checks vs the reference.

CPU tier: builds the amax and quantize kernels from fake tensors for sm_90a/100a/103a/107a and
asserts the instructions (native ``cvt ... e2m1x2`` on sm_100a+ only, IEEE ``div.rn``, no
approximate division), and no spills.
GPU tier (marker gpu): `launch.quantize` equals `quantize_reference` byte for byte (data, scales
including padding, global scale) on many shapes and adversarial values.
"""

import dataclasses
import random

import pytest
import torch

import cutlass

from tk_cute.compile import build
from tk_cute.kernels import nvfp4_quantize as nq
from tk_cute.nvfp4 import launch, unpack_fp4
from tk_cute.nvfp4.tensor import has_row_pitch
from tk_cute.ops import nvfp4 as fp4
from tk_cute.tuning import quantize as quantize_tuning

ARCHS = ("sm_90a", "sm_100a", "sm_103a", "sm_107a")
ELEM = {"bf16": cutlass.BFloat16, "f16": cutlass.Float16, "f32": cutlass.Float32}


def _quantize_args(cfg):
    return nq.quantize_signature(cfg).compile_args(cfg)


def _build_quantize(arch, dtype="bf16", given=False, **kw):
    cfg = nq.Config(dtype=dtype, arch=arch, given_scale=given, **kw)
    return build(nq._quantize, *_quantize_args(cfg), arch=arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_kernel_instructions(arch):
    cfg = nq.Config(arch=arch)
    rows = cfg.rows_per_warp  # one 8-element half block per row
    b = _build_quantize(arch)
    native = b.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2\.f32")
    if arch == "sm_90a":
        assert native == 0
        assert b.ptx_count(r"add\.rn\.f32") > 0  # the magic-add E2M1 rounding
    else:
        assert native == 4 * rows  # 4 pairs per lane-row
    assert b.ptx_count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == rows
    assert b.ptx_count(r"div\.rn\.f32") == 2 * rows + 2  # 2 per block + the global scales
    assert b.ptx_count(r"max\.NaN\.f32") == 1  # NaN/Inf amax -> non-finite global scale
    # The recipe's floors (their bit patterns appear as mov.b32 immediates) and its one select,
    # s_enc = 0 where sf == 0, per block row: a selp, no arithmetic (the div count is unchanged).
    assert b.ptx_count(rf"\b{fp4.F32_AMAX_FLOOR}\b") == 1
    assert b.ptx_count(rf"\b{fp4.F32_MIN_NORMAL}\b") >= 1
    assert b.ptx_count(r"selp\.f32") == rows
    assert b.ptx_count(r"div\.(approx|full)") == 0
    assert b.ptx_count(r"\bfma\.") == 0  # the recipe forbids contraction
    assert b.ptx_count(r"\b(atom|red)\.global") == 0  # no flag without check_finite + given scale
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0, b.kernel
    assert b.kernel.registers <= 65536 // (cfg.threads * cfg.min_ctas_per_sm)
    assert b.sass_count(r"LDG\.E\.EF\.128") == rows  # one 16-byte load per lane-row
    assert b.sass_count(r"STG\.E\.64") == 0  # 4-byte data stores, coalesced per warp


@pytest.mark.parametrize("split", sorted(quantize_tuning.SPLITS))
@pytest.mark.parametrize("given", (False, True))
@pytest.mark.parametrize("dtype", ("bf16", "f32"))
def test_row_split_kernels_keep_their_registers(split, given, dtype):
    """Each planned row split (`tuning.quantize.SPLITS`) compiles for sm_90a without spills,
    within the registers its occupancy asks for, one 16-byte load per lane-row."""
    kw = quantize_tuning.SPLITS[split]
    b = _build_quantize("sm_90a", dtype, given=given, **kw)
    cfg = nq.Config(**kw)
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0, b.kernel
    assert b.kernel.registers <= 65536 // (cfg.threads * cfg.min_ctas_per_sm)
    assert b.sass_count(r"LDG\.E\.EF\.128") == cfg.rows_per_warp


@pytest.mark.parametrize("arch", ("sm_90a", "sm_100a"))
@pytest.mark.parametrize("dtype", ("f16", "f32"))
def test_quantize_kernel_dtypes_compile(arch, dtype):
    b = _build_quantize(arch, dtype)
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0
    assert (b.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2") > 0) == (arch != "sm_90a")


@pytest.mark.parametrize("arch", ("sm_90a", "sm_107a"))
@pytest.mark.parametrize("check", (False, True))
def test_given_scale_skips_amax_word(arch, check):
    rows = nq.ATOM_ROWS // nq.Config().warps
    b = _build_quantize(arch, given=True, check_finite=check)
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0
    assert b.ptx_count(r"div\.rn\.f32") == 2 * rows + 1  # only 1/s_dec_g globally
    assert b.ptx_count(rf"\b{fp4.F32_AMAX_FLOOR}\b") == 0  # no amax: no amax floor
    assert (b.ptx_count(r"atom\.global\.or|red\.global\.or") > 0) == check
    assert b.ptx_count(r"griddepcontrol") == 0  # (no amax pass before it: no PDL)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ("bf16", "f32"))
def test_amax_kernel_compiles(arch, dtype):
    cfg = nq.Config(dtype=dtype, arch=arch)
    b = build(nq._amax, *nq.amax_signature(cfg).compile_args(cfg), arch=arch)
    assert b.kernel.local_bytes == 0
    loads = b.sass_count(r"LDG\.E\.EF\.128")  # ptxas may unroll the grid-stride loop further
    assert loads >= cfg.amax_unroll and loads % cfg.amax_unroll == 0
    assert b.sass_count(r"REDUX") >= 2  # warp max, then the CTA's warps
    assert b.ptx_count(r"\b(atom|red)\.global") == 0  # a plain store per CTA: no zeroing
    # PDL: the amax pass lets the quantize pass start, which waits before reading partials
    assert b.ptx_count(r"griddepcontrol\.launch_dependents") == 1
    q = _build_quantize(arch, dtype)
    assert q.ptx_count(r"griddepcontrol\.wait") == 1
    assert q.ptx_count(r"griddepcontrol\.launch_dependents") == 0
    (early,) = q.reads_before_pdl_wait().values()  # only x's rows (16-byte evict-first loads)
    assert early and set(early) == {"LDG.E.EF.128"}, early


def test_fast_argument_packing_matches_dsl():
    """The launch path packs ctypes slots itself (`launcher.Signature`); they must hold the DSL's
    own bytes for every argument, and a mismatch must be caught."""
    cfg = nq.Config(arch="sm_90a")
    q = nq.compile_quantize(cfg, options="--gpu-arch sm_90a")  # checks its packing
    values = q.signature.sample_values()
    q.check_against_dsl(values)
    a = nq.compile_amax(cfg, options="--gpu-arch sm_90a")
    v = dict(x=16, partials=32, n_vec=2**40 + 5, grid=132, stream=48)
    a.check_against_dsl(v)

    class Shifted(type(a.signature)):  # our slots hold another grid than the DSL's
        def pack(self, values):
            return super().pack({**values, "grid": values["grid"] + 1})

    wrong = type(a)(a.compiled, Shifted(*a.signature.args))
    with pytest.raises(RuntimeError, match="differs"):
        wrong.check_against_dsl(v)

    # The call path refills per-thread slots: the bytes it hands the DSL are pack()'s, call
    # after call, and wrong names still raise.
    import ctypes

    class Capture:
        def run_compiled_program(self, addrs):
            self.seen = [ctypes.string_at(p.value, ctypes.sizeof(c))
                         for p, c in zip(addrs, a.signature._slots)]

    cap = Capture()
    call = type(a)(cap, a.signature)
    for values in (v, dict(v, x=4096, grid=7, stream=0)):
        call(**values)
        _, ours = a.signature.pack(values)
        assert cap.seen == [ctypes.string_at(p, ctypes.sizeof(c))
                            for p, c in zip(ours, a.signature._slots)]
    with pytest.raises(TypeError, match="launch arguments are"):
        call(**dict(v, grid_size=1))


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="dtype"):
        nq.Config(dtype="f8")
    with pytest.raises(ValueError, match="rows_in_flight"):
        nq.Config(warps=8, rows_in_flight=3)
    with pytest.raises(ValueError, match="amax_threads"):
        nq.Config(amax_threads=100)


# ---------------------------------------------------------------- one launch (CPU: emulator)

ONE = nq.Config(**quantize_tuning.ONE_LAUNCH)


@pytest.mark.parametrize("arch", ("sm_90a", "sm_107a"))
def test_one_launch_kernel_instructions(arch):
    """One cluster, no workspace: the warps' maxima cross the cluster through distributed
    shared memory behind cluster barriers; nothing global is atomic."""
    cfg = dataclasses.replace(ONE, arch=arch)
    b = build(nq._quantize_one_launch, *nq.one_launch_signature(cfg).compile_args(cfg),
              arch=arch)
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0, b.kernel
    assert b.kernel.registers <= 65536 // cfg.threads  # one 1024-thread CTA per SM
    assert b.ptx_count(r"mapa\.shared::cluster") >= 1
    assert b.ptx_count(r"ld\.shared::cluster") == b.ptx_count(r"mapa\.shared::cluster")
    assert b.ptx_count(r"barrier\.cluster\.arrive") == 2  # maxima written; remote reads done
    assert b.ptx_count(r"barrier\.cluster\.wait") == 2
    assert b.ptx_count(r"\b(atom|red)\.global") == 0
    assert b.ptx_count(r"max\.NaN\.f32") == 1
    assert b.ptx_count(r"div\.(approx|full)") == 0 and b.ptx_count(r"\bfma\.") == 0
    assert b.ptx_count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == b.ptx_count(r"selp\.f32")


def _emulated(x, ctas, **options):
    from tk_cute.emulator import hopper

    cfg = dataclasses.replace(ONE, dtype=launch.QUANTIZE_DTYPES[x.dtype])
    q, machines = hopper.quantize(x, cfg, ctas, **options)
    return q, [h for m in machines for h in m.hazards]


def _same_bytes(got, ref):
    """Codes (padding included), blocked scales (padding included) and the decode scale's
    bits."""
    assert torch.equal(got.data_padded, ref.data_padded)
    assert torch.equal(got.scales, ref.scales)
    assert got.global_scale.view(torch.int32).item() == ref.global_scale.view(torch.int32).item()


def _hard(shape, dtype, gen):
    """Random values over a wide range with zero blocks, -0.0 and a zero row."""
    lim = {torch.bfloat16: 60, torch.float16: 10, torch.float32: 60}[dtype]
    x = torch.randn(shape, generator=gen)
    x = x * torch.exp2(torch.randint(-lim, lim, shape, generator=gen).float())
    x[..., 0, :] = 0
    x[..., :16] = 0
    x[..., 1::3, 16::5] = -0.0
    if dtype != torch.float32:
        x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)
    return x.to(dtype)


# (shape, CTAs): one row; K % 32 != 0 (padded code rows); padding scale columns; more rows
# than a scale atom; L batches; segments beyond one batch of the cluster's warps
ONE_LAUNCH_CASES = [((1, 256), 1), ((7, 48), 1), ((3, 1040), 2), ((130, 80), 2),
                    ((2, 3, 96), 3), ((2, 129, 16), 4), ((70, 528), 1)]


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
@pytest.mark.parametrize("shape,ctas", ONE_LAUNCH_CASES)
def test_one_launch_matches_reference(shape, ctas, dtype, seed):
    from tk_cute.nvfp4 import quantize_reference

    gen = torch.Generator().manual_seed(seed)
    x = _hard(shape, dtype, gen)
    got, hazards = _emulated(x, ctas)
    assert hazards == []
    _same_bytes(got, quantize_reference(x))


def test_one_launch_adversarial_schedule_and_edge_values(seed):
    """Random warp order and yields (a CTA racing past the cluster barrier would read a peer's
    maximum unwritten); an all-zero tensor (amax under the floor); NaN gives a non-finite
    decode scale (the host's finite check)."""
    from tk_cute.nvfp4 import quantize_reference

    x = torch.randn(40, 272, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    got, hazards = _emulated(x, 8, adversarial=True, seed=seed)
    assert hazards == []
    _same_bytes(got, quantize_reference(x))
    zeros = torch.zeros(3, 64, dtype=torch.bfloat16)
    _same_bytes(_emulated(zeros, 2)[0], quantize_reference(zeros))
    x[17, 100] = float("nan")
    assert not torch.isfinite(_emulated(x, 3)[0].global_scale)


def test_quantize_tuning_plans():
    """One launch only with the computed scale and up to the byte bound; its cluster has
    1..MAX_CLUSTER CTAs, enough warps for the segments up to that bound."""
    K = quantize_tuning.ONE_LAUNCH_MAX_BYTES // 2  # bf16: the bound's bytes in one row
    assert quantize_tuning.config((1, K), 2, False, 132).one_launch
    assert not quantize_tuning.config((1, K), 2, True, 132).one_launch
    assert not quantize_tuning.config((1, K + 16), 2, False, 132).one_launch
    for M, K in ((1, 16), (1, 256), (16, 8192), (128, 2048), (1, 262144), (4096, 16)):
        segments = M * -(-K // ONE.cols)
        ctas = quantize_tuning.one_launch_ctas(ONE, segments, 2 * M * K)
        assert 1 <= ctas <= nq.MAX_CLUSTER
        assert ctas == nq.MAX_CLUSTER or ctas * ONE.warps * ONE.rows_in_flight >= segments
    with pytest.raises(ValueError, match="one_launch"):
        nq.Config(one_launch=True, given_scale=True)


def test_pass_config_splits_only_few_tiles(seed):
    """The quantize pass's rows split over more CTAs only where its tiles are fewer than
    SPLIT_BELOW x the SMs, never past SPLIT_CTAS_PER_SM x the SMs, each CTA a valid Config
    covering its share of the 128 rows."""
    r = random.Random(seed)
    for _ in range(300):
        L, K = r.choice([1, 1, 2, 3]), 16 * r.randint(1, 2048)
        M = r.choice([1, 16, 64, 100, 128, 129, 1024, r.randint(1, 5000)])
        esize, sms = r.choice([2, 4]), r.choice([16, 78, 132, 148])
        cfg = quantize_tuning.pass_config((L, M, K), esize, sms)
        cols = nq.Config(dtype={2: "bf16", 4: "f32"}[esize]).cols  # elements per row segment
        tiles = -(-M // nq.ATOM_ROWS) * -(-K // cols) * L  # the unsplit pass's CTAs
        assert not cfg.one_launch
        cap = quantize_tuning.SPLIT_CTAS_PER_SM * sms
        if tiles >= quantize_tuning.SPLIT_BELOW * sms:
            assert cfg.row_split == 1
        else:  # the largest split that fits
            assert cfg.row_split > 1 and tiles * cfg.row_split <= cap
            assert not [s for s in quantize_tuning.SPLITS if s > cfg.row_split and tiles * s <= cap]
    assert quantize_tuning.config((64, 2880), 2, True, 132).row_split == 16  # 12 tiles


@pytest.mark.parametrize("split", sorted(quantize_tuning.SPLITS))
@pytest.mark.parametrize("shape", [(7, 272), (130, 48), (2, 37, 32)])
def test_row_split_matches_reference(split, shape, seed):
    """Each split of `tuning.quantize.SPLITS`, emulated (amax + quantize, outputs poisoned):
    the reference's bytes, padding rows' scale bytes included."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize_reference

    x = _hard(shape, torch.bfloat16, torch.Generator().manual_seed(seed))
    q, machines = hopper.quantize(x, nq.Config(**quantize_tuning.SPLITS[split]), 2)
    assert [h for m in machines for h in m.hazards] == []
    _same_bytes(q, quantize_reference(x))


# ---------------------------------------------------------------- GPU tier


def _check(x, global_scale=None, config=None):
    from tk_cute.nvfp4 import quantize_reference

    ref = quantize_reference(x, global_scale=global_scale)
    got = launch.quantize(x, None if global_scale is None else
                          torch.as_tensor(global_scale, dtype=torch.float32, device=x.device),
                          config=config)
    torch.cuda.synchronize()
    assert got.data.shape == ref.data.shape and got.scales.shape == ref.scales.shape
    # rows row_pitch(K) bytes apart, their padding (K % 32 != 0) written as zeros
    assert got.data.stride() == ref.data.stride() and has_row_pitch(got.data, x.shape[-1])
    bad = (got.data_padded != ref.data_padded).nonzero()
    assert bad.numel() == 0, f"data differs at {bad[:8].tolist()} (shape {tuple(x.shape)})"
    bad = (got.scales != ref.scales).nonzero()
    assert bad.numel() == 0, f"scales differ at {bad[:8].tolist()} (shape {tuple(x.shape)})"
    assert got.global_scale.view(torch.int32).item() == ref.global_scale.view(torch.int32).item()
    return got


SHAPES = [(1, 16), (7, 48), (128, 64), (129, 80), (300, 272), (256, 4096), (1000, 1008),
          (3, 5, 32), (2, 130, 208), (4, 64, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
def test_random_matches_reference(shape, dtype, seed):
    x = torch.randn(shape, device="cuda").to(dtype)
    _check(x)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 256), (16, 8192), (130, 80), (2, 129, 1040)])
@pytest.mark.parametrize("way", ("one launch", "two launches"))
def test_each_launch_way_matches_reference(shape, way, seed):
    """The plan takes one launch for small inputs (`tuning.quantize`); both ways, forced, on
    small and large inputs, and the finite check on each (`test_outputs_fully_written`
    poisons the outputs of a shape the plan gives one launch)."""
    config = ONE if way == "one launch" else nq.Config()
    x = _hard(shape, torch.bfloat16, torch.Generator().manual_seed(seed)).to("cuda")
    got = _check(x, config=config)
    x[..., -1, -1] = float("inf")
    with pytest.raises(ValueError, match="finite"):
        launch.quantize(x, config=config)
    assert got.global_scale.dim() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
def test_huge_dynamic_range_and_zero_blocks(dtype, seed):
    lim = {torch.bfloat16: 120, torch.float16: 14, torch.float32: 120}[dtype]
    x = torch.randn(3, 257, 528, device="cuda")
    x = x * torch.exp2(torch.randint(-lim, lim, x.shape, device="cuda").float())
    x[:, :, 32:48] = 0  # zero blocks
    x[:, 5] = 0
    x[:, 6, ::3] = -0.0
    if dtype != torch.float32:
        x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)
    _check(x.to(dtype))
    _check(torch.zeros(130, 64, device="cuda", dtype=dtype))  # all-zero tensor


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_ties_and_saturation_points(dtype):
    # With global_scale 1/2688 and a block amax of 6*448/2688*... choose blocks whose scale
    # comes out exactly 1: amax 6 -> t = 1 * s_enc_g... use a given scale so s_enc = 1 exactly.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    near = [v * (1 + s * 2.0**-7) for v in ties for s in (-1, 1)]
    vals = torch.tensor(ties + [-v for v in ties] + near[:32], dtype=torch.float32)
    x = vals.reshape(-1, 16)
    x[:, 0] = 6.0  # block amax 6 -> sf = E4M3(1.0 * 448 / 448) with s_dec_g = 1/448
    x = torch.cat([x, x * 2.0**-5, x * 2.0**5]).to("cuda").to(dtype)
    _check(x, global_scale=1.0 / 448)
    _check(x, global_scale=2.0**-126)  # t overflows: scales saturate to 448 (0x7E)
    _check(x)
    # saturation: blocks where x*s_enc lands just above 6 and E4M3 scale ties
    y = torch.randn(64, 256, device="cuda")
    y[:, ::16] = 448.0 * 6 / 2688 * 17
    _check(y.to(dtype))


AMAX_FLOOR = 2688 * 2.0**-116


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("log2_amax", (0, -40, -47, -100, -105, -106, -120, -125))
def test_tiny_amax_matches_reference(dtype, log2_amax, seed):
    # The recipe's floors (AMAX_FLOOR = 2688 * 2^-116 ~ 2^-104.6 on amax, 2^-126 under each
    # block's decode scale) and the zero-scale select: above the floor the bytes equal those of
    # the amax-1 copy; below it (-105 .. -125) s_dec_g = 2^-116 and the scales shrink (all 0
    # at 2^-125 <= 6 * 2^-126).
    x = torch.randn(3, 257, 33, 16, device="cuda")
    x = (x * torch.exp2(-torch.rand(3, 257, 33, 1, device="cuda") * 30)).reshape(3, 257, 528)
    x[:, :, 32:48] = 0  # zero blocks
    x[:, 6, ::3] = -0.0
    x1 = (x / x.abs().max()).to(dtype)
    x1 = torch.where(x1.abs() < 2.0**-21, 0.0, x1)  # so the scaling stays exact to 2^-105
    x = x1 * 2.0**log2_amax
    got = _check(x)
    if x.abs().max().item() >= AMAX_FLOOR and torch.equal(x * 2.0**-log2_amax, x1):
        base = _check(x1)  # exact scaling: the contract says the bytes are the same
        assert torch.equal(got.data, base.data) and torch.equal(got.scales, base.scales)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
def test_zero_scale_blocks_match_reference(dtype, seed):
    # Blocks whose t <= 2^-10 (scale 0) but whose data is not zero: s_enc = 0, so their codes
    # are the signs alone (0 / 8), from the product's sign bit on every path (native cvt,
    # sm_90a magic add with input sign nibbles, fp32 sign extraction).
    x = torch.randn(130, 272, device="cuda")
    x[:, 16:32] *= 2.0**-20  # t ~ 2^-12: scale 0
    x[:, 48:64] *= 2.0**-16  # t ~ 2^-8: subnormal scales
    x[7] = 0  # an all-zero row
    x[:, 64:80] = -0.0
    got = _check(x.to(dtype))
    sf = got.scales_logical()
    assert (sf[:, 1] == 0).all()
    codes = unpack_fp4(got.data)
    assert ((codes[:, 16:32] & 7) == 0).all() and (codes[:, 64:80] == 8).all()


@pytest.mark.gpu
@pytest.mark.parametrize("gs", (2.0**-126, 3.1e-37, 2.0**-117, 2.0**120))
def test_extreme_given_scales_match_reference(gs, seed):
    # Below 2^-117 the floor under d binds (subnormal sf * gs); 2^120 is past F32_MAX / 2688,
    # where decodes can overflow. Blocks span 20 binades below 2 * 32 * gs (capped at 2^127).
    x = torch.randn(2, 200, 10, 16, device="cuda").clamp(-2, 2)
    x = (x * torch.exp2(-torch.rand(2, 200, 10, 1, device="cuda") * 20)).reshape(2, 200, 160)
    x = x * min(gs * 32, 2.0**126)
    _check(x, global_scale=gs)


@pytest.mark.gpu
def test_given_global_scale_random(seed):
    x = torch.randn(2, 200, 160, device="cuda", dtype=torch.bfloat16)
    for gs in (1e-3, 0.37, 3.0, 1e-30):
        _check(x, global_scale=gs)


@pytest.mark.gpu
def test_non_finite_rejected_and_opt_out():
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[100, 17] = bad
        with pytest.raises(ValueError, match="finite"):
            launch.quantize(y)
        with pytest.raises(ValueError, match="finite"):
            launch.quantize(y, torch.tensor(0.01, device="cuda"))
        launch.quantize(y, check_finite=False)  # no error, no sync
    # finite input: same bytes with and without the check
    a, b = launch.quantize(x), launch.quantize(x, check_finite=False)
    assert torch.equal(a.data, b.data) and torch.equal(a.scales, b.scales)


@pytest.mark.gpu
def test_outputs_fully_written():
    """Poisoned allocations: every data and scale byte (padding too: K = 48 pads the rows of
    codes to 32 bytes) must be written."""
    x = torch.randn(130, 48, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    # The caching allocator hands back the poisoned blocks of the same sizes.
    for _ in range(2):
        ref = launch.quantize(x)
        junk = [torch.full_like(ref.data_padded, 0xAB), torch.full_like(ref.scales, 0xAB)]
        del ref, junk
    got = _check(x)
    assert (got.scales.view(-1)[got.scales.numel() - 1] == 0)


SWEEP = [dict(warps=4, rows_in_flight=4, min_ctas_per_sm=0), dict(rows_in_flight=1),
         dict(reverse=False), dict(amax_threads=512, amax_ctas_per_sm=2, amax_unroll=2),
         dict(warps=16, rows_in_flight=2, min_ctas_per_sm=2), {"pdl": False},
         *quantize_tuning.SPLITS.values()]


@pytest.mark.gpu
@pytest.mark.parametrize("kw", SWEEP, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_tuning_configs_match_reference(kw):
    """Every configuration the benchmark sweeps gives the same bytes."""
    from tk_cute.nvfp4 import quantize_reference

    x = torch.randn(2, 300, 1040, device="cuda", dtype=torch.bfloat16)
    ref = quantize_reference(x)
    for gs in (None, ref.global_scale):
        got = launch.quantize(x, gs, config=nq.Config(**kw))
        assert torch.equal(got.data, ref.data) and torch.equal(got.scales, ref.scales)
        assert torch.equal(got.global_scale, ref.global_scale)


@pytest.mark.gpu
def test_graph_capture_and_repeated_calls():
    """Unchecked calls capture into a CUDA graph; replays and repeated (cached-plan) calls give
    the reference bytes."""
    from tk_cute.nvfp4 import quantize_reference

    x = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)
    ref = quantize_reference(x)
    launch.quantize(x, check_finite=False)  # plan + compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = launch.quantize(x, check_finite=False)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(got.data, ref.data) and torch.equal(got.scales, ref.scales)
        assert torch.equal(got.global_scale, ref.global_scale)
    for _ in range(3):  # the cached plan's bare NVFP4Tensor path
        again = launch.quantize(x)
        assert torch.equal(again.data, ref.data) and again.data.shape == ref.data.shape
