"""What a study measures first: the configs already known to do well on this matrix or on ones like it.

A search of a few dozen trials finds the best early only if it starts near it
(issue #21: on a matrix with 40 % empty rows the float64 search found NuT at
1.39x cuSPARSE, the float32 search never tried it). :func:`seed_configs` reads
the store, in this order:

1. this matrix's best on this device in the other dtype (the same structure
   usually wants the same family, often the same config);
2. the bests of the ``k`` tuned matrices nearest in features on this device and
   dtype (log1p of the counts, then each feature standardized over them and
   this matrix), nearest first.

:func:`~tuner.search.loop.tune` measures them before what it is asked to
enqueue (the selector's first configs, a portfolio), and those before the
families' defaults. Configs that no longer validate (a family renamed, a
parameter dropped since they were stored) are left out; each config once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from common.errors import InvalidConfigError
from db.store import Store
from kernels import config_key, get_family
from tuner.matrix.features import FEATURE_NAMES
from tuner.select.model import COUNT_FEATURES

__all__ = ["DTYPES", "nearest_bests", "seed_configs", "unique_valid"]

DTYPES = ("float64", "float32")
"""The dtypes a matrix is tuned in: the other one's best seeds a study."""


def seed_configs(store: Store, *, fingerprint: str, device: str, dtype: str, features: Mapping[str, float],
                 k: int = 3) -> list[tuple[str, dict[str, Any]]]:
    """The configs to measure first in a study of matrix ``fingerprint`` on ``device`` in ``dtype``: its best
    in the other dtype, then the bests of the ``k`` nearest tuned matrices (see the module's doc)."""
    other = [store.best(fingerprint, device=device, dtype=d) for d in DTYPES if d != dtype]
    near = nearest_bests(store, features, device=device, dtype=dtype, k=k, exclude=fingerprint)
    return unique_valid([(b["kernel"], b["params"]) for b in [*other, *near] if b is not None])


def nearest_bests(store: Store, features: Mapping[str, float], *, device: str, dtype: str, k: int,
                  exclude: str | None = None) -> list[dict[str, Any]]:
    """The best rows of the ``k`` matrices nearest to ``features`` among those with a best on ``device`` in
    ``dtype`` (``exclude``: a fingerprint left out), nearest first; features missing anywhere are not used."""
    rows = [r for r in store.bests_with_features(device=device, dtype=dtype) if r["fingerprint"] != exclude]
    names = [n for n in FEATURE_NAMES if n in features and all(n in r["features"] for r in rows)]
    if not rows or not names or k < 1:
        return []
    X = _scaled(np.array([[r["features"][n] for n in names] for r in rows], dtype=np.float64), names)
    q = _scaled(np.array([[float(features[n]) for n in names]], dtype=np.float64), names)
    both = np.vstack([X, q])
    mean, std = both.mean(axis=0), both.std(axis=0)
    std[std == 0] = 1.0
    distance = np.linalg.norm((X - mean) / std - (q - mean) / std, axis=1)
    return [rows[i] for i in np.argsort(distance, kind="stable")[:k]]


def unique_valid(configs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``configs`` in order, each once, those that no longer validate against the registry left out."""
    out, seen = [], set()
    for kernel, params in configs:
        try:
            valid = get_family(kernel).space.validate(dict(params), family=kernel)
        except InvalidConfigError:
            continue
        if (key := config_key(kernel, valid)) not in seen:
            seen.add(key)
            out.append((kernel, valid))
    return out


def _scaled(F: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """log1p of the counts (they span orders of magnitude), the other features as they are."""
    return np.column_stack([np.log1p(np.maximum(F[:, i], 0)) if n in COUNT_FEATURES else F[:, i]
                            for i, n in enumerate(names)])
