"""Capture a kernel launch without a GPU: what the host code of a `@cute.jit` function hands the
CUDA runtime, for any target (sm_90a, sm_100a, sm_103a, sm_107a).

`capture(fn, *args, arch=...)` compiles `fn` for `arch` (`cute.compile` with ``--gpu-arch`` and
``--keep-ptx``, under `tk_cute.compile.COMPILE_LOCK`), exports its host code through the DSL's
ahead-of-time path (`dump_to_object`, the object `export_to_c` writes), links that object with a
small C stand-in for the CUDA runtime (`standin.c`) into a shared library, and calls the host
function in it with the real argument values. Pointers are plain integers there: the host code
only passes them on or encodes them into tensor maps, so nothing is dereferenced. The result is
a frozen `Launch` per kernel launch.

What is captured (per launch): the kernel's name and PTX, grid, block, cluster dims (a launch
attribute, not in the PTX), dynamic shared memory bytes, every launch attribute (named by
`cudaLaunchAttributeID`, decoded where known: cluster dims, programmatic stream serialization
(PDL), ...; the raw 64-byte value otherwise), the function attributes the host set (e.g.
``cudaFuncAttributeMaxDynamicSharedMemorySize``), the stream, the size of the image the host
passed to ``cudaLibraryLoadData`` (a fatbin), and every kernel parameter's bytes, cut by the
sizes of the PTX ``.entry`` signature (``.param .u64``, ``.param .align 64 .b8 p[128]`` for a
tensor map, ...). `tk_cute.emulator.tensormap.decode` reads the tensor maps.

The stand-in implements the runtime entry points the exported object imports (checked with
``nm`` on DSL 4.8.1): ``_cudaLibraryLoadData``, ``_cudaLibraryGetKernel``,
``_cudaLaunchKernelEx``, ``_cudaFuncSetAttribute``, ``_cudaKernelSetAttributeForDevice``,
``_cudaGetDevice``, ``_cudaDeviceGetAttribute``, ``_cuKernelGetAttribute``, plus
``_cudaLaunchKernel`` and ``_cudaOccupancyMaxActiveBlocksPerMultiprocessor``, which the host
module declares. Device attributes come from `tk_cute.arch.target(arch)` where it knows them
(`device_attributes`; override per call); one the stand-in has no value for fails the capture
with its id and name, never silently 0. An unknown launch attribute id is kept raw. The host
function runs on a zeroed stack, so the bytes it leaves unwritten (the last 64 of each tensor
map, struct padding) read 0 and two captures of one launch are equal. To write its object the
DSL links the host code in the process, so the DSL's runtime library (libcute_dsl_runtime.so,
which needs no driver) is loaded once with RTLD_GLOBAL.

Build and cache: the stand-in is compiled once with the system C compiler (``$CC``, else
``cc``, ``gcc`` or ``clang``; a RuntimeError names them when none is found) into
``$TK_CUTE_EMULATOR_CACHE`` (default ``$XDG_CACHE_HOME/tk_cute/emulator`` or
``~/.cache/tk_cute/emulator``, created private), as ``standin-<sha256 of its source>.o``, so an
edited stand-in is rebuilt. Each program's library is linked in a temporary directory (removed
once loaded), loaded with RTLD_LOCAL (its stand-in symbols are hidden, so it never binds to the
real runtime) and unloaded when its `HostProgram` is closed or collected.

Contracts:
- Thread safety: compiles and exports hold `COMPILE_LOCK`; a `HostProgram` runs one call at a
  time (its stand-in state is per library); captures in several threads are safe.
- Repeated runs: the stand-in's records are reset before each run, so one `HostProgram` may be
  run many times with different argument values (no recompile).
- A DSL upgrade may change the exported host ABI (entry points, struct layouts): the tests in
  tests/tk_cute/emulator/ check it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tk_cute.arch import target as _target
from tk_cute.compile import COMPILE_LOCK

STANDIN_SOURCE = Path(__file__).with_name("standin.c")
_PREFIX = "tkemu"  # symbol prefix of the exported host code

# cudaDeviceAttr ids (CUDA runtime API) the stand-in answers: (id, name, value or callable on
# the `Target`). The host code asks 97 for the opt-in shared memory; the rest are limits a
# launch preflight may read.
_DEVICE_ATTRIBUTES = (
    (1, "cudaDevAttrMaxThreadsPerBlock", 1024),
    (2, "cudaDevAttrMaxBlockDimX", 1024),
    (3, "cudaDevAttrMaxBlockDimY", 1024),
    (4, "cudaDevAttrMaxBlockDimZ", 64),
    (5, "cudaDevAttrMaxGridDimX", 2**31 - 1),
    (6, "cudaDevAttrMaxGridDimY", 65535),
    (7, "cudaDevAttrMaxGridDimZ", 65535),
    (8, "cudaDevAttrMaxSharedMemoryPerBlock", 48 * 1024),
    (10, "cudaDevAttrWarpSize", 32),
    (16, "cudaDevAttrMultiProcessorCount", lambda t: t.sm_count),
    (75, "cudaDevAttrComputeCapabilityMajor", lambda t: t.compute_capability[0]),
    (76, "cudaDevAttrComputeCapabilityMinor", lambda t: t.compute_capability[1]),
    (97, "cudaDevAttrMaxSharedMemoryPerBlockOptin", lambda t: t.smem_bytes),
)

# CUfunction_attribute ids (driver API) for cuKernelGetAttribute: the host code asks 1 (static
# shared bytes) and sets max dynamic shared memory = opt-in - static.
_KERNEL_ATTRIBUTES = {0: "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
                      1: "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES",
                      2: "CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES",
                      3: "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"}

_PTX_TYPE_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}


def device_attributes(arch: str) -> dict[int, int]:
    """{cudaDeviceAttr id: value} the stand-in answers for `arch` (from `tk_cute.arch.target`;
    an SM count the target does not fix (``sm_count=None``) is left out: pass it)."""
    t = _target(arch)
    out = {}
    for attr, _, value in _DEVICE_ATTRIBUTES:
        v = value(t) if callable(value) else value
        if v is not None:
            out[attr] = int(v)
    return out


class Param(NamedTuple):
    """One kernel parameter as the launch passed it: PTX name (without the kernel's prefix),
    PTX type (``u64``, ``b8``, ...), size and alignment in bytes, and its bytes."""

    name: str
    ptx_type: str
    size: int
    align: int
    data: bytes


@dataclass(frozen=True)
class Launch:
    """One kernel launch the host code made (see the module docstring for each field's
    source). `attributes` maps launch attribute names to decoded values (tuples for dims,
    ints for flags, bytes for the ones not decoded); `func_attributes` the function attributes
    the host set, by ``cudaFuncAttribute`` name; `device_queries` every device / kernel
    attribute the host asked, ``(name, value)``."""

    arch: str
    kernel: str
    ptx: str = field(repr=False)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    smem_bytes: int
    attributes: dict = field(repr=False)
    params: tuple[Param, ...] = field(repr=False)
    func_attributes: dict = field(default_factory=dict, repr=False)
    device_queries: tuple = field(default=(), repr=False)
    stream: int = 0
    library_bytes: int = 0

    def param(self, key: int | str) -> Param:
        """The parameter at index `key`, or named `key` (``param_3`` or the full PTX name)."""
        if isinstance(key, int):
            return self.params[key]
        for p in self.params:
            if p.name == key or f"{self.kernel}_{p.name}" == key:
                return p
        raise KeyError(f"{self.kernel} has no parameter {key!r}: "
                       f"{[p.name for p in self.params]}")

    def raw(self, key: int | str) -> bytes:
        """A parameter's bytes as passed."""
        return self.param(key).data

    def value(self, key: int | str, signed: bool = False) -> int:
        """A scalar parameter's value (little-endian; any size)."""
        return int.from_bytes(self.param(key).data, "little", signed=signed)

    def tensor_maps(self) -> list[tuple[int, bytes]]:
        """(index, 128 bytes) of every parameter shaped like a TMA descriptor (a 64-byte
        aligned 128-byte ``.b8`` array)."""
        return [(i, p.data) for i, p in enumerate(self.params)
                if p.ptx_type == "b8" and p.size == 128 and p.align == 64]


class _EntryParam(NamedTuple):
    name: str
    ptx_type: str
    size: int
    align: int


_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\((.*?)\)", re.DOTALL)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.([a-z]+)(\d+)"
                    r"((?:\s+\.ptr)?(?:\s+\.(?:global|const|shared|local))?"
                    r"(?:\s+\.align\s+\d+)?)\s+([\w$.]+)(?:\[(\d+)\])?")


def entry_params(ptx: str) -> dict[str, list[_EntryParam]]:
    """{kernel name: its parameters} from the ``.entry`` signatures of `ptx`: the size of each
    is its type's bytes times the array length; the alignment the ``.align`` before the type
    (else the type's size; an ``.align`` after ``.ptr`` is the pointee's, not the slot's)."""
    out = {}
    for name, body in _ENTRY.findall(ptx):
        params = []
        for decl in (d.strip() for d in body.split(",")):
            if not decl:
                continue
            m = _PARAM.fullmatch(decl)
            if m is None:
                raise ValueError(f"unrecognized parameter of {name}: {decl!r}")
            align, kind, bits, _, pname, count = m.groups()
            elem = _PTX_TYPE_BYTES[bits]
            short = pname[len(name) + 1:] if pname.startswith(name + "_") else pname
            params.append(_EntryParam(short, kind + bits, elem * int(count or 1),
                                      int(align or elem)))
        out[name] = params
    return out


def static_shared_bytes(ptx: str) -> int:
    """Bytes of the module's static (non-extern) ``.shared`` variables: what
    ``cuKernelGetAttribute(SHARED_SIZE_BYTES)`` answers (an upper bound for a module of several
    kernels; the DSL's kernels use dynamic shared memory, so usually 0)."""
    total = 0
    for m in re.finditer(r"^\s*\.shared\s+(?:\.align\s+\d+\s+)?\.[a-z]+(\d+)\s+[\w$.]+"
                         r"((?:\[\d+\])*)\s*;", ptx, re.MULTILINE):
        n = _PTX_TYPE_BYTES[m.group(1)]
        for dim in re.findall(r"\[(\d+)\]", m.group(2)):
            n *= int(dim)
        total += n
    return total


# ---- the stand-in: build once per source hash ---------------------------------------------
def cache_dir() -> Path:
    """Where built stand-ins are kept (see the module docstring): a private directory, made
    with mode 0700 and refused (PermissionError) unless it is this user's and no one else can
    write it, as the DSL's own cache (`tk_cute.dsl_cache.private_dir`): the object found there
    is linked into this process."""
    from tk_cute.dsl_cache import private_dir

    base = os.environ.get("TK_CUTE_EMULATOR_CACHE")
    if base:
        path = Path(base)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(xdg) / "tk_cute" / "emulator"
    return private_dir(path)


def c_compiler() -> str:
    """The C compiler the stand-in is built and linked with: ``$CC``, else the first of cc,
    gcc, clang on PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else []
    for name in names + ["cc", "gcc", "clang"]:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "tk_cute.emulator needs a C compiler to build its CUDA runtime stand-in and link the "
        f"exported host code: none of {', '.join(names + ['cc', 'gcc', 'clang'])} is on PATH "
        "(install gcc, or set CC)")


_BUILD_LOCK = threading.Lock()


def standin_object() -> Path:
    """The compiled stand-in (position-independent object), built at first use."""
    if not STANDIN_SOURCE.exists():
        raise RuntimeError(f"{STANDIN_SOURCE} is missing: the tk_cute install lacks its package "
                           "data (tk_cute/emulator/standin.c)")
    source = STANDIN_SOURCE.read_bytes()
    out = cache_dir() / f"standin-{hashlib.sha256(source).hexdigest()[:16]}.o"
    with _BUILD_LOCK:
        if not out.exists():
            cc = c_compiler()
            fd, tmp = tempfile.mkstemp(suffix=".o", dir=out.parent)
            os.close(fd)
            try:
                _run([cc, "-std=c11", "-O2", "-fPIC", "-Wall", "-c", str(STANDIN_SOURCE), "-o",
                      tmp], "compile the stand-in")
                os.replace(tmp, out)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return out


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        missing = sorted(set(re.findall(r"undefined reference to [`'](\w+)'", done.stderr)))
        hint = (f"; the exported host code needs runtime entry points the stand-in lacks: "
                f"{missing} (a DSL upgrade? add them to standin.c)") if missing else ""
        raise RuntimeError(f"could not {what} (exit {done.returncode}){hint}: "
                           f"{done.stderr.strip()[:2000]}")


# ---- records (mirrors of standin.c's structs) -----------------------------------------------
class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint8 * 4),
                ("val", ctypes.c_uint8 * 64)]


def _launch_rec(max_attrs: int):
    class _LaunchRec(ctypes.Structure):
        _fields_ = [("kernel", ctypes.c_int32), ("via_ex", ctypes.c_int32),
                    ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3),
                    ("smem", ctypes.c_uint64), ("stream", ctypes.c_uint64),
                    ("num_attrs", ctypes.c_uint32), ("nparams", ctypes.c_uint32),
                    ("param_offset", ctypes.c_uint64), ("param_bytes", ctypes.c_uint64),
                    ("attrs", _LaunchAttr * max_attrs)]
    return _LaunchRec


class _AttrLog(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("kernel", ctypes.c_int32), ("attr", ctypes.c_int32),
                ("value", ctypes.c_int32), ("device", ctypes.c_int32),
                ("answered", ctypes.c_int32)]


@functools.cache
def _enum_names(enum_name: str) -> dict[int, str]:
    """{value: name} of a cuda.bindings.runtime enum (empty where it is not importable)."""
    try:
        from cuda.bindings import runtime

        return {int(e): e.name for e in getattr(runtime, enum_name)}
    except Exception:  # pragma: no cover - cuda-python is a DSL dependency
        return {}


def _attribute_name(attr: int) -> str:
    return _enum_names("cudaLaunchAttributeID").get(attr, f"cudaLaunchAttribute{attr}")


def _decode_attribute(attr: int, val: bytes):
    """A launch attribute's value: dims as tuples, flags / ids as ints, else the raw bytes."""
    name = _attribute_name(attr)
    if name in ("cudaLaunchAttributeClusterDimension",
                "cudaLaunchAttributePreferredClusterDimension"):
        return struct.unpack_from("<3I", val)
    if name in ("cudaLaunchAttributeProgrammaticStreamSerialization",
                "cudaLaunchAttributeCooperative", "cudaLaunchAttributePriority",
                "cudaLaunchAttributeMemSyncDomain", "cudaLaunchAttributeSynchronizationPolicy",
                "cudaLaunchAttributeClusterSchedulingPolicyPreference",
                "cudaLaunchAttributePortableClusterSizeMode",
                "cudaLaunchAttributeSharedMemoryMode",
                "cudaLaunchAttributePreferredSharedMemoryCarveout",
                "cudaLaunchAttributeNvlinkUtilCentricScheduling"):
        return struct.unpack_from("<I", val)[0]
    return bytes(val)


def _image_size(addr: int | None) -> int:
    """Bytes of the image at `addr`: a fatbin (header: magic 0xBA55ED50, u16 version, u16
    header size, u64 payload size) or an ELF cubin (to the end of its last header table or
    section); 0 when neither."""
    if not addr:
        return 0
    head = ctypes.string_at(addr, 64)
    magic = struct.unpack_from("<I", head)[0]
    if magic == 0xBA55ED50:
        _, _, header, payload = struct.unpack_from("<IHHQ", head)
        return header + payload
    if head[:4] == b"\x7fELF" and head[4] == 2:
        phoff, shoff = struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
        end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
        for i in range(shnum):
            sh = ctypes.string_at(addr + shoff + i * shentsize, shentsize)
            kind, offset, size = struct.unpack_from("<I", sh, 4)[0], *struct.unpack_from(
                "<QQ", sh, 24)
            if kind != 8:  # SHT_NOBITS occupies no file bytes
                end = max(end, offset + size)
        return end
    return 0


# ---- the host program --------------------------------------------------------------------
class HostProgram:
    """A `@cute.jit` host function compiled for `arch`, its host code exported and linked with
    the stand-in: `run(*args, **kwargs)` calls it with new argument values (same compile-time
    arguments) and returns its launches."""

    def __init__(self, fn, *args, arch: str, options: str = "", **kwargs):
        import cutlass.cute as cute

        _target(arch)  # rejects unknown targets
        self.arch = arch
        # --keep-ptx writes the PTX file into --dump-dir (the working directory without it).
        with tempfile.TemporaryDirectory(prefix="tk_cute_emu_dump_") as dump, COMPILE_LOCK:
            opts = f"--gpu-arch {arch} --keep-ptx --dump-dir {dump} {options}".strip()
            self.compiled = cute.compile(fn, *args, options=opts, **kwargs)
            self.ptx = self.compiled.__ptx__
            _load_dsl_runtime_globally()
            obj = self.compiled.dump_to_object(_PREFIX)
        self.entries = entry_params(self.ptx)
        self._static_smem = static_shared_bytes(self.ptx)
        self._lock = threading.Lock()
        self._lib = self._link(obj)

    def _link(self, obj: bytes):
        standin = standin_object()
        with tempfile.TemporaryDirectory(prefix="tk_cute_emu_") as tmp:
            o, so = Path(tmp) / "host.o", Path(tmp) / "host.so"
            o.write_bytes(obj)
            _run([c_compiler(), "-shared", "-Wl,-z,defs", "-Wl,-Bsymbolic", "-o", str(so), str(o),
                  str(standin)], "link the exported host code with the stand-in")
            lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_LOCAL)
        name = ctypes.string_at(ctypes.addressof(
            ctypes.c_char.in_dll(lib, f"{_PREFIX}_function_name"))).decode()
        # The packed wrappers: void f(void **slots), each slot the address of an argument's
        # value, then the address of the result.
        self._host, self._init, self._load = (
            getattr(lib, sym) for sym in (name, f"_mlir_{_PREFIX}_cuda_init",
                                          f"_mlir_{_PREFIX}_cuda_load_to_device"))
        for f in (self._host, self._init, self._load):
            f.argtypes, f.restype = [ctypes.c_void_p], None
        lib.standin_call.argtypes, lib.standin_call.restype = [ctypes.c_void_p] * 2, None
        for fname, restype in (("standin_kernel_name", ctypes.c_char_p),
                               ("standin_error", ctypes.c_char_p),
                               ("standin_launch", ctypes.c_void_p),
                               ("standin_log", ctypes.c_void_p),
                               ("standin_arena", ctypes.c_void_p),
                               ("standin_library_image", ctypes.c_void_p),
                               ("standin_sizeof_launch", ctypes.c_uint32),
                               ("standin_sizeof_log", ctypes.c_uint32),
                               ("standin_max_attrs", ctypes.c_uint32)):
            getattr(lib, fname).restype = restype
        self._rec = _launch_rec(lib.standin_max_attrs())
        if (ctypes.sizeof(self._rec) != lib.standin_sizeof_launch()
                or ctypes.sizeof(_AttrLog) != lib.standin_sizeof_log()):
            raise RuntimeError("standin.c's record layout differs from launch.py's mirror")
        return lib

    def close(self) -> None:
        """Unload the program's library (the `HostProgram` cannot run afterwards)."""
        lib, self._lib = getattr(self, "_lib", None), None
        if lib is not None:
            import _ctypes

            _ctypes.dlclose(lib._handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def _fail(self, what: str, code: int):
        detail = self._lib.standin_error().decode()
        queries = [q for q in self._queries() if q[2] is None]
        hint = "".join(f"; asked {name} ({kind}), which the stand-in has no value for: pass "
                       f"device_attributes={{{attr}: value}}" for kind, name, _, attr in queries)
        raise RuntimeError(f"{what} returned CUDA error {code} on the stand-in"
                           f"{': ' + detail if detail else ''}{hint}")

    def _queries(self):
        """(kind, name, value or None where unanswered, id) of every attribute query."""
        out = []
        for i in range(self._lib.standin_log_count()):
            e = _AttrLog.from_address(self._lib.standin_log(i))
            if e.kind == 3:
                name = _enum_names("cudaDeviceAttr").get(e.attr, f"cudaDevAttr{e.attr}")
                out.append(("device", name, e.value if e.answered else None, e.attr))
            elif e.kind == 4:
                name = _KERNEL_ATTRIBUTES.get(e.attr, f"CU_FUNC_ATTRIBUTE_{e.attr}")
                out.append(("kernel", name, e.value if e.answered else None, e.attr))
        return out

    def runtime_args(self, args: tuple, kwargs: dict) -> tuple:
        """The runtime arguments among `args`, `kwargs`, in the compiled signature's order (the
        compile-time ones dropped; a method's `self` is bound by the caller's object)."""
        ea = self.compiled.execution_args
        sig, runtime = ea.original_signature, list(ea.signature.parameters)
        for lead in ((), (None,)):  # a jit method's signature starts with self
            try:
                bound = sig.bind(*lead, *args, **kwargs)
            except TypeError:
                continue
            bound.apply_defaults()
            if all(n in bound.arguments for n in runtime):
                return tuple(bound.arguments[n] for n in runtime)
        raise TypeError(f"arguments do not bind to {sig}: {len(args)} positional, "
                        f"{sorted(kwargs)} keyword")

    def run(self, *args, device_attributes: dict[int, int] | None = None,
            **kwargs) -> list[Launch]:
        """Call the host function with these argument values (all of them, as `fn` takes them;
        compile-time ones must equal the compile's) and return its launches in order.

        Args:
            device_attributes: {cudaDeviceAttr id: value} over the target's defaults (None:
                no value, so a host query of it fails, naming it).
        """
        runtime = self.runtime_args(args, kwargs)
        with self._lock:
            if self._lib is None:
                raise RuntimeError("this HostProgram was closed")
            return self._run(runtime, device_attributes or {})

    def _run(self, runtime: tuple, overrides: dict) -> list[Launch]:
        lib = self._lib
        lib.standin_reset()
        for name, params in self.entries.items():
            sizes = (ctypes.c_uint32 * max(1, len(params)))(*[p.size for p in params])
            if lib.standin_declare_kernel(name.encode(), len(params), sizes):
                self._fail("declaring " + name, -1)
        for attr, value in {**device_attributes(self.arch), **overrides}.items():
            if value is not None:  # None: no value (the host code's query fails, named)
                lib.standin_set_device_attr(int(attr), int(value))
        for attr, value in {0: 1024, 1: self._static_smem, 2: 0, 3: 0}.items():
            lib.standin_set_kernel_attr(attr, value)

        library, err, device = ctypes.c_void_p(), ctypes.c_int32(0), ctypes.c_int32(0)
        p_library = ctypes.pointer(library)
        packed = (ctypes.c_void_p * 2)(ctypes.addressof(p_library), ctypes.addressof(err))
        self._init(packed)
        if err.value:
            self._fail("cuda_init", err.value)
        packed = (ctypes.c_void_p * 3)(ctypes.addressof(p_library), ctypes.addressof(device),
                                       ctypes.addressof(err))
        self._load(packed)
        if err.value:
            self._fail("cuda_load_to_device", err.value)

        exe, keep = self.compiled.execution_args.generate_execution_args(runtime, {})
        result = ctypes.c_int32(0)
        slots = [_slot(a) for a in exe] + [ctypes.addressof(result)]
        lib.standin_call(ctypes.cast(self._host, ctypes.c_void_p),
                         (ctypes.c_void_p * len(slots))(*slots))
        del keep, exe  # (the values the slots point at stay alive up to here)
        if result.value:
            self._fail("the host function", result.value)
        return self._launches()

    def _launches(self) -> list[Launch]:
        lib = self._lib
        arena = lib.standin_arena()
        image = _image_size(lib.standin_library_image())
        queries = tuple((name, value) for _, name, value, _ in self._queries())
        func_attrs: dict[int, dict] = {}
        for i in range(lib.standin_log_count()):
            e = _AttrLog.from_address(lib.standin_log(i))
            if e.kind in (1, 2):
                name = _enum_names("cudaFuncAttribute").get(e.attr, f"cudaFuncAttribute{e.attr}")
                func_attrs.setdefault(e.kernel, {})[name] = e.value
        out = []
        for i in range(lib.standin_launch_count()):
            r = self._rec.from_address(lib.standin_launch(i))
            kernel = lib.standin_kernel_name(r.kernel).decode()
            decls = self.entries[kernel]
            data = ctypes.string_at(arena + r.param_offset, r.param_bytes) if r.param_bytes else b""
            params, at = [], 0
            for d in decls:
                params.append(Param(d.name, d.ptx_type, d.size, d.align, data[at:at + d.size]))
                at += d.size
            attrs = {}
            for a in r.attrs[:min(r.num_attrs, len(r.attrs))]:
                attrs[_attribute_name(a.id)] = _decode_attribute(a.id, bytes(a.val))
            cluster = tuple(attrs.get("cudaLaunchAttributeClusterDimension", (1, 1, 1)))
            out.append(Launch(
                arch=self.arch, kernel=kernel, ptx=self.ptx, grid=tuple(r.grid),
                block=tuple(r.block), cluster=cluster, smem_bytes=r.smem, attributes=attrs,
                params=tuple(params), func_attributes=func_attrs.get(r.kernel, {}),
                device_queries=queries, stream=r.stream, library_bytes=image))
        return out


def _slot(arg) -> int:
    """The address an execution argument stands for (the DSL hands ints, c_void_p, or CUDA
    handle objects whose `getPtr` is the address of their value)."""
    if isinstance(arg, ctypes.c_void_p):
        return arg.value or 0
    if isinstance(arg, int):
        return arg
    if hasattr(arg, "getPtr"):
        return int(arg.getPtr())
    return ctypes.cast(arg, ctypes.c_void_p).value


_RUNTIME_HANDLE = None


def _load_dsl_runtime_globally() -> None:
    """The DSL writes its object through an LLVM JIT that resolves the host code's runtime
    imports in the process: load its runtime library (libcute_dsl_runtime.so, no CUDA driver
    needed) with RTLD_GLOBAL once. The stand-in's own definitions are hidden, so programs
    linked with it still bind to the stand-in."""
    global _RUNTIME_HANDLE
    if _RUNTIME_HANDLE is not None:
        return
    from cutlass.base_dsl.env_manager import get_prefix_dsl_libs

    libs = [p for p in (get_prefix_dsl_libs("CUTE_DSL") or "").split(os.pathsep)
            if p.endswith("libcute_dsl_runtime.so") and os.path.exists(p)]
    if not libs:
        raise RuntimeError("the CuTe DSL's runtime library (libcute_dsl_runtime.so) was not "
                           "found (CUTE_DSL_LIBS): the DSL needs it to export host code")
    _RUNTIME_HANDLE = ctypes.CDLL(libs[0], mode=ctypes.RTLD_GLOBAL)


def capture_all(fn, *args, arch: str, options: str = "", device_attributes=None,
                **kwargs) -> list[Launch]:
    """Every launch `fn(*args, **kwargs)` makes, compiled for `arch` (see the module).

    Args:
        fn: a `@cute.jit` host function (or jit-decorated callable object / bound method).
        *args, **kwargs: its arguments with the real runtime values (pointers as
            `cute.runtime.make_ptr(dtype, address, ...)`: any integers, nothing is read).
        arch: ``sm_90a``, ``sm_100a``, ``sm_103a`` or ``sm_107a``.
        options: extra `cute.compile` options.
        device_attributes: {cudaDeviceAttr id: value} over `device_attributes(arch)`.

    Returns:
        The launches, in the order the host code made them.
    """
    program = HostProgram(fn, *args, arch=arch, options=options, **kwargs)
    return program.run(*args, device_attributes=device_attributes, **kwargs)


def capture(fn, *args, arch: str, options: str = "", device_attributes=None,
            **kwargs) -> Launch:
    """The one launch `fn(*args, **kwargs)` makes for `arch` (`capture_all`; raises if it
    makes none or several)."""
    launches = capture_all(fn, *args, arch=arch, options=options,
                           device_attributes=device_attributes, **kwargs)
    if len(launches) != 1:
        raise RuntimeError(f"expected one launch, the host code made {len(launches)}: "
                           f"{[x.kernel for x in launches]} (use capture_all)")
    return launches[0]
