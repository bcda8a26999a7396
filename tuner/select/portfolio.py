"""The portfolio: configs measured on every corpus matrix, beside those that optuna samples per matrix.

Tuning a matrix measures a few dozen configs, mostly different ones on each
matrix. The selector (:class:`tuner.select.model.KernelSelector`) learns the time
of each config measured on most training matrices, relative to the matrix's
best, and its evaluation is exact only where the configs it ranks first were
measured on the held-out matrix. The portfolio gives both: ``tune-many
--enqueue FILE`` measures it on every matrix.

What goes in (:func:`build_portfolio`, from what a store has measured):

- every config of a family whose space holds at most ``exhaustive_up_to``
  configs (cuSPARSE, the CSR baselines): their parameters are then known exactly;
- for a larger space, up to ``per_family`` configs picked greedily: each next
  one is within ``within`` of the family's best on the most matrices not yet
  covered, counting the matrices where the family is within ``near_best`` of
  the matrix's best (where choosing its parameters matters).

A portfolio file is JSON: ``{"format": "spmv-tuner-portfolio", "configs":
[{"kernel": ..., "params": {...}}, ...]}``; :func:`read_portfolio` validates
every config against the registry.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import InvalidConfigError
from kernels import REGISTRY, config_key, config_of, get_family

if TYPE_CHECKING:
    from db.store import Store

__all__ = ["FORMAT", "Config", "build_portfolio", "measured_times", "read_portfolio", "write_portfolio"]

FORMAT = "spmv-tuner-portfolio"
Config = tuple[str, dict[str, Any]]


def measured_times(store: Store, *, device: str, dtype: str) -> dict[str, dict[str, float]]:
    """Fingerprint → config key (:func:`kernels.config_key`) → fastest verified time on (device, dtype)."""
    out: dict[str, dict[str, float]] = {}
    rows = store.db.execute(
        "select fingerprint, kernel, params, min(time_s) from trials where device = ? and dtype = ? "
        "and state = 'ok' and verified = 1 group by fingerprint, kernel, params", [device, dtype])
    for fp, kernel, params, time_s in rows:
        out.setdefault(fp, {})[config_key(kernel, json.loads(params))] = time_s
    return out


def build_portfolio(store: Store, *, device: str, dtypes: Sequence[str] = ("float64", "float32"),
                    exhaustive_up_to: int = 32, per_family: int = 6, within: float = 0.03,
                    near_best: float = 0.10) -> list[Config]:
    """The portfolio for ``device`` from the store's verified trials in ``dtypes`` (see the module's doc)."""
    times = {(fp, dtype): row for dtype in dtypes  # (fingerprint, dtype) -> config key -> time
             for fp, row in measured_times(store, device=device, dtype=dtype).items()}
    out: list[Config] = []
    for name in sorted(REGISTRY):
        space = get_family(name).space
        configs = space.configs()
        if len(configs) <= exhaustive_up_to:
            out += [(name, c) for c in configs]
            continue
        good: dict[str, set[tuple[str, str]]] = defaultdict(set)  # config -> matrices it is near-best on
        for matrix, measured in times.items():
            mine = {k: t for k, t in measured.items() if k.startswith(name + "{")}
            if not mine or min(mine.values()) > (1 + near_best) * min(measured.values()):
                continue
            family_best = min(mine.values())
            for k, t in mine.items():
                if t <= (1 + within) * family_best:
                    good[k].add(matrix)
        chosen = [config_key(name, space.defaults())]
        covered: set[tuple[str, str]] = set(good.get(chosen[0], ()))
        while len(chosen) < per_family and good:
            k = max(sorted(good), key=lambda k: len(good[k] - covered))
            if not good[k] - covered:
                break
            chosen.append(k)
            covered |= good.pop(k)
        out += [config_of(k) for k in chosen]
    return out


def write_portfolio(path: str | Path, configs: Sequence[Config]) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"format": FORMAT, "configs": [{"kernel": k, "params": p} for k, p in configs]},
                               indent=1) + "\n")
    return path


def read_portfolio(path: str | Path) -> list[Config]:
    """The configs of a portfolio file, each validated against the registry (InvalidConfigError names the bad one)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidConfigError(f"cannot read the portfolio {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("configs"), list):
        raise InvalidConfigError(f"{path} is not a portfolio file (a JSON object with format {FORMAT!r} and configs)")
    out = []
    for i, item in enumerate(doc["configs"]):
        if not isinstance(item, dict) or not isinstance(item.get("params", {}), dict):
            raise InvalidConfigError(f"{path}: config {i} is not an object with 'kernel' and 'params'")
        kernel = item.get("kernel")
        family = get_family(kernel)  # InvalidConfigError for an unknown family
        out.append((family.name, family.space.validate(item.get("params", {}), family=family.name)))
    return out
