"""Every .cu file compiles with nvcc for Hopper, with every instantiation its family uses, and so does every
kernel kept as a source string in a Python module.

Runs on a machine without a GPU (CI has nvcc), so a syntax or template error in a
kernel never lands. Skipped where nvcc is not on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import pytest

from kernels import REGISTRY, _narrow
from kernels._cuda import KERNEL_DIR
from kernels.spmspv import MODES
from tuner.matrix import features_gpu, structure_gpu
from tuner.measure import backend, verify
from tuner.select import rank_gpu

NVCC = shutil.which("nvcc")
SOURCES = {**{n: f for n, f in REGISTRY.items() if f.cu_file}, **{f"spmspv-{n}": m for n, m in MODES.items()},
           "narrow": SimpleNamespace(cu_file=_narrow.CU_FILE, name_expressions=lambda dtype: _narrow.KERNELS),
           "reference": SimpleNamespace(cu_file=verify.REFERENCE_CU, name_expressions=verify.reference_kernel_names)}
"""Every user of a .cu file: the SpMV families, the SpMSpV modes, the narrow columns some families share and
the reference every GPU result is checked against."""
CU_FAMILIES = sorted(SOURCES)


def test_every_cu_file_belongs_to_a_family():
    on_disk = {p.name for p in KERNEL_DIR.glob("*.cu")}
    assert on_disk == {SOURCES[n].cu_file for n in CU_FAMILIES}


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("family", CU_FAMILIES)
def test_cu_file_compiles_with_nvcc(family, tmp_path):
    f = SOURCES[family]
    uses = "\n".join(
        f"    (void)&{expr};" for dtype in ("float32", "float64") for expr in f.name_expressions(dtype)
    )
    wrapper = tmp_path / f"{family}_check.cu"
    wrapper.write_text(f'#include "{KERNEL_DIR / f.cu_file}"\nvoid instantiate_all() {{\n{uses}\n}}\n')
    proc = subprocess.run(
        [NVCC, "-std=c++17", "-arch=sm_90", "-rdc=true", "-c", str(wrapper), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "k.o").stat().st_size > 0


INLINE = {"features": (features_gpu._SOURCE, ("feature_rows", "feature_xor_bits", "feature_columns", "feature_tail")),
          "structure": (structure_gpu._SOURCE, ("csr_structure",)),
          "rank": (rank_gpu.SOURCE, ("rank_from_counters", "rank_from_features")),
          "spin": (backend._SPIN, ("spin_cycles",)), "gate": (backend._GATE, ("wait_for_host",))}
"""The kernels kept as source strings in Python modules (compiled by NVRTC at run time), and their entry points."""


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", sorted(INLINE))
def test_inline_kernels_compile_with_nvcc(name, tmp_path):
    source, entries = INLINE[name]
    path = tmp_path / f"{name}.cu"
    path.write_text(source)
    proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "--ptx", str(path), "-o", str(tmp_path / "k.ptx")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    for entry in entries:  # each extern "C" kernel the module asks for is an entry of the PTX
        assert f".entry {entry}(" in ptx, entry
