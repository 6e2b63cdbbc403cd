"""`gemm_sm100(a, b)`: NVFP4 ``D = a @ b^T`` on Blackwell (sm_100a, sm_103a) and Rubin (sm_107a).

Validates the operands against what `kernels/gemm/nvfp4_sm100.py` needs, picks its `Config`
(`heuristics.sm100_config`), compiles once per (config, target, cluster budget) (`KernelCache`) and
launches on the current stream. The global scales stay on the device: the kernel reads both
0-dim fp32 tensors and multiplies in its epilogue (no `.item()`, no host sync).

`prepare` does everything but compile and launch; the CPU tests build the kernel from the
arguments it produces (`compile_launch(..., keep=True)`) for each target, so the argument
conversion here and the kernel's compiled signature are checked together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tk_cute import arch
from tk_cute.runtime import KernelCache, compile_locked

from . import heuristics
from .tensor import NVFP4Tensor

TARGETS = ("sm_100a", "sm_103a", "sm_107a")
OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_CACHE = KernelCache()


@dataclass(frozen=True)
class Launch:
    """One call's kernel config, `GemmNvfp4Sm100.__call__` arguments and output tensor."""

    config: object  # kernels.gemm.nvfp4_sm100.Config
    args: tuple  # compile-time arguments (with the Constexpr cluster budget)
    out: torch.Tensor

    @property
    def key(self):
        return self.config, self.args[11]

    def runtime_args(self, stream) -> tuple:
        """What the compiled function takes: no Constexpr, the launch stream last."""
        return (*self.args[:11], stream)


def device_target(device: torch.device) -> str:
    """The tk_cute target of `device`; ValueError unless a CUDA device of sm_100a/103a/107a."""
    if device.type != "cuda":
        raise ValueError(f"gemm_sm100 needs CUDA tensors, got device {device}")
    name = arch.device_target(device).name
    if name not in TARGETS:
        raise ValueError(f"gemm_sm100 runs on {', '.join(TARGETS)}; {device} is {name}")
    return name


def supports(m: int, n: int, k: int, out_dtype="bfloat16") -> bool:
    """Whether `gemm_sm100` takes an (m, n, k) NVFP4 x NVFP4 GEMM (on an sm_100a/103a/107a GPU):
    K a multiple of the configs' Kb (256), N of 8, bf16/fp16 output (a torch dtype or its
    name)."""
    names = set(OUT_DTYPES.values())
    out_ok = out_dtype in names if isinstance(out_dtype, str) else out_dtype in OUT_DTYPES
    return k % 256 == 0 and n % 8 == 0 and out_ok and min(m, n, k) > 0


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(a, b, out_dtype) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, NVFP4Tensor):
            raise TypeError(f"gemm_sm100 operand {name} must be an NVFP4Tensor, got "
                            f"{type(t).__name__}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"gemm_sm100 out_dtype must be torch.bfloat16 or torch.float16, got "
                        f"{out_dtype}")
    if a.ndim != b.ndim or a.K != b.K or (a.ndim == 3 and a.L != b.L):
        raise ValueError(f"gemm_sm100 needs (M, K) x (N, K) or (L, M, K) x (L, N, K) with one K "
                         f"and L; got a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"gemm_sm100 operands on different devices: {a.device}, {b.device}")
    for name, t in (("a", a), ("b", b)):
        for part, x, align in (("data", t.data, 32), ("scales", t.scales, 16)):
            if not x.is_contiguous() or x.data_ptr() % align:
                raise ValueError(f"gemm_sm100: {name}.{part} must be contiguous and {align}-byte "
                                 f"aligned (TMA), got stride {x.stride()}, address "
                                 f"{x.data_ptr():#x}")


def prepare(a: NVFP4Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16, config=None,
            out: torch.Tensor | None = None) -> Launch:
    """Validate, pick the config, allocate D and build the kernel arguments (no compile)."""
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    _check(a, b, out_dtype)
    target = device_target(a.device)
    M, N, Kdim, L = a.M, b.M, a.K, a.L or 1
    cfg = config or heuristics.sm100_config(target, M, N, Kdim, out=OUT_DTYPES[out_dtype])
    if cfg.arch != target or cfg.out != OUT_DTYPES[out_dtype]:
        raise ValueError(f"config is for {cfg.arch} / {cfg.out}; the call needs {target} / "
                         f"{OUT_DTYPES[out_dtype]}")
    if Kdim % cfg.Kb:
        raise ValueError(f"gemm_sm100 needs K % {cfg.Kb} == 0 (one pipeline stage holds "
                         f"Kb={cfg.Kb} elements of K); got K={Kdim}")
    if N % 8:
        raise ValueError(f"gemm_sm100 needs N % 8 == 0 (16-byte rows of D for the TMA store); "
                         f"got N={N}")
    shape = (M, N) if a.L is None else (L, M, N)
    d = torch.empty(shape, dtype=out_dtype, device=a.device) if out is None else out
    if d.shape != shape or d.dtype != out_dtype or not d.is_contiguous() or d.device != a.device:
        raise ValueError(f"out must be a contiguous {shape} {out_dtype} tensor on {a.device}; "
                         f"got {tuple(d.shape)} {d.dtype} on {d.device}")
    addr = {"a": a.data, "b": b.data, "sfa": a.scales, "sfb": b.scales, "d": d,
            "ga": a.global_scale, "gb": b.global_scale}
    clusters = sm_count(a.device) // (cfg.CLUSTER_M * cfg.CLUSTER_N)
    args = K.launch_args(cfg, {k: t.data_ptr() for k, t in addr.items()}, M, N, Kdim, L,
                         clusters)
    return Launch(cfg, args, d)


def compile_launch(launch: Launch, keep: bool = False):
    """Compile the kernel for `launch` (its config's target). keep=True returns
    (`tk_cute.compile.Build` with PTX, SASS and resources, the kernel object) instead of the
    bare compiled function."""
    from tk_cute.compile import build
    from tk_cute.kernels.gemm.nvfp4_sm100 import GemmNvfp4Sm100

    kern = GemmNvfp4Sm100(launch.config)
    if keep:
        return build(kern, *launch.args, arch=launch.config.arch), kern
    return compile_locked(kern, *launch.args, options=f"--gpu-arch {launch.config.arch}")


def gemm_sm100(a: NVFP4Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16, config=None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``D = gA gB (A @ B^T)`` for NVFP4 operands on sm_100a / sm_103a / sm_107a.

    Args:
        a: NVFP4Tensor (M, K) or (L, M, K) on a CUDA device.
        b: NVFP4Tensor (N, K) or (L, N, K) on the same device.
        out_dtype: torch.bfloat16 (default) or torch.float16.
        config: a `kernels.gemm.nvfp4_sm100.Config` overriding `heuristics.sm100_config`.
        out: optional contiguous (M, N) / (L, M, N) tensor of `out_dtype` to write D into.

    Returns:
        D of `out_dtype`. M may be any size (TMA zero-fills / clips the tails); K must be a
        multiple of the config's Kb (256) and N of 8.

    Raises:
        TypeError: operand or out_dtype types.
        ValueError: shapes, devices, alignment, K % Kb, N % 8, or a GPU that is not sm_100a,
            sm_103a or sm_107a.
    """
    from tk_cute.runtime import stream

    launch = prepare(a, b, out_dtype, config, out)
    fn = _CACHE.get(launch.key, lambda: compile_launch(launch))
    fn(*launch.runtime_args(stream()))
    return launch.out


def compile_seconds() -> dict:
    """Seconds each cached (config, cluster budget) took to compile."""
    return dict(_CACHE.compile_seconds)
