"""`python -m tk_cute compare`: one GEMM in tk_cute and in a CuTe DSL peer, side by side.

For a target and a shape, each side is compiled (no GPU needed) and read: source lines (kernel
files, kernel classes, `@cute.kernel` bodies, host launch), the instruction mix of its PTX and
SASS (`tk_cute.compile.INSTRUCTION_MIX`: MMA, TMA, barriers, shared loads / stores, ...),
registers, spills, shared and tensor memory; on a GPU of the target's kind (Hopper) both sides
are also timed (`tk_cute.bench.harness`, cold L2). The result prints as a table and draws as a
bar chart (`Comparison.figure`).

The peers are not vendored: `--peer PATH` names a copy of the public CUTLASS repository's
file, which is imported, i.e. RUN as Python in this process (pass only a file you trust):
- sm_90a: `examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py`
  (`HopperWgmmaGemmPersistentKernel`, bf16, tile 128x256, cluster 1x1: the tk_cute default);
- sm_100a / sm_103a / sm_107a: `examples/python/CuTeDSL/cute/blackwell/kernel/blockscaled_gemm/
  dense_blockscaled_gemm_persistent.py` (NVFP4, compiled by `tk_cute.report.peer`);
e.g. copied into the git-ignored `.peers/`. Without `--peer` the other side is a second tk_cute
config (`--alt KEY=VALUE,...`, overriding the kernel Config).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
from dataclasses import dataclass, field

ARCHS = ("sm_90a", "sm_100a", "sm_103a", "sm_107a")
PEER_CLASSES = {"hopper": "HopperWgmmaGemmPersistentKernel",
                "tcgen05": "Sm100BlockScaledPersistentDenseGemmKernel"}
DEFAULT_ALT = {"hopper": {"Nb": 128}, "tcgen05": {"Mb": 256, "Nb": 128, "ACC_PIPE_DEPTH": 2}}


class Table:
    """Rows of labelled values: text when printed, an HTML table in a notebook. In the text,
    the first `left` columns (labels) are left-justified, the others (values) right-justified."""

    def __init__(self, header: list[str], rows: list[list], *, left: int = 1):
        self.header, self.rows, self.left = header, rows, left

    def __str__(self) -> str:
        cells = [self.header] + [[str(v) for v in r] for r in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        line = lambda r: "  ".join(v.ljust(w) if i < self.left else v.rjust(w)
                                   for i, (v, w) in enumerate(zip(r, widths))).rstrip()
        return "\n".join([line(cells[0]), line(["-" * w for w in widths])]
                         + [line(r) for r in cells[1:]])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from tk_cute.compile import _html_table

        return _html_table(self.header, self.rows)


def mix_table(builds: dict) -> Table:
    """The instruction mix of several `Build`s side by side ("PTX / SASS" line counts), plus
    registers and spills."""
    mixes = {name: b.instruction_mix() for name, b in builds.items()}
    classes = [c for c in next(iter(mixes.values())) if any(m[c] != (0, 0)
                                                              for m in mixes.values())]
    rows = [[c] + [f"{m[c][0]} / {m[c][1]}" for m in mixes.values()] for c in classes]
    rows.append(["registers"] + ["/".join(str(k.registers) for k in b.resources)
                                 for b in builds.values()])
    rows.append(["spill bytes"] + [sum(k.local_bytes for k in b.resources)
                                   for b in builds.values()])
    return Table(["PTX / SASS lines"] + list(builds), rows)


# --------------------------------------------------------------------------- source lines
def code_lines(text: str) -> int:
    """Lines that are neither blank nor only a comment."""
    return sum(1 for l in text.splitlines() if l.strip() and not l.strip().startswith("#"))


SOURCE_ROWS = ("kernel files", "kernel classes", "@cute.kernel bodies", "host launch")


def source_lines(classes: list[tuple[str, str]]) -> dict[str, int]:
    """Code lines of the (file, class name) pairs that make a kernel: its files, the classes,
    their `@cute.kernel` methods, and their host launch (`__call__`, `launch`)."""
    out = dict.fromkeys(SOURCE_ROWS, 0)
    for path in dict.fromkeys(p for p, _ in classes):
        out["kernel files"] += code_lines(open(path).read())
    for path, name in classes:
        text = open(path).read()
        node = next((n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)
                     and n.name == name), None)
        if node is None:
            raise ValueError(f"{path} defines no class {name}")
        out["kernel classes"] += code_lines(_segment(text, node))
        for fn in (n for n in node.body if isinstance(n, ast.FunctionDef)):
            lines = code_lines(_segment(text, fn))
            if any(ast.unparse(d) == "cute.kernel" for d in fn.decorator_list):
                out["@cute.kernel bodies"] += lines
            elif fn.name in ("__call__", "launch"):
                out["host launch"] += lines
    return out


def _segment(text: str, node) -> str:
    """A definition's source lines, its decorators included."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(text.splitlines()[first - 1:node.end_lineno])


def _of(cls) -> list[tuple[str, str]]:
    """(file, name) of a tk_cute kernel class and its tk_cute base classes."""
    return [(inspect.getsourcefile(c), c.__name__) for c in cls.__mro__
            if c.__module__.startswith("tk_cute")]


# --------------------------------------------------------------------------- sides
@dataclass
class Side:
    """One compiled kernel of the comparison."""

    name: str
    build: object  # tk_cute.compile.Build
    source: dict
    smem_bytes: int
    tmem_columns: int = 0
    run: object = field(default=None, repr=False)  # (a, b, c) -> None on a GPU, or None
    time_us: float | None = None


def _family(arch: str) -> str:
    from tk_cute.arch import target

    return "hopper" if target(arch).wgmma else "tcgen05"


def _fake(dtype):
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    r, c = cute.sym_int64(divisibility=256), cute.sym_int64(divisibility=128)
    return make_fake_tensor(dtype, (r, c, 1), (c, 1, r * c), assumed_align=16)


def _hopper_build(kernel):
    """`kernel` (a persistent Hopper GEMM) compiled for sm_90a's SM count, bf16 in and out."""
    import cutlass
    from cuda.bindings import driver as cuda

    from tk_cute.arch import target
    from tk_cute.compile import build

    bf16 = cutlass.BFloat16
    return build(kernel, _fake(bf16), _fake(bf16), _fake(bf16), target("sm_90a").sm_count,
                 cuda.CUstream(0), arch="sm_90a")


def tk_cute_side(arch: str, mnk, overrides: dict | None = None, name: str = "tk_cute") -> Side:
    """tk_cute's GEMM for `arch`: the Hopper bf16 GEMM (`kernels/gemm/gemm_sm90.py`) or the
    NVFP4 GEMM (`kernels/gemm/nvfp4_sm100.py`, the dispatch's config for `mnk`), with Config
    fields `overrides`."""
    overrides = overrides or {}
    if _family(arch) == "hopper":
        from tk_cute.kernels.gemm.gemm_sm90 import Config, kernel_for

        cfg = Config(dtype="bfloat16", **overrides)
        kernel = kernel_for(cfg)

        def run(a, b, c):
            import tk_cute

            tk_cute.gemm(a, b, config=cfg, out=c)

        return Side(name, _hopper_build(kernel), source_lines(_of(type(kernel))),
                    kernel.dynamic_shared_memory(), run=run)
    from tk_cute.kernels.gemm import nvfp4_sm100 as K
    from tk_cute.tuning.sm100 import w4a4_config

    cfg = dataclasses.replace(w4a4_config(arch, *mnk), **overrides)
    b, kern = K.compile(cfg, *mnk)
    return Side(name, b, source_lines(_of(K.GemmNvfp4Sm100)), kern.traced["smem_bytes"],
                cfg.tmem_columns_used)


def peer_side(path: str, arch: str, mnk) -> Side:
    """The CUTLASS CuTe DSL peer at `path` for `arch` (see the module docstring)."""
    cls = PEER_CLASSES[_family(arch)]
    if f"class {cls}" not in open(path).read():
        wanted = ("dense_gemm_persistent.py" if cls.startswith("Hopper")
                  else "dense_blockscaled_gemm_persistent.py")
        raise ValueError(f"{path} defines no {cls}: for {arch} pass CUTLASS's {wanted}")
    name = f"CUTLASS {os.path.basename(path)}"
    if _family(arch) == "hopper":
        from tk_cute.bench.gemm import _peer, peer_kernel

        kernel = peer_kernel(path)  # the bench's kernel, its defaults: loaded and made once
        b = _hopper_build(kernel)
        compiled = {}  # the bench's runner of the same kernel on torch tensors, made once

        def run(a, b_, c):
            if not compiled:
                import torch

                sms = torch.cuda.get_device_properties(a.device).multi_processor_count
                compiled["fn"] = _peer(path, torch.bfloat16, sms, kernel)[0]
            compiled["fn"](a, b_, c)

        return Side(name, b, source_lines([(path, cls)]), kernel.shared_storage.size_in_bytes(),
                    run=run)
    from tk_cute import report

    info = report.peer(path, arch, *mnk)
    return Side(name, info["build"], source_lines([(path, cls)]), info["smem_bytes"],
                info["tmem_columns"])


# --------------------------------------------------------------------------- comparison
@dataclass
class Comparison:
    """Both sides of one GEMM on one target."""

    arch: str
    mnk: tuple
    sides: list

    def table(self) -> Table:
        s = self.sides
        rows = [[f"source: {k} (code lines)"] + [x.source[k] for x in s] for k in SOURCE_ROWS]
        rows += mix_table({x.name: x.build for x in s}).rows
        rows += [["shared memory (bytes)"] + [f"{x.smem_bytes:,}" for x in s],
                 ["tensor memory (columns)"] + [x.tmem_columns for x in s]]
        if any(x.time_us for x in s):
            flops = 2 * self.mnk[0] * self.mnk[1] * self.mnk[2]
            rows += [["time (us)"] + [f"{x.time_us:.1f}" if x.time_us else "-" for x in s],
                     ["TFLOP/s"] + [f"{flops / x.time_us / 1e6:.0f}" if x.time_us else "-"
                                    for x in s]]
        return Table([f"{self.arch}, {'x'.join(map(str, self.mnk))}"] + [x.name for x in s],
                     rows)

    def __repr__(self) -> str:
        return (f"<Comparison {self.arch} {'x'.join(map(str, self.mnk))}: "
                f"{' vs '.join(x.name for x in self.sides)} ({len(self.table().rows)} rows; "
                f".table(), .figure())>")

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def figure(self):
        """Bar chart: source lines, instruction mix (PTX lines), resources, per side."""
        import numpy as np

        from tk_cute.viz import _figure

        mixes = [x.build.instruction_mix() for x in self.sides]
        classes = [c for c in mixes[0] if any(m[c][0] for m in mixes)]
        data = {
            "source lines": (list(SOURCE_ROWS), [[x.source[k] for k in SOURCE_ROWS]
                                                 for x in self.sides]),
            "PTX instruction lines": (classes, [[m[c][0] for c in classes] for m in mixes]),
            "resources": (["registers", "shared KiB", "TMEM columns / 4"],
                          [[x.build.resources[0].registers, x.smem_bytes / 1024,
                            x.tmem_columns / 4] for x in self.sides]),
        }
        fig, axes = _figure(3, 18, 5.5)
        fig.drawn = data
        width = 0.8 / len(self.sides)
        for ax, (title, (labels, values)) in zip(axes, data.items()):
            y = np.arange(len(labels))
            for i, (side, v) in enumerate(zip(self.sides, values)):
                ax.barh(y + i * width, v, width, label=side.name, gid=f"{title}: {side.name}")
            ax.set(yticks=y + width * (len(self.sides) - 1) / 2, yticklabels=labels, title=title)
            ax.invert_yaxis()
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{self.arch}, {'x'.join(map(str, self.mnk))}: "
                     f"{' vs '.join(x.name for x in self.sides)}")
        fig.tight_layout()
        return fig


def time_sides(sides, mnk, rounds: int = 10) -> None:
    """Fill `time_us` of the sides that can run (`run`), same process, cold L2 input sets."""
    import torch

    from tk_cute.bench import harness

    M, N, K = mnk

    def make():
        return (torch.randn(M, K, device="cuda").bfloat16(),
                torch.randn(N, K, device="cuda").bfloat16(),
                torch.empty(M, N, device="cuda", dtype=torch.bfloat16))

    runnable = {x.name: x for x in sides if x.run is not None}
    sets = harness.input_sets(make, (M + N) * K * 2 + M * N * 2)
    res = harness.bench({n: (lambda s, x=x: x.run(*s)) for n, x in runnable.items()}, sets,
                        rounds=rounds)
    for n, x in runnable.items():
        x.time_us = res[n].ms * 1e3


def compare(arch: str = "sm_90a", mnk=(8192, 8192, 8192), peer: str | None = None,
            alt: dict | None = None, time: bool | None = None) -> Comparison:
    """tk_cute against `peer` (a CUTLASS file, see the module docstring) or, without one,
    against tk_cute with the Config overrides `alt` (default `DEFAULT_ALT`).

    Args:
        arch: target (sm_90a, sm_100a, sm_103a, sm_107a).
        mnk: the GEMM shape (for timing; for tcgen05 targets also the config choice).
        peer: path of the CUTLASS example, or None.
        alt: Config overrides of the second tk_cute side when there is no peer.
        time: time both sides on the GPU (default: when this GPU is `arch`, Hopper only).

    Returns:
        A `Comparison` (`.table()`, `.figure()`).
    """
    from tk_cute.arch import current

    ours = tk_cute_side(arch, mnk)
    if peer:
        other = peer_side(peer, arch, mnk)
    else:
        alt = DEFAULT_ALT[_family(arch)] if alt is None else alt
        other = tk_cute_side(arch, mnk, alt, "tk_cute " + ",".join(f"{k}={v}"
                                                                   for k, v in alt.items()))
    here = current()
    if time is None:
        time = here is not None and here.name == arch and here.wgmma
    if time:
        time_sides([ours, other], mnk)
    return Comparison(arch, tuple(mnk), [ours, other])


# --------------------------------------------------------------------------- command line
def _overrides(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE[,KEY=VALUE], got {text!r}")
        value = value.strip()
        out[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
    return out


def main(argv=None) -> int:
    from tk_cute.report import _mnk

    p = argparse.ArgumentParser(prog="python -m tk_cute compare",
                                description="The same GEMM in tk_cute and in a CuTe DSL peer "
                                            "(or a second tk_cute config), side by side.")
    p.add_argument("--arch", choices=ARCHS, default="sm_90a")
    p.add_argument("--mnk", type=_mnk, default=(8192, 8192, 8192), help="M,N,K")
    p.add_argument("--peer", metavar="PATH",
                   help="path of the CUTLASS CuTe DSL example (see the epilog). The file is "
                        "imported, i.e. RUN as Python code in this process: pass only a file "
                        "you trust")
    p.add_argument("--alt", type=_overrides, default=None,
                   help="without --peer: Config overrides of the second tk_cute side, e.g. "
                        "Nb=128 (default: Nb=128 on sm_90a, Mb=256,Nb=128,ACC_PIPE_DEPTH=2 else)")
    p.add_argument("--plot", help="also draw the bar chart into this PNG/SVG file")
    p.add_argument("--no-time", action="store_true", help="compile only, even on a GPU")
    p.epilog = ("peers (not vendored; from the public CUTLASS repository): "
                "examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py "
                "(sm_90a), examples/python/CuTeDSL/cute/blackwell/kernel/blockscaled_gemm/"
                "dense_blockscaled_gemm_persistent.py (sm_100a, sm_103a, sm_107a)")
    a = p.parse_args(argv)
    if a.peer and not os.path.isfile(a.peer):
        p.error(f"--peer {a.peer!r}: no such file")
    if a.plot:
        from tk_cute.viz import out_file_error

        error = out_file_error(a.plot, "--plot")
        if error:
            p.error(error)
    if _family(a.arch) == "tcgen05":
        from tk_cute.report import check_shape

        try:
            check_shape(*a.mnk)
        except ValueError as e:
            p.error(str(e))
    try:
        result = compare(a.arch, a.mnk, a.peer, a.alt, False if a.no_time else None)
    except (TypeError, ValueError) as e:  # Config rejections, a peer of the wrong kind
        p.error(str(e))
    print(result.table())
    if not any(x.time_us for x in result.sides):
        print("(compile only: time and TFLOP/s need a GPU of the target's kind, Hopper)")
    if a.plot:
        result.figure().savefig(a.plot, dpi=110)
        print(f"plot: {a.plot}")
    return 0
