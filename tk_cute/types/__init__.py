"""TK's types on CuTe: `gl`/`coord` (global), `st`/`sv` (shared), `rt`/`rv` (register),
`semaphore` (mbarrier)."""

from tk_cute.types.gl import coord, gl
from tk_cute.types.rt import rt, rv
from tk_cute.types.semaphore import semaphore
from tk_cute.types.st import Shared, st, sv

__all__ = ["coord", "gl", "rt", "rv", "semaphore", "Shared", "st", "sv"]
