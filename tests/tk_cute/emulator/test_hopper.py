"""tk_cute.emulator.wgmma: the sm_90a warpgroup engine (wgmma, ldmatrix, stmatrix) on the CPU.

Hand-written PTX checks the descriptor layouts, the register fragments of ldmatrix / stmatrix,
imm-scale / scale-d and the hazards; then real kernels run captured (`launch.capture`, no
GPU) and must give the exact product, bit for bit, with no hazard: ladder levels 04-07,
tk_cute's dense GEMM (`kernels/gemm/gemm_sm90.py`: bf16, fp16, fp8, ragged shapes, C
transposed, 64-byte swizzle), two of the Hopper primitive kernels (B MN-major; A in registers
through ldmatrix) and, where ../shared/peers/cutlass/ is present, NVIDIA's Hopper GEMM with
M-major A, N-major B and an fp16 accumulator. Inputs are small integers: every product and
sum is exact in fp32, whatever order the tensor cores add in.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tk_cute.emulator import machine as M
from tk_cute.emulator import wgmma as W
from tk_cute.emulator.launch import Launch, Param, capture, capture_all
from tk_cute.emulator.memory import GlobalMemory

pytestmark = pytest.mark.slow  # the slow tier: `python -m pytest --full`

ROOT = Path(__file__).resolve().parents[3]
LADDER = ROOT / "examples" / "ladder"
PRIMITIVES = ROOT / "tests" / "tk_cute" / "ops" / "test_primitives_sm90.py"
PEER = next((p for p in (ROOT / ".peers", ROOT.parent / "shared" / "peers" / "cutlass")
             if (p / "dense_gemm_persistent_sm90.py").exists()),
            ROOT.parent / "shared" / "peers" / "cutlass") / "dense_gemm_persistent_sm90.py"


def _ints(dtype, *shape, lo=-4, hi=4):
    return torch.randint(lo, hi, shape).to(dtype)


def _run(launch, tensors, **options):
    """Run `launch` over `tensors` (CPU, placed at their own addresses)."""
    mem = GlobalMemory()
    for i, t in enumerate(tensors):
        mem.place(t.view(torch.uint8).numpy(), f"t{i}", address=t.data_ptr())
    return M.run(launch, mem, **options)


# --- descriptors: hand-computed addresses ---------------------------------------------------
def _desc(start=0, lbo=0, sbo=0, swizzle=0):
    mode = {0: 0, 128: 1, 64: 2, 32: 3}[swizzle]
    return (start >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | mode << 62


def test_descriptor_fields():
    # A descriptor of ladder level 04's PTX (`or.b64 %rd12, %rd22, 4611686293305360386`):
    # 128-byte swizzle, SBO 1024 (8 rows of 128 B), LBO 16 (unused), start 32 (K-step 1).
    assert W.decode_descriptor(0x4000004000010002) == {
        "start": 32, "lbo": 16, "sbo": 1024, "base_offset": 0, "swizzle": 128}
    assert W.decode_descriptor(_desc(0x1230, 0x40, 0x4560, 64)) == {
        "start": 0x1230, "lbo": 0x40, "sbo": 0x4560, "base_offset": 0, "swizzle": 64}


@pytest.mark.parametrize("swizzle, lbo, sbo, mn_major, rows, cases", [
    # K-major, 128-byte swizzle, rows 128 B apart, 8-row groups SBO = 1024 apart; the 16-byte
    # chunk index (address bits 4-6) XOR address bits 7-9:
    # (1, 0): 0x400 + 128 = 0x480, bits 7-9 = 1 -> chunk 0 ^ 1: 0x490
    # (1, 8): 0x480 + 16 = 0x490 -> chunk 1 ^ 1: 0x480
    # (9, 3): 0x400 + 1024 + 128 + 6 = 0x886, bits 7-9 = 1 -> 0x896
    # (63, 15): 0x400 + 7 * 1024 + 7 * 128 + 30 = 0x239E, bits 7-9 = 7, chunk 1 ^ 7 = 6: 0x23EE
    (128, 16, 1024, False, 64, [((0, 0), 0x400), ((1, 0), 0x490), ((1, 8), 0x480),
                                ((9, 3), 0x896), ((63, 15), 0x23EE)]),
    # K-major, 64-byte swizzle (rows 64 B apart, SBO 512): (3, 12): 0x400 + 192 + 24 = 0x4D8,
    # bits 7-8 = 1, chunk 1 ^ 1 = 0: 0x4C8; (8, 0): 0x400 + 512 = 0x600, bits 7-8 = 0
    (64, 16, 512, False, 64, [((3, 12), 0x4C8), ((8, 0), 0x600), ((2, 0), 0x490)]),
    # K-major, 32-byte swizzle (rows 32 B apart): (5, 9): 0x400 + 160 + 18 = 0x4B2, bit 7 = 1:
    # 0x4A2; (4, 8): 0x400 + 128 + 16 = 0x490, bit 7 = 1: 0x480
    (32, 16, 256, False, 64, [((5, 9), 0x4A2), ((4, 8), 0x480), ((3, 8), 0x470)]),
    # K-major, no swizzle: 8 x 16-byte core matrices, rows 16 B apart, the second 8 K LBO = 128
    # on, 8-row groups SBO = 256 apart: (9, 11): 0x400 + 16 + 256 + 128 + 6 = 0x596
    (0, 128, 256, False, 64, [((9, 11), 0x596), ((0, 8), 0x480), ((7, 7), 0x47E)]),
    # MN-major (B, 128 rows = N), 128-byte swizzle: 64 N contiguous (128 B), the next 64 LBO =
    # 8192 on; K rows 128 B apart, 8-row groups SBO = 1024 apart. (70, 9): 0x400 + 12 + 8192
    # + 128 + 1024 = 0x288C, bits 7-9 = 1, chunk 0 ^ 1: 0x289C; (1, 0): 0x402
    (128, 8192, 1024, True, 128, [((70, 9), 0x289C), ((1, 0), 0x402), ((0, 1), 0x490)]),
    # MN-major, no swizzle: 8 N (16 B) contiguous, the next 8 N SBO = 128 on, K rows 16 B
    # apart, the second 8 K LBO = 1024 on: (20, 10): 0x400 + 8 + 2 * 128 + 32 + 1024 = 0x928
    (0, 1024, 128, True, 64, [((20, 10), 0x928), ((7, 0), 0x40E), ((8, 0), 0x480)]),
])
def test_descriptor_layouts_hand_computed(swizzle, lbo, sbo, mn_major, rows, cases):
    pos = W.operand_offsets(_desc(0x400, lbo, sbo, swizzle), rows, 2, mn_major)
    assert pos.shape == (rows, 16, 2)
    for (r, k), addr in cases:
        assert pos[r, k, 0] == addr, (r, k, hex(int(pos[r, k, 0])), hex(addr))
        assert pos[r, k, 1] == addr + 1
    assert len(np.unique(pos)) == pos.size  # a bijection onto the tile's bytes


def test_fp8_k_major_rows_hold_32_elements():
    pos = W.operand_offsets(_desc(0x400, 16, 1024, 128), 64, 1, False)
    assert pos.shape == (64, 32, 1)
    assert pos[0, 31, 0] == 0x41F and pos[1, 16, 0] == 0x480  # (1, 16): 0x490, chunk 1 ^ 1


def test_register_fragment_maps():
    # Accumulator (ISA "wgmma 64xN D fragment"): thread 5 of warp 1 holds d0, d1 at row
    # 16 + 5 / 4 = 17, columns 2 (5 % 4) = 2, 3; d2, d3 eight rows down; d4 eight columns on.
    rows, cols = W.d_fragment(16)
    assert [(rows[1, i, 5], cols[1, i, 5]) for i in range(8)] == [
        (17, 2), (17, 3), (25, 2), (25, 3), (17, 10), (17, 11), (25, 10), (25, 11)]
    # 8-bit A: four consecutive K per register, the second register eight rows down.
    rows, cols = W.a_fragment("e4m3")
    assert [(rows[0, i, 6], cols[0, i, 6]) for i in (0, 3, 4, 8, 15)] == [
        (1, 8), (1, 11), (9, 8), (1, 24), (9, 27)]
    rows, cols = W.a_fragment("tf32")
    assert [(rows[3, i, 31], cols[3, i, 31]) for i in range(4)] == [
        (55, 3), (63, 3), (55, 7), (63, 7)]


# --- hand-written PTX ------------------------------------------------------------------------
HEADER = """.version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
"""


def _launch(body: str, params: list[tuple[str, int]], smem: int, threads: int = 128) -> Launch:
    """A one-CTA launch of kernel `k(params...)` (u64 values) with `body`."""
    decl = ", ".join(f".param .u64 {n}" for n, _ in params)
    ptx = HEADER + f".visible .entry k({decl})\n{{\n{body}\n}}\n"
    return Launch(arch="sm_90a", kernel="k", ptx=ptx, grid=(1, 1, 1), block=(threads, 1, 1),
                  cluster=(1, 1, 1), smem_bytes=smem, attributes={},
                  params=tuple(Param(n, "u64", 8, 8, int(v).to_bytes(8, "little"))
                               for n, v in params))


REGS = """
  .reg .b32 %r<40>;
  .reg .b64 %rd<20>;
  .reg .pred %p<4>;
  .reg .f32 %f<8>;
"""

# Each thread copies 4-byte words tid, tid + 128, ... of `src` into the dynamic shared memory.
COPY_IN = """
  mov.u32 %r1, %tid.x;
  ld.param.u64 %rd1, [src];
  mov.u32 %r2, smem;
$L_copy:
  setp.ge.u32 %p1, %r1, {words};
  @%p1 bra $L_done;
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  ld.global.u32 %r3, [%rd3];
  shl.b32 %r4, %r1, 2;
  add.s32 %r5, %r2, %r4;
  st.shared.u32 [%r5], %r3;
  add.s32 %r1, %r1, 128;
  bra $L_copy;
$L_done:
"""


def _mma_kernel(op: str, a_operand: str, imms: str, words: int, proxy_fence=True,
                wgmma_fence=True, early_read=False, a_regs: str = "") -> str:
    """A 64x8 wgmma: operands copied from global into shared memory, the accumulator set to
    1.0, one MMA (descriptors: the `da` / `db` parameters plus the shared address), each
    thread's 4 accumulators stored to out[tid]."""
    return REGS + COPY_IN.format(words=words) + (
        "  fence.proxy.async.shared::cta;\n" if proxy_fence else "") + f"""
  bar.sync 0;
  mov.f32 %f0, 0f3F800000;
  mov.f32 %f1, 0f3F800000;
  mov.f32 %f2, 0f3F800000;
  mov.f32 %f3, 0f3F800000;
  ld.param.u64 %rd4, [da];
  ld.param.u64 %rd5, [db];
  cvt.u64.u32 %rd6, %r2;
  shr.u64 %rd6, %rd6, 4;
  and.b64 %rd6, %rd6, 16383;
  add.s64 %rd4, %rd4, %rd6;
  add.s64 %rd5, %rd5, %rd6;
  ld.param.u64 %rd10, [scale_d];
  setp.ne.u64 %p2, %rd10, 0;
{a_regs}
""" + ("  wgmma.fence.sync.aligned;\n" if wgmma_fence else "") + f"""
  {op} {{%f0, %f1, %f2, %f3}}, {a_operand}, %rd5, %p2, {imms};
  wgmma.commit_group.sync.aligned;
""" + ("  add.f32 %f4, %f0, %f1;\n" if early_read else "") + """
  wgmma.wait_group.sync.aligned 0;
  mov.u32 %r1, %tid.x;
  ld.param.u64 %rd7, [out];
  mul.wide.u32 %rd8, %r1, 16;
  add.s64 %rd9, %rd7, %rd8;
  st.global.v4.f32 [%rd9], {%f0, %f1, %f2, %f3};
  ret;
"""


def _place(data: np.ndarray, pos: np.ndarray, image: np.ndarray):
    """Write operand `data` (rows, K) of 2-byte elements at byte offsets `pos` of `image`."""
    image[pos] = data.view(np.uint8).reshape(pos.shape)


def _accumulators(out: torch.Tensor) -> np.ndarray:
    """The (64, 8) accumulator from each thread's 4 registers (out: 128 x 4 fp32)."""
    rows, cols = W.d_fragment(8)
    d = np.zeros((64, 8), np.float32)
    d[rows, cols] = out.numpy().reshape(4, 32, 4).transpose(0, 2, 1)
    return d


MMA_BF16 = "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16"


@pytest.mark.parametrize("trans_a, trans_b, scale_a, scale_b, scale_d", [
    (0, 0, 1, 1, 1), (1, 0, -1, 1, 0), (0, 1, 1, -1, 1), (1, 1, -1, -1, 1)])
def test_wgmma_interleaved_layouts_scales_and_scale_d(trans_a, trans_b, scale_a, scale_b,
                                                      scale_d):
    """No-swizzle (interleaved) K- and MN-major operands, imm-scale -1, scale-d false / true
    (the accumulator starts at 1.0)."""
    at, bt = _ints(torch.bfloat16, 64, 16), _ints(torch.bfloat16, 8, 16)
    image = np.zeros(8192, np.uint8)
    # A at 0 (core-matrix groups 128 B apart along M: SBO; the two K halves LBO = 1024 apart);
    # B at 2048, LBO 256 / SBO 128.
    da, db = _desc(0, 1024, 128), _desc(2048, 256, 128)
    _place(at.view(torch.int16).numpy(), W.operand_offsets(da, 64, 2, bool(trans_a)), image)
    _place(bt.view(torch.int16).numpy(), W.operand_offsets(db, 8, 2, bool(trans_b)), image)
    src = torch.from_numpy(image)
    out = torch.full((128, 4), float("nan"))
    launch = _launch(_mma_kernel(MMA_BF16, "%rd4", f"{scale_a}, {scale_b}, {trans_a}, "
                                 f"{trans_b}", image.size // 4),
                     [("src", src.data_ptr()), ("out", out.data_ptr()), ("da", da),
                      ("db", db), ("scale_d", scale_d)], 8192)
    m = _run(launch, [src, out])
    assert m.hazards == []
    ref = scale_a * scale_b * at.double().numpy() @ bt.double().numpy().T + scale_d
    assert np.array_equal(_accumulators(out), ref.astype(np.float32))


def test_wgmma_register_a_fp8():
    """RS form, e4m3: each thread's 4 A registers loaded from global (the ISA's 8-bit A
    fragment: row 16 warp + lane / 4 (+ 8), column 4 (lane % 4) + byte (+ 16))."""
    at, bt = _ints(torch.float8_e4m3fn, 64, 32), _ints(torch.float8_e4m3fn, 8, 32)
    image = np.zeros(4096, np.uint8)
    db = _desc(1024, 16, 256, 32)  # B K-major, 32-byte swizzle: rows of 32 B
    image[W.operand_offsets(db, 8, 1, False)] = bt.view(torch.uint8).numpy()[..., None]
    src = torch.from_numpy(image)
    rows, cols = W.a_fragment("e4m3")  # (4 warps, 16 elements, 32 lanes)
    frag = at.view(torch.uint8).numpy()[rows, cols]  # byte j of register i: element 4i + j
    regs = torch.from_numpy(np.ascontiguousarray(frag.transpose(0, 2, 1)).reshape(128, 16))
    out = torch.full((128, 4), float("nan"))
    load_a = """
  mov.u32 %r1, %tid.x;
  ld.param.u64 %rd11, [areg];
  mul.wide.u32 %rd12, %r1, 16;
  add.s64 %rd13, %rd11, %rd12;
  ld.global.v4.u32 {%r20, %r21, %r22, %r23}, [%rd13];"""
    op = "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"
    launch = _launch(_mma_kernel(op, "{%r20, %r21, %r22, %r23}", "1, 1", image.size // 4,
                                 a_regs=load_a),
                     [("src", src.data_ptr()), ("out", out.data_ptr()), ("da", 0), ("db", db),
                      ("scale_d", 1), ("areg", regs.data_ptr())], 4096)
    m = _run(launch, [src, out, regs])
    assert m.hazards == []
    ref = at.double().numpy() @ bt.double().numpy().T + 1
    assert np.array_equal(_accumulators(out), ref.astype(np.float32))


@pytest.mark.parametrize("missing, kind", [
    ("proxy_fence", "proxy-fence"), ("wgmma_fence", "wgmma-fence"),
    ("early_read", "wgmma-register")])
def test_wgmma_hazards(missing, kind):
    """Generic stores read by the MMA without fence.proxy.async; an MMA with no wgmma.fence
    before it; an accumulator read between the MMA and its wait_group."""
    at, bt = _ints(torch.bfloat16, 64, 16), _ints(torch.bfloat16, 8, 16)
    image = np.zeros(9216, np.uint8)  # A: 64 rows of 128 B (128-byte swizzle); B: 8 rows
    da, db = _desc(0, 16, 1024, 128), _desc(8192, 16, 1024, 128)
    _place(at.view(torch.int16).numpy(), W.operand_offsets(da, 64, 2, False), image)
    _place(bt.view(torch.int16).numpy(), W.operand_offsets(db, 8, 2, False), image)
    src, out = torch.from_numpy(image), torch.full((128, 4), float("nan"))
    flags = {"proxy_fence": missing != "proxy_fence", "wgmma_fence": missing != "wgmma_fence",
             "early_read": missing == "early_read"}
    launch = _launch(_mma_kernel(MMA_BF16, "%rd4", "1, 1, 0, 0", image.size // 4, **flags),
                     [("src", src.data_ptr()), ("out", out.data_ptr()), ("da", da),
                      ("db", db), ("scale_d", 1)], image.size)
    m = _run(launch, [src, out])
    assert {h.kind for h in m.hazards} == {kind}
    ref = at.double().numpy() @ bt.double().numpy().T + 1
    assert np.array_equal(_accumulators(out), ref.astype(np.float32))  # the values still flow


# --- ldmatrix / stmatrix -------------------------------------------------------------------
def _matrix_kernel(count: int, trans: bool, generic: bool) -> str:
    """stmatrix x`count` of registers from `src` (lane-major, `count` per lane) to shared
    memory (matrix i at 128 i, rows 16 B apart), the bytes copied to `mem`, then ldmatrix of
    the same addresses back into registers, stored to `back` (`generic`: generic addresses,
    no state space in the opcodes)."""
    regs = ", ".join(f"%r{20 + i}" for i in range(count))
    space = "" if generic else ".shared"
    st = f"stmatrix.sync.aligned.m8n8.x{count}{'.trans' * trans}{space}.b16"
    ld = f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' * trans}{space}.b16"
    addr = "%rd11" if generic else "%r4"
    vec = "" if count == 1 else f".v{count}"
    return REGS + f"""
  mov.u32 %r1, %tid.x;
  ld.param.u64 %rd1, [src];
  mul.wide.u32 %rd2, %r1, {4 * count};
  add.s64 %rd3, %rd1, %rd2;
  ld.global{vec}.u32 {{{regs}}}, [%rd3];
  mov.u32 %r2, smem;
  shl.b32 %r3, %r1, 4;
  add.s32 %r4, %r2, %r3;
  cvt.u64.u32 %rd10, %r4;
  cvta.shared.u64 %rd11, %rd10;
  {st} [{addr}], {{{regs}}};
  bar.sync 0;
  shl.b32 %r5, %r1, 2;
  add.s32 %r6, %r2, %r5;
  ld.shared.u32 %r7, [%r6];
  ld.param.u64 %rd4, [mem];
  mul.wide.u32 %rd5, %r1, 4;
  add.s64 %rd6, %rd4, %rd5;
  st.global.u32 [%rd6], %r7;
  add.s32 %r8, %r6, 128;
  ld.shared.u32 %r9, [%r8];
  st.global.u32 [%rd6+128], %r9;
  add.s32 %r8, %r6, 256;
  ld.shared.u32 %r9, [%r8];
  st.global.u32 [%rd6+256], %r9;
  add.s32 %r8, %r6, 384;
  ld.shared.u32 %r9, [%r8];
  st.global.u32 [%rd6+384], %r9;
  {ld} {{{regs}}}, [{addr}];
  ld.param.u64 %rd7, [back];
  add.s64 %rd8, %rd7, %rd2;
  st.global{vec}.u32 [%rd8], {{{regs}}};
  ret;
"""


@pytest.mark.parametrize("count, trans, generic", [
    (1, False, False), (2, False, False), (4, False, False), (1, True, False),
    (2, True, False), (4, True, False), (4, True, True), (2, False, True)])
def test_stmatrix_then_ldmatrix(count, trans, generic):
    """Register i of lane l holds matrix i's (row l / 4, columns 2 (l % 4) + {0, 1}) (.trans:
    (rows 2 (l % 4) + {0, 1}, column l / 4)); rows of matrix i at the addresses of lanes
    8i .. 8i + 7. Values: 1000 i + 10 lane + half."""
    vals = np.array([[[1000 * i + 10 * lane + h for h in range(2)] for i in range(count)]
                     for lane in range(32)], np.uint16)  # (lane, register, half)
    src = torch.from_numpy(vals.reshape(-1).copy())
    mem = torch.zeros(256, dtype=torch.int16)  # 4 matrices x 8 rows x 8 b16
    back = torch.zeros(32 * count * 2, dtype=torch.int16)
    launch = _launch(_matrix_kernel(count, trans, generic),
                     [("src", src.data_ptr()), ("mem", mem.data_ptr()),
                      ("back", back.data_ptr())], 1024, threads=32)
    m = _run(launch, [src, mem, back])
    got = mem.view(torch.uint16 if hasattr(torch, "uint16") else torch.int16).numpy().astype(
        np.int64).reshape(4, 8, 8)
    for i in range(count):
        for r in range(8):
            for c in range(8):
                lane, h = (4 * c + r // 2, r % 2) if trans else (4 * r + c // 2, c % 2)
                assert got[i, r, c] == 1000 * i + 10 * lane + h, (i, r, c)
    assert (got[count:] == 0).all()
    # ldmatrix with the same .trans reads back each lane's registers
    assert np.array_equal(back.numpy().view(np.uint16).reshape(32, count, 2), vals)
    # (the copy-out reads all 4 matrices' bytes: those past `count` were never written)
    assert {h.kind for h in m.hazards} == ({"uninitialized-shared"} if count < 4 else set())


# --- captured kernels ---------------------------------------------------------------------
def _stream():
    from cuda.bindings import driver as cuda

    return cuda.CUstream(0)


def _ladder(level):
    sys.path.insert(0, str(LADDER))
    try:
        return importlib.import_module(level)
    finally:
        sys.path.remove(str(LADDER))


@pytest.mark.parametrize("level, shape, ctas, adversarial", [
    ("04_wgmma", (256, 128, 128), None, False),
    ("05_ring", (128, 256, 256), None, False),
    ("06_warp_specialized", (256, 256, 128), None, False),
    ("07_lcf_persistent", (256, 512, 128), 2, False),  # 4 tiles on 2 persistent CTAs
    ("07_lcf_persistent", (256, 512, 128), 2, True),  # random order, async ops held back
])
def test_ladder_level_is_exact(level, shape, ctas, adversarial):
    from cutlass.cute.runtime import from_dlpack

    lv = _ladder(level)
    m_, n_, k_ = shape
    a, b = _ints(torch.bfloat16, m_, k_, 1), _ints(torch.bfloat16, n_, k_, 1)
    c = torch.full((m_, n_, 1), float("nan"), dtype=torch.bfloat16)
    args = [from_dlpack(t, assumed_align=16) for t in (a, b, c)] + ([ctas] if ctas else [])
    launch = capture(getattr(lv, "gemm", None) or lv.kernel, *args, _stream(), arch="sm_90a")
    m = _run(launch, [a, b, c], adversarial=adversarial, seed=1)
    assert m.hazards == []
    ref = (a[..., 0].double() @ b[..., 0].double().T).to(torch.bfloat16)
    assert torch.equal(c[..., 0], ref)


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("shape, config", [
    ((128, 128, 64), {}),
    ((130, 72, 48), {}),  # ragged: TMA zero fill and clipped stores
    ((130, 72, 48), {"dtype": "float16", "out_dtype": "float16"}),
    ((128, 128, 64), {"dtype": "float16", "out_dtype": "float32"}),
    ((130, 72, 160), {"dtype": "float8_e4m3fn"}),
    ((96, 80, 64), {"dtype": "float8_e5m2", "out_dtype": "float32"}),
    ((72, 130, 48), {"TRANSPOSE_C": True, "Nb": 64, "EPI_N": 16}),  # stmatrix.trans
    ((130, 72, 96), {"Kb": 32}),  # 64-byte K rows: 64-byte swizzle
    # split-K: 3 ranges of 3, 3, 4 K steps on 2 CTAs (several units each), partial edge tiles;
    # transposed, with a shifted edge band; 5 ranges of 1-2 steps, fp32 C
    ((130, 72, 160), {"SPLIT_K": 3, "Kb": 16}),
    ((72, 200, 96), {"SPLIT_K": 2, "TRANSPOSE_C": True, "Nb": 64, "EPI_N": 16,
                     "SHIFT_EDGES": True}),
    ((64, 64, 112), {"SPLIT_K": 5, "Kb": 16, "Mb": 64, "Nb": 64, "EPI_PIPE_DEPTH": 2,
                     "out_dtype": "float32"}),
    ((64, 200, 96), {"SPLIT_K": 3, "Kb": 32, "Mb": 64, "Nb": 64, "EPI_PIPE_DEPTH": 2,
                     "CLUSTER_N": 2}),  # A multicast between the CTAs of one K range
    ((130, 72, 48), {"PDL": True}),  # a programmatic dependent (its wait, its trigger)
    ((130, 72, 160), {"SPLIT_K": 3, "Kb": 16, "PDL": True}),
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else
    ",".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_dense_gemm_is_exact(shape, config):
    """tk_cute's Hopper GEMM (`GemmSm90.call_ptrs`, 2 persistent CTAs; with split-K the plane
    sum after it) on CPU tensors."""
    from tk_cute.kernels.gemm import gemm_sm90 as G

    _dense_is_exact(G.Config(**config), shape)


@pytest.mark.parametrize("shape, plan, dtype, transposed", [
    ((130, 360, 64), (128, 176, (1, 1)), "bfloat16", False),  # 11 blocks of 16 columns
    ((200, 136, 128), (192, 128, (1, 1)), "float8_e4m3fn", False),  # three warpgroups, fp8
    ((96, 200, 48), (128, 96, (1, 1)), "bfloat16", True),  # C^T: 6 transposed blocks
])
def test_planned_epilogue_buffers_are_exact(shape, plan, dtype, transposed):
    """The plans' epilogue (`dense_sm90.plan_config`: a 16-bit C staged whole, one buffer per
    block) over several tiles per CTA, so each tile's blocks reuse the buffers the tile before
    stored from: C exact, no hazard."""
    from tk_cute.tuning import dense_sm90

    m_, n_, _ = shape
    cfg = dense_sm90.plan_config(DTYPES[dtype], torch.bfloat16, *(
        (n_, m_) if transposed else (m_, n_)), plan, transposed=transposed)
    assert cfg.EPI_PIPE_DEPTH == cfg.Nb // cfg.EPI_N
    _dense_is_exact(cfg, shape)


def test_split_k_is_exact_on_random_configs(seed):
    """Split-K on seeded random configs (tile, K step, ranges, C transposed, shifted edges,
    clusters) and ragged shapes, on 2-4 persistent CTAs (several units each)."""
    import random

    from tk_cute.kernels.gemm import gemm_sm90 as G

    rng = random.Random(seed)
    for _ in range(2):
        kb, cluster = rng.choice([16, 32, 64]), rng.choice([(1, 1), (1, 2), (2, 1)])
        k_ = rng.randrange(2, 9) * kb - rng.choice([0, 16 % kb])
        cfg = G.Config(Mb=rng.choice([64, 128]), Nb=rng.choice([64, 96, 128]), Kb=kb,
                       EPI_N=16, EPI_PIPE_DEPTH=2, TRANSPOSE_C=rng.random() < 0.5,
                       SHIFT_EDGES=rng.random() < 0.5, CLUSTER_M=cluster[0],
                       CLUSTER_N=cluster[1], SPLIT_K=rng.randrange(2, -(-k_ // kb) + 1))
        m_, n_ = rng.randrange(1, 161), rng.randrange(1, 21) * 8
        if cfg.TRANSPOSE_C:  # (C^T's rows, the kernel's M, are the 16-byte ones)
            m_, n_ = n_, rng.randrange(1, 161)
        print(cfg, (m_, n_, k_))
        _dense_is_exact(cfg, (m_, n_, k_), ctas=rng.choice([2, 4]))


def _dense_is_exact(cfg, shape, ctas=2):
    """Run `cfg`'s launches (`call_ptrs` on `ctas` SMs) over fresh small integers in a poisoned
    C (and workspace) and assert C is the exact product, with no hazard."""
    from tk_cute.kernels.gemm import gemm_sm90 as G

    m_, n_, k_ = shape
    cfg.check_k(k_)
    a, b = _ints(DTYPES[cfg.dtype], m_, k_), _ints(DTYPES[cfg.dtype], n_, k_)
    c = torch.full((n_, m_) if cfg.TRANSPOSE_C else (m_, n_), float("nan"),
                   dtype=DTYPES[cfg.out_dtype])
    ws = torch.full((max(cfg.workspace_bytes(m_, n_), 16) // 4,), float("nan"))
    values = {"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr(), "ws": ws.data_ptr(),
              "M": m_, "N": n_, "K": k_, "lda": k_, "ldb": k_,
              "ldc": m_ if cfg.TRANSPOSE_C else n_, "stream": 0}
    values = {n: values[n] for n in G.signature(cfg).names + ("stream",)}
    launches = capture_all(G.kernel_for(cfg).call_ptrs, ctas,
                           *G.signature(cfg).dsl_values(values), arch="sm_90a")
    assert len(launches) == (2 if cfg.SPLIT_K > 1 else 1)
    mem = GlobalMemory()
    for i, t in enumerate([a, b, c, ws]):
        mem.place(t.view(torch.uint8).numpy(), f"t{i}", address=t.data_ptr())
    for launch in launches:
        assert M.run(launch, mem).hazards == []
    ref = a.double() @ b.double().T
    assert torch.equal(c, (ref.T if cfg.TRANSPOSE_C else ref).to(c.dtype))


@pytest.fixture(scope="module")
def primitives():
    spec = importlib.util.spec_from_file_location("_hopper_primitives", PRIMITIVES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["ss_ab_bf16", "rs_ab_fp16", "ss_abt_e4m3"])
def test_primitive_mma_kernel_is_exact(primitives, name):
    """tests/tk_cute/ops' MMA kernels: B (K, N) N-major (imm-trans-b, 128-byte swizzle across
    two LBO blocks); A in registers through ldmatrix (RS); fp8."""
    P = primitives
    dtype, form, regs = P.MMA_CASES[name]
    k = 2 * P._kb(dtype)
    a = _ints(P.TORCH[dtype], P.MMA_M, k)
    b = _ints(P.TORCH[dtype], *((P.MMA_N, k) if form == "ABt" else (k, P.MMA_N)))
    c = torch.full((P.MMA_M, P.MMA_N), float("nan"))
    ptrs = [P._ptr(d, t) for t, d in ((a, dtype), (b, dtype), (c, P.F32))]
    launch = capture(P._mma_host, *ptrs, _stream(), form, regs, arch="sm_90a")
    m = _run(launch, [a, b, c])
    assert m.hazards == []
    bt = b.double().T if form == "ABt" else b.double()
    assert torch.equal(c, (a.double() @ bt).float())


@pytest.mark.parametrize("majors, acc", [(("m", "n"), "f32"), (("m", "k"), "f16")])
def test_nvidia_hopper_gemm_mn_major_is_exact(majors, acc):
    """NVIDIA's CuTe DSL Hopper GEMM (fp16): A M-major (imm-trans-a), B N- or K-major, fp32 or
    fp16 accumulators."""
    if not PEER.exists():
        pytest.skip(f"NVIDIA's example is absent (looked in .peers/ and {PEER.parent})")
    import cutlass
    from cutlass.cute.runtime import from_dlpack

    spec = importlib.util.spec_from_file_location("_hopper_peer", PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m_, n_, k_ = 128, 128, 64

    def matrix(rows, cols, mn_major):
        x = _ints(torch.float16, rows, cols)
        store = (x.t() if mn_major else x).contiguous().unsqueeze(0)
        view = store.permute(2, 1, 0) if mn_major else store.permute(1, 2, 0)
        return x, store, view

    a, sa, va = matrix(m_, k_, majors[0] == "m")
    b, sb, vb = matrix(n_, k_, majors[1] == "n")
    sc = torch.full((1, m_, n_), float("nan"), dtype=torch.float16)
    kern = mod.HopperWgmmaGemmPersistentKernel(
        {"f32": cutlass.Float32, "f16": cutlass.Float16}[acc], (128, 128), (1, 1), 1, True)
    launch = capture(kern, *(from_dlpack(t, assumed_align=16) for t in (va, vb,
                                                                       sc.permute(1, 2, 0))),
                     2, _stream(), arch="sm_90a")
    assert f".f{acc[1:]}.f16.f16" in launch.ptx
    m = _run(launch, [sa, sb, sc])
    assert m.hazards == []
    assert torch.equal(sc[0], (a.double() @ b.double().T).half())
