"""The example notebooks: each percent-format script (`examples/NN_*.py`,
`examples/ladder/NN_*.py`) is paired with a notebook holding the same cells (jupytext, see
docs/notebooks.md), and every notebook runs top to bottom on this machine (nbclient).

Notebooks are committed without outputs (readable diffs); executing them must give the outputs
a reader expects: HTML tables for builds and reports, inline figures, no PTX dumped into a cell,
and GPU cells that say they were skipped when there is no GPU. They run two at a time, each in
its own kernel.
"""

import asyncio
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # the slow tier: `python -m pytest --full`

# The dev extra installs these (CI has them); a machine without them (the GPU machine) skips
# this module instead of failing the whole collection.
jupytext = pytest.importorskip("jupytext", reason="notebook tests need the dev extra (jupytext)")
nbformat = pytest.importorskip("nbformat", reason="notebook tests need the dev extra")
NotebookClient = pytest.importorskip("nbclient", reason="notebook tests need the dev extra"
                                     ).NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(EXAMPLES.glob("[0-9][0-9]_*.py")) + sorted(
    (EXAMPLES / "ladder").glob("[0-9][0-9]_*.py"))
NAMES = [str(p.relative_to(EXAMPLES).with_suffix("")) for p in SCRIPTS]
PARALLEL = 2  # kernels at a time (the CI machine has 2 cores)
# Rich outputs each executed notebook must show (MIME types of its execute results).
EXPECTED = {
    "01_nvfp4_format": {"image/png"},
    "02_kernel_report": {"text/html", "image/png"},
    "03_hopper_gemm": {"text/html", "image/png"},
    "04_compare": {"text/html", "image/png"},
    "ladder/07_lcf_persistent": {"text/html", "image/png"},
}
PTX_MARKERS = (".version ", ".target sm_", ".visible .entry")


def _cells(nb):
    return [(c.cell_type, c.source) for c in nb.cells]


@pytest.mark.parametrize("script", SCRIPTS, ids=NAMES)
def test_notebook_is_paired_with_its_script(script):
    notebook = script.with_suffix(".ipynb")
    assert notebook.exists(), f"{notebook.name} is missing: run `jupytext --sync {script}`"
    saved = nbformat.read(notebook, as_version=4)
    assert _cells(saved) == _cells(jupytext.read(script)), (
        f"{notebook.name} and {script.name} differ: edit one, then `jupytext --sync {script}`")
    assert not any(c.get("outputs") for c in saved.cells if c.cell_type == "code"), (
        f"{notebook.name} is committed with outputs: clear them (`jupytext --sync` writes none)")


def test_every_notebook_has_a_script():
    notebooks = set(EXAMPLES.glob("*.ipynb")) | set((EXAMPLES / "ladder").glob("*.ipynb"))
    assert notebooks == {s.with_suffix(".ipynb") for s in SCRIPTS}


async def _execute_all(paths):
    gate = asyncio.Semaphore(PARALLEL)

    async def one(path):
        async with gate:
            nb = nbformat.read(path, as_version=4)
            client = NotebookClient(nb, timeout=300, kernel_name="python3",
                                    resources={"metadata": {"path": str(path.parent)}})
            start = time.perf_counter()
            try:
                await client.async_execute()
            except Exception as e:  # noqa: BLE001 - reported by the notebook's own test
                return path, nb, e, time.perf_counter() - start
            return path, nb, None, time.perf_counter() - start

    return await asyncio.gather(*(one(p) for p in paths))


@pytest.fixture(scope="module")
def executed():
    start = time.perf_counter()
    runs = asyncio.run(_execute_all([s.with_suffix(".ipynb") for s in SCRIPTS]))
    total = time.perf_counter() - start
    print(f"executed {len(runs)} notebooks in {total:.1f} s: "
          + ", ".join(f"{p.stem} {t:.1f} s" for p, _, _, t in runs))
    return {str(p.relative_to(EXAMPLES).with_suffix("")): (nb, err) for p, nb, err, _ in runs}


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(executed, name):
    nb, err = executed[name]
    assert err is None, f"{name}.ipynb failed: {err}"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    kinds = {k for o in outputs if o.output_type == "execute_result" for k in o.data}
    assert EXPECTED.get(name, {"text/html"}) <= kinds, f"{name}: rich outputs {kinds}"
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert not any(m in text for m in PTX_MARKERS), f"{name}: PTX dumped into an output"
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "<table>" in html or "text/html" not in kinds
    gpu_tests = any("pytest.mark.gpu" in c.source for c in nb.cells)
    if gpu_tests and not torch.cuda.is_available():
        assert "skipped" in text, f"{name}: a GPU cell ran silently without a GPU"
