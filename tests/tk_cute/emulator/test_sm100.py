"""The tcgen05 kernels run on the CPU (`tk_cute.emulator`): NVIDIA's known-good block-scaled
GEMM, then tk_cute's sm100 kernel through the public dispatch on every target, then broken
variants of it, each of which the emulator must report.

Data is exactly representable (`emulator.gemm.random_operands`: every float32 sum exact), so
every element of D is compared with the exact reference bit for bit (NVFP4 D with the
quantizer's recipe); D is poisoned first; no hazard and no deadlock is allowed.
"""

import re
from pathlib import Path

import pytest
import torch

from tk_cute.emulator import gemm as G
from tk_cute.emulator.machine import Deadlock
from tk_cute.kernels.gemm import nvfp4_sm100 as K
from tk_cute.kernels.gemm import nvfp4_w4a16_sm100 as W
from tk_cute.ops import schedule

pytestmark = pytest.mark.slow  # the slow tier: `python -m pytest --full`

PEER = Path(__file__).resolve().parents[4] / "shared" / "peers" / "cutlass" / \
    "dense_blockscaled_gemm_persistent.py"


def clean(run, a, b, out="bfloat16", gs=None):
    ok, what = G.check(run, a, b, out, gs)
    assert ok, what
    assert run.hazards == [], [str(h) for h in run.hazards]


# --- a. NVIDIA's kernel, known to run correctly on B200 -------------------------------------
@pytest.mark.skipif(not PEER.exists(), reason=f"NVIDIA's example is not at {PEER} (the peers "
                    "folder beside the checkout holds it; a user's clone has none)")
@pytest.mark.parametrize("tile, cluster, clusters", [((256, 128), (2, 1), 74),
                                                     ((128, 128), (1, 1), 148),
                                                     ((256, 128), (2, 1), 1)])
def test_nvidia_blockscaled_gemm_matches_the_exact_product(tile, cluster, clusters):
    """sm_100a, as its file is (read-only test data): 256x128 pair tiles in 2x1 clusters,
    128x128 single-CTA tiles, and one cluster walking every tile."""
    import importlib.util

    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import OperandMajorMode
    from cutlass.cute.runtime import make_ptr
    from cutlass.tensor_utils import LayoutEnum

    from tk_cute import nvfp4
    from tk_cute.emulator import launch, machine
    from tk_cute.emulator.memory import GlobalMemory

    spec = importlib.util.spec_from_file_location("nvidia_blockscaled_peer", PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kern = mod.Sm100BlockScaledPersistentDenseGemmKernel(16, tile, cluster)
    M, N, Kd = 512, 384, 512
    a, b = G.random_operands(M, N, Kd, seed=11)
    a.global_scale.fill_(1.0)  # the example has no global scales
    b.global_scale.fill_(1.0)
    d = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    ptr = lambda dt, t, al: make_ptr(dt, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=al)
    fp4, sf = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    ln = launch.capture(kern, ptr(fp4, a.data, 32), ptr(fp4, b.data, 32), ptr(sf, a.scales, 16),
                        ptr(sf, b.scales, 16), ptr(cutlass.BFloat16, d, 16),
                        (OperandMajorMode.K, OperandMajorMode.K, LayoutEnum.ROW_MAJOR),
                        tuple(cutlass.Int32(x) for x in (M, N, Kd, 1)), clusters,
                        cuda.CUstream(0), arch="sm_100a")
    mem = GlobalMemory()
    G.place(mem, a, b, d)
    m = machine.run(ln, mem)
    assert m.hazards == []
    assert torch.equal(d, nvfp4.gemm(a, b, torch.float32).double().to(torch.bfloat16))


# --- c. tk_cute's kernel through the public dispatch ----------------------------------------
CASES = [
    # arch, M, N, K, out, extra: config overrides / clusters / batch / scale format
    ("sm_100a", 256, 256, 512, "bfloat16", {}),
    ("sm_100a", 300, 136, 512, "float16", {}),  # M and N tails
    ("sm_100a", 512, 512, 256, "bfloat16", {"clusters": 1}),  # several tiles per CTA
    ("sm_100a", 512, 512, 256, "bfloat16", {"clusters": 1, "acc": 1}),  # one accumulator
    ("sm_100a", 512, 256, 512, "bfloat16", {"sched": schedule.CLC}),
    ("sm_100a", 256, 256, 512, "nvfp4", {}),
    ("sm_100a", 128, 256, 256, "bfloat16", {"batch": 2}),
    ("sm_103a", 256, 256, 512, "nvfp4", {}),  # tcgen05.ld.red max
    ("sm_103a", 512, 384, 256, "bfloat16", {"sched": schedule.CLC, "clusters": 1}),
    ("sm_107a", 256, 256, 512, "bfloat16", {"sf": "ue5m3"}),
    # two M halves: Rubin's B collector fill / lastuse
    ("sm_107a", 512, 256, 512, "nvfp4", {"Mb": 512, "acc": 1, "depth": 4}),
    ("sm_107a", 200, 264, 512, "bfloat16", {"clusters": 1}),
    # any K % 16 (a last K stage partly zero-filled), any N (D rows padded then copied), fp32
    ("sm_100a", 100, 100, 48, "bfloat16", {}),
    ("sm_103a", 64, 200, 272, "float16", {}),
    ("sm_100a", 3, 1, 16, "float32", {}),
    ("sm_107a", 129, 36, 2880, "float32", {}),  # gpt-oss's K; > 256 KiB of shared memory
    ("sm_100a", 77, 40, 4112, "bfloat16", {"batch": 2}),
    ("sm_107a", 130, 48, 1040, "nvfp4", {}),
    # W4A16: bf16 activations, the weights decoded in the kernel (nvfp4_w4a16_sm100)
    ("sm_100a", 128, 128, 64, "bfloat16", {"act": "bf16"}),
    ("sm_100a", 300, 136, 1040, "bfloat16", {"act": "bf16"}),  # stages wrap, tails
    ("sm_103a", 1, 100, 48, "float32", {"act": "bf16"}),
    ("sm_107a", 129, 257, 272, "float16", {"act": "bf16", "sf": "ue5m3"}),
    ("sm_107a", 64, 128, 2880, "bfloat16", {"act": "bf16"}),
    ("sm_100a", 100, 72, 320, "bfloat16", {"act": "bf16", "batch": 2}),
    ("sm_103a", 256, 256, 512, "nvfp4", {"act": "bf16"}),  # fp32 D, then the quantizer
    # small M: the weights as the MMA's A (D stored transposed), split K (fp32 partial D's)
    ("sm_100a", 1, 300, 1040, "bfloat16", {"swap": True, "split": 3, "depth": 4}),
    ("sm_103a", 64, 520, 512, "float32", {"swap": True, "depth": 4}),
    ("sm_107a", 16, 256, 2880, "float16", {"swap": True, "split": 4, "depth": 4, "batch": 2}),
    ("sm_100a", 200, 136, 1040, "bfloat16", {"split": 4, "depth": 4}),
    ("sm_107a", 3, 100, 1040, "bfloat16", {"act": "bf16", "split": 5}),
    ("sm_100a", 5, 300, 1040, "bfloat16", {"act": "bf16", "swap": True, "x_rows": 16}),
    ("sm_103a", 40, 136, 272, "float32", {"act": "bf16", "swap": True, "x_rows": 32, "split": 2}),
    ("sm_107a", 100, 200, 512, "float16", {"act": "bf16", "swap": True, "x_rows": 64,
                                            "batch": 2}),
    ("sm_100a", 1, 3000, 2048, "bfloat16", {}),  # the model's pick for a decode call
]


def _run(arch, M, N, Kd, out, extra, **options):
    a, b = G.random_operands(M, N, Kd, batch=extra.get("batch"), activations=extra.get(
        "act", "nvfp4"), scale_format=extra.get("sf", "ue4m3"), seed=M + N + Kd)
    gs = torch.tensor(4.0) if out == "nvfp4" else None
    cfg = None
    if extra.get("act") == "bf16" and {"split", "swap"} & set(extra):
        cfg = W.Config(arch=arch, STAGES=4, out=out, sf=extra.get("sf", "ue4m3"),
                       SPLIT_K=extra.get("split", 1), swap_ab=extra.get("swap", False),
                       x_rows=extra.get("x_rows", 128))
    elif {"acc", "sched", "Mb", "depth", "swap", "split"} & set(extra):
        from tk_cute.tuning.sm100 import w4a4_config

        base = w4a4_config(arch, M, N, Kd, out, extra.get("sf", "ue4m3"))
        cfg = K.Config(**{**base.__dict__, "ACC_PIPE_DEPTH": extra.get("acc", 2),
                          "scheduler": extra.get("sched", base.scheduler),
                          "Mb": extra.get("Mb", base.Mb),
                          "LOAD_PIPE_DEPTH": extra.get("depth", base.LOAD_PIPE_DEPTH),
                          "swap_ab": extra.get("swap", False),
                          "SPLIT_K": extra.get("split", 1)})
    run = G.gemm(a, b, out, arch=arch, out_global_scale=gs, config=cfg,
                 clusters=extra.get("clusters"), **options)
    return run, a, b, gs


@pytest.mark.parametrize("arch, M, N, Kd, out, extra", CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{c[4]}-{i}" for i, c in
                              enumerate(CASES)])
def test_sm100_kernel_matches_the_exact_product(arch, M, N, Kd, out, extra):
    run, a, b, gs = _run(arch, M, N, Kd, out, extra)
    assert run.kernel == ("sm100_w4a16" if extra.get("act") == "bf16" else "sm100")
    clean(run, a, b, out, gs)


@pytest.mark.parametrize("seed", [1, 2])
def test_adversarial_schedule(seed):
    """Random warp order, asynchronous operations completed at random points: still exact,
    no hazard (one accumulator stage, several tiles per CTA: where the hand-off matters)."""
    run, a, b, gs = _run("sm_100a", 512, 512, 256, "bfloat16", {"clusters": 1, "acc": 1},
                         adversarial=True, seed=seed)
    clean(run, a, b)


def test_a_call_the_target_has_no_kernel_for():
    a, b = G.random_operands(64, 72, 48)  # NVFP4 D of N = 72: its 16-column scale blocks
    with pytest.raises(G.NoKernel, match="no kernel for this call on sm_100a.*N % 16"):
        G.gemm(a, b, "nvfp4", arch="sm_100a", out_global_scale=torch.tensor(1.0))


# --- d. broken variants: each one reported ------------------------------------------------
@pytest.fixture(scope="module")
def base():
    """One accumulator stage, several tiles per CTA, bf16 out (TMA stores): every mutation
    below has something to break."""
    return _run("sm_100a", 512, 512, 256, "bfloat16", {"clusters": 1, "acc": 1})


def _edit(ptx: str, pattern: str, repl, count: int | None = None) -> str:
    new, n = re.subn(pattern, repl, ptx, flags=re.M)
    assert n and (count is None or n == count), f"{pattern!r} matched {n} times"
    return new


def _first_wait_before(ptx: str, anchor: str) -> int:
    """Index in `ptx` of the last mbarrier parity wait before the first `anchor`."""
    return ptx.rfind("mbarrier.try_wait.parity", 0, ptx.index(anchor))


def _mutant(name: str, ptx: str) -> str:
    if name == "no-wait-ld":  # the defect read from the PTX on 2026-12-04
        return _edit(ptx, r"^\s*tcgen05\.wait::ld\.sync\.aligned;\n", "")
    if name == "wrong-scale-column":  # the MMA reads A's scales 4 columns on
        ptx = _edit(ptx, r"(\.reg \.b32 \t?%r<\d+>;)", r"\1\n\t.reg .b32 %mut;", 1)
        return _edit(ptx, r"^(\s*)(tcgen05\.mma[^\[]*\[[^\]]+\], [^,]+, [^,]+, [^,]+, )"
                          r"\[(%r\d+)\]", r"\1add.s32 %mut, \3, 4;\n\1\2[%mut]")
    if name in ("skipped-wait", "wrong-parity"):  # the MMA warp's wait on a loaded stage
        at = _first_wait_before(ptx, "tcgen05.cp")
        line_end = ptx.index("\n", at)
        line = ptx[at:line_end]
        if name == "skipped-wait":
            new = re.sub(r"mbarrier\.try_wait\.parity\.shared\.b64 (P1#?\d*|P1), .*",
                         r"setp.eq.u32 \1, 0, 0;", line.strip())
        else:
            new = re.sub(r", (%r\d+), 10000000;", r", 5, 10000000;", line.strip())
            assert new != line.strip()
        return ptx[:at] + new + ptx[line_end:]
    if name == "wrong-swizzle":  # the A descriptor says 64B swizzle, TMA wrote 128B
        return _edit(ptx, r"(or\.b64 \t?%rd\d+, %rd\d+, )4611756662049538048;",
                     r"\g<1>0x8000404000000000;")
    if name == "no-proxy-fence":  # the epilogue's stores reach the TMA store unfenced
        return _edit(ptx, r"^\s*fence\.proxy\.async\.shared::cta;\n", "")
    raise KeyError(name)


MUTANTS = {  # mutation -> what the emulator must report
    "no-wait-ld": "hazard:tmem-read-after-release",
    "wrong-scale-column": "wrong",
    "skipped-wait": "wrong|hazard:uninitialized",
    "wrong-parity": "wrong|deadlock|hazard",
    "wrong-swizzle": "wrong",
    "no-proxy-fence": "hazard:proxy-fence",
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_reported(base, name):
    run, a, b, _ = base
    ptx = _mutant(name, run.launch.ptx)
    assert ptx != run.launch.ptx
    try:  # adversarial: TMA and MMA complete late, a skipped wait reads what has not landed
        bad = G.replay(run, a, b, ptx, adversarial=True, seed=1)
    except Deadlock as e:
        assert "deadlock" in MUTANTS[name], str(e)
        assert "mbarrier" in str(e) and "PTX line" in str(e)  # names the barrier and the wait
        return
    ok, what = G.check(bad, a, b)
    kinds = {h.kind for h in bad.hazards}
    found = ("wrong" if not ok else "") + "".join(f" hazard:{k}" for k in sorted(kinds))
    assert any(alt.split(":")[0] in found and (":" not in alt or alt.split(":")[1] in found)
               for alt in MUTANTS[name].split("|")), f"{name}: {found or 'nothing reported'}"
    if MUTANTS[name] == "wrong":
        assert not ok, what


def test_unmutated_replay_is_clean(base):
    run, a, b, _ = base
    clean(G.replay(run, a, b), a, b)


def test_speed_256x256x512():
    """A 256x256x512 sm_100a GEMM in well under 10 s on one core (instruction rate: docs)."""
    run, a, b, _ = _run("sm_100a", 256, 256, 512, "bfloat16", {})
    assert run.seconds < 10, run.seconds
    assert run.machine.executed / run.seconds > 2000


# --- the whole grid of issue 49 (a sample of 120 calls; TK_CUTE_EMULATOR_GRID=1: all) -------
GRID_M = (1, 3, 16, 64, 100, 128, 129, 256, 300, 512)
GRID_N = (8, 136, 256, 1000)
GRID_K = (16, 48, 272, 1024)
GRID_OUT = ("bfloat16", "float16", "float32", "nvfp4")


def _grid():
    """Every target x mode x (M, N, K) of issue 49's grid, the output dtypes taken in turn (each
    dtype meets every target and mode, over a quarter of the shapes each), every seventh
    dense call batched."""
    import itertools

    shapes = list(itertools.product(GRID_M, GRID_N, GRID_K))
    for t, arch in enumerate(("sm_100a", "sm_103a", "sm_107a")):
        for a, act in enumerate(("nvfp4", "bf16")):
            for i, (m, n, k) in enumerate(shapes):
                out = GRID_OUT[(i + t + a) % len(GRID_OUT)]
                batch = 2 if i % 7 == 0 and out != "nvfp4" else None
                yield arch, act, out, m, n, k, batch


# The slow tier runs a fixed sample of 120 calls (seeded: every target, mode and output
# dtype, M, N and K value, and the configs the cost model picks across them);
# TK_CUTE_EMULATOR_GRID=1 runs all 960 (20-40 minutes on one core).
GRID = list(_grid())
GRID_CALLS = (GRID if __import__("os").environ.get("TK_CUTE_EMULATOR_GRID") else
              __import__("random").Random(49).sample(GRID, 120))


@pytest.mark.parametrize("arch, act, out, m, n, k, batch", GRID_CALLS)
def test_grid(arch, act, out, m, n, k, batch):
    """Every call the format allows on every target: D equals the exact reference (NVFP4 D
    bit for bit), poisoned first; no hazard, no deadlock; N % 16 != 0 with NVFP4 D: no
    kernel (the format's 16-column scale blocks)."""
    a, b = G.random_operands(m, n, k, activations=act, batch=batch, seed=m * 7 + n + k)
    gs = torch.tensor(4.0) if out == "nvfp4" else None
    if out == "nvfp4" and n % 16:
        with pytest.raises(G.NoKernel, match="N % 16"):
            G.gemm(a, b, out, arch=arch, out_global_scale=gs)
        return
    clean(G.gemm(a, b, out, arch=arch, out_global_scale=gs), a, b, out, gs)
