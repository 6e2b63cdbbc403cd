"""Test tiers for tests/ and examples/: the CPU tier runs everywhere; tests marked `gpu` skip
(not fail) without a GPU."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.device_count() < 2:  # tensor-parallel tests (marker multigpu)
        multi = pytest.mark.skip(reason="needs 2 or more CUDA GPUs (marker multigpu)")
        for item in items:
            if "multigpu" in item.keywords:
                item.add_marker(multi)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
