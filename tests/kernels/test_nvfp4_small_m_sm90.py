"""Small-M NVFP4 GEMM for Hopper (kernels/gemm/nvfp4_small_m_sm90.py).

CPU tier (the register decode's host model is in tests/tk_cute/ops/test_nvfp4_ops.py): host
models of the index maps and of the whole kernel's data flow; sm_90a compiles from fake tensors
assert 16-byte loads, mma.sync, a fence-free shared-memory split-K and 0 spills; shape rules.
GPU tier (marker gpu): W4A16 against a float64 product of deq(b), W4A4 against `gemm_reference`,
poisoned outputs, split-K invariance and bad input.
"""

import dataclasses
import itertools

import pytest
import torch
from tk_cute.kernels.gemm import nvfp4_small_m_sm90 as gv

from tk_cute.compile import build
from tk_cute.nvfp4 import launch
from tk_cute.testing import assert_gemm_close, random_weights
from tk_cute.tuning import sm90 as sm90_tuning

# --- host model of the index maps (the kernel's own formulas, evaluated on Python ints) -------
# PTX ISA, mma.m16n8k16 with .bf16 (lane = 4 g + t): A register r (a bf16x2) holds row
# g + 8 (r % 2); B registers hold column g; C register i is element (g + 8 (i // 2), 2 t + i % 2).
# The kernel passes A registers [lo, hi, lo, hi] (lo = weight_row h=0, hi = h=1).


def _c_elem(lane, i):
    return lane // 4 + 8 * (i // 2), 2 * (lane % 4) + i % 2


def _tilings():
    """Every MT x NT x WN whose partial fits one CTA (S = 1)."""
    for mt in (1, 2, 4):
        for nt in (1, 2, 4, 8):
            for wn in (1, 4, 8):
                try:
                    cfg = gv.Config(MT=mt, NT=nt, WN=wn)
                except ValueError:  # its partial does not fit one CTA's shared memory
                    continue
                yield cfg


INDEX_CONFIGS = sorted({sm90_tuning.small_m_config(M, 8192, 8192) for M in range(1, 65)}
                       | {sm90_tuning.small_m_config(M, 96, 8192) for M in range(1, 65)}
                       | set(_tilings()), key=repr)


@pytest.mark.parametrize("cfg", INDEX_CONFIGS, ids=lambda c: f"MT{c.MT}NT{c.NT}WN{c.WN}")
def test_partials_follow_the_mma_layout_and_cover_the_block_once(cfg):
    """Every accumulator register is the product of the weight row its A-fragment lanes loaded
    and the activation row its B-fragment lanes loaded, and the CTA's registers cover the
    (rows x m_pad) block of partials exactly once."""
    seen = {}
    for warp in range(cfg.WN):
        for lane in range(32):
            for mt in range(cfg.MT):
                for nt in range(cfg.NT):
                    for i in range(4):
                        row, m = gv.acc_coord(cfg, warp, lane, mt, nt, i)
                        r, c = _c_elem(lane, i)
                        for t in range(4):  # every lane of group r % 8 loads that A row ...
                            assert row == gv.weight_row(cfg, warp, 4 * (r % 8) + t, mt, r // 8)
                            assert m == gv.act_row(nt, 4 * c + t)  # ... and of group c, B col
                        if i % 2:  # st.v2 of registers 2h, 2h+1: adjacent slot words
                            assert gv.slot_index(cfg, 1, row, m) == \
                                gv.slot_index(cfg, 1, *gv.acc_coord(cfg, warp, lane, mt, nt,
                                                                    i - 1)) + 1
                        assert (row, m) not in seen, (row, m)
                        seen[(row, m)] = 1
    assert set(seen) == {(n, m) for n in range(cfg.rows) for m in range(cfg.m_pad)}


def _with_splits(configs, splits):
    """(cfg with S) for every S that fits one CTA (warps, shared memory)."""
    for cfg in configs:
        for S in splits:
            if cfg.fits(S):
                yield dataclasses.replace(cfg, S=S)


@pytest.mark.parametrize("cfg", list(_with_splits(INDEX_CONFIGS, (1, 2, 8)))
                         + [sm90_tuning.small_m_config(M, 576, 7168) for M in (1, 4)]
                         + [gv.Config(MT=1, NT=8, WN=2, S=3, CLUSTER=8)],
                         ids=lambda c: f"MT{c.MT}NT{c.NT}WN{c.WN}S{c.S}C{c.CLUSTER}")
def test_reduction_reads_every_partial_once(cfg):
    """The final loop (reduce_trips x threads, 4 columns each, over the CLUSTER CTAs of a row
    block) covers rows x m_pad once (an early version summed only half of the block: rows M >=
    m_pad / 2 were never read), the ranks' shares of the first columns (M = 1: m0 = 0) within
    one sum of each other; with CLUSTER each CTA's sum of its slices (`_sum_slices`, one CTA's
    loop) covers them once too."""
    for ranks in {cfg.CLUSTER, 1}:
        seen, first = [], [0] * ranks
        for it, rank in itertools.product(range(gv.reduce_trips(cfg, ranks)), range(ranks)):
            for tidx in range(cfg.threads):
                row, m0 = gv.reduce_coord(cfg, it, tidx, rank, ranks)
                assert m0 % 4 == 0
                if m0 < cfg.m_pad:
                    assert row < cfg.rows
                    seen += [(row, m0 + e) for e in range(4)]
                    first[rank] += m0 == 0
        assert len(seen) == len(set(seen))
        assert set(seen) == {(n, m) for n in range(cfg.rows) for m in range(cfg.m_pad)}
        assert max(first) - min(first) <= 1, first


def test_warp_roles_and_slots_are_bijections():
    """Warps -> (row group, K-slice) and (slice, row, column) -> the shared buffer, each once."""
    cfg = gv.Config(MT=1, NT=2, WN=2, S=3)
    assert sorted(gv.warp_role(cfg, w) for w in range(cfg.threads // 32)) == \
        [(wn, s) for wn in range(cfg.WN) for s in range(cfg.S)]
    idx = [gv.slot_index(cfg, s, n, m) for s in range(cfg.S) for n in range(cfg.rows)
           for m in range(cfg.m_pad)]
    assert sorted(idx) == list(range(cfg.part_bytes // 4))


@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_k_permutation_covers_each_trip_once(unroll):
    """Threads t = 0..3 x steps u hold 32 contiguous K elements each; together one trip."""
    starts = sorted(gv.k_offset(t, u) for t in range(4) for u in range(unroll))
    assert starts == list(range(0, gv.STEP_K * unroll, 32))


@pytest.mark.parametrize("t", range(4))
def test_scale_steps_follow_the_blocked_layout(t):
    """The kernel addresses scale pairs as band_offset(first K) + scale_step(trip/step K):
    equal to band_offset of the true K element, for rows across bands and K across atoms."""
    from tk_cute.layouts import nvfp4_scales

    K = 2048
    for n in (0, 5, 31, 32, 127, 128, 300):
        for k_begin in (0, 512, 1024):
            base = nvfp4_scales.band_offset(n, (k_begin + gv.k_offset(t, 0)) // 16, K // 64)
            for trip in range(2):
                for u in range(4):
                    dk = trip * 512 + gv.k_offset(0, u)
                    k = k_begin + gv.k_offset(t, 0) + dk
                    assert base + gv.scale_step(dk) == nvfp4_scales.band_offset(n, k // 16,
                                                                                K // 64)


@pytest.mark.parametrize("S", [1, 2, 4])
@pytest.mark.parametrize("M", [1, 3, 7, 8, 9, 16, 17, 33, 64])
def test_host_model_of_the_whole_kernel(M, S):
    """Simulate the kernel's data flow on the host with its own index maps: warp roles,
    fragments, MMA, the K-slices' partials in shared memory, their sum and the m < M store;
    compare with X @ W^T."""
    N, K = 64, 8  # K: one dot product per split (the K permutation is modelled elsewhere)
    g = torch.Generator().manual_seed(M)
    w = torch.randn(N, S * K, generator=g, dtype=torch.float64)
    x = torch.randn(M, S * K, generator=g, dtype=torch.float64)
    cfg = dataclasses.replace(sm90_tuning.small_m_config(M, N, 1024), WN=2, S=S)
    assert M <= cfg.m_pad and N % cfg.rows == 0
    out = torch.full((M, N), float("nan"), dtype=torch.float64)
    for rb in range(N // cfg.rows):
        n_blk = rb * cfg.rows
        part = torch.full((cfg.part_bytes // 4,), float("nan"), dtype=torch.float64)
        for wid in range(cfg.threads // 32):
            wn, s = gv.warp_role(cfg, wid)
            ks = slice(s * K, (s + 1) * K)
            for mt in range(cfg.MT):
                for nt in range(cfg.NT):
                    # A rows r: loaded by lanes 4 (r % 8) + t, half r // 8; B columns c: 4 c + t
                    a = torch.stack([w[n_blk + gv.weight_row(cfg, wn, 4 * (r % 8), mt, r // 8),
                                       ks] for r in range(16)])
                    b = torch.stack([x[min(gv.act_row(nt, 4 * c), M - 1), ks] for c in range(8)])
                    c_tile = a @ b.t()
                    for lane in range(32):
                        for i in range(4):
                            row, m = gv.acc_coord(cfg, wn, lane, mt, nt, i)
                            if m - i % 2 < M:  # the kernel stores pairs (m, m + 1) from m < M
                                part[gv.slot_index(cfg, s, row, m)] = c_tile[_c_elem(lane, i)]
        for it in range(gv.reduce_trips(cfg)):
            for tidx in range(cfg.threads):
                row, m0 = gv.reduce_coord(cfg, it, tidx)
                for e in range(4):
                    if m0 + e < M:
                        out[m0 + e, n_blk + row] = sum(
                            part[gv.slot_index(cfg, k, row, m0 + e)] for k in range(S))
    assert not out.isnan().any()
    torch.testing.assert_close(out, x @ w.t(), rtol=1e-12, atol=1e-12)


# --- compile (CPU, sm_90a) ------------------------------------------------------------------

CONFIGS = {
    "m8": sm90_tuning.small_m_config(8, 8192, 8192),
    "m16": sm90_tuning.small_m_config(16, 8192, 8192),
    "m64": sm90_tuning.small_m_config(64, 8192, 8192),
    "m16_w4a4": sm90_tuning.small_m_config(16, 8192, 8192, w4a4=True),
    "m1_fp32": sm90_tuning.small_m_config(1, 4096, 4096, out_dtype="float32"),
    "m1_no_ahead": dataclasses.replace(sm90_tuning.small_m_config(1, 8192, 8192), AHEAD=False,
                                      MIN_CTAS=0),
    "m16_wn1": sm90_tuning.small_m_config(16, 8160, 8192),
    "m1": sm90_tuning.small_m_config(1, 8192, 8192),
    "m1_pdl_early": dataclasses.replace(sm90_tuning.small_m_config(1, 8192, 8192),
                                        EARLY_WEIGHTS=True),  # pdl=True
    "m16_no_pdl": dataclasses.replace(sm90_tuning.small_m_config(16, 8192, 8192), PDL=False),
    "m16_pdl_early": dataclasses.replace(sm90_tuning.small_m_config(16, 8192, 8192),
                                         EARLY_WEIGHTS=True),
    "m1_w4a4": sm90_tuning.small_m_config(1, 8192, 8192, w4a4=True),  # staged, decoded once
    "m1_w4a4_global_x": dataclasses.replace(sm90_tuning.small_m_config(1, 8192, 8192, w4a4=True),
                                            XSMEM=0),
    # the uneven K split (74 chunks in 15 slices), the most warps one plans
    "m1_uneven": sm90_tuning.small_m_config(1, 3584, 18944),
    "m8_w4a4_uneven": sm90_tuning.small_m_config(8, 3584, 18944, w4a4=True),
    # K % 128 == 64 (gpt-oss's 2880): the half step after the first slice's trips
    "m1_k_tail": sm90_tuning.small_m_config(1, 5120, 2880),
    # Qwen2.5-72B's down projection: 231 steps, UNROLL = 2 and one step past the trips
    "m1_rest": sm90_tuning.small_m_config(1, 8192, 29568),
    "m8_rest_pdl_early": dataclasses.replace(sm90_tuning.small_m_config(8, 8192, 29568),
                                             EARLY_WEIGHTS=True),
    # DeepSeek-V3's kv_a (N = 576, 28 chunks): S = 14, not the aim's 28 warps (72 registers:
    # 83 spills per trip), and W4A4 at 16 rows (two activation tiles decoded per trip)
    "m1_narrow": sm90_tuning.small_m_config(1, 576, 7168),  # K split over clusters of 4
    "m4_w4a4_narrow": sm90_tuning.small_m_config(4, 576, 7168, w4a4=True),
    "m16_w4a4_narrow": sm90_tuning.small_m_config(16, 576, 7168, w4a4=True),
    "m8_w4a4_k_tail": sm90_tuning.small_m_config(8, 5760, 2880, w4a4=True),
    "m16_k_tail": sm90_tuning.small_m_config(16, 2880, 2880),
    # two CTAs per SM at 16 rows (SMALL_M_TWO_TILES_MAX_S: W4A4's 168 registers at the cap)
    "m16_two_per_sm": sm90_tuning.small_m_config(16, 5120, 2880),
    "m16_w4a4_two_per_sm": sm90_tuning.small_m_config(16, 5120, 2880, w4a4=True),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def built(request):

    cfg = CONFIGS[request.param]
    return cfg, build(gv._launch, *gv.signature(cfg).compile_args(cfg), arch="sm_90a")


def _steps(cfg):
    """128-K steps in the code: UNROLL per copy of the trip body (AHEAD peels the last trip
    and loads the first one before the loop: two copies), the REST steps and K_TAIL's half
    step."""
    return cfg.UNROLL * (2 if cfg.AHEAD else 1) + cfg.REST + cfg.K_TAIL


def test_compiles_to_ldg128_and_mma_sync_without_spills(built):
    cfg, b = built
    steps = cfg.MT * _steps(cfg)
    # Weights: one 16-byte streaming load per weight row (2 per MMA tile) per 128-K step.
    hint = rf"\.L2::{cfg.L2_FETCH}B" if cfg.L2_FETCH else ""
    # (read-only loads with EARLY_WEIGHTS or without PDL, else coherent: after the PDL wait)
    assert b.ptx_count(rf"ld\.global(\.nc)?\.L1::no_allocate{hint}\.v4\.u32") == 2 * steps
    hint = rf"\.LTC{cfg.L2_FETCH}B" if cfg.L2_FETCH else ""
    assert b.sass_count(rf"LDG\.E\.NA{hint}\.128") == 2 * steps
    # Activations: 16-byte loads (bf16: 4 per MMA column tile and step; NVFP4: 1).
    act = cfg.NT * (1 if cfg.decodes_activations else 4) * _steps(cfg)
    if cfg.XSMEM and cfg.w4a4:  # decoded once into shared memory (one loop), LDS.128 per trip
        assert b.ptx_count(r"ld\.global(\.nc)?\.v4\.u32") == 0
        assert b.ptx_count(r"ld\.shared\.v4\.u32") == act
        assert b.ptx_count(r"st\.shared\.v4\.u32") == 1
        assert b.ptx_count(r"ld\.global\.u8") == 1  # its scale bytes (the codes: ld.global.b32)
        assert b.ptx_count(r"cp\.async") == 0
    else:
        assert b.ptx_count(r"ld\.global(\.nc)?\.v4\.u32") == act
    mmas = 8 * cfg.MT * cfg.NT * _steps(cfg)
    assert b.ptx_count(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32") == mmas
    assert b.sass_count(r"HMMA\.16816\.F32\.BF16") == mmas
    assert b.ptx_count(r"cvt\.\w+\.e2m1") == 0  # no FP4 conversion on sm_90a
    # No spills, in the trip loop never; the REST configs keep a few 64-bit addresses in local
    # memory across their short trip before the loop (4 STL.64 and 4 LDL.64 at 1x8192x29568;
    # after the loop it spilled in every trip)
    assert b.kernel.local_bytes == 0 and b.local_in_loops() == []
    spills = 4 if cfg.REST else 0
    assert b.kernel.stack_bytes <= 8 * spills
    assert b.sass_count(r"\bSTL\b") <= spills and b.sass_count(r"\bLDL\b") <= spills
    # Split-K inside the CTA: one shared store per register pair, no fence, no global partials.
    # With CLUSTER the sum reads every rank's partials (its own too) from distributed shared
    # memory between two cluster barriers (each arrive a release: one MEMBAR); without, none
    assert b.sass_count(r"\bSTS\.64\b") == 2 * cfg.MT * cfg.NT
    assert b.sass_count(r"MEMBAR") == (2 if cfg.CLUSTER > 1 else 0)
    assert b.sass_count(r"STG\.E\.64") == 0
    assert b.ptx_count(r"ld\.shared::cluster\.v4\.f32") == (
        gv.reduce_trips(cfg) * cfg.CLUSTER if cfg.CLUSTER > 1 else 0)
    assert b.ptx_count(r"barrier\.cluster\.arrive") == (2 if cfg.CLUSTER > 1 else 0)


def test_decode_instruction_budget(built):
    """Per 8 weight codes: 4 exact bf16x2 multiplies and 4 imad; natural pairing: 2 mask/shift,
    4 prmt, 4 lop3; strided pairing (MT > NT or W4A4): 4 masks, 1 shift, 4 lop3 and no prmt,
    the bf16 activations paying 4 prmt per 8 values instead (16 per step and n8 tile, shared by
    the MT weight tiles; W4A4's staged rows (XSMEM) are decoded into the strided pairing); 1
    prmt per scale pair (the broadcast of each scale to both halves is an HMUL2 operand
    select); with CLUSTER 1 prmt more per rank's sum read from distributed shared memory (its
    `mapa`)."""
    cfg, b = built
    per_trip = cfg.decodes_activations
    words = (8 * cfg.MT + (4 * cfg.NT if per_trip else 0)) * _steps(cfg)
    scales = (2 * cfg.MT + (cfg.NT if per_trip else 0)) * _steps(cfg)
    selected = words  # multiplies by one half of a scale pair (an operand select)
    if cfg.w4a4 and cfg.XSMEM:  # the staging loop: one word of codes, one whole scale word
        words, scales = words + 1, scales + 1
    # ptxas may recompute a scale pair (2 HMUL2) rather than keep it live (seen at NT = 8).
    assert 4 * words + 2 * scales <= b.sass_count(r"HMUL2\.BF16") <= 4 * words + 4 * scales
    assert b.sass_count(r"HMUL2\.BF16_V2 R\d+, R\d+, R\d+(\.reuse)?\.H[01]_H[01]") >= \
        4 * selected
    act = 16 * cfg.NT * _steps(cfg) if cfg.strided and not cfg.w4a4 else 0
    words_permuted = 0 if cfg.strided else 4 * words
    remote = gv.reduce_trips(cfg) * cfg.CLUSTER if cfg.CLUSTER > 1 else 0
    assert b.sass_count(r"\bPRMT\b") <= words_permuted + act + 2 * scales + 4 + remote


def test_pdl_reads_nothing_before_the_wait_but_early_weights(built):
    """With PDL the kernel lets the next one launch before anything else and waits for the one
    before it; in the SASS (ptxas moves read-only loads above the wait) no global read precedes
    the wait, except with EARLY_WEIGHTS and AHEAD the first trip's weights: read-only loads,
    at most one trip's. Activations, which the kernel before may have written, are read with
    coherent loads (W4A4 scales too); without PDL neither op is there."""
    cfg, b = built
    if not cfg.PDL:
        assert b.ptx_count(r"griddepcontrol") == 0
        return
    assert b.ptx_count(r"griddepcontrol\.wait") == 1
    assert b.ptx_count(r"griddepcontrol\.launch_dependents") == 1
    assert b.ptx.index("griddepcontrol.launch_dependents") < b.ptx.index("griddepcontrol.wait")
    (early,) = b.reads_before_pdl_wait().values()
    if cfg.EARLY_WEIGHTS and cfg.AHEAD:
        assert all(r.endswith(".CONSTANT") for r in early), early
        assert len(early) <= 2 * (2 * cfg.MT) * cfg.UNROLL  # a 16-byte and a scale load per row
    else:
        assert early == []
    # read-only loads: the weights' (streaming, and their scales), none without EARLY_WEIGHTS
    assert b.ptx_count(r"ld\.global\.nc\.v4") == 0
    if not cfg.EARLY_WEIGHTS:
        assert b.ptx_count(r"ld\.global\.nc") == 0
    if not cfg.XSMEM:  # (staged: coherent loads of codes and scales)
        assert b.ptx_count(r"ld\.global\.v4\.u32") > 0


@pytest.mark.parametrize("w4a4", [False, True])
@pytest.mark.parametrize("M, K, staged", [(1, 8192, True), (1, 28672, True), (1, 32768, False),
                                           (2, 8192, False), (1, 4096, True)])
def test_activations_staged_in_shared_memory_at_m1_where_they_fit(M, K, staged, w4a4):
    """NVFP4 rows (decoded once per CTA) where they fit, up to K = 8192, past which the decode
    before the first trip cost more than it saved (docs/facts.md#w4a4-stage-max-k); bf16 rows
    never (staged, 0.2-3.2 us slower: docs/facts.md#small-m-round), and the kernel refuses
    them by name."""
    cfg = sm90_tuning.small_m_config(M, 8192, K, w4a4=w4a4)
    staged = staged and w4a4 and K <= sm90_tuning.W4A4_STAGE_MAX_K
    if not w4a4:
        with pytest.raises(ValueError, match="XSMEM.*W4A4 only.*w4a4=False"):
            dataclasses.replace(cfg, XSMEM=gv.xsmem_bytes(1, 8192))
    assert bool(cfg.XSMEM) == staged
    if staged:
        assert cfg.XSMEM == gv.xsmem_bytes(M, K) <= gv.MAX_XSMEM
        assert cfg.part_bytes + cfg.XSMEM <= 227 * 1024


@pytest.mark.parametrize("M, N, K, fetch", [
    (1, 8192, 8192, 128), (1, 8192, 18944, 128), (1, 8192, 29568, 0), (1, 8192, 2880, 0),
    (2, 8192, 8192, 128), (8, 8192, 8192, 128), (8, 8192, 29568, 0), (9, 8192, 8192, 0),
    (16, 8192, 8192, 0), (16, 4096, 4096, 0), (64, 8192, 8192, 0)])
def test_weight_loads_fetch_whole_l2_lines_on_one_activation_tile(M, N, K, fetch):
    """With one activation tile (M <= 8) and two steps per trip (not the cluster split) a trip
    reads one 128-byte line of each weight row as two 64-byte loads, each asking L2 for the
    whole line (measured: faster there, slower with two tiles; 16x4096^2 runs two tiles on
    two-step trips), where the rows' K / 2 bytes keep every row on whole lines (K % 256 == 0; at
    K = 29568 half the rows straddle two lines: 69.6 us with the fetch, 55.9 without at
    1x8192x29568 on the H100)."""
    cfg = sm90_tuning.small_m_config(M, N, K)
    assert cfg.L2_FETCH == fetch
    if fetch:
        assert gv.k_offset(0, cfg.UNROLL) // 2 == fetch  # bytes of each row a trip reads
    with pytest.raises(ValueError, match="L2_FETCH .* must be 0, 128 or 256, got 64"):
        dataclasses.replace(cfg, L2_FETCH=64)


@pytest.mark.parametrize("M, N", [(1, 1536), (8, 1536), (1, 576), (8, 576)])
def test_cluster_split_reads_half_lines_without_the_fetch(M, N):
    """The K split over clusters runs one 128-K step per trip (64 bytes of each weight row): the
    whole-line fetch would ask for the next trip's half too, and lost (1-8x1536x7168 on the
    H100), so those plans leave it off."""
    cfg = sm90_tuning.small_m_config(M, N, 7168)
    assert cfg.CLUSTER > 1 and cfg.UNROLL == 1 and cfg.L2_FETCH == 0


def test_fast_argument_packing_matches_dsl():
    """gemm_small_m packs raw pointers into ctypes slots itself: they must hold the DSL's bytes
    (checked inside compile_launcher; a mismatch raises)."""
    gv.compile_launcher(sm90_tuning.small_m_config(16, 8192, 8192, w4a4=True),
                        options="--gpu-arch sm_90a")


@pytest.mark.parametrize(
    "M, N, K, match",
    [(65, 256, 512, "M <= 64"), (0, 256, 512, "M <= 64"), (16, 1000, 512, "multiple of 32"),
     (16, 256, 520, "multiple of 64"), (16, 256, 64, "at least 128")],
)
def test_config_rejects_unsupported_shapes(M, N, K, match):
    with pytest.raises(ValueError, match=match):
        sm90_tuning.small_m_config(M, N, K)


@pytest.mark.parametrize("M", [1, 7, 16, 33, 64])
@pytest.mark.parametrize("N, K", [(256, 512), (4096, 4096), (8192, 8192), (28672, 8192),
                                  (8192, 28672), (96, 128), (160, 384), (3584, 18944)])
def test_split_k_divides_the_k_chunks_unless_that_starves_it(M, N, K):
    cfg = sm90_tuning.small_m_config(M, N, K)
    assert M <= cfg.m_pad and N % cfg.rows == 0 and K % cfg.k_chunk == gv.STEP_K * cfg.REST
    S, chunks = sm90_tuning.small_m_splits(cfg, N, K, 132), K // cfg.k_chunk
    assert S == cfg.S <= chunks and cfg.threads <= gv.MAX_THREADS
    assert cfg.part_bytes <= gv.MAX_PART_BYTES
    if chunks % S and not cfg.REST:  # (3584 x 18944: 74 chunks = 2 x 37) the best divisor is
        # under half the aim (with REST the first slice runs more anyway: the aim is taken)
        even = max(d for d in range(1, S) if chunks % d == 0 and cfg.fits(d))
        assert even < sm90_tuning.SMALL_M_EVEN_MIN * S


@pytest.mark.parametrize("M", [9, 16])
@pytest.mark.parametrize("N, K, unroll, S", [
    (3584, 3584, 2, 14), (2880, 4096, 2, 16), (4096, 4096, 2, 16), (4608, 3584, 4, 7),
    (576, 7168, 4, 14), (6144, 4096, 4, 8), (8192, 8192, 4, 8), (2880, 2880, 2, 11)])
def test_two_steps_per_trip_where_four_halve_the_slices(M, N, K, unroll, S):
    """At 9-16 rows 4 K steps per trip, unless 2 give twice the K-slices (at most
    SMALL_M_MAX_WARPS = 16) in CTAs that fit the SMs in one round: short K's slices of 4
    steps fall below the aim (H100: 16x3584^2 U4 S7 8.8 us, U2 S14 6.8; 16x2880x4096 U4 S8
    9.3, U2 S16 6.9; 16x576x7168 U2 S28 slower than U4 S14; 16x4608x3584, 144 CTAs of one row
    group, U2 S14 11.9 us against U4 S7 9.1). 2880: 22 steps and a half, 2 per trip anyway."""
    cfg = sm90_tuning.small_m_config(M, N, K)
    assert (cfg.UNROLL, cfg.S) == (unroll, S)
    assert cfg.REST == (K // gv.STEP_K) % unroll and cfg.S <= K // cfg.k_chunk


def test_rest_takes_the_aims_split():
    """K = 29568 (115 trips of 256 and a step): S = 8, not the divisor 5 (H200: 46.9 against
    59.7 us at M = 1)."""
    cfg = sm90_tuning.small_m_config(1, 8192, 29568)
    assert (cfg.UNROLL, cfg.REST, cfg.S) == (2, 1, 8)
    assert cfg.S == sm90_tuning.small_m_config(1, 8192, 28672).S  # (224 steps: the aim too)


def test_k_slices_cover_k_once_one_trip_apart():
    """`k_slice`: S slices of the chunks, in order, contiguous, each floor or ceil of
    chunks / S (evaluated on Python ints, as the kernel computes it)."""
    for chunks in range(1, 80):
        for S in range(1, min(chunks, 32) + 1):
            cfg = dataclasses.replace(gv.Config(), S=S) if gv.Config().fits(S) else None
            if cfg is None:
                continue
            K = chunks * cfg.k_chunk
            slices = [gv.k_slice(cfg, s, K) for s in range(S)]
            assert slices[0][0] == 0 and sum(n for _, n in slices) == chunks
            assert all(f + n == nf for (f, n), (nf, _) in itertools.pairwise(slices))
            assert {n for _, n in slices} <= {chunks // S, -(-chunks // S)}
            for c in (2, 4, 8):  # CLUSTER: rank r's warp slice j is slice r S / c + j
                if S % c == 0:
                    spread = dataclasses.replace(cfg, S=S // c, CLUSTER=c)
                    assert [gv.k_slice(spread, s, K) for s in range(S)] == slices


def _emulated(cfg, M, N, K, w4a4, seed, scale_dtype="ue4m3"):
    """The kernel with `cfg` in the emulator on fresh random operands, D poisoned first: every
    element within the product's bound (`assert_gemm_close`), no hazard but the one
    `test_h200_fixtures.benign` explains (M % 4 in (1, 2): partial slots read unwritten)."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize

    gv.check_shape(cfg, M, N, K)
    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=g), scale_dtype=scale_dtype)
    x = torch.randn(M, K, generator=g)
    a = quantize(x, scale_dtype=scale_dtype) if w4a4 else x.bfloat16()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    machines = hopper.small_m(a, b, cfg, out)
    benign = {"uninitialized-shared"} if M % 4 in (1, 2) else set()
    assert [h for m in machines for h in m.hazards if h.kind not in benign] == []
    assert_gemm_close(out, a, b)


def _planned(M, N, K, w4a4, sf="ue4m3"):
    """The Config the dispatch runs for this call (`small_m_config` + `complete`)."""
    return sm90_tuning.complete("small_m", sm90_tuning.small_m_config(M, N, K, w4a4), N, K,
                                w4a4, "bfloat16", sf, False)


@pytest.mark.parametrize("M, S, w4a4", [(1, 3, False), (1, 4, True), (5, 3, False),
                                        (12, 3, False)])
def test_uneven_k_split_runs_exactly_in_the_emulator(M, S, w4a4, seed):
    """S K-slices that do not divide the 5 K chunks (slices of 1 and 2 trips)."""
    N, K = 64, 5 * 256
    cfg = dataclasses.replace(sm90_tuning.small_m_config(M, N, K, w4a4), S=S, WN=1)
    assert cfg.k_chunk == 256 and gv.k_slice(cfg, 0, K)[1] != gv.k_slice(cfg, S - 1, K)[1]
    _emulated(cfg, M, N, K, w4a4, seed)


@pytest.mark.parametrize("M, N, K, w4a4, S", [
    (1, 32, 2880, False, None),  # M = 1, strided pairing
    (1, 32, 576, True, None),  # W4A4 staged decoded
    (8, 32, 2880, True, None),  # AHEAD, W4A4 decoded in every trip
    (8, 32, 2880, False, 4),  # 11 chunks in 4 uneven slices, then the tail
    (16, 64, 576, False, None),  # two activation tiles, no AHEAD
    (5, 32, 192, False, None),  # UNROLL = 1: one step, then the half step
])
def test_k_tail_runs_exactly_in_the_emulator(M, N, K, w4a4, S, seed):
    """K % 128 == 64 (K_TAIL): the first slice's half step, lanes past K zeroed (read in bounds:
    the emulator faults on any byte outside the operands; a lane's duplicated products left in
    would double them)."""
    cfg = _planned(M, N, K, w4a4)
    if S is not None:
        cfg = dataclasses.replace(cfg, S=S, WN=1)
    assert cfg.K_TAIL
    _emulated(cfg, M, N, K, w4a4, seed)


@pytest.mark.parametrize("M, N, K, w4a4, S", [
    (1, 32, 384, False, None),  # 3 steps: one trip of 2, then one step; staged row, AHEAD
    (8, 32, 448, True, None),  # the step, then the half step; W4A4 decoded in every trip
    (16, 64, 384, False, None),  # two activation tiles, no AHEAD (UNROLL 4 -> 2)
    (5, 32, 1408, False, 2),  # 11 steps: 5 trips in 2 uneven slices, then the step
    (1, 32, 640, True, 2),  # W4A4 staged, decoded once
])
def test_rest_steps_run_exactly_in_the_emulator(M, N, K, w4a4, S, seed):
    """K // 128 steps that are not whole trips (`Config.REST`): the first slice's short trip
    (and then the half step of K_TAIL), every element within bound."""
    cfg = _planned(M, N, K, w4a4)
    if S is not None:
        cfg = dataclasses.replace(cfg, S=S, WN=1)
    assert cfg.UNROLL == 2 and cfg.REST == 1 and cfg.K_TAIL == (K % 128 != 0)
    _emulated(cfg, M, N, K, w4a4, seed)


def test_rest_must_be_short_of_a_trip():
    with pytest.raises(ValueError, match="REST"):
        gv.Config(UNROLL=2, REST=2)
    with pytest.raises(ValueError, match="REST=0"):
        gv.check_shape(gv.Config(UNROLL=2), 1, 32, 384)


def _quantize_a_config(M, N, K, pdl=False):
    """The dispatch's in-kernel-quantize Config (`quantize_in_gemm` + `complete`)."""
    cfg = sm90_tuning.quantize_in_gemm(M, N, K)
    assert cfg is not None and cfg.QUANTIZE_A and cfg.w4a4
    return sm90_tuning.complete("small_m", cfg, N, K, True, "bfloat16", "ue4m3", pdl)


def _blocky(M, K, gen):
    """bf16 activations whose 16-element blocks span 2^-30 .. 2^30 (block scales of every
    size, some underflowing to zero codes), one all-zero block, one huge block."""
    x = torch.randn(M, K, generator=gen) * torch.exp2(
        torch.randint(-30, 31, (M, K // 16), generator=gen).float()).repeat_interleave(16, 1)
    x[0, :16] = 0.0
    x[-1, -16:] *= 2.0 ** 40
    return x.bfloat16()


@pytest.mark.parametrize("M, N, K, adversarial, pdl", [
    (1, 64, 512, True, False),  # the decode row; adversarial warp order and yields
    (1, 64, 512, True, True),  # early weight loads before the PDL wait
    (1, 32, 2880, False, False),  # K tail; more chunks than threads
    (3, 64, 1024, False, False),  # rows of 128 chunks, fewer chunks than threads on the last trip
    (8, 32, 2048, False, False),  # one activation tile's 8 rows
    (12, 96, 1024, False, False),  # two activation tiles, no AHEAD (N % 128 != 0: small-M)
    (5, 32, 576, True, False),  # K tail, 5 rows
])
def test_quantize_a_in_the_kernel_is_quantize_then_gemm(M, N, K, adversarial, pdl, seed):
    """QUANTIZE_A (`gemm(x, w, quantize_a=True)`'s one launch): bf16 rows quantized in the
    kernel give D bit for bit as the kernel on `quantize(x, check_finite=False)`'s NVFP4
    activations, and within the bound of that exact product; no hazard but the benign
    unwritten partial slots (`_emulated`)."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize

    cfg = _quantize_a_config(M, N, K, pdl)
    gen = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=gen))
    x = _blocky(M, K, gen)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    options = {"adversarial": True, "seed": seed} if adversarial else {}
    machines = hopper.small_m(x, b, cfg, out, **options)
    benign = {"uninitialized-shared"} if M % 4 in (1, 2) else set()
    assert [h for m in machines for h in m.hazards if h.kind not in benign] == []
    a = quantize(x, check_finite=False)
    two = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    hopper.small_m(a, b, dataclasses.replace(cfg, QUANTIZE_A=False), two)
    assert torch.equal(out.view(torch.int16), two.view(torch.int16))
    assert_gemm_close(out, a, b)


def test_quantize_a_non_finite_and_zero_rows(seed):
    """A NaN activation makes every D element NaN (the computed gA is NaN, as `quantize`'s
    is: the contract leaves D unspecified for NaN / Inf, this pins what the kernel does); all-
    zero activations give D = 0 (amax under the floor: zero codes)."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize

    M, N, K = 2, 32, 512
    cfg = _quantize_a_config(M, N, K)
    b = quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(seed)))
    x = torch.zeros(M, K, dtype=torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    hopper.small_m(x, b, cfg, out)
    assert torch.equal(out, torch.zeros_like(out))
    x = torch.randn(M, K).bfloat16()
    x[1, 300] = float("nan")
    hopper.small_m(x, b, cfg, out)
    assert torch.isnan(out).all()


def test_quantize_a_kernel_compiles_without_spills():
    """The in-kernel quantize on the decode plan: no local memory, the quantizer's encode
    (cvt to E4M3 for the block scales) and one CTA barrier more than the staged W4A4 plan."""
    cfg = _quantize_a_config(1, 8192, 8192)
    plain = dataclasses.replace(cfg, QUANTIZE_A=False)
    got, before = (build(gv._launch, *gv.signature(c).compile_args(c), arch="sm_90a")
                   for c in (cfg, plain))
    assert got.kernel.local_bytes == 0 and got.kernel.stack_bytes == 0, got.kernel
    assert got.ptx_count(r"cvt\.rn\.satfinite\.e4m3x2") > before.ptx_count(
        r"cvt\.rn\.satfinite\.e4m3x2")
    assert got.ptx_count(r"bar\.sync") == before.ptx_count(r"bar\.sync") + 1


@pytest.mark.parametrize("w4a4", [False, True])
def test_k_tail_with_ue5m3_scales_in_the_emulator(w4a4, seed):
    """UE5M3 operands (Rubin's scales, decoded on Hopper too) with the K tail: the zeroed
    scale byte decodes to 0 in that format as well."""
    cfg = _planned(4, 32, 576, w4a4, "ue5m3")
    assert cfg.K_TAIL and cfg.sf == "ue5m3"
    _emulated(cfg, 4, 32, 576, w4a4, seed, "ue5m3")


@pytest.mark.parametrize("N, K", [(3584, 18944), (5120, 2880)])
@pytest.mark.parametrize("M, w4a4", [(1, False), (8, True)])
def test_planned_uneven_split_runs_in_the_emulator(N, K, M, w4a4, seed):
    """Plans complete as the dispatch runs them, on one CTA's weight rows: Qwen2.5-7B's down
    projection (K = 18944: 74 chunks in 15 slices), gpt-oss's qkv (K = 2880: 11 chunks in 6
    slices, one round of CTAs, and the half step)."""
    cfg = _planned(M, N, K, w4a4)
    assert (K // cfg.k_chunk) % cfg.S != 0
    _emulated(cfg, M, 32, K, w4a4, seed)


@pytest.mark.parametrize("M, N, K, w4a4", [(16, 4096, 7168, False), (16, 4096, 7168, True),
                                        (9, 4096, 14336, True), (4, 1536, 7168, False),
                                        (8, 1536, 7168, True), (16, 5120, 2880, False),
                                        (12, 5760, 2880, True)])
def test_planned_16_row_and_pair_cluster_plans_run_in_the_emulator(M, N, K, w4a4, seed):
    """The plans of 9-16 rows on whole-step K (`SMALL_M_WHOLE_K_MAX`: DeepSeek-V3's 4096x7168,
    Llama 3 8B's 4096x14336) and two CTAs per SM (`SMALL_M_TWO_TILES_MAX_S`: gpt-oss's
    5120x2880 and 5760x2880, 11 chunks in 6 slices and K's last half step) and of q_a's
    clusters of 2 (1536x7168, 16 slices of 28 steps per CTA), as the dispatch completes them,
    on one row block: D within the bound, no hazard."""
    assert sm90_tuning.hopper_path(w4a4, M, N, K, 132) == "small_m"
    cfg = _planned(M, N, K, w4a4)
    assert cfg.CLUSTER == (2 if N == 1536 else 1)
    if K == 2880:  # two CTAs per SM
        assert (cfg.S, cfg.MIN_CTAS) == (sm90_tuning.SMALL_M_TWO_TILES_MAX_S, 2)
    _emulated(cfg, M, 32 * cfg.WN, K, w4a4, seed)


@pytest.mark.parametrize("M, N, K, S, cluster, w4a4, as_planned", [
    (3, 64, 2048, 2, 2, False, True),  # two row blocks, 16 steps in 4 slices
    (1, 64, 1216, 2, 2, False, True),  # K_TAIL on the first rank's first slice
    (5, 96, 1216, 1, 4, True, True),  # W4A4 decoded in every trip, 9 steps in 4 slices
    (1, 32, 2048, 3, 4, True, True),  # W4A4 at one row (not staged, as planned), 16 steps in 12
    # the kernel takes more than the plans give: 2 steps per trip, REST and K_TAIL on the first
    # rank's first slice, W4A4's row staged in every CTA
    (1, 64, 1216, 2, 2, True, False),
])
def test_cluster_split_runs_in_the_emulator(M, N, K, S, cluster, w4a4, as_planned, seed):
    """`Config.CLUSTER`: a row block's S x CLUSTER K-slices spread over a cluster, each rank
    summing its slices, then a CLUSTER-th of the outputs over the ranks' sums (distributed
    shared memory); in the emulator on fresh random operands, D (fp32) poisoned: every element
    within the product's bound, as the one CTA of all the slices is, no hazard (but the benign
    one of `_emulated`)."""
    from tk_cute.emulator import hopper
    from tk_cute.nvfp4 import quantize

    base = sm90_tuning.complete("small_m", sm90_tuning.small_m_config(M, N, K, w4a4), N, K,
                                w4a4, "float32", "ue4m3", False)
    if as_planned:  # (one step per trip, W4A4's row not staged: `small_m_cluster`'s Configs)
        base = dataclasses.replace(base, UNROLL=1, REST=0, XSMEM=0)
    else:
        assert base.UNROLL == 2 and base.REST and base.K_TAIL and base.XSMEM
    base = dataclasses.replace(base, WN=1, MIN_CTAS=0)
    g = torch.Generator().manual_seed(seed)
    b = quantize(torch.randn(N, K, generator=g))
    x = torch.randn(M, K, generator=g)
    a = quantize(x) if w4a4 else x.bfloat16()
    for cfg in (dataclasses.replace(base, S=S * cluster), dataclasses.replace(
            base, S=S, CLUSTER=cluster)):
        gv.check_shape(cfg, M, N, K)
        out = torch.full((M, N), float("nan"), dtype=torch.float32)
        machines = hopper.small_m(a, b, cfg, out)
        benign = {"uninitialized-shared"} if M % 4 in (1, 2) else set()
        assert [h for m in machines for h in m.hazards if h.kind not in benign] == []
        assert len(machines) == 1 and not out.isnan().any()
        assert_gemm_close(out, a, b, f"CLUSTER={cfg.CLUSTER}")


def test_narrow_layers_split_k_over_clusters():
    """`sm90_tuning.small_m_cluster` over a grid of shapes and SM counts: clusters of the first
    size of SMALL_M_CLUSTERS that fits, only at M <= SMALL_M_CLUSTER_MAX_M where the row
    blocks' CTAs times the cluster fit the SMs, every cluster runs at once and each CTA gets
    SMALL_M_CLUSTER_MIN_STEPS 128-K steps or more, and there always; one step per trip, a
    slice per warp of at least one step, a CTA that fits. DeepSeek-V3's kv_a (576x7168: 18 row
    blocks) takes clusters of 4 at 1-8 rows (14 warps each), its q_a (1536x7168: 48) clusters
    of 2 (16 warps); `quantize_in_gemm` keeps one CTA per row block."""
    T = sm90_tuning
    for M, N, K, sms, w4a4 in itertools.product(
            (1, 3, 4, 5, 8, 16), (32, 256, 576, 1024, 1056, 1536, 2080, 2112),
            (512, 1216, 3584, 4096, 7168, 7232, 16384), (132, 114, 78), (False, True)):
        cfg = T.small_m_config(M, N, K, w4a4, sms=sms)
        one = T.small_m_config(M, N, K, w4a4, sms=sms, clusters=False)
        blocks, steps = N // one.rows, K // gv.STEP_K
        fits = [c for c in T.SMALL_M_CLUSTERS
                if M <= T.SMALL_M_CLUSTER_MAX_M and blocks * c <= sms
                and blocks <= T.CLUSTERS_RESIDENT[c] * sms // 132
                and steps >= c * T.SMALL_M_CLUSTER_MIN_STEPS]
        assert cfg.CLUSTER == (fits[0] if fits else 1), (M, N, K, sms)
        if fits:  # (W4A4's row not staged: every CTA of the cluster would decode all of it)
            c = fits[0]
            assert cfg.UNROLL == 1 and cfg.REST == 0 and cfg.slices <= steps and not cfg.XSMEM
            assert cfg.S == min(T.SMALL_M_MAX_WARPS // one.WN, steps // c) and cfg.fits(cfg.S)
            q = T.quantize_in_gemm(M, N, K, sms=sms)  # (staging all the rows: one CTA a block)
            assert q is None or q.CLUSTER == 1 and q == dataclasses.replace(
                T.small_m_config(M, N, K, True, sms=sms, clusters=False),
                XSMEM=gv.xsmem_bytes(M, K), QUANTIZE_A=True)
            gv.check_shape(cfg, M, N, K)
    assert T.SMALL_M_CLUSTERS == tuple(sorted(T.SMALL_M_CLUSTERS, reverse=True))
    for M in (1, 2, 4, 8):
        for w4a4 in (False, True):
            kv_a, q_a = (T.small_m_config(M, N, 7168, w4a4) for N in (576, 1536))
            assert (kv_a.CLUSTER, kv_a.S, q_a.CLUSTER, q_a.S) == (4, 14, 2, 16)


# --- GPU --------------------------------------------------------------------------------------

SHAPES = [(256, 512), (4096, 4096), (8192, 8192), (1024, 2048), (160, 384)]



# Bounds: `tk_cute.testing.assert_gemm_close` (every element; derived in its docstring).


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 7, 16, 33, 64])
@pytest.mark.parametrize("N, K", SHAPES)
def test_w4a16_matches_float64(seed, M, N, K):
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    d = launch.gemm_small_m(a, b, out=out)
    assert d.data_ptr() == out.data_ptr()
    assert not d.isnan().any(), "unwritten or NaN outputs"
    assert_gemm_close(d, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 64])
@pytest.mark.parametrize("tiling", [dict(UNROLL=1), dict(UNROLL=4), dict(MT=4, WN=2),
                                    dict(MT=1, WN=8), dict(UNROLL=1, AHEAD=True),
                                    dict(UNROLL=2, AHEAD=True), dict(UNROLL=4, L2_FETCH=256)],
                         ids=["u1", "u4", "mt4", "mt1", "u1_ahead", "u2_ahead", "u4_l2_256"])
def test_every_tiling_matches_float64(seed, M, tiling):
    N, K = 1024, 4096
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    cfg = dataclasses.replace(sm90_tuning.small_m_config(M, N, K), **tiling, S=2)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = launch.gemm_small_m(a, b, out=out, config=cfg)
    assert not d.isnan().any(), "unwritten or NaN outputs"
    assert_gemm_close(d, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4, 8])
@pytest.mark.parametrize("w4a4", [False, True])
@pytest.mark.parametrize("N, K", [(3584, 18944), (4096, 29568)], ids=["uneven", "rest"])
def test_planned_odd_k_splits_on_the_gpu(seed, M, w4a4, N, K):
    """Through the public dispatch, the small-M kernel, every element within bound, D poisoned
    first: Qwen2.5-7B's down projection (K = 18944: 74 chunks in 15 slices) and Qwen2.5-72B's
    K (29568: 231 steps, one past UNROLL = 2's trips, `Config.REST`) on 4096 rows (narrower
    layers split K over clusters at one step per trip)."""
    from tk_cute import nvfp4

    b = random_weights(N, K)
    x = torch.randn(M, K, device="cuda")
    a = nvfp4.quantize(x) if w4a4 else x.bfloat16()
    cfg = nvfp4.plan(a, b).config
    assert nvfp4.plan(a, b).path == "small_m" and (K // cfg.k_chunk) % cfg.S != 0
    assert cfg.REST == (K == 29568)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = nvfp4.gemm(a, b, out=out)
    assert not d.isnan().any(), "unwritten or NaN outputs"
    assert_gemm_close(d, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 4, 8])
@pytest.mark.parametrize("w4a4", [False, True])
@pytest.mark.parametrize("N, cluster, S", [(576, 4, 14), (1536, 2, 16)])
def test_cluster_split_on_the_gpu(seed, M, w4a4, N, cluster, S):
    """DeepSeek-V3's kv_a (576x7168) and q_a (1536x7168) through the public dispatch: the K
    split over clusters of 4 (72 CTAs) and 2 (96), D poisoned, every element within the
    product's bound, a second call bit for bit the first (the ranks' sums added in a fixed
    order)."""
    from tk_cute import nvfp4

    K = 7168
    b = random_weights(N, K)
    x = torch.randn(M, K, device="cuda").bfloat16()
    a = nvfp4.quantize(x) if w4a4 else x
    cfg = nvfp4.plan(a, b).config
    assert cfg.CLUSTER == cluster and cfg.S == S and not cfg.XSMEM
    outs = [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(2)]
    for out in outs:
        nvfp4.gemm(a, b, out=out)
    assert not outs[0].isnan().any(), "unwritten or NaN outputs"
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert_gemm_close(outs[0], a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 7, 16, 33, 64])
@pytest.mark.parametrize("N, K", SHAPES)
def test_w4a4_matches_gemm_reference(seed, M, N, K):
    from tk_cute.nvfp4 import quantize

    b = random_weights(N, K)
    a = quantize(torch.randn(M, K, device="cuda"))
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = launch.gemm_small_m(a, b, out=out)
    assert not d.isnan().any(), "unwritten or NaN outputs"
    assert_gemm_close(d, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 64])
def test_fp32_output_split_invariance_and_determinism(seed, M):
    """Every split count (uneven ones too: 3, 5, 7 slices of 16 chunks) gives the same sum up to
    fp32 rounding; one split count is bitwise reproducible run to run (the partials are summed
    in a fixed order)."""
    N, K = 512, 4096
    b = random_weights(N, K)
    a = torch.randn(M, K, device="cuda").bfloat16()
    cfg = dataclasses.replace(sm90_tuning.small_m_config(M, N, K, clusters=False), WN=1)
    chunks = K // cfg.k_chunk
    results = {}
    for S in [s for s in (1, 2, 3, 5, 7, chunks) if s <= chunks and cfg.fits(s)]:
        d = launch.gemm_small_m(a, b, torch.float32, config=cfg, splits=S)
        assert_gemm_close(d, a, b, f"splits={S}")
        again = launch.gemm_small_m(a, b, torch.float32, config=cfg, splits=S)
        assert torch.equal(d, again), f"splits={S} not deterministic"
        results[S] = d


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])  # PDL reading nothing early / weights first
@pytest.mark.parametrize("M", [1, 16])
def test_pdl_chain_reads_each_activation_after_its_producer(seed, M, pdl):
    """Calls chained through their outputs (call i + 1's activations are call i's output; each
    may start during the previous one's tail, with pdl=True weights first): every link equals
    the float64 product of the bf16 activations it was given."""
    N = K = 4096
    b = random_weights(N, K)
    xs = [torch.randn(M, K, device="cuda").bfloat16()]
    outs = [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(4)]  # poison
    for out in outs:
        xs.append(launch.gemm_small_m(xs[-1], b, out=out, pdl=pdl))
    torch.cuda.synchronize()
    for x, d in zip(xs, xs[1:]):
        assert not d.isnan().any(), "unwritten or NaN outputs"
        assert_gemm_close(d, x, b)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8])
def test_public_gemm_takes_pdl_here(seed, M):
    """`tk_cute.nvfp4.gemm(..., pdl=True)` runs this kernel with PDL: the same sums in the same
    order as without it."""
    from tk_cute.nvfp4 import gemm

    b = random_weights(1024, 2048)
    a = torch.randn(M, 2048, device="cuda").bfloat16()
    assert torch.equal(gemm(a, b, pdl=True), launch.gemm_small_m(a, b))


@pytest.mark.gpu
def test_rejects_bad_input():
    from tk_cute.nvfp4 import quantize

    b = random_weights(256, 512)
    a = torch.randn(4, 512, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="K mismatch"):
        launch.gemm_small_m(a[:, :256], b)
    with pytest.raises(ValueError, match="one device"):
        launch.gemm_small_m(a.cpu(), b)
    with pytest.raises(ValueError, match="CUDA device"):
        launch.gemm_small_m(a.cpu(), b.to("cpu"))
    with pytest.raises(ValueError, match="multiple of 32.*N=1000"):
        launch.gemm_small_m(torch.randn(4, 512, device="cuda").bfloat16(),
                            random_weights(1000, 512))
    with pytest.raises(ValueError, match="multiple of 64.*K=528"):
        launch.gemm_small_m(torch.randn(4, 528, device="cuda").bfloat16(),
                            random_weights(256, 528))
    with pytest.raises(ValueError, match="M <= 64, got M=65"):
        launch.gemm_small_m(torch.randn(65, 512, device="cuda").bfloat16(), b)
    with pytest.raises(TypeError, match="bfloat16"):
        launch.gemm_small_m(a.half(), b)
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        launch.gemm_small_m(a, a)
    with pytest.raises(ValueError, match="stages 1040 B of activations; M=2, K=512 needs 2080"):
        launch.gemm_small_m(quantize(a[:2]), b,  # (W4A4 stages its row at M = 1)
                            config=sm90_tuning.small_m_config(1, 256, 512, w4a4=True))


def test_validation_before_any_gpu_work():
    """Bad input is rejected on the host (these run without a GPU)."""
    from tk_cute.nvfp4 import quantize

    b = quantize(torch.randn(256, 512))
    a = torch.randn(4, 512).bfloat16()
    with pytest.raises(ValueError, match="K mismatch: a has K=256, b has K=512"):
        launch.gemm_small_m(a[:, :256], b)
    with pytest.raises(TypeError, match="bfloat16"):
        launch.gemm_small_m(a.half(), b)
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        launch.gemm_small_m(a, a)
    with pytest.raises(ValueError, match="CUDA device"):
        launch.gemm_small_m(a, b)
