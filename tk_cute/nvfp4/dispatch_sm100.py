"""`gemm_sm100(a, b)`: NVFP4 ``D = a @ b^T`` on Blackwell (sm_100a, sm_103a) and Rubin (sm_107a).

Validates the operands against what `kernels/gemm/nvfp4_sm100.py` needs, picks its `Config`
(`heuristics.sm100_config`), compiles once per (config, target, cluster budget) (`KernelCache`) and
launches on the current stream. The global scales stay on the device: the kernel reads both
0-dim fp32 tensors and multiplies in its epilogue (no `.item()`, no host sync).
`gemm_sm100_nvfp4(a, b, global_scale)`: the same GEMM with D quantized to NVFP4 in the epilogue
(D's decode scale given, as a 0-dim tensor the kernel reads), returned as an NVFP4Tensor whose
`saturated` is a 0-dim int32 device flag. UE5M3 operands (``scale_format == "ue5m3"``) run on
sm_107a only (`arch.Target.ue5m3_scales`); both operands must share one scale format (the MMA
takes one scale type).

`prepare` does everything but compile and launch; the CPU tests build the kernel from the
arguments it produces (`compile_launch(..., keep=True)`) for each target, so the argument
conversion here and the kernel's compiled signature are checked together.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from tk_cute import arch
from tk_cute.layouts import nvfp4_codes
from tk_cute.runtime import KernelCache, compile_locked, output, sm_count

from . import heuristics, validate
from .tensor import NVFP4Tensor

TARGETS = tuple(t.name for t in arch.TARGETS.values() if t.fp4_tensor_cores)  # tcgen05 FP4
OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
NVFP4 = "nvfp4"  # out_dtype of an NVFP4 D
_CACHE = KernelCache()


@dataclass(frozen=True)
class Launch:
    """One call's kernel config, `GemmNvfp4Sm100.__call__` arguments and output tensor."""

    config: object  # kernels.gemm.nvfp4_sm100.Config
    args: tuple  # compile-time arguments (with the Constexpr cluster budget)
    out: torch.Tensor | NVFP4Tensor
    wide: torch.Tensor | None = None  # D with rows `d_pitch` apart where N is off 16 bytes

    def finish(self):
        """After the kernel: D from the row-padded buffer into `out` (one copy; none where
        D's rows are 16-byte aligned)."""
        if self.wide is not None:
            self.out.copy_(self.wide[..., :self.out.shape[-1]])
        return self.out

    @property
    def key(self):
        from tk_cute.kernels.gemm.nvfp4_sm100 import CLUSTERS

        return self.config, self.args[CLUSTERS]

    def runtime_args(self, stream) -> tuple:
        """What the compiled function takes: no Constexpr, the launch stream last."""
        from tk_cute.kernels.gemm.nvfp4_sm100 import CLUSTERS

        return (*self.args[:CLUSTERS], stream)


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
    any M, N >= 1, K a multiple of 16, bf16 / fp16 / fp32 output (a torch dtype or its name);
    or "nvfp4" output (`gemm_sm100_nvfp4`) with N a multiple of 16 (D's scale blocks)."""
    if min(m, n, k) < 1 or k % 16:
        return False
    if out_dtype == NVFP4:
        return n % 16 == 0
    name = out_dtype if isinstance(out_dtype, str) else OUT_DTYPES.get(out_dtype)
    return name in OUT_DTYPES.values()


def _check(a, b, out_dtype) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, NVFP4Tensor):
            raise TypeError(f"gemm_sm100 operand {name} must be an NVFP4Tensor, got "
                            f"{type(t).__name__}")
    if out_dtype != NVFP4 and out_dtype not in OUT_DTYPES:
        raise TypeError(f"gemm_sm100 out_dtype must be torch.bfloat16, torch.float16 or "
                        f"torch.float32, got {out_dtype}")
    validate.one_scale_format(a, b, "gemm_sm100")
    if a.ndim != b.ndim or a.K != b.K or (a.ndim == 3 and a.L != b.L):
        raise ValueError(f"gemm_sm100 needs (M, K) x (N, K) or (L, M, K) x (L, N, K) with one K "
                         f"and L; got a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"gemm_sm100 operands on different devices: {a.device}, {b.device}")
    for name, t in (("a", a), ("b", b)):
        rows = nvfp4_codes.strides(t.shape[-2], t.K, t.ndim == 3)
        for part, x, align, ok in (
                ("data", t.data, 32, tuple(t.data.stride()) == rows),
                ("scales", t.scales, 16, t.scales.is_contiguous())):
            if not ok or x.data_ptr() % align:
                raise ValueError(f"gemm_sm100: {name}.{part} must be laid out as NVFP4Tensor "
                                 f"makes it (codes: rows nvfp4_codes.row_pitch(K) bytes apart) "
                                 f"and {align}-byte aligned (TMA), got stride {x.stride()}, "
                                 f"address {x.data_ptr():#x}")


def scale_format(fmt: str, target: str) -> str:
    """The operands' scale format `fmt` as the kernel's `Config.sf`; ValueError where `target`
    has no MMA for it (UE5M3: `arch.Target.ue5m3_scales`, sm_107a)."""
    if fmt == "ue5m3" and not arch.target(target).ue5m3_scales:
        raise ValueError(f"UE5M3 block scales need a Rubin (sm_107a) block-scaled MMA; this GPU "
                         f"is {target} (its MMA takes UE4M3 NVFP4 scales): quantize with "
                         f"scale_dtype='ue4m3'")
    return fmt


def prepare(a: NVFP4Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16, config=None,
            out: torch.Tensor | NVFP4Tensor | None = None, out_global_scale=None,
            target: str | None = None) -> Launch:
    """Validate, pick the config, allocate D and build the kernel arguments (no compile).
    `out_dtype` "nvfp4": D is an NVFP4Tensor with decode scale `out_global_scale` (a float32
    0-dim tensor on the operands' device, already checked) or `out`'s. `target`: the arguments
    for that GPU whatever the operands' device (`tk_cute.emulator` runs them on the CPU)."""
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    _check(a, b, out_dtype)
    if target is not None and target not in TARGETS:
        raise ValueError(f"gemm_sm100 runs on {', '.join(TARGETS)}; target={target!r}")
    sms = (arch.target(target).sm_count or 148) if target else None
    target = target or device_target(a.device)
    M, N, Kdim, L = a.M, b.M, a.K, a.L or 1
    name = NVFP4 if out_dtype == NVFP4 else OUT_DTYPES[out_dtype]
    sf = scale_format(a.scale_format, target)
    cfg = config or heuristics.sm100_config(target, M, N, Kdim, out=name, sf=sf)
    if cfg.arch != target or cfg.out != name or cfg.sf != sf:
        raise ValueError(f"config is for {cfg.arch} / {cfg.out} / {cfg.sf} scales; the call "
                         f"needs {target} / {name} / {sf}")
    shape = (M, N) if a.L is None else (L, M, N)
    wide = None
    if name == NVFP4:
        if N % 16:
            raise ValueError(f"NVFP4 D needs N % 16 == 0 (16-element scale blocks along its "
                             f"rows); got N={N}")
        d = validate.nvfp4_out(shape, a.device, out, out_global_scale)
        addr = {"d": d.data, "d_sf": d.scales, "d_gs": d.global_scale, "flag": d.saturated}
    else:
        d = output(out, shape, out_dtype, a.device, "gemm_sm100")
        pitch = K.d_pitch(N, name)
        if pitch != N:  # rows off 16 bytes: the kernel writes padded rows, `finish` copies
            wide = torch.empty((*shape[:-1], pitch), dtype=out_dtype, device=a.device)
        addr = {"d": d if wide is None else wide}
    addr.update(a=a.data, b=b.data, sfa=a.scales, sfb=b.scales, ga=a.global_scale,
                gb=b.global_scale)
    clusters = (sms or sm_count(a.device)) // (cfg.CLUSTER_M * cfg.CLUSTER_N)
    args = K.launch_args(cfg, {k: t.data_ptr() for k, t in addr.items()}, M, N, Kdim, L,
                         clusters)
    return Launch(cfg, args, d, wide)


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


class UnverifiedKernelWarning(UserWarning):
    """A Blackwell / Rubin kernel is about to run on a GPU for the first time in this process:
    tk_cute has verified it by compiling it and by running it in its PTX emulator
    (`tk_cute.emulator`), never on such a GPU. Silence it with
    ``warnings.filterwarnings("ignore", category=UnverifiedKernelWarning)``."""


def _compile_first(launch: Launch):
    """Compile `launch`'s kernel for its first call in this process, saying once how it was
    verified (`UnverifiedKernelWarning`)."""
    cfg = launch.config
    warnings.warn(UnverifiedKernelWarning(
        f"tk_cute's {cfg.arch} NVFP4 GEMM (kernels/gemm/nvfp4_sm100.py, Mb={cfg.Mb} "
        f"Nb={cfg.Nb} Kb={cfg.Kb}, out {cfg.out}, {cfg.scheduler} scheduler) runs on this GPU "
        f"for the first time: it was verified by compiling and in tk_cute's PTX emulator "
        f"(python -m tk_cute emulate), never on {cfg.arch} hardware. To silence: "
        f"warnings.filterwarnings('ignore', category=tk_cute.nvfp4.dispatch_sm100."
        f"UnverifiedKernelWarning)"), stacklevel=4)
    return compile_launch(launch)


def gemm_sm100_nvfp4(a: NVFP4Tensor, b: NVFP4Tensor, global_scale: torch.Tensor, config=None,
                     out: NVFP4Tensor | None = None) -> NVFP4Tensor:
    """``D = gA gB (A @ B^T)`` quantized to NVFP4 in the epilogue (sm_100a / sm_103a / sm_107a):
    per 16 columns of a D row the block amax (sm_103a / sm_107a: from the reducing TMEM load),
    then the recipe of `tk_cute.nvfp4.quantize` with decode scale `global_scale` on the fp32
    values fl(acc * gA gB). D never exists in fp32 or bf16 (0.5625 B written per element).

    Args:
        a, b: NVFP4Tensor (M, K) x (N, K) (or batched) on one CUDA device, one scale format.
        global_scale: D's decode scale, a float32 0-dim tensor on that device (validated by
            the caller: positive, finite, at least 2^-126), or None with `out`.
        config: a `Config` with ``out="nvfp4"`` overriding `heuristics.sm100_config`.
        out: optional UE4M3 NVFP4Tensor of D's shape whose data and scales are overwritten.

    Returns:
        D, with attribute `saturated` (0-dim int32 on the device: 1 where some block scale
        saturated at 448, i.e. the global scale was too small for those values).

    Raises:
        ValueError: as `gemm_sm100`, and N % 16 != 0.
    """
    from tk_cute.runtime import stream

    gs = out.global_scale if global_scale is None else global_scale
    launch = prepare(a, b, NVFP4, config, out, gs)
    fn = _CACHE.get(launch.key, lambda: _compile_first(launch))
    fn(*launch.runtime_args(stream()))
    return launch.out


def gemm_sm100(a: NVFP4Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16, config=None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``D = gA gB (A @ B^T)`` for NVFP4 operands on sm_100a / sm_103a / sm_107a.

    Args:
        a: NVFP4Tensor (M, K) or (L, M, K) on a CUDA device.
        b: NVFP4Tensor (N, K) or (L, N, K) on the same device.
        out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32.
        config: a `kernels.gemm.nvfp4_sm100.Config` overriding `heuristics.sm100_config`.
        out: optional contiguous (M, N) / (L, M, N) tensor of `out_dtype` to write D into.

    Returns:
        D of `out_dtype`. Any M and N (TMA zero-fills / clips the tails; where D's rows are not
        a multiple of 16 bytes the kernel writes rows padded to `d_pitch` and one copy puts
        them in place); K a multiple of 16 (the last K stage partly zero-filled).

    Raises:
        TypeError: operand or out_dtype types.
        ValueError: shapes, devices, layout, K % 16, or a GPU that is not sm_100a, sm_103a or
            sm_107a.
    """
    from tk_cute.runtime import stream

    launch = prepare(a, b, out_dtype, config, out)
    fn = _CACHE.get(launch.key, lambda: _compile_first(launch))
    fn(*launch.runtime_args(stream()))
    return launch.finish()


def compile_seconds() -> dict:
    """Seconds each cached (config, cluster budget) took to compile."""
    return dict(_CACHE.compile_seconds)
