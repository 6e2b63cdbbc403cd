# %% [markdown]
# # 04 - tk_cute beside its CuTe DSL peer
#
# You will learn:
# - how `tk_cute.compare` sets one GEMM in tk_cute beside CUTLASS's CuTe DSL example for the
#   same target: source lines (files, kernel classes, `@cute.kernel` bodies, host launch), the
#   instruction mix of PTX and SASS, registers, spills, shared and tensor memory; on a Hopper
#   GPU also time and TFLOP/s (`python -m tk_cute compare --arch sm_90a --peer PATH`);
# - where the peers come from: they are not vendored. Copy from the public CUTLASS repository
#   `examples/python/CuTeDSL/cute/blackwell/kernel/blockscaled_gemm/
#   dense_blockscaled_gemm_persistent.py` (sm_100a / sm_107a) or `.../hopper/kernel/dense_gemm/
#   dense_gemm_persistent.py` (sm_90a) into the git-ignored `.peers/`.
# Without a peer file the other side is a second tk_cute config (the dispatch's small-shape
# choice). Runs on a CPU (Rubin, sm_107a: compile only).

# %%
from pathlib import Path

from tk_cute import compare


def peer_file(name="dense_blockscaled_gemm_persistent.py"):
    """`.peers/NAME` in this directory or a parent, or None."""
    for d in (Path.cwd(), *Path.cwd().parents):
        if (d / ".peers" / name).is_file():
            return str(d / ".peers" / name)
    return None


result = compare.compare("sm_107a", (8192, 8192, 8192), peer=peer_file())
result

# %% [markdown]
# The same numbers as bars (each figure keeps what it drew in `fig.drawn`).

# %%
result.figure()

# %%
def test_both_sides_fit_rubin():
    from tk_cute.arch import target

    ours, other = result.sides  # the comparison above (compiled once, at import)
    mix = ours.build.instruction_mix()
    assert mix["MMA"] == (4, 4)  # 2 K blocks x 2 M halves per stage, one line each
    assert ours.tmem_columns == 576 and ours.smem_bytes <= target("sm_107a").smem_bytes
    assert all(x.build.kernel.local_bytes == 0 for x in result.sides)
    assert other.build.instruction_mix()["MMA"][0] > 0


# %%
if __name__ == "__main__":  # a script or a notebook (pytest runs the tests itself)
    print(result.table())
