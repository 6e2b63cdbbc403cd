"""Shards of an NVFP4Tensor for tensor parallelism: `shard` and its inverse `unshard`.

A tensor-parallel GEMM gives each of ``count`` ranks one slice of the weights: a block of rows
(N, ``dim=0`` of an (N, K) weight: column parallelism) or a block of K (``dim=1``: row
parallelism). `shard` cuts an NVFP4Tensor so that each shard is, byte for byte, what quantizing
the matching slice of the original values with the SAME global scale gives::

    shard(quantize(x, global_scale=g), dim, i, count)
        == quantize(x[slice i of dim], global_scale=g)     # data, scales and global scale

Why it holds, and where. With a given global scale the recipe (`tk_cute.nvfp4.quantize`, steps
4-6) encodes every 16-element K block of every row from that block's values and the global
scale alone. So:

* rows (N, and L for a batched tensor): any row split works (granularity 1 row). The shard's
  scales are re-blocked: a 128-row band of the shard mixes rows of two bands of the original
  whenever a boundary is not a multiple of 128, and its last band is padded again.
* K: the boundaries must fall on 16-element blocks, ``(K / count) % 16 == 0``; inside a block
  the values of the slice would get another block amax. The shard's scale columns are
  re-blocked and re-padded (to a multiple of 4 columns per 512-byte atom).

Shards are equal (``size % count == 0``); other counts raise ValueError naming the constraint.
Every shard keeps the original's global scale (and its block-scale format, UE4M3 or UE5M3):
quantizing a slice with its OWN amax would give other bytes (and in a row-parallel GEMM, partial
sums on different scales). A shard owns
its memory (a view would keep the whole tensor alive on every rank). Padding bytes of the
blocked scales are written as zero, as `quantize` writes them; an original with nonzero
padding still shards to the bytes `quantize` gives for the slice.

Kernel constraints are not format constraints: a shard the format allows may still be a shape
a GEMM kernel of some GPU does not take (e.g. W4A16 on Blackwell / Rubin,
docs/distributed.md); `tk_cute.nvfp4.gemm` says so when called.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tk_cute.layouts.nvfp4_scales import to_blocked

from .tensor import SF_VEC, NVFP4Tensor, codes_storage


def _dim(q: NVFP4Tensor, dim) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -q.ndim <= dim < q.ndim:
        names = "0 (rows, N) or 1 (K)" if q.ndim == 2 else "0 (L), 1 (rows) or 2 (K)"
        raise ValueError(f"shard dim must be {names} (or negative) for a {q.ndim}-D NVFP4Tensor "
                         f"of shape {tuple(q.shape)}, got {dim!r}")
    return dim % q.ndim


def split_size(shape: Sequence[int], dim: int, count: int) -> int:
    """The size of each of `count` equal shards of an NVFP4 `shape` along `dim` (normalized,
    0 <= dim < len(shape)), checking the format's granularity.

    Raises:
        ValueError: count is not a positive int, or the shards would not be equal, or (dim K)
            a shard boundary would cut a 16-element scale block.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"shard count must be a positive int, got {count!r}")
    size = shape[dim]
    if dim == len(shape) - 1:
        if size % (SF_VEC * count):
            raise ValueError(
                f"K shards must start and end on 16-element scale blocks: K / count % 16 == 0 "
                f"is needed, got K={size}, count={count} (K / count = {size / count:g}); "
                f"counts that work here: {_counts(size // SF_VEC)}")
        return size // count
    what = "rows (N)" if dim == len(shape) - 2 else "batches (L)"
    if size % count:
        raise ValueError(
            f"{what} shards must be equal: {size} % count == 0 is needed, got count={count} "
            f"(any split of whole {what.split()[0]} keeps the blocks: counts that work here: "
            f"{_counts(size)})")
    return size // count


def _counts(n: int) -> str:
    divisors = [c for c in range(1, min(n, 64) + 1) if n % c == 0]
    return ", ".join(map(str, divisors)) + (", ..." if n > 64 else "")


def shard(q: NVFP4Tensor, dim: int, index: int, count: int) -> NVFP4Tensor:
    """The `index`-th of `count` equal shards of `q` along `dim` (module docstring).

    Args:
        q: a 2-D (N, K) or 3-D (L, N, K) NVFP4Tensor.
        dim: 0 (rows, N: column parallelism) or 1 (K: row parallelism) of a 2-D tensor;
            for a 3-D one 0 (L), 1 (rows) or 2 (K); negative dims count from the end.
        index: which shard, 0 <= index < count (a rank in the tensor-parallel group).
        count: how many shards (the group's size).

    Returns:
        An NVFP4Tensor on q's device with its own data and re-blocked scales and a copy of q's
        global scale; its shape is q's with ``shape[dim] // count``.

    Raises:
        TypeError: q is not an NVFP4Tensor.
        ValueError: dim, index or count out of range, or a count that does not divide the
            dimension at the format's granularity (`split_size`).
    """
    if not isinstance(q, NVFP4Tensor):
        raise TypeError(f"shard takes an NVFP4Tensor, got {type(q).__name__}")
    d = _dim(q, dim)
    step = split_size(q.shape, d, count)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"shard index must be an int in [0, {count}), got {index!r}")
    lo, hi = index * step, (index + 1) * step
    sf = q.scales_logical()  # (..., M, K // 16), padding dropped
    cut = [slice(None)] * q.ndim
    if d == q.ndim - 1:
        data = q.data[..., lo // 2: hi // 2]
        sf = sf[..., lo // SF_VEC: hi // SF_VEC]
    else:
        cut[d] = slice(lo, hi)
        data, sf = q.data[tuple(cut)], sf[tuple(cut)]
    shape = list(q.shape)
    shape[d] = step
    own = codes_storage(shape, data.device).copy_(data)  # one copy, in the shard's row pitch
    return _like(q, own, to_blocked(sf), q.global_scale.clone(), shape)


def _like(q: NVFP4Tensor, data, scales, global_scale, shape) -> NVFP4Tensor:
    # Valid by construction (bytes of a valid tensor, zero padding): no value checks, which
    # would read a CUDA tensor back. The scale bytes keep their format.
    fmt = getattr(q, "scale_format", "ue4m3")
    if fmt == "ue4m3":
        return NVFP4Tensor.trusted(data, scales, global_scale, shape)
    return NVFP4Tensor.trusted(data, scales, global_scale, shape, fmt)


def unshard(shards: Sequence[NVFP4Tensor], dim: int) -> NVFP4Tensor:
    """Gather shards into one NVFP4Tensor along `dim` (the inverse of `shard`).

    ``unshard([shard(q, dim, i, n) for i in range(n)], dim)`` has q's bytes (with zero scale
    padding, as `quantize` writes it). Shards may differ in size along `dim` (rows: any count;
    K: multiples of 16, which every NVFP4Tensor's K is), and must agree everywhere else.

    Args:
        shards: one or more NVFP4Tensors of one rank (2-D or 3-D), in order.
        dim: the dimension they were cut along (as in `shard`).

    Returns:
        A new NVFP4Tensor on the shards' device.

    Raises:
        TypeError: shards is empty or holds something other than NVFP4Tensors.
        ValueError: the shards differ in rank, device, scale format, global scale or another
            dimension.
    """
    shards = list(shards)
    if not shards or not all(isinstance(s, NVFP4Tensor) for s in shards):
        raise TypeError(f"unshard takes a non-empty sequence of NVFP4Tensors, got "
                        f"{[type(s).__name__ for s in shards]}")
    first = shards[0]
    d = _dim(first, dim)
    for i, s in enumerate(shards[1:], 1):
        if s.ndim != first.ndim or s.device != first.device:
            raise ValueError(f"unshard: shard {i} is {s.ndim}-D on {s.device}, shard 0 is "
                             f"{first.ndim}-D on {first.device}")
        other = [n for j, n in enumerate(s.shape) if j != d]
        if other != [n for j, n in enumerate(first.shape) if j != d]:
            raise ValueError(f"unshard along dim {d}: shard {i} has shape {tuple(s.shape)}, "
                             f"shard 0 {tuple(first.shape)}: every other dimension must match")
        fmt, fmt0 = getattr(s, "scale_format", "ue4m3"), getattr(first, "scale_format", "ue4m3")
        if fmt != fmt0:
            raise ValueError(f"unshard: shard {i} has {fmt} scales, shard 0 {fmt0}")
        if not torch.equal(s.global_scale, first.global_scale):
            raise ValueError(
                f"unshard: shards of one tensor share its global scale, but shard {i} has "
                f"{float(s.global_scale)!r} and shard 0 {float(first.global_scale)!r} (slices "
                f"quantized with their own amax: quantize them with one global_scale=...)")
    data_dim = -1 if d == first.ndim - 1 else d  # K: whole bytes, as K % 16 == 0 per shard
    data = torch.cat([s.data for s in shards], dim=data_dim)
    sf = torch.cat([s.scales_logical() for s in shards], dim=d)
    shape = list(first.shape)
    shape[d] = sum(s.shape[d] for s in shards)
    return _like(first, data, to_blocked(sf), first.global_scale.clone(), shape)
