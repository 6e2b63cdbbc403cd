"""Shared fixtures (the GPU skip rule is in the root conftest.py, for examples/ too)."""

import pytest
import torch


@pytest.fixture
def seed():
    """A fresh seed per test run, printed on failure so the case can be replayed."""
    import os
    import random

    value = int(os.environ.get("TK_CUTE_SEED", random.randrange(2**31)))
    torch.manual_seed(value)
    print(f"TK_CUTE_SEED={value}")
    return value
