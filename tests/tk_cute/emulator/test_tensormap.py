"""tk_cute.emulator.tensormap: the TMA descriptor layout, pinned by probes of the DSL's encoder
(compiled here, so a DSL upgrade reruns them), by maps the CUDA driver's encoder wrote on an
H200 (driver_maps_h200.json: interleave, OOB fill, L2 promotion and element strides, which the
DSL never varies) and by the maps of real kernels (fixtures in conftest.py)."""

import json
from pathlib import Path

import cutlass
import pytest

from tk_cute.emulator import tensormap as T

DRIVER_MAPS = Path(__file__).with_name("driver_maps_h200.json")
# cuda.h CUtensorMapDataType -> (format code, TF32 bit), as the H200 driver encoded them.
DRIVER_FORMATS = {0: (0, 0), 1: (1, 0), 2: (2, 0), 3: (3, 0), 4: (4, 0), 5: (5, 0), 6: (6, 0),
                  7: (7, 0), 8: (9, 0), 9: (10, 0), 10: (8, 0), 11: (7, 1), 12: (8, 1)}
BF16 = cutlass.BFloat16


def dsl(dtype=BF16, dims=(1000, 2000), strides=(1024,), box=(64, 16), **kw):
    """A DSL-encoded map, checked for what every DSL map holds, and decoded."""
    raw = T.dsl_encode(dtype, dims, strides, box, **kw)
    tm = T.decode(raw)
    # Fields the DSL never varies, and no bit outside the table.
    assert (tm.dsl_marker, tm.l2_promotion, tm.oob_fill, tm.interleave) == (
        True, "128B", "zero", "none")
    assert tm.element_strides == (1,) * tm.rank and tm.other_bits == 0
    assert raw[64:] == bytes(64)  # the host code writes 64 bytes (on a zeroed stack)
    assert T.encode(tm) == raw  # the table covers every bit
    return tm


@pytest.mark.parametrize("name, fmt, bits, tf32", [
    ("Uint8", "U8", 8, False), ("Float8E4M3FN", "U8", 8, False), ("Uint16", "U16", 16, False),
    ("Int32", "U32", 32, False), ("Int64", "U64", 64, False), ("Float16", "F16", 16, False),
    ("Float32", "F32", 32, False), ("TFloat32", "F32", 32, True), ("Float64", "F64", 64, False),
    ("BFloat16", "BF16", 16, False), ("Float4E2M1FN", "U4", 4, False)])
def test_dsl_element_formats(name, fmt, bits, tf32):
    """Probe: the element type alone (128B swizzle, so box 0 is 128 bytes of elements)."""
    dtype = getattr(cutlass, name)
    per_row = 1024 // bits
    tm = dsl(dtype, (4 * per_row, 40), (8 * per_row,), (per_row, 8))
    assert (tm.dtype, tm.element_bits, tm.tf32) == (fmt, bits, tf32)
    assert tm.dims == (4 * per_row, 40)  # elements, 4-bit ones too
    assert tm.strides == (8 * per_row * bits // 8,)  # bytes
    assert tm.box == (per_row, 8) and tm.box_bytes == 128 * 8


def test_dsl_six_bit_format():
    tm = dsl(cutlass.Float6E2M3FN, (128, 8), (128,), (64, 8), swizzle=0)
    assert (tm.dtype, tm.element_bits, tm.strides) == ("U6_UNPACK_U8", 6, (96,))


@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_dsl_rank_dims_strides_box(rank):
    box = (64, 8, 2, 4, 3)[:rank]
    dims = (1001, 1002, 1003, 1004, 1005)[:rank]
    strides = (3 * 1024, 15 * 1024**2, 7 << 20, 11 << 22)[:rank - 1]
    tm = dsl(BF16, dims, strides, box)
    assert (tm.rank, tm.dims, tm.box) == (rank, dims, box)
    assert tm.strides == tuple(2 * s for s in strides)


@pytest.mark.parametrize("swizzle, name, box0", [(0, "none", 64), (32, "32B", 16),
                                                 (64, "64B", 32), (128, "128B", 64)])
def test_dsl_swizzle(swizzle, name, box0):
    """A swizzled tile is copied in boxes one swizzle span wide (the atom's width)."""
    tm = dsl(BF16, (64, 8), (64,), (64, 8), swizzle=swizzle)
    assert (tm.swizzle, tm.box, tm.swizzle_bytes) == (name, (box0, 8), swizzle)


def test_dsl_address_stride_and_dim_extremes():
    """Runtime values on one rank-5 program: 57-bit addresses (bits above 56 dropped), byte
    strides to 2^40 - 16 (36 bits of stride / 16), dims to 2^32."""
    box = (64, 8, 2, 4, 3)
    dims = (1001, 1002, 1003, 1004, 1005)
    for addr, want in ((0x10, 0x10), (0xFEDCBA9876543210, 0x00DCBA9876543210),
                       ((1 << 57) - 16, (1 << 57) - 16)):
        assert dsl(BF16, dims, (64,) * 4, box, address=addr).address == want
    big = (3 << 35, 5 << 35, 7 << 35, (1 << 39) - 8)  # elements of 2 bytes
    assert dsl(BF16, dims, big, box).strides == tuple(2 * s for s in big)
    assert dsl(BF16, (2**32 - 1, 5, 6, 7, 8), (64,) * 4, box).dims == (2**32 - 1, 5, 6, 7, 8)


@pytest.mark.parametrize("dims, strides, large", [
    ((64, 1024), (64,), True), ((64, 1023), (64,), False),  # 128 + 1023 * 128 = 131072 B
    ((65536, 1), (65536,), True), ((65535, 1), (65536,), False)])
def test_dsl_large_tensor_flag(dims, strides, large):
    """Bit 85: dim 0's bytes + (dim 1 - 1) * stride 1 >= 128 KiB (the host IR's test)."""
    assert dsl(BF16, dims, strides, (64, 16)).large_tensor is large


def test_dsl_loads_stores_and_targets_encode_alike():
    base = T.dsl_encode(BF16, (1000, 2000), (1024,), (64, 16))
    assert T.dsl_encode(BF16, (1000, 2000), (1024,), (64, 16), store=True) == base
    for arch in ("sm_90a", "sm_103a", "sm_107a"):
        assert T.dsl_encode(BF16, (1000, 2000), (1024,), (64, 16), arch=arch) == base
    for n in (2, 4):  # multicast over n CTAs: each loads 1/n of the box's rows
        tm = dsl(BF16, (1000, 2000), (1024,), (64, 16), multicast=n)
        assert tm.box == (64, 16 // n) and T.encode(tm)[:48] == base[:48]


def _driver_expected(args: dict) -> dict:
    rank = len(args["dims"])
    fmt, tf32 = DRIVER_FORMATS[args["dtype"]]
    return dict(address=args["address"] & ((1 << 57) - 16), rank=rank, format=fmt,
                tf32=bool(tf32), dims=tuple(args["dims"]),
                strides=tuple(args["strides"][:rank - 1]), box=tuple(args["box"]),
                element_strides=tuple(args["element_strides"] or [1] * rank),
                interleave=T.INTERLEAVES[args["interleave"]], swizzle=T.SWIZZLES[args["swizzle"]],
                l2_promotion=T.L2_PROMOTIONS[args["l2"]], oob_fill=T.OOB_FILLS[args["oob"]],
                dsl_marker=False, large_tensor=False, other_bits=0)


def _check_driver_maps(maps: list[dict]) -> int:
    checked = 0
    for m in maps:
        if "raw" not in m:
            continue
        raw = bytes.fromhex(m["raw"])
        tm = T.decode(raw)
        got = {k: getattr(tm, k) for k in _driver_expected(m["args"])}
        assert got == _driver_expected(m["args"]), m["name"]
        assert T.encode(tm)[:64] == raw[:64], m["name"]
        checked += 1
    return checked


def test_driver_maps_decode_to_their_inputs():
    """The recorded H200 driver maps: every field, including those only the driver varies."""
    maps = json.loads(DRIVER_MAPS.read_text())["maps"]
    assert _check_driver_maps(maps) == 62
    by_name = {m["name"]: T.decode(bytes.fromhex(m["raw"])) for m in maps if "raw" in m}
    assert by_name["interleave 2 swizzle 1"].interleave == "32B"
    assert by_name["oob 1"].oob_fill == "nan_request_zero_fma"
    assert by_name["l2 3"].l2_promotion == "256B"
    assert by_name["element strides 5d"].element_strides == (1, 2, 3, 4, 5)
    assert by_name["dtype TFLOAT32_FTZ"].tf32 and by_name["dtype TFLOAT32_FTZ"].dtype == "F32_FTZ"
    # The driver writes bytes 64-79 too (not decoded); the DSL leaves 64-127 unwritten.
    assert by_name["base"].tail[:16] != bytes(16)


@pytest.mark.gpu
def test_driver_encoder_live():
    """On a GPU: the driver's encoder gives the recorded bytes and refusals, case for case, and
    agrees with the table (the recording's 3 DSL-encoded maps are not part of the sweep)."""
    live = T.driver_sweep()
    recorded = {m["name"]: m for m in json.loads(DRIVER_MAPS.read_text())["maps"]}
    for m in live:
        r = recorded[m["name"]]
        assert (m.get("raw"), "error" in m) == (r.get("raw"), "error" in r), m["name"]
    assert _check_driver_maps(live) == 59


def test_nvfp4_sm100_maps(nvfp4):
    """tk_cute's NVFP4 GEMM (sm_100a): A, B, SFA, SFB, D in parameter order."""
    cfg, m, n, k, addr = nvfp4.cfg, nvfp4.m, nvfp4.n, nvfp4.k, nvfp4.addr
    a, b, sfa, sfb, d = (T.decode(raw) for _, raw in nvfp4.launch.tensor_maps())
    # A (m, k) FP4, K contiguous; each CTA of the pair loads Mb / 2 rows of a 128-byte
    # (256-element) K slice per box, 128B swizzle.
    assert (a.address, a.dtype, a.element_bits) == (addr["a"], "U4", 4)
    assert (a.dims, a.strides) == ((k, m, 1), (k // 2, m * k // 2))
    assert (a.box, a.swizzle) == ((256, cfg.Mb // 2, 1), "128B")
    assert (b.address, b.dims, b.box) == (addr["b"], (k, n, 1), (256, cfg.Nb // 2, 1))
    # Scales move as 16-bit elements in their blocked layout, unswizzled.
    assert (sfa.address, sfa.dtype, sfa.swizzle) == (addr["sfa"], "U16", "none")
    assert (sfb.address, sfb.dtype, sfb.swizzle) == (addr["sfb"], "U16", "none")
    # D (m, n) bf16 stored EPI_N columns x 128 rows per box (64 bytes: 64B swizzle).
    assert (d.address, d.dtype, d.dims, d.strides) == (addr["d"], "BF16", (n, m, 1),
                                                       (2 * n, 2 * m * n))
    assert (d.box, d.swizzle) == ((cfg.EPI_N, 128, 1), "64B")
    for tm in (a, b, sfa, sfb, d):
        assert tm.dsl_marker and tm.other_bits == 0 and tm.l2_promotion == "128B"


def test_sm90_dense_gemm_maps(sm90):
    v, cfg = sm90.values, sm90.cfg
    a, b, c = (T.decode(raw) for _, raw in sm90.launch.tensor_maps())
    assert (a.address, a.dtype, a.dims, a.strides) == (v["a"], "BF16", (v["K"], v["M"]),
                                                       (2 * v["lda"],))
    assert (a.box, a.swizzle) == ((64, cfg.Mb), "128B")  # 64 bf16 = one 128-byte span
    assert (b.address, b.dims, b.box) == (v["b"], (v["K"], v["N"]), (64, cfg.Nb))
    assert (c.address, c.dims, c.strides) == (v["c"], (v["N"], v["M"]), (2 * v["ldc"],))
    assert (c.box, c.swizzle) == ((cfg.EPI_N, 128), "64B")


def test_peer_maps_equal_tk_cutes(peer, nvfp4):
    """NVIDIA's example, same problem, tile and addresses: its five maps are byte-identical
    to tk_cute's (so the emulator's TMA path is shared)."""
    ours = [raw for _, raw in nvfp4.launch.tensor_maps()]
    theirs = [raw for _, raw in peer.launch.tensor_maps()]
    assert theirs == ours


def test_decode_rejects_wrong_sizes_and_encode_bad_strides():
    with pytest.raises(ValueError, match="128 bytes"):
        T.decode(bytes(32))
    tm = T.decode(T.dsl_encode(BF16, (1000, 2000), (1024,), (64, 16)))
    with pytest.raises(ValueError, match="multiples of 16"):
        T.encode(tm.__class__(**{**tm.__dict__, "strides": (24,)}))
