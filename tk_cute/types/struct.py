"""`DeviceStruct`: a plain Python object that can be a kernel argument.

The CuTe DSL passes an argument to a `@cute.kernel` by flattening it to MLIR values and
rebuilding it inside the kernel (`__extract_mlir_values__` / `__new_from_mlir_values__`, the
protocol `cutlass.pipeline` states use),
with per-value attributes (`__extract_mlir_attributes__`). A subclass names its device fields in
`_fields`; every other attribute is trace-time (static) data and travels as is. This is what
lets a kernel take TK-style `gl` objects instead of a dozen loose atoms and tensors.
"""

from __future__ import annotations

import copy
import dataclasses

import cutlass


class DeviceStruct:
    _fields: tuple[str, ...] = ()

    def __extract_mlir_values__(self):
        values, counts = [], []
        for name in self._fields:
            v = cutlass.extract_mlir_values(getattr(self, name))
            counts.append(len(v))
            values += v
        self._value_counts = counts
        return values

    def __extract_mlir_attributes__(self):
        # Per-argument attributes must travel too: a TMA atom is marked grid-constant
        # (passed by value) this way, and its lowering fails without it.
        from cutlass.base_dsl.utils.mlir_value_tree import extract_mlir_attributes

        return sum((extract_mlir_attributes(getattr(self, n)) for n in self._fields), [])

    def __new_from_mlir_values__(self, values):
        out = copy.copy(self)
        i = 0
        for name, n in zip(self._fields, self._value_counts):
            setattr(out, name, cutlass.new_from_mlir_values(getattr(self, name), values[i : i + n]))
            i += n
        return out

    def __repr__(self):  # kernel symbol names are derived from argument reprs: keep them stable
        return type(self).__name__


def config_repr(cfg) -> str:
    """The dataclass repr of a kernel Config, without the fields marked
    ``metadata={"quiet": True}`` while they hold their defaults. The DSL derives a kernel's
    symbol from the reprs of its Constexpr arguments: a field added later this way leaves the
    existing configs' kernel names, and so their PTX, as they were. Use as
    ``__repr__ = config_repr`` in the (frozen) dataclass body."""
    parts = [f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg) if f.repr
             and not (f.metadata.get("quiet") and getattr(cfg, f.name) == f.default)]
    return f"{type(cfg).__qualname__}({', '.join(parts)})"
