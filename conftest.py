"""Test tiers for tests/ and examples/: the CPU tier runs everywhere; tests marked `gpu` skip
(not fail) without a GPU. Tests marked `slow` (the emulator's kernel runs, the notebooks, the
machine-code baselines) run only with `--full` (what `.ci/run` runs); `python -m pytest -q` is
the fast tier."""

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="run the slow tier too (tests marked slow: emulator kernel runs, "
                          "notebooks, machine-code baselines); .ci/run does")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("full"):
        slow = pytest.mark.skip(reason="slow tier (marker slow): python -m pytest --full")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
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
