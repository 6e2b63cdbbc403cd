"""Tensor-parallel NVFP4 GEMMs: each rank runs `tk_cute.nvfp4.gemm` on its weight shard and the
ranks combine the results with torch.distributed collectives (NCCL on GPUs, gloo on CPUs).

Weights are NVFP4 shards cut by `tk_cute.nvfp4.shard` (one global scale for all of them);
activations are bfloat16 (W4A16) or NVFP4Tensors (W4A4). ``D = a @ W^T`` with W (N, K):

- `column_parallel_gemm(a, w_shard)`: W cut along N (rows); a replicated; each rank computes
  its N / p output columns, optionally all-gathered along N. Every output element is one row of
  W against one row of a, computed as on one process: exact (bitwise the single-process result
  on the CPU reference; on a GPU the shard's kernel may differ from the full GEMM's, so within
  `tk_cute.testing.assert_gemm_close`'s bound).
- `row_parallel_gemm(a_shard, w_shard)`: W and a cut along K; each rank's partial product (M, N)
  is computed in `reduce_dtype` and summed across ranks by an all-reduce (D replicated) or a
  reduce-scatter (rank r gets D's dim-0 block r). The sum is re-associated: bounded in
  `tk_cute.distributed.numerics` (fp32: p roundings of 2^-24 on top of one GEMM's error, far
  below a bf16 output's rounding; bf16: up to p roundings of 2^-8).
- `all_gather_gemm(a_local, w_shards)`: sequence-parallel column GEMM: a's dim 0 (rows) is
  sharded, all-gathered in `chunks` pieces per rank, each piece's GEMM started as soon as it has
  arrived while the next piece travels; this rank's own rows first (they need no
  communication). NVFP4 activations travel as NVFP4 (data + scales: 0.5625 B per element,
  3.56x fewer bytes than bf16; the global scale is shared, so not sent).
- `gemm_reduce_scatter(a, w_shard)`: row-parallel GEMM + reduce-scatter along dim 0, in
  `chunks` pieces: the reduce-scatter of piece j overlaps the GEMM of piece j + 1.
- `quantize_shared(x_local)`: NVFP4-quantize this rank's slice with the global scale of the
  whole tensor (one all-reduce of the amax), so the slices are `shard`s of
  ``quantize(whole)``, byte for byte.

Overlap: collectives are issued with ``async_op=True``. On NCCL they run on the process
group's own CUDA stream while the GEMMs run on the current stream (``Work.wait()`` makes the
current stream wait on the communication stream, never the host); on gloo they run on the
process group's worker threads while the host computes. Streams are ordered as the data needs:
chunk j's GEMM waits for chunk j's gather only; the output of a reduce-scatter is read after
every piece's wait.

Bad input raises on every rank (`tk_cute.distributed.checks`): a local error on one rank, or
ranks that disagree on K, on their weight shards' global scale, on shapes, or a group whose
size does not match `out_features` / `in_features` when given. ``check=False`` skips the
exchange (one small all-gather of Python objects and a host wait per call).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from tk_cute import nvfp4
from tk_cute.layouts.nvfp4_scales import to_blocked
from tk_cute.nvfp4 import NVFP4Tensor, validate

from .checks import checked, group_info

REDUCE_DTYPES = (torch.float32, torch.bfloat16)
REDUCES = ("all_reduce", "reduce_scatter")
HINTS = {
    "weight global scale": "shards of one weight share its global scale: quantize the full "
                           "weight once and cut it with tk_cute.nvfp4.shard, or quantize each "
                           "slice with global_scale= the full weight's",
    "activation global scale": "gathered NVFP4 activations must share one global scale: "
                               "quantize them with tk_cute.distributed.quantize_shared",
    "K": "the shards must all be cut the same way (tk_cute.nvfp4.shard with one count)",
    "weight rows": "the shards must all be cut the same way (tk_cute.nvfp4.shard with one count)",
}

# The collectives every piece here (and the bench's plain-torch baseline) calls: torch's
# single-tensor forms under whichever name this torch has.
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)


# ---------------------------------------------------------------- argument checks


def _weight(w, name: str = "w_shard") -> NVFP4Tensor:
    if not isinstance(w, NVFP4Tensor) or w.ndim != 2:
        raise TypeError(f"{name} must be a 2-D (N, K) NVFP4Tensor (a shard from "
                        f"tk_cute.nvfp4.shard), got {getattr(w, 'shape', type(w).__name__)}")
    return w


def _rows(a) -> int:
    """Rows of `a` along its first dim (the dim sequence parallelism splits)."""
    if isinstance(a, NVFP4Tensor):
        if a.ndim != 2:
            raise ValueError(f"NVFP4 activations must be 2-D (M, K), got {tuple(a.shape)}")
        return a.M
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"activations must be a bfloat16 tensor (W4A16) or an NVFP4Tensor (W4A4), "
                        f"got {type(a).__name__}")
    if a.dim() < 2:
        raise ValueError(f"activations must be at least 2-D (rows, ..., K), got {tuple(a.shape)}")
    return a.shape[0]


def _kind(a) -> str:
    return "nvfp4" if isinstance(a, NVFP4Tensor) else str(getattr(a, "dtype", type(a).__name__))


def _chunks(chunks, rows: int) -> list[tuple[int, int]]:
    """(offset, size) of `chunks` near-equal pieces of `rows` (the first ones one larger)."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= rows:
        raise ValueError(f"chunks must be an int in [1, rows per rank = {rows}], got {chunks!r}")
    base, extra = divmod(rows, chunks)
    sizes = [base + (j < extra) for j in range(chunks)]
    offsets = [sum(sizes[:j]) for j in range(chunks)]
    return list(zip(offsets, sizes))


def _reduce_dtype(dtype) -> torch.dtype:
    if dtype not in REDUCE_DTYPES:
        raise TypeError(f"reduce_dtype must be torch.float32 (exact-order bound: p * 2^-24) or "
                        f"torch.bfloat16 (half the bytes, p * 2^-8), got {dtype}")
    return dtype


def _fmt(t) -> str | None:
    """The block-scale format of an NVFP4 operand (None for bf16 activations)."""
    return getattr(t, "scale_format", "ue4m3") if isinstance(t, NVFP4Tensor) else None


def _trusted(like: NVFP4Tensor, data, scales, shape) -> NVFP4Tensor:
    """A piece of `like` (its global scale and scale format) from re-blocked parts."""
    fmt = _fmt(like)
    extra = () if fmt == "ue4m3" else (fmt,)
    return NVFP4Tensor.trusted(data, scales, like.global_scale, shape, *extra)


def _full_size(name: str, given, local: int, size: int, dim: str) -> None:
    if given is not None and local * size != given:
        raise ValueError(
            f"the group has {size} ranks and this rank's shard has {local} {dim}, so the shards "
            f"make {local * size}, not {name}={given}: the group size does not match how the "
            f"weight was sharded (tk_cute.nvfp4.shard(w, dim, rank, count) with count = "
            f"{given / local:g} here?)")


# ---------------------------------------------------------------- column parallel


def column_parallel_gemm(a, w_shard: NVFP4Tensor, group=None, gather_output: bool = False, *,
                         out_dtype: torch.dtype = torch.bfloat16, out_features: int | None = None,
                         check: bool = True) -> torch.Tensor:
    """This rank's N slice of ``D = a @ W^T`` (W cut along N), or all of D (`gather_output`).

    Args:
        a: the activations, the same on every rank: bfloat16 (..., K) (W4A16) or an NVFP4Tensor
            (M, K) (W4A4; the same bytes and global scale on every rank: quantize the same
            values, or `quantize_shared` them).
        w_shard: this rank's (N / p, K) rows of W (``tk_cute.nvfp4.shard(w, 0, rank, p)``).
        group: the tensor-parallel process group (default: the default group).
        gather_output: all-gather the slices along N, giving every rank D (..., N).
        out_dtype: D's dtype (bfloat16, float16 or float32).
        out_features: N, when known: checks that the group's size matches the sharding.
        check: exchange the arguments' facts first so bad input raises on every rank.

    Returns:
        (..., N / p), or (..., N) with `gather_output`; out_dtype.

    Raises:
        TypeError, ValueError, NotImplementedError: on every rank (module docstring).
    """
    _, size = group_info(group)

    def validate():
        _weight(w_shard)
        nvfp4.plan(a, w_shard, out_dtype)  # the GEMM's own checks (and a kernel for it)
        _full_size("out_features", out_features, w_shard.M, size, "rows (N)")
        # K first: where several facts differ, the first is the one reported.
        facts = {"K": w_shard.K, "weight rows": w_shard.M, "weight scale format": _fmt(w_shard),
                 "weight global scale": w_shard.global_scale, "activations": _kind(a),
                 "activation shape": tuple(a.shape), "activation scale format": _fmt(a),
                 "out_dtype": str(out_dtype), "gather_output": bool(gather_output)}
        if isinstance(a, NVFP4Tensor):
            facts["activation global scale"] = a.global_scale
        return facts

    checked(group, "column_parallel_gemm", validate, check, HINTS)
    y = nvfp4.gemm(a, w_shard, out_dtype)
    return gather_last_dim(y, group) if gather_output else y


def gather_last_dim(y: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather every rank's (..., n) tensor into (..., p * n), rank r's at columns
    ``r * n:(r + 1) * n`` (every rank must pass the same shape)."""
    _, size = group_info(group)
    if size == 1:
        return y
    buf = gather_buffer(y, size)
    all_gather_tensor(buf, y.contiguous(), group=group)
    return buf.view(size, *y.shape).movedim(0, -2).reshape(*y.shape[:-1], size * y.shape[-1])


def gather_buffer(t: torch.Tensor, size: int) -> torch.Tensor:
    """The output of `all_gather_tensor` of `t` over `size` ranks: (size * rows, ...) (gloo
    checks the input's shape stacked along dim 0, NCCL only the element count); callers view
    it as (size, rows, ...)."""
    return torch.empty((size * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)


# ---------------------------------------------------------------- row parallel


def row_parallel_gemm(a_shard, w_shard: NVFP4Tensor, group=None, reduce: str = "all_reduce",
                      reduce_dtype: torch.dtype = torch.float32, *,
                      out_dtype: torch.dtype = torch.bfloat16, in_features: int | None = None,
                      check: bool = True) -> torch.Tensor:
    """``D = a @ W^T`` with a and W cut along K: partial products summed across the group.

    Each rank computes ``a_shard @ w_shard^T`` in `reduce_dtype` (the GEMM's fp32 accumulator
    rounded once to it), the collective sums the p partials in `reduce_dtype` in the backend's
    order (NCCL ring / tree, gloo: not fixed, but every rank receives the same bits), and the sum
    is rounded to `out_dtype`. Bounds: `tk_cute.distributed.numerics.row_parallel_bound`.

    Args:
        a_shard: this rank's K slice of the activations: bfloat16 (..., K / p) or an
            NVFP4Tensor (M, K / p) (its global scale may be this rank's own, or the whole
            tensor's via `quantize_shared`: bit-identical to the single-process model).
        w_shard: this rank's (N, K / p) slice of W (``tk_cute.nvfp4.shard(w, 1, rank, p)``).
        group: the tensor-parallel process group (default: the default group).
        reduce: "all_reduce" (D (..., N) on every rank) or "reduce_scatter" (rank r gets block
            r of D's first dim: (a.shape[0] / p, ..., N); that dim must divide by p).
        reduce_dtype: torch.float32 (default) or torch.bfloat16 (half the bytes on the wire,
            a coarser sum).
        out_dtype: D's dtype.
        in_features: K, when known: checks that the group's size matches the sharding.
        check: exchange the arguments' facts first so bad input raises on every rank.

    Returns:
        D of out_dtype.

    Raises:
        TypeError, ValueError, NotImplementedError: on every rank (module docstring).
    """
    if reduce == "reduce_scatter":
        return gemm_reduce_scatter(a_shard, w_shard, group, chunks=1, reduce_dtype=reduce_dtype,
                                   out_dtype=out_dtype, in_features=in_features, check=check)
    _, size = group_info(group)

    def validate():
        if reduce not in REDUCES:
            raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
        return _row_facts(a_shard, w_shard, size, reduce_dtype, out_dtype, in_features)

    checked(group, "row_parallel_gemm", validate, check, HINTS)
    partial = nvfp4.gemm(a_shard, w_shard, reduce_dtype)
    if size > 1:
        dist.all_reduce(partial, group=group)
    return partial.to(out_dtype)


def _row_facts(a, w, size, reduce_dtype, out_dtype, in_features) -> dict:
    _weight(w)
    _reduce_dtype(reduce_dtype)
    validate.out_dtype(out_dtype)
    nvfp4.plan(a, w, reduce_dtype)
    _full_size("in_features", in_features, w.K, size, "K elements")
    return {"K": w.K, "weight rows": w.M, "weight scale format": _fmt(w),
            "weight global scale": w.global_scale, "activations": _kind(a),
            "activation shape": tuple(a.shape), "activation scale format": _fmt(a),
            "reduce_dtype": str(reduce_dtype), "out_dtype": str(out_dtype)}


def gemm_reduce_scatter(a, w_shard: NVFP4Tensor, group=None, *, chunks: int = 1,
                        reduce_dtype: torch.dtype = torch.float32,
                        out_dtype: torch.dtype = torch.bfloat16, in_features: int | None = None,
                        check: bool = True) -> torch.Tensor:
    """Row-parallel ``D = a @ W^T`` reduce-scattered along D's first dim, pipelined in `chunks`.

    Rank r's result is block r of D's first dim (rows ``r * m:(r + 1) * m``, m = a.shape[0] /
    p), each split in `chunks` pieces: piece j's partial product covers piece j of every rank's
    block (p * size_j rows of a, gathered once into one operand when chunks > 1), and its
    reduce-scatter (async) runs while the GEMM of piece j + 1 computes. Numerics as
    `row_parallel_gemm` (the pieces change which rows a GEMM call sees, not any element's sum).

    Args:
        a: this rank's K slice of the activations, bfloat16 (S, ..., K / p) or an NVFP4Tensor
            (M, K / p); its first dim must divide by the group's size.
        w_shard: this rank's (N, K / p) slice of W.
        group: the tensor-parallel process group.
        chunks: pieces per rank, 1 <= chunks <= a.shape[0] / p (1: one GEMM, one collective).
        reduce_dtype, out_dtype, in_features, check: as `row_parallel_gemm`.

    Returns:
        (a.shape[0] / p, ..., N) of out_dtype.
    """
    _, size = group_info(group)

    def validate():
        facts = _row_facts(a, w_shard, size, reduce_dtype, out_dtype, in_features)
        rows = _rows(a)
        if rows % size:
            raise ValueError(f"reduce-scatter splits D's first dim over the group: a.shape[0] = "
                             f"{rows} must be a multiple of the group's size {size}")
        _chunks(chunks, rows // size)
        facts["chunks"] = chunks
        return facts

    checked(group, "gemm_reduce_scatter", validate, check, HINTS)
    rows = _rows(a)
    m = rows // size
    N = w_shard.M
    nv = isinstance(a, NVFP4Tensor)
    if nv:
        mid, K = (), a.K
        sf = a.scales_logical() if chunks > 1 else None
    else:
        a = a.contiguous()
        mid, K = tuple(a.shape[1:-1]), a.shape[-1]
    out = torch.empty((m, *mid, N), dtype=reduce_dtype, device=w_shard.device)
    works, keep = [], []
    for off, n in _chunks(chunks, m):
        if chunks == 1:
            part_a = a
        elif nv:  # piece j of every rank's block: p * n rows
            data = a.data.reshape(size, m, K // 2)[:, off:off + n].reshape(size * n, K // 2)
            scales = to_blocked(sf.reshape(size, m, K // 16)[:, off:off + n].reshape(size * n,
                                                                                  K // 16))
            part_a = _trusted(a, data, scales, (size * n, K))
        else:
            part_a = a.view(size, m, *mid, K)[:, off:off + n].reshape(size * n, *mid, K)
        partial = nvfp4.gemm(part_a, w_shard, reduce_dtype)  # (p * n, ..., N)
        if size == 1:
            out[off:off + n].copy_(partial)
            continue
        keep.append(partial)  # alive until its collective has read it
        works.append(reduce_scatter_tensor(out[off:off + n], partial, group=group,
                                           async_op=True))
    for work in works:
        work.wait()
    return out.to(out_dtype)


# ---------------------------------------------------------------- sequence-parallel gather


def all_gather_gemm(a_local, w_shards, group=None, *, chunks: int = 1,
                    out_dtype: torch.dtype = torch.bfloat16, out_features: int | None = None,
                    check: bool = True):
    """``all_gather(a_local along dim 0) @ w^T`` for each weight shard, pipelined in `chunks`.

    Rank q's rows of the gathered activations are rows ``q * m:(q + 1) * m`` (m = a_local's
    first dim). The gather is issued first, as `chunks` async all-gathers (piece j: rows
    ``off_j:off_j + n_j`` of every rank); this rank's own rows are multiplied while they travel;
    then each piece's GEMM over the other ranks' rows starts once that piece has arrived (on a
    GPU: the current stream waits for it; the next pieces keep moving on NCCL's stream). NVFP4
    activations are sent as NVFP4: data and scales in one uint8 buffer per piece.

    Every output element is computed as on one process (exact, as `column_parallel_gemm`).

    Args:
        a_local: this rank's rows: bfloat16 (m, ..., K) or an NVFP4Tensor (m, K) whose global
            scale is the same on every rank (`quantize_shared`).
        w_shards: one NVFP4Tensor (N / p, K) or a sequence of them (one gather feeds every
            GEMM, e.g. an MLP's gate and up projections).
        group: the tensor-parallel process group.
        chunks: pieces per rank, 1 <= chunks <= m.
        out_dtype: D's dtype.
        out_features: N (every weight's), when known: checks the group's size.
        check: exchange the arguments' facts first so bad input raises on every rank.

    Returns:
        (p * m, ..., N / p) of out_dtype per weight: one tensor for one weight, else a list.
    """
    rank, size = group_info(group)
    single = isinstance(w_shards, NVFP4Tensor)
    ws = [w_shards] if single else list(w_shards) if isinstance(w_shards, Sequence) else None

    def validate():
        if not ws:
            raise TypeError(f"w_shards must be an NVFP4Tensor or a non-empty sequence of them, "
                            f"got {type(w_shards).__name__}")
        for i, w in enumerate(ws):
            _weight(w, f"w_shards[{i}]")
            nvfp4.plan(a_local, w, out_dtype)
            _full_size("out_features", out_features, w.M, size, "rows (N)")
        _chunks(chunks, _rows(a_local))
        facts = {"K": ws[0].K, "weight rows": tuple(w.M for w in ws),
                 "weight scale format": tuple(_fmt(w) for w in ws),
                 "weight global scale": tuple(w.global_scale for w in ws),
                 "activations": _kind(a_local), "activation shape": tuple(a_local.shape),
                 "activation scale format": _fmt(a_local), "out_dtype": str(out_dtype),
                 "chunks": chunks}
        if isinstance(a_local, NVFP4Tensor):
            facts["activation global scale"] = a_local.global_scale
        return facts

    checked(group, "all_gather_gemm", validate, check, HINTS)
    nv = isinstance(a_local, NVFP4Tensor)
    m = _rows(a_local)
    if nv:
        mid, K = (), a_local.K
        data, sf = a_local.data, a_local.scales_logical()
    else:
        a_local = a_local.contiguous()
        mid, K = tuple(a_local.shape[1:-1]), a_local.shape[-1]
    dev = ws[0].device
    outs = [torch.empty((size, m, *mid, w.M), dtype=out_dtype, device=dev) for w in ws]
    pieces = _chunks(chunks, m)
    sends, recvs, works = [], [], []
    if size > 1:  # issue every piece first: they queue on the communication stream / threads
        for off, n in pieces:
            if nv:  # one buffer per piece: [data (n, K/2) | scales (n, K/16)]
                send = torch.cat([data[off:off + n].reshape(-1), sf[off:off + n].reshape(-1)])
            else:
                send = a_local[off:off + n]
            recv = gather_buffer(send, size)
            works.append(all_gather_tensor(recv, send, group=group, async_op=True))
            sends.append(send)
            recvs.append(recv.view(size, *send.shape))
    for w, out in zip(ws, outs):  # this rank's rows: no communication needed
        out[rank].copy_(nvfp4.gemm(a_local, w, out_dtype))
    for (off, n), recv, work in zip(pieces, recvs, works):
        work.wait()
        if rank == 0:
            theirs = recv[1:]
        elif rank == size - 1:
            theirs = recv[:-1]
        else:
            theirs = torch.cat([recv[:rank], recv[rank + 1:]])
        rows = (size - 1) * n
        if nv:
            d = theirs[:, :n * K // 2].reshape(rows, K // 2)
            s = to_blocked(theirs[:, n * K // 2:].reshape(rows, K // 16))
            part_a = _trusted(a_local, d, s, (rows, K))
        else:
            part_a = theirs.reshape(rows, *mid, K)
        for w, out in zip(ws, outs):
            y = nvfp4.gemm(part_a, w, out_dtype).view(size - 1, n, *mid, w.M)
            # the peers are ranks [0, rank) then (rank, size): two slice copies (no index tensor)
            out[:rank, off:off + n].copy_(y[:rank])
            out[rank + 1:, off:off + n].copy_(y[rank:])
    del sends  # the collectives that read them have completed (waited above)
    outs = [out.reshape(size * m, *mid, w.M) for w, out in zip(ws, outs)]
    return outs[0] if single else outs


# ---------------------------------------------------------------- shared-scale quantize


def quantize_shared(x: torch.Tensor, group=None, *, check_finite: bool | None = None,
                    scale_dtype: str = "ue4m3") -> NVFP4Tensor:
    """NVFP4-quantize this rank's slice `x` of a tensor sharded over `group` with the global
    scale ``quantize`` would give the whole tensor.

    ``amax`` is a max, exact in any order: one all-reduce (MAX) of the ranks' local amax and
    the recipe's ``max(amax, AMAX_FLOOR) / 2688`` (UE5M3: the format's floor and denominator)
    give every rank the whole tensor's global scale bit for bit, and with it (`tk_cute.nvfp4.
    shard`'s argument) the bytes of
    ``shard(quantize(whole), dim, rank, p)`` for a row slice (dim 0) or a K slice (dim 1,
    boundaries on 16-element blocks, i.e. the slice's K % 16 == 0, which quantize requires).

    Args:
        x: this rank's float32 / bfloat16 / float16 slice, (M, K) or (L, M, K), K % 16 == 0.
        group: the process group over which the tensor is sharded.
        check_finite: count NaN/Inf on every rank (exchanged with the amax) and raise on every
            rank if any rank has one. Default: True on CPU, False on CUDA (no host sync: NaN/Inf
            then give unspecified bytes, as `tk_cute.nvfp4.Linear`'s forward, and an invalid
            `x` on one rank raises on that rank only).
        scale_dtype: the block-scale format, "ue4m3" (NVFP4) or "ue5m3" (CPU only: the CUDA
            quantizer does UE4M3).

    Returns:
        An NVFP4Tensor on x's device.

    Raises:
        TypeError, ValueError: x is not a valid quantize input (local; the caller's shapes are
            the same on every rank), or, on every rank, some rank's slice is not finite.
    """
    from tk_cute.nvfp4.format import scale_format
    from tk_cute.nvfp4.quantize import _check_quantize_input

    _, size = group_info(group)
    try:
        _check_quantize_input(x, None, finite=False)  # dtype / shape only: no value read
        fmt = scale_format(scale_dtype)
        if x.is_cuda and fmt.name != "ue4m3":
            raise NotImplementedError(f"quantize_shared: the CUDA quantizer does UE4M3 only, "
                                      f"got scale_dtype={scale_dtype!r}")
        error = None
    except (TypeError, ValueError, NotImplementedError) as e:
        error = e
    if error is not None:  # still take part in the all-reduce, flagging the error to all
        nccl = dist.get_backend(group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
        stats = torch.tensor([0.0, 0.0, 1.0], device=device)
        check = True
    else:
        x = x.detach()
        check = (not x.is_cuda) if check_finite is None else bool(check_finite)
        amax = x.abs().amax().to(torch.float32)  # exact: a max of values of x's own dtype
        bad = (~torch.isfinite(x)).sum().to(torch.float32) if check else torch.zeros_like(amax)
        stats = torch.stack([amax, bad, torch.zeros_like(amax)])
    if size > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
    if error is not None:
        raise error
    if check and bool(stats[2] > 0):
        raise ValueError("quantize_shared: another rank's input is not a valid quantize input "
                         "(its own error names it)")
    if check and bool(stats[1] > 0):
        raise ValueError(f"quantize_shared: the sharded input holds NaN/Inf (up to "
                         f"{int(stats[1])} values on one rank): there is no global scale for it")
    f32 = lambda v: torch.full((), v, dtype=torch.float32, device=x.device)  # no host copy
    # The recipe's step 2, the same float32 operations as quantize_reference (a division).
    g = torch.div(torch.maximum(stats[0], f32(fmt.amax_floor)), f32(fmt.global_denom))
    if x.is_cuda:
        from tk_cute.nvfp4.launch import quantize as quantize_cuda

        # The launch takes the device scale as is: quantize's host range check of a given
        # scale would sync, and g is in range by construction (>= 2^-116, finite for finite x).
        return quantize_cuda(x, g, check_finite=check)
    if fmt.name == "ue4m3":
        return nvfp4.quantize(x, global_scale=g)
    return nvfp4.quantize(x, global_scale=g, scale_dtype=fmt.name)
