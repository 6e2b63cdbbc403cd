"""Compile-only checks of the tcgen05 NVFP4 GEMM on sm_100a, sm_103a and sm_107a (no GPU).

Each target is built once (module fixture) through the torch entry's own path
(`dispatch_sm100.prepare` -> `compile_launch`) from CPU NVFP4Tensors, the device query
monkeypatched, so the entry's argument conversion and the kernel's signature are compiled
together; the tests read its PTX, SASS and resources, and compare the shared memory the kernel's
own layouts asked for with its Config.
"""

import dataclasses
import re

import pytest
import torch

from tk_cute.arch import target
from tk_cute.kernels.gemm import nvfp4_sm100 as K
from tk_cute.layouts.nvfp4_scales import blocked_shape
from tk_cute.nvfp4 import NVFP4Tensor
from tk_cute.nvfp4 import dispatch_sm100 as D
from tk_cute.nvfp4 import heuristics
from tk_cute.ops import schedule

ARCHS = ["sm_100a", "sm_103a", "sm_107a"]
MMA = r"tcgen05\.mma\.cta_group::2\.kind::mxf4nvf4\.block_scale\.block16"
TRY_CANCEL = r"clusterlaunchcontrol\.try_cancel\.async\.shared::cta\.mbarrier::complete_tx::bytes" \
             r"\.multicast::cluster::all\.b128"


def fake_operand(rows, k, gs=1.0):
    """A CPU NVFP4Tensor with the right shapes (its bytes do not matter for a compile)."""
    return NVFP4Tensor(torch.zeros(rows, k // 2, dtype=torch.uint8),
                       torch.zeros(blocked_shape(rows, k), dtype=torch.uint8),
                       torch.tensor(gs), (rows, k))


def entry_build(arch, cfg, m=256, n=256, k=512):
    """Compile through the entry's path, as if the CPU tensors were on an `arch` GPU."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D, "device_target", lambda device: arch)
        mp.setattr(D, "sm_count", lambda device: target(arch).sm_count or 148)
        launch = D.prepare(fake_operand(m, k), fake_operand(n, k), torch.bfloat16, cfg)
    return D.compile_launch(launch, keep=True)


@pytest.fixture(scope="module", params=ARCHS)
def built(request):
    arch = request.param
    cfg = heuristics.sm100_config(arch, 8192, 8192, 8192)
    b, kern = entry_build(arch, cfg)
    return arch, cfg, b, kern


def test_block_scaled_mma_pair_and_k(built):
    arch, cfg, b, _ = built
    # one instruction per (K block, M half) of a stage: K = 64 on Blackwell, 128 on Rubin
    assert cfg.mma_k == (128 if arch == "sm_107a" else 64)
    assert b.ptx_count(MMA) == (cfg.Kb // cfg.mma_k) * cfg.m_mmas
    assert b.ptx_count(r"tcgen05\.mma\.cta_group::1") == 0
    sass = "UTCOMMA.2CTA.4X" if arch == "sm_100a" else "UTCOMMA.2CTA.BLOCK16"
    assert b.sass_count(re.escape(sass)) == b.ptx_count(MMA)


def test_tmem_alloc_and_budget(built):
    arch, cfg, b, _ = built
    t = target(arch)
    assert cfg.tmem_columns_used <= t.tmem_columns
    exclusive = b.ptx_count(r"tcgen05\.alloc\.exclusive\.cta_group::2")
    plain = b.ptx_count(r"tcgen05\.alloc\.cta_group::2")
    if arch == "sm_107a":
        assert cfg.tmem_columns_used == 576 and exclusive == 1 and plain == 0
    else:
        assert cfg.tmem_columns_used <= 512 and exclusive == 0 and plain == 1
    assert b.ptx_count(r"tcgen05\.dealloc") >= 1


def test_scales_tma_multicast_pdl(built):
    _, cfg, b, _ = built
    assert b.ptx_count(r"tcgen05\.cp\.cta_group::2\.32x128b\.warpx4") >= 1
    assert b.ptx_count(r"cp\.async\.bulk\.tensor.*multicast::cluster.*cta_group::2") >= 1
    assert b.ptx_count(r"griddepcontrol\.wait") == 1
    assert b.ptx_count(r"griddepcontrol\.launch_dependents") == 1
    assert b.ptx_count(r"tcgen05\.ld\.sync\.aligned\.32x32b\.x32") >= 1


def test_no_spills_and_smem_from_layouts(built):
    arch, cfg, b, kern = built
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0
    # the struct the kernel traced from its own layouts == the Config's budget <= capacity
    assert kern.traced["smem_bytes"] == cfg.smem_bytes <= target(arch).smem_bytes
    per = cfg.stage_bytes
    assert kern.traced["a_stage_bytes"] == 2 * per["A"]
    assert kern.traced["bs_stage_bytes"] == 2 * (per["B"] + per["SFA"] + per["SFB"])


def test_rubin_collector_and_early_a_release(built):
    arch, cfg, b, _ = built
    fill = b.ptx_count(MMA + r".*collector::b::fill")
    last = b.ptx_count(MMA + r".*collector::b::lastuse")
    early = b.ptx_count(r"tcgen05\.commit\.cta_group::2.*sync_restrict::shared::read::mma::a")
    if arch != "sm_107a":
        assert fill == last == early == 0
        return
    assert cfg.LOAD_PIPE_DEPTH >= 5 and cfg.smem_bytes > 227 * 1024
    assert fill == last == cfg.Kb // cfg.mma_k
    assert b.sass_count(r"UTCOMMA.*\.B_KEEP") == fill
    assert b.sass_count(r"UTCOMMA.*\.B_REUSE") == last
    assert early == 1


def test_rubin_double_buffered_two_accumulators():
    cfg = K.Config(arch="sm_107a", Mb=512, Nb=128, ACC_PIPE_DEPTH=2, LOAD_PIPE_DEPTH=6)
    b, kern = K.compile(cfg)
    assert cfg.tmem_columns_used == 560
    assert b.ptx_count(r"tcgen05\.alloc\.exclusive\.cta_group::2") == 1
    assert b.kernel.local_bytes == 0 and kern.traced["smem_bytes"] == cfg.smem_bytes
    # Config's default scheduler is static: no CLC, 6 warps
    assert cfg.scheduler == schedule.STATIC and b.ptx_count("clusterlaunchcontrol") == 0
    assert b.ptx_count(r"\.reqntid 192, 1, 1") == 1


def test_cluster_launch_control(built):
    """The heuristic picks CLC at 8192^3 (more tiles than one wave of clusters): a 7th warp
    issues try_cancel multicast to the cluster, every walker decodes the response."""
    _, cfg, b, _ = built
    assert cfg.scheduler == schedule.CLC
    assert b.ptx_count(TRY_CANCEL) == 1
    # one response decode per role that walks tiles: load, MMA, epilogue, scheduler warp
    assert b.ptx_count(r"clusterlaunchcontrol\.query_cancel\.is_canceled\.pred\.b128") == 4
    assert b.ptx_count(r"\.reqntid 224, 1, 1") == 1


def test_static_scheduler_and_fp16_out():
    cfg = dataclasses.replace(heuristics.sm100_config("sm_100a", 8192, 8192, 8192),
                              scheduler=schedule.STATIC, out="float16")
    b, _ = K.compile(cfg)
    assert b.ptx_count("clusterlaunchcontrol") == 0 and b.ptx_count(r"\.reqntid 192") == 1
    assert b.ptx_count(r"cvt\.rn\.f16x2\.f32") >= 1 and b.ptx_count(r"cvt\.rn\.bf16") == 0
    assert b.kernel.local_bytes == 0


def test_alpha_read_on_device(built):
    """alpha = gA * gB: two fp32 loads from the global-scale tensors, no host scalar."""
    _, _, b, _ = built
    assert b.ptx_count(r"ld\.global\.b32") == 2
    assert b.ptx_count(r"mul\.(rn\.)?f32") >= 1


@pytest.mark.parametrize("Mb, Nb", [(256, 128), (256, 256), (512, 128), (512, 256)])
def test_epilogue_tiles_are_the_mma_c_partition(Mb, Nb):
    """`d_row_tile` (the 128 x EPI_N D tile `tma.store_async` writes for CTA tile m, M half mh)
    is where the pair's MMA puts those accumulator rows: CuTe's partition_C of the 2-CTA MMA,
    evaluated on an identity tensor (the epilogue's own partition before issue 23)."""
    import cutlass
    import cutlass.cute as cute

    from tk_cute.compile import COMPILE_LOCK
    from tk_cute.ops import tcgen05 as tc

    epi, found = 32, {}

    @cute.jit
    def trace():
        mma = tc.tiled_mma(tc.block_scaled_op("sm_100a", Nb, cutlass.Float8E4M3FN))
        mD = cute.make_identity_tensor((4 * Mb, 4 * Nb, 2))
        for v in cutlass.range_constexpr(2):  # CTA of the pair
            part = mma.get_slice(v).partition_C(cute.local_tile(mD, (Mb, Nb), (None,) * 3))
            blocks = cute.flat_divide(part[((None, None), None, 0, None, None, None)], (128, epi))
            for mi, mh, j in [(mi, mh, j) for mi in (0, 3) for mh in range(Mb // 256)
                              for j in (0, Nb // epi - 1)]:
                found[(v, mi, mh, j)] = (blocks[0, 0, 0, j, mh, mi, 2, 1],
                                         blocks[127, epi - 1, 0, j, mh, mi, 2, 1])

    with COMPILE_LOCK:  # host-only: the layouts are evaluated while tracing
        cute.compile(trace, options="--gpu-arch sm_100a")
    assert len(found) == 2 * 2 * (Mb // 256) * 2
    for (v, mi, mh, j), (first, last) in found.items():
        row = K.d_row_tile(2 * mi + v, mh, Mb // 256) * 128
        col = (2 * Nb // epi + j) * epi
        assert tuple(first) == (row, col, 1) and tuple(last) == (row + 127, col + epi - 1, 1)


def test_select_config_scheduler_by_waves():
    assert heuristics.sm100_config("sm_100a", 8192, 8192, 8192).scheduler == schedule.CLC
    assert heuristics.sm100_config("sm_100a", 512, 1024, 8192).scheduler == schedule.STATIC
    assert heuristics.sm100_config("sm_107a", 16384, 16384, 256).scheduler == schedule.CLC


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(arch="sm_100a", Mb=512, Nb=256), K.TmemBudgetError),  # 576 columns > 512
        (dict(arch="sm_100a", Mb=256, Nb=256, ACC_PIPE_DEPTH=2), K.TmemBudgetError),  # 560
        (dict(arch="sm_100a", Mb=256, Nb=256, LOAD_PIPE_DEPTH=6), K.SmemBudgetError),
        (dict(arch="sm_107a", Mb=512, Nb=256, LOAD_PIPE_DEPTH=6), K.SmemBudgetError),
        (dict(arch="sm_100a", Mb=256, sf="ue5m3"), K.ConfigError),  # UE5M3 is Rubin-only
        (dict(arch="sm_90a"), K.ConfigError),
        (dict(arch="sm_107a", CLUSTER_M=3), K.ConfigError),
        (dict(arch="sm_107a", out="float32"), K.ConfigError),
        (dict(arch="sm_107a", scheduler="dynamic"), K.ConfigError),
    ],
)
def test_config_rejections(kwargs, error):
    with pytest.raises(error):
        K.Config(**kwargs)
