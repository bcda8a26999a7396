"""CuPy access for the kernel families: lazy import, compilation, value types.

CuPy is imported only when a GPU path is used, so the CPU references, the
tests and the CLI work on a machine without a GPU; asking for a GPU path there
raises :class:`~common.errors.NoDeviceError` that says what to install.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np

from common.errors import NoDeviceError

KERNEL_DIR = Path(__file__).resolve().parent
C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


@functools.cache
def require_cupy() -> ModuleType:
    """Return the ``cupy`` module, or raise NoDeviceError naming what is missing (cached once found)."""
    try:
        import cupy
    except ImportError as exc:
        raise NoDeviceError(
            "CuPy is not installed: install the GPU extra, `pip install -e '.[gpu]'` for a CUDA 13 "
            "driver or `.[gpu-cuda12]` for CUDA 12, or use --device cpu-reference"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver
        raise NoDeviceError(f"no usable CUDA device: {exc}") from exc
    if count == 0:
        raise NoDeviceError("no CUDA device found")
    return cupy


def gpu_available() -> bool:
    try:
        require_cupy()
    except NoDeviceError:
        return False
    return True


def device_attributes() -> dict[str, int]:
    """The current device's attributes (CuPy's ``Device.attributes``), read once a device and process: CuPy
    reads every attribute from the driver on each ask, and preparations and plan() ask on every call."""
    return _attributes(require_cupy().cuda.Device().id)


@functools.cache
def _attributes(device: int) -> dict[str, int]:
    return dict(require_cupy().cuda.Device(device).attributes)


def c_type(dtype: Any) -> str:
    """The CUDA C type for a value dtype (float32 → float, float64 → double)."""
    return C_TYPES[np.dtype(dtype)]


@functools.cache
def _read(cu_file: str) -> str:
    return (KERNEL_DIR / cu_file).read_text()


@functools.cache
def _compile(cu_file: str, name_expressions: tuple[str, ...], options: tuple[str, ...], cooperative: bool,
             device: int) -> Any:
    cupy = require_cupy()
    code = f'#line 1 "{cu_file}"\n' + _read(cu_file)
    module = cupy.RawModule(code=code, options=("-std=c++17", *options), name_expressions=name_expressions,
                            enable_cooperative_groups=cooperative)
    module.compile()
    return module


def get_kernels(
    cu_file: str, name_expressions: tuple[str, ...], *, options: tuple[str, ...] = (), cooperative: bool = False
) -> Mapping[str, Any]:
    """Compile ``cu_file`` once per (instantiations, options, device); return its kernels by name.

    Templates take their tunables as template arguments (``csr_vector<double, 8, true>``),
    so one compilation serves every config of a family and dtype. ``cooperative``: every kernel of this
    compilation is launched cooperatively (all its blocks resident at once, or the launch fails), so a
    grid-wide barrier in it cannot deadlock; a launch must then ask no more blocks than
    :func:`resident_threads` allows.
    """
    return _functions(cu_file, name_expressions, options, cooperative, require_cupy().cuda.Device().id)


@functools.cache
def _functions(cu_file: str, name_expressions: tuple[str, ...], options: tuple[str, ...], cooperative: bool,
               device: int) -> Mapping[str, Any]:
    """:func:`get_kernels`' answer, once per compilation (a prepare asks for it: a dozen ``get_function`` calls
    cost 0.07 ms of each ``plan()`` on the GPU machines' hosts)."""
    module = _compile(cu_file, name_expressions, options, cooperative, device)
    return MappingProxyType({name: module.get_function(name) for name in name_expressions})


def resident_threads(regs: int, block: int, attributes: dict[str, int]) -> int:
    """Threads of a kernel using ``regs`` registers a thread, in blocks of ``block``, that the GPU holds at
    once: the register file's limit (registers are given out 8 a thread at a time), the threads', the
    blocks' (shared memory, a few KB a block where a kernel of ours holds any, is never the limit)."""
    per_block = -(-regs // 8) * 8 * block
    # Every GPU since Volta has 64 K registers and at least 16 blocks an SM, should CuPy not list the attribute.
    blocks = min(attributes.get("MaxRegistersPerMultiprocessor", 65536) // per_block,
                 attributes["MaxThreadsPerMultiProcessor"] // block, attributes.get("MaxBlocksPerMultiprocessor", 16))
    return attributes["MultiProcessorCount"] * blocks * block


def grid(n_threads: int, block: int) -> int:
    """Blocks needed for ``n_threads`` threads (at least one, so a launch is always valid)."""
    return max(1, -(-n_threads // block))


def to_numpy(a: Any) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array (a read-back for CuPy: it waits for the GPU)."""
    return np.asarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a)
