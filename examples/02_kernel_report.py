# %% [markdown]
# # 02 - Reading a kernel for a GPU you do not own
#
# You will learn:
# - how `tk_cute.compile.build` compiles any target on a CPU-only machine;
# - how to read a kernel report: tiles, stages, shared and tensor memory, registers, spills,
#   MMA instructions, and a clearly labelled roofline MODEL (not a measurement).
# Runs on a CPU.

# %%
from tk_cute import report

# %%
def rubin_report(mnk=(8192, 8192, 8192)):
    from tk_cute.nvfp4.heuristics import sm100_config

    cfg = sm100_config("sm_107a", *mnk)
    return report.report(cfg, *mnk)


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
