"""examples/quickstart.ipynb runs from top to bottom and learns (the README cannot rot)."""
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def _text(cell):
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif "data" in o and "text/plain" in o["data"]:
            out.append(o["data"]["text/plain"])
    return "".join(out)


@pytest.mark.slow
def test_quickstart_notebook_runs_and_learns():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    t0 = time.time()
    client.execute()
    elapsed = time.time() - t0
    assert elapsed < 60, f"notebook took {elapsed:.0f}s"

    outputs = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "4880 points" in outputs and "159 labels" in outputs
    p1 = float(re.search(r"P: @1 (\d\.\d+)", outputs).group(1))
    assert 0.45 < p1 <= 1.0  # Bibtex P@1 of a small network after a few epochs
    reload = float(re.search(r"P@1 after reload: (\d\.\d+)", outputs).group(1))
    assert reload == pytest.approx(p1, abs=1e-4)
    assert len(re.findall(r"^point \d: true", outputs, flags=re.M)) == 3
    # the training-curve cell drew a figure
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in nb.cells for o in c.get("outputs", []))
