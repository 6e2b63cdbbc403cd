"""Test tiers: the CPU tier runs everywhere; tests marked `gpu` skip (not fail) without a GPU."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed():
    """A fresh seed per test run, printed on failure so the case can be replayed."""
    import os
    import random

    value = int(os.environ.get("TK_CUTE_SEED", random.randrange(2**31)))
    torch.manual_seed(value)
    print(f"TK_CUTE_SEED={value}")
    return value
