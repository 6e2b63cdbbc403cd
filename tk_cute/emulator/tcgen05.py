# SPDX-License-Identifier: MIT
"""The tcgen05 engine: tensor memory, its allocator, copies, loads and stores, the block-scaled
and f16 MMAs and their commits (PTX ISA 9.7.16), with the conventions the ISA gives only as
figures written down where they are implemented.

Tensor memory (TMEM): per SM (one CTA each here) 128 lanes x 512 columns of 32-bit cells (576
on sm_107a through an exclusive allocation), with a written mask. An address is lane << 16 |
column (9.7.16.1.1). `tcgen05.alloc` takes the first free run of columns (a power of two >= 32;
sm_107a: a multiple of 32 above 512, exclusive) and writes the address to shared memory; with
`.cta_group::2` one warp of each CTA of the pair allocates in its own SM, as the ISA asks.
An allocation still held when the CTA ends is a `tmem-leak` hazard; allocating after
`relinquish_alloc_permit` is an error.

Conventions (each says where it comes from):
- Data path (figure "Layout" of 9.7.16.10; the natural reading): the pair's M = 256 MMA puts
  rows 128 v .. 128 v + 127 of D in lanes 0-127 of CTA v's TMEM (v = rank & 1), column j of
  the instruction's N at the D address's column + j. A comes from each CTA's own shared memory
  (its 128 rows, at the descriptor's address), B is split along N: CTA v holds B rows
  N/2 v .. N/2 v + N/2 - 1 at the same shared offset (CUTLASS's 2-SM UMMA partition).
- `tcgen05.ld.32x32b.xN`: warp w reads lanes 32 (w % 4) .. + 31; thread t of the warp lane
  32 (w % 4) + t, register j column + j (Table 47 and the 32x32b figure).
- Scale factors (block16 = scale_vec::4X, 9.7.16.10.7): a 32x128b.warpx4 `tcgen05.cp` copies 32
  rows of 16 bytes to lanes 0-31 of 4 columns and replicates them to the 4 lane quarters; row i
  of the blocked 128x4 atom lands in lane i % 32, column i // 32 (the NVFP4 128x4 layout's
  byte (i % 32) * 16 + (i // 32) * 4 + k). The MMA reads the K = 64 block's 4 scales of A row r
  from lane r, column sf + r // 32 (bytes k = 0..3), of B row n from lane n % 32, column
  sf + n // 32. Rubin's K = 128 (unconfirmed by hardware: only the DSL's descriptor code
  describes it) reads a second atom 4 columns on (bytes 4..7 of the 8 scales).
- The selector bits of the instruction descriptor (A: 29-30, B: 4-5) pick the scale byte of a
  column where a K block has fewer than 4 scales; block16 uses all 4 (must be 0 here).
- Shared-memory matrix descriptor (Table 40): start (bits 0-13) << 4, LBO (16-29) << 4, SBO
  (32-45) << 4, base offset (49-51), swizzle (61-63: 0 none, 1 128B with 32B atom, 2 128B, 4
  64B, 6 32B); on sm_107a start and LBO take bits 14 and 30 too (the DSL's `Tcgen05SmemDesc`:
  Rubin's shared memory passes 256 KiB; unconfirmed by hardware). K-major swizzled operand: row
  r of the slice at start + (r // 8) SBO + (r % 8) * span, XOR-swizzled on absolute shared
  addresses; the start may sit inside the atom (the kernels advance it 32 B per K = 64 block
  with base offset 0: CUTLASS's model). K-major, no swizzle: core matrices of 8 rows x 16 B
  (rows 16 B apart), SBO along M / N, LBO along K. MN-major operand (kind::f16 with the
  transpose bit; CUTLASS's `make_umma_desc<Major::MN>`, cute/atom/mma_traits_sm100.hpp, the
  canonical layouts of wgmma's): swizzled, span bytes of M / N contiguous, the next span bytes
  LBO on, K rows span apart, the next 8 K SBO on; no swizzle, 16 B of M / N per core-matrix row,
  K rows 16 B apart, the next 16 B of M / N SBO on, the next 8 K LBO on.
- Scale copy source (`tcgen05.cp 32x128b`): row i at start + (i // 8) SBO + (i % 8) 16.
- kind::f16 instruction descriptor (Table 42 of 9.7.16.4.2; the same positions in CUTLASS's
  `UMMA::InstrDescriptor`, cute/arch/mma_sm100_desc.hpp, and in what the DSL encodes, e.g.
  0x08400490 for bf16 M = 128, N = 256, both K-major): D type bits 4-5 (F32 = 1, the one
  emulated), A / B type 7-9 / 10-12 (F16 = 0, BF16 = 1), negate A / B 13 / 14, transpose
  (MN-major) A / B 15 / 16, N >> 3 at 17-22, M >> 4 at 24-28 (block-scaled kinds: M >> 7 at
  27-28, Table 44), maximum shift 30-31 (.ws only: 0). K = 16 per instruction, M = 128 per CTA
  (256 on a pair). The disable-output-lane vector before enable-input-d (4 registers, 8 on a
  pair) must be zero (what the DSL passes); the optional scale-input-d s scales D by 2^-s
  before the add; `collector::a::fill` keeps A, `::use` / `::lastuse` read the kept copy
  (lastuse drops it). A from TMEM, .ws, .sp and M = 64 are errors.
- Arithmetic (the order is not specified, 9.7.16.10): each MMA instruction sums its K products
  in float64 (products exact; the sum too for NVFP4, and for f16 / bf16 data whose exponents
  span less than float64's precision), then adds to D in float32: one rounding per
  instruction. Tests use data for which every order gives the same float32 result.
- Ordering: the MMAs and copies a thread issues run in issue order; `tcgen05.commit` arrives
  (multicast: on the barrier at that offset in each CTA of the mask) once they are done.
- Rubin's B collector (sm_107a, unconfirmed by hardware): `fill` keeps the B operand it read,
  `lastuse` reads that kept copy (and a `lastuse` without a `fill` before is an error).
"""

from __future__ import annotations

import numpy as np

from tk_cute.emulator import isa
from tk_cute.emulator import machine as machine_mod
from tk_cute.emulator.machine import AsyncOp, Block
from tk_cute.emulator.memory import OFFSET_MASK, RANK_SHIFT, EmulatorError
from tk_cute.emulator.tma import check_async_read
from tk_cute.emulator.values import E2M1, E4M3, UE5M3, bf16_to_f32

LANES = 128
# Instruction-descriptor bits 23-24 (scale type) of UE5M3 scales: 2 in what the DSL encodes for
# sm_107a (0: UE4M3); unconfirmed by hardware. sm_107a's descriptors also set bit 3 (the DSL's
# a_sf_layout bit), which the emulator reads as the layout described in the module docstring.
UE5M3_SF_TYPE = 2


class Tmem:
    """One SM's tensor memory and allocator."""

    def __init__(self, columns: int):
        self.cells = np.zeros((LANES, columns), np.uint32)
        self.written = np.zeros((LANES, columns), bool)
        self.owner = np.full(columns, -1, np.int64)  # allocation start column, -1 free
        self.relinquished = False
        self.loads: list = []  # pending tcgen05.ld AsyncOps: (op, cols)

    def fits(self, n: int) -> bool:
        free = self.owner < 0
        return any(free[s:s + n].all() for s in range(0, self.owner.size - n + 1, 32))

    def alloc(self, n: int) -> int | None:
        free = self.owner < 0
        for start in range(0, self.owner.size - n + 1, 32):
            if free[start:start + n].all():
                self.owner[start:start + n] = start
                return start
        return None


def tmem_of(cta) -> Tmem:
    m = cta.machine
    t = m.tmem.get(id(cta))
    if t is None:
        from tk_cute.arch import target

        cols = max(target(m.arch).tmem_columns, 512)
        t = m.tmem[id(cta)] = Tmem(cols)
    return t


def _split(addr: int) -> tuple[int, int]:
    return addr >> 16 & 0xFFFF, addr & 0xFFFF


def _pair(cta) -> list:
    base = cta.rank & ~1
    return cta.cluster.ctas[base:base + 2]


# --- allocation ---------------------------------------------------------------------------
def _alloc(ins, m):
    pair = "cta_group::2" in ins.op

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        n = int(isa.read(w, ins.args[1], "u32")[mask][0])
        t = tmem_of(w.cta)
        if t.relinquished:
            raise EmulatorError("tcgen05.alloc after tcgen05.relinquish_alloc_permit")
        ok = n >= 32 and (n & (n - 1) == 0 and n <= 512 or
                          ".exclusive" in ins.op and n % 32 == 0 and n <= t.cells.shape[1])
        if not ok:
            raise EmulatorError(f"tcgen05.alloc of {n} columns: a power of two 32..512 (or, "
                                f"exclusive on sm_107a, a multiple of 32 up to 576)")
        if n > 512 and ".exclusive" not in ins.op:
            raise EmulatorError(f"{n} columns need tcgen05.alloc.exclusive")
        start = t.alloc(n)
        if start is None:  # wait for a dealloc (the columns taken on the retry)
            raise Block(lambda: t.fits(n), f"tcgen05.alloc of {n} columns")
        dst = int(isa.address(w, ins.args[0])[mask][0]) & OFFSET_MASK
        w.cta.smem.data[dst:dst + 4] = np.frombuffer(np.uint32(start).tobytes(), np.uint8)
        w.cta.smem.written[dst:dst + 4] = True
        w.cta.extra_tmem = (start, n, pair)
    return run


def _dealloc(ins, m):
    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        addr = int(isa.read(w, ins.args[0], "u32")[mask][0])
        n = int(isa.read(w, ins.args[1], "u32")[mask][0])
        t = tmem_of(w.cta)
        _, col = _split(addr)
        if (t.owner[col:col + n] != col).any():
            raise EmulatorError(f"tcgen05.dealloc of columns {col}..{col + n - 1}, not an "
                                f"allocation of this CTA")
        for op, cols in list(t.loads):
            if not op.done and cols & set(range(col, col + n)):
                m.hazard("tmem-read-after-release", ins.line, f"CTA {w.cta.ctaid} frees "
                         f"columns {col}..{col + n - 1} while a tcgen05.ld of them is in flight")
        t.owner[col:col + n] = -1
        w.cta.extra_tmem = None
    return run


def _relinquish(ins, m):
    def run(w, mask):
        if mask.any():
            tmem_of(w.cta).relinquished = True
    return run


# --- loads and stores ---------------------------------------------------------------------
def _quarter_lanes(w, lane0: int, ins) -> int:
    q = w.index % 4
    if lane0 != 32 * q:
        raise EmulatorError(f"warp {w.index} may access TMEM lanes {32 * q}..{32 * q + 31}, "
                            f"not from lane {lane0} ({ins.op})")
    return lane0


def _ld(ins, m):
    parts = ins.op.split(".")
    shape = next(p for p in parts if p.startswith(("32x32b", "16x", "32x")))
    if shape != "32x32b":
        raise EmulatorError(f"tcgen05.ld shape {shape} is not emulated (32x32b is)")
    n = int(next(p for p in parts if p.startswith("x") and p[1:].isdigit())[1:])
    red = ".red" in ins.op
    regs = isa.vec(ins.args[0])
    if len(regs) != n:
        raise EmulatorError(f"tcgen05.ld .x{n} with {len(regs)} registers")
    red_reg = ins.args[1] if red else None
    taddr = ins.args[2] if red else ins.args[1]
    op_kind = next((p for p in parts if p in ("min", "max")), None)

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        addr = int(isa.read(w, taddr.strip("[] "), "u32")[mask][0])
        lane0, col = _split(addr)
        _quarter_lanes(w, lane0, ins)
        t = tmem_of(w.cta)
        cols = set(range(col, col + n))
        if (t.owner[col:col + n] < 0).any():
            raise EmulatorError(f"tcgen05.ld of columns {col}..{col + n - 1}, not allocated")

        def complete():
            block = t.cells[lane0:lane0 + 32, col:col + n]
            if not t.written[lane0:lane0 + 32, col:col + n].all():
                m.hazard("uninitialized-tmem", ins.line, f"CTA {w.cta.ctaid} warp {w.index} "
                         f"reads TMEM lanes {lane0}.. columns {col}..{col + n - 1} nothing wrote")
            for j, r in enumerate(regs):
                isa.write(w, r, block[:, j], mask)
            if red:
                vals = block.view(np.float32)
                v = np.abs(vals) if "abs" in parts else vals
                r = v.max(axis=1) if op_kind == "max" else v.min(axis=1)
                isa.write(w, red_reg, r.astype(np.float32).view(np.uint32), mask)
            t.loads[:] = [x for x in t.loads if x[0] is not op]

        op = AsyncOp(f"tcgen05.ld (line {ins.line})", complete, w)
        t.loads.append((op, cols))
        for r in regs + ([red_reg] if red else []):
            w.scoreboard[r] = op
        w.state.setdefault("tc_ld", []).append(op)
        m.issue(op, late=True)  # done at tcgen05.wait::ld or the first read of its registers
    return run


def _st(ins, m):
    parts = ins.op.split(".")
    n = int(next(p for p in parts if p.startswith("x") and p[1:].isdigit())[1:])
    regs = isa.vec(ins.args[1])

    def run(w, mask):
        if not mask.any():
            return
        isa.aligned_check(w, mask, ins)
        lane0, col = _split(int(isa.read(w, ins.args[0].strip("[] "), "u32")[mask][0]))
        _quarter_lanes(w, lane0, ins)
        t = tmem_of(w.cta)
        vals = np.stack([isa.read(w, r, "b32") for r in regs], axis=1)

        def complete():
            t.cells[lane0:lane0 + 32, col:col + n] = vals
            t.written[lane0:lane0 + 32, col:col + n] = True

        op = AsyncOp(f"tcgen05.st (line {ins.line})", complete, w)
        w.state.setdefault("tc_st", []).append(op)
        m.issue(op)
    return run


def _wait(ins, m):
    key = "tc_ld" if "wait::ld" in ins.op else "tc_st"

    def run(w, mask):
        if mask.any():
            for op in w.state.pop(key, []):
                m.complete(op)
    return run


# --- descriptors ----------------------------------------------------------------------------
_SPAN = {0: 0, 1: 128, 2: 128, 4: 64, 6: 32}


def smem_desc(d: int, arch: str = "sm_100a") -> dict:
    """Fields of a tcgen05 shared-memory matrix descriptor (Table 40). On sm_107a the start
    address and the leading byte offset take one more bit each (14 and 30, reserved on sm_100:
    the DSL's `Tcgen05SmemDesc`), reaching Rubin's shared memory past 256 KiB."""
    wide = 0x7FFF if arch == "sm_107a" else 0x3FFF
    return {"start": (d & wide) << 4, "lbo": (d >> 16 & wide) << 4,
            "sbo": (d >> 32 & 0x3FFF) << 4, "fixed": d >> 46 & 7, "base": d >> 49 & 7,
            "lbo_mode": d >> 52 & 1, "swizzle": d >> 61 & 7}


def _rows(smem, desc: dict, rows: int, row_bytes: int, line: int, what: str,
          mn_major: bool = False, esize: int = 1) -> np.ndarray:
    """Shared offsets (rows, row_bytes) of an operand slice at `desc` in `smem` (swizzled): row
    r (M / N) holds the instruction's K elements of `esize` bytes, in K order. K-major unless
    `mn_major` (then K = row_bytes / esize; the module docstring gives both layouts)."""
    span = _SPAN.get(desc["swizzle"])
    if span is None:
        raise EmulatorError(f"{what}: swizzle mode {desc['swizzle']} is not emulated")
    if desc["swizzle"] == 1:
        raise EmulatorError(f"{what}: 128B swizzle with 32B atoms is not emulated")
    start, lbo, sbo = desc["start"], desc["lbo"], desc["sbo"]
    if mn_major:
        k = row_bytes // esize
        r = np.arange(rows)[:, None, None]
        kk = np.arange(k)[None, :, None]
        mb = r * esize + np.arange(esize)[None, None, :]  # byte along M / N
        if span:  # span bytes of M / N contiguous, the next span LBO on; K rows span apart,
            logical = (start + mb % span + (mb // span) * lbo  # the next 8 K SBO on
                       + (kk % 8) * span + (kk // 8) * sbo)
        else:  # core matrices of 8 K rows x 16 B of M / N: the next 16 B SBO on, next 8 K LBO
            logical = start + mb % 16 + (mb // 16) * sbo + (kk % 8) * 16 + (kk // 8) * lbo
        logical = logical.reshape(rows, row_bytes)
    else:
        r = np.arange(rows)[:, None]
        b = np.arange(row_bytes)[None, :]
        if span:
            logical = start + (r // 8) * sbo + (r % 8) * span + b
        else:  # interleaved core matrices: 8 rows x 16 B, LBO along K, SBO along M / N
            logical = start + (r // 8) * sbo + (r % 8) * 16 + (b // 16) * lbo + b % 16
    phys = logical ^ (((logical >> 7) & (span // 16 - 1)) << 4) if span else logical
    phys = phys & OFFSET_MASK
    smem.span(int(phys.min()), int(phys.max() - phys.min()) + 1, what)
    return phys


def idesc_fields(i: int, kind: str = "mxf4nvf4") -> dict:
    """Fields of the instruction descriptor: kind::mxf4nvf4 (Table 44) or kind::f16 (Table 42:
    M has 5 bits from bit 24 there, D's type bits 4-5, B's type 3 bits)."""
    common = {"sparse": i >> 2 & 1, "atype": i >> 7 & 7, "neg_a": i >> 13 & 1,
              "neg_b": i >> 14 & 1, "trans_a": i >> 15 & 1, "trans_b": i >> 16 & 1,
              "n": (i >> 17 & 0x3F) << 3}
    if kind == "f16":
        return {**common, "sparse_id": i & 3, "saturate": i >> 3 & 1, "dtype": i >> 4 & 3,
                "btype": i >> 10 & 7, "m": (i >> 24 & 0x1F) << 4, "max_shift": i >> 30 & 3}
    return {**common, "b_sf_id": i >> 4 & 3, "btype": i >> 10 & 3, "sf_type": i >> 23 & 3,
            "m": (i >> 27 & 3) << 7, "a_sf_id": i >> 29 & 3, "k_bit": i >> 31 & 1}


F16_TYPES = {0: "f16", 1: "bf16"}  # Table 42, kind::f16 atype / btype


def _f16_values(raw: np.ndarray, t: str) -> np.ndarray:
    """(rows, 2 k) bytes of f16 / bf16 elements -> (rows, k) float64 values."""
    bits = np.ascontiguousarray(raw).view(np.uint16)
    if t == "bf16":
        return bf16_to_f32(bits).astype(np.float64)
    return bits.view(np.float16).astype(np.float64)


def _check_f16(f: dict, ctas: list, ins) -> None:
    """kind::f16 descriptors the emulator runs (an EmulatorError names any other)."""
    bad = []
    if f["sparse"]:
        bad.append("sparse")
    if f["dtype"] != 1:
        bad.append(f"D type {f['dtype']} (F32 = 1 is emulated)")
    if f["atype"] not in F16_TYPES or f["btype"] not in F16_TYPES:
        bad.append(f"A / B types {f['atype']} / {f['btype']} (F16 = 0, BF16 = 1)")
    if f["m"] != 128 * len(ctas):
        bad.append(f"M = {f['m']} with cta_group::{len(ctas)} (128 per CTA is emulated)")
    if not 16 <= f["n"] <= 256 or f["n"] % 16:  # M = 128 and M = 256: N % 16 == 0
        bad.append(f"N = {f['n']}")
    if f["max_shift"]:
        bad.append("a maximum shift (bits 30-31)")
    if bad:
        raise EmulatorError(f"`{ins.op}`: instruction descriptor with " + ", ".join(bad)
                            + " is not emulated")


def _fp4_values(raw: np.ndarray) -> np.ndarray:
    """Packed E2M1 bytes (rows, k/2) -> values (rows, k): low nibble first."""
    lo, hi = raw & 0xF, raw >> 4
    return E2M1[np.stack([lo, hi], -1).reshape(raw.shape[0], -1).astype(np.int64)]


def _mma(ins, m):
    parts = ins.op.split(".")
    pair = "cta_group::2" in parts
    kind = next(p for p in parts if p.startswith("kind::"))[6:]
    scaled = "block_scale" in parts
    fill, last = "collector::b::fill" in parts, "collector::b::lastuse" in parts
    a_use = next((p.split("::")[-1] for p in parts if p.startswith("collector::a::")),
                 "discard")
    if kind not in ("mxf4nvf4", "f16"):
        raise EmulatorError(f"tcgen05.mma kind::{kind} is not emulated")
    if "ws" in parts or "sp" in parts:
        raise EmulatorError(f"`{ins.op}`: .ws and .sp MMAs are not emulated")
    if ins.args[1].startswith("["):
        raise EmulatorError(f"`{ins.op}`: A from tensor memory is not emulated")
    rest = ins.args[4:]
    if not scaled:  # kind::f16: [{disable-output-lane},] enable-input-d [, scale-input-d]
        lanes_off = isa.vec(rest[0]) if rest[0].startswith("{") else []
        rest = rest[1:] if lanes_off else rest
        if lanes_off and len(lanes_off) != (8 if pair else 4):
            raise EmulatorError(f"`{ins.op}`: {len(lanes_off)} disable-output-lane registers")
        scale_d = int(rest[1], 0) if len(rest) > 1 else 0
        if not 0 <= scale_d <= 15:
            raise EmulatorError(f"`{ins.op}`: scale-input-d {scale_d} outside 0..15")

    def run(w, mask):
        if not mask.any():
            return
        lanes = np.nonzero(mask)[0]
        if len(lanes) != 1:
            raise EmulatorError(f"tcgen05.mma issued by {len(lanes)} threads (one issues it)")
        lane = lanes[0]
        rd = lambda i, t: isa.read(w, ins.args[i], t)[lane]
        d_addr = int(isa.read(w, ins.args[0][1:-1], "u32")[lane])
        a_desc, b_desc = int(rd(1, "u64")), int(rd(2, "u64"))
        idesc = int(rd(3, "u32"))
        if scaled:
            sfa = int(isa.read(w, ins.args[4][1:-1], "u32")[lane])
            sfb = int(isa.read(w, ins.args[5][1:-1], "u32")[lane])
            acc = bool(isa.read(w, ins.args[6], "pred")[lane])
            acc_scale = 1.0
        else:
            sfa = sfb = None
            if any(int(isa.read(w, r, "u32")[lane]) for r in lanes_off):
                raise EmulatorError(f"`{ins.op}`: a non-zero disable-output-lane mask is not "
                                    f"emulated")
            acc = bool(isa.read(w, rest[0], "pred")[lane])
            acc_scale = 2.0 ** -scale_d
        ctas = _pair(w.cta) if pair else [w.cta]
        if pair and w.cta.rank & 1:
            raise EmulatorError("a cta_group::2 tcgen05.mma must be issued by the even CTA")
        f = idesc_fields(idesc, kind)
        if kind == "f16":
            _check_f16(f, ctas, ins)
        k = 128 if m.arch == "sm_107a" and kind == "mxf4nvf4" else (
            64 if kind == "mxf4nvf4" else 16)
        op_state = w.state.setdefault("collector", {})

        def complete():
            _mma_complete(m, ins, ctas, f, k, d_addr, a_desc, b_desc, sfa, sfb, acc, kind,
                          fill, last, op_state, a_use, acc_scale)

        lane0, col = _split(d_addr)
        for c in ctas:  # the MMA may run from now on: a load of its D columns still in flight
            for op, cols in tmem_of(c).loads:
                if not op.done and cols & set(range(col, col + f["n"])):
                    m.hazard("tmem-read-after-release", ins.line, f"tcgen05.mma issued over TMEM "
                             f"columns {col}..{col + f['n'] - 1} of CTA {c.ctaid} while a "
                             f"tcgen05.ld of them ({op.what}) is in flight: the loading thread "
                             f"released them without tcgen05.wait::ld")
        _issue_ordered(w, m, AsyncOp(f"tcgen05.mma (line {ins.line})", complete, w))
    return run


def _issue_ordered(w, m, op: AsyncOp):
    """A tcgen05 op of thread `w`: done after every earlier one of the same thread."""
    queue = w.state.setdefault("tc_queue", [])
    earlier = [o for o in queue if not o.done]
    inner = op.complete

    def complete():
        for o in earlier:
            m.complete(o)
        inner()

    op.complete = complete
    queue[:] = earlier + [op]
    m.issue(op)


def _mma_complete(m, ins, ctas, f, k, d_addr, a_desc, b_desc, sfa, sfb, acc, kind, fill,
                  last, state, a_use="discard", acc_scale=1.0):
    n = f["n"]
    rows_a = 128
    nb = n // len(ctas)
    f16 = kind == "f16"
    bytes_per = k * 2 if f16 else k // 2
    esize = 2 if f16 else 1
    da, db = smem_desc(a_desc, m.arch), smem_desc(b_desc, m.arch)
    if last:
        if "B" not in state:
            raise EmulatorError("collector::b::lastuse without a collector::b::fill before it")
        B = state.pop("B")
    else:
        parts = []
        for c in ctas:
            pos = _rows(c.smem, db, nb, bytes_per, ins.line, "MMA B", f16 and f["trans_b"], esize)
            check_async_read(m, c, pos.reshape(-1), ins.line, "tcgen05.mma B")
            parts.append(c.smem.data[pos])
        B = np.concatenate(parts, 0)
        if fill:
            state["B"] = B
    if a_use in ("use", "lastuse") and "A" not in state:
        raise EmulatorError(f"collector::a::{a_use} without a collector::a::fill before it")
    kept = state.pop("A") if a_use == "lastuse" else state.get("A")
    if a_use == "fill":
        state["A"] = []
    for v, c in enumerate(ctas):
        if a_use in ("use", "lastuse"):
            A = kept[v]
        else:
            pos = _rows(c.smem, da, rows_a, bytes_per, ins.line, "MMA A", f16 and f["trans_a"],
                        esize)
            check_async_read(m, c, pos.reshape(-1), ins.line, "tcgen05.mma A")
            A = c.smem.data[pos]
            if a_use == "fill":
                state["A"].append(A)
        t = tmem_of(c)
        if f16:
            av = _f16_values(A, F16_TYPES[f["atype"]]) * (-1.0 if f["neg_a"] else 1.0)
            bv = _f16_values(B, F16_TYPES[f["btype"]]) * (-1.0 if f["neg_b"] else 1.0)
        else:
            av, bv = _fp4_values(A), _fp4_values(B)
            sf = "ue5m3" if f["sf_type"] == UE5M3_SF_TYPE and m.arch == "sm_107a" else "ue4m3"
            sa = _scales(t, sfa, np.arange(rows_a), k, m, ins, "A", sf)
            sb = _scales(t, sfb, np.arange(n), k, m, ins, "B", sf)
            av = av * np.repeat(sa, 16, axis=1)
            bv = bv * np.repeat(sb, 16, axis=1)
        prod = av @ bv.T  # float64: exact products (module docstring)
        lane0, col = _split(d_addr)
        if lane0:
            raise EmulatorError(f"tcgen05.mma D at lane {lane0} (M = 128 per CTA starts at 0)")
        if col + n > t.cells.shape[1] or (t.owner[col:col + n] < 0).any():
            raise EmulatorError(f"tcgen05.mma D columns {col}..{col + n - 1} of CTA {c.ctaid} "
                                f"are not allocated")
        dst = t.cells[:rows_a, col:col + n]
        if acc:
            if not t.written[:rows_a, col:col + n].all():
                m.hazard("uninitialized-tmem", ins.line, "tcgen05.mma accumulates into TMEM "
                         "columns nothing wrote")
            prod = dst.view(np.float32).astype(np.float64) * acc_scale + prod
        prod = prod.astype(np.float32)  # one rounding per instruction
        for op, cols in t.loads:
            if not op.done and cols & set(range(col, col + n)):
                m.hazard("tmem-read-after-release", ins.line, f"tcgen05.mma writes TMEM columns "
                         f"{col}..{col + n - 1} of CTA {c.ctaid} while a tcgen05.ld of them is "
                         f"in flight (released without tcgen05.wait::ld)")
        t.cells[:rows_a, col:col + n] = prod.view(np.uint32)
        t.written[:rows_a, col:col + n] = True


def _scales(t: Tmem, addr: int, rows: np.ndarray, k: int, m, ins, which: str,
            sf: str) -> np.ndarray:
    """Decoded scales (rows, k / 16) of operand `which` for a K-block MMA (see the module)."""
    lane0, col = _split(addr)
    per = k // 16  # scales per row: 4 (K = 64) or 8 (K = 128, two atoms)
    out = np.zeros((rows.size, per), np.float64)
    lanes = rows % 32 + (32 * (rows // 32 % 4) if which == "A" else 0)
    for atom in range(per // 4):
        cols = col + atom * 4 + rows // 32
        if cols.max() >= t.cells.shape[1]:
            raise EmulatorError(f"scale columns past TMEM's {t.cells.shape[1]}")
        if not t.written[lanes, cols].all():
            m.hazard("uninitialized-tmem", ins.line, f"tcgen05.mma reads {which} scales from "
                     f"TMEM nothing wrote (column {col})")
        raw = t.cells[lanes, cols].copy().view(np.uint8).reshape(-1, 4).astype(np.int64)
        out[:, 4 * atom:4 * atom + 4] = (UE5M3 if sf == "ue5m3" else E4M3)[raw]
    return out


def _cp(ins, m):
    parts = ins.op.split(".")
    if "32x128b" not in parts or "warpx4" not in parts:
        raise EmulatorError(f"`{ins.op}`: only 32x128b.warpx4 copies are emulated")
    pair = "cta_group::2" in parts

    def run(w, mask):
        lane = isa.first_lane(mask)
        if lane is None:
            return
        taddr = int(isa.read(w, ins.args[0][1:-1], "u32")[lane])
        desc = smem_desc(int(isa.read(w, ins.args[1], "u64")[lane]), m.arch)
        ctas = _pair(w.cta) if pair else [w.cta]

        def complete():
            _, col = _split(taddr)
            r = np.arange(32)
            for c in ctas:
                pos = (desc["start"] + (r // 8)[:, None] * desc["sbo"] + (r % 8)[:, None] * 16
                       + np.arange(16)[None, :]) & OFFSET_MASK
                c.smem.span(int(pos.min()), int(pos.max() - pos.min()) + 1, "tcgen05.cp")
                check_async_read(m, c, pos.reshape(-1), ins.line, "tcgen05.cp")
                words = c.smem.data[pos].copy().view(np.uint32)  # (32, 4)
                t = tmem_of(c)
                for q in range(4):
                    t.cells[32 * q:32 * q + 32, col:col + 4] = words
                    t.written[32 * q:32 * q + 32, col:col + 4] = True

        _issue_ordered(w, m, AsyncOp(f"tcgen05.cp (line {ins.line})", complete, w))
    return run


def _commit(ins, m):
    parts = ins.op.split(".")
    multicast = "multicast::cluster" in parts

    def run(w, mask):
        lane = isa.first_lane(mask)
        if lane is None:
            return
        bar = int(isa.address(w, ins.args[0])[lane])
        cl = w.cta.cluster
        rank, off = (bar >> RANK_SHIFT, bar & OFFSET_MASK) if "shared::cluster" in parts else (
            w.cta.rank, bar & OFFSET_MASK)
        targets = [rank]
        if multicast:
            msk = int(isa.read(w, ins.args[1], "u16")[lane])
            targets = [r for r in range(len(cl.ctas)) if msk >> r & 1]

        def complete():
            for r in targets:
                b = cl.ctas[r].mbarriers.get(off)
                if b is None:
                    raise EmulatorError(f"tcgen05.commit arrives on an mbarrier at offset "
                                        f"{off:#x} of CTA rank {r} that was never initialized")
                b.pending -= 1
                if b.pending < 0:
                    m.hazard("arrival-overflow", ins.line, f"tcgen05.commit: more arrivals "
                             f"than the count of the mbarrier initialized at line {b.line}")
                    b.pending = 0
                b.complete_if_due()

        _issue_ordered(w, m, AsyncOp(f"tcgen05.commit (line {ins.line})", complete, w))
    return run


def _noop(ins, m):
    return lambda w, mask: None


def _loads_in_flight(m, w, ins):
    """An mbarrier arrive while this thread's tcgen05.ld is in flight (neither waited by
    tcgen05.wait::ld nor its value used): the columns it reads are handed to another thread
    before they are read (PTX ISA 9.7.16.6.4.4: ld -> wait::ld -> fence -> arrive)."""
    for op in w.state.get("tc_ld", []):
        if not op.done:
            m.hazard("tmem-read-after-release", ins.line, f"{w.where} arrives on an mbarrier "
                     f"while its {op.what} is in flight (no tcgen05.wait::ld before the "
                     f"release)")
            return


isa.ENGINES.update({
    "tcgen05.alloc": _alloc, "tcgen05.dealloc": _dealloc,
    "tcgen05.relinquish_alloc_permit": _relinquish, "tcgen05.ld": _ld, "tcgen05.st": _st,
    "tcgen05.wait": _wait, "tcgen05.mma": _mma, "tcgen05.cp": _cp, "tcgen05.commit": _commit,
    "tcgen05.fence": _noop})
machine_mod.RELEASE_CHECKS.append(_loads_in_flight)
