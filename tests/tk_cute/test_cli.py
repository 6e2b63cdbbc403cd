"""The command line: `python -m tk_cute` (main job, report) and `python -m tk_cute.bench`."""

import pytest
import torch

from tk_cute.__main__ import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name}" in out and desc[:30] in out for name, desc in COMMANDS.items())


@pytest.mark.parametrize("argv, message", [
    (["nope"], "unknown command 'nope'"),
    (["run", "--k", "17"], "--k must be a multiple of 16"),
    (["run", "--m", "0"], "expected a positive integer, got 0"),
    (["report", "--mnk", "0,0,0"], "three positive integers, got '0,0,0'"),
    (["report", "--mnk", "abc"], "three integers"),
    (["report", "--arch", "sm_999"], "invalid choice: 'sm_999'"),
    (["report", "--mnk", "256,256,100"], "K % 256 == 0"),
    (["report", "--Mb", "384"], "no kernel config"),
])
def test_bad_arguments_give_usage_errors(usage_error, argv, message):
    usage_error(argv, message)


def test_main_job_passes_and_says_what_ran(capsys):
    assert main(["run", "--m", "17", "--n", "24", "--k", "48", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert f"on {device}" in out and "check: PASS" in out
    if device == "cpu":
        assert "ran reference" in out and "Rubin (sm_107a) NVFP4 GEMM compiled" in out


def test_main_job_can_fail(monkeypatch, capsys):
    """A wrong GEMM result makes the main job fail (it checks something real)."""
    from tk_cute import nvfp4

    real = nvfp4.gemm

    def off_by_one_element(*args, **kwargs):
        d = real(*args, **kwargs)
        d.view(-1)[7] += 1.0
        return d

    monkeypatch.setattr(nvfp4, "gemm", off_by_one_element)
    assert main(["run", "--m", "16", "--n", "16", "--k", "32", "--seed", "1"]) == 1
    assert "check: FAIL" in capsys.readouterr().out
