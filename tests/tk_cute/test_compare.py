"""`tk_cute.compare` (`python -m tk_cute compare`) and the notebook reprs of `Build` and
`Report`: compiled on the CPU, against a second tk_cute config, and against the CUTLASS peers
when `.peers/` holds them (never vendored)."""

import textwrap
from pathlib import Path

import pytest

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from tk_cute import compare
from tk_cute.compile import build

PEERS = Path(__file__).resolve().parents[2] / ".peers"
HOPPER_PEER = PEERS / "dense_gemm_persistent.py"
BLACKWELL_PEER = PEERS / "dense_blockscaled_gemm_persistent.py"


@cute.kernel
def _copy_kernel(x: cute.Tensor, y: cute.Tensor):
    i = cute.arch.block_idx()[0] * 128 + cute.arch.thread_idx()[0]
    y[i] = x[i] + 1.0


@cute.jit
def _copy(x: cute.Tensor, y: cute.Tensor):
    _copy_kernel(x, y).launch(grid=(x.shape[0] // 128, 1, 1), block=(128, 1, 1))


@pytest.fixture(scope="module")
def small_build():
    x = make_fake_tensor(cutlass.Float32, (cute.sym_int64(divisibility=128),), (1,),
                         assumed_align=16)
    return build(_copy, x, x, arch="sm_90a")


def test_build_repr_is_short_and_html_is_a_table(small_build):
    b = small_build
    text = repr(b)
    assert text.startswith("<Build sm_90a: 1 kernel, ") and "\n" not in text and len(text) < 200
    assert f"{b.kernel.registers} registers" in text and "0 spill bytes" in text
    html = b._repr_html_()
    assert html.count("<table>") == 2 and "<th>registers</th>" in html
    assert ".version" not in html and ".version" in b.ptx  # the PTX is one attribute away
    assert b.instruction_mix()["global load"] == (1, 1)
    assert b.instruction_mix()["global store"] == (1, 1)
    assert b.instruction_mix()["MMA"] == (0, 0)
    assert "<td>global load</td><td>1</td><td>1</td>" in html


def test_source_lines_by_role(tmp_path):
    f = tmp_path / "k.py"
    f.write_text(textwrap.dedent('''\
        # header comment
        import cutlass.cute as cute


        class Gemm:
            def __init__(self):
                self.x = 1

            @cute.kernel
            def kernel(self):
                # a comment
                pass

            @cute.jit
            def __call__(self, a):
                self.kernel().launch()
                return a
        '''))
    assert compare.source_lines([(str(f), "Gemm")]) == {
        "kernel files": 11, "kernel classes": 10, "@cute.kernel bodies": 3, "host launch": 4}
    with pytest.raises(ValueError, match="no class Other"):
        compare.source_lines([(str(f), "Other")])


@pytest.fixture(scope="module")
def rubin():
    return compare.compare("sm_107a", (8192, 8192, 8192))


def test_compare_rubin_against_a_second_config(rubin):
    ours, alt = rubin.sides
    assert alt.name == "tk_cute Mb=256,Nb=128,ACC_PIPE_DEPTH=2"
    rows = {r[0]: r[1:] for r in rubin.table().rows}
    assert rows["MMA"] == ["4 / 4", "2 / 2"]  # two M halves share B vs one 256-row MMA
    assert rows["tensor memory (columns)"] == [576, 288]
    assert rows["spill bytes"] == [0, 0]
    assert ours.source == alt.source and ours.source["@cute.kernel bodies"] > 0
    assert rows["source: kernel files (code lines)"][0] == ours.source["kernel files"]
    assert "time (us)" not in rows  # compile only without a GPU of the target
    assert repr(rubin).startswith("<Comparison sm_107a 8192x8192x8192: tk_cute vs ")
    assert "<table>" in rubin._repr_html_()


def test_compare_figure_draws_the_table(rubin):
    fig = rubin.figure()
    labels, values = fig.drawn["PTX instruction lines"]
    mma = labels.index("MMA")
    assert [v[mma] for v in values] == [4, 2]
    bars = [a for a in fig.axes[1].get_children() if a.get_gid() == "PTX instruction lines: "
            "tk_cute"]
    assert [p.get_width() for p in bars] == values[0]
    assert fig.drawn["resources"][1][1][2] == 288 / 4


def test_report_repr_and_html():
    from tk_cute import report
    from tk_cute.tuning.sm100 import w4a4_config

    r = report.report(w4a4_config("sm_107a", 8192, 8192, 8192), 8192, 8192, 8192)
    text = repr(r)
    assert text.startswith("<Report NVFP4 GEMM 8192x8192x8192 on sm_107a: tile 512x256x256")
    assert "TMEM 576/576" in text and "MODEL" in text and "\n" not in text
    assert isinstance(r, dict) and r["tmem_columns"] == 576
    assert "<td>tensor memory (columns)</td><td>576 / 576 exclusive</td>" in r._repr_html_()


@pytest.mark.parametrize("argv, message", [
    (["compare", "--arch", "sm_80"], "invalid choice: 'sm_80'"),
    (["compare", "--peer", "/nonexistent.py"], "no such file"),
    (["compare", "--alt", "Nb"], "expected KEY=VALUE"),
    (["compare", "--alt", "Nb=72", "--no-time"], "tile must be one of (64, 128, 192) rows"),
    (["compare", "--alt", "Nope=1", "--no-time"], "Nope"),
    (["compare", "--arch", "sm_107a", "--mnk", "256,256,100"], "K % 16 == 0"),
    (["compare", "--plot", "x.jpg"], "--plot must end in .png or .svg"),
    (["compare", "--arch", "sm_107a", "--peer", __file__], "defines no Sm100BlockScaled"),
])
def test_compare_usage_errors(usage_error, argv, message):
    usage_error(argv, message)


def test_compare_command_sm107a(tmp_path, capsys):
    from tk_cute.__main__ import main

    plot = tmp_path / "compare.png"
    assert main(["compare", "--arch", "sm_107a", "--alt", "Mb=256,Nb=256",
                 "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "tk_cute Mb=256,Nb=256" in out and "TMEM alloc / ld / cp" in out
    assert "compile only" in out and plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.skipif(not HOPPER_PEER.exists(), reason="CUTLASS Hopper peer not in .peers/")
def test_compare_hopper_peer():
    r = compare.compare("sm_90a", (8192, 8192, 8192), peer=str(HOPPER_PEER), time=False)
    ours, peer = r.sides
    assert peer.name == "CUTLASS dense_gemm_persistent.py"
    for side in r.sides:  # same tile, stages and register split
        assert side.build.instruction_mix()["setmaxnreg"] == (2, 2)
        assert side.build.kernel.registers == 168 and side.smem_bytes == 230400
    assert peer.source["kernel classes"] > 3 * ours.source["kernel classes"]


@pytest.mark.skipif(not BLACKWELL_PEER.exists(), reason="CUTLASS Blackwell peer not in .peers/")
def test_compare_blockscaled_peer_on_rubin():
    r = compare.compare("sm_107a", (8192, 8192, 8192), peer=str(BLACKWELL_PEER))
    ours, peer = r.sides
    assert peer.tmem_columns == 512 and ours.tmem_columns == 576  # the peer keeps sm_100 limits
    assert peer.build.instruction_mix()["MMA"][0] > 0 and peer.build.kernel.local_bytes == 0


def test_compare_help_says_the_peer_file_runs(capsys):
    """`--peer PATH` imports the file: its code runs in this process, and --help says so."""
    from tk_cute.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--peer PATH" in text and "RUN as Python code in this process" in text
    assert "pass only a file you trust" in text
