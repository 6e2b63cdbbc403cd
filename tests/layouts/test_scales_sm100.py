"""Host proof: the scale bytes the tcgen05 NVFP4 GEMM reads are the ones `quantize` wrote.

Chain, every level evaluated with CuTe's own layout algebra on the host (no GPU): global
`tile_atom_to_shape_SF` (what the kernel's TMA reads) -> shared stage (`make_smem_layout_sf*`,
what TMA writes) -> tensor memory (`make_tmem_layout_sf*`, what `tcgen05.cp` writes and each MMA
reads). Closed forms in `layouts.scales_sm100` are pinned to the CuTe layouts; a simulation of
TMA + `tcgen05.cp 32x128b.warpx4` over padded problems then reproduces `dequantize` exactly.
"""

import functools

import pytest
import torch

import cutlass
import cutlass.cute as cute

from tk_cute.layouts import scales_sm100 as S
from tk_cute.layouts.nvfp4_scales import blocked_offset, eval_cute_layout, scale_offsets_cute
from tk_cute.types import st_mma
from tk_cute.nvfp4 import dequantize, e2m1_decode, e4m3_decode, quantize, unpack_fp4

TILES = [(512, 256, 256), (256, 256, 256), (256, 128, 256)]  # (Mb, Nb, Kb) the kernel uses


def _stage_coords(rows, kb_stage, replicas=False):
    """CuTe coordinates of every (row, 16-block) of one stage, for the smem / TMEM layouts."""
    out = []
    for r in range(rows):
        for kb in range(kb_stage):
            k = 16 * kb
            atom = ((r % 32, (r // 32) % 4), (0, (k // 16) % 4))
            out.append(((r, kb), atom, r // 128, k // 64))
    return out


@functools.cache
def _layouts(Mb, Nb, Kb):
    """Evaluated (smem, tmem) offsets of SFA and SFB for one tile, keyed by (row, kb)."""
    res = {}
    for operand, rows in (("SFA", Mb // 2), ("SFB", -(-Nb // 128) * 128)):
        coords = _stage_coords(rows, Kb // 16)
        make = st_mma.SFA if operand == "SFA" else st_mma.SFB  # the kernel's scale tiles

        def smem():
            tile = make(cutlass.Float8E4M3FN, (Mb, Nb, Kb))
            return cute.slice_(tile.layout(1), (None, None, None, 0))

        def tmem():
            return make(cutlass.Float8E4M3FN, (Mb, Nb, Kb)).tmem_layout()

        # smem mode 0 is ((32,4),rest_rows),(16,4); bands beyond the atom are MMA_M / rest modes
        s_lay, _ = eval_cute_layout(smem)
        t_lay, _ = eval_cute_layout(tmem)
        s_off, t_off = {}, {}
        for (r, kb), (row_a, k_a), band, chunk in coords:
            if operand == "SFA":
                s_c = (((row_a, 0), k_a), band, chunk)
                t_c = [(((row_a, q), k_a), band, chunk) for q in range(4)]
            else:  # SFB rows are (32, 4 * bands) in one MMA_N mode
                s_c = (((row_a, band), k_a), 0, chunk)
                t_c = [((((row_a[0], row_a[1] + 4 * band), q), k_a), 0, chunk) for q in range(4)]
            s_off[r, kb] = s_lay(s_c)
            t_off[r, kb] = [t_lay(c) for c in t_c]
        res[operand] = (rows, s_off, t_off)
    return res


def _split(v):
    """TMEM byte address (lane << 18 | column << 2 | byte) -> (lane, column, byte)."""
    return v >> 18, (v & ((1 << 18) - 1)) >> 2, v & 3


@pytest.mark.parametrize("tile", TILES)
def test_smem_stage_is_blocked(tile):
    Mb, Nb, Kb = tile
    for operand, (rows, s_off, _) in _layouts(*tile).items():
        for (r, kb), s in s_off.items():
            assert s == S.smem_offset(r, kb, rows, Kb // 16) == blocked_offset(r, kb, rows, Kb)


@pytest.mark.parametrize("tile", TILES)
def test_tmem_layout_is_the_copy_of_smem_atoms(tile):
    Mb, Nb, Kb = tile
    for operand, (rows, s_off, t_off) in _layouts(*tile).items():
        group_of_atom = {}
        for (r, kb), addrs in t_off.items():
            lanes = sorted(_split(a)[0] for a in addrs)
            lane0, col, byte = _split(addrs[0])
            assert lanes == [lane0 % 32 + 32 * q for q in range(4)]  # warpx4 replication
            assert (lane0 % 32, col, byte) == S.tmem_address(r, kb, rows, Kb // 16, operand)
            s = s_off[r, kb]  # 32x128b geometry inside an atom, one 4-column group per atom
            assert (lane0 % 32, col % 4, byte) == ((s % 512) // 16, (s % 16) // 4, s % 4)
            assert group_of_atom.setdefault(s // 512, col // 4) == col // 4
        assert len(set(group_of_atom.values())) == len(group_of_atom)


@pytest.mark.parametrize("M, K", [(300, 320), (129, 64), (512, 1024)])
def test_global_layout_is_blocked_offset(M, K):
    kbs = -(-K // 16)
    coords = [(m, 16 * kb, 0) for m in range(M) for kb in range(kbs)]
    got = scale_offsets_cute(M, K, 1, coords)
    assert got == [blocked_offset(m, kb, M, K) for m in range(M) for kb in range(kbs)]


@pytest.mark.parametrize("tile, M, K", [((512, 256, 256), 300, 512), ((256, 128, 256), 200, 768)])
def test_simulated_tma_and_tcgen05_cp_reproduce_dequantize(tile, M, K, seed):
    """TMA (global -> smem stage), tcgen05.cp (atoms -> TMEM), MMA reads: == dequantize(q)."""
    Mb, Nb, Kb = tile
    x = torch.randn(M, K) * torch.exp2(torch.randint(-8, 8, (M, 1)).float())
    q = quantize(x)
    flat = q.scales.flatten()
    rows, s_off, t_off = _layouts(*tile)["SFA"]
    kbs = K // 16
    g_off = dict(zip(((m, kb) for m in range(M) for kb in range(kbs)),
                     scale_offsets_cute(M, K, 1, [(m, 16 * kb, 0) for m in range(M)
                                                  for kb in range(kbs)])))
    sf = torch.zeros(M, kbs, dtype=torch.uint8)
    for m0 in range(0, M, rows):  # CTA tiles of `rows` A rows (Mb / 2)
        for k0 in range(0, kbs, Kb // 16):  # K stages
            smem = torch.zeros(rows * Kb // 16, dtype=torch.uint8)
            for (r, kb), s in s_off.items():
                if m0 + r < M:  # TMA fills rows past M with zeros
                    smem[s] = flat[g_off[m0 + r, k0 + kb]]
            tmem = torch.zeros(128, 64, 4, dtype=torch.uint8)  # lanes x columns x bytes
            groups = _atom_groups(s_off, t_off)  # the s2t copy's atom -> column group
            for a in range(smem.numel() // 512):  # tcgen05.cp 32x128b.warpx4, atom by atom
                for b in range(512):
                    lane, col, byte = b // 16, 4 * groups[a] + (b % 16) // 4, b % 4
                    for qd in range(4):
                        tmem[lane + 32 * qd, col, byte] = smem[a * 512 + b]
            for (r, kb), addrs in t_off.items():
                if m0 + r < M:
                    vals = {int(tmem[_split(v)]) for v in addrs}
                    assert len(vals) == 1
                    sf[m0 + r, k0 + kb] = vals.pop()
    codes = e2m1_decode(unpack_fp4(q.data))
    scale = e4m3_decode(sf).repeat_interleave(16, dim=1)
    assert torch.equal(codes * scale * q.global_scale, dequantize(q))


def _atom_groups(s_off, t_off):
    """Shared atom -> TMEM 4-column group, read off the two CuTe layouts."""
    return {s_off[rk] // 512: _split(t_off[rk][0])[1] // 4 for rk in s_off}


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("mma_k", [64, 128])
def test_mma_scale_columns(tile, mma_k):
    """Each MMA's scale operand starts at the group holding its first 64-K chunk."""
    Mb, Nb, Kb = tile
    for operand, (rows, _, t_off) in _layouts(*tile).items():
        bands = rows // 128 if operand == "SFA" else 1
        for band in range(bands):
            for j in range(Kb // mma_k):
                r, kb = band * 128, j * mma_k // 16
                col = _split(t_off[r, kb][0])[1]
                assert col == S.mma_scale_column(operand, band, j, rows, Kb // 16, mma_k)
