# SPDX-License-Identifier: MIT
"""Inline PTX: the one helper every inline-PTX op of tk_cute goes through (`asm`), and `unpack`
for ops that return several registers (an LLVM struct)."""

from __future__ import annotations

from cutlass._mlir.dialects import llvm


def asm(ret, args, text, constraints, loc=None, ip=None, side_effects=False):
    """Inline PTX `text` returning `ret` (an LLVM type, a struct of several, or None) from DSL
    values `args`; `side_effects` keeps it in place and alive (loads, stores, barriers)."""
    return llvm.inline_asm(
        ret,
        [a.ir_value(loc=loc, ip=ip) for a in args],
        text,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def unpack(res, ty, n, cls, loc=None, ip=None) -> list:
    """The `n` fields (LLVM type `ty`) of the struct `res` as DSL values of class `cls`."""
    return [cls(llvm.extractvalue(ty, res, [i], loc=loc, ip=ip)) for i in range(n)]
