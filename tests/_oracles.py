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
