"""Every notebook in notebooks/ executes top to bottom on CPU (docs/architecture.md).

Notebooks choose ``BACKEND = "auto"``, so here (no GPU) they run on NumPy; on a GPU machine the
same cells run on CuPy.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="install the notebooks extra")
    nbclient = pytest.importorskip("nbclient", reason="install the notebooks extra")
    nb = nbformat.read(path, as_version=4)
    env_backup = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        if env_backup is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = env_backup
