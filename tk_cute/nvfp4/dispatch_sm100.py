"""`gemm_sm100(a, b)`: NVFP4 ``D = a @ b^T`` on Blackwell (sm_100a, sm_103a) and Rubin (sm_107a).

Validates the operands against what `kernels/gemm/nvfp4_sm100.py` needs, picks its `Config`
(`tk_cute.tuning.sm100.w4a4_config`, a cost model), compiles once per (config, target, cluster
budget) (`KernelCache`) and launches on the current stream. The config may swap the operands
(the weights as the MMA's A, D stored transposed: small M) and split K (`SPLIT_K`: the kernel
writes fp32 partial D's that `Launch.finish` sums in fp32, then casts into D: two torch
reductions after the kernel). The global scales stay on the device: the kernel reads both
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
from tk_cute.launcher import KernelCache
from tk_cute.runtime import device_index, dtype_name, output, raw_stream, sm_count
from tk_cute.tuning import sm100 as sm100_tuning

from . import validate
from .tensor import NVFP4Tensor

TARGETS = tuple(t.name for t in arch.TARGETS.values() if t.fp4_tensor_cores)  # tcgen05 FP4
NVFP4 = "nvfp4"  # out_dtype of an NVFP4 D
_CACHE = KernelCache()


@dataclass(frozen=True)
class Launch:
    """One call's kernel config, launch values (`signature`'s names: raw addresses and sizes),
    cluster budget (the W4A4 kernel's Constexpr; None for W4A16) and output tensor."""

    config: object  # kernels.gemm.nvfp4_sm100.Config or nvfp4_w4a16_sm100.Config
    values: dict
    clusters: int | None
    out: torch.Tensor | NVFP4Tensor
    wide: torch.Tensor | None = None  # what the kernel writes where it is not `out`: D with
    # rows `d_pitch` apart (N off 16 bytes), or split K's fp32 partial D's (L * splits, M, pitch)
    splits: int = 1

    def finish(self):
        """After the kernel: D from the kernel's buffer into `out`: none where the kernel wrote
        `out`; the rows unpadded (one copy); split K's partial D's summed in fp32, then cast."""
        if self.wide is not None:
            d = self.wide[..., :self.out.shape[-1]]
            if self.config.SPLIT_K > 1:
                d = d.unflatten(0, (-1, self.splits)).sum(1).reshape(self.out.shape)
            self.out.copy_(d)
        return self.out

    @property
    def w4a16(self) -> bool:
        return self.clusters is None

    @property
    def module(self):
        from tk_cute.kernels.gemm import nvfp4_sm100, nvfp4_w4a16_sm100

        return nvfp4_w4a16_sm100 if self.w4a16 else nvfp4_sm100

    @property
    def key(self):
        return self.config, self.clusters

    @property
    def constexpr(self) -> tuple:
        """The compile-time arguments before the runtime ones (the cluster budget)."""
        return () if self.w4a16 else (self.clusters,)

    @property
    def args(self) -> tuple:
        """The kernel's `__call__` arguments as DSL objects, null stream (what a build from
        fake pointers and the emulator's host capture take)."""
        values = {**self.values, "stream": 0}
        return (*self.constexpr, *self.module.signature(self.config).dsl_values(values))

    def kernel(self):
        """The kernel object of this launch's config."""
        from tk_cute.kernels.gemm.nvfp4_sm100 import GemmNvfp4Sm100
        from tk_cute.kernels.gemm.nvfp4_w4a16_sm100 import GemmW4A16Sm100

        return (GemmW4A16Sm100 if self.w4a16 else GemmNvfp4Sm100)(self.config)


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
    name = out_dtype if isinstance(out_dtype, str) else dtype_name(out_dtype)
    return name in map(dtype_name, validate.OUT_DTYPES)


def _check(a, b, out_dtype) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, NVFP4Tensor):
            raise TypeError(f"gemm_sm100 operand {name} must be an NVFP4Tensor, got "
                            f"{type(t).__name__}")
    if out_dtype != NVFP4 and out_dtype not in validate.OUT_DTYPES:
        raise TypeError(f"gemm_sm100 out_dtype must be torch.bfloat16, torch.float16 or "
                        f"torch.float32, got {out_dtype}")
    validate.one_scale_format(a, b, "gemm_sm100")
    if a.ndim != b.ndim or a.K != b.K or (a.ndim == 3 and a.L != b.L):
        raise ValueError(f"gemm_sm100 needs (M, K) x (N, K) or (L, M, K) x (L, N, K) with one K "
                         f"and L; got a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"gemm_sm100 operands on different devices: {a.device}, {b.device}")
    for name, t in (("a", a), ("b", b)):
        _check_layout(name, t)


def _check_layout(name: str, t: NVFP4Tensor) -> None:
    """ValueError unless `t`'s codes and scales are laid out as NVFP4Tensor makes them and
    aligned as the kernels' loads need."""
    rows = nvfp4_codes.strides(t.shape[-2], t.K, t.ndim == 3)
    for part, x, align, ok in (
            ("data", t.data, 32, tuple(t.data.stride()) == rows),
            ("scales", t.scales, 16, t.scales.is_contiguous())):
        if not ok or x.data_ptr() % align:
            raise ValueError(f"gemm_sm100: {name}.{part} must be laid out as NVFP4Tensor makes "
                             f"it (codes: rows nvfp4_codes.row_pitch(K) bytes apart) and "
                             f"{align}-byte aligned, got stride {x.stride()}, address "
                             f"{x.data_ptr():#x}")


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
            target: str | None = None, checked: bool = False) -> Launch:
    """Validate, pick the config, allocate D and build the kernel arguments (no compile).
    `out_dtype` "nvfp4": D is an NVFP4Tensor with decode scale `out_global_scale` (a float32
    0-dim tensor on the operands' device, already checked) or `out`'s. `target`: the arguments
    for that GPU whatever the operands' device (`tk_cute.emulator` runs them on the CPU).
    `checked`: the operands and `out` were validated by `tk_cute.nvfp4.gemm` (its one
    validation): only the layouts the kernel's loads need are checked here."""
    from tk_cute.kernels.gemm import nvfp4_sm100 as K

    if checked:
        for name, t in (("a", a), ("b", b)):
            _check_layout(name, t)
    else:
        _check(a, b, out_dtype)
    if target is not None and target not in TARGETS:
        raise ValueError(f"gemm_sm100 runs on {', '.join(TARGETS)}; target={target!r}")
    sms = (arch.target(target).sm_count or 148) if target else None
    target = target or device_target(a.device)
    M, N, Kdim, L = a.M, b.M, a.K, a.L or 1
    name = NVFP4 if out_dtype == NVFP4 else dtype_name(out_dtype)
    sf = scale_format(a.scale_format, target)
    cfg = config or sm100_tuning.w4a4_config(target, M, N, Kdim, name, sf, L)
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
        d = out if checked and out is not None else output(out, shape, out_dtype, a.device,
                                                            "gemm_sm100")
        splits = K.k_splits(cfg, Kdim)
        wide = kernel_d(d, cfg, splits)
        addr = {"d": d if wide is None else wide}
    addr.update(a=a.data, b=b.data, sfa=a.scales, sfb=b.scales, ga=a.global_scale,
                gb=b.global_scale)
    clusters = (sms or sm_count(a.device)) // (cfg.CLUSTER_M * cfg.CLUSTER_N)
    values = K.launch_values(cfg, {k: t.data_ptr() for k, t in addr.items()}, M, N, Kdim, L)
    return Launch(cfg, values, clusters, d, wide, 1 if name == NVFP4 else splits)


def kernel_d(d: torch.Tensor, cfg, splits: int) -> torch.Tensor | None:
    """The buffer a dense-D kernel (`cfg`: either sm100 Config) writes instead of `d`, or None
    where it writes `d` itself: split K's fp32 partial D's (L * splits, M, pitch), or D with
    its rows padded to `d_pitch` (16 bytes) where N is off 16 bytes."""
    from tk_cute.kernels.gemm.nvfp4_sm100 import d_pitch

    pitch, N = d_pitch(d.shape[-1], cfg.d_type), d.shape[-1]
    if cfg.SPLIT_K == 1 and pitch == N:
        return None
    lead = d.shape[:-2] if cfg.SPLIT_K == 1 else ((d.shape[0] if d.dim() == 3 else 1) * splits,)
    dtype = torch.float32 if cfg.SPLIT_K > 1 else d.dtype
    return torch.empty((*lead, d.shape[-2], pitch), dtype=dtype, device=d.device)


def compile_launch(launch: Launch, keep: bool = False):
    """Compile the kernel for `launch` (its config's target) into a raw-pointer
    `launcher.Launcher` (its signature: the kernel module's `signature`). keep=True returns
    (`tk_cute.compile.Build` with PTX, SASS and resources, the kernel object) instead."""
    from tk_cute.compile import build

    kern = launch.kernel()
    if keep:
        return build(kern, *launch.args, arch=launch.config.arch), kern
    return launch.module.signature(launch.config).compile(
        kern, *launch.constexpr, options=f"--gpu-arch {launch.config.arch}")


class UnverifiedKernelWarning(UserWarning):
    """A Blackwell / Rubin kernel is about to run on a GPU for the first time in this process:
    tk_cute has verified it by compiling it and by running it in its PTX emulator
    (`tk_cute.emulator`), never on such a GPU. Silence it with
    ``warnings.filterwarnings("ignore", category=UnverifiedKernelWarning)``."""


def _compile_first(launch: Launch):
    """Compile `launch`'s kernel for its first call in this process, saying once how it was
    verified (`UnverifiedKernelWarning`)."""
    cfg = launch.config
    what = (("W4A16 GEMM (kernels/gemm/nvfp4_w4a16_sm100.py" if launch.w4a16 else
             "NVFP4 GEMM (kernels/gemm/nvfp4_sm100.py") + f", {sm100_tuning.describe(cfg)}")
    warnings.warn(UnverifiedKernelWarning(
        f"tk_cute's {cfg.arch} {what}, out {cfg.out}) runs on this GPU for the first time: "
        f"it was verified by compiling and in tk_cute's PTX emulator "
        f"(python -m tk_cute emulate), never on {cfg.arch} hardware. To silence: "
        f"warnings.filterwarnings('ignore', category=tk_cute.nvfp4.dispatch_sm100."
        f"UnverifiedKernelWarning)"), stacklevel=6)  # (the caller of gemm_sm100 & co.)
    return compile_launch(launch)


def gemm_sm100_nvfp4(a: NVFP4Tensor, b: NVFP4Tensor, global_scale: torch.Tensor, config=None,
                     out: NVFP4Tensor | None = None, checked: bool = False) -> NVFP4Tensor:
    """``D = gA gB (A @ B^T)`` quantized to NVFP4 in the epilogue (sm_100a / sm_103a / sm_107a):
    per 16 columns of a D row the block amax (sm_103a / sm_107a: from the reducing TMEM load),
    then the recipe of `tk_cute.nvfp4.quantize` with decode scale `global_scale` on the fp32
    values fl(acc * gA gB). D never exists in fp32 or bf16 (0.5625 B written per element).

    Args:
        a, b: NVFP4Tensor (M, K) x (N, K) (or batched) on one CUDA device, one scale format.
        global_scale: D's decode scale, a float32 0-dim tensor on that device (validated by
            the caller: positive, finite, at least 2^-126), or None with `out`.
        config: a `Config` with ``out="nvfp4"`` overriding `sm100_tuning.w4a4_config`.
        out: optional UE4M3 NVFP4Tensor of D's shape whose data and scales are overwritten.

    Returns:
        D, with attribute `saturated` (0-dim int32 on the device: 1 where some block scale
        saturated at 448, i.e. the global scale was too small for those values).

    Raises:
        ValueError: as `gemm_sm100`, and N % 16 != 0.
    """
    gs = out.global_scale if global_scale is None else global_scale
    launch = prepare(a, b, NVFP4, config, out, gs, checked=checked)
    run(launch)
    return launch.out


def gemm_sm100(a: NVFP4Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16, config=None,
               out: torch.Tensor | None = None, checked: bool = False) -> torch.Tensor:
    """``D = gA gB (A @ B^T)`` for NVFP4 operands on sm_100a / sm_103a / sm_107a.

    Args:
        a: NVFP4Tensor (M, K) or (L, M, K) on a CUDA device.
        b: NVFP4Tensor (N, K) or (L, N, K) on the same device.
        out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32.
        config: a `kernels.gemm.nvfp4_sm100.Config` overriding `sm100_tuning.w4a4_config`.
        out: optional contiguous (M, N) / (L, M, N) tensor of `out_dtype` to write D into.
        checked: the operands and `out` were validated by `tk_cute.nvfp4.gemm` (`prepare`).

    Returns:
        D of `out_dtype`. Any M and N (TMA zero-fills / clips the tails; where D's rows are not
        a multiple of 16 bytes the kernel writes rows padded to `d_pitch` and one copy puts
        them in place); K a multiple of 16 (the last K stage partly zero-filled).

    Raises:
        TypeError: operand or out_dtype types.
        ValueError: shapes, devices, layout, K % 16, or a GPU that is not sm_100a, sm_103a or
            sm_107a.
    """
    launch = prepare(a, b, out_dtype, config, out, checked=checked)
    run(launch)
    return launch.finish()


def prepare_w4a16(x: torch.Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16, config=None,
                  out: torch.Tensor | None = None, target: str | None = None,
                  checked: bool = False) -> Launch:
    """As `prepare`, for W4A16: bf16 activations x (M, K) or (L, M, K), contiguous and
    16-byte aligned, times NVFP4 weights b (N, K) or (L, N, K) (`nvfp4_w4a16_sm100`).
    `checked` as `prepare`'s (x's layout and b's are still checked)."""
    from tk_cute.kernels.gemm import nvfp4_w4a16_sm100 as W

    if not checked:
        _check_w4a16(x, b, out_dtype)
    if not x.is_contiguous() or x.data_ptr() % 16:
        raise ValueError(f"W4A16 activations must be contiguous and 16-byte aligned; got "
                         f"stride {x.stride()}, address {x.data_ptr():#x}")
    _check_layout("b", b)
    if target is not None and target not in TARGETS:
        raise ValueError(f"gemm_sm100 runs on {', '.join(TARGETS)}; target={target!r}")
    target = target or device_target(x.device)
    M, N, K, L = x.shape[-2], b.M, b.K, b.L or 1
    name = dtype_name(out_dtype)
    cfg = config or sm100_tuning.w4a16_config(target, M, N, K, name, b.scale_format, L)
    if cfg.arch != target or cfg.out != name or cfg.sf != scale_format(b.scale_format, target):
        raise ValueError(f"config is for {cfg.arch} / {cfg.out} / {cfg.sf} scales; the call "
                         f"needs {target} / {name} / {b.scale_format}")
    shape = (M, N) if b.L is None else (L, M, N)
    d = out if checked and out is not None else output(out, shape, out_dtype, x.device,
                                                        "gemm_sm100_w4a16")
    splits = W.k_splits(cfg, K)
    wide = kernel_d(d, cfg, splits)
    addr = {"x": x, "w": b.data, "wsf": b.scales, "gb": b.global_scale,
            "d": d if wide is None else wide}
    values = W.launch_values(cfg, {k: t.data_ptr() for k, t in addr.items()}, M, N, K, L)
    return Launch(cfg, values, None, d, wide, splits)


def _check_w4a16(x, b, out_dtype) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"W4A16 activations must be a bfloat16 tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if not isinstance(b, NVFP4Tensor):
        raise TypeError(f"W4A16 weights must be an NVFP4Tensor, got {type(b).__name__}")
    if out_dtype not in validate.OUT_DTYPES:
        raise TypeError(f"W4A16 out_dtype must be torch.bfloat16, torch.float16 or "
                        f"torch.float32, got {out_dtype}")
    if x.dim() != b.ndim or x.shape[-1] != b.K or (b.ndim == 3 and x.shape[0] != b.L):
        raise ValueError(f"W4A16 needs (M, K) x (N, K) or (L, M, K) x (L, N, K) with one K and "
                         f"L; got x {tuple(x.shape)}, b {tuple(b.shape)}")
    if x.device != b.device:
        raise ValueError(f"W4A16 activations must be on the weights' device; got {x.device}, "
                         f"{b.device}")


def gemm_sm100_w4a16(x: torch.Tensor, b: NVFP4Tensor, out_dtype=torch.bfloat16, config=None,
                     out: torch.Tensor | None = None, checked: bool = False) -> torch.Tensor:
    """``D = gB (X @ W^T)`` for bf16 activations and NVFP4 weights on sm_100a / sm_103a /
    sm_107a: the weights decoded in the kernel, exactly (`nvfp4_w4a16_sm100`). Any M, N, L and
    K % 16; bf16 / fp16 / fp32 D.

    Raises:
        TypeError, ValueError: as `prepare_w4a16`.
    """
    launch = prepare_w4a16(x, b, out_dtype, config, out, checked=checked)
    run(launch)
    return launch.finish()


def run(launch: Launch) -> None:
    """Launch `launch` on the current stream (its kernel compiled at its first call)."""
    fn = _CACHE.get(launch.key, lambda: _compile_first(launch))
    fn(**launch.values, stream=raw_stream(device_index(launch.out.device)))


def compile_seconds() -> dict:
    """Seconds each cached (config, cluster budget) took to compile."""
    return dict(_CACHE.compile_seconds)
