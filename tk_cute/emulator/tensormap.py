"""Decode the 128-byte TMA descriptors (CUtensorMap) that the CuTe DSL's host code writes.

A tensor map is a kernel parameter (``.param .align 64 .b8 p[128]``; `launch.Launch.tensor_maps`
finds them). The DSL's host code builds it itself, without the driver's encoder, and writes
only the first 64 bytes; bytes 64-127 are not written (the stand-in runs the host code on a
zeroed stack, so they read 0 in a capture). The driver's encoder (cuTensorMapEncodeTiled) also
writes bytes 64-79 (seen: the box's bytes, then the swizzle atom's bytes), which `decode`
keeps in `TensorMap.tail` and does not interpret.

Layout of the first 64 bytes, as one little-endian 512-bit number (bit b is bit b % 64 of the
little-endian 64-bit word b // 64). "DSL" names a probe of the DSL's encoder (`dsl_encode`: a
`@cute.jit` program making a TMA atom, captured with `launch.capture`) varying that one input;
"IR" the DSL's host LLVM IR of such a probe, which computes the word; "driver" a probe of
cuTensorMapEncodeTiled on an H200 (driver 580.159.04, `encode_with_driver` / `driver_sweep`;
the 62 maps it wrote are recorded in tests/tk_cute/emulator/driver_maps_h200.json and decoded by
test_tensormap.py), for the fields the DSL never varies.

  bits      field                                             established by
  0-3       0 (the address is 16-byte aligned)                 DSL address probe, IR
  4-56      global address bits 4-56                           DSL address probe (bits 57-63
                                                               of an address are dropped), IR
                                                               (addr / 16 & (2^53 - 1)) << 4
  65        DSL marker: 1 in every DSL map (load, store,       DSL (every probe); driver: 0
            multicast, every type and target), meaning
            not documented
  68-70     rank - 1                                           DSL rank probe 2-5, driver 1-5
  71-74     element format (`FORMATS`)                         DSL dtype probe; the DSL's own
                                                               TmaDataFormat ("bits 74-71");
                                                               driver dtype probe
  75-76     interleave: 0 none, 1 16B, 2 32B                   driver
  77-78     swizzle: 0 none, 1 32B, 2 64B, 3 128B              DSL swizzle probe, driver
  79        OOB fill: 1 NaN (request zero FMA), 0 zeros        driver (the DSL: 0)
  80        TF32: fp32 rounded to tf32 (format 7 or 8)         DSL TFloat32, driver TFLOAT32*
  81-82     L2 promotion: 0 none, 1 64B, 2 128B, 3 256B        driver (the DSL: always 128B)
  85        DSL large-tensor flag: set where dim0's bytes      DSL 2-D and 3-D extent
            plus the sum of (dim_i - 1) * stride_i reach       probes, IR (compares with
            128 KiB; meaning not documented                    131072); driver: 0
  96-223    stride_i >> 4, bits 0-31, i = 1..4 (32 each)       DSL stride probes, driver
  224-239   stride_i >> 4, bits 32-35, at 224 + 4 (i - 1)      DSL / driver probes of strides
                                                               up to 2^40 - 16 bytes
  256-415   dim_i - 1, i = 0..4 (32 bits each)                 DSL dims probes (to 2^32 - 1),
                                                               driver (2^32)
  416-430   element stride_i - 1, i = 0..4 (3 bits each)       driver (the DSL: 1)
  440-447   box_0 - 1                                          DSL box probes, driver
  448-479   box_i - 1, i = 1..4 (8 bits each)                  DSL box / multicast probes
  other     0 in every map seen (`TensorMap.other_bits` keeps any that is set)

Not probed: the driver on the H200 (Hopper) refuses the Blackwell-only sub-byte types
(16U4_ALIGN8B, 16U4_ALIGN16B, 16U6_ALIGN16B) and 128B_ATOM swizzles, so their encoding is not
known here (the DSL's FP4 and FP6 maps use formats 11 and 13 with the plain swizzles).

Dims, box and element strides count elements (4-bit elements for format 11: FP4 counts FP4
values); strides are bytes (multiples of 16) of dims 1..rank-1, dim 0 being contiguous. The DSL
encodes the same bytes for sm_90a, sm_100a, sm_103a and sm_107a, for loads and stores;
multicast over n CTAs divides box_1 by n.

A DSL upgrade can change any of this: the tests rerun the probes (`dsl_encode`) and compare the
decoded fields with what each probe asked for; the driver-only fields are pinned by the
recorded driver maps (rerun `driver_sweep` on a GPU to refresh them).
"""

import ctypes
import functools
import json
import sys
from dataclasses import dataclass, field

# Element formats (bits 71-74): (name, bits of one element in global memory). Names are the
# DSL's `TmaDataFormat`; codes 0-11 and 13 were produced by the DSL probe, 0-10 by the driver
# (which writes FLOAT32_FTZ as 8 and TFLOAT32 as 7 + the TF32 bit). 12 and 14-15 are the DSL
# enum's names, never produced by a probe.
FORMATS = {0: ("U8", 8), 1: ("U16", 16), 2: ("U32", 32), 3: ("S32", 32), 4: ("U64", 64),
           5: ("S64", 64), 6: ("F16", 16), 7: ("F32", 32), 8: ("F32_FTZ", 32), 9: ("F64", 64),
           10: ("BF16", 16), 11: ("U4", 4), 12: ("U4_UNPACK_U8", 4), 13: ("U6_UNPACK_U8", 6),
           14: ("TF32", 32), 15: ("TF32_FTZ", 32)}
SWIZZLES = ("none", "32B", "64B", "128B")
INTERLEAVES = ("none", "16B", "32B", "reserved")
L2_PROMOTIONS = ("none", "64B", "128B", "256B")
OOB_FILLS = ("zero", "nan_request_zero_fma")

# (first bit, width) of each field in the 512-bit number.
_ADDRESS, _MARKER, _RANK, _FORMAT = (4, 53), (65, 1), (68, 3), (71, 4)
_INTERLEAVE, _SWIZZLE, _OOB, _TF32 = (75, 2), (77, 2), (79, 1), (80, 1)
_L2, _LARGE = (81, 2), (85, 1)
_STRIDE_LO, _STRIDE_HI = 96, 224  # + 32 (i - 1), + 4 (i - 1)
_DIM, _ESTRIDE, _BOX0, _BOX = 256, 416, (440, 8), 448  # + 32 i, + 3 i, -, + 8 (i - 1)


def _get(x: int, at: int, width: int) -> int:
    return (x >> at) & ((1 << width) - 1)


def _known_mask() -> int:
    mask = 0
    for at, width in (_ADDRESS, _MARKER, _RANK, _FORMAT, _INTERLEAVE, _SWIZZLE, _OOB, _TF32, _L2,
                      _LARGE, _BOX0):
        mask |= ((1 << width) - 1) << at
    for i in range(4):
        mask |= (2**32 - 1) << (_STRIDE_LO + 32 * i) | 15 << (_STRIDE_HI + 4 * i)
        mask |= 255 << (_BOX + 8 * i)
    for i in range(5):
        mask |= (2**32 - 1) << (_DIM + 32 * i) | 7 << (_ESTRIDE + 3 * i)
    return mask


_KNOWN = _known_mask()


@dataclass(frozen=True)
class TensorMap:
    """A decoded tensor map (fields as in the module's table; tuples have `rank` entries,
    `strides` rank - 1: the byte strides of dims 1..rank-1)."""

    address: int
    rank: int
    format: int
    dtype: str  # FORMATS name
    element_bits: int
    tf32: bool
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: str
    swizzle: str
    l2_promotion: str
    oob_fill: str
    dsl_marker: bool
    large_tensor: bool
    other_bits: int = 0  # set bits outside every field above (0 in every map seen)
    tail: bytes = field(default=b"", repr=False)  # bytes 64-127 as passed (DSL: unwritten)

    @property
    def box_bytes(self) -> int:
        """Bytes one box copies (the element strides' subsampling not counted)."""
        n = self.element_bits
        for b in self.box:
            n *= b
        return n // 8

    @property
    def swizzle_bytes(self) -> int:
        """The swizzle span in bytes (0: none)."""
        return {"none": 0, "32B": 32, "64B": 64, "128B": 128}[self.swizzle]


def decode(raw: bytes) -> TensorMap:
    """The `TensorMap` in the first 64 bytes of `raw` (a 128-byte CUtensorMap, or its 64
    written bytes); bits outside the known fields go to `other_bits`."""
    if len(raw) not in (64, 128):
        raise ValueError(f"a tensor map is 128 bytes (64 written), got {len(raw)}")
    x = int.from_bytes(raw[:64], "little")
    rank = _get(x, *_RANK) + 1
    fmt = _get(x, *_FORMAT)
    name, bits = FORMATS[fmt]
    strides = tuple(
        (_get(x, _STRIDE_LO + 32 * (i - 1), 32) | _get(x, _STRIDE_HI + 4 * (i - 1), 4) << 32)
        << 4 for i in range(1, rank))
    box = (_get(x, *_BOX0) + 1,) + tuple(_get(x, _BOX + 8 * (i - 1), 8) + 1
                                         for i in range(1, rank))
    return TensorMap(
        address=_get(x, *_ADDRESS) << 4, rank=rank, format=fmt, dtype=name, element_bits=bits,
        tf32=bool(_get(x, *_TF32)),
        dims=tuple(_get(x, _DIM + 32 * i, 32) + 1 for i in range(rank)), strides=strides,
        box=box, element_strides=tuple(_get(x, _ESTRIDE + 3 * i, 3) + 1 for i in range(rank)),
        interleave=INTERLEAVES[_get(x, *_INTERLEAVE)], swizzle=SWIZZLES[_get(x, *_SWIZZLE)],
        l2_promotion=L2_PROMOTIONS[_get(x, *_L2)], oob_fill=OOB_FILLS[_get(x, *_OOB)],
        dsl_marker=bool(_get(x, *_MARKER)), large_tensor=bool(_get(x, *_LARGE)),
        other_bits=x & ~_KNOWN, tail=bytes(raw[64:]))


def encode(tm: TensorMap) -> bytes:
    """The 64 bytes `decode` reads `tm` from, then 64 zero bytes (the inverse of `decode` for
    a map whose unused dims, strides and boxes are zero, as every encoder writes them)."""
    fields = [(tm.address >> 4, _ADDRESS), (tm.dsl_marker, _MARKER), (tm.rank - 1, _RANK),
              (tm.format, _FORMAT), (INTERLEAVES.index(tm.interleave), _INTERLEAVE),
              (SWIZZLES.index(tm.swizzle), _SWIZZLE), (OOB_FILLS.index(tm.oob_fill), _OOB),
              (tm.tf32, _TF32), (L2_PROMOTIONS.index(tm.l2_promotion), _L2),
              (tm.large_tensor, _LARGE), (tm.box[0] - 1, _BOX0)]
    for i, s in enumerate(tm.strides, start=1):
        if s % 16 or s >> 40:
            raise ValueError(f"stride {s} bytes: TMA strides are multiples of 16 below 2^40")
        fields += [((s >> 4) & (2**32 - 1), (_STRIDE_LO + 32 * (i - 1), 32)),
                   (s >> 36, (_STRIDE_HI + 4 * (i - 1), 4))]
    for i in range(tm.rank):
        fields += [(tm.dims[i] - 1, (_DIM + 32 * i, 32)),
                   (tm.element_strides[i] - 1, (_ESTRIDE + 3 * i, 3))]
        if i:
            fields.append((tm.box[i] - 1, (_BOX + 8 * (i - 1), 8)))
    x = tm.other_bits
    for value, (at, width) in fields:
        if not 0 <= int(value) < 1 << width:
            raise ValueError(f"{value} does not fit the {width}-bit field at bit {at}")
        x |= int(value) << at
    return x.to_bytes(64, "little") + bytes(64)


# ---- probing the DSL's encoder ------------------------------------------------------------
def dsl_encode(dtype, dims, strides, box, swizzle: int = 128, address: int = 0x10000,
               arch: str = "sm_100a", store: bool = False, multicast: int = 1) -> bytes:
    """The 128 bytes the DSL's host code writes for one TMA atom (a probe of its encoder).

    A `@cute.jit` program makes the atom with `cpasync.make_tiled_tma_atom` for the global
    tensor `dims` (elements, dim 0 contiguous, at most 5) with element strides `strides` (of
    dims 1.., elements), a shared tile `box` laid out with the `swizzle` (32, 64, 128: CuTe's
    MN-major swizzle atoms, which may split the box; 0: a plain compact layout, no swizzle),
    and passes it to a kernel; `launch.HostProgram` captures the kernel's parameter. The
    program is compiled once per (dtype, box, swizzle, arch, store, multicast) and rerun for
    new dims, strides and address.
    """
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    rank = len(box)
    if not 1 <= rank <= 5 or len(dims) != rank or len(strides) != rank - 1:
        raise ValueError(f"rank {rank}: {len(dims)} dims and {len(strides)} strides given")
    program = _probe_program(dtype, tuple(box), swizzle, arch, store, multicast)
    pad = lambda xs, n, fill: list(xs) + [fill] * (n - len(xs))
    args = (make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=16),
            *[cutlass.Int32(d) for d in pad(dims, 5, 1)],
            *[cutlass.Int64(s) for s in pad(strides, 4, 0)], cuda.CUstream(0))
    (launch,) = program.run(*args)
    ((_, raw),) = launch.tensor_maps()
    return raw


# (No `from __future__ import annotations` in this module: the DSL evaluates the probe's
# annotations in the module's namespace, where cute and cutlass are not imported.)
@functools.lru_cache(maxsize=64)
def _probe_program(dtype, box: tuple, swizzle: int, arch: str, store: bool, multicast: int):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync, warpgroup
    from cutlass.cute.runtime import make_ptr

    from tk_cute.emulator.launch import HostProgram

    kinds = {32: warpgroup.SmemLayoutAtomKind.MN_SW32, 64: warpgroup.SmemLayoutAtomKind.MN_SW64,
             128: warpgroup.SmemLayoutAtomKind.MN_SW128}
    if swizzle not in (0, *kinds):
        raise ValueError(f"swizzle {swizzle}: 0, 32, 64 or 128")
    rank = len(box)
    if store:
        op = cpasync.CopyBulkTensorTileS2GOp()
    elif multicast > 1:
        op = cpasync.CopyBulkTensorTileG2SMulticastOp()
    else:
        op = cpasync.CopyBulkTensorTileG2SOp()

    @cute.kernel
    def probe_kernel(atom: cute.CopyAtom):
        cpasync.prefetch_descriptor(atom)  # a use: an unused parameter is dropped

    @cute.jit
    def probe_host(ptr: cute.Pointer, d0: cutlass.Int32, d1: cutlass.Int32, d2: cutlass.Int32,
                   d3: cutlass.Int32, d4: cutlass.Int32, s1: cutlass.Int64, s2: cutlass.Int64,
                   s3: cutlass.Int64, s4: cutlass.Int64, stream: cuda.CUstream):
        g = cute.make_tensor(ptr, cute.make_layout((d0, d1, d2, d3, d4)[:rank],
                                                   stride=(1, s1, s2, s3, s4)[:rank]))
        if cutlass.const_expr(swizzle == 0):
            smem = cute.make_layout(box)
        else:
            atom = warpgroup.make_smem_layout_atom(kinds[swizzle], dtype)
            smem = cute.tile_to_shape(atom, box, order=tuple(range(rank)))
        if cutlass.const_expr(multicast > 1):
            tma, _ = cpasync.make_tiled_tma_atom(op, g, smem, box, num_multicast=multicast)
        else:
            tma, _ = cpasync.make_tiled_tma_atom(op, g, smem, box)
        probe_kernel(tma).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    args = (make_ptr(dtype, 0x10000, cute.AddressSpace.gmem, assumed_align=16),
            *[cutlass.Int32(1024)] * 5, *[cutlass.Int64(1 << 20)] * 4, cuda.CUstream(0))
    return HostProgram(probe_host, *args, arch=arch)


# ---- probing the driver's encoder (a GPU machine; stdlib only, so it runs as a script) ------
# cuda.h enums (the values of cuda.bindings.driver.CUtensorMap*).
DRIVER_DTYPES = {"UINT8": 0, "UINT16": 1, "UINT32": 2, "INT32": 3, "UINT64": 4, "INT64": 5,
                 "FLOAT16": 6, "FLOAT32": 7, "FLOAT64": 8, "BFLOAT16": 9, "FLOAT32_FTZ": 10,
                 "TFLOAT32": 11, "TFLOAT32_FTZ": 12, "16U4_ALIGN8B": 13, "16U4_ALIGN16B": 14,
                 "16U6_ALIGN16B": 15}
_DRIVER_ELEMENT_BYTES = {"UINT8": 1, "UINT16": 2, "UINT32": 4, "INT32": 4, "UINT64": 8,
                         "INT64": 8, "FLOAT16": 2, "FLOAT32": 4, "FLOAT64": 8, "BFLOAT16": 2,
                         "FLOAT32_FTZ": 4, "TFLOAT32": 4, "TFLOAT32_FTZ": 4}
_DRIVER = []


def _driver():
    """libcuda with device 0's primary context current (the encoder needs a context)."""
    if not _DRIVER:
        lib = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
        for call in (lambda: lib.cuInit(0), lambda: lib.cuDeviceGet(ctypes.byref(dev), 0),
                     lambda: lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                     lambda: lib.cuCtxSetCurrent(ctx)):
            err = call()
            if err:
                raise RuntimeError(f"CUDA driver setup failed: CUresult {err}")
        _DRIVER.append(lib)
    return _DRIVER[0]


def encode_with_driver(dtype: int, dims, strides, box, element_strides=None, address=0x10000,
                       interleave=0, swizzle=0, l2=0, oob=0) -> bytes:
    """cuTensorMapEncodeTiled (libcuda, needs a GPU): the 128-byte map. `dtype`, `interleave`,
    `swizzle`, `l2`, `oob` are cuda.h enum values; `strides` the byte strides of dims 1..;
    raises with the CUresult where the driver refuses."""
    lib = _driver()
    rank = len(dims)
    out = (ctypes.c_uint8 * 128)()
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    f = lib.cuTensorMapEncodeTiled
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                  ctypes.c_int, ctypes.c_int]
    err = f(out, dtype, rank, ctypes.c_void_p(address), (u64 * rank)(*dims),
            (u64 * max(1, rank - 1))(*strides), (u32 * rank)(*box),
            (u32 * rank)(*(element_strides or [1] * rank)), interleave, swizzle, l2, oob)
    if err:
        raise RuntimeError(f"cuTensorMapEncodeTiled: CUresult {err}")
    return bytes(out)


def driver_sweep() -> list[dict]:
    """Driver encodings, one input changed at a time from a base case (bf16 1000 x 2000, row
    2048 B, box 64 x 16, 128B swizzle): what the recorded maps in the tests came from."""
    base = dict(dtype=9, dims=[1000, 2000], strides=[2048], box=[64, 16], element_strides=None,
                address=0x7F0000001000, interleave=0, swizzle=3, l2=0, oob=0)
    cases = [("base", {})]
    for name, v in DRIVER_DTYPES.items():
        inner = 128 // _DRIVER_ELEMENT_BYTES.get(name, 1)
        cases.append((f"dtype {name}", dict(dtype=v, box=[min(inner, 64), 16])))
        cases.append((f"dtype {name} noswz", dict(dtype=v, box=[32, 16], swizzle=0)))
    cases += [(f"swizzle {sw}", dict(swizzle=sw, box=[16, 16])) for sw in range(7)]
    cases += [(f"l2 {v}", dict(l2=v)) for v in range(4)]
    cases += [(f"oob {v}", dict(oob=v)) for v in range(2)]
    for il, sw in ((0, 0), (1, 0), (2, 0), (2, 1), (1, 1)):
        cases.append((f"interleave {il} swizzle {sw}", dict(
            interleave=il, swizzle=sw, dims=[16, 30, 40], strides=[512, 512 * 30],
            box=[16, 8, 4])))
    cases += [(f"element strides {es}", dict(element_strides=es))
              for es in ([1, 1], [2, 1], [1, 2], [3, 5], [8, 8])]
    cases.append(("element strides 5d", dict(
        dims=[64, 3, 5, 7, 9], strides=[256, 256 * 3, 256 * 15, 256 * 105], box=[64, 2, 3, 4, 5],
        element_strides=[1, 2, 3, 4, 5])))
    for rank in range(1, 6):
        cases.append((f"rank {rank}", dict(
            dims=[1000 + i for i in range(rank)],
            strides=[2048 * (i + 1) * (7 ** i) for i in range(rank - 1)],
            box=[64, 8, 2, 4, 3][:rank])))
    cases.append(("big strides", dict(
        dims=[64, 3, 5, 7, 9], strides=[3 << 36, 5 << 36, 7 << 36, (1 << 40) - 16],
        box=[64, 2, 3, 4, 5])))
    cases.append(("big dims", dict(dims=[2**32, 5], strides=[2**33 + 2**32], box=[64, 5])))
    cases += [(f"address {a:#x}", dict(address=a))
              for a in (0x10, 0x123456789AB0, (1 << 56) - 16, (1 << 57) - 16, (1 << 63) + 0x100)]
    out = []
    for name, change in cases:
        args = {**base, **change}
        try:
            out.append(dict(name=name, args=args, raw=encode_with_driver(**args).hex()))
        except Exception as e:  # refusals are recorded too
            out.append(dict(name=name, args=args, error=str(e)))
    return out


if __name__ == "__main__":  # python tk_cute/emulator/tensormap.py OUT.json (on a GPU machine)
    with open(sys.argv[1], "w") as f:
        json.dump(driver_sweep(), f, indent=1)
