"""Packaging, targets, the compile helper and the main job."""

import subprocess
import sys
import zipfile

import pytest

from tk_cute import arch


def test_wheel_maps_layouts_and_kernels_under_tk_cute(tmp_path):
    # A plain (non-editable) install must carry layouts/ and kernels/ as tk_cute.layouts and
    # tk_cute.kernels, never as generic top-level packages.
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(root)], check=True)
    (wheel,) = tmp_path.glob("tk_cute-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "tk_cute/layouts/nvfp4_scales.py" in names
    assert "tk_cute/kernels/gemm/gemm_sm90.py" in names
    assert "tk_cute/nvfp4/quantize.py" in names
    assert not any(n.startswith(("layouts/", "kernels/", "tests/")) for n in names)


def test_targets_carry_their_limits():
    assert arch.target("sm_90a").tmem_columns == 0 and not arch.target("sm_90a").fp4_tensor_cores
    assert arch.target("sm_100a").tmem_columns == 512 and arch.target("sm_100a").nvfp4_mma_k == 64
    rubin = arch.target("sm_107a")
    assert (rubin.tmem_columns, rubin.nvfp4_mma_k, rubin.sm_count) == (576, 128, 224)
    assert rubin.smem_bytes == 327 * 1024 > arch.target("sm_100a").smem_bytes
    assert [t.compute_capability for t in arch.TARGETS.values()] == [
        (9, 0), (10, 0), (10, 3), (10, 7)]


def test_unknown_target_is_rejected_with_the_known_list():
    with pytest.raises(ValueError, match=r"unsupported target 'sm_89'.*sm_90a, sm_100a"):
        arch.target("sm_89")


def test_current_is_none_without_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert arch.current() is None


def test_compile_target_follows_env(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_103a")
    assert arch.compile_target().name == "sm_103a"


def test_main_job_runs_and_passes():
    out = subprocess.run([sys.executable, "-m", "tk_cute", "--m", "64", "--n", "128", "--k",
                          "256", "--seed", "3"], capture_output=True, text=True, check=True).stdout
    assert "0.5625 bytes/element" in out and "check: PASS" in out


def test_a_plain_install_has_what_the_library_imports():
    """`pip install .` (no extra) runs the main job and every CLI command (checked by hand in a
    fresh venv, 2026-12-04): every third-party package the library's code imports, and the
    CUDA tools `tk_cute.compile` runs, are base dependencies, not the dev extra."""
    import ast
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    base = {d.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()
            for d in project["dependencies"]}
    # import name -> distribution
    dist = {"cutlass": "nvidia-cutlass-dsl", "cuda": "nvidia-cutlass-dsl", "torch": "torch",
            "nvidia": "nvidia-cuda-nvdisasm",  # nvidia.cu13: the 13.5 tools (`compile.cuda_tool`)
            "numpy": "numpy", "matplotlib": "matplotlib"}
    optional = {"transformers", "compressed_tensors", "safetensors", "torchao", "IPython",
                "humming", "flashinfer", "tvm_ffi", "hypothesis", "pytest"}  # guarded imports
    seen = set()
    for folder in ("tk_cute", "kernels", "layouts"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and not node.level
                         and node.module else [])
                seen.update(n.split(".")[0] for n in names)
    third_party = {n for n in seen - set(sys.stdlib_module_names) - optional
                   if n not in ("tk_cute", "kernels", "layouts")}
    assert third_party <= set(dist), f"imports with no known distribution: {third_party - set(dist)}"
    assert {dist[n] for n in third_party} <= base
    assert {"nvidia-cuda-nvdisasm", "nvidia-cuda-cuobjdump"} <= base
