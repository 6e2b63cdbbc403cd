"""tk_cute's own code raises no DeprecationWarning: a fresh interpreter imports every public
module and compiles a kernel of each family (sm100 W4A4 with cluster launch control, W4A16,
the Hopper dense GEMM, register-A, small-M and tiled kernels, the quantizer), recording every
DeprecationWarning whose call stack passes through tk_cute's files (a DSL API tk_cute calls
that "will be removed" counts, wherever the DSL attributes it)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, traceback, warnings
ROOT = %r
found = []
def show(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, DeprecationWarning):
        ours = [f for f in traceback.extract_stack()[:-1]
                if f.filename.startswith(ROOT) and "/.venv/" not in f.filename
                and "site-packages" not in f.filename]
        if ours:
            found.append(f"{str(message)[:120]} (from {ours[-1].filename[len(ROOT):]}:"
                         f"{ours[-1].lineno})")
warnings.simplefilter("always")
warnings.showwarning = show
import tk_cute, tk_cute.nvfp4, tk_cute.dense_gemm, tk_cute.report, tk_cute.viz
import tk_cute.compare, tk_cute.emulator, tk_cute.bench, tk_cute.tuning.sm100 as T
from tk_cute.kernels.gemm import nvfp4_sm100 as K, nvfp4_w4a16_sm100 as W
from tk_cute.kernels.gemm import gemm_sm90, nvfp4_small_m_sm90, nvfp4_register_a_sm90
from tk_cute.kernels.gemm import nvfp4_register_a_tiled_sm90 as rst
from tk_cute.kernels import nvfp4_quantize
K.compile(T.w4a4_config("sm_100a", 8192, 8192, 8192))  # cluster launch control
W.compile(W.Config(arch="sm_107a", swap_ab=True, x_rows=16, SPLIT_K=2))
opt = "--gpu-arch sm_90a"
gemm_sm90.compile_launcher(gemm_sm90.Config(), 132, options=opt)
nvfp4_small_m_sm90.compile_launcher(nvfp4_small_m_sm90.Config(), options=opt)
nvfp4_register_a_sm90.compile_launcher(nvfp4_register_a_sm90.Config(), options=opt)
rst.compile_launcher(rst.Config(Nb=128), 132, options=opt)
nvfp4_quantize.compile_quantize(nvfp4_quantize.Config(), options=opt)
print(json.dumps(sorted(set(found))))
""" % (str(ROOT) + "/",)


def test_no_deprecation_warning_from_tk_cute_code():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == [], "\n".join(found)
