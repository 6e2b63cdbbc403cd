"""TK's types on CuTe: `gl`/`coord` (global), `st`/`st_mma`/`sv` (shared; `st_mma`: a tcgen05
operand tile), `rt`/`rv` (register), `semaphore` (mbarrier) and `stage_ring` (full/empty
barrier pairs), `tt` (tensor memory, `tk_cute.types.tt`)."""

from tk_cute.types.gl import coord, gl
from tk_cute.types.rt import rt, rv
from tk_cute.types.semaphore import semaphore, stage_ring
from tk_cute.types.st import Shared, st, st_mma, sv

__all__ = ["coord", "gl", "rt", "rv", "semaphore", "stage_ring", "Shared", "st", "st_mma", "sv"]
