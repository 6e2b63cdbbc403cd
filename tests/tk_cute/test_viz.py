"""`tk_cute.viz`: each picture is drawn from the layout functions the kernels use; the data a
figure drew (`fig.drawn`) and its artists are checked against those functions and against
closed forms derived independently here."""

import io
import itertools
import json

import numpy as np
import pytest
import torch

import cutlass

from tk_cute import viz
from tk_cute.layouts import scales_sm100
from tk_cute.layouts.nvfp4_scales import blocked_offset, to_blocked
from tk_cute.ops.schedule import supergroup_coord
from tk_cute.types import st


def _artist(ax, gid):
    found = [a for a in ax.get_children() if a.get_gid() == gid]
    assert len(found) == 1, f"{len(found)} artists with gid {gid!r}"
    return found[0]


@pytest.mark.parametrize("M, K, element", [(256, 1024, (130, 600)), (200, 96, (199, 95)),
                                           (128, 64, (0, 0)), (384, 512, (257, 333))])
def test_scale_tiling_marks_the_byte_blocked_offset_names(M, K, element):
    fig = viz.scale_tiling_plot(M, K, element, stage=0)
    m, k = element
    off = blocked_offset(m, k // 16, M, K)
    atoms, inside, stage = fig.axes
    # the scale matrix picture: every cell's atom is blocked_offset // 512
    rows, cols = np.indices(fig.drawn["offset"].shape)
    assert (fig.drawn["offset"] == blocked_offset(rows, cols, M, K)).all()
    assert (atoms.images[0].get_array() == fig.drawn["offset"] // 512).all()
    star = _artist(atoms, "element")
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (k // 16, m)
    # inside the atom: the star sits at (byte % 16, byte // 16) of blocked_offset % 512
    star = _artist(inside, "element")
    x, y = star.get_xdata()[0], star.get_ydata()[0]
    assert fig.drawn["element"]["atom"] * 512 + y * 16 + x == off
    # ... and that byte of a real blocked scale tensor holds the element's scale
    sf = torch.randint(0, 256, (M, -(-K // 16)), dtype=torch.uint8)
    assert to_blocked(sf).flatten()[off] == sf[m, k // 16]
    # the stage panel: the TMEM groups tcgen05.cp gives each atom of one CTA's stage
    lane, column, _ = scales_sm100.tmem_address(m % 256, (k // 16) % 16, 256, 16, "SFA")
    assert (fig.drawn["element"]["lane"], fig.drawn["element"]["column"]) == (lane, column)
    assert fig.drawn["stage_groups"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert "MMA 1" in _artist(stage, "group 0,2").get_text()  # K = 128: two atoms per MMA


def test_scale_tiling_rejects_an_element_outside_and_a_k_off_the_scale_blocks():
    with pytest.raises(ValueError, match="outside"):
        viz.scale_tiling_plot(128, 64, (128, 0))
    with pytest.raises(ValueError, match="multiple of 16 .*got 1000"):
        viz.scale_tiling_plot(256, 1000, (0, 0))


def _swizzled(x, bits):
    """CuTe Swizzle<bits, 4, 3> of byte address x (16-byte units XOR 128-byte rows)."""
    return x ^ ((x & (((1 << bits) - 1) << 7)) >> 3)


@pytest.mark.parametrize("dtype, cols, bits", [(cutlass.BFloat16, 64, 3), (cutlass.BFloat16, 32, 2),
                                               (cutlass.Float8E4M3FN, 128, 3),
                                               (cutlass.Float32, 8, 1)])
def test_swizzle_plot_is_the_st_layout(dtype, cols, bits):
    tile = st(dtype, 16, cols)
    fig = viz.swizzle_plot(tile)
    row_bytes = cols * dtype.width // 8
    r, c = np.indices(fig.drawn["byte"].shape)
    assert (fig.drawn["byte"] == _swizzled(r * row_bytes + 16 * c, bits)).all()
    assert (fig.axes[0].images[0].get_array() == fig.drawn["slot"]).all()
    bank = fig.drawn["bank"]
    assert _artist(fig.axes[0], "chunk 3,1").get_text() == f"{bank[3, 1]}-{bank[3, 1] + 3}"


def test_128_byte_swizzle_spreads_a_chunk_column_over_all_banks():
    fig = viz.swizzle_plot(st(cutlass.BFloat16, 128, 64))
    slot = fig.drawn["slot"]
    assert (slot == np.arange(8)[None, :] ^ (np.arange(16)[:, None] % 8)).all()
    for c in range(8):  # 8 rows of one logical chunk: 8 distinct slots = all 32 banks
        assert sorted(slot[:8, c]) == list(range(8))


def test_unswizzled_tile_is_row_major():
    fig = viz.swizzle_plot(st(cutlass.Uint8, 16, 64, swizzle=False))
    assert fig.drawn["byte"].tolist() == [[64 * r + 16 * c for c in range(4)] for r in range(16)]


def test_tmem_plot_is_the_rubin_column_map():
    from tk_cute.kernels.gemm.nvfp4_sm100 import Config

    cfg = Config()
    fig = viz.tmem_plot(cfg)
    d = fig.drawn
    assert d["regions"] == {k: (r.offset, r.columns) for k, r in cfg.tmem.items()}
    assert d["regions"] == {"acc": (0, 512), "SFA": (512, 32), "SFB": (544, 32)}
    assert d["accumulators"] == {(0, 0): 0, (1, 0): 256} and d["capacity"] == 576
    top, low = fig.axes
    for name, (off, n) in d["regions"].items():
        if name != "acc":
            box = _artist(top, name)
            assert (box.get_x(), box.get_width()) == (off, n)
    assert _artist(top, "acc 1,0").get_x() == 256
    assert max(off + n for off, n in d["regions"].values()) == 576
    assert d["mma_columns"][("SFA", 1, 1)] == 512 + scales_sm100.mma_scale_column(
        "SFA", 1, 1, 256, 16, 128) == 536
    assert d["mma_columns"][("SFB", 0, 1)] == 560
    assert _artist(low, "SFB 1,0").get_x() == d["groups"][("SFB", 1, 0)] == 548


def test_tmem_plot_double_buffered_accumulators():
    from tk_cute.kernels.gemm.nvfp4_sm100 import Config

    d = viz.tmem_plot(Config(Mb=512, Nb=128, ACC_PIPE_DEPTH=2)).drawn
    # the fragment layout: M halves 128 columns apart, stages 256
    assert d["accumulators"] == {(0, 0): 0, (1, 0): 128, (0, 1): 256, (1, 1): 384}
    assert d["regions"]["SFB"] == (544, 16)


@pytest.mark.parametrize("m_tiles, n_tiles, ctas, sg, cluster",
                         [(64, 32, 132, 8, (1, 1)), (10, 7, 16, 4, (1, 1)), (8, 6, 12, 3, (2, 1)),
                          (3, 5, 100, 8, (1, 1))])
def test_schedule_plot_is_the_supergroup_walk(m_tiles, n_tiles, ctas, sg, cluster):
    fig = viz.schedule_plot(m_tiles, n_tiles, ctas, sg, cluster)
    owner, wave = fig.drawn["owner"], fig.drawn["wave"]
    cm, cn = cluster
    total = (m_tiles // cm) * (n_tiles // cn)
    persistent = min(total, ctas // (cm * cn))
    for k in range(total):  # linear index k goes to cluster k % P in its turn k // P
        x, y, _ = supergroup_coord(k, m_tiles // cm, n_tiles // cn, sg, min_=min)
        assert owner[x * cm, y * cn] == k % persistent and wave[x * cm, y * cn] == k // persistent
    assert (owner >= 0).all()  # every tile taken
    counts = np.bincount(owner.flatten()) // (cm * cn)
    assert counts.max() - counts.min() <= 1
    line = _artist(fig.axes[0], "path")
    assert list(zip(line.get_ydata(), line.get_xdata())) == fig.drawn["path"]
    assert fig.drawn["path"][0] == (0, 0)


@pytest.mark.parametrize("tiles, k_steps, ctas", [(96, 64, None), (64, 64, None), (3, 5, 7),
                                                 (224, 64, None), (1, 16, 4)])
def test_stream_k_plot_is_the_kernels_share_walk(tiles, k_steps, ctas):
    """Every unit's CTA is the one whose `stream_k_share` holds it (`stream_k_owner`); the grid
    defaults to `stream_k_grid`'s; a tile's parts are consecutive CTAs, its head first, and
    exactly the split tiles' heads are outlined."""
    from tk_cute.ops import schedule

    fig = viz.stream_k_plot(tiles, k_steps, ctas)
    d = fig.drawn
    grid = schedule.stream_k_grid(tiles, k_steps, 132) if ctas is None else ctas
    assert d["ctas"] == grid
    units = tiles * k_steps
    assert [schedule.stream_k_owner(u, grid, units) for u in range(units)] == (
        d["owner"].flatten().tolist())
    for t, held in enumerate(d["parts"]):
        assert held == list(range(held[0], held[-1] + 1))
        assert held[0] == schedule.stream_k_owner(t * k_steps, grid, units)
    heads = {a.get_gid() for a in fig.axes[0].patches if str(a.get_gid()).startswith("head")}
    assert heads == {f"head {t}" for t, held in enumerate(d["parts"]) if len(held) > 1}
    with pytest.raises(ValueError, match="1 <= ctas <= tiles x k_steps = 15, got 16"):
        viz.stream_k_plot(3, 5, 16)


def test_paths_plot_maps_the_dispatch():
    """The Hopper dispatch's regions (docs/design.md's table): small_m, register_a, the split
    tile up to 208 rows (as teams on few bands), dequantize on few bands beyond it, W4A16 and
    W4A4; the image's colours are the same paths."""
    fig = viz.paths_plot(8192, ms=[1, 16, 64, 129, 240], ns=[1024, 4000, 8192])
    d = fig.drawn
    want = {(1, 8192): "small_m", (16, 4000): "small_m", (16, 8192): "small_m",
            (64, 4000): "register_a", (64, 8192): "register_a", (129, 1024): "register_a_tiled",
            (240, 1024): "dequantize", (240, 8192): "register_a_tiled"}
    assert {k: d["paths"][k] for k in want} == want
    assert d["schedules"][(129, 8192)] == "Nb=144, stream-K"
    assert d["schedules"][(129, 1024)] == "Nb=144, stream-K teams"
    assert d["schedules"][(240, 8192)] == "Nb=128" and (240, 1024) not in d["schedules"]
    image = np.asarray(fig.axes[0].images[0].get_array())
    assert image.shape == (3, 5)
    assert [[d["legend"][int(v)] for v in row] for row in image] == [
        [d["paths"][(m, n)] for m in d["ms"]] for n in d["ns"]]
    assert viz.paths_plot(8192, w4a4=True, ms=[240], ns=[1024]).drawn["paths"][(240, 1024)] == \
        "dequantize"  # W4A4 too (its operands decode in one launch: tuning.sm90.DEQUANTIZE_PAIRED)
    with pytest.raises(ValueError, match="multiple of 16 .*got 100"):
        viz.paths_plot(100)


def test_dense_plan_plot_maps_the_tile_plan():
    """`tk_cute.gemm`'s plans (docs/design.md, the dense GEMM): 64-row tiles for few rows in
    1 x 4 clusters where 30 fit, 1 x 2 where 32 would not, 128-row tiles beyond 256 rows,
    transposed ones (C^T = B A^T) where the last 128-row band would lie mostly past M; the
    image's colours are the same plans."""
    fig = viz.dense_plan_plot(quads=30, ms=[16, 128, 257, 8192], ns=[4096, 8192, 16384])
    d = fig.drawn
    want = {(16, 8192): "64x128, cluster 1x4", (16, 16384): "64x128, cluster 1x2",
            (128, 4096): "64x128, cluster 1x4", (8192, 8192): "128x256, cluster 2x1",
            (257, 8192): "C^T: 128x144, cluster 1x2", (8192, 4096): "128x256, cluster 2x1"}
    assert {k: d["plans"][k] for k in want} == want
    image = np.asarray(fig.axes[0].images[0].get_array())
    assert image.shape == (3, 4)
    assert [[d["legend"][int(v)] for v in row] for row in image] == [
        [d["plans"][(m, n)] for m in d["ms"]] for n in d["ns"]]
    assert "30 resident 4-CTA clusters" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="sms and quads must be positive"):
        viz.dense_plan_plot(quads=0)


def _inside(fig, artists):
    """Each artist's drawn extent lies within the figure (what savefig writes: nothing
    clipped), after the figure's own layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box = fig.bbox
    for a in artists:
        e = a.get_window_extent(canvas.get_renderer())
        assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, (a, e)


def test_dense_plan_default_gives_each_plan_its_colour_and_fits_the_figure():
    """The default grid's 44 plans: 44 legend entries of 44 different colours (they shared 20),
    each the colour the image gives that plan; the title and legend drawn whole."""
    from matplotlib.colors import to_rgba

    fig = viz.dense_plan_plot()
    d, ax = fig.drawn, fig.axes[0]
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    colours = [to_rgba(h.get_facecolor()) for h in legend.legend_handles]
    assert labels == d["legend"] and len(labels) >= 40
    assert len(set(colours)) == len(labels)
    image = ax.images[0]
    rgba = image.cmap(image.norm(np.asarray(image.get_array())))
    for (i, n), (j, m) in itertools.product(enumerate(d["ns"]), enumerate(d["ms"])):
        assert tuple(rgba[i, j]) == colours[labels.index(d["plans"][(m, n)])]
    _inside(fig, [ax.title, legend])


@pytest.mark.parametrize("what", ["schedule", "stream-k"])
def test_draw_defaults_number_the_ctas_as_the_title_says(what):
    """`draw schedule` and `draw stream-k` with their defaults: the title promises CTA numbers,
    and every tile (schedule) or every CTA's share of a tile (stream-K) carries its CTA's
    number; where they cannot fit the title says so instead."""
    p = viz._parser()
    fig = viz.draw(p.parse_args([what, "--out", "x.png"]), p)
    ax, owner = fig.axes[0], fig.drawn["owner"]
    assert "number: the CTA" in ax.get_title()
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
             for t in ax.texts}
    if what == "schedule":
        want = {(m, n): str(owner[m, n]) for m, n in np.ndindex(owner.shape)}
    else:
        want = {(t, k): str(owner[t, k]) for t, k in np.ndindex(owner.shape)
                if k == 0 or owner[t, k] != owner[t, k - 1]}
    assert texts == want and len(want) > 100
    crowded = viz.schedule_plot(256, 256) if what == "schedule" else viz.stream_k_plot(600, 64)
    assert not crowded.axes[0].texts and "too many tiles to number" in (
        crowded.axes[0].get_title())


def _report(arch, m, n, k):
    from tk_cute import report

    return {"arch": arch, "mnk": (m, n, k), "tile_per_pair": "512x256x256",
            "roofline": report.roofline(arch, m, n, k)}


def test_roofline_plot_puts_the_model_under_the_roof():
    from tk_cute import report

    big, small = _report("sm_107a", 16384, 16384, 16384), _report("sm_107a", 128, 8192, 8192)
    fig = viz.roofline_plot([big, small], measured_us=[None, 100.0])
    x, y = fig.drawn["roof"]["sm_107a"]
    assert np.allclose(y, np.minimum(35e15, x * 22e12))
    assert report.ridge("sm_107a") == pytest.approx(35e15 / 22e12)
    (l0, i0, f0), (l1, i1, f1), (l2, i2, f2) = fig.drawn["points"]
    assert l0.endswith("(model)") and l2.endswith("(measured)")
    assert f0 == pytest.approx(35e15)  # compute-bound: at the peak
    assert f1 == pytest.approx(report.attainable("sm_107a", i1))  # memory-bound: on the slope
    assert f2 == pytest.approx(small["roofline"]["flops"] / 100e-6)
    star = _artist(fig.axes[0], l0)
    assert star.get_xdata()[0] == i0 and star.get_ydata()[0] == pytest.approx(35.0)


def test_speedup_plot_draws_baseline_over_variant():
    rows = [{"variant": v, "M": m, "N": 64, "K": 64, "us": us}
            for m in (1, 16) for v, us in (("cuBLAS bf16 (deq W)", 10.0 * m),
                                            ("tk_cute w4a16", 4.0 * m))]
    fig = viz.speedup_plot(rows)
    (line, _) = fig.axes[0].get_lines()[:2]
    assert line.get_label() == "tk_cute w4a16" and list(line.get_ydata()) == [2.5, 2.5]


def test_speedup_plot_wraps_panels_and_keeps_each_variants_colour():
    """Rows of at most SPEEDUP_COLUMNS panels (the last row's empty places hidden); a variant
    keeps its colour where a panel lacks another (humming fails on some layers), and the
    legend names every variant drawn in any panel."""
    rows = []
    for n in range(5):
        for m in (1, 16):
            rows.append({"variant": "cuBLAS bf16 (deq W)", "M": m, "N": 64 * (n + 1), "K": 64,
                         "us": 10.0})
            rows.append({"variant": "tk_cute w4a16", "M": m, "N": 64 * (n + 1), "K": 64,
                         "us": 5.0})
            if n != 4:
                rows.append({"variant": "humming NVFP4 w4a16", "M": m, "N": 64 * (n + 1),
                             "K": 64, "us": 8.0})
    fig = viz.speedup_plot(rows)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(fig.axes) == 2 * viz.SPEEDUP_COLUMNS and len(shown) == 5
    colours = {}
    for ax in shown:
        for line in ax.get_lines():
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert all(len(c) == 1 for c in colours.values())
    legend = [t.get_text() for t in shown[-1].get_legend().get_texts()]
    assert "humming NVFP4 w4a16" in legend and "tk_cute w4a16" in legend


@pytest.mark.parametrize("fmt, magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_figures_save_as_png_and_svg(fmt, magic):
    buf = io.BytesIO()
    viz.schedule_plot(4, 4, ctas=3).savefig(buf, format=fmt)
    assert buf.getvalue().startswith(magic)


def test_draw_command_writes_files(tmp_path, capsys):
    from tk_cute.__main__ import main

    results = tmp_path / "bench.json"
    results.write_text(json.dumps({"results": [
        {"variant": v, "M": m, "N": 8, "K": 8, "us": 1.0 + m} for m in (1, 2)
        for v in ("cuBLAS bf16 (deq W)", "tk_cute w4a4")]}))
    for argv in (["schedule", "--mnk", "1024,2048,64"], ["swizzle", "--dtype", "float8_e4m3fn",
                                                         "--shape", "64,128"],
                 ["scales", "--mk", "128,128", "--element", "5,17"], ["tmem"],
                 ["speedup", "--results", str(results)], ["paths", "--k", "2880", "--w4a4"],
                 ["dense-plan", "--quads", "30"]):
        out = tmp_path / f"{argv[0]}.svg"
        assert main(["draw", *argv, "--out", str(out)]) == 0
        assert out.read_text().lstrip().startswith("<?xml")
    assert "schedule: " in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["draw"], "the following arguments are required: WHAT"),
    (["draw", "tmem"], "the following arguments are required: --out"),
    (["draw", "nope", "--out", "x.png"], "invalid choice: 'nope'"),
    (["draw", "tmem", "--out", "x.jpg"], "--out must end in .png or .svg"),
    (["draw", "scales", "--element", "999,0", "--out", "x.png"], "outside the (256, 1024)"),
    (["draw", "scales", "--mk", "256,1000", "--out", "x.png"], "multiple of 16 (the scale "
                                                               "block), got 1000"),
    (["draw", "swizzle", "--shape", "12,64", "--out", "x.png"], "multiple of 8"),
    (["draw", "roofline", "--mnk", "256,256,100", "--out", "x.png"], "K % 16 == 0"),
    (["draw", "schedule", "--tile", "a,b", "--out", "x.png"], "comma-separated"),
    (["draw", "speedup", "--results", "/nonexistent.json", "--out", "x.png"], "cannot read"),
    (["draw", "paths", "--k", "100", "--out", "x.png"], "multiple of 16"),
    (["draw", "paths", "--sms", "0", "--out", "x.png"], "--sms must be positive"),
    (["draw", "dense-plan", "--quads", "0", "--out", "x.png"], "quads must be positive"),
])
def test_draw_usage_errors(usage_error, argv, message):
    usage_error(argv, message)


@pytest.mark.parametrize("text, message", [
    ('{"x": 1}', "a dict without 'results'"),
    ('[{"variant": "a", "M": 1}]', "row 0 must be a dict with variant, M, N, K, us; it lacks N, K"),
    ('{"results": [1, 2]}', "row 0 must be a dict"),
    ('{"results": []}', "non-empty list of rows"),
    ("not json", "Expecting value"),
])
def test_draw_speedup_names_what_is_wrong_with_the_results(usage_error, tmp_path, text, message):
    bad = tmp_path / "bench.json"
    bad.write_text(text)
    usage_error(["draw", "speedup", "--results", str(bad), "--out", str(tmp_path / "x.png")],
                f"cannot read bench results {str(bad)!r}: ")
    usage_error(["draw", "speedup", "--results", str(bad), "--out", str(tmp_path / "x.png")],
                message)


def test_draw_and_compare_name_a_missing_output_folder(usage_error, tmp_path):
    missing = tmp_path / "no" / "such"
    usage_error(["draw", "schedule", "--out", str(missing / "x.png")],
                f"the folder {str(missing)!r} does not exist")
    usage_error(["compare", "--plot", str(missing / "x.svg")],
                f"--plot {str(missing / 'x.svg')!r}: the folder {str(missing)!r} does not exist")


def test_tmem_map_draws_on_a_hopper_machine():
    """The TMEM map traces a tcgen05 MMA whatever GPU the process has: on a Hopper machine (the
    DSL's default target sm_90a) a direct trace was refused (seen on the H200)."""
    import os
    import subprocess
    import sys

    code = ("from tk_cute import viz; from tk_cute.tuning.sm100 import w4a4_config; "
            "print(viz.tmem_plot(w4a4_config('sm_107a', 8192, 8192, 8192))"
            ".drawn['accumulators'])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "CUTE_DSL_ARCH": "sm_90a"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "(1, 0): 256" in run.stdout
