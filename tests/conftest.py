"""Shared fixtures: the real matrices in ../shared/matrices and the GPU marker."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# No selector shipped in the package answers in the tests (or in the servers and workers they start):
# what is shipped must not change their 'default's; tests of shipped selectors set their own folder.
os.environ["SPMV_TUNER_MODELS"] = ""
# rich wraps the CLI's output at the terminal's width, which differs between one process and xdist's
# workers (80 columns there): the tests read whole lines
os.environ["COLUMNS"] = "200"
SHARED_MATRICES = Path(
    __import__("os").environ.get("SPMV_SHARED_MATRICES", REPO.parent / "shared" / "matrices")
)


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


GPU_WORKERS = 6
"""Processes of ``python -m pytest -m gpu`` on a machine with a GPU when ``-n`` is not given: the suite is
bound by compiling kernels and by the host's launches, so six processes sharing the GPU (pytest-xdist) run it
in about a third of one's time. ``SPMV_GPU_WORKERS`` sets another count; ``-n 0`` runs it in one process."""


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Before pytest-xdist reads ``-n``: a GPU run (``-m gpu``, on a machine with a GPU) gets GPU_WORKERS."""
    if (getattr(config.option, "numprocesses", 0) is None and not hasattr(config, "workerinput")
            and config.option.markexpr.strip() == "gpu" and not config.getoption("usepdb", False)
            and _gpu_available()):
        config.option.numprocesses = int(os.environ.get("SPMV_GPU_WORKERS", GPU_WORKERS))


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def shared_manifest() -> list[dict[str, str]]:
    """Rows of MANIFEST.tsv (empty when the shared matrices are not beside the checkout)."""
    path = SHARED_MATRICES / "MANIFEST.tsv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED_MATRICES / "MANIFEST.tsv").exists():
        pytest.skip(f"shared matrices not found at {SHARED_MATRICES}")
    return SHARED_MATRICES
