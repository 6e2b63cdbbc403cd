"""Shared fixtures (the GPU skip rule is in the root conftest.py, for examples/ too), and this
directory on sys.path for the shared oracles (`_oracles`)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def seed():
    """A fresh seed per test run, printed on failure so the case can be replayed."""
    import os
    import random

    value = int(os.environ.get("TK_CUTE_SEED", random.randrange(2**31)))
    torch.manual_seed(value)
    print(f"TK_CUTE_SEED={value}")
    return value


@pytest.fixture
def usage_error(capsys):
    """`usage_error(argv, message)`: `python -m tk_cute` with `argv` exits with status 2 and an
    argparse usage error on stderr that names `message` (no traceback)."""
    from tk_cute.__main__ import main

    def check(argv, message):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "usage:" in err and message in err and "Traceback" not in err, err

    return check


def _sync_lint(build):
    """Every tcgen05 kernel a test compiles (`tk_cute.compile.build`) passes the static
    synchronization lint; a test that builds a broken variant on purpose empties
    `compile.BUILD_CHECKS` with monkeypatch. (Hopper kernels are not held to it: the lint reads
    the kernel as one thread, and a test program that commits TMA stores in one `warp == 0`
    branch and waits in another reads as a path without the wait.)"""
    if "tcgen05." in build.ptx and build.sync_findings:
        lines = "\n".join(f"  {f}" for f in build.sync_findings)
        raise AssertionError(f"synchronization lint on {build.arch}:\n{lines}")


@pytest.fixture(autouse=True, scope="session")
def sync_lint():
    from tk_cute import compile as compile_

    compile_.BUILD_CHECKS.append(_sync_lint)
    yield
    compile_.BUILD_CHECKS.remove(_sync_lint)
