"""The house rules that keep the layers apart, and thread-safe compiles.

Imports point down: public API (`tk_cute.nvfp4`, `tk_cute.dense_gemm`, `tk_cute.bench`, ...)
-> tuning (`tk_cute.tuning`: host cost models) -> `kernels/` -> vocabulary (`tk_cute/{types,ops,templates}`) -> `layouts/` -> CuTe DSL. Every
import statement of every module is read (module level and inside functions).
"""

import ast
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ("tk_cute.nvfp4", "tk_cute.dense_gemm", "tk_cute.bench", "tk_cute.report",
          "tk_cute.viz", "tk_cute.testing", "tk_cute.__main__")


def _imports(path: Path, package: str) -> set[str]:
    """Every module `path` imports (relative imports resolved against `package`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            out.add(mod)
            out.update(f"{mod}.{alias.name}" for alias in node.names)
    return out


def _modules(folder: str, package: str):
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT / folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        pkg = ".".join([package, *parts[:-1]]) if path.name != "__init__.py" else ".".join(
            [package, *parts])
        yield path, _imports(path, pkg)


def _violations(folder, package, forbidden):
    bad = []
    for path, mods in _modules(folder, package):
        for m in sorted(mods):
            if any(m == f or m.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {m}")
    return bad


def test_kernels_never_import_the_public_layer():
    assert _violations("kernels", "tk_cute.kernels", PUBLIC + ("tk_cute.tuning",)) == []


def test_tuning_sits_between_the_public_layer_and_kernels():
    """`tk_cute.tuning` (host cost models and picks) imports kernels' Configs, never the public
    layer; only the public layer imports it."""
    assert _violations("tk_cute/tuning", "tk_cute.tuning", PUBLIC) == []
    for folder in ("tk_cute/types", "tk_cute/ops", "tk_cute/templates", "layouts"):
        assert _violations(folder, folder.replace("/", "."), ("tk_cute.tuning",)) == [], folder


def test_vocabulary_never_imports_kernels_or_the_public_layer():
    for folder in ("tk_cute/types", "tk_cute/ops", "tk_cute/templates"):
        pkg = folder.replace("/", ".")
        assert _violations(folder, pkg, ("tk_cute.kernels",) + PUBLIC) == [], folder


def test_layouts_import_only_layouts():
    assert _violations("layouts", "tk_cute.layouts",
                       ("tk_cute.kernels", "tk_cute.types", "tk_cute.ops", "tk_cute.templates")
                       + PUBLIC) == []


def test_the_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "k.py"
    bad.write_text("def f():\n    from tk_cute.nvfp4.tensor import NVFP4Tensor\n")
    assert "tk_cute.nvfp4.tensor" in _imports(bad, "tk_cute.kernels")


# ---------------------------------------------------------------- thread-safe compiles


@pytest.mark.parametrize("round_", range(2))
def test_concurrent_compiles_build_each_key_once(round_):
    """8 threads x 2 targets compile at once through the public paths: a shared kernel cache
    (sm_90a, the stream-read kernel) and `tk_cute.compile.build` (sm_100a, the quantizer).
    No crash, no exception, one kernel object per cache key."""
    from tk_cute.compile import build
    from tk_cute.kernels import nvfp4_quantize as nq
    from tk_cute.kernels import stream_read as sr
    from tk_cute.launcher import KernelCache

    cache, results, errors = KernelCache(), [], []
    cfg = nq.Config(arch="sm_100a")
    start = threading.Barrier(16)

    def cached():
        start.wait()
        results.append(cache.get("sm_90a", lambda: sr.compile_launcher("--gpu-arch sm_90a")))

    def built():
        start.wait()
        b = build(nq._quantize, *nq.quantize_signature(cfg).compile_args(cfg), arch="sm_100a")
        assert b.ptx_count(r"cvt\.rn\.satfinite\.e2m1x2\.f32") > 0

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in [cached] * 8 + [built] * 8]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a compile hung"
    assert errors == []
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert len(cache) == 1 and len(cache.compile_seconds) == 1


def _in_threads(fns, timeout: float = 300) -> list:
    """Run each of `fns` in its own thread, all released at once; the exceptions raised."""
    errors, start = [], threading.Barrier(len(fns))

    def guarded(fn):
        try:
            start.wait()
            fn()
        except BaseException as e:  # noqa: BLE001 - collected and asserted by the caller
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a trace hung"
    return errors


def test_host_layout_traces_from_many_threads():
    """`eval_cute_layout` and `viz.swizzle_bytes` trace a `@cute.jit` function on the host; 8
    threads of each at once (they raised in every round before they took `COMPILE_LOCK`) give
    the closed forms: a random strided layout's offsets, the 128-byte swizzle's XOR."""
    import random

    import cutlass
    import cutlass.cute as cute
    import numpy as np

    from tk_cute.layouts.nvfp4_scales import eval_cute_layout
    from tk_cute.types import st
    from tk_cute.viz import swizzle_bytes

    def layout_job():
        shape = (random.randint(1, 9), random.randint(1, 9))
        stride = (random.randint(0, 50), random.randint(0, 50))
        coords = [(i, j) for i in range(shape[0]) for j in range(shape[1])]
        _, got = eval_cute_layout(lambda: cute.make_layout(shape, stride=stride), coords)
        assert got == [i * stride[0] + j * stride[1] for i, j in coords], (shape, stride)

    def swizzle_job():
        got = swizzle_bytes(st(cutlass.BFloat16, 16, 64))  # 128-byte rows: Swizzle<3, 4, 3>
        x = 128 * np.arange(16)[:, None] + 16 * np.arange(8)[None, :]
        assert (got == x ^ ((x & (7 << 7)) >> 3)).all()

    assert _in_threads([layout_job] * 8 + [swizzle_job] * 8) == []


def test_nvfp4_modules_import_without_a_circle():
    """Inside `tk_cute.nvfp4` the imports (module level and inside functions) form no circle:
    `tensor` (the data type) sits at the bottom and learns its torch-function handler from
    `modules` at import (`tensor.TORCH_FUNCTION`) instead of importing it."""
    graph = {}
    for path, mods in _modules("tk_cute/nvfp4", "tk_cute.nvfp4"):
        name = "tk_cute.nvfp4" if path.name == "__init__.py" else f"tk_cute.nvfp4.{path.stem}"
        graph[name] = {m for m in mods if m.startswith("tk_cute.nvfp4.") and m.count(".") == 2}
    graph.pop("tk_cute.nvfp4")  # the package imports everything it exports
    seen, stack = set(), []

    def visit(node):
        if node in stack:
            raise AssertionError(" -> ".join(stack[stack.index(node):] + [node]))
        if node in seen or node not in graph:
            return
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()
        seen.add(node)

    for node in sorted(graph):
        visit(node)


def test_kernels_import_without_torch():
    """`kernels/` (and the vocabulary, layouts and `tk_cute.launcher` below them) import no
    torch: every kernel module imports in a process where torch cannot be imported."""
    import subprocess
    import sys

    code = (
        "import sys, importlib, pathlib\n"
        "sys.modules['torch'] = None\n"
        "for p in sorted(pathlib.Path('kernels').rglob('*.py')):\n"
        "    parts = p.with_suffix('').parts[1:]\n"
        "    parts = parts[:-1] if parts[-1] == '__init__' else parts\n"
        "    importlib.import_module('.'.join(('tk_cute', 'kernels', *parts)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
