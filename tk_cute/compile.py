"""Compile a CuTe DSL program for any target, with or without a GPU, and read what came out.

`build(fn, *args, arch=...)` traces and compiles `fn` (a `@cute.jit` function) for one target and
returns a `Build`: the PTX, the cubin, its SASS (nvdisasm 13.5, which reads sm_107a) and the
per-kernel resources ptxas settled on (cuobjdump). Tests assert on these; `tk_cute report` prints
them. The target is passed to the DSL as a compile option (`--gpu-arch`), so one process can
build for several targets; `CUTE_DSL_ARCH` is not needed.

Arguments may be fake (`fake_tensor`, `cute.runtime.make_fake_tensor`): nothing touches a GPU.

`COMPILE_LOCK` serializes every compile in the process: the DSL's compile state is global, and
two threads compiling at once abort the interpreter. `build` and `tk_cute.runtime`'s caches take
it; so must any other caller of `cute.compile` that may run beside them.
"""

from __future__ import annotations

import functools
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


@dataclass(frozen=True)
class KernelResources:
    """What ptxas gave one kernel (cuobjdump --dump-resource-usage)."""

    name: str
    registers: int
    stack_bytes: int
    local_bytes: int  # per-thread local memory: register spills and local arrays
    static_shared_bytes: int


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

    def ptx_count(self, pattern: str) -> int:
        """Number of PTX instruction lines matching the regular expression `pattern`."""
        return _count(self.ptx, pattern)

    def sass_count(self, pattern: str) -> int:
        """Number of SASS instruction lines matching the regular expression `pattern`."""
        return _count(self.sass, pattern)


def _count(text: str, pattern: str) -> int:
    rx = re.compile(pattern)
    return sum(1 for line in text.splitlines() if rx.search(line.split("//")[0]))


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
            f"{name} not found: install the dev extra (pip install -e '.[dev]'), which brings "
            f"nvidia-cuda-{name}==13.5.*"
        )
    return found


def _run_on_cubin(cubin: bytes, cmd: list[str]) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [cuda_tool(cmd[0]), *cmd[1:], f.name], check=True, capture_output=True, text=True
        ).stdout


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
    return Build(arch, compiled, ptx, cubin, seconds)
