"""Oracles the test files share (put on sys.path by tests/conftest.py: test files cannot import
each other under --import-mode=importlib). Plain numpy, independent of tk_cute."""

import numpy as np


def nearest_even(v, grid: np.ndarray) -> np.ndarray:
    """Indices of the ascending grid values nearest to v >= 0 (may be +inf), ties to the even
    index, saturating at the last. float64 differences are exact wherever a tie is possible
    (grids of few significant bits)."""
    v = np.asarray(v, dtype=np.float64)
    i = np.clip(np.searchsorted(grid, v, side="right") - 1, 0, len(grid) - 2)
    with np.errstate(invalid="ignore"):  # inf - inf where v = inf; saturated below anyway
        lo, hi = v - grid[i], grid[i + 1] - v
    up = (hi < lo) | ((hi == lo) & (i % 2 == 1))
    return np.where(v >= grid[-1], len(grid) - 1, np.where(up, i + 1, i))


E2M1_MAGS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # FP4 magnitudes, codes 0..7


def _e4m3(b: int) -> float:
    e, m = b >> 3, b & 7
    return m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3_POS = np.array([_e4m3(b) for b in range(0x7F)])  # UE4M3 bytes 0..0x7E, ascending


def slow_quantize(xf: np.ndarray, grid: np.ndarray, global_denom: float, amax_floor: float,
                  global_scale=None):
    """The NVFP4 recipe (shared/reference/nvfp4.md), one 16-element block at a time in numpy
    float32 scalars (IEEE round-to-nearest-even per operation) over an explicit ascending grid
    of block-scale values (UE4M3 or UE5M3), for xf (L, M, K) float32. The decode scale is
    max(amax, amax_floor) / global_denom unless given. Returns (codes (L, M, K) uint8 with the
    sign in bit 3, logical scale bytes (L, M, K / 16) uint8, the decode scale float32)."""
    F = np.float32
    L, M, K = xf.shape
    if global_scale is None:
        s_dec = F(max(F(np.abs(xf).max()), F(amax_floor)) / F(global_denom))
    else:
        s_dec = F(global_scale)
    s_enc = F(F(1) / s_dec)
    codes = np.zeros((L, M, K), np.uint8)
    scales = np.zeros((L, M, K // 16), np.uint8)
    with np.errstate(over="ignore"):  # t may overflow to inf with a user global scale
        for l in range(L):
            for m in range(M):
                for b in range(K // 16):
                    blk = xf[l, m, 16 * b: 16 * b + 16]
                    t = F(F(F(np.abs(blk).max()) / F(6)) * s_enc)
                    sf = int(nearest_even(t, grid))
                    d = max(F(F(grid[sf]) * s_dec), F(2.0**-126))
                    s = F(0) if sf == 0 else F(F(1) / d)
                    y = (blk * s).astype(F)
                    c = nearest_even(np.abs(y), E2M1_MAGS) | np.where(np.signbit(y), 8, 0)
                    codes[l, m, 16 * b: 16 * b + 16] = c
                    scales[l, m, b] = sf
    return codes, scales, s_dec
