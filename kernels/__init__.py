"""The kernel families and their one registry.

>>> from kernels import REGISTRY, get_family
>>> " ".join(sorted(REGISTRY))
'csr5 csr_scalar csr_vector cusparse firsttouch ipcsr merge_path nut rcm rowsort specsum suraa'
>>> get_family("csr_vector").space.defaults()
{'threads_per_row': 8, 'block_size': 256, 'indices': 'narrow'}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from common.errors import InvalidConfigError
from kernels._family import Family, Prepared
from kernels._space import Param, Space
from kernels.csr5 import Csr5
from kernels.csr_scalar import CsrScalar
from kernels.csr_vector import CsrVector
from kernels.cusparse import CuSparse
from kernels.firsttouch import Firsttouch
from kernels.ipcsr import Ipcsr
from kernels.merge_path import MergePath
from kernels.nut import Nut
from kernels.rcm import Rcm
from kernels.rowsort import Rowsort
from kernels.specsum import SpecSum
from kernels.suraa import Suraa

REGISTRY: dict[str, Family] = {
    f.name: f for f in (CuSparse(), CsrScalar(), CsrVector(), Ipcsr(), MergePath(), Nut(), Rcm(), Rowsort(),
                        Firsttouch(), SpecSum(), Suraa(), Csr5())
}
"""Every family by name. The tuner, the service and the docs read this and nothing else."""

BASELINE = "cusparse"
"""The family every result is compared against, and the safe default of plan()."""
BASELINE_CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    (BASELINE, {"algorithm": "csr_alg1"}),
    (BASELINE, {"algorithm": "csr_alg2"}),
)
"""cuSPARSE's two CSR algorithms: every race times both beside its entrants, and a benchmark's reference is the
faster of them (cuSPARSE's best); the first is the one ``plan(effort="predict")`` holds a config to."""


def get_family(name: str) -> Family:
    """The registered family called ``name``; unknown names list the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise InvalidConfigError(f"unknown kernel {name!r}; known kernels: {sorted(REGISTRY)}") from None


def with_adapted(configs: Sequence[tuple[str, dict[str, Any]]], *, cols: int, itemsize: int,
                 l2_bytes: int) -> list[tuple[str, dict[str, Any]]]:
    """``configs`` with, second, the first as its family fits it to a matrix of ``cols`` columns of
    ``itemsize``-byte values on a GPU with ``l2_bytes`` of L2 (:meth:`Family.adapt`), where that is a
    config not among them already. The first's only: the race and the search's seeds both start there."""
    if not configs:
        return []
    kernel, params = configs[0]
    fitted = get_family(kernel).adapt(params, cols=cols, itemsize=itemsize, l2_bytes=l2_bytes)
    if fitted is None or any(config_key(k, p) == config_key(kernel, fitted) for k, p in configs):
        return list(configs)
    return [configs[0], (kernel, fitted), *configs[1:]]


def config_key(kernel: str, params: Mapping[str, Any]) -> str:
    """One string per (family, params): how trials, studies and the selector tell configs apart."""
    return kernel + json.dumps(dict(params), sort_keys=True)


def canonical(kernel: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the family's defaults filled in, what runs: the config a trial records, so that one
    recorded before a parameter was added (csr_vector's ``indices``: int32 then) is never taken for one
    with it; as given where they do not validate (the trial then fails and says why)."""
    try:
        return get_family(kernel).space.validate(params, family=kernel)
    except InvalidConfigError:
        return dict(params)


def config_of(key: str) -> tuple[str, dict[str, Any]]:
    """``(kernel, params)`` back from a :func:`config_key`."""
    brace = key.index("{")
    return key[:brace], json.loads(key[brace:])


__all__ = ["BASELINE", "REGISTRY", "Family", "Param", "Prepared", "Space", "canonical", "config_key", "config_of",
           "get_family", "with_adapted"]
