"""The blocked (128x4) NVFP4 scale layout: formula == to_blocked == torch's convention == CuTe's
``tile_atom_to_shape_SF`` evaluated by the CuTe DSL itself on the host."""

import ast
import pathlib

import pytest
import torch

from tk_cute.layouts.nvfp4_scales import (
    HostLayout,
    blocked_dims,
    blocked_offset,
    blocked_shape,
    eval_cute_layout,
    from_blocked,
    scale_layout_cute,
    scale_offsets_cute,
    to_blocked,
)

# (M, K elements, L): M % 128 != 0, (K / 16) % 4 != 0, L > 1, and exact multiples.
SHAPES = [(1, 16, 1), (128, 64, 1), (130, 80, 1), (200, 96, 2), (300, 144, 2), (64, 272, 3)]


def ceil_div(a, b):
    return -(-a // b)


def torch_convention_to_blocked(sf: torch.Tensor) -> torch.Tensor:
    """torch ``_scaled_mm``'s to_blocked, rewritten from its definition: pad to
    (128*RM, 4*RK), view (RM, 128, RK, 4), permute (0, 2, 1, 3), reshape (-1, 4, 32, 4),
    transpose (1, 2), reshape (-1, 32, 16); flattened."""
    rows, cols = sf.shape
    rm, rk = ceil_div(rows, 128), ceil_div(cols, 4)
    padded = torch.zeros((rm * 128, rk * 4), dtype=sf.dtype)
    padded[:rows, :cols] = sf
    blocks = padded.view(rm, 128, rk, 4).permute(0, 2, 1, 3)
    return blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()


def torch_own_to_blocked():
    """torch's own ``to_blocked`` from torch/testing/_internal/common_quantized.py.

    That module does not import in this environment (it needs ``expecttest``), so the two
    functions are compiled from its source text. None when torch no longer ships them."""
    import torch.testing

    path = pathlib.Path(torch.testing.__file__).parent / "_internal" / "common_quantized.py"
    if not path.exists():
        return None
    tree = ast.parse(path.read_text())
    names = ("ceil_div", "to_blocked")
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    if len(wanted) != 2:
        return None
    ns = {"torch": torch}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), ns)
    return ns["to_blocked"]


def random_scales(shape):
    return torch.randint(1, 256, shape, dtype=torch.uint8)  # non-zero, so padding is visible


@pytest.mark.parametrize("M, K, L", SHAPES)
def test_round_trip_and_zero_padding(M, K, L, seed):
    kb = ceil_div(K, 16)
    for shape in ((M, kb), (L, M, kb)):
        sf = random_scales(shape)
        blocked = to_blocked(sf)
        lead = shape[:-2]
        assert blocked.shape == blocked_shape(M, K, *lead)
        assert torch.equal(from_blocked(blocked, M, K), sf)
        assert int((blocked != 0).sum()) == sf.numel()  # every padding byte is zero


@pytest.mark.parametrize("M, K, L", SHAPES)
def test_offset_formula_matches_to_blocked(M, K, L, seed):
    kb = ceil_div(K, 16)
    sf = random_scales((L, M, kb))
    flat = to_blocked(sf).flatten()
    l, m, k = torch.meshgrid(torch.arange(L), torch.arange(M), torch.arange(kb), indexing="ij")
    off = blocked_offset(m, k, M, K, l)
    assert torch.equal(flat[off], sf)
    # offsets are a bijection onto the non-padding bytes: no two scales share a byte
    assert off.unique().numel() == off.numel()
    # ints give the same as tensors
    assert blocked_offset(M - 1, kb - 1, M, K, L - 1) == int(off[L - 1, M - 1, kb - 1])


@pytest.mark.parametrize("M, K, L", SHAPES)
def test_matches_torch_scaled_mm_convention(M, K, L, seed):
    sf = random_scales((M, ceil_div(K, 16)))
    mine = to_blocked(sf).flatten()
    assert torch.equal(mine, torch_convention_to_blocked(sf))
    own = torch_own_to_blocked()
    if own is not None:
        assert torch.equal(mine, own(sf).flatten())


def test_torch_own_to_blocked_is_found():
    # torch 2.13 ships it; if this starts failing, the convention test above lost its oracle.
    assert torch_own_to_blocked() is not None


@pytest.mark.parametrize("M, K, L", SHAPES)
def test_matches_cute_tile_atom_to_shape_sf(M, K, L):
    pytest.importorskip("cutlass")
    kb = ceil_div(K, 16)
    cute_offsets = torch.tensor(scale_offsets_cute(M, K, L)).reshape(L, M, kb)
    l, m, k = torch.meshgrid(torch.arange(L), torch.arange(M), torch.arange(kb), indexing="ij")
    assert torch.equal(cute_offsets, blocked_offset(m, k, M, K, l))

    layout = scale_layout_cute(M, K, L)
    rm, rk = blocked_dims(M, K)
    assert layout.shape == (((32, 4), rm), ((16, 4), rk), (1, L))
    assert layout.cosize == L * rm * rk * 512
    # HostLayout evaluates like CuTe, including k not a multiple of 16 (stride 0 inside a scale)
    coords = [(mm, kk, ll) for ll in range(L) for mm in range(0, M, 7) for kk in range(0, K, 5)]
    want = [blocked_offset(m, k // 16, M, K, l) for m, k, l in coords]
    assert [layout(c) for c in coords] == want


def test_cute_offsets_inside_a_scale_and_in_padding():
    pytest.importorskip("cutlass")
    M, K, L = 200, 96, 2
    rm, rk = blocked_dims(M, K)
    # every k of the 16 sharing a scale, and rows/columns in the padding region
    rows = (0, 31, 127, 128, 199, 200, 255)
    coords = [(m, k, l) for l in range(L) for m in rows for k in range(0, 4 * rk * 16, 3)]
    got = scale_offsets_cute(M, K, L, coords)
    assert got == [blocked_offset(m, k // 16, M, K, l) for m, k, l in coords]


def test_eval_cute_layout_generic():
    cute = pytest.importorskip("cutlass.cute")
    coords = [(1, 2), 5, 31]
    layout, offsets = eval_cute_layout(lambda: cute.make_layout((4, 8), stride=(8, 1)), coords)
    assert isinstance(layout, HostLayout) and str(layout) == "(4,8):(8,1)"
    assert offsets == [10, 9, 31] == [layout(c) for c in coords]


def test_bad_arguments():
    with pytest.raises(ValueError, match="M and K must be positive"):
        blocked_dims(0, 16)
    with pytest.raises(ValueError, match=r"must have shape \(\.\.\., 1, 1, 512\)"):
        from_blocked(torch.zeros(2, 1, 512, dtype=torch.uint8), 100, 64)
    with pytest.raises(ValueError, match="to_blocked expects"):
        to_blocked(torch.zeros(4, dtype=torch.uint8))


def test_band_offset_is_the_formula_kernels_call():
    # Kernels address scales with band_offset / atom_offset on device integers; they must be the
    # blocked layout of blocked_offset (itself checked against CuTe's tile_atom_to_shape_SF).
    from tk_cute.layouts.nvfp4_scales import atom_offset, band_offset, blocked_dims

    for M, K in [(130, 272), (256, 64), (300, 1024)]:
        rk = blocked_dims(M, K)[1]
        for m in range(0, 128 * -(-M // 128)):
            for kb in range(0, 4 * rk):
                assert band_offset(m, kb, rk) == blocked_offset(m, kb, M, K)
                assert band_offset(m, kb, rk) % 512 == atom_offset(m, kb)
