"""Pictures of what tk_cute lays out, schedules and measures (matplotlib). Each function returns a
Figure (`.savefig` writes PNG or SVG; a notebook shows it inline) whose `drawn` attribute holds
the arrays it was drawn from, computed by the same layout functions the kernels use:

- `scale_tiling_plot`: the NVFP4 (M, K/16) scale matrix in 128x4 blocked atoms
  (`layouts.nvfp4_scales.blocked_offset`), where one element's scale byte lands, and how one K
  stage of the Blackwell/Rubin kernel puts its atoms in tensor memory (`layouts.scales_sm100`).
- `swizzle_plot`: which 16-byte chunk of an `st` tile row goes to which bank (`st.layout()`,
  evaluated by CuTe, swizzle included).
- `tmem_plot`: the tensor-memory column map of the NVFP4 kernel (`Config.tmem`, the accumulator
  fragment's own layout, the MMAs' scale columns): 576 columns on Rubin.
- `schedule_plot`: which persistent CTA takes which output tile, in the supergroup order of
  `ops.schedule.supergroup_coord` (the static scheduler's stride: one grid per wave).
- `stream_k_plot`: which CTA's stream-K share holds each (tile, K step) unit on the grid the
  host picks (`ops.schedule.stream_k_grid`, `stream_k_share`), which tiles are split and where
  their heads are.
- `roofline_plot`: kernel reports (`tk_cute.report.report`) on their target's roof (a MODEL).
- `speedup_plot(results)`: the NVFP4 bench's speedup over cuBLAS bf16 against M, one panel per
  (N, K), log-scaled M (`python -m tk_cute.bench nvfp4 --plot FILE`).
- `paths_plot`: which Hopper NVFP4 path `tk_cute.nvfp4.gemm` takes for each M x N at one K
  (`tuning.sm90.hopper_path`, the dispatch's own rules), and the tiled kernel's schedule.

`python -m tk_cute draw WHAT --out FILE` draws any of them (`main`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import numpy as np

# The bench's variants a reader compares, in legend order (others are drawn too, thinner).
MAIN_VARIANTS = ("tk_cute w4a16", "tk_cute w4a4", "humming NVFP4 w4a16",
                 "cuBLAS fp8 _scaled_mm", "speed of light: read W")
BANK_BYTES, BANKS, CHUNK_BYTES = 4, 32, 16  # shared memory: 32 banks of 4 bytes


def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        try:
            matplotlib.use("Agg")
        except Exception:  # noqa: BLE001 - an interactive backend already in use is fine
            pass
    import matplotlib.pyplot as plt

    return plt


def _figure(ncols: int, width: float, height: float, nrows: int = 1, **kw):
    plt = _pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kw)
    plt.close(fig)  # the caller shows or saves it; pyplot keeps no reference
    return fig, list(axes.flat)


# --------------------------------------------------------------------------- NVFP4 scales
def scale_tiling_plot(M: int = 256, K: int = 1024, element: tuple[int, int] = (130, 600),
                      stage: int = 1, arch: str = "sm_107a", Mb: int = 512, Kb: int = 256):
    """The blocked layout of an (M, K) operand's scales, one element's byte, one K stage.

    Args:
        M: rows of the operand.
        K: K extent in elements, a multiple of 16 (K / 16 scale columns).
        element: (m, k) of the element whose scale byte is marked (k in elements).
        stage: which K stage (Kb elements) of the kernel is outlined and mapped to TMEM.
        arch: target whose MMA K decides which atoms one MMA reads (sm_107a: 2 per MMA).
        Mb: output rows per CTA pair (Mb / 2 per CTA: the SFA rows of one stage).
        Kb: K elements per stage.

    Returns:
        The Figure; `fig.drawn` has "offset" (the padded (M, K/16) byte offsets), "atom"
        (offset // 512), "element" (m, kb, offset, atom, byte in atom, lane, column) and
        "stage_groups" (the stage's TMEM column group of each (band, chunk) atom).
    """
    from tk_cute.arch import target
    from tk_cute.layouts import nvfp4_scales as S
    from tk_cute.layouts import scales_sm100

    _check_k(K)
    rm, rk = S.blocked_dims(M, K)
    rows, cols = np.arange(rm * S.ATOM_ROWS)[:, None], np.arange(rk * S.ATOM_SF_COLS)[None, :]
    offset = S.blocked_offset(rows, cols, M, K)
    m, k = element
    kb = k // S.SF_VEC
    if not (0 <= m < M and 0 <= k < K):
        raise ValueError(f"element {element} is outside the ({M}, {K}) operand")
    off = int(S.blocked_offset(m, kb, M, K))
    byte = off % S.ATOM_BYTES
    cta_rows, kb_stage = Mb // 2, Kb // S.SF_VEC
    bands, chunks = -(-cta_rows // S.ATOM_ROWS), kb_stage // S.ATOM_SF_COLS
    groups = np.array([[scales_sm100.tmem_address(b * S.ATOM_ROWS, c * S.ATOM_SF_COLS, cta_rows,
                                                  kb_stage, "SFA")[1] // 4
                        for c in range(chunks)] for b in range(bands)])
    lane, column, _ = scales_sm100.tmem_address(m % cta_rows, kb % kb_stage, cta_rows, kb_stage,
                                                "SFA")
    per_mma = target(arch).nvfp4_mma_k // S.ATOM_K
    fig, (a0, a1, a2) = _figure(3, 17, 5.2, gridspec_kw={"width_ratios": [2.2, 1.2, 1.4]})
    fig.drawn = {"offset": offset, "atom": offset // S.ATOM_BYTES, "stage_groups": groups,
                 "element": {"m": m, "kb": kb, "offset": off, "atom": off // S.ATOM_BYTES,
                             "byte": byte, "lane": lane, "column": column}}

    a0.imshow(offset // S.ATOM_BYTES, aspect="auto", cmap="tab20", interpolation="nearest")
    for r in range(rm):
        for c in range(rk):
            if rm * rk <= 64:
                a0.text(c * 4 + 1.5, r * 128 + 64, f"atom {r * rk + c}", ha="center",
                        va="center", fontsize=7)
    a0.set_xticks(np.arange(-0.5, rk * 4, 4), minor=True)
    a0.set_yticks(np.arange(-0.5, rm * 128, 128), minor=True)
    a0.grid(which="minor", color="black", linewidth=1)
    k0 = stage * kb_stage
    a0.add_patch(_rect(k0 - 0.5, -0.5, min(kb_stage, rk * 4 - k0), min(cta_rows, rm * 128),
                       "stage", edgecolor="red", linewidth=2, fill=False))
    a0.plot([kb], [m], "k*", markersize=14, gid="element")
    a0.set(title=f"scales of an ({M}, {K}) operand: (M, K/16) in 128x4 atoms\n"
                 f"red: K stage {stage} of one CTA ({cta_rows} rows x {Kb} K)",
           xlabel="scale column kb = k // 16", ylabel="row m")

    inside = ((np.arange(S.ATOM_BYTES) % 16) // 4).reshape(32, 16)
    a1.imshow(inside, cmap="Pastel1", interpolation="nearest", aspect="auto")
    a1.plot([byte % 16], [byte // 16], "k*", markersize=14, gid="element")
    a1.set(title=f"inside atom {off // S.ATOM_BYTES} (32 x 16 bytes): the scale of\n"
                 f"{element} is byte {off} = {off // S.ATOM_BYTES} * 512 + {byte}",
           xlabel="byte % 16 = 4 * ((m // 32) % 4) + kb % 4", ylabel="byte // 16 = m % 32")

    a2.imshow(groups // per_mma, cmap="Set3", interpolation="nearest", aspect="auto")
    for b in range(bands):
        for c in range(chunks):
            g = groups[b, c]
            a2.text(c, b, f"cols {4 * g}-{4 * g + 3}\nMMA {c // per_mma}", ha="center",
                    va="center", fontsize=8, gid=f"group {b},{c}")
    a2.set(title=f"K stage in TMEM ({arch}): atom -> 4 SFA columns\nelement: lane {lane} "
                 f"(+32q), column {column}",
           xlabel="K chunk of 64 (4 scales)", ylabel="128-row band", xticks=range(chunks),
           yticks=range(bands))
    fig.tight_layout()
    return fig


def _check_k(K: int) -> None:
    if K < 16 or K % 16:
        raise ValueError(f"NVFP4 K must be a positive multiple of 16 (the scale block), got {K}")


def _rect(x, y, w, h, gid, **kw):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, gid=gid, **kw)


# --------------------------------------------------------------------------- swizzle
def swizzle_bytes(tile) -> np.ndarray:
    """Byte offset of every 16-byte chunk (row, chunk) of an `st` tile: its layout
    (`st.layout()`) and its swizzle, both evaluated by CuTe on the host (traced under
    `COMPILE_LOCK`: any thread may call it)."""
    import cutlass.cute as cute

    from tk_cute.compile import COMPILE_LOCK

    per = CHUNK_BYTES * 8 // tile.dtype.width  # elements per chunk
    coords = [(r, c * per, 0) for r in range(tile.rows) for c in range(tile.cols // per)]
    found = {}

    @cute.jit
    def trace():
        _evaluate_swizzle(tile, coords, found)

    with COMPILE_LOCK:
        trace()
    return np.array(found["bytes"]).reshape(tile.rows, tile.cols // per)


def _evaluate_swizzle(tile, coords, out):
    # A plain function (not rewritten by the DSL), run while `trace` is traced. The tile's
    # layout is swizzle o offset o (element layout); the swizzle acts on byte addresses.
    import cutlass.cute as cute

    layout, size = tile.layout(1), tile.dtype.width // 8
    if not tile.swizzle:
        out["bytes"] = [int(layout(c)) * size for c in coords]
        return
    bytes_ = cute.make_composed_layout(layout.inner, 0, cute.make_layout(2 * tile.bytes))
    out["bytes"] = [int(bytes_(int(layout.outer(c)) * size)) for c in coords]


def swizzle_plot(tile, rows: int = 16):
    """Which bank each 16-byte chunk of an `st` tile lands in, logically and physically.

    Args:
        tile: a `tk_cute.types.st` tile type (e.g. ``st(cutlass.BFloat16, 128, 64)``).
        rows: rows drawn (the swizzle repeats every 8 rows of 128 bytes).

    Returns:
        The Figure; `fig.drawn` has "byte" (rows, chunks) offsets, "slot" (the chunk's place in
        its 128-byte line: banks 4*slot .. 4*slot + 3) and "bank" (first bank).
    """
    byte = swizzle_bytes(tile)[:rows]
    slot = (byte // CHUNK_BYTES) % (128 // CHUNK_BYTES)
    bank = (byte // BANK_BYTES) % BANKS
    n_rows, chunks = byte.shape
    fig, (a0, a1) = _figure(2, 13, max(4.0, 0.32 * n_rows + 1.5))
    fig.drawn = {"byte": byte, "slot": slot, "bank": bank}
    a0.imshow(slot, cmap="tab10", vmin=0, vmax=9, interpolation="nearest", aspect="auto")
    for r in range(n_rows):
        for c in range(chunks):
            a0.text(c, r, f"{bank[r, c]}-{bank[r, c] + 3}", ha="center", va="center",
                    fontsize=7, gid=f"chunk {r},{c}")
    name = f"st({tile.dtype.__name__}, {tile.rows}, {tile.cols})"
    a0.set(title=f"{name}: banks of each 16-byte chunk\n(a column: 8 rows of one chunk, "
                 f"all 32 banks when swizzled)", xlabel="16-byte chunk of the row",
           ylabel="row", xticks=range(chunks), yticks=range(n_rows))
    lines = byte // 128
    first = int(lines.min())
    phys = np.full((int(lines.max()) - first + 1, 8), -1)
    label = {}
    for r in range(n_rows):
        for c in range(chunks):
            phys[lines[r, c] - first, slot[r, c]] = slot[r, c]
            label[(lines[r, c] - first, slot[r, c])] = f"r{r} c{c}"
    a1.imshow(np.ma.masked_less(phys, 0), cmap="tab10", vmin=0, vmax=9, aspect="auto",
              interpolation="nearest")
    for (y, x), text in label.items():
        a1.text(x, y, text, ha="center", va="center", fontsize=7)
    a1.set(title="shared memory: 128-byte lines (8 chunks = 32 banks)",
           xlabel="chunk slot in the line (banks 4s .. 4s+3)",
           ylabel=f"128-byte line (from byte {first * 128})", xticks=range(8))
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- tensor memory
def accumulator_columns(cfg) -> dict[tuple[int, int], int]:
    """{(M half, accumulator stage): first TMEM column} from the kernel's MMA fragment layout
    (`make_fragment_C` of its tiled MMA, evaluated by CuTe; the K = 64 and K = 128 block-scaled
    ops share this C layout)."""
    import cutlass
    import cutlass.cute as cute

    found = {}

    @cute.jit
    def trace():
        from tk_cute.ops import tcgen05 as tc

        mma = tc.tiled_mma(tc.block_scaled_op("sm_100a", cfg.Nb, cutlass.Float8E4M3FN))
        shape = mma.partition_shape_C((cfg.Mb, cfg.Nb))
        _evaluate_columns(mma.make_fragment_C(cute.append(shape, cfg.ACC_PIPE_DEPTH)).layout,
                          cfg, found)

    # Traced for a tcgen05 target whatever GPU this process has (a direct call would trace for
    # the current GPU, and on a Hopper machine the block-scaled op refuses sm_90a).
    from tk_cute.launcher import compile_locked

    compile_locked(trace, options="--gpu-arch sm_100a")
    return found


def _evaluate_columns(layout, cfg, out):
    for h in range(cfg.m_mmas):
        for s in range(cfg.ACC_PIPE_DEPTH):
            out[(h, s)] = int(layout((0, h, 0, s))) & 0xFFFF  # TMEM address: lane << 16 | column


def tmem_plot(cfg=None):
    """The tensor-memory column map of the NVFP4 GEMM (`kernels/gemm/nvfp4_sm100.Config`).

    Args:
        cfg: a Config (default: the Rubin config, 512 x 256 per pair, 576 columns).

    Returns:
        The Figure (the whole map above, the scale columns below); `fig.drawn` has "regions"
        ({name: (offset, columns)} of `cfg.tmem`), "accumulators" ({(M half, stage): column}),
        "groups" ({(operand, band, K chunk): first column of its 4}), "mma_columns"
        ({(operand, M half, MMA j): first scale column it reads}) and "capacity".
    """
    from tk_cute.arch import target
    from tk_cute.kernels.gemm.nvfp4_sm100 import Config
    from tk_cute.layouts import scales_sm100 as sf

    cfg = cfg or Config()
    regions = {name: (r.offset, r.columns) for name, r in cfg.tmem.items()}
    kb_stage, rows = cfg.Kb // 16, {"SFA": cfg.Mb // 2, "SFB": cfg.Nb}
    groups = {(op, b, c): regions[op][0] + sf.tmem_address(b * 128, 4 * c, rows[op], kb_stage,
                                                           op)[1]
              for op in rows for b in range(-(-rows[op] // 128)) for c in range(kb_stage // 4)}
    bands = {"SFA": cfg.m_mmas, "SFB": 1}  # M half h reads SFA band h; both read all of SFB
    mmas = {(op, b, j): regions[op][0] + sf.mma_scale_column(op, b, j, rows[op], kb_stage,
                                                             cfg.mma_k)
            for op in rows for b in range(bands[op]) for j in range(cfg.k_blocks)}
    cap = target(cfg.arch).tmem_columns
    fig, (top, low) = _figure(1, 14, 6.4, nrows=2, height_ratios=[1, 1.1])
    fig.drawn = {"regions": regions, "accumulators": accumulator_columns(cfg), "groups": groups,
                 "mma_columns": mmas, "capacity": cap}
    colors = {"acc": "#9ecae1", "SFA": "#fdae6b", "SFB": "#a1d99b"}
    for (h, s), col in sorted(fig.drawn["accumulators"].items()):
        top.add_patch(_rect(col, 0, cfg.Nb, 128, f"acc {h},{s}", facecolor=colors["acc"],
                            edgecolor="black"))
        top.text(col + cfg.Nb / 2, 64, f"accumulator: M half {h}, stage {s}\n{cfg.Nb} columns",
                 ha="center", va="center", fontsize=8)
    for name in rows:
        top.add_patch(_rect(*(regions[name][0], 0), regions[name][1], 128, name,
                            facecolor=colors[name], edgecolor="black"))
        top.text(regions[name][0] + regions[name][1] / 2, 64, name, ha="center", fontsize=8)
    for x, what in ((512, "512"), (cap, f"{cfg.arch}: {cap}")):
        top.axvline(x, color="red", linestyle="--", linewidth=1)
        top.text(x - 2, 131, what, color="red", ha="right", fontsize=8)
    top.set(xlim=(0, max(cap, cfg.tmem_columns_used) + 4), ylim=(0, 140), ylabel="lane",
            title=f"tensor memory of the NVFP4 GEMM on {cfg.arch}: tile {cfg.Mb}x{cfg.Nb}x"
                  f"{cfg.Kb} per pair, {cfg.tmem_columns_used} of {cap} columns")
    start = regions["SFA"][0]
    for (op, b, c), col in groups.items():
        low.add_patch(_rect(col, 0, 4, 1, f"{op} {b},{c}", facecolor=colors[op],
                            edgecolor="black"))
        low.text(col + 2, 0.5, f"{op}\nband {b}\nK {c}", ha="center", va="center", fontsize=7)
    for (op, b, j), col in mmas.items():
        width = 4 * cfg.mma_k // 64 * (1 if op == "SFA" else -(-cfg.Nb // 128))
        low.add_patch(_rect(col, -0.45, width, 0.35, f"MMA {op} {b},{j}", facecolor="white",
                            edgecolor="black"))
        low.text(col + width / 2, -0.28, f"MMA {j}" + (f", M half {b}" if op == "SFA" else ""),
                 ha="center", va="center", fontsize=7)
    low.set(xlim=(start, regions["SFB"][0] + regions["SFB"][1]), ylim=(-0.5, 1.05),
            yticks=[], xlabel="TMEM column (32-bit cells)",
            title=f"scale columns of one K stage: each 512-byte atom (128 rows x 4 scales) is "
                  f"4 columns (tcgen05.cp 32x128b.warpx4); MMA j (K = {cfg.mma_k}) starts at "
                  f"its box")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- tile schedule
def schedule_walk(m_tiles: int, n_tiles: int, ctas: int, supergroup: int = 8,
                  cluster: tuple[int, int] = (1, 1)) -> tuple[np.ndarray, np.ndarray]:
    """(owner, wave): the persistent cluster that takes each output tile and in which of its
    turns. The static scheduler launches P = min(clusters, ctas / cluster size) clusters;
    cluster c takes linear indices c, c + P, c + 2P, ... mapped to tiles by the kernels'
    `supergroup_coord`."""
    from tk_cute.ops.schedule import supergroup_coord

    cm, cn = cluster
    if m_tiles % cm or n_tiles % cn:
        raise ValueError(f"{m_tiles} x {n_tiles} tiles do not split into {cm} x {cn} clusters")
    clusters_m, clusters_n = m_tiles // cm, n_tiles // cn
    total = clusters_m * clusters_n
    persistent = min(total, ctas // (cm * cn))
    owner, wave = np.full((m_tiles, n_tiles), -1), np.full((m_tiles, n_tiles), -1)
    for k in range(total):
        x, y, _ = supergroup_coord(k, clusters_m, clusters_n, supergroup, min_=min)
        owner[x * cm:(x + 1) * cm, y * cn:(y + 1) * cn] = k % persistent
        wave[x * cm:(x + 1) * cm, y * cn:(y + 1) * cn] = k // persistent
    return owner, wave


def schedule_plot(m_tiles: int, n_tiles: int, ctas: int | None = None, supergroup: int = 8,
                  cluster: tuple[int, int] = (1, 1), follow: int = 0):
    """Which persistent CTA (cluster) takes which output tile, in supergroup order.

    Args:
        m_tiles, n_tiles: output tiles along M and N (e.g. M / Mb, N / Nb).
        ctas: persistent CTAs (default: sm_90a's SM count, `tk_cute.arch.target`: an H100/H200).
        supergroup: tile rows (clusters along M) per group.
        cluster: CTAs per cluster along (M, N).
        follow: the cluster whose walk is drawn as a path.

    Returns:
        The Figure; `fig.drawn` has "owner" and "wave" (m_tiles, n_tiles) arrays and "path"
        (the followed cluster's tiles in order).
    """
    if ctas is None:
        from tk_cute.arch import target

        ctas = target("sm_90a").sm_count
    owner, wave = schedule_walk(m_tiles, n_tiles, ctas, supergroup, cluster)
    order = np.argsort(wave[owner == follow], kind="stable")
    ms, ns = np.nonzero(owner == follow)
    path = [(int(ms[i]), int(ns[i])) for i in order]
    fig, (ax,) = _figure(1, min(16, 3 + 0.35 * n_tiles), min(14, 2 + 0.3 * m_tiles))
    fig.drawn = {"owner": owner, "wave": wave, "path": path}
    image = ax.imshow(wave, cmap="viridis", interpolation="nearest", aspect="auto")
    fig.colorbar(image, ax=ax, label="turn (wave) of the tile's CTA")
    numbered = _numbers_fit(fig, m_tiles, n_tiles, str(owner.max()))
    if numbered:
        for m in range(m_tiles):
            for n in range(n_tiles):
                ax.text(n, m, str(owner[m, n]), ha="center", va="center", fontsize=6,
                        color="white")
    for g in range(supergroup, m_tiles, supergroup):
        ax.axhline(g - 0.5, color="black", linewidth=1.5)
    ax.plot([n for _, n in path], [m for m, _ in path], "k-o", markersize=4, linewidth=1.5,
            gid="path")
    who = "cluster" if cluster != (1, 1) else "CTA"
    key = (f"number: the {who} that takes the tile" if numbered else
           f"too many tiles to number: fig.drawn['owner'] has each tile's {who}")
    ax.set(title=f"{m_tiles} x {n_tiles} tiles on {owner.max() + 1} persistent {who}s in "
                 f"supergroups of {supergroup} tile rows\n({key}; line: {who} {follow}'s "
                 f"walk)", xlabel="tile column (N)", ylabel="tile row (M)")
    fig.tight_layout()
    return fig


def _numbers_fit(fig, rows: int, cols: int, widest: str, points: float = 6) -> bool:
    """Whether labels of `points` size, `widest` the longest, fit the cells of a rows x cols
    image that fills about 3/4 of the figure (what the layout leaves the axes)."""
    width, height = fig.get_size_inches() * 72 * 0.75
    return height / rows >= points + 1 and width / cols >= 0.6 * points * len(widest)


# --------------------------------------------------------------------------- stream-K shares
def stream_k_walk(tiles: int, k_steps: int, ctas: int) -> tuple[np.ndarray, list]:
    """(owner, parts): the CTA whose equal stream-K share (`ops.schedule.stream_k_share`) holds
    each (tile, K step) unit, tiles in the kernels' order, and per tile the CTAs that hold a
    part of it, its head (the first part, which sums the others and stores the tile) first."""
    from tk_cute.ops.schedule import stream_k_share

    units = tiles * k_steps
    owner = np.empty(units, dtype=np.int64)
    for c in range(ctas):
        start, end = stream_k_share(c, ctas, units)
        owner[start:end] = c
    owner = owner.reshape(tiles, k_steps)
    return owner, [list(dict.fromkeys(row.tolist())) for row in owner]


def stream_k_plot(tiles: int, k_steps: int, ctas: int | None = None):
    """Stream-K (`StreamK`): which CTA takes which K steps of which tile.

    Args:
        tiles: output tiles (in the kernels' supergroup order), e.g. ceil(M / Mb) * ceil(N / Nb).
        k_steps: K steps per tile (K / Kb rounded up).
        ctas: the grid (default: `ops.schedule.stream_k_grid` on sm_90a's SM count, as the
            launches pick it).

    Returns:
        The Figure; `fig.drawn` has "owner" (tiles, k_steps), "parts" (per tile the CTAs
        holding it, head first) and "ctas".
    """
    from tk_cute.ops.schedule import stream_k_grid

    if tiles < 1 or k_steps < 1:
        raise ValueError(f"tiles and k_steps must be >= 1, got {tiles} and {k_steps}")
    if ctas is None:
        from tk_cute.arch import target

        ctas = stream_k_grid(tiles, k_steps, target("sm_90a").sm_count)
    if not 1 <= ctas <= tiles * k_steps:
        raise ValueError(f"a stream-K grid needs 1 <= ctas <= tiles x k_steps = "
                         f"{tiles * k_steps}, got {ctas}")
    owner, parts = stream_k_walk(tiles, k_steps, ctas)
    fig, (ax,) = _figure(1, min(14, 4 + 0.12 * k_steps), min(14, 2.5 + 0.18 * tiles))
    fig.drawn = {"owner": owner, "parts": parts, "ctas": ctas}
    ax.imshow(owner % 20, cmap="tab20", interpolation="nearest", aspect="auto", vmin=0, vmax=19)
    for t, held in enumerate(parts):  # the head's part of each split tile, outlined
        if len(held) > 1:
            k1 = int(np.count_nonzero(owner[t] == held[0]))
            ax.add_patch(_rect(-0.5, t - 0.5, k1, 1, f"head {t}", fill=False, linewidth=1.5))
    numbered = _numbers_fit(fig, tiles, 1, str(ctas - 1))  # (a number per share: rows decide)
    if numbered:
        for t in range(tiles):
            for k in range(k_steps):
                if k == 0 or owner[t, k] != owner[t, k - 1]:
                    ax.text(k, t, str(owner[t, k]), ha="left", va="center", fontsize=6)
    split = [p for p in parts if len(p) > 1]
    kind = "stream-K"
    key = ("colour and number: the CTA" if numbered else
           "colour: the CTA, 20 colours round; too many tiles to number")
    ax.set(title=f"{tiles} tiles x {k_steps} K steps on {ctas} CTAs ({kind}): {len(split)} "
                 f"tiles split, up to {max(map(len, parts))} parts\n({key}; outlined: a split "
                 f"tile's head, which adds the later parts)",
           xlabel="K step", ylabel="tile (supergroup order)")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- roofline
def roofline_plot(reports, measured_us=None):
    """Kernel reports on their target's roofline MODEL (vendor peaks, not a measurement).

    Args:
        reports: one `tk_cute.report.report` result or a list of them.
        measured_us: optional measured time per report (None entries skipped), drawn as
            circles beside the model's stars.

    Returns:
        The Figure; `fig.drawn` has "roof" ({arch: (intensity, FLOP/s)}) and "points"
        ([(label, intensity, FLOP/s)], model first, then the measured ones).
    """
    from tk_cute import report as R

    reports = [reports] if isinstance(reports, dict) else list(reports)
    measured_us = measured_us or [None] * len(reports)
    fig, (ax,) = _figure(1, 8, 5)
    x = np.logspace(0, 5, 400)
    roof, points = {}, []
    for arch in dict.fromkeys(r["arch"] for r in reports):
        roof[arch] = (x, R.attainable(arch, x))
        ax.loglog(x, roof[arch][1] / 1e15, label=f"roof {R.PEAKS[arch][2]}", gid=f"roof {arch}")
        ax.axvline(R.ridge(arch), color="gray", linestyle=":", linewidth=1)
    for r, us in zip(reports, measured_us):
        rf = r["roofline"]
        label = f"{r['arch']} {'x'.join(map(str, r.get('mnk', ())))} {r['tile_per_pair']}"
        points.append((label + " (model)", rf["intensity_flop_per_byte"],
                       rf["flops"] / (rf["time_us"] * 1e-6)))
        if us is not None:
            points.append((label + " (measured)", rf["intensity_flop_per_byte"],
                           rf["flops"] / (us * 1e-6)))
    for label, i, f in points:
        ax.plot([i], [f / 1e15], "*" if label.endswith("(model)") else "o", markersize=12,
                label=label, gid=label)
    fig.drawn = {"roof": roof, "points": points}
    ax.set(xlabel="arithmetic intensity (FLOP / byte of HBM traffic, each operand read once)",
           ylabel="PFLOP/s", title="roofline MODEL (vendor peaks; not a measurement)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- bench speedups
def speedup_plot(results: list[dict], baseline: str = "cuBLAS bf16 (deq W)",
                 variants: tuple[str, ...] | None = None):
    """Speedup over `baseline` against M, one panel per (N, K).

    Args:
        results: the bench's rows: dicts with variant, M, N, K, us.
        baseline: the variant every speedup divides (drawn as the line y = 1).
        variants: which variants to draw (default: MAIN_VARIANTS present in the results).

    Returns:
        The Figure; `fig.drawn` has "baseline" and "speedups" ({(N, K): {variant: [(M,
        speedup)]}}, the panels' lines).

    Raises:
        ValueError: `results` is not a list of such rows (the first bad row named).
    """
    _check_rows(results)
    times = {(r["variant"], r["M"], r["N"], r["K"]): r["us"] for r in results}
    panels = defaultdict(set)
    for r in results:
        panels[(r["N"], r["K"])].add(r["M"])
    panels = {nk: ms for nk, ms in panels.items() if len(ms) > 1}  # lines need two points
    present = {r["variant"] for r in results}
    variants = variants or tuple(v for v in MAIN_VARIANTS if v in present)
    speedups = {}
    for (N, K), ms in sorted(panels.items()):
        lines = {name: [(m, times[(baseline, m, N, K)] / times[(name, m, N, K)])
                        for m in sorted(ms)
                        if (name, m, N, K) in times and (baseline, m, N, K) in times]
                 for name in variants}
        speedups[(N, K)] = {name: pts for name, pts in lines.items() if pts}
    n = max(1, len(panels))
    cols = min(n, SPEEDUP_COLUMNS)
    rows = -(-n // cols)
    fig, axes = _figure(cols, 5 * cols, 4 * rows, nrows=rows, sharey=True)
    for ax in axes[n:]:  # the last row's empty places
        ax.set_visible(False)
    axes = axes[:n]
    fig.drawn = {"baseline": baseline, "speedups": speedups}
    for ax, ((N, K), lines) in zip(axes, speedups.items()):
        for name, pts in lines.items():  # one colour per variant in every panel
            ax.plot(*zip(*pts), marker="o", label=name, gid=f"N={N}, K={K}: {name}",
                    color=f"C{variants.index(name) % 10}")
        ax.axhline(1.0, color="black", linewidth=1, label=f"{baseline} = 1")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (activation rows)")
        ax.set_title(f"N={N}, K={K}")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[::cols]:
        ax.set_ylabel(f"speedup over {baseline}")
    legend = {}  # every variant drawn in any panel
    for ax in axes:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    axes[-1].legend(legend.values(), legend.keys(), fontsize=8)
    fig.tight_layout()
    return fig


SPEEDUP_COLUMNS = 4  # panels per row of `speedup_plot`
BENCH_KEYS = ("variant", "M", "N", "K", "us")  # what a bench result row must hold


def _check_rows(results) -> None:
    if not isinstance(results, list) or not results:
        raise ValueError(f"bench results must be a non-empty list of rows, got "
                         f"{str(results)[:80]}")
    for i, r in enumerate(results):
        missing = [k for k in BENCH_KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise ValueError(f"bench result row {i} must be a dict with {', '.join(BENCH_KEYS)}; "
                             f"it lacks {', '.join(missing)}: {str(r)[:80]}")


# The Hopper NVFP4 paths' colours (`paths_plot`), in `sm90_tuning.PATHS` order.
PATH_COLOURS = {"small_m": "#4c72b0", "register_a": "#55a868", "register_a_tiled": "#c44e52",
                "dequantize": "#ccb974"}


def _path_edges() -> set[int]:
    """The first M of each Hopper path's rows (`tuning.sm90`'s own constants)."""
    from tk_cute.kernels.gemm import nvfp4_register_a_sm90 as rs
    from tk_cute.tuning import sm90 as h

    return {h.RS_MIN_M, h.SMALL_M_TAIL_MAX_M + 1, h.SPLIT_TILE_MIN_M, rs.MAX_M + 1,
            h.SPLIT_TILE_MAX_M + 1}


def _default_ms() -> list[int]:
    """M from 1 to 8192, log-spaced, with each side of the dispatch's edges (`_path_edges`)."""
    ms = set(np.unique(np.round(np.geomspace(1, 8192, 48))).astype(int).tolist())
    edges = _path_edges()
    return sorted(ms | edges | {m - 1 for m in edges} | {64, 256})


def _default_ns() -> list[int]:
    """N from 128 to 32768, log-spaced whole 128-row bands, each beside a partial one (+ 64)."""
    bands = np.unique(np.round(np.geomspace(1, 256, 24))).astype(int)
    return sorted({128 * b for b in bands.tolist()} | {128 * b + 64 for b in bands.tolist()})


def paths_plot(K: int = 8192, w4a4: bool = False, sms: int | None = None,
               ms: list[int] | None = None, ns: list[int] | None = None):
    """Which Hopper path the NVFP4 dispatch takes at each M x N for one K.

    Args:
        K: the shared dimension (a multiple of 16).
        w4a4: NVFP4 activations (else bf16, W4A16).
        sms: the GPU's SM count (default: sm_90a's, an H100/H200).
        ms, ns: the activation rows and weight rows drawn (default: log-spaced from 1 and 128,
            the dispatch's M edges and partial weight bands included).

    Returns:
        The Figure; `fig.drawn` has "paths" ({(M, N): path}, from
        `tuning.sm90.hopper_path`), "schedules" ({(M, N): the tiled kernel's
        `register_a_tiled_config` as `nvfp4.gemm.tiled_schedule` words it, e.g. "Nb=144,
        stream-K teams"} where that path runs), "ms", "ns".
    """
    from tk_cute.nvfp4.gemm import tiled_schedule
    from tk_cute.tuning import sm90 as sm90_tuning

    _check_k(K)
    if sms is None:
        from tk_cute.arch import target

        sms = target("sm_90a").sm_count
    ms, ns = sorted(ms or _default_ms()), sorted(ns or _default_ns())
    if min(ms) < 1 or min(ns) < 1:
        raise ValueError(f"M and N must be positive, got M from {min(ms)} and N from {min(ns)}")
    paths, schedules = {}, {}
    for m in ms:
        for n in ns:
            path = paths[(m, n)] = sm90_tuning.hopper_path(w4a4, m, n, K, sms)
            if path == "register_a_tiled":
                cfg = sm90_tuning.register_a_tiled_config(m, n, K, "bfloat16", sms)
                schedules[(m, n)] = tiled_schedule(cfg)
    names = [p for p in PATH_COLOURS if p in set(paths.values())]
    index = np.array([[names.index(paths[(m, n)]) for m in ms] for n in ns])
    fig, (ax,) = _figure(1, 11, 6)
    fig.drawn = {"paths": paths, "schedules": schedules, "ms": ms, "ns": ns}
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ax.imshow(index, cmap=ListedColormap([PATH_COLOURS[p] for p in names]), vmin=-0.5,
              vmax=len(names) - 0.5, aspect="auto", origin="lower", interpolation="nearest")
    edges = _path_edges()
    xs = [i for i, m in enumerate(ms) if i % 6 == 0 or m in edges]
    ax.set_xticks(xs, [str(ms[i]) for i in xs], fontsize=7, rotation=90)
    ys = [i for i, n in enumerate(ns) if n % 128 == 0][::3]
    ax.set_yticks(ys, [str(ns[i]) for i in ys], fontsize=7)
    fig.drawn["legend"] = names  # the image's value i is path names[i]
    ax.legend(handles=[Patch(color=PATH_COLOURS[p], label=p) for p in names], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set(xlabel="M (activation rows)",
           ylabel="N (weight rows: whole bands and N + 64)",
           title=f"tk_cute.nvfp4.gemm on Hopper ({sms} SMs), {'W4A4' if w4a4 else 'W4A16'}, "
                 f"K = {K}: the path of each M x N")
    fig.tight_layout()
    return fig


def dense_plan_plot(sms: int | None = None, quads: int | None = None,
                    ms: list[int] | None = None, ns: list[int] | None = None):
    """The tile and cluster `tk_cute.gemm` plans at each M x N (`dense_tuning.tile_plan`: rows
    x columns of the tile, cluster shape; "C^T" where `dense_tuning.swap_plan` swaps A and B,
    its tile then N x M; the plan does not depend on K; operand rows on L2 lines).

    Args:
        sms: the GPU's SM count (default: sm_90a's, an H100/H200).
        quads: the 4-CTA clusters the GPU holds at once (`runtime.resident_clusters`; default
            sms // 4; the H200 holds 30).
        ms, ns: the output rows and columns drawn (default: log-spaced from 1 and 64, each side
            of the few-rows edges and of whole 256-wide tiles).

    Returns:
        The Figure; `fig.drawn` has "plans" ({(M, N): "Mb x Nb, cluster CMxCN"}), "legend"
        (the image's value i is plan legend[i]), "ms", "ns".
    """
    from tk_cute.tuning import dense_sm90 as dense_tuning

    if sms is None:
        from tk_cute.arch import target

        sms = target("sm_90a").sm_count
    if sms < 1 or (quads is not None and quads < 1):
        raise ValueError(f"sms and quads must be positive, got {sms} and {quads}")
    edges = {64, 128, dense_tuning.FEW_ROWS_MAX_M, dense_tuning.SWAP_MAX_M}
    ms = sorted(ms or set(np.unique(np.round(np.geomspace(1, 8192, 40))).astype(int).tolist())
                | edges | {m + 1 for m in edges})
    ns = sorted(ns or set(np.unique(np.round(np.geomspace(64, 32768, 28) / 8) * 8).astype(
        int).tolist()))
    if min(ms) < 1 or min(ns) < 1:
        raise ValueError(f"M and N must be positive, got M from {min(ms)} and N from {min(ns)}")

    def words(plan):
        transposed, (mb, nb, (cm, cn)) = plan
        return f"{'C^T: ' if transposed else ''}{mb}x{nb}, cluster {cm}x{cn}"

    def plan(m, n):
        swap = dense_tuning.swap_plan(m, n, sms, quads)
        return (True, swap) if swap else (False, dense_tuning.tile_plan(m, n, sms, quads=quads))

    raw = {(m, n): plan(m, n) for m in ms for n in ns}
    names = [words(p) for p in sorted(set(raw.values()))]
    plans = {k: words(p) for k, p in raw.items()}
    index = np.array([[names.index(plans[(m, n)]) for m in ms] for n in ns])
    columns = -(-len(names) // LEGEND_ROWS)  # legend columns: the figure widens for each
    fig, (ax,) = _figure(1, 8 + 2.2 * columns, 6)
    colours = distinct_colours(len(names))
    fig.drawn = {"plans": plans, "legend": names, "colours": colours, "ms": ms, "ns": ns}
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ax.imshow(index, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(names) - 0.5,
              aspect="auto", origin="lower", interpolation="nearest")
    xs = [i for i, m in enumerate(ms) if i % 5 == 0 or m in edges]
    ax.set_xticks(xs, [str(ms[i]) for i in xs], fontsize=7, rotation=90)
    ys = list(range(0, len(ns), 3))
    ax.set_yticks(ys, [str(ns[i]) for i in ys], fontsize=7)
    ax.legend(handles=[Patch(color=c, label=n) for c, n in zip(colours, names)], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=columns)
    quads_seen = sms // 4 if quads is None else quads
    ax.set(xlabel="M (rows of A and C)", ylabel="N (rows of B, columns of C)",
           title=f"tk_cute.gemm's tile plan on Hopper ({sms} SMs, {quads_seen} resident 4-CTA "
                 f"clusters):\nrows x columns, cluster (C^T: A and B swapped)")
    fig.tight_layout()
    return fig


LEGEND_ROWS = 22  # legend entries per column that fit a 6-inch figure at 7 points


def distinct_colours(n: int) -> list:
    """`n` different RGBA colours: matplotlib's qualitative tab20, tab20b and tab20c (60), and
    beyond 60 evenly spaced samples of the turbo map."""
    from matplotlib import colormaps

    if n > 60:
        return [tuple(c) for c in colormaps["turbo"](np.linspace(0, 1, n))]
    pool = [colormaps[name](i) for name in ("tab20", "tab20b", "tab20c") for i in range(20)]
    return pool[:n]


# --------------------------------------------------------------------------- command line
DRAWINGS = {
    "scales": "NVFP4 scale factors in 128x4 blocked atoms, one element's byte, a K stage in TMEM",
    "swizzle": "banks of the 16-byte chunks of a swizzled shared tile (st)",
    "tmem": "tensor-memory column map of the Blackwell/Rubin NVFP4 GEMM",
    "schedule": "which persistent CTA takes which output tile (supergroup order)",
    "stream-k": "which CTA's stream-K share holds which K steps of which tile",
    "roofline": "a kernel report on its target's roofline model (compiles the kernel)",
    "speedup": "the NVFP4 bench's speedup over cuBLAS bf16 against M (from --json results)",
    "paths": "which Hopper NVFP4 path the dispatch takes at each M x N for one K",
    "dense-plan": "which tile and cluster tk_cute.gemm plans at each M x N",
}
DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn")


def _ints(count: int):
    def parse(text: str):
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {count} comma-separated integers, got "
                                             f"{text!r}") from None
        if len(values) != count or min(values) < (0 if count == 2 else 1):
            raise argparse.ArgumentTypeError(f"expected {count} comma-separated "
                                             f"{'non-negative' if count == 2 else 'positive'} "
                                             f"integers, got {text!r}")
        return values

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tk_cute draw",
                                description="Draw a picture of a tk_cute layout, schedule or "
                                            "result into a PNG or SVG file.")
    sub = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    for name, desc in DRAWINGS.items():
        s = sub.add_parser(name, help=desc, description=desc)
        s.add_argument("--out", required=True, help="output file (.png or .svg)")
        if name == "scales":
            s.add_argument("--mk", type=_ints(2), default=(256, 1024), help="M,K of the operand")
            s.add_argument("--element", type=_ints(2), default=(130, 600), help="m,k")
            s.add_argument("--stage", type=int, default=1)
        elif name == "swizzle":
            s.add_argument("--dtype", choices=DTYPES, default="bfloat16")
            s.add_argument("--shape", type=_ints(2), default=(64, 64), help="rows,cols")
        elif name == "schedule":
            s.add_argument("--mnk", type=_ints(3), default=(8192, 8192, 8192), help="M,N,K")
            s.add_argument("--tile", type=_ints(2), default=(128, 256), help="Mb,Nb")
            s.add_argument("--ctas", type=int, default=None,
                           help="persistent CTAs (default: sm_90a's SM count)")
            s.add_argument("--supergroup", type=int, default=8)
        elif name == "stream-k":
            s.add_argument("--mnk", type=_ints(3), default=(257, 8192, 8192), help="M,N,K")
            s.add_argument("--tile", type=_ints(3), default=(128, 256, 64), help="Mb,Nb,Kb")
            s.add_argument("--ctas", type=int, default=None,
                           help="the grid (default: stream_k_grid on sm_90a's SM count)")
        elif name in ("tmem", "roofline"):
            s.add_argument("--arch", choices=("sm_100a", "sm_103a", "sm_107a"),
                           default="sm_107a")
            s.add_argument("--mnk", type=_ints(3), default=(16384, 16384, 16384), help="M,N,K")
        elif name == "paths":
            s.add_argument("--k", type=int, default=8192, help="K (a multiple of 16)")
            s.add_argument("--w4a4", action="store_true", help="NVFP4 activations")
            s.add_argument("--sms", type=int, default=None, help="SMs (default: sm_90a's)")
        elif name == "dense-plan":
            s.add_argument("--sms", type=int, default=None, help="SMs (default: sm_90a's)")
            s.add_argument("--quads", type=int, default=None,
                           help="4-CTA clusters the GPU holds at once (default: SMs / 4; the "
                                "H200: 30)")
        elif name == "speedup":
            s.add_argument("--results", required=True, help="JSON of `tk_cute.bench nvfp4 "
                                                            "--json`")
    return p


def draw(args, parser):
    """The Figure `args` (parsed by `_parser`) asks for; usage errors go to `parser.error`."""
    if args.what == "scales":
        (M, K), (m, k) = args.mk, args.element
        try:
            return scale_tiling_plot(M, K, (m, k), args.stage)
        except ValueError as e:
            parser.error(str(e))
    if args.what == "swizzle":
        import cutlass

        from tk_cute.kernels.gemm.gemm_sm90 import INPUT_TYPES, OUTPUT_TYPES
        from tk_cute.types import st

        dtype = {**INPUT_TYPES, **OUTPUT_TYPES, "float32": cutlass.Float32}[args.dtype]
        try:
            return swizzle_plot(st(dtype, *args.shape))
        except ValueError as e:
            parser.error(str(e))
    if args.what == "schedule":
        (M, N, _), (Mb, Nb) = args.mnk, args.tile
        if (args.ctas is not None and args.ctas < 1) or args.supergroup < 1 or Mb < 1 or Nb < 1:
            parser.error("--ctas, --supergroup and --tile must be positive")
        return schedule_plot(-(-M // Mb), -(-N // Nb), args.ctas, args.supergroup)
    if args.what == "stream-k":
        (M, N, K), (Mb, Nb, Kb) = args.mnk, args.tile
        if min(M, N, K, Mb, Nb, Kb) < 1:
            parser.error("--mnk and --tile must be positive")
        try:
            return stream_k_plot(-(-M // Mb) * -(-N // Nb), -(-K // Kb), args.ctas)
        except ValueError as e:
            parser.error(str(e))
    if args.what in ("tmem", "roofline"):
        from tk_cute import report
        from tk_cute.tuning.sm100 import w4a4_config

        try:
            report.check_shape(*args.mnk)
        except ValueError as e:
            parser.error(str(e))
        cfg = w4a4_config(args.arch, *args.mnk)
        return tmem_plot(cfg) if args.what == "tmem" else roofline_plot(
            report.report(cfg, *args.mnk))
    if args.what == "paths":
        if args.sms is not None and args.sms < 1:
            parser.error(f"--sms must be positive, got {args.sms}")
        try:
            return paths_plot(args.k, args.w4a4, args.sms)
        except ValueError as e:
            parser.error(str(e))
    if args.what == "dense-plan":
        try:
            return dense_plan_plot(args.sms, args.quads)
        except ValueError as e:
            parser.error(str(e))
    try:
        with open(args.results) as f:
            data = json.load(f)
        if isinstance(data, dict) and "results" not in data:
            raise ValueError("a dict without 'results' (`tk_cute.bench nvfp4 --json` writes "
                             "{'environment': ..., 'results': [rows]})")
        return speedup_plot(data["results"] if isinstance(data, dict) else data)
    except (OSError, ValueError) as e:
        parser.error(f"cannot read bench results {args.results!r}: {e}")


def out_file_error(path: str, flag: str = "--out") -> str | None:
    """Why a picture cannot be written to `path` (given as `flag`), or None: it must end in
    .png or .svg, in a folder that exists."""
    if not path.lower().endswith((".png", ".svg")):
        return f"{flag} must end in .png or .svg, got {path!r}"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{flag} {path!r}: the folder {folder!r} does not exist (create it first)"
    return None


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    error = out_file_error(args.out)
    if error:
        p.error(error)
    fig = draw(args, p)
    fig.savefig(args.out, dpi=110)
    print(f"{args.what}: {args.out}")
    return 0
