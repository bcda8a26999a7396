"""spmv-tuner: auto-tuned sparse matrix-vector products on NVIDIA GPUs.

>>> from tuner import plan          # doctest: +SKIP
>>> ex = plan("A.mtx"); y = ex(x)   # doctest: +SKIP

The exceptions are :mod:`common.errors`'s. ``plan``, ``plan_renumbered`` and ``Executor`` are
imported on first use, so that importing a submodule stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.errors import InvalidConfigError, MatrixFormatError, NoDeviceError, StoreError, TunerError

if TYPE_CHECKING:
    from tuner.execute.executor import Executor
    from tuner.execute.plan import plan
    from tuner.execute.renumbered import plan_renumbered


def __getattr__(name: str) -> Any:
    if name == "plan":
        from tuner.execute.plan import plan as value
    elif name == "plan_renumbered":
        from tuner.execute.renumbered import plan_renumbered as value
    elif name == "Executor":
        from tuner.execute.executor import Executor as value
    else:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "Executor",
    "InvalidConfigError",
    "MatrixFormatError",
    "NoDeviceError",
    "StoreError",
    "TunerError",
    "plan",
    "plan_renumbered",
]
