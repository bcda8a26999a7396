"""Whether the selector's held-out first config gains from its training matrices' outcomes moved to the size of
the matrix it ranks, replayed on a corpus's times with each structure family left out.

The ranking (:meth:`tuner.select.model.KernelSelector.rank_order`) draws training matrices by their nearness in
the forest and puts first the config whose slowdown is lowest at a quantile over them. The corpus holds mostly
small matrices, where a product's fixed cost (a launch: cuSPARSE's floor is 8 us against 3.6 for csr_vector and
csr_scalar on the H200) weighs most, and cuSPARSE's best over the best row kernel goes from 2.3x at under 10^5
nonzeros to 0.7x at over 10^7. Two variants (:class:`SizeAware`) against the shipped settings:

- ``floor:F`` (F a factor of each config's floor, its fastest time over the training matrices): each drawn
  matrix's time of a config becomes ``F floor + (t - F floor) * t_bytes(this) / t_bytes(drawn)``, the part
  above the floor scaled to this matrix's compulsory bytes;
- ``near:TAU``: the draws weighted further by ``exp(-|log(t_bytes(this) / t_bytes(drawn))| / TAU)``, matrices
  of about this one's size first.

Each line: the first config's geometric mean of t_best / t, its worst 5 % and its geometric mean over the
matrices of 1 M nonzeros and more, and a race of the first three configs and cuSPARSE's (``race3``), means
over the seeds. Result: ``bench/results/2026-11-29_lofo-size-66.txt``.

    python bench/probe_lofo_size.py --corpus bench/results/corpus/2026-11-24_NVIDIA-H200-sm-90_corpus.jsonl.gz
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.select.evaluation import corpus_table, evaluate_selector  # noqa: E402
from tuner.select.model import MISSING_PENALTY, NEAR_POWER, KernelSelector, _quantile, bytes_time  # noqa: E402


class SizeAware(KernelSelector):
    """The shipped selector, its ranking's outcomes moved to the ranked matrix's size (``floor``) or its draws
    weighted to matrices of about that size (``tau``); see the module's doc."""

    def __init__(self, *, floor: float = 0.0, tau: float | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.floor, self.tau = floor, tau

    def fit(self, X: Any, times: Any, **kwargs: Any) -> SizeAware:
        super().fit(X, times, **kwargs)
        T = np.array([[row.get(k, np.nan) for k in self.config_keys()] for row in times], dtype=np.float64)
        used = np.isfinite(T).any(axis=1)
        self.tb_ = bytes_time(np.asarray(X, dtype=np.float64)[used], dtype=self.dtype_, device=self.device_,
                              feature_names=list(self.feature_names_in_))
        ratio = np.log(T[used] / self.tb_[:, None])
        ratio = np.where(np.isnan(ratio), np.nanmax(ratio, axis=1, keepdims=True) + MISSING_PENALTY, ratio)
        self.T_ = self.tb_[:, None] * np.exp(ratio)  # a config not measured: the row's slowest times 2, as fit's
        self.floor_ = self.floor * self.T_.min(axis=0)
        return self

    def _moved(self, drawn: np.ndarray, tb: np.ndarray) -> np.ndarray:
        """log(t / t_best) on the drawn rows with the times above each config's floor scaled to ``tb``."""
        t = self.floor_ + np.maximum(self.T_[drawn] - self.floor_, 0) * (tb[:, None] / self.tb_[drawn])[..., None]
        slow = np.log(t) - np.log(t.min(axis=-1, keepdims=True))
        return slow if self.cap is None else np.minimum(slow, math.log(self.cap))

    def rank_order(self, X: Any, *, device: Any = None) -> np.ndarray:
        rows, expected, _, weights = self._expected(X, device)
        tb = bytes_time(rows, dtype=self.dtype_, device=self.device_, feature_names=list(self.feature_names_in_))
        if self.tau is not None:
            weights = weights * np.exp(-np.abs(np.log(tb[:, None] / self.tb_[None, :])) / self.tau)
        key = _quantile(self._moved(self._draws(weights), tb), self.risk_quantile)
        if self.near_share:
            near = _quantile(self._moved(self._draws(weights ** NEAR_POWER), tb), self.risk_quantile)
            key = (1 - self.near_share) * key + self.near_share * near
        return np.lexsort((expected, key), axis=-1)


def make_selector(variant: str, seed: int) -> KernelSelector:
    """``shipped``, ``floor:F`` or ``near:TAU`` (the module's doc), with this forest seed."""
    if variant == "shipped":
        return KernelSelector(random_state=seed)
    kind, value = variant.split(":")
    return SizeAware(random_state=seed, **({"floor": float(value)} if kind == "floor" else {"tau": float(value)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, help="a corpus file (tuner corpus export)")
    ap.add_argument("--variants", default="shipped,floor:1,floor:0.8,floor:0.5,near:2,near:1,near:0.5")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    for dtype in ("float64", "float32"):
        table = corpus_table(args.corpus, dtype=dtype)
        for variant in args.variants.split(","):
            scores = []
            for seed in range(args.seeds):
                rows = {r.strategy: r for r in evaluate_selector(
                    table, cv="lofo", ks=(3,), make=lambda v=variant, s=seed: make_selector(v, s)).rows}
                first, race = rows["first"], rows["race3"]
                scores.append((first.geomean, first.worst5, first.large_geomean, race.geomean, race.large_geomean))
            m = np.mean(scores, axis=0)
            print(f"{dtype} {variant:10s} first {m[0]:.3f}, worst 5 % {m[1]:.3f}, >= 1 M nonzeros {m[2]:.3f} | "
                  f"race3 {m[3]:.3f}, >= 1 M nonzeros {m[4]:.3f}", flush=True)


if __name__ == "__main__":
    main()
