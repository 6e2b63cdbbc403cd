# %% [markdown]
# # 02 - Reading a kernel for a GPU you do not own
#
# You will learn:
# - how `tk_cute.compile.build` compiles any target on a CPU-only machine;
# - how to read a kernel report: tiles, stages, shared and tensor memory, registers, spills,
#   MMA instructions, and a clearly labelled roofline MODEL (not a measurement).
# Runs on a CPU.

# %%
import functools

from tk_cute import report, viz
from tk_cute.tuning.sm100 import w4a4_config

# %% [markdown]
# The report of the Rubin NVFP4 GEMM at 8192^3 (in a notebook: a table; `format_report` gives
# the text).

# %%
@functools.cache
def rubin_report(mnk=(8192, 8192, 8192)):
    return report.report(w4a4_config("sm_107a", *mnk), *mnk)


rubin_report()

# %% [markdown]
# The same kernel on its target's roofline: the MODEL's time as a point under the roof (vendor
# peaks; not a measurement).

# %%
viz.roofline_plot(rubin_report())

# %% [markdown]
# Where its 576 tensor-memory columns go: two 256-column accumulators sharing B, then the scale
# factors of one K stage, 4 columns per 512-byte atom.

# %%
viz.tmem_plot(w4a4_config("sm_107a", 8192, 8192, 8192))


# %%


def test_rubin_report_fits_the_target():
    r = rubin_report()
    text = report.format_report(r)
    assert "sm_107a" in text and "model" in text.lower()
    assert r["spill_bytes"] == 0
    assert r["smem_bytes"] <= r["smem_capacity"] == 334848  # Rubin's oversized shared memory
    assert r["tmem_columns"] == 576 and r["tmem_exclusive"]  # needs the exclusive allocation
    assert r["mma_instruction"].endswith("block16") and "x128 " in r["mma_instruction"]


if __name__ == "__main__":
    print(report.format_report(rubin_report()))
