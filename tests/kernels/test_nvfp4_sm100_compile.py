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
from tk_cute.tuning import sm100 as sm100_tuning
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
    cfg = sm100_tuning.w4a4_config(arch, 8192, 8192, 8192)
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
    cfg = dataclasses.replace(sm100_tuning.w4a4_config("sm_100a", 8192, 8192, 8192),
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
    assert sm100_tuning.w4a4_config("sm_100a", 8192, 8192, 8192).scheduler == schedule.CLC
    assert sm100_tuning.w4a4_config("sm_100a", 512, 1024, 8192).scheduler == schedule.STATIC
    assert sm100_tuning.w4a4_config("sm_107a", 16384, 16384, 256).scheduler == schedule.CLC


@pytest.mark.parametrize("arch", ARCHS)
def test_small_m_swapped_and_split_k(arch):
    """Small M: the weights as the MMA's A, D stored transposed through a column-major staging
    tile (16-bit scalar shared stores, TMA store), K split into runs (the K loop starts at
    the run's first stage; fp32 partial D's); the same MMAs and no spills."""
    cfg = sm100_tuning.w4a4_config(arch, 1, 3584, 18944)
    assert cfg.SPLIT_K > 1
    cfg = dataclasses.replace(cfg, swap_ab=True, out="bfloat16", LOAD_PIPE_DEPTH=4)
    b, kern = K.compile(cfg, 16, 3584, 18944)
    assert b.ptx_count(r"tcgen05\.mma\.cta_group::2\.kind::mxf4nvf4") >= cfg.k_blocks
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared") >= 1  # D: TMA only
    assert b.ptx_count(r"st\.global") == 0
    assert b.ptx_count(r"st\.shared\.f32|st\.shared\.b32") >= 1  # fp32 partials, by lane
    assert b.kernel.local_bytes == 0 and cfg.smem_bytes <= target(arch).smem_bytes
    plain = dataclasses.replace(cfg, swap_ab=False, SPLIT_K=1)
    assert plain.d_type == "bfloat16" and cfg.d_type == "float32"
    with pytest.raises(K.ConfigError, match="dense out"):
        K.Config(arch=arch, out="nvfp4", swap_ab=True)
    with pytest.raises(K.ConfigError, match="SPLIT_K"):
        K.Config(arch=arch, out="nvfp4", SPLIT_K=2)


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
        (dict(arch="sm_107a", out="int8"), K.ConfigError),
        (dict(arch="sm_107a", scheduler="dynamic"), K.ConfigError),
    ],
)
def test_config_rejections(kwargs, error):
    with pytest.raises(error):
        K.Config(**kwargs)


# --- the fused NVFP4-output epilogue (out="nvfp4") -------------------------------------------

def nvfp4_entry_build(arch, m=8192, n=8192, k=8192):
    """The NVFP4-output kernel compiled through `dispatch_sm100.prepare` (NVFP4Tensor D, its
    decode scale and saturation flag as kernel arguments), as if on an `arch` GPU."""
    cfg = sm100_tuning.w4a4_config(arch, m, n, k, out="nvfp4")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D, "device_target", lambda device: arch)
        mp.setattr(D, "sm_count", lambda device: target(arch).sm_count or 148)
        launch = D.prepare(fake_operand(256, 512), fake_operand(256, 512), "nvfp4", cfg,
                           out_global_scale=torch.tensor(0.5))
    return cfg, *D.compile_launch(launch, keep=True)


@pytest.fixture(scope="module", params=ARCHS)
def nvfp4_built(request):
    return request.param, *nvfp4_entry_build(request.param)


def test_nvfp4_epilogue_instructions(nvfp4_built):
    """Per EPI_N columns and M half (one copy of the step loop each): one TMEM load per 16
    columns, the reducing `tcgen05.ld.red ... max.abs` where the target has it (SASS
    LDTM.STAT ... MAXABS), the recipe's UE4M3 encode and 8 native E2M1 conversions per block,
    one 8-byte code store and one scale-byte store per block; no TMA store, no stmatrix."""
    arch, cfg, b, _ = nvfp4_built
    blocks = cfg.m_mmas * cfg.EPI_N // 16
    reducing = target(arch).tmem_load_reduce
    assert reducing == (arch in ("sm_103a", "sm_107a"))
    red = b.ptx_count(r"tcgen05\.ld\.red\.sync\.aligned\.32x32b\.x16\.max\.abs\.f32")
    plain = b.ptx_count(r"tcgen05\.ld\.sync\.aligned\.32x32b\.x16\.b32")
    assert (red, plain) == ((blocks, 0) if reducing else (0, blocks))
    assert b.sass_count(r"LDTM\.STAT\.x16\.MAXABS\.F32") == (blocks if reducing else 0)
    assert b.ptx_count(r"tcgen05\.ld") == blocks  # no other TMEM load
    assert b.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2\.f32") == 8 * blocks
    assert b.sass_count(r"F2FP\.SATFINITE\.E2M1\.F32") == 8 * blocks
    assert b.ptx_count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == blocks
    assert b.ptx_count(r"st\.global\.v2\.b32") == blocks and b.sass_count(r"STG\.E\.64") == blocks
    assert b.ptx_count(r"st\.global\.u8") == blocks and b.sass_count(r"STG\.E\.U8") == blocks
    # IEEE divisions: 1 / D's decode scale once, then per block t = amax / 6 and 1 / d
    assert b.ptx_count(r"div\.rn\.f32") == 1 + 2 * blocks
    assert b.ptx_count(r"div\.(approx|full)") == 0
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared") == 0
    assert b.ptx_count(r"stmatrix") == 0
    # the saturation flag: one warp vote, one atomic OR; three global loads: gA, gB, D's scale
    assert b.ptx_count(r"vote\.sync\.any") == 1 and b.ptx_count(r"atom\.global\.or") == 1
    assert b.ptx_count(r"ld\.global\.b32") == 3
    # the MMA side is the dense kernel's
    assert b.ptx_count(MMA) == (cfg.Kb // cfg.mma_k) * cfg.m_mmas


def test_nvfp4_epilogue_resources(nvfp4_built):
    arch, cfg, b, kern = nvfp4_built
    t = target(arch)
    assert b.kernel.local_bytes == 0 and b.kernel.stack_bytes == 0
    # no D staging buffers: the traced shared memory == the Config's budget <= capacity
    dense = dataclasses.replace(cfg, out="bfloat16")
    assert kern.traced["smem_bytes"] == cfg.smem_bytes <= t.smem_bytes
    assert cfg.smem_bytes == dense.smem_bytes - 128 * cfg.EPI_N * 2 * cfg.EPI_PIPE_DEPTH
    assert cfg.tmem_columns_used <= t.tmem_columns
    assert b.ptx_count(r"tcgen05\.alloc\.exclusive") == (1 if arch == "sm_107a" else 0)


def _tile_blocks(cfg, cta_tile_m, tile_n, m, n, l=0):
    """What `consumer_finish_nvfp4` stores for one CTA tile, evaluated with Python ints: for
    every thread (TMEM lane t = row t of 128), M half, EPI_N step and 16-column block, the
    (row, col) and `nvfp4_out_store`'s offsets and predicates."""
    out = []
    for mh in range(cfg.m_mmas):
        for t in range(128):
            row = K.d_row_tile(cta_tile_m, mh, cfg.m_mmas) * 128 + t
            for j in range(cfg.Nb // cfg.EPI_N):
                for b in range(cfg.EPI_N // 16):
                    col = tile_n * cfg.Nb + j * cfg.EPI_N + 16 * b
                    out.append((row, col, *K.nvfp4_out_store(l, row, col, m, n)))
    return out


# the tile shapes the heuristic picks (Rubin big / small, Blackwell big; small = Rubin's)
NVFP4_TILES = [("sm_107a", 16384, 16384), ("sm_107a", 512, 1024), ("sm_100a", 16384, 16384)]


@pytest.mark.parametrize("arch, m, n", NVFP4_TILES)
def test_nvfp4_scale_addresses_are_the_blocked_layout(arch, m, n):
    """For every (row, 16-column block) of a CTA pair's tile (both CTAs), the scale byte the
    epilogue addresses is `blocked_offset`'s, the codes byte is row-major (n / 2 per row), and
    each (row, block) is written exactly once."""
    from tk_cute.layouts.nvfp4_scales import blocked_offset

    cfg = sm100_tuning.w4a4_config(arch, m, n, 8192, out="nvfp4")
    pair_m, pair_n = 1, 2  # the second pair tile along M, third along N
    got = _tile_blocks(cfg, 2 * pair_m, pair_n, m, n) + _tile_blocks(cfg, 2 * pair_m + 1,
                                                                       pair_n, m, n)
    cells = {(r, c) for r, c, *_ in got}
    assert len(cells) == len(got) == cfg.Mb * cfg.Nb // 16
    rows = range(pair_m * cfg.Mb, (pair_m + 1) * cfg.Mb)
    cols = range(pair_n * cfg.Nb, (pair_n + 1) * cfg.Nb, 16)
    assert cells == {(r, c) for r in rows for c in cols}
    for row, col, at, ok, sf_at, sf_ok in got:
        assert ok and sf_ok  # inside the tensor
        assert sf_at == blocked_offset(row, col // 16, m, n)
        assert at == row * (n // 2) + col // 2


@pytest.mark.parametrize("arch, m, n, l", [("sm_107a", 300, 144, 0), ("sm_107a", 300, 144, 1),
                                           ("sm_100a", 130, 80, 0)])
def test_nvfp4_grid_writes_every_byte_once(arch, m, n, l):
    """Over all tiles of a ragged problem (M, N not multiples of the tile) the predicated
    stores write every code byte of D (M rows of N / 2, `nvfp4_codes.row_pitch(N)` bytes apart:
    N = 144 and 80 pad them) and every byte of its blocked scale tensor, padding rows and
    columns included, exactly once, and nothing outside (batch l)."""
    from tk_cute.layouts.nvfp4_codes import row_pitch
    from tk_cute.layouts.nvfp4_scales import blocked_shape

    cfg = sm100_tuning.w4a4_config(arch, m, n, 8192, out="nvfp4")
    cta_m = -(-m // (cfg.Mb // 2))
    cta_m += cta_m % 2  # whole pairs (the cluster's M is 2)
    codes, scales = [], []
    for tm in range(cta_m):
        for tn in range(-(-n // cfg.Nb)):
            for row, col, at, ok, sf_at, sf_ok in _tile_blocks(cfg, tm, tn, m, n, l):
                if ok:
                    codes += range(at, at + 8)
                if sf_ok:
                    scales.append(sf_at)
    rm, rk, atom = blocked_shape(m, n)
    pitch = row_pitch(n)
    base_c, base_s = l * m * pitch, l * rm * rk * atom
    assert pitch > n // 2  # the padding is never written: the kernel's rows hold N / 2 codes
    assert sorted(codes) == [base_c + r * pitch + j for r in range(m) for j in range(n // 2)]
    assert sorted(scales) == list(range(base_s, base_s + rm * rk * atom))


@pytest.mark.parametrize("reduce", [False, True])
def test_nvfp4_epilogue_thread_holds_its_row(reduce):
    """`epilogue.tmem_quantize`'s tcgen05.ld partition (x16 atoms, reducing or not) evaluated
    by CuTe on the host: thread t of the 4 epilogue warps holds row t of the 128 x EPI_N block
    and register c is column c, which is what `nvfp4_out_store`'s row and col assume."""
    import cutlass
    import cutlass.cute as cute

    from tk_cute.compile import COMPILE_LOCK
    from tk_cute.ops import epilogue
    from tk_cute.ops import tcgen05 as tc

    epi, found = 32, {}
    arch = "sm_107a" if reduce else "sm_100a"

    @cute.jit
    def trace():
        mma = tc.block_scaled_mma(arch, 256, cutlass.Float8E4M3FN, arch == "sm_107a")
        layout = mma.accumulator((512 if reduce else 256, 256), 1)
        ptr = cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.tmem, assumed_align=16)
        acc = cute.make_tensor(ptr, layout)
        for t in (0, 1, 31, 32, 77, 127):
            e = epilogue.tmem_quantize(acc, (128, epi), t, reduce)
            found[t] = [tuple(e.coords[i]) for i in range(cute.size(e.coords))]
            found[("amax", t)] = None if e.amax is None else cute.size(e.amax)

    with COMPILE_LOCK:
        cute.compile(trace, options=f"--gpu-arch {arch}")
    for t in (0, 1, 31, 32, 77, 127):
        assert found[t] == [(t, c) for c in range(epi)]
        assert found[("amax", t)] == (epi // 16 if reduce else None)


def test_rubin_ue5m3_scales_compile():
    """sf="ue5m3" on sm_107a: the same kernel, the MMA's instruction descriptor differing only
    in its scale-type bit (bit 24 of the idesc: 0 UE4M3, 1 UE5M3 in DSL 4.8.1's encoding); 0
    spills. Every other line of the PTX is the UE4M3 build's."""
    import re

    cfg = sm100_tuning.w4a4_config("sm_107a", 8192, 8192, 8192)
    (b4, _), (b5, k5) = K.compile(cfg), K.compile(dataclasses.replace(cfg, sf="ue5m3"))
    assert b5.kernel.local_bytes == 0 and k5.traced["smem_bytes"] == cfg.smem_bytes
    assert b5.ptx_count(MMA) == b4.ptx_count(MMA) == (cfg.Kb // cfg.mma_k) * cfg.m_mmas
    norm = lambda ptx: [re.sub(r"%\w+", "%", l) for l in ptx.splitlines()]  # noqa: E731
    diff = [(x, y) for x, y in zip(norm(b4.ptx), norm(b5.ptx)) if x != y]
    assert len(norm(b4.ptx)) == len(norm(b5.ptx)) and diff
    for x, y in diff:
        (i4,), (i5,) = re.findall(r"or\.b32\s+%, %, (\d+);", x), re.findall(
            r"or\.b32\s+%, %, (\d+);", y)
        assert int(i4) ^ int(i5) == 1 << 24 and int(i5) & (1 << 24)


@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
def test_ue5m3_refused_off_rubin(arch):
    with pytest.raises(K.ConfigError, match=r"UE5M3 .*sm_107a.*" + arch):
        K.Config(arch=arch, Mb=256, Nb=256, sf="ue5m3")
    with pytest.raises(K.ConfigError, match="UE5M3"):
        sm100_tuning.w4a4_config(arch, 8192, 8192, 8192, sf="ue5m3")


def test_nvfp4_config_rejections():
    with pytest.raises(K.ConfigError, match="EPI_N"):
        K.Config(arch="sm_107a", out="nvfp4", EPI_N=8)
