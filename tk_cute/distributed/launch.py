"""Starting tensor-parallel processes: the multicast-off environment, `init_process_group`, and
`spawn`, which runs a function on N processes of one host with bounded time.

NVLink multicast stays off in every process this module starts or initializes
(`MULTICAST_OFF`): NCCL's NVLS algorithms (``NCCL_NVLS_ENABLE=0``), torch's symmetric-memory
multicast (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``) and NVSHMEM's (``NVSHMEM_DISABLE_NVLS=1``).
The machines this project runs on lend GPUs whose multicast objects must not be used (see the
device notes); NCCL reads its variable when a communicator is created, so they are set before
``init_process_group`` and inherited by spawned children. Nothing here uses symmetric memory or
multimem operations; the collectives are plain NCCL (GPU) or gloo (CPU) ones.

`spawn(fn, world_size, *args)` runs ``fn(rank, world_size, *args)`` on `world_size` fresh
processes (the "spawn" start method: no forked CUDA state), each with the default process group
initialized (gloo on CPU, NCCL with one GPU per rank) from a file rendezvous in a temporary
directory (no TCP port to collide on) and a collective timeout, and returns the values by rank.
gloo ranks get an equal share of the host's cores for torch's intra-op threads.
Every wait is bounded: a rank that hangs or dies is reported and its processes terminated, so a
test never hangs CI. ``fn`` must be importable by the children: a function of an importable
module, of a file (a test module, an example script: the child loads the file, without running
its ``if __name__ == "__main__":`` block), or a ``"path/to/file.py:name"`` /
``"package.module:name"`` string (a notebook passes its paired script this way).
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
import queue as queue_mod
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
DEFAULT_TIMEOUT_S = 60.0


def disable_multicast() -> None:
    """Set `MULTICAST_OFF` in this process's environment (overriding any other value: a
    communicator created afterwards never uses NVLink multicast)."""
    os.environ.update(MULTICAST_OFF)


def init_process_group(backend: str | None = None, *, rank: int, world_size: int,
                       init_method: str | None = None, store=None,
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """``torch.distributed.init_process_group`` with multicast off and a bounded timeout.

    Args:
        backend: "nccl" or "gloo"; default NCCL where CUDA is available, else gloo.
        rank, world_size: this process's rank and the number of processes.
        init_method, store: the rendezvous (as torch's).
        timeout_s: every collective's timeout (a rank that never arrives fails the others
            after this long instead of hanging them).

    For NCCL the current CUDA device is set to ``rank % device_count`` first (one GPU per
    rank on one host; NCCL collectives and ``all_gather_object`` use the current device).
    """
    disable_multicast()
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    kwargs = {"store": store} if store is not None else {"init_method": init_method}
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s), **kwargs)


@dataclass
class RankError:
    """What one rank raised: the exception's type name, message and formatted traceback."""

    rank: int
    type: str
    message: str
    traceback: str


class SpawnError(RuntimeError):
    """Some ranks of a `spawn` raised, died or ran out of time; `errors` holds each one's."""

    def __init__(self, message: str, errors: list[RankError]):
        super().__init__(message)
        self.errors = errors


def _reference(fn) -> tuple[str, str, str | None]:
    """(module name, qualified name, file) by which a child finds `fn`."""
    if isinstance(fn, str):
        where, sep, name = fn.rpartition(":")
        if not sep or not where or not name:
            raise ValueError(f"spawn: a function reference is 'file.py:name' or 'module:name', "
                             f"got {fn!r}")
        if where.endswith(".py"):
            path = Path(where).resolve()
            if not path.is_file():
                raise ValueError(f"spawn: {path} does not exist")
            return "", name, str(path)
        return where, name, None
    if not callable(fn) or "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        raise ValueError(f"spawn needs a module-level function (the children import it), got "
                         f"{fn!r}")
    module = sys.modules.get(fn.__module__)
    file = getattr(module, "__file__", None)
    if fn.__module__ == "__main__" and file is None:
        raise ValueError("spawn: functions defined in a notebook or an interactive session "
                         "cannot be imported by the children; pass 'file.py:name' for a script "
                         "that defines the function")
    return fn.__module__, fn.__qualname__, file


def _resolve(module: str, qualname: str, file: str | None):
    """The child's side of `_reference`."""
    obj = None
    if file is not None:
        # A script run as __main__ was loaded by multiprocessing as __mp_main__: reuse it.
        main = sys.modules.get("__mp_main__")
        if getattr(main, "__file__", None) and os.path.samefile(main.__file__, file):
            obj = main
        elif module and module != "__main__":
            spec = importlib.util.find_spec(module) if _importable(module) else None
            if spec is not None and spec.origin and os.path.samefile(spec.origin, file):
                obj = importlib.import_module(module)
        if obj is None:  # a test module or script not importable by name: load its file
            name = f"_tk_cute_spawned_{Path(file).stem.replace('-', '_')}"
            obj = sys.modules.get(name)
            if obj is None:
                spec = importlib.util.spec_from_file_location(name, file)
                obj = importlib.util.module_from_spec(spec)
                sys.modules[name] = obj
                spec.loader.exec_module(obj)
    else:
        obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _child(rank, world_size, backend, init_file, timeout_s, ref, args, results):
    disable_multicast()
    if backend == "gloo":  # CPU ranks share the host's cores: no oversubscribed thread pools
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        fn = _resolve(*ref)
        init_process_group(backend, rank=rank, world_size=world_size,
                           init_method=f"file://{init_file}", timeout_s=timeout_s)
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        buf = io.BytesIO()
        # Bytes, not tensors, cross the queue: torch's multiprocessing pickler would hand
        # tensors over in shared memory that this process frees when it exits.
        torch.save(value, buf)
        results.put((rank, "ok", buf.getvalue()))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        results.put((rank, "error", (type(e).__name__, str(e), traceback.format_exc())))


def spawn(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S,
          join_timeout_s: float | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` on `world_size` new processes (module docstring).

    Args:
        fn: a module-level function (or a ``"file.py:name"`` / ``"module:name"`` reference).
        world_size: the number of processes (NCCL: at most one per GPU).
        args: passed to every rank; picklable.
        backend: "gloo" (CPU) or "nccl" (GPU i for rank i).
        timeout_s: the collectives' timeout inside the children.
        join_timeout_s: the most this call waits for all ranks (default ``2 * timeout_s +
            60``: imports and a collective timeout included); then the remaining children
            are terminated.

    Returns:
        The ranks' return values (loaded with ``torch.load``), by rank.

    Raises:
        SpawnError: a rank raised (its type, message and traceback are in ``errors``), exited
            without a result, or did not finish in time.
    """
    import torch.multiprocessing as mp

    ref = _reference(fn)
    disable_multicast()  # inherited by the children, set again there before init
    deadline = time.monotonic() + (2 * timeout_s + 60 if join_timeout_s is None
                                   else join_timeout_s)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="tk_cute_spawn_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_child, args=(rank, world_size, backend, init_file,
                                                  timeout_s, ref, args, results), daemon=True)
                 for rank in range(world_size)]
        for p in procs:
            p.start()
        done: dict[int, tuple] = {}
        try:
            while len(done) < world_size and time.monotonic() < deadline:
                try:
                    rank, status, payload = results.get(timeout=0.1)
                    done[rank] = (status, payload)
                except queue_mod.Empty:
                    # A child that died without a result (killed, crashed interpreter).
                    if any(p.exitcode not in (None, 0) for r, p in enumerate(procs)
                           if r not in done) and results.empty():
                        time.sleep(0.2)  # let a result already in the pipe arrive
                        if results.empty():
                            break
            for p in procs:
                p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()  # only the children this call started
                    p.join(timeout=5)
    errors = []
    for rank, p in enumerate(procs):
        if rank not in done:
            why = (f"exited with code {p.exitcode} and no result"
                   if p.exitcode not in (None, -15) else "had not finished and was terminated")
            errors.append(RankError(rank, "SpawnError", f"rank {rank} {why}", ""))
        elif done[rank][0] == "error":
            errors.append(RankError(rank, *done[rank][1]))
    if errors:
        summary = "; ".join(f"rank {e.rank}: {e.type}: {e.message}" for e in errors)
        detail = "\n".join(e.traceback for e in errors if e.traceback)
        raise SpawnError(f"spawn of {world_size} {backend} processes failed: {summary}\n{detail}",
                         errors)
    return [torch.load(io.BytesIO(done[r][1]), weights_only=False) for r in range(world_size)]
