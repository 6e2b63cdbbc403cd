"""The one timing method every benchmark uses.

- Same process, same inputs for every variant; variants are interleaved round by round so
  clock and thermal drift hit them alike.
- Cold L2: each variant cycles through input sets whose total is several times the L2
  (`input_sets`), so no call finds its operands cached by the previous one.
- CUDA events around a batch of calls (one per input set), warm-up first, median over rounds.
- A batch passes over the input sets until it holds GRAPH_CALLS calls. `graph=True` captures
  each variant's batch in a CUDA graph and times its replay: the GPU time alone, without the
  host's per-call cost (Python validation, DLPack views, launch), which `host_overhead`
  measures separately; launching a graph costs a few microseconds, which over the 5 calls of
  one pass had added ~0.8 us to each call of a 10 us kernel (H200, docs/facts.md#graph-calls),
  a constant that shrank every speedup over a slower peer. Eager batches are as long, the
  calls queued back to back as a model's layers are: the GPU waits on the host only where the
  host is slower than the kernels (a batch of one pass, 2 calls from an idle queue, had added
  the host's lead to the first kernel to every call of a GPU-bound forward).
- Every result line records the GPU; `environment()` gives clocks and versions for the results
  file.
"""

from __future__ import annotations

import html
import statistics
import time
from dataclasses import dataclass

import torch


def l2_bytes() -> int:
    return torch.cuda.get_device_properties(0).L2_cache_size


def input_sets(make, bytes_per_set: int, minimum: int = 2, factor: int = 3) -> list:
    """As many input sets from `make()` as needed to exceed `factor` x the L2 cache."""
    n = max(minimum, -(-factor * l2_bytes() // max(bytes_per_set, 1)))
    return [make() for _ in range(n)]


GRAPH_CALLS = 64  # calls per timed batch, eager or graph, at least (whole passes over the input sets)


@dataclass
class Result:
    name: str
    ms: float  # median per call
    spread: float  # (max - min) / median over rounds

    def __repr__(self) -> str:
        return f"<Result {self.name}: {self.ms * 1e3:.1f} us, spread {self.spread:.2f}>"

    def _repr_html_(self) -> str:
        return (f"<table><tr><th>variant</th><th>time (us)</th><th>spread</th></tr><tr><td>"
                f"{html.escape(self.name)}</td><td>{self.ms * 1e3:.1f}</td>"
                f"<td>{self.spread:.2f}</td></tr></table>")


def bench(variants: dict, sets: list, warmup: int = 3, rounds: int = 20, pause: float = 0.0,
          graph: bool = False):
    """Time each `variants[name](inputs)` over `sets`; return {name: Result}.

    One round calls a variant on the input sets in turn, GRAPH_CALLS or more calls (whole
    passes), between two CUDA events (or replays the captured graph of those calls); the
    per-call time is that span over the number of calls.
    Rounds alternate between variants."""
    for fn in variants.values():
        for _ in range(warmup):
            for s in sets:
                fn(s)
    torch.cuda.synchronize()
    sets = sets * -(-GRAPH_CALLS // len(sets))
    calls_per_batch = len(sets)
    if graph:
        variants = {name: _captured(fn, sets) for name, fn in variants.items()}
        sets = [None]
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for s in sets:
                fn(s)
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / calls_per_batch)
            if pause:
                time.sleep(pause)
    out = {}
    for name, t in times.items():
        med = statistics.median(t)
        out[name] = Result(name, med, (max(t) - min(t)) / med)
    return out


def checked_call(fn, inputs, shape, dtype: torch.dtype, a, b, what: str) -> None:
    """One untimed call ``fn(inputs, d)`` of a tk_cute variant into a NaN-poisoned D of `shape`
    and `dtype`; raise AssertionError unless it wrote that D with every element within
    `tk_cute.testing`'s bound of ``a @ b^T`` (a wrong, unwritten or NaN element fails; the
    benches check every tk_cute variant of every shape so before timing it). `a`, `b`: the
    operands, or their exact float64 values (`testing.exact`) where several calls share them
    (not for fp8 operands: their bound is wider)."""
    from tk_cute.testing import assert_gemm_close

    d = torch.full(shape, float("nan"), dtype=dtype, device=b.device)
    got = fn(inputs, d)
    if got is not d:
        raise AssertionError(f"{what}: returned a tensor other than the D it was given")
    assert_gemm_close(d, a, b, what)


def _captured(fn, sets):
    """A callable replaying a CUDA graph of `fn` over every input set."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for s in sets:
            fn(s)
    torch.cuda.synchronize()
    return lambda _: g.replay()


def host_overhead(fn, inputs, calls: int = 200) -> float:
    """Microseconds of host time per call of `fn(inputs)` (mean over `calls`, GPU work queued
    asynchronously; the queue does not fill in 200 calls of a small problem): one round of
    `host_overheads`."""
    return host_overheads({"fn": lambda: fn(inputs)}, calls, rounds=1)["fn"][0]


def host_overheads(fns: dict, calls: int = 200, rounds: int = 15) -> dict[str, list[float]]:
    """Microseconds of host time per call of each `fns[name]()`, once per round: {name: [us per
    round]}. Rounds alternate between the calls (as `bench`'s do), so a host's drift (other
    tenants, clocks) hits them alike: compare two calls by the median of their per-round
    ratios. GPU work queues asynchronously; the garbage collector is off while timing (as
    `timeit` does)."""
    import gc

    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    out = {name: [] for name in fns}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, fn in fns.items():
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                out[name].append((time.perf_counter() - start) / calls * 1e6)
                torch.cuda.synchronize()
    finally:
        if enabled:
            gc.enable()
    return out


def require_gpu() -> None:
    """Exit with a clear message where torch sees no CUDA GPU (the benches time kernels)."""
    if not torch.cuda.is_available():
        raise SystemExit(f"python -m tk_cute.bench times kernels on a CUDA GPU; torch "
                         f"{torch.__version__} sees none (CUDA build: {torch.version.cuda})")


def environment() -> str:
    """GPU, clocks, driver and library versions, for the results file (`require_gpu`
    first)."""
    import subprocess

    import cutlass

    require_gpu()

    p = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001 - informational only
        smi = f"nvidia-smi unavailable: {e}"
    return (f"{p.name}, {p.multi_processor_count} SMs, L2 {p.L2_cache_size >> 20} MiB; "
            f"nvidia-smi: {smi}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"nvidia-cutlass-dsl {getattr(cutlass, '__version__', '4.8.1')}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def row(name: str, shape: str, ms: float, flops: float = 0, nbytes: float = 0,
        baseline_ms: float | None = None, extra: str = "") -> str:
    """One result line: name, shape, ms, TFLOP/s, GB/s, speedup vs the named baseline."""
    tf = f"{flops / ms / 1e9:8.1f}" if flops else "       -"
    gb = f"{nbytes / ms / 1e6:8.1f}" if nbytes else "       -"
    sp = f"{baseline_ms / ms:6.3f}x" if baseline_ms else "      -"
    return f"| {name:<28} | {shape:<22} | {ms * 1e3:10.1f} | {tf} | {gb} | {sp} | {extra}"


HEADER = ("| variant                      | shape                  |    time us |   TF/s  |"
          "   GB/s  | vs base | notes")
