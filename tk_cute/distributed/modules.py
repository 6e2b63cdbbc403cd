"""Tensor-parallel NVFP4 modules: `ColumnParallelLinear`, `RowParallelLinear` and the MLP block
built of them, `TensorParallelMLP` (Megatron-LM's layout: gate and up column-parallel, down
row-parallel, so the intermediate activations never cross ranks).

Both linears are `tk_cute.nvfp4.Linear`s holding THIS rank's weight shard in the same buffers
(``weight_data``, ``weight_scales``, ``weight_global_scale``, ``bias``): a rank's state dict is
its shard, plain tensors, loadable with ``weights_only=True`` into a module built for the same
group size (another size has other buffer shapes: torch's load_state_dict raises). Build them
from a full layer on every rank (`from_linear` quantizes the full weight, identically on every
rank, then keeps this rank's `tk_cute.nvfp4.shard`; `from_nvfp4` shards an NVFP4Tensor) or from
a shard (`from_shard`, given the full layer's out_features / in_features: a shard cut for
another group size raises). Every rank must build the same layers in the same order.

Modes (construction choices, not in the state dict):

- plain tensor parallelism (default): the input is replicated; the column layer's output is
  this rank's N slice (``gather_output=True`` all-gathers it), the row layer takes this rank's
  K slice and all-reduces (``reduce="all_reduce"``: output replicated).
- sequence parallelism (``sequence_parallel=True`` on the column layer, ``reduce=
  "reduce_scatter"`` on the row layer): the input's first dim is sharded across ranks; the
  column layer all-gathers it pipelined with its GEMMs (`all_gather_gemm`, ``chunks``), the row
  layer's reduce-scatter is pipelined with its GEMM (`gemm_reduce_scatter`): the output's first
  dim is sharded again. `TensorParallelMLP` gathers once for gate and up.

Activations: "bf16" (W4A16, bfloat16 in and out) or "nvfp4" (W4A4, any float dtype in, the
input's dtype out). W4A4 quantizes per call with the global scale of the WHOLE activation
tensor (`quantize_shared`: one all-reduce of the amax) where the input is sharded, so the
quantized shards are byte for byte those of the single-process model; a row layer may use
``activation_scale="local"`` (each rank's own amax: no collective, other bytes, same accuracy).
Replicated inputs are quantized on each rank alike, with no communication.

Numerics against the single-process model (`tk_cute.nvfp4.quantize_` of the same model): the
column layers' outputs are the same elements (bitwise on the CPU reference); the row layer's
sum is re-associated across ranks in fp32 by default (`tk_cute.distributed.numerics`).

Checks: each module exchanges its shard's facts with the group once, on its first forward
(and again after a ``load_state_dict``): ranks whose shards disagree on shapes or global scale
raise on every rank. Forwards run eagerly (the collectives are not traced by torch.compile here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tk_cute import nvfp4
from tk_cute.nvfp4.modules import _check_activations, _no_grad_input
from tk_cute.nvfp4.shard import shard, split_size

from .checks import agree, group_info, local
from .gemm import (
    HINTS,
    REDUCES,
    _full_size,
    _reduce_dtype,
    _rows,
    all_gather_gemm,
    gather_last_dim,
    gemm_reduce_scatter,
    quantize_shared,
    row_parallel_gemm,
)

ACTIVATION_SCALES = ("global", "local")


def _split(what: str, shape, dim: int, size: int) -> int:
    try:
        return split_size(shape, dim, size)
    except ValueError as e:
        raise ValueError(f"{what} cannot be split over the group's {size} ranks: {e}") from None


def _positive_chunks(chunks) -> None:
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a positive int, got {chunks!r}")


class _Parallel(nvfp4.Linear):
    """What both parallel linears share: the group, the shard's facts, the first-forward check."""

    def _setup(self, group, rank: int, size: int) -> None:
        self.group, self.tp_rank, self.tp_size = group, rank, size
        self._checked = False

    def _out_dtype(self, x) -> torch.dtype:
        return x.dtype if self.activations == "nvfp4" else torch.bfloat16

    def _check_input(self, x) -> None:
        _no_grad_input(x, f"tk_cute.distributed.{type(self).__name__}")
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise ValueError(f"{type(self).__name__} takes a (rows, ..., K) tensor, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input's last dim is {x.shape[-1]}, this rank's "
                             f"{type(self).__name__} takes {self.in_features}")
        if self.activations == "bf16" and x.dtype != torch.bfloat16:
            raise TypeError(f"W4A16 {type(self).__name__} takes bfloat16 activations, got "
                            f"{x.dtype} (or use activations='nvfp4')")

    def facts(self) -> dict:
        """What every rank's shard must agree on (`check`)."""
        return {"layer": type(self).__name__, "group size": self.tp_size,
                "full shape (N, K)": self.full_shape, "weight rows": self.out_features,
                "K": self.in_features, "weight global scale": float(self.weight_global_scale),
                "bias": self.bias is not None, "activations": self.activations}

    def check(self) -> None:
        """Exchange the shard's facts with the group; on disagreement every rank raises."""
        def validate():
            _, size = group_info(self.group)
            if size != self.tp_size:
                raise ValueError(f"the module was built for {self.tp_size} ranks, its group now "
                                 f"has {size}")
            return self.facts()

        facts, error = local(validate)
        agree(self.group, f"tk_cute.distributed.{type(self).__name__}", facts, error, HINTS)
        self._checked = True

    def _first_forward(self) -> None:
        if not self._checked and not torch.compiler.is_compiling():
            self.check()

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._checked = False  # new shards: check them on the next forward

    @classmethod
    def _full_shape(cls, w_shard: nvfp4.NVFP4Tensor, given, size: int) -> tuple:
        """The full layer's (N, K) of `from_shard`: the shard's, with `given` (the full size
        along the cut, `SHARD_DIM`) in place of the shard's own once `size` shards of this one
        make it (nothing in a shard tells the group size it was cut for)."""
        dim = cls.SHARD_DIM
        name = ("out_features", "in_features")[dim]
        if not isinstance(w_shard, nvfp4.NVFP4Tensor) or w_shard.ndim != 2:
            raise TypeError(f"{cls.__name__}.from_shard takes a 2-D NVFP4Tensor, got a "
                            f"{type(w_shard).__name__} of shape "
                            f"{tuple(getattr(w_shard, 'shape', ()))}")
        if isinstance(given, bool) or not isinstance(given, int):
            raise TypeError(f"{cls.__name__}.from_shard needs {name}=, the full layer's size "
                            f"(an int), got {given!r}")
        _full_size(name, given, w_shard.shape[dim], size, ("rows (N)", "K elements")[dim])
        full = list(w_shard.shape)
        full[dim] = given
        return tuple(full)

    @classmethod
    def _wrap(cls, w_shard: nvfp4.NVFP4Tensor, bias: torch.Tensor | None, full: tuple,
              **opts) -> _Parallel:
        N, K = full
        fmt = getattr(w_shard, "scale_format", "ue4m3")
        if fmt != "ue4m3":  # Linear's forward carries the parts through UE4M3-only custom ops
            raise NotImplementedError(f"{cls.__name__}: the modules take UE4M3 NVFP4 weights "
                                      f"only, got {fmt} scales (the functional "
                                      f"tk_cute.distributed GEMMs take both)")
        dtype = bias.dtype if bias is not None else torch.bfloat16
        mod = cls(K, N, bias is not None, device="meta", dtype=dtype, **opts)
        if tuple(w_shard.shape) != (mod.out_features, mod.in_features):
            raise ValueError(f"{cls.__name__}: a shard of a ({N}, {K}) weight over "
                             f"{mod.tp_size} ranks is ({mod.out_features}, {mod.in_features}), "
                             f"got {tuple(w_shard.shape)}")
        mod.weight_data, mod.weight_scales = w_shard.data, w_shard.scales
        mod.weight_global_scale = w_shard.global_scale
        if bias is not None:
            mod.bias = bias.detach().to(w_shard.device)
        return mod

    @classmethod
    def from_nvfp4(cls, weight: nvfp4.NVFP4Tensor, bias: torch.Tensor | None = None, group=None,
                   **opts) -> _Parallel:
        """This rank's part of the full (N, K) NVFP4 `weight`, cut along the class's
        `SHARD_DIM` (columns: N rows; rows: K columns), and of the (N,) bias."""
        if not isinstance(weight, nvfp4.NVFP4Tensor) or weight.ndim != 2:
            raise TypeError(f"{cls.__name__}.from_nvfp4 takes a 2-D NVFP4Tensor, got "
                            f"{getattr(weight, 'shape', type(weight).__name__)}")
        rank, size = group_info(group)
        dim = cls.SHARD_DIM
        name = ("out_features", "in_features")[dim]
        n = _split(f"{cls.__name__}: {name}={weight.shape[dim]}", weight.shape, dim, size)
        b = None if bias is None else cls._bias_part(bias, rank, n).clone()
        return cls._wrap(shard(weight, dim, rank, size), b, tuple(weight.shape), group=group,
                         **opts)

    @classmethod
    def from_linear(cls, linear: nn.Module, group=None, **opts) -> _Parallel:
        """This rank's part of a full layer: an ``nn.Linear`` (its weight quantized whole, the
        same bytes on every rank, then sharded) or a `tk_cute.nvfp4.Linear` (sharded as is;
        its activation mode is kept unless `opts` gives one)."""
        if isinstance(linear, nvfp4.Linear):
            opts.setdefault("activations", linear.activations)
            return cls.from_nvfp4(linear.weight, linear.bias, group, **opts)
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{cls.__name__}.from_linear takes an nn.Linear or a "
                            f"tk_cute.nvfp4.Linear, got {type(linear).__name__}")
        bias = None if linear.bias is None else linear.bias.detach()
        return cls.from_nvfp4(nvfp4.quantize(linear.weight.detach()), bias, group, **opts)


class ColumnParallelLinear(_Parallel):
    """``y[..., this rank's N slice] = x @ W_shard^T (+ bias slice)`` (module docstring).

    Args:
        in_features: K (a multiple of 16).
        out_features: the FULL N; each rank holds N / p rows (N % p == 0).
        bias: whether the layer has a bias (each rank holds its N / p slice).
        group: the tensor-parallel process group (default: the default group).
        gather_output: all-gather the output along N (every rank gets (..., N)).
        sequence_parallel: the input's first dim is sharded: all-gather it, pipelined with the
            GEMMs in `chunks` pieces per rank (`all_gather_gemm`). Not with gather_output.
        chunks: pieces per rank of the sequence-parallel gather (at most: an input with fewer
            rows per rank takes one piece per row).
        activations: "bf16" (W4A16) or "nvfp4" (W4A4).
        device, dtype: as `tk_cute.nvfp4.Linear` (dtype: the bias's).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, group=None,
                 gather_output: bool = False, sequence_parallel: bool = False, chunks: int = 1,
                 activations: str = "bf16", device=None, dtype: torch.dtype = torch.bfloat16):
        rank, size = group_info(group)
        _positive_chunks(chunks)
        n = _split(f"ColumnParallelLinear: out_features={out_features}",
                   (out_features, in_features), 0, size)
        if gather_output and sequence_parallel:
            raise ValueError("ColumnParallelLinear: gather_output and sequence_parallel are "
                             "exclusive (the sequence-parallel output is (rows, N / p))")
        super().__init__(in_features, n, bias, activations=activations, device=device,
                         dtype=dtype)
        self._setup(group, rank, size)
        self.full_shape = (out_features, in_features)
        self.gather_output, self.sequence_parallel = bool(gather_output), bool(sequence_parallel)
        self.chunks = chunks

    SHARD_DIM = 0  # W's rows (N)

    @staticmethod
    def _bias_part(bias: torch.Tensor, rank: int, n: int) -> torch.Tensor:
        return bias[rank * n:(rank + 1) * n]  # this rank's N slice

    @classmethod
    def from_shard(cls, w_shard: nvfp4.NVFP4Tensor, bias_shard: torch.Tensor | None = None,
                   group=None, *, out_features: int, **opts) -> ColumnParallelLinear:
        """A layer holding an already cut (N / p, K) shard (and its (N / p,) bias slice) of a
        layer of `out_features` = N rows: a shard cut for another group size raises."""
        _, size = group_info(group)
        return cls._wrap(w_shard, bias_shard, cls._full_shape(w_shard, out_features, size),
                         group=group, **opts)

    def operand(self, x: torch.Tensor):
        """What `forward` multiplies (and, sequence-parallel, gathers): x itself (W4A16), or x
        quantized, with the whole tensor's global scale when x is sharded (W4A4)."""
        if self.activations == "bf16":
            return x
        rows = x.reshape(-1, self.in_features)
        if self.sequence_parallel:
            return quantize_shared(rows, self.group, check_finite=self.check_finite or None)
        return nvfp4.quantize(rows, check_finite=self.check_finite)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._first_forward()
        if not self.sequence_parallel:
            y = super().forward(x)  # this rank's slice, through the custom ops
            return gather_last_dim(y, self.group) if self.gather_output else y
        return gathered_forward([self], x)[0]

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, tp {self.tp_rank}/{self.tp_size} of out_features="
                f"{self.full_shape[0]}, gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}")


def gathered_forward(layers: list[ColumnParallelLinear], x: torch.Tensor) -> list[torch.Tensor]:
    """Sequence-parallel column layers sharing one input: ONE pipelined all-gather of x feeds
    every layer's GEMM (`all_gather_gemm`); returns each layer's (p * rows, ..., N / p)."""
    first = layers[0]
    for layer in layers:
        if not layer.sequence_parallel or (layer.group, layer.activations, layer.chunks) != (
                first.group, first.activations, first.chunks):
            raise ValueError("gathered_forward: the layers must be sequence-parallel with one "
                             "group, activation mode and chunk count")
        layer._first_forward()
        layer._check_input(x)
    a = first.operand(x)
    chunks = min(first.chunks, _rows(a))  # inputs vary in M: at most one piece per row
    ys = all_gather_gemm(a, [layer.weight for layer in layers], first.group, chunks=chunks,
                         out_dtype=first._out_dtype(x), check=False)
    shape = (first.tp_size * x.shape[0], *x.shape[1:-1])
    out = []
    for y, layer in zip(ys, layers):
        y = y.reshape(*shape, layer.out_features)
        out.append(y if layer.bias is None else y + layer.bias)
    return out


class RowParallelLinear(_Parallel):
    """``y = sum over ranks of x_shard @ W_shard^T (+ bias)`` (module docstring).

    Args:
        in_features: the FULL K; each rank holds K / p columns (K / p % 16 == 0: the shards
            end on 16-element scale blocks).
        out_features: N.
        bias: whether the layer has a bias (the full (N,) bias on every rank, added once
            after the reduction).
        group: the tensor-parallel process group (default: the default group).
        reduce: "all_reduce" (output replicated) or "reduce_scatter" (sequence parallel: the
            output's first dim sharded, pipelined with the GEMM in `chunks` pieces).
        reduce_dtype: torch.float32 (default) or torch.bfloat16 for the partial sums.
        chunks: pieces per rank of the reduce-scatter (at most, as the column layer's).
        activations: "bf16" (W4A16) or "nvfp4" (W4A4).
        activation_scale: W4A4: "global" (the whole intermediate tensor's global scale, one
            all-reduce: bit-identical shards to the single-process model) or "local".
        device, dtype: as `tk_cute.nvfp4.Linear` (dtype: the bias's).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, group=None,
                 reduce: str = "all_reduce", reduce_dtype: torch.dtype = torch.float32,
                 chunks: int = 1, activations: str = "bf16", activation_scale: str = "global",
                 device=None, dtype: torch.dtype = torch.bfloat16):
        rank, size = group_info(group)
        _positive_chunks(chunks)
        k = _split(f"RowParallelLinear: in_features={in_features}", (out_features, in_features),
                   1, size)
        if reduce not in REDUCES:
            raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
        if activation_scale not in ACTIVATION_SCALES:
            raise ValueError(f"activation_scale must be one of {ACTIVATION_SCALES}, got "
                             f"{activation_scale!r}")
        _check_activations(activations)
        # The bias is the full (N,) vector on every rank (Linear sizes it by out_features).
        super().__init__(k, out_features, bias, activations=activations, device=device,
                         dtype=dtype)
        self._setup(group, rank, size)
        self.full_shape = (out_features, in_features)
        self.reduce, self.reduce_dtype = reduce, _reduce_dtype(reduce_dtype)
        self.chunks, self.activation_scale = chunks, activation_scale

    SHARD_DIM = 1  # W's columns (K)

    @staticmethod
    def _bias_part(bias: torch.Tensor, rank: int, n: int) -> torch.Tensor:
        return bias  # added once, after the reduction: the full (N,) vector

    @classmethod
    def from_shard(cls, w_shard: nvfp4.NVFP4Tensor, bias: torch.Tensor | None = None,
                   group=None, *, in_features: int, **opts) -> RowParallelLinear:
        """A layer holding an already cut (N, K / p) shard of a layer of `in_features` = K
        columns, and the full (N,) bias: a shard cut for another group size raises."""
        _, size = group_info(group)
        return cls._wrap(w_shard, bias, cls._full_shape(w_shard, in_features, size),
                         group=group, **opts)

    def operand(self, x: torch.Tensor):
        """x (W4A16), or x quantized (W4A4) with the whole tensor's or this rank's scale."""
        if self.activations == "bf16":
            return x
        rows = x.reshape(-1, self.in_features)
        if self.activation_scale == "global":
            return quantize_shared(rows, self.group, check_finite=self.check_finite or None)
        return nvfp4.quantize(rows, check_finite=self.check_finite)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._first_forward()
        self._check_input(x)
        size = self.tp_size
        if self.reduce == "reduce_scatter" and x.shape[0] % size:
            raise ValueError(f"RowParallelLinear(reduce='reduce_scatter') splits the output's "
                             f"first dim over {size} ranks: x.shape[0] = {x.shape[0]} is not a "
                             f"multiple")
        a = self.operand(x)
        dtype = self._out_dtype(x)
        if self.reduce == "all_reduce":
            y = row_parallel_gemm(a, self.weight, self.group, "all_reduce", self.reduce_dtype,
                                  out_dtype=dtype, check=False)
            y = y.reshape(*x.shape[:-1], self.out_features)
        else:
            chunks = min(self.chunks, _rows(a) // size)  # at most one piece per row
            y = gemm_reduce_scatter(a, self.weight, self.group, chunks=chunks,
                                    reduce_dtype=self.reduce_dtype, out_dtype=dtype, check=False)
            y = y.reshape(x.shape[0] // size, *x.shape[1:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, tp {self.tp_rank}/{self.tp_size} of in_features="
                f"{self.full_shape[1]}, reduce={self.reduce!r}, reduce_dtype={self.reduce_dtype}")


class TensorParallelMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` over p ranks: gate and up column-parallel (each rank
    I / p intermediate features), down row-parallel (module docstring).

    Plain (``sequence_parallel=False``): x (..., H) replicated in, y (..., H) replicated out,
    one all-reduce. Sequence parallel: x's first dim sharded in and out; one pipelined
    all-gather of x for gate and up, one pipelined reduce-scatter after down.

    Build with `from_mlp` (from a model with ``gate``, ``up``, ``down`` linears, e.g.
    `tk_cute.bench.model.MLP`, bf16 or already `tk_cute.nvfp4.quantize_`-d).
    """

    def __init__(self, gate: ColumnParallelLinear, up: ColumnParallelLinear,
                 down: RowParallelLinear):
        super().__init__()
        sp = gate.sequence_parallel
        if up.sequence_parallel != sp or (down.reduce == "reduce_scatter") != sp:
            raise ValueError("TensorParallelMLP: gate and up must both be sequence-parallel "
                             "exactly when down reduce-scatters")
        self.gate, self.up, self.down = gate, up, down
        self.sequence_parallel = sp

    @classmethod
    def from_mlp(cls, mlp: nn.Module, group=None, *, activations: str | None = None,
                 sequence_parallel: bool = False, chunks: int = 1,
                 reduce_dtype: torch.dtype = torch.float32,
                 activation_scale: str = "global") -> TensorParallelMLP:
        """This rank's part of `mlp`'s ``gate``, ``up`` and ``down`` (nn.Linear or
        `tk_cute.nvfp4.Linear`; `activations` default: the layers' mode, else "bf16")."""
        def mode(layer):
            if activations is not None:
                return {"activations": activations}
            return {"activations": getattr(layer, "activations", "bf16")}

        col = {"sequence_parallel": sequence_parallel, "chunks": chunks}
        gate = ColumnParallelLinear.from_linear(mlp.gate, group, **col, **mode(mlp.gate))
        up = ColumnParallelLinear.from_linear(mlp.up, group, **col, **mode(mlp.up))
        down = RowParallelLinear.from_linear(
            mlp.down, group, reduce="reduce_scatter" if sequence_parallel else "all_reduce",
            reduce_dtype=reduce_dtype, chunks=chunks, activation_scale=activation_scale,
            **mode(mlp.down))
        return cls(gate, up, down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            g, u = gathered_forward([self.gate, self.up], x)
        else:
            g, u = self.gate(x), self.up(x)
        return self.down(F.silu(g) * u)
