"""Tensor-parallel NVFP4 GEMMs across GPUs (or CPU processes) on torch.distributed.

NCCL on GPUs, gloo on CPUs; NVLink multicast off in every process this package starts
(`launch.MULTICAST_OFF`). Design, numerics and what has been run: docs/distributed.md.

- GEMMs (`gemm`): `column_parallel_gemm` (weights cut along N), `row_parallel_gemm` (cut along
  K, partial sums reduced in fp32 or bf16), the overlapped sequence-parallel forms
  `all_gather_gemm` (chunked all-gather of the activations pipelined with the GEMMs; NVFP4
  activations travel as NVFP4) and `gemm_reduce_scatter`, and `quantize_shared` (a shard's
  quantization with the whole tensor's global scale).
- Modules (`modules`): `ColumnParallelLinear`, `RowParallelLinear` (`tk_cute.nvfp4.Linear`s
  holding weight shards) and `TensorParallelMLP`.
- Numerics (`numerics`): element-wise bounds of the re-associated row-parallel sums.
- Processes (`launch`): `init_process_group` (multicast off, bounded timeout) and `spawn` (N
  processes with bounded waits, for tests, examples and the bench).
- Checks (`checks`): bad input raises on every rank, never on one while the others wait.

The shards themselves come from `tk_cute.nvfp4.shard` / `unshard`.
"""

from .checks import agree, group_info
from .gemm import (
    all_gather_gemm,
    column_parallel_gemm,
    gather_last_dim,
    gemm_reduce_scatter,
    quantize_shared,
    row_parallel_gemm,
)
from .launch import MULTICAST_OFF, SpawnError, disable_multicast, init_process_group, spawn
from .modules import ColumnParallelLinear, RowParallelLinear, TensorParallelMLP
from .numerics import assert_row_parallel_close, explain_mismatches, row_parallel_bound

__all__ = [
    "MULTICAST_OFF",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "SpawnError",
    "TensorParallelMLP",
    "agree",
    "all_gather_gemm",
    "assert_row_parallel_close",
    "column_parallel_gemm",
    "disable_multicast",
    "explain_mismatches",
    "gather_last_dim",
    "gemm_reduce_scatter",
    "group_info",
    "init_process_group",
    "quantize_shared",
    "row_parallel_bound",
    "row_parallel_gemm",
    "spawn",
]
