"""Register-A wgmma W4A16 kernel (kernels/gemm/nvfp4_register_a_sm90.py).

CPU: host proofs of the K permutation (decode side and permuting-warp side agree on every
element), of the shared-memory addresses against the swizzled `st` layouts, of the scale reads
against the blocked layout; configuration rules; sm_90a compile tests on the instructions and
resources. GPU (marker `gpu`): results against a float64 reference on fresh random data.
"""

import dataclasses
import itertools
import re

import pytest
import torch
from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
from tk_cute.layouts import nvfp4_scales, register_a

from tk_cute.compile import build
from tk_cute.nvfp4 import launch
from tk_cute.ops import warpgroup
from tk_cute.testing import assert_gemm_close, random_weights
from tk_cute.tuning import sm90 as sm90_tuning

# --- the K permutation (host model) -----------------------------------------------------------


def test_act_column_permutes_each_stage():
    cols = [register_a.act_column(k) for k in range(rs.STAGE_K)]
    assert sorted(cols) == list(range(rs.STAGE_K))
    assert all(c // rs.SUB_K == k // rs.SUB_K for k, c in enumerate(cols))  # blocks stay put


def _decode_slots():
    """(k16 step, slot, K) for what `_decode` puts in a thread's A registers: word j of lane t
    holds codes 32t + 8j + 0..7; the strided decode gives bf16 pairs (i, i + 4); pair i goes to
    k16 step 2i + j // 2, slots 2t, 2t + 1 (j even) or 2t + 8, 2t + 9 (j odd)."""
    for t in range(4):
        for j in range(4):
            for i in range(4):
                slot0 = 2 * t + 8 * (j % 2)
                yield 2 * i + j // 2, slot0, 32 * t + 8 * j + i
                yield 2 * i + j // 2, slot0 + 1, 32 * t + 8 * j + i + 4


def test_decode_meets_each_activation_at_its_column():
    """wgmma k16 step s reads activation columns 16 s .. 16 s + 15 of the block: the K the A
    operand holds in slot x of step s must sit at column 16 s + x."""
    seen = set()
    for step, slot, k in _decode_slots():
        assert register_a.act_column(k) == 16 * step + slot
        seen.add(k)
    assert seen == set(range(rs.SUB_K))


def _permuted_block():
    """Model of `_load_natural` / `_store_permuted` on one 128-K block of one row: column ->
    natural K after the 4 threads p = 0..3 of a group have run."""
    natural = list(range(rs.SUB_K))
    chunks = [natural[8 * c: 8 * c + 8] for c in range(16)]
    strided = [[(ch[i], ch[i + 4]) for i in range(4)] for ch in chunks]  # bf16x8_strided
    out = [None] * rs.SUB_K
    for p in range(4):
        loaded = [strided[4 * u + p] for u in range(4)]
        for e in range(4):
            for u in range(4):
                out[8 * (4 * e + p) + 2 * u: 8 * (4 * e + p) + 2 * u + 2] = loaded[u][e]
    return out


def test_permuting_warps_implement_act_column():
    for col, k in enumerate(_permuted_block()):
        assert register_a.act_column(k) == col


@pytest.mark.parametrize("M, K", [(1, 256), (9, 512), (17, 512), (32, 8192), (100, 2048),
                                  (128, 2048)])
def test_permute_kernel_threads_cover_every_row_block_once(M, K):
    """Permute "call": `_permute_kernel`'s threads (the grid `_launch` gives it: N_ACT rows, M
    copied and the rest zeroed, so the GEMM's activation boxes lie in the copy) take each (row,
    128-K block, p) once, so with the model above every activation lands at `act_column`."""
    rows = sm90_tuning.register_a_config(M, 256, K).N_ACT
    assert M <= rows < M + 16
    blocks = K // rs.SUB_K
    threads = rs._permute_ctas(False, rows, K) * rs.PERMUTE_THREADS
    tasks = [rs.permute_task(t, blocks) for t in range(threads)]
    mine = sorted(x for x in tasks if x[0] < rows)
    assert mine == [(m, blk, p) for m in range(rows) for blk in range(blocks) for p in range(4)]


@pytest.mark.parametrize("M, K", [(1, 2880), (9, 160), (32, 32), (128, 2912)])
def test_permute_kernel_with_a_k_tail_covers_the_partial_block(M, K):
    """With a K tail the permute passes run ceil(K / 128) blocks per row (the last one partial:
    its chunks past K are written as zeros), into rows `permuted_width(K)` wide."""
    blocks = rs.k_blocks(True, K)
    assert blocks * rs.SUB_K == rs.permuted_width(K) >= K > (blocks - 1) * rs.SUB_K
    threads = rs._permute_ctas(True, M, K) * rs.PERMUTE_THREADS
    mine = sorted(x for x in (rs.permute_task(t, blocks) for t in range(threads)) if x[0] < M)
    assert mine == [(m, blk, p) for m in range(M) for blk in range(blocks) for p in range(4)]


@pytest.mark.parametrize("K, stages, tail", [(8192, 32, False), (2880, 12, True),
                                             (160, 1, True), (8320, 33, True)])
def test_k_tail_configs_count_the_partial_stage(K, stages, tail):
    cfg = sm90_tuning.register_a_config(16, 256, K)
    assert cfg.K_TAIL == tail and rs.k_stages(cfg, K) == stages
    assert rs.stream_units(cfg, 256, K) == 2 * stages if cfg.ROWS == 128 else stages
    if tail:
        with pytest.raises(ValueError, match="K_TAIL=True"):
            rs.check_shape(rs.Config(N_ACT=16), 16, 256, K)


@pytest.mark.parametrize("rows", [128, 256])
@pytest.mark.parametrize("K", [2880, 160])
def test_k_tail_scale_tiles_hold_each_stage_atoms(K, rows):
    """With a K tail the scales are one batch of rows per 128-row band (`weight_tensors`): the
    stage-s tile of band b (rows 8s .. 8s + 7 of 256 bytes in batch b, `scale_coord`) holds
    exactly the scale bytes of that band's rows at K 256s .. 256s + 255 that exist."""
    rk = -(-K // nvfp4_scales.ATOM_K)
    for b in range(rows // 128):
        for s in range(-(-K // rs.STAGE_K)):
            lo = (b * rk * 2 + 8 * s) * 256
            for m in (0, 31, 77, 127):
                for kb in range(16 * s, min(16 * s + 16, -(-K // 16))):
                    off = nvfp4_scales.blocked_offset(128 * b + m, kb, rows, K)
                    assert lo <= off < lo + 8 * 256


def test_strided_pairs_match_the_ops_selector():
    """The model's (i, i + 4) pairing is what `ops.nvfp4.bf16x8_strided` selects."""
    from tk_cute.ops.nvfp4 import STRIDED_PAIRS

    for i, (a, b, sel) in enumerate(STRIDED_PAIRS):
        first_bytes = (sel & 0xF, (sel >> 8) & 0xF)  # source byte of each bf16 half
        elems = [2 * (a if byte < 4 else b) + (byte % 4) // 2 for byte in first_bytes]
        assert elems == [i, i + 4]


# --- shared-memory addresses --------------------------------------------------------------------


def _swizzle128(byte):
    """The 128-byte swizzle TMA and wgmma apply to a shared address (CuTe Swizzle<3,4,3> on the
    byte address): 16-byte chunk bits 4..6 XOR row-of-128-bytes bits 7..9."""
    return byte ^ (((byte >> 7) & 7) << 4)


def _outer_offsets(tile, coords):
    import cutlass.cute as cute

    out = {}

    def body():
        layout = tile.layout(1).outer  # the swizzle applies to the byte address, after this
        out["offsets"] = [int(layout(c)) for c in coords]

    @cute.jit
    def trace():
        body()

    trace()
    return out["offsets"]


@pytest.mark.parametrize("n_act", [8, 16, 48, 128])
def test_act_offset_is_the_swizzled_tile(n_act):
    coords = [(m, c, 0) for m in range(n_act) for c in range(0, rs.STAGE_K, 2)]
    offsets = _outer_offsets(rs.Config(N_ACT=n_act, STAGES=2).act_tile, coords)
    for (m, c, _), off in zip(coords, offsets):
        assert register_a.act_offset(n_act, m, c) == _swizzle128(2 * off)


@pytest.mark.parametrize("rows", [128, 256])
def test_weight_offset_is_the_swizzled_tile(rows):
    coords = [(r, 16 * c, 0) for r in range(rows) for c in range(8)]
    offsets = _outer_offsets(rs.Config(ROWS=rows).weight_tile, coords)
    for (r, c, _), off in zip(coords, offsets):
        assert register_a.weight_offset(r, c // 16) == _swizzle128(off)


def _wavefronts(offsets):
    """Shared-memory wavefronts of one 16-byte access per lane (32 offsets): each quarter-warp
    is served at once unless two of its lanes hit the same banks at different addresses."""
    waves = 0
    for q in range(4):
        banks = {}
        for off in offsets[8 * q: 8 * q + 8]:
            banks.setdefault((off // 16) % 8, set()).add(off)
        waves += max(len(v) for v in banks.values())
    return waves


@pytest.mark.parametrize("n_act", [8, 16, 64])
def test_acc_coord_is_the_wgmma_fragment(n_act):
    """`register_a.acc_coord` (where `_reduce_kernel` finds each partial sum of `_store`'s
    fragment-order vectors) is CuTe's partition of the wgmma accumulator, for every thread
    and element."""
    import cutlass
    from cutlass import cute

    from tk_cute.compile import COMPILE_LOCK
    from tk_cute.types.rt import rt

    out = {}

    def body(mma):
        for thread in range(warpgroup.WARPGROUP_THREADS):
            acc = rt.accumulator(mma, thread, 64, n_act)
            coords = acc.coords()
            out[thread] = [tuple(int(x) for x in coords[e]) for e in range(cute.size(acc.frag))]

    @cute.jit
    def trace():
        body(warpgroup.tiled_mma(cutlass.BFloat16, n_act))

    with COMPILE_LOCK:  # (traced for sm_90a: wgmma's tiled MMA exists there only)
        cute.compile(trace, options="--gpu-arch sm_90a")
    assert len(out) == warpgroup.WARPGROUP_THREADS
    for thread, coords in out.items():
        assert len(coords) == n_act // 2
        assert coords == [register_a.acc_coord(thread, e) for e in range(n_act // 2)]


def test_16_byte_shared_accesses_are_conflict_free():
    """Every LDS.128 / STS.128 of the consumers and the permuting warps takes the minimum of 4
    wavefronts (Nsight Compute counted 2x the ideal before `spread_row`)."""
    for warp in range(16):  # consumers: rows r_lo, r_lo + 8 of lane (g, t), chunk 4 blk + t
        for blk in range(rs.STAGE_K // rs.SUB_K):
            for row8 in (0, 8):
                offs = [register_a.weight_offset(16 * warp + register_a.spread_row(lane // 4) + row8,
                                         4 * blk + lane % 4) for lane in range(32)]
                assert _wavefronts(offs) == 4
    blocks = rs.STAGE_K // rs.SUB_K
    for n_act in (8, 16, 48):
        for first in range(0, n_act * blocks * 4, 32):  # permuting warps: one warp's 32 tasks
            tasks = [rs.quad_task((first + lane) // 4, blocks) for lane in range(32)]
            for x in range(4):  # natural chunk 4u + p loaded, permuted chunk 4e + p stored
                offs = [register_a.act_offset(n_act, m, blk * rs.SUB_K + 8 * (4 * x + lane % 4))
                        for lane, (m, blk) in enumerate(tasks)]
                assert _wavefronts(offs) == 4
    rows = sorted(m * blocks + blk for q in range(16 * blocks)
                  for m, blk in [rs.quad_task(q, blocks)])
    assert rows == list(range(16 * blocks))  # every (row, block) of 16 rows once


@pytest.mark.parametrize("rows", [128, 256])
@pytest.mark.parametrize("K", [256, 8192])
def test_scale_reads_follow_the_blocked_layout(K, rows):
    """The consumer reads the two scales of K 32t .. 32t + 31 of block blk at atom 2 blk + t // 2,
    byte atom_offset(r, 2 (t % 2)) of its band's scale tile (band r // 128 of the row block),
    which TMA copies (box (band * stages + stage) of 4 atoms) from the band's atom 4 stage."""
    cfg = rs.Config(ROWS=rows)
    rk = K // nvfp4_scales.ATOM_K
    for rb in (0, 3):
        for stage in range(K // rs.STAGE_K):
            for r in range(rows):
                band = rb * cfg.bands + r // rs.BAND
                box = (band * (K // rs.STAGE_K) + stage) * cfg.scale_tile.bytes
                assert box == (band * rk + stage * rs.STAGE_K // nvfp4_scales.ATOM_K) \
                    * nvfp4_scales.ATOM_BYTES
                for blk in range(2):
                    for t in range(4):
                        k = stage * rs.STAGE_K + blk * rs.SUB_K + 32 * t
                        atom = (rs.SUB_K * blk + 32 * t) // nvfp4_scales.ATOM_K
                        mine = atom * nvfp4_scales.ATOM_BYTES + nvfp4_scales.atom_offset(
                            r, 2 * (t % 2))
                        want = nvfp4_scales.band_offset(rb * rows + r, k // 16, rk) - box
                        assert mine == want
                        assert nvfp4_scales.band_offset(rb * rows + r, k // 16 + 1, rk) \
                            - box == mine + 1


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize("M, N, K, n_act, rows, tiles", [
    (9, 8192, 8192, 16, 256, 1), (16, 28672, 8192, 16, 256, 1), (64, 8192, 8192, 64, 256, 1),
    (72, 8192, 8192, 80, 128, 1), (100, 8192, 8192, 112, 128, 1), (16, 384, 8192, 16, 128, 1),
    (1, 8192, 8192, 8, 256, 1), (33, 4096, 4096, 48, 128, 1), (128, 4096, 4096, 128, 256, 2),
    (128, 384, 4096, 128, 128, 1), (16, 5120, 2880, 16, 128, 1), (32, 6144, 4096, 32, 128, 1),
    (48, 5120, 2880, 48, 128, 1), (48, 8192, 2880, 48, 256, 1), (64, 7168, 2048, 64, 128, 1),
    (32, 7168, 18432, 32, 128, 1)])
def test_config_for(M, N, K, n_act, rows, tiles):
    cfg = sm90_tuning.register_a_config(M, N, K)
    assert (cfg.N_ACT, cfg.ROWS, cfg.TILES) == (n_act, rows, tiles) and cfg.stages >= 2
    assert cfg.smem(cfg.stages) <= rs.SMEM_BUDGET


@pytest.mark.parametrize("rows, tiles", [(128, 1), (256, 1), (256, 2)])
def test_register_split_is_feasible(rows, tiles):
    """setmaxnreg.inc only takes registers the block already holds (its launch allocation): the
    consumers' increase must fit in what the producer warpgroup's decrease gives back, or they
    wait forever (a hang seen on the H200 with 640 threads at 40 / 112)."""
    cfg = rs.Config(ROWS=rows, TILES=tiles)
    entry = warpgroup.entry_registers(cfg.threads)
    assert entry * cfg.threads <= warpgroup.REGISTER_FILE and entry % 8 == 0
    assert cfg.consumers * (cfg.consumer_registers - entry) <= entry - rs.PRODUCER_REGISTERS
    assert cfg.consumer_registers % 8 == 0 and cfg.consumer_registers >= entry
    assert (cfg.threads, cfg.consumer_registers) == {128: (384, 224), 256: (640, 104)}[
        rows // tiles]


@pytest.mark.parametrize("M, N, K, match", [
    (129, 256, 512, "M <= N_ACT = 128.*got M=129"), (0, 256, 512, "got M=0"),
    (16, 196, 512, "N % 8 == 0 .16-byte rows of D., got N=196"),
    (16, 256, 392, "multiple of 16 .the scale block., got K=392")])
def test_config_rejects_unsupported_shapes(M, N, K, match):
    assert not rs.supports(M, N, K)
    with pytest.raises(ValueError, match=match):
        sm90_tuning.register_a_config(M, N, K)


def test_partial_row_blocks_take_n_tail():
    """N % 128 != 0 (gpt-oss's 2880, the issue's 136 and 4000): `Config.N_TAIL`, a partial last
    row block counted in the stream-K units; without it the Config refuses the shape; the
    dispatch picks it from 17 rows (the small-M kernel up to 16, where it takes K)."""
    cfg = sm90_tuning.register_a_config(16, 2880, 2880)
    assert cfg.N_TAIL and cfg.ROWS == 128 and rs.row_blocks(cfg, 2880) == 23
    assert rs.stream_units(cfg, 2880, 2880) == 23 * rs.k_stages(cfg, 2880)
    assert not sm90_tuning.register_a_config(16, 2944, 2880).N_TAIL
    with pytest.raises(ValueError, match="N=136 is not a multiple of ROWS = 128: the Config "
                                         "needs N_TAIL=True"):
        rs.check_shape(rs.Config(N_ACT=16), 16, 136, 256)
    assert sm90_tuning.hopper_path(True, 16, 2880, 2880, 132) == "small_m"  # (K's half step)
    assert sm90_tuning.hopper_path(True, 17, 2880, 2880, 132) == "register_a"
    assert sm90_tuning.hopper_path(False, 16, 4000, 8192, 132) == "small_m"
    assert sm90_tuning.hopper_path(True, 17, 4000, 8192, 132) == "register_a"
    assert sm90_tuning.hopper_path(True, 16, 7168, 2048, 132) == "small_m"  # (short K)
    assert sm90_tuning.check_hopper_path("register_a", True, 16, 2880, 2880,
                                        "bfloat16") == "register_a"


def test_partial_row_blocks_build_the_same_stores():
    """The N_TAIL build: the same wgmma and partial-sum stores (whole row blocks: the rows past
    N are zeros, which the reduction's row check leaves out of D), no spills."""
    whole, tail = rs.Config(N_ACT=64), rs.Config(N_ACT=64, N_TAIL=True)
    b0, b1 = (build(rs._launch, *rs.signature(c).compile_args(c), arch="sm_90a")
              for c in (whole, tail))
    assert b1.sass_count(r"\bHGMMA\b") == b0.sass_count(r"\bHGMMA\b") == 16
    assert b1.ptx_count(r"st\.global\.v4") == b0.ptx_count(r"st\.global\.v4") > 0
    assert all(r.local_bytes == 0 for r in b1.resources) and b1.sass_count(r"\bSTL\b") == 0


def test_config_rejects_bad_fields():
    for n_act in (12, 24, 136):
        with pytest.raises(ValueError, match=f"8 or a multiple of 16 up to 128, got {n_act}"):
            rs.Config(N_ACT=n_act)
    with pytest.raises(ValueError, match="out_dtype"):
        rs.Config(out_dtype="int8")
    with pytest.raises(ValueError, match="ROWS must be 128 or 256, got 192"):
        rs.Config(ROWS=192)
    with pytest.raises(ValueError, match="A_SETS must be 0 .auto., 1 or 2, got 3"):
        rs.Config(A_SETS=3)
    with pytest.raises(ValueError, match="TILES must be 1 or 2, got 3"):
        rs.Config(TILES=3)
    with pytest.raises(ValueError, match="PERMUTE must be 'auto', 'stage' or 'call', got 'x'"):
        rs.Config(PERMUTE="x")


def test_permute_mode():
    """The activations are permuted per stage by the permuting warps up to N_ACT = 16, once per
    call by `_permute_kernel` beyond (measured, `CALL_PERMUTE_MIN_N_ACT`), or as configured."""
    assert rs.Config(N_ACT=16).permute == "stage" and rs.Config(N_ACT=8).permute == "stage"
    assert rs.Config(N_ACT=32).permute == "call" and rs.Config(N_ACT=128).permute == "call"
    assert rs.Config(N_ACT=64, PERMUTE="stage").permute == "stage"


def test_a_register_sets():
    """Two A sets where they fit the consumer registers (ptxas would serialize the wgmma
    otherwise: `test_register_a_wgmma_fed_by_tma_without_spills`), else one; or as configured."""
    assert rs.Config(N_ACT=128).a_sets == 2 and rs.Config(N_ACT=16, ROWS=256).a_sets == 2
    assert rs.Config(N_ACT=32, ROWS=256).a_sets == 1 and rs.Config(N_ACT=80, ROWS=256).a_sets == 1
    assert rs.Config(N_ACT=16, ROWS=256, A_SETS=1).a_sets == 1
    assert rs.Config(N_ACT=128, ROWS=256, TILES=2).a_sets == 1


# --- compile (CPU, sm_90a) --------------------------------------------------------------------

CONFIGS = {"n8": rs.Config(N_ACT=8), "n16": rs.Config(N_ACT=16), "n48": rs.Config(N_ACT=48),
           "n64": rs.Config(N_ACT=64), "n128": rs.Config(N_ACT=128),
           "n16_fp32": rs.Config(N_ACT=16, out_dtype="float32"),
           "n16_r256": rs.Config(N_ACT=16, ROWS=256), "n64_r256": rs.Config(N_ACT=64, ROWS=256),
           "n80_r256": rs.Config(N_ACT=80, ROWS=256),
           "n16_r256_call": rs.Config(N_ACT=16, ROWS=256, PERMUTE="call"),
           "n64_stage": rs.Config(N_ACT=64, PERMUTE="stage"),
           "n128_r256_t2": rs.Config(N_ACT=128, ROWS=256, TILES=2),
           "n16_r256_pdl": rs.Config(N_ACT=16, ROWS=256, PDL=True),
           "n16_r256_pdl_early": rs.Config(N_ACT=16, ROWS=256, PDL=True, EARLY_WEIGHTS=True),
           "n64_r256_pdl": rs.Config(N_ACT=64, ROWS=256, PDL=True)}


@pytest.fixture(scope="module", params=list(CONFIGS))
def built(request):

    cfg = CONFIGS[request.param]
    return cfg, build(rs._launch, *rs.signature(cfg).compile_args(cfg), arch="sm_90a")


def test_register_a_wgmma_fed_by_tma_without_spills(built):
    cfg, b = built
    per_call = cfg.permute == "call"
    main = [k for k in b.resources if "reduce" not in k.name and "permute" not in k.name]
    assert len(main) == 1 and len(b.resources) == 2 + per_call  # the reduction (and permute)
    # 2 x 8 wgmma per stage and tile, A from registers (an R operand, not a descriptor), B from
    # shared memory.
    mmas = 16 * cfg.TILES
    assert b.sass_count(rf"HGMMA\.64x{cfg.N_ACT}x16\.F32\.BF16 R\d+, R\d+, gdesc") == mmas
    assert b.sass_count(r"\bHGMMA\b") == mmas
    assert b.ptx_count(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16 ") == mmas
    # not serialized by ptxas (a full wait after each wgmma): full waits only after each batch
    # with one A set (2 per tile) and in the finish
    assert b.sass_count(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0") <= 2 * cfg.TILES + 1
    # TMA tile loads per stage: weights, each band's scales and the activations in 64-column
    # (128-byte, one swizzle span) boxes; no global vector loads but the reduction's
    # REDUCE_AHEAD (coherent: the partials are the GEMM's output) and the permute kernel's 4
    # (natural chunks) and its 4 + 4 stores (permuted chunks; zero rows past M, `_zero_rows`,
    # for the tiled kernel's whole tiles); the partial store: a 16-byte vector per 4 accumulator
    # elements (fragment order, `rs.partial_vector`), no per-element stores.
    tma_loads = 1 + cfg.bands + rs.STAGE_K // 64
    assert b.ptx_count(r"cp\.async\.bulk\.tensor\.2d") == tma_loads
    assert b.sass_count(r"\bUTMALDG\b") == tma_loads
    assert b.ptx_count(r"ld\.global\.nc\S*\.v4") == 4 * per_call
    assert b.ptx_count(r"ld\.global\.L1::evict_first\.v4") == 4 * rs.REDUCE_AHEAD
    fp32 = cfg.out_dtype == "float32"  # (the reduction's 4 vectors of D: 16 or 8 bytes)
    assert b.ptx_count(r"st\.global\.v4") == 8 * per_call + cfg.TILES * cfg.N_ACT // 8 + 4 * fp32
    assert b.ptx_count(r"st\.global\.v2\.b32") == 4 * (not fp32)
    assert b.ptx_count(r"st\.global\.(f32|b16)") == 0
    # PDL: the reduction launches early and waits for the partials; the GEMM waits (a no-op
    # without PDL) for the permute kernel, which waits for the kernel before it. With
    # Config.PDL the reduction lets the next call's GEMM launch too.
    assert b.ptx_count(r"griddepcontrol\.launch_dependents") == 1 + per_call + cfg.PDL
    assert b.ptx_count(r"griddepcontrol\.wait") == 2 + per_call
    # A row block's first wgmma (per tile) overwrites the accumulator under a run-time predicate.
    assert b.sass_count(r"HGMMA\.\S+ R\d+, R\d+, gdesc\[UR\d+\], R\d+, !?UPT?\d") == cfg.TILES
    # Consumers: 2 LDS.128 of weights per 128-K block and tile; permuting warps: 4 LDS.128 + 4
    # STS.128.
    assert b.ptx_count(r"ld\.shared\.v4\.u32") == 2 * 2 * cfg.TILES + 4 * (not per_call)
    assert b.ptx_count(r"st\.shared\.v4\.u32") == 4 * (not per_call)
    assert b.ptx_count(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{rs.PRODUCER_REGISTERS}") == 1
    assert b.ptx_count(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{cfg.consumer_registers}") == 1
    # ptxas honours setmaxnreg only knowing the register count at entry (`ops.warpgroup`)
    assert b.ptx_count(r"\.minnctapersm 1") == 2  # (the reduction: its loads in flight)
    assert b.sass_count(r"USETMAXREG\.DEALLOC") == 1 and b.sass_count(r"USETMAXREG\.TRY_ALLOC") == 1
    assert b.ptx_count(rf"\.reqntid {cfg.threads}, 1, 1") == 1
    assert b.ptx_count(r"cvt\.\w+\.e2m1") == 0  # no FP4 conversion on sm_90a
    assert all(k.local_bytes == 0 and k.stack_bytes == 0 for k in b.resources)
    assert b.sass_count(r"\bSTL\b") == 0 and b.sass_count(r"\bLDL\b") == 0


def test_decode_instruction_budget(built):
    """Per 8 weight codes (the strided decode) 4 exact bf16x2 multiplies; per scale pair one
    byte permute and 2 multiplies (the broadcasts fold into operand selects); the permuting
    warps re-pair 4 chunks with at most 16 byte permutes."""
    cfg, b = built
    words = 2 * 2 * 4 * cfg.TILES  # 2 rows x 2 blocks x 4 words per thread, stage and tile
    assert b.sass_count(r"\bHMUL2\b") == 4 * words + 2 * 2 * 2 * cfg.TILES
    assert b.sass_count(r"PRMT R\d+, R\d+, 0x4140") == 2 * 2 * cfg.TILES
    assert b.sass_count(r"PRMT R\d+, R\d+, 0x(5410|7632)") <= 16


def test_fast_argument_packing_matches_dsl():
    rs.compile_launcher(rs.Config(N_ACT=16), options="--gpu-arch sm_90a")
    rs.compile_launcher(rs.Config(N_ACT=16, a_format="nvfp4"), options="--gpu-arch sm_90a")


def _entries(ptx: str) -> dict:
    """{kernel symbol: its PTX body with the symbol replaced} (bodies comparable across
    configs whose symbols differ)."""
    out = {}
    for chunk in re.split(r"(?=\.visible \.entry )", ptx)[1:]:
        name = re.match(r"\.visible \.entry (\w+)\(", chunk).group(1)
        body = "\n".join(line for line in chunk.splitlines() if not line.lstrip().startswith("//"))
        out[name] = body.replace(name, "KERNEL")
    return out


@pytest.mark.parametrize("n_act, rows", [(16, 128), (64, 256)])
def test_w4a4_decodes_in_the_permute_pass(n_act, rows):
    """W4A4 (`a_format` "nvfp4") replaces the permute kernel by the decode-permute kernel and
    runs the W4A16 GEMM and reduction unchanged (the same PTX bodies); the decode pass reads
    per thread 4 words of codes and 4 scale bytes (plus the two global scales) and writes 4
    16-byte chunks, with no spills."""
    w16 = rs.Config(N_ACT=n_act, ROWS=rows, PERMUTE="call")
    w4 = dataclasses.replace(w16, PERMUTE="auto", a_format="nvfp4")
    assert w4.permute == "call"
    b16 = build(rs._launch, *rs.signature(w16).compile_args(w16), arch="sm_90a")
    b4 = build(rs.launch_fn(w4), *rs.signature(w4).compile_args(w4), arch="sm_90a")
    e16, e4 = _entries(b16.ptx), _entries(b4.ptx)
    pick = lambda e, tag: [v for k, v in e.items() if tag in k]  # noqa: E731
    for tag in ("__kernel_", "_reduce_kernel"):
        assert pick(e16, tag) == pick(e4, tag) and len(pick(e4, tag)) == 1
    (dec,) = pick(e4, "_decode_permute_kernel")
    assert len(re.findall(r"ld\.global\.b32", dec)) == 4 + 2  # codes, gA and gB
    assert len(re.findall(r"ld\.global\.u8", dec)) == 4
    assert len(re.findall(r"st\.global\.v4", dec)) == 4 + 4  # permuted chunks, zero rows
    assert len(re.findall(r"mul\.rn\.bf16x2", dec)) >= 4 * 4  # the exact decode, 4 per word
    assert all(k.local_bytes == 0 for k in b4.resources) and len(b4.resources) == 3
    with pytest.raises(ValueError, match="PERMUTE='stage'"):
        rs.Config(a_format="nvfp4", PERMUTE="stage")
    with pytest.raises(ValueError, match="a_format must be one of"):
        rs.Config(a_format="fp8")


# --- emulator (CPU, slow tier) -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("M, N, K, ctas, out_dtype", [
    (16, 128, 2048, 8, "float32"),  # one row block in 8 partials: two rounds of REDUCE_AHEAD
    (32, 256, 1280, 3, "float16"),  # shares of 3, 3, 4 units straddling two row blocks ("call")
    (16, 384, 2048, 6, "bfloat16"),  # the aligned grid of two shares per row block
])
def test_partials_sum_in_the_emulator(seed, M, N, K, ctas, out_dtype):
    """The GEMM, its partial sums and the reduction (with the permute pass where planned) run
    in the emulator on fresh random operands, D and the workspace poisoned first: every element
    within the product's bound in each output type, no hazard (the third grid is one the
    planner's rule can pick: aligned, `rounds.aligned`)."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize
    from tk_cute.tuning import rounds

    cfg = sm90_tuning.complete("register_a", sm90_tuning.register_a_config(M, N, K), N, K,
                               False, out_dtype, "ue4m3", False)
    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=g))
    a = torch.randn(M, K, generator=g).bfloat16()
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, out_dtype))
    machines = hopper.register_a(a, b, cfg, out, ctas)
    assert [h for m in machines for h in m.hazards] == []
    assert len(machines) == 2 + (cfg.permute == "call")
    assert not out.isnan().any()
    assert_gemm_close(out, a, b, f"ctas={ctas}")
    if (N, ctas) == (384, 6):
        assert rounds.aligned(rs.stream_units(cfg, N, K), rs.k_stages(cfg, K), ctas)


@pytest.mark.slow
@pytest.mark.parametrize("M, N, K, ctas", [(48, 256, 1280, 3), (17, 136, 512, 2)])
def test_pdl_stage_permute_in_the_emulator(seed, M, N, K, ctas):
    """pdl=True up to N_ACT = PDL_STAGE_MAX_N_ACT: the plan permutes per stage (48 and 32
    activation rows, shares straddling row blocks, a partial row block), launches as a
    programmatic dependent with early weight loads; in the emulator on fresh random operands,
    D and the workspace poisoned: every element within the product's bound, no hazard, and D
    bit for bit the per-call pass's (the same permuted activations, the same sums)."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize

    cfg = sm90_tuning.complete("register_a", sm90_tuning.register_a_config(M, N, K), N, K,
                               False, "bfloat16", "ue4m3", True)
    assert cfg.permute == "stage" and cfg.PDL and cfg.EARLY_WEIGHTS and cfg.N_ACT in (32, 48)
    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=g))
    a = torch.randn(M, K, generator=g).bfloat16()
    outs = []
    for c in (cfg, dataclasses.replace(cfg, PERMUTE="call", PDL=False, EARLY_WEIGHTS=False)):
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
        machines = hopper.register_a(a, b, c, out, ctas)
        assert [h for m in machines for h in m.hazards] == []
        assert len(machines) == 2 + (c.permute == "call")  # + the permute pass
        outs.append(out)
    assert_gemm_close(outs[0], a, b, f"ctas={ctas}")
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))  # the pass's D


@pytest.mark.slow
@pytest.mark.parametrize("M, N, K, ctas, w4a4, out_dtype", [
    (16, 512, 512, 4, False, "bfloat16"),  # one row block per CTA (permute "stage")
    (40, 392, 400, 2, False, "float32"),  # two per CTA, partial last block and K stage ("call")
    (24, 256, 768, 2, True, "bfloat16"),  # W4A4: D's scale from the decode pass
])
def test_direct_store_in_the_emulator(seed, M, N, K, ctas, w4a4, out_dtype):
    """`Config.DIRECT` (shares of whole row blocks): the GEMM stores D itself, no reduction
    launch, and D is bit for bit the one the planes and the reduction give (both run in the
    emulator on the same fresh random operands, D poisoned first), within the product's
    bound, no hazard."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize

    cfg = sm90_tuning.complete("register_a", sm90_tuning.register_a_config(M, N, K), N, K,
                               w4a4, out_dtype, "ue4m3", False)
    assert rs.whole_blocks(cfg, N, K, ctas) and not cfg.DIRECT
    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=g))
    a = torch.randn(M, K, generator=g).bfloat16()
    outs = []
    for c in (cfg, dataclasses.replace(cfg, DIRECT=True)):
        out = torch.full((M, N), float("nan"), dtype=getattr(torch, out_dtype))
        machines = hopper.register_a(quantize(a) if w4a4 else a, b, c, out, ctas)
        assert [h for m in machines for h in m.hazards] == []
        assert len(machines) == (c.permute == "call") + (1 if c.DIRECT else 2)
        outs.append(out)
    assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))
    assert_gemm_close(outs[1], quantize(a).dequantize() if w4a4 else a, b)


@pytest.mark.slow
@pytest.mark.parametrize("M, N, K, cluster, w4a4, out_dtype", [
    (16, 256, 1024, 4, False, "bfloat16"),  # 4 stages in 4 shares (permute "stage")
    (40, 392, 1040, 2, False, "float32"),  # 5 stages in 2 + 3, partial last block and stage
    (128, 512, 512, 2, False, "bfloat16"),  # 256-row blocks of two MMA tiles
    (24, 256, 2048, 8, True, "float16"),  # W4A4: D's scale from the decode pass
])
def test_cluster_sum_in_the_emulator(seed, M, N, K, cluster, w4a4, out_dtype):
    """`Config.CLUSTER`: the CTAs of a row block sum their partials through distributed shared
    memory, no workspace, no reduction launch; in the emulator on fresh random operands, D
    poisoned: every element within the product's bound, no hazard, and D bit for bit the
    stream-K grid's of as many CTAs (the same shares, even or not: the same partials summed in
    the same order) with its reduction."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize

    cfg = sm90_tuning.complete("register_a", sm90_tuning.register_a_config(M, N, K), N, K,
                               w4a4, out_dtype, "ue4m3", False)
    if (M, N) == (128, 512):
        assert cfg.ROWS == 256 and cfg.TILES == 2
    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=g))
    a = torch.randn(M, K, generator=g).bfloat16()
    outs = []
    for c in (dataclasses.replace(cfg, CLUSTER=cluster), cfg):
        out = torch.full((M, N), float("nan"), dtype=getattr(torch, out_dtype))
        machines = hopper.register_a(quantize(a) if w4a4 else a, b, c, out,
                                     rs.row_blocks(c, N) * cluster)
        assert [h for m in machines for h in m.hazards] == []
        assert len(machines) == (c.permute == "call") + (1 if c.CLUSTER > 1 else 2)
        assert not out.isnan().any()
        outs.append(out)
    assert_gemm_close(outs[0], quantize(a).dequantize() if w4a4 else a, b)
    assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))


@pytest.mark.slow
def test_emulated_dispatch_runs_the_planned_cluster_sum(seed):
    """The public dispatch as the H100 / H200 would run it (`emulator.gemm.gemm`, 132 SMs): at
    33 x 1024 x 1024 the plan sums in clusters of 4 (8 row blocks of 4 stages: the stream-K
    grid's 32 CTAs), launched as 8 clusters of 4; D within the product's bound, no hazard."""
    from tk_cute.emulator import gemm as G
    from tk_cute.nvfp4 import quantize

    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(1024, 1024, generator=g))
    a = torch.randn(33, 1024, generator=g).bfloat16()
    run = G.gemm(a, b, arch="sm_90a")
    assert run.kernel == "register_a" and run.config.CLUSTER == 4
    assert run.launch.grid == (32, 1, 1) and run.launch.cluster == (4, 1, 1)
    assert run.machine.hazards == []
    assert_gemm_close(run.out, a, b)


def test_cluster_sum_compiles_one_kernel_with_distributed_shared_loads():
    """With CLUSTER the GEMM is one kernel (no reduction), without spills or local memory, its
    sum reading each rank's 16-byte vectors from distributed shared memory between two cluster
    barriers; the host refuses other grids and too few stages, the Config DIRECT with it."""
    for cfg in (rs.Config(N_ACT=16, CLUSTER=4), rs.Config(N_ACT=64, ROWS=256, CLUSTER=2)):
        b = build(rs.launch_fn(cfg), *rs.signature(cfg).compile_args(cfg), arch="sm_90a")
        assert len(b.resources) == 1 + (cfg.permute == "call")
        assert all(k.local_bytes == 0 for k in b.resources)
        assert b.ptx_count(r"ld\.shared::cluster\.v4\.f32") == cfg.CLUSTER
        assert b.ptx_count(r"barrier\.cluster\.arrive") == 4  # (producer and consumer paths)
        assert b.ptx_count(r"ld\.global\.v4") == 0  # (no partials read back)
    w = random_weights(512, 1024, device="cpu")
    cfg = rs.Config(N_ACT=16, CLUSTER=4)
    assert rs.cluster_ctas(cfg, 512) == 16 and rs.partial_bytes(cfg, 512, 16) == 0
    with pytest.raises(ValueError, match="CLUSTER = 4 runs 16 CTAs"):
        launch.RegisterA(w, cfg, 16, ctas=8)
    with pytest.raises(ValueError, match="need as many 256-K stages, K=512 has 2"):
        rs.check_shape(cfg, 16, 512, 512)
    with pytest.raises(ValueError, match="CLUSTER must be one of"):
        rs.Config(CLUSTER=3)
    with pytest.raises(ValueError, match="one or the other"):
        rs.Config(CLUSTER=2, DIRECT=True)


def test_direct_store_is_planned_where_the_grid_gives_whole_row_blocks():
    """`complete(..., sms)` sets DIRECT exactly where the planned grid (`register_a_ctas`) gives
    every row block to one CTA (`whole_blocks`), over the real layers' register-A plans; the
    kernel then compiles without the reduction (one kernel fewer); a DIRECT Config on a grid
    that splits row blocks is refused at launch preparation."""
    from tk_cute.bench.nvfp4 import MODEL_LAYERS
    from tk_cute.nvfp4.gemm import _plan_hopper

    direct = 0
    for layers in MODEL_LAYERS.values():
        for _, N, K in layers:
            for M, w4a4 in itertools.product((9, 16, 48, 64, 96, 128), (False, True)):
                p = _plan_hopper(w4a4, M, N, K, "bfloat16", 132, False)
                if p.path != "register_a":
                    continue
                ctas = sm90_tuning.register_a_grid(p.config, N, K, 132)
                assert p.config.DIRECT == rs.whole_blocks(p.config, N, K, ctas)
                direct += p.config.DIRECT
    assert direct >= 20  # (Llama 3 8B gate_up, DeepSeek-V3 q_b and kv_b)
    cfg = rs.Config(N_ACT=16, DIRECT=True)
    b = build(rs.launch_fn(cfg), *rs.signature(cfg).compile_args(cfg), arch="sm_90a")
    base = build(rs.launch_fn(rs.Config(N_ACT=16)),
                 *rs.signature(rs.Config(N_ACT=16)).compile_args(rs.Config(N_ACT=16)),
                 arch="sm_90a")
    assert len(b.resources) == len(base.resources) - 1
    assert all(k.local_bytes == 0 for k in b.resources)
    assert b.ptx_count(r"ld\.global\.b32") == 1  # D's scale, once per row block written
    w = random_weights(512, 512, device="cpu")
    with pytest.raises(ValueError, match="DIRECT needs shares of whole row blocks"):
        launch.RegisterA(w, dataclasses.replace(cfg, N_ACT=16), 16, ctas=3)


# --- GPU --------------------------------------------------------------------------------------

SHAPES = [(128, 256), (384, 1024), (1024, 2048), (256, 4096)]
# Bounds: `tk_cute.testing.assert_gemm_close` (every element; derived in its docstring).



@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 9, 16, 33, 64, 100, 128])
@pytest.mark.parametrize("N, K", SHAPES)
def test_w4a16_matches_float64(seed, M, N, K):
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    d = launch.gemm_rs(a, b, out=out)
    assert d.data_ptr() == out.data_ptr()
    assert not d.isnan().any(), "unwritten or NaN outputs"
    assert_gemm_close(d, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 48, 128])  # activations permuted per stage / per call
@pytest.mark.parametrize("N", [384, 512])  # 128 / 256 rows per CTA (2 tiles at M = 128)
def test_fp32_output_share_invariance_and_determinism(seed, M, N):
    """Every CTA count (one CTA for all, shares that split row blocks unevenly, one unit per
    CTA) gives the same sum up to fp32 rounding; one CTA count is bitwise reproducible run to
    run (partials summed in CTA order). The row counts are forced (the plan's pick depends on
    M and N: `sm90_tuning.register_a_config`)."""
    K = 2048
    cfg = rs.Config(N_ACT=-(-M // 16) * 16, ROWS={384: 128, 512: 256}[N],
                    TILES=2 if (M, N) == (128, 512) else 1)
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    for ctas in (1, 5, 7, 24, None):
        out = torch.full((M, N), float("nan"), device="cuda")
        d = launch.gemm_rs(a, b, torch.float32, out=out, config=cfg, ctas=ctas)
        assert not d.isnan().any(), ctas
        assert_gemm_close(d, a, b, f"ctas={ctas}")
        assert torch.equal(d, launch.gemm_rs(a, b, torch.float32, config=cfg, ctas=ctas)), ctas
    d16 = launch.gemm_rs(a, b, torch.float16, config=cfg, ctas=7)
    assert d16.dtype == torch.float16
    assert_gemm_close(d16, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, cluster", [(16, 512, 2048, 4), (64, 2880, 2880, 4),
                                              (32, 3584, 3584, 2), (48, 576, 7168, 8),
                                              (128, 1024, 1024, 2)])
def test_cluster_sum_matches_float64(seed, M, N, K, cluster):
    """`Config.CLUSTER` on the GPU (clusters of 2-8 CTAs per row block, partial last blocks and
    stages, uneven splits): every element within the product's bound, D poisoned first; where
    the stages split evenly, bit for bit the stream-K grid of the same shares with its
    reduction kernel; run to run reproducible."""
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    pick = sm90_tuning.register_a_config(M, N, K)
    cfg = dataclasses.replace(pick, CLUSTER=cluster)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = launch.gemm_rs(a, b, out=out, config=cfg)
    assert not d.isnan().any()
    assert_gemm_close(d, a, b, f"CLUSTER={cluster}")
    assert torch.equal(d, launch.gemm_rs(a, b, config=cfg))
    if rs.k_stages(cfg, K) % cluster == 0:
        ref = launch.gemm_rs(a, b, config=pick, ctas=rs.cluster_ctas(cfg, N))
        assert torch.equal(d.view(torch.int16), ref.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("M, N", [(16, 512), (40, 384), (128, 256)])
def test_permute_modes_agree_bitwise(seed, M, N):
    """Permuting per stage (in shared memory) and once per call (`_permute_kernel`) put the same
    activations at the same columns: identical bits."""
    import dataclasses

    K = 2048
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    cfg = sm90_tuning.register_a_config(M, N, K)
    outs = []
    for mode in ("stage", "call"):
        out = torch.full((M, N), float("nan"), device="cuda")
        outs.append(launch.gemm_rs(a, b, torch.float32, out=out,
                               config=dataclasses.replace(cfg, PERMUTE=mode)))
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(9, 256, 512), (16, 512, 2048), (100, 1024, 1024),
                                     (128, 256, 4096), (32, 256, 2880), (64, 512, 160)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_w4a4_in_kernel_decode_equals_w4a16_on_decoded_activations(seed, M, N, K, out_dtype):
    """W4A4 on the register-A kernel (activations decoded in its permute pass, D's scale
    gA * gB * 2^8 written by that pass) is bit for bit the W4A16 kernel on the exactly decoded
    activations with D's scale gA * gB (the power-of-two scalings are exact: docstring of
    `_decode_permute_kernel`); and within the exact product's bound."""
    import dataclasses

    from tk_cute.nvfp4 import quantize

    b = random_weights(N, K)
    a = quantize(torch.randn(M, K, device="cuda"))
    cfg = sm90_tuning.register_a_config(M, N, K, str(out_dtype).removeprefix("torch."))
    w4 = dataclasses.replace(cfg, a_format="nvfp4")
    w16 = dataclasses.replace(cfg, PERMUTE="call")
    d4 = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    launch.register_a(a, b, d4, w4)
    d16 = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    launch.register_a(launch.dequantize_blocks(a), b, d16, w16, gsb=a.global_scale * b.global_scale)
    assert not d4.isnan().any() and torch.equal(d4, d16)
    assert_gemm_close(d4, a, b, "W4A4 register-A, in-kernel decode")


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(1, 256, 2880), (16, 512, 160), (48, 384, 2912),
                                     (128, 256, 32), (64, 512, 8320)])
def test_k_tail_matches_float64(seed, M, N, K):
    """K % 256 != 0 (the last stage partial, both permute modes, 128 and 256 rows per CTA):
    every element within the exact product's bound, every one written."""
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    cfg = sm90_tuning.register_a_config(M, N, K)
    assert cfg.K_TAIL
    d = launch.gemm_rs(a, b, out=out)
    assert d.data_ptr() == out.data_ptr()
    assert_gemm_close(d, a, b, f"K tail {M}x{N}x{K} ({cfg.permute})")


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(1, 2880, 2880), (16, 136, 48), (65, 4000, 8192),
                                     (128, 8, 256), (100, 2880, 8208), (9, 1000, 512)])
def test_partial_row_blocks_match_float64(seed, M, N, K):
    """N % 128 != 0: every element of bf16 / fp32 D within the exact product's bound, nothing
    written past the M x N output (a poisoned guard after it stays NaN), W4A16 and W4A4 (through
    the public `gemm(path="register_a")`)."""
    from tk_cute import nvfp4

    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    assert sm90_tuning.register_a_config(M, N, K).N_TAIL
    for out_dtype in (torch.bfloat16, torch.float32):
        flat = torch.full((M * N + 4096,), float("nan"), device="cuda", dtype=out_dtype)
        d = launch.gemm_rs(a, b, out=flat[:M * N].view(M, N))
        assert_gemm_close(d, a, b, f"N tail {M}x{N}x{K} {out_dtype}")
        assert flat[M * N:].isnan().all(), "a store past the output"
        aq = nvfp4.quantize(a.float())
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
        assert_gemm_close(nvfp4.gemm(aq, b, out_dtype, out=out, path="register_a"), aq, b,
                          f"W4A4 N tail {M}x{N}x{K}")


@pytest.mark.gpu
def test_chained_calls_read_the_previous_output(seed):
    """A call whose activations are the previous call's output (its reduction kernel) reads them
    complete: the permute kernel, launched with PDL, waits for the kernel before it."""
    M, K = 32, 512
    b1, b2 = random_weights(1024, K), random_weights(256, 1024)
    a = torch.randn(M, K, device="cuda").bfloat16()
    assert sm90_tuning.register_a_config(M, 256, 1024).permute == "call"
    for _ in range(3):
        d1 = launch.gemm_rs(a, b1)
        d2 = launch.gemm_rs(d1, b2)  # back to back on the stream
        torch.cuda.synchronize()
        assert torch.equal(d2, launch.gemm_rs(d1.clone(), b2))


def test_pdl_reads_nothing_before_the_wait_but_the_first_weights(built):
    """In the SASS (ptxas moves read-only loads above ``griddepcontrol.wait``) the reduction and
    the permute pass read nothing above their wait, nor does the GEMM where it waits before its
    first weights (PDL, permute "stage", no EARLY_WEIGHTS); elsewhere the GEMM asks only for its
    first unit's weights and scales (TMA) before it."""
    cfg, b = built
    for name, reads in b.reads_before_pdl_wait().items():
        if "reduce" in name or "permute" in name or cfg.waits_before_weights:
            assert reads == [], name
        else:
            assert set(reads) <= {"UTMALDG.2D"} and len(reads) <= 1 + cfg.bands, (name, reads)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 48])  # activations permuted per stage / per call
@pytest.mark.parametrize("ctas", [None, 8])  # one unit per CTA, or 8
@pytest.mark.parametrize("early", [False, True])  # EARLY_WEIGHTS (pdl=True)
def test_pdl_chain_reads_each_activation_after_its_producer(seed, M, ctas, early):
    """PDL calls chained through their outputs (call i + 1's activations are call i's
    output, written by its reduction, during which the next GEMM may launch and, with
    EARLY_WEIGHTS, ask for its first unit's weights): every link matches the float64 product
    of the activations it was given, and every output element is written."""
    import dataclasses

    N = K = 2048
    b = random_weights(N, K)
    # (the host's pdl: stage only)
    cfg = dataclasses.replace(sm90_tuning.register_a_config(M, N, K), PDL=True,
                              EARLY_WEIGHTS=early)
    xs = [torch.randn(M, K, device="cuda").bfloat16()]
    outs = [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(4)]  # poison
    for out in outs:
        xs.append(launch.gemm_rs(xs[-1], b, out=out, config=cfg, ctas=ctas))
    torch.cuda.synchronize()
    for x, d in zip(xs, xs[1:]):
        assert not d.isnan().any(), "unwritten or NaN outputs"
        assert_gemm_close(d, x, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [17, 64, 128])  # (9-16 rows of K <= 4096: the small-M kernel)
def test_public_gemm_dispatches_here(seed, M):
    from tk_cute.nvfp4 import gemm, plan

    b = random_weights(256, 1024)
    a = torch.randn(M, 1024, device="cuda").bfloat16()
    assert plan(a, b).path == "register_a"
    assert torch.equal(gemm(a, b), launch.gemm_rs(a, b))
    assert torch.equal(gemm(a, b, pdl=True), launch.gemm_rs(a, b))  # same sums, in the same order


@pytest.mark.gpu
def test_rejects_bad_input():
    b = random_weights(256, 512)
    a = torch.randn(16, 512, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="K mismatch"):
        launch.gemm_rs(a[:, :256], b)
    with pytest.raises(ValueError, match="one device"):
        launch.gemm_rs(a.cpu(), b)
    with pytest.raises(ValueError, match="CUDA device"):
        launch.gemm_rs(a.cpu(), b.to("cpu"))
    # (the default Config takes N % 128 != 0, `Config.N_TAIL`; a forced one is completed with
    # the shape's tails by `sm90_tuning.complete`, and the kernel's check refuses one without)
    with pytest.raises(ValueError, match="N=160 is not a multiple of ROWS = 128: the Config "
                                         "needs N_TAIL=True"):
        rs.check_shape(rs.Config(N_ACT=16), 4, 160, 512)
    with pytest.raises(ValueError, match="N=384 is not a multiple of ROWS = 256"):
        launch.gemm_rs(a, random_weights(384, 512), config=rs.Config(ROWS=256))
    with pytest.raises(ValueError, match="ctas >= 1, got ctas=0"):
        launch.gemm_rs(a, b, ctas=0)
    with pytest.raises(ValueError, match="got M=129"):
        launch.gemm_rs(torch.randn(129, 512, device="cuda").bfloat16(), b)
    with pytest.raises(ValueError, match="N_ACT = 16.*got M=17"):
        launch.gemm_rs(torch.randn(17, 512, device="cuda").bfloat16(), b, config=rs.Config())
    with pytest.raises(TypeError, match="bfloat16"):
        launch.gemm_rs(a.half(), b)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, w4a4", [(16, 32768, 512, False), (16, 32768, 512, True),
                                           (64, 24576, 1536, False), (9, 28672, 4096, False)])
def test_direct_store_is_the_reductions_d_on_the_gpu(seed, M, N, K, w4a4):
    """Where the planner stores D from the GEMM (`Config.DIRECT`: DeepSeek-V3's kv_b and q_b,
    Llama 3 8B's gate_up), D is bit for bit the planes-and-reduction path's on the same grid,
    both poisoned first, and within the product's bound."""
    from tk_cute import nvfp4

    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    x = nvfp4.quantize(a) if w4a4 else a
    p = nvfp4.plan(x, b)
    assert p.path == "register_a" and p.config.DIRECT
    d = nvfp4.gemm(x, b, out=torch.full((M, N), float("nan"), device="cuda",
                                        dtype=torch.bfloat16))
    ref = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch.register_a(x, b, ref, dataclasses.replace(p.config, DIRECT=False))
    assert torch.equal(d.view(torch.uint8), ref.view(torch.uint8))
    assert_gemm_close(d, x.dequantize() if w4a4 else a, b)


@pytest.mark.parametrize("w4a4", (False, True))
def test_split_tile_from_its_k(w4a4):
    """At 113-128 rows on 8 weight bands or more the split tile takes K from SPLIT_TILE_MIN_K,
    the register-A kernel below it (its two-tile warpgroups at 128 rows on 256-row bands)."""
    k = sm90_tuning.SPLIT_TILE_MIN_K
    for M in (sm90_tuning.SPLIT_TILE_MIN_M, rs.MAX_M):
        assert sm90_tuning.hopper_path(w4a4, M, 32768, k - 16, 132) == "register_a"
        assert sm90_tuning.hopper_path(w4a4, M, 32768, k, 132) == "register_a_tiled"
        assert sm90_tuning.hopper_path(w4a4, M, 7168, k, 132) == "register_a_tiled"
    assert sm90_tuning.register_a_config(128, 32768, 512).TILES == 2
