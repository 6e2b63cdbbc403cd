"""Compile a CuTe DSL program for any target, with or without a GPU, and read what came out.

`build(fn, *args, arch=...)` traces and compiles `fn` (a `@cute.jit` function) for one target and
returns a `Build`: the PTX, the cubin, its SASS (nvdisasm 13.5, which reads sm_107a) and the
per-kernel resources ptxas settled on (cuobjdump). Tests assert on these; `tk_cute report` prints
them. The target is passed to the DSL as a compile option (`--gpu-arch`), so one process can
build for several targets; `CUTE_DSL_ARCH` is not needed.

Arguments may be fake (`fake_tensor`, `cute.runtime.make_fake_tensor`): nothing touches a GPU.

In a notebook a `Build` shows as a short summary (`repr`) or a resources and instruction-mix
table (`_repr_html_`, the `INSTRUCTION_MIX` classes counted in PTX and SASS); the full text is
one attribute away (`.ptx`, `.sass`).

`COMPILE_LOCK` serializes every compile in the process: the DSL's compile state is global, and
two threads compiling at once abort the interpreter. `build` and `tk_cute.runtime`'s caches take
it; so must any other caller of `cute.compile` that may run beside them.
"""

from __future__ import annotations

import functools
import html
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tk_cute.arch import target as _target

COMPILE_LOCK = threading.RLock()

# Called with every `Build` that `build` returns (the test suite registers the synchronization
# lint here, so every kernel any test compiles is checked; see tests/conftest.py).
BUILD_CHECKS: list = []


@dataclass(frozen=True)
class KernelResources:
    """What ptxas gave one kernel (cuobjdump --dump-resource-usage)."""

    name: str
    registers: int
    stack_bytes: int
    local_bytes: int  # per-thread local memory: register spills and local arrays
    static_shared_bytes: int


# What a GEMM reader counts in a kernel: (class, PTX pattern, SASS pattern), one line each.
INSTRUCTION_MIX = (
    ("MMA", r"\b(wgmma\.mma_async|tcgen05\.mma|mma\.sync)\b",
     r"\b(HGMMA|QGMMA|IGMMA|HMMA|UTC\w*MMA)\b"),
    ("TMA load", r"\bcp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global", r"\bUTMALDG\b"),
    ("TMA store", r"\bcp\.async\.bulk\.tensor\.\w+\.global\.shared", r"\bUTMASTG\b"),
    ("mbarrier", r"\bmbarrier\.", r"\bSYNCS\b"),
    ("CTA / named barrier", r"\bbar(rier)?\.(sync|arrive|cta)", r"\bBAR\b"),
    ("shared load", r"\b(ld\.shared|ldmatrix)", r"\bLDS(M)?\b"),
    ("shared store", r"\b(st\.shared|stmatrix)", r"\bSTS(M)?\b"),
    ("global load", r"\bld\.global", r"\bLDG\b"),
    ("global store", r"\bst\.global", r"\bSTG\b"),
    ("setmaxnreg", r"\bsetmaxnreg", r"\bUSETMAXREG\b"),
    ("tcgen05.commit", r"\btcgen05\.commit", r"\bUTCBAR\b"),
    ("TMEM alloc / ld / cp", r"\btcgen05\.(alloc|ld|st|cp)\b",
     r"\b(UTCATOMSWS|LDTM|STTM|UTC\w*CP)\b"),
)


@dataclass
class Build:
    """A compiled program for one target: its artifacts and how to query them."""

    arch: str
    compiled: object  # the DSL's JitCompiledFunction (callable on a matching GPU)
    ptx: str
    cubin: bytes
    compile_seconds: float
    _sass: str | None = field(default=None, repr=False)

    @property
    def sass(self) -> str:
        """SASS of every kernel in the cubin (nvdisasm)."""
        if self._sass is None:
            self._sass = _run_on_cubin(self.cubin, ["nvdisasm", "-c"])
        return self._sass

    @functools.cached_property
    def resources(self) -> list[KernelResources]:
        text = _run_on_cubin(self.cubin, ["cuobjdump", "--dump-resource-usage"])
        out = []
        for name, body in re.findall(r"Function (\S+):\s*\n\s*(REG:.*)", text):
            f = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", body))
            out.append(
                KernelResources(
                    name.rstrip(":"),
                    int(f["REG"]),
                    int(f["STACK"]),
                    int(f["LOCAL"]),
                    int(f["SHARED"]),
                )
            )
        return out

    @property
    def kernel(self) -> KernelResources:
        """Resources of the program's one kernel (raises if there are several)."""
        (only,) = self.resources
        return only

    @functools.cached_property
    def sync_findings(self) -> list:
        """The static synchronization lint's findings on this program's PTX
        (`tk_cute.emulator.lint`: TMEM hand-off, proxy fences, barrier init, bulk groups)."""
        from tk_cute.emulator.lint import lint

        return lint(self.ptx)

    def ptx_count(self, pattern: str) -> int:
        """Number of PTX instruction lines matching the regular expression `pattern`."""
        return _count(self.ptx, pattern)

    def sass_count(self, pattern: str) -> int:
        """Number of SASS instruction lines matching the regular expression `pattern`."""
        return _count(self.sass, pattern)

    def reads_before_pdl_wait(self) -> dict[str, list[str]]:
        """{kernel: its global reads (LDG, LDGSTS, TMA loads) above its first
        ``griddepcontrol.wait`` (SASS ACQBULK) in the program text} for every kernel that
        waits: what it may read while the kernel before it on the stream still runs
        (programmatic dependent launch). ptxas moves read-only (``.nc``) loads above the wait,
        so the PTX order alone does not tell."""
        out = {}
        for name, body in _kernel_sass(self.sass):
            if "ACQBULK" in body:
                head = body[:body.index("ACQBULK")]
                out[name] = re.findall(r"\b(?:LDG|LDGSTS|UTMALDG|UBLKCP)\b\S*", head)
        return out

    def local_in_loops(self) -> list[str]:
        """The local-memory instructions (STL / LDL: spills) inside a loop of the SASS, every
        kernel: between a label and a later branch back to it. A spill outside every loop runs
        once per thread; one inside runs on every iteration."""
        out = []
        for _, body in _kernel_sass(self.sass):
            lines = body.splitlines()
            labels = {m.group(1): i for i, line in enumerate(lines)
                      if (m := re.match(r"\s*(\.L_x_\d+):", line))}
            for i, line in enumerate(lines):
                m = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", line)
                if m and labels.get(m.group(1), i) < i:
                    out += [x.strip() for x in lines[labels[m.group(1)]:i]
                            if re.search(r"\b(STL|LDL)\b", x)]
        return out

    def instruction_mix(self) -> dict[str, tuple[int, int]]:
        """{class: (PTX lines, SASS lines)} for the `INSTRUCTION_MIX` classes (a static count of
        the program text, not of executed instructions)."""
        return {name: (self.ptx_count(ptx), self.sass_count(sass))
                for name, ptx, sass in INSTRUCTION_MIX}

    def __repr__(self) -> str:
        kernels = self.resources
        regs = "/".join(str(k.registers) for k in kernels)
        spills = sum(k.local_bytes for k in kernels)
        return (f"<Build {self.arch}: {len(kernels)} kernel{'s' * (len(kernels) != 1)}, "
                f"{regs} registers, {spills} spill bytes, {len(self.ptx.splitlines()):,} PTX "
                f"lines (.ptx, .sass), compiled in {self.compile_seconds:.2f} s>")

    def _repr_html_(self) -> str:
        head = (f"<p><b>Build</b> for <code>{self.arch}</code>, compiled in "
                f"{self.compile_seconds:.2f} s; PTX {len(self.ptx.splitlines()):,} lines "
                f"(<code>.ptx</code>), SASS in <code>.sass</code></p>")
        res = _html_table(["kernel", "registers", "spill bytes", "stack bytes",
                           "static shared bytes"],
                          [[_short(k.name), k.registers, k.local_bytes, k.stack_bytes,
                            k.static_shared_bytes] for k in self.resources])
        mix = _html_table(["instructions", "PTX lines", "SASS lines"],
                          [[name, p, s] for name, (p, s) in self.instruction_mix().items()
                           if p or s])
        return head + res + mix


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _html_table(header: list, rows: list) -> str:
    """A plain HTML table (cells escaped), as notebooks render `_repr_html_`."""
    cell = lambda tag, v: f"<{tag}>{html.escape(str(v))}</{tag}>"
    out = ["<table>", "<tr>" + "".join(cell("th", h) for h in header) + "</tr>"]
    out += ["<tr>" + "".join(cell("td", v) for v in r) + "</tr>" for r in rows]
    return "\n".join(out + ["</table>"])


def _count(text: str, pattern: str) -> int:
    rx = re.compile(pattern)
    return sum(1 for line in text.splitlines() if rx.search(line.split("//")[0]))


def _kernel_sass(sass: str) -> list[tuple[str, str]]:
    """(kernel, its SASS text) for every kernel of a build's SASS."""
    return re.findall(r"^\s*\.text\.(\S+):\s*$(.*?)(?=^\s*\.section|\Z)", sass,
                      re.MULTILINE | re.DOTALL)


@functools.cache
def cuda_tool(name: str) -> str:
    """Path of a CUDA binary tool (`nvdisasm`, `cuobjdump`) from the 13.5 pip wheels or PATH."""
    try:
        import nvidia.cu13

        for base in nvidia.cu13.__path__:
            candidate = Path(base) / "bin" / name
            if candidate.exists():
                return str(candidate)
    except ImportError:
        pass
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"{name} not found: tk_cute depends on nvidia-cuda-{name}==13.5.* (pip install "
            f"'nvidia-cuda-{name}==13.5.*', or reinstall tk_cute)"
        )
    return found


def _run_on_cubin(cubin: bytes, cmd: list[str]) -> str:
    tool = cuda_tool(cmd[0])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([tool, *cmd[1:], f.name], capture_output=True, text=True)
    if done.returncode != 0:  # (an older CUDA's tool on PATH cannot read the newer targets)
        raise RuntimeError(
            f"{tool} could not read the cubin (exit {done.returncode}: "
            f"{done.stderr.strip()[:200]!r}); the 13.5 tools read every target: pip install "
            f"nvidia-cuda-{cmd[0]}==13.5.* (a tk_cute dependency)")
    return done.stdout


def build(fn, *args, arch: str, options: str = "", **kwargs) -> Build:
    """Trace and compile `fn(*args, **kwargs)` for `arch` and keep its PTX and cubin.

    Args:
        fn: a `@cute.jit` function.
        *args: its arguments; fake tensors and pointers work without a GPU.
        arch: target name (``sm_90a``, ``sm_100a``, ``sm_103a``, ``sm_107a``).
        options: extra `cute.compile` options.

    Returns:
        A `Build` with the artifacts, compile time and a callable `compiled`.
    """
    import cutlass.cute as cute

    _target(arch)  # rejects unknown targets with the list of known ones
    with tempfile.TemporaryDirectory(prefix="tk_cute_build_") as dump:
        opts = f"--gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {dump} {options}".strip()
        with COMPILE_LOCK:
            start = time.perf_counter()
            compiled = cute.compile(fn, *args, options=opts, **kwargs)
            seconds = time.perf_counter() - start
            ptx = compiled.__ptx__
            cubin = compiled.__cubin__
        if isinstance(cubin, str):  # some DSL paths hand back the file name
            cubin = Path(cubin).read_bytes()
    out = Build(arch, compiled, ptx, cubin, seconds)
    for check in BUILD_CHECKS:
        check(out)
    return out
