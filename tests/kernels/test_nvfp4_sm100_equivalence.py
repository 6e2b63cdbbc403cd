"""The tcgen05 NVFP4 GEMM compiles to the same machine code as before its vocabulary rewrite.

`data/nvfp4_sm100_sass_baseline.json` was written by `nvfp4_sm100_sass.py` from the kernel as it
was before issue 23 moved it onto `st` / `gl` / `tma.load_async` / `Shared` / rings / `tt`, and
again after the epilogue's tcgen05.wait::ld fix and after split K and tk_cute's own schedulers
(that script's docstring lists what each changed). Each config there (fixed configs on sm_100a,
sm_103a, sm_107a: big and mid tiles, fp16 out, both schedulers, the small-M form, Rubin's
double-buffered accumulator) is rebuilt and compared: the MMA, TMA, barrier and tensor-memory
instruction counts (SASS and PTX, per full mnemonic) and shared / tensor memory exactly,
registers within +-8, no spills.
"""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow tier: `python -m pytest --full`

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("nvfp4_sm100_sass", HERE / "nvfp4_sm100_sass.py")
sass = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass)

BASELINE = json.loads(sass.BASELINE.read_text())
REGISTER_SLACK = 8


def test_baseline_covers_every_target_and_both_schedulers():
    configs = sass.configs()
    assert set(configs) == set(BASELINE)
    for name, cfg in configs.items():  # the same Config the baseline was taken for
        assert BASELINE[name]["config"] == sass.dataclasses.asdict(cfg), name
    kinds = {(b["config"]["arch"], b["config"]["scheduler"]) for b in BASELINE.values()}
    assert kinds == {(a, s) for a in sass.ARCHS for s in ("clc", "static")}
    assert {b["config"]["out"] for b in BASELINE.values()} == {"bfloat16", "float16"}


@pytest.mark.parametrize("name", sorted(BASELINE))
def test_same_instructions_and_resources(name):
    base = BASELINE[name]
    now = sass.measure(sass.configs()[name])
    for cls in sass.SASS_CLASSES:
        assert now["sass"][cls] == base["sass"][cls], f"{name}: SASS {cls}"
    for key in ("mma_b_keep", "mma_b_reuse"):
        assert now["sass"][key] == base["sass"][key], f"{name}: SASS {key}"
    for cls in sass.PTX_CLASSES:
        assert now["ptx"][cls] == base["ptx"][cls], f"{name}: PTX {cls}"
    r, b = now["resources"], base["resources"]
    assert abs(r["registers"] - b["registers"]) <= REGISTER_SLACK, (name, r, b)
    assert r["local_bytes"] == b["local_bytes"] == 0 and r["stack_bytes"] == b["stack_bytes"]
    for key in ("static_shared_bytes", "dynamic_shared_bytes", "launch_shared_bytes",
                "threads", "tmem_columns_used", "tmem_alloc_columns", "tmem_exclusive"):
        assert r[key] == b[key], f"{name}: {key} {r[key]} != {b[key]}"
