"""tk_cute.emulator.launch: kernel launches captured on the CPU through the DSL's exported host
code and the C stand-in (fixtures in conftest.py; the compiles are shared per session)."""

import hashlib
import threading

import pytest

from tk_cute.arch import target
from tk_cute.emulator import launch as L


def test_nvfp4_launch_matches_its_config(nvfp4):
    cfg, x = nvfp4.cfg, nvfp4.launch
    assert x.arch == "sm_100a"
    assert x.kernel.startswith("kernel_cutlass_kernel_") and "GemmNvfp4Sm100" in x.kernel
    assert f".entry {x.kernel}(" in x.ptx
    # Static persistent scheduler: one cluster (the CTA pair along x) per output tile, here
    # (256 / Mb) * (256 / Nb) = 2 tiles, fewer than the 148 / 2 clusters that fit.
    tiles = (nvfp4.m // cfg.Mb) * (nvfp4.n // cfg.Nb)
    assert x.grid == (cfg.CLUSTER_M, cfg.CLUSTER_N, tiles) == (2, 1, 2)
    assert x.block == (192, 1, 1)  # 6 warps: 4 epilogue, MMA, producer (no CLC warp)
    assert x.cluster == (2, 1, 1)  # a launch attribute only: not in the PTX
    assert x.smem_bytes == cfg.smem_bytes == 74752
    assert x.stream == nvfp4.stream


def test_nvfp4_launch_attributes(nvfp4):
    x = nvfp4.launch
    assert x.attributes["cudaLaunchAttributeClusterDimension"] == (2, 1, 1)
    assert x.attributes["cudaLaunchAttributeProgrammaticStreamSerialization"] == 1  # PDL
    assert x.attributes["cudaLaunchAttributeCooperative"] == 0
    # The host code sets the opt-in maximum less the static shared memory (none).
    assert x.func_attributes == {
        "cudaFuncAttributeMaxDynamicSharedMemorySize": target("sm_100a").smem_bytes,
        "cudaFuncAttributeNonPortableClusterSizeAllowed": 1}
    assert ("cudaDevAttrMaxSharedMemoryPerBlockOptin", 232448) in x.device_queries
    assert x.library_bytes > 10_000  # the fatbin handed to cudaLibraryLoadData


def test_nvfp4_parameters_follow_the_ptx_signature(nvfp4):
    x = nvfp4.launch
    decl = L.entry_params(x.ptx)[x.kernel]
    assert [(p.name, p.ptx_type, p.size, p.align) for p in x.params] == [
        (d.name, d.ptx_type, d.size, d.align) for d in decl]
    assert all(len(p.data) == p.size for p in x.params)
    # Five TMA descriptors (A, B, SFA, SFB, D), each followed by its 12-byte shape parameter.
    assert [i for i, _ in x.tensor_maps()] == [0, 2, 4, 6, 8]
    assert all(x.param(i + 1).size == 12 for i in (0, 2, 4, 6, 8))
    # The two global-scale pointers are passed through as u64 values.
    assert (x.param(10).ptx_type, x.value(10), x.value("param_11")) == (
        "u64", nvfp4.addr["ga"], nvfp4.addr["gb"])
    assert x.raw(10) == nvfp4.addr["ga"].to_bytes(8, "little")
    with pytest.raises(KeyError, match="no parameter"):
        x.param("param_99")


def test_rerun_resets_and_takes_new_values(nvfp4):
    """One compiled program, run again: identical records (state reset, zeroed stack), and new
    sizes reach the grid (tiles, capped at the 74 clusters the compile was given)."""
    K, cfg = nvfp4.K, nvfp4.cfg
    (again,) = nvfp4.program.run(*nvfp4.args)
    assert again == nvfp4.launch
    for size, clusters in ((1024, 32), (4096, 74)):
        args = K.launch_args(cfg, nvfp4.addr, size, size, 512)
        (x,) = nvfp4.program.run(*args)
        assert x.grid == (2, 1, clusters)
        assert x.stream == 0


def test_runs_from_several_threads(nvfp4):
    """Threads sharing one program each get their own launch (its run is serialized)."""
    K, cfg = nvfp4.K, nvfp4.cfg
    out = {}

    def run(i):
        addr = {**nvfp4.addr, "ga": 0x1000 * (i + 1)}
        (x,) = nvfp4.program.run(*K.launch_args(cfg, addr, 256, 256, 512))
        out[i] = x.value(10)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {i: 0x1000 * (i + 1) for i in range(4)}


def test_device_attributes_come_from_the_target_and_can_be_overridden(nvfp4):
    assert L.device_attributes("sm_107a")[97] == target("sm_107a").smem_bytes
    assert L.device_attributes("sm_90a")[16] == 132
    assert 16 not in L.device_attributes("sm_103a")  # the product spans SKUs: not fixed
    (x,) = nvfp4.program.run(*nvfp4.args, device_attributes={97: 100_000})
    assert x.func_attributes["cudaFuncAttributeMaxDynamicSharedMemorySize"] == 100_000
    with pytest.raises(RuntimeError, match="cudaDevAttrMaxSharedMemoryPerBlockOptin"):
        nvfp4.program.run(*nvfp4.args, device_attributes={97: None})
    (x,) = nvfp4.program.run(*nvfp4.args)  # and the program still works afterwards
    assert x == nvfp4.launch


def test_sm90_dense_gemm_launch(sm90):
    x, cfg, kern = sm90.launch, sm90.cfg, sm90.kern
    assert x.arch == "sm_90a" and "GemmSm90" in x.kernel
    assert x.block == (kern.threads, 1, 1) == (384, 1, 1)  # producer + 2 consumer warpgroups
    assert x.cluster == (1, 1, 1)
    tiles = (512 // cfg.Mb) * (1024 // cfg.Nb)
    assert x.grid[0] * x.grid[1] * x.grid[2] == tiles == 16
    assert 200 * 1024 < x.smem_bytes <= target("sm_90a").smem_bytes  # stages fill the target
    assert len(x.tensor_maps()) == 3  # A, B (loads) and C (store)


def test_peer_launch(peer):
    """NVIDIA's example runs through the same entry points (no PDL attribute set)."""
    x = peer.launch
    assert x.grid == (2, 1, 2) and x.block == (192, 1, 1) and x.cluster == (2, 1, 1)
    assert x.smem_bytes == peer.kern.shared_storage.size_in_bytes()
    assert x.attributes["cudaLaunchAttributeProgrammaticStreamSerialization"] == 0
    assert len(x.tensor_maps()) == 5


def test_entry_params_and_static_shared_memory_from_ptx():
    ptx = """
.shared .align 8 .b8 bar[64];
.shared .align 16 .b32 table[4][8];
.extern .shared .align 1024 .b8 dyn[];
.visible .entry k(
	.param .align 64 .b8 k_param_0[128],
	.param .u64 .ptr .global .align 16 k_param_1,
	.param .u32 k_param_2,
	.param .align 4 .b8 k_param_3[12],
	.param .f64 k_param_4
)
{ ret; }
"""
    assert L.entry_params(ptx) == {"k": [
        ("param_0", "b8", 128, 64), ("param_1", "u64", 8, 8), ("param_2", "u32", 4, 4),
        ("param_3", "b8", 12, 4), ("param_4", "f64", 8, 8)]}
    assert L.static_shared_bytes(ptx) == 64 + 4 * 4 * 8


def test_standin_is_built_once_per_source_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_CUTE_EMULATOR_CACHE", str(tmp_path))
    path = L.standin_object()
    digest = hashlib.sha256(L.STANDIN_SOURCE.read_bytes()).hexdigest()[:16]
    assert path == tmp_path / f"standin-{digest}.o" and path.stat().st_size > 0
    mtime = path.stat().st_mtime_ns
    assert L.standin_object() == path and path.stat().st_mtime_ns == mtime  # not rebuilt


def test_missing_c_compiler_is_named(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RuntimeError, match="cc, gcc, clang"):
        L.c_compiler()


def test_unknown_target_is_rejected():
    with pytest.raises(ValueError, match="unsupported target"):
        L.HostProgram(lambda: None, arch="sm_80")


def test_stand_in_cache_must_be_private(tmp_path, monkeypatch):
    """The stand-in object found in the cache is linked into this process: a cache directory
    others can write is refused, as the DSL's own (tk_cute.dsl_cache)."""
    import os

    from tk_cute.emulator import launch

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TK_CUTE_EMULATOR_CACHE", str(shared))
    with pytest.raises(PermissionError, match="group or others may write"):
        launch.cache_dir()
    private = tmp_path / "private"
    monkeypatch.setenv("TK_CUTE_EMULATOR_CACHE", str(private))
    assert launch.cache_dir() == private and (os.stat(private).st_mode & 0o777) == 0o700
