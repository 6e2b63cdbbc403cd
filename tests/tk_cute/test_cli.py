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
    (["report", "--mnk", "256,256,100"], "K % 16 == 0"),
    (["report", "--Mb", "384"], "no kernel config"),
    (["emulate", "--arch", "sm_100a", "--mnk", "64,64,40"], "K a multiple of 16"),
    (["emulate", "--arch", "sm_80", "--mnk", "64,64,64"], "invalid choice: 'sm_80'"),
    (["emulate", "--mnk", "64,64,64"], "--arch"),
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
        assert "run in the PTX emulator" in out and "equal the exact product, no hazard" in out


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


@pytest.fixture
def unsupported_gpu(monkeypatch):
    """The process sees one CUDA GPU that tk_cute has no kernels for: an sm_120 card."""
    from tk_cute import arch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (12, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "RTX 5090")
    arch._device_target.cache_clear()
    yield
    arch._device_target.cache_clear()


SUPPORTED = "tk_cute has kernels for sm_90a, sm_100a, sm_103a, sm_107a only"


def test_an_unsupported_gpu_is_named_with_the_way_to_the_cpu_reference(unsupported_gpu):
    """The dispatch and the quantizer's launch (a meta tensor stands in for the CUDA one: the
    device check comes first) say which GPU, what is supported and how to run on the CPU."""
    from tk_cute import arch
    from tk_cute.nvfp4 import launch

    message = rf"RTX 5090 is sm_120; {SUPPORTED}\. The exact reference runs on the CPU"
    with pytest.raises(ValueError, match=message):
        arch.device_target(torch.device("cuda"))
    with pytest.raises(ValueError, match=message):
        launch.quantize(torch.empty(16, 64, device="meta"))


def test_main_job_on_an_unsupported_gpu_runs_the_cpu_checks(unsupported_gpu, monkeypatch,
                                                               capsys):
    import tk_cute.__main__ as cli

    monkeypatch.setattr(cli, "_rubin_compile", lambda M, N, K: "compiled (stubbed here)")
    monkeypatch.setattr(cli, "_hopper_compile", lambda: "compiled (stubbed here)")
    assert main(["run", "--m", "16", "--n", "16", "--k", "32", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "sm_120" in out and SUPPORTED in out and "running the CPU checks instead" in out
    assert "tk_cute NVFP4 on cpu" in out and "check: PASS" in out


def test_emulate_runs_the_targets_kernel_and_checks_it(capsys):
    """`emulate` runs the plan's kernel for a GPU we do not have: exit 0 only when D matches
    the exact reference with no hazard; it says what ran and what it cost."""
    assert main(["emulate", "--arch", "sm_103a", "--mnk", "256,128,256", "--out-dtype",
                 "nvfp4", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "check: PASS: NVFP4 codes and scales bit-exact" in out and "hazards: none" in out
    assert "kernel: sm100 Config(arch='sm_103a'" in out and "out='nvfp4'" in out
    assert "epilogue" in out and "mma" in out and "producer" in out and "per second" in out


def test_emulate_says_when_the_target_has_no_kernel(capsys):
    assert main(["emulate", "--arch", "sm_100a", "--mnk", "64,72,48", "--out-dtype",
                 "nvfp4"]) == 2  # NVFP4 D needs N % 16 (its scale blocks)
    assert "no kernel for this call on sm_100a: " in capsys.readouterr().out


def test_emulate_fails_on_a_wrong_result(monkeypatch, capsys):
    """A kernel whose D differs from the reference makes `emulate` exit 1 (the check is
    real): the emulated MMA is made to read A as zeros."""
    from tk_cute.emulator import tcgen05

    real = tcgen05._fp4_values
    monkeypatch.setattr(tcgen05, "_fp4_values", lambda raw: real(raw) * (raw.shape[0] != 128))
    assert main(["emulate", "--arch", "sm_100a", "--mnk", "256,256,256"]) == 1
    assert "check: FAIL" in capsys.readouterr().out
