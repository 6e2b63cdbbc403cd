"""Kernel launches captured once per session (each compile takes seconds) and shared by
test_launch.py and test_tensormap.py: tk_cute's NVFP4 sm100 GEMM, its sm_90a dense GEMM and
NVIDIA's block-scaled example (skipped where ../shared/peers/cutlass/ is absent)."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

# NVIDIA's example: where the other peer tests look (.peers/ in the checkout), else beside it.
_ROOT = Path(__file__).resolve().parents[3]
PEER = next((p for p in (_ROOT / ".peers", _ROOT.parent / "shared" / "peers" / "cutlass")
             if (p / "dense_blockscaled_gemm_persistent.py").exists()),
            _ROOT.parent / "shared" / "peers" / "cutlass") / "dense_blockscaled_gemm_persistent.py"

# Distinct fake device addresses per operand: a decoded map must name its own.
ADDR = dict(a=0x10000000, b=0x20000000, sfa=0x30000000, sfb=0x40000000, d=0x50000000,
            ga=0x60000000, gb=0x70000000)
STREAM = 0xABC0


@pytest.fixture(scope="session")
def nvfp4():
    """sm_100a NVFP4 GEMM, 256 x 256 x 512, Config(Mb=256, Nb=128, Kb=256, 2 stages, static
    scheduler): the `HostProgram` and its launch."""
    import cuda.bindings.driver as cuda
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    from tk_cute.emulator.launch import HostProgram
    from tk_cute.ops import schedule

    cfg = K.Config(arch="sm_100a", Mb=256, Nb=128, Kb=256, LOAD_PIPE_DEPTH=2,
                   scheduler=schedule.STATIC)
    m = n = 256
    k = 512
    args = K.launch_args(cfg, ADDR, m, n, k, stream=cuda.CUstream(STREAM))
    program = HostProgram(K.GemmNvfp4Sm100(cfg), *args, arch=cfg.arch)
    (launch,) = program.run(*args)
    return SimpleNamespace(cfg=cfg, K=K, m=m, n=n, k=k, program=program, launch=launch,
                           args=args, addr=ADDR, stream=STREAM)


@pytest.fixture(scope="session")
def sm90():
    """sm_90a dense bf16 GEMM (`GemmSm90.call_ptrs`), M, N, K = 512, 1024, 256, row-major."""
    from tk_cute.kernels.gemm import gemm_sm90
    from tk_cute.kernels.gemm.gemm_sm90 import Config, GemmSm90

    from tk_cute.emulator.launch import capture

    cfg = Config()
    values = dict(a=0x10000000, b=0x20000000, c=0x30000000, partials=0x40000000,
                  flags=0x50000000, M=512, N=1024, K=256, lda=256, ldb=256, ldc=1024, ctas=1,
                  stream=0)
    kern = GemmSm90(cfg)
    launch = capture(kern.call_ptrs, 132, *gemm_sm90.signature(cfg).dsl_values(values),
                     arch="sm_90a")
    return SimpleNamespace(cfg=cfg, kern=kern, values=values, launch=launch)


@pytest.fixture(scope="session")
def peer():
    """NVIDIA's dense_blockscaled_gemm_persistent.py, 256 x 128 tile, 2 x 1 cluster, NVFP4
    (UE4M3 scales, bf16 out), the nvfp4 fixture's problem and addresses."""
    if not PEER.exists():
        pytest.skip(f"NVIDIA's example is absent (looked in .peers/ and {PEER.parent})")
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import OperandMajorMode
    from cutlass.cute.runtime import make_ptr
    from cutlass.tensor_utils import LayoutEnum

    from tk_cute.emulator.launch import capture

    spec = importlib.util.spec_from_file_location("tk_cute_emulator_peer", PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kern = mod.Sm100BlockScaledPersistentDenseGemmKernel(16, (256, 128), (2, 1))
    fp4, sf = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    ptr = lambda dt, key, align: make_ptr(dt, ADDR[key], cute.AddressSpace.gmem,
                                          assumed_align=align)
    args = (ptr(fp4, "a", 32), ptr(fp4, "b", 32), ptr(sf, "sfa", 16), ptr(sf, "sfb", 16),
            ptr(cutlass.BFloat16, "d", 16),
            (OperandMajorMode.K, OperandMajorMode.K, LayoutEnum.ROW_MAJOR),
            tuple(cutlass.Int32(x) for x in (256, 256, 512, 1)), 74, cuda.CUstream(0))
    return SimpleNamespace(kern=kern, launch=capture(kern, *args, arch="sm_100a"), addr=ADDR)
