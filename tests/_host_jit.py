"""A host-side `@cute.jit` that prints `schedule.stream_k_ctas` on DSL integers (a module: the
DSL compiles only functions whose source it can read)."""

import cutlass
import cutlass.cute as cute

from tk_cute.ops import schedule


@cute.jit
def print_stream_k_ctas(tiles: cutlass.Int32, k_steps: cutlass.Int32, limit: cutlass.Constexpr,
                        max_split: cutlass.Constexpr):
    cute.printf("ctas {}", schedule.stream_k_ctas(tiles, k_steps, limit, max_split))
