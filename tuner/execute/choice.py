"""Which config ``plan(A)`` runs, and where it comes from: tuned, predicted or the default.

Where the config comes from is part of the answer (``ex.source``):
``'tuned'`` when the store has a best config for this matrix's fingerprint on
this device model and dtype, ``'predicted'`` when it has none but holds a
trained selector for the device and dtype (:mod:`tuner.select.model`), ``'default'``
otherwise (cuSPARSE, the safe choice), and ``'cpu'`` on a machine without a
GPU, where SciPy computes y. The service's ``/recommend`` asks the same
function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import InvalidConfigError
from db.store import Store
from kernels import BASELINE, get_family
from tuner.matrix.features import FEATURE_NAMES
from tuner.select.shipped import may_predict


@dataclass(frozen=True)
class Choice:
    """A kernel config and where it came from ('tuned', 'predicted' or 'default'); for a tuned one, the
    times of it and of cuSPARSE the store holds (``cusparse_time_s`` may be unknown); for a predicted one,
    the GFLOP/s its neighbours measured (may be unknown) and the selector's probability of the family."""

    kernel: str
    params: dict[str, Any]
    source: str
    expected_gflops: float | None = None
    time_s: float | None = None
    cusparse_time_s: float | None = None
    confidence: float | None = None


def choose(fp: str, *, store: Store | None, device: str, dtype: str, use_tuned: bool = True,
           features: Mapping[str, float] | None = None) -> Choice:
    """The config plan() runs: the stored best for (fingerprint, device, dtype), else the
    prediction from ``features`` of the store's latest model for (device, dtype) or, without one, of
    the model shipped in the package for exactly that device and dtype, else the default.

    ``use_tuned=False`` gives what plan() would pick for a matrix it has never
    tuned (the benchmark compares that with the tuned best).
    """
    best = store.best(fp, device=device, dtype=dtype) if (use_tuned and store is not None) else None
    if best is not None:
        return Choice(best["kernel"], best["params"], "tuned", best["gflops"], best["time_s"], best["cusparse_time_s"])
    if features is not None and set(FEATURE_NAMES) <= set(features) and may_predict(store, device, dtype):
        from tuner.select.model import find_model  # scikit-learn only when a model is stored or shipped

        model = find_model(store, device=device, dtype=dtype)
        if model is not None:
            p = model.predict_details(features)[0]
            try:  # a model trained before the registry changed may name what no longer exists
                return Choice(p.kernel, get_family(p.kernel).space.validate(p.params, family=p.kernel), "predicted",
                              expected_gflops=p.expected_gflops, confidence=p.confidence)
            except InvalidConfigError:
                pass
    return Choice(BASELINE, get_family(BASELINE).space.defaults(), "default")


__all__ = ["Choice", "choose"]
