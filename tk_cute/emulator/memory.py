# SPDX-License-Identifier: MIT
"""The emulator's memories, numpy-backed, every access bounds-checked.

- `GlobalMemory`: the caller's tensors, each a region at an address the emulator hands out
  (`place`); an access outside every region is a `MemoryFault` naming the address.
- `SharedMemory`: one CTA's shared memory with a byte-wise initialization mask (a read of bytes
  nothing wrote is a hazard). Addresses: a CTA of cluster rank r sees its own shared memory at
  `(r << 24) | offset` (CUTLASS's convention for the pair: bit 24 of a CTA's own shared address
  is its rank's low bit, the peer mask 0xFEFFFFFF; `mapa` and shared::cluster windows use the
  same form); the first 1 KiB is reserved (as on sm_90 / sm_100), static `.shared` variables
  follow, then the dynamic shared memory, 1 KiB-aligned.
- Generic addresses: global addresses are themselves; shared memory appears at
  `SHARED_WINDOW + shared address`, the kernel parameters at `PARAM_WINDOW + offset`.
"""

from __future__ import annotations

import bisect

import numpy as np

SHARED_WINDOW = 0x0000_7F00_0000_0000
PARAM_WINDOW = 0x0000_7E00_0000_0000
RANK_SHIFT = 24  # shared::cluster address = (rank << 24) | offset
OFFSET_MASK = (1 << RANK_SHIFT) - 1
RESERVED_SHARED = 1024


class EmulatorError(RuntimeError):
    """The kernel did something the emulator cannot or must not do (it names where)."""


class MemoryFault(EmulatorError):
    """An access outside every buffer of its state space."""


def _gather(buf: np.ndarray, offs: np.ndarray, size: int) -> np.ndarray:
    return buf[offs[:, None] + np.arange(size)]


class GlobalMemory:
    """Regions of global memory: base address -> uint8 array (the caller's data, by view)."""

    BASE = 0x0000_1000_0000_0000  # where `place` starts handing out addresses
    ALIGN = 4096

    def __init__(self):
        self._bases: list[int] = []
        self._bufs: list[np.ndarray] = []
        self._names: list[str] = []
        self._next = self.BASE

    def place(self, data, name: str = "", address: int | None = None) -> int:
        """Make `data` (a numpy array, or a byte count for zeros) global memory; its address.
        The region is `data`'s own bytes: what the kernel writes shows in the array."""
        if isinstance(data, int):
            data = np.zeros(data, np.uint8)
        buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if buf.size and not np.shares_memory(buf, data):
            raise ValueError(f"global region {name!r} must be a contiguous array")
        if address is None:
            address = self._next
            self._next += -(-max(buf.size, 1) // self.ALIGN) * self.ALIGN + self.ALIGN
        i = bisect.bisect(self._bases, address)
        prev_end = self._bases[i - 1] + self._bufs[i - 1].size if i else 0
        if address < prev_end or (i < len(self._bases) and address + buf.size > self._bases[i]):
            raise ValueError(f"global region {name!r} at {address:#x} overlaps another")
        self._bases.insert(i, address)
        self._bufs.insert(i, buf)
        self._names.insert(i, name)
        return address

    def region(self, address: int, size: int) -> tuple[np.ndarray, int]:
        """(the region's bytes, offset of `address` in them) for an access of `size` bytes."""
        i = bisect.bisect(self._bases, address) - 1
        if i >= 0:
            off = address - self._bases[i]
            if off + size <= self._bufs[i].size:
                return self._bufs[i], off
        raise MemoryFault(f"global access of {size} B at {address:#x} is outside every tensor "
                          f"({self.describe()})")

    def describe(self) -> str:
        return ", ".join(f"{n or '?'} [{b:#x}, {b + x.size:#x})" for b, x, n in
                         zip(self._bases, self._bufs, self._names)) or "none placed"

    def read(self, addrs: np.ndarray, size: int) -> np.ndarray:
        """Bytes (n, size) at each address."""
        addrs = addrs.astype(np.uint64)
        lo, hi = int(addrs.min()), int(addrs.max())
        buf, off = self.region(lo, hi - lo + size)
        return _gather(buf, (addrs - np.uint64(lo)).astype(np.int64) + off, size)

    def write(self, addrs: np.ndarray, data: np.ndarray):
        addrs = addrs.astype(np.uint64)
        size = data.shape[1]
        lo, hi = int(addrs.min()), int(addrs.max())
        buf, off = self.region(lo, hi - lo + size)
        idx = (addrs - np.uint64(lo)).astype(np.int64)[:, None] + off + np.arange(size)
        buf[idx] = data

    def bytes(self, address: int, size: int) -> np.ndarray:
        """A view of `size` bytes at `address` (TMA and the tensor-core model use it)."""
        buf, off = self.region(address, size)
        return buf[off:off + size]


class SharedMemory:
    """One CTA's shared memory: bytes and which of them were written."""

    def __init__(self, size: int, rank: int):
        self.data = np.zeros(size, np.uint8)
        self.written = np.zeros(size, bool)
        # which warp (rank * 64 + warp) last wrote a byte with a generic store not yet made
        # visible to the async proxy (fence.proxy.async); -1: none
        self.writer = np.full(size, -1, np.int32)
        self.rank = rank

    @property
    def size(self) -> int:
        return self.data.size

    def offsets(self, addrs: np.ndarray, size: int, what: str) -> np.ndarray:
        """Offsets of shared::cta addresses (this CTA's window), bounds-checked."""
        a = addrs.astype(np.int64)
        rank = a >> RANK_SHIFT
        if np.any((rank != self.rank) & (rank != 0)):
            bad = int(a[(rank != self.rank) & (rank != 0)][0])
            raise MemoryFault(f"{what}: shared::cta address {bad:#x} is in CTA rank "
                              f"{bad >> RANK_SHIFT}'s window, not this CTA's ({self.rank})")
        off = a & OFFSET_MASK
        if np.any(off < 0) or np.any(off + size > self.size):
            bad = int(off[(off < 0) | (off + size > self.size)][0])
            raise MemoryFault(f"{what}: shared access of {size} B at offset {bad:#x} is outside "
                              f"the CTA's {self.size} B of shared memory")
        return off

    def read(self, offs: np.ndarray, size: int) -> tuple[np.ndarray, bool]:
        """Bytes (n, size) at offsets, and whether every byte had been written."""
        idx = offs[:, None] + np.arange(size)
        return self.data[idx], bool(self.written[idx].all())

    def write(self, offs: np.ndarray, data: np.ndarray, writer=None):
        """Generic-proxy stores (`writer`: (cta rank, warp) of the storing warp)."""
        idx = offs[:, None] + np.arange(data.shape[1])
        self.data[idx] = data
        self.written[idx] = True
        if writer is not None:
            self.writer[idx] = writer[0] * 64 + writer[1]

    def fence_proxy(self, writer):
        """fence.proxy.async by warp `writer`: its generic writes are visible to TMA / MMA."""
        self.writer[self.writer == writer[0] * 64 + writer[1]] = -1

    def span(self, off: int, size: int, what: str) -> slice:
        """A contiguous range of this CTA's shared memory (TMA boxes, MMA operands)."""
        if off < 0 or off + size > self.size:
            raise MemoryFault(f"{what}: shared range [{off:#x}, {off + size:#x}) is outside the "
                              f"CTA's {self.size} B")
        return slice(off, off + size)
